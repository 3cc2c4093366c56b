//! Multi-process tests over real TCP and real page faults: each test runs a job of node processes
//! on this machine (`tmk-testnode <scenario> -n N`).

mod support;

use std::time::Duration;
use support::{Job, heap_base, run, run_on, run_with, testnode};
use treadmarks_tests::{Proc, proc_stat};

/// A process runs one node of one job, once: a second start, while the node runs or after its
/// job's exit, is `Error::AlreadyStarted`, at once (a spawned node had tried to meet its ended
/// job again for 30 s, and a launcher's new nodes had run `main` from its start).
#[test]
fn a_process_starts_its_node_once() {
    for (backend, out) in run("start-twice", 2, 39).iter() {
        out.assert_pass("start-twice");
        for node in 0..2 {
            let line = format!("NODE {node} STARTED ONCE");
            assert!(out.stdout.lines().any(|l| l == line), "{backend}: {out:#?}");
        }
        assert!(out.elapsed < Duration::from_secs(20), "{backend}: took {:?}", out.elapsed);
    }
}

#[test]
fn four_nodes_count_to_4000_under_one_lock() {
    run("counter", 4, 1).assert_pass("counter");
}

#[test]
fn one_node_jobs_need_no_peers() {
    run("counter", 1, 2).assert_pass("counter");
}

#[test]
fn interleaved_words_of_one_page_merge_at_barriers() {
    run("interleaved", 4, 3).assert_pass("interleaved");
    run("interleaved", 3, 4).assert_pass("interleaved");
}

#[test]
fn a_node_that_never_held_a_page_reads_it_after_a_barrier() {
    run("never-held", 4, 5).assert_pass("never-held");
}

#[test]
fn a_lock_chain_passes_data_through_every_node_in_turn() {
    run("lock-chain", 4, 6).assert_pass("lock-chain");
}

#[test]
fn a_lock_walk_takes_bundled_tokens_without_asking_or_handing_off() {
    run("lock-walk", 2, 17).assert_pass("lock-walk");
    run("lock-walk", 3, 17).assert_pass("lock-walk");
}

#[test]
fn pages_nobody_asks_for_produce_no_diff() {
    run("lazy", 2, 7).assert_pass("lazy");
}

#[test]
fn views_of_parts_fetch_only_the_pages_they_declare_or_touch() {
    run("parts", 2, 16).assert_pass("parts");
}

#[test]
fn streaming_views_return_early_and_synchronization_waits_for_their_pages() {
    run_with("stream", 2, 24, &[("TMK_STREAM_MIN_PAGES", "16")]).assert_pass("stream");
}

#[test]
fn pages_declared_overwritten_are_not_fetched_and_reach_readers_whole() {
    run("overwrite", 3, 18).assert_pass("overwrite");
}

#[test]
fn neighbours_read_each_step_get_diffs_pushed_at_the_barrier() {
    run("push", 3, 15).assert_pass("push");
}

#[test]
fn bad_ids_and_sizes_are_typed_errors_naming_the_value() {
    run("errors", 2, 8).assert_pass("errors");
}

/// A launcher whose root (`TMK_ROOT`, left set from a job across hosts, say) is an address this
/// machine does not have fails at once, naming the setting and the address.
#[test]
fn a_root_node_0_cannot_listen_on_is_named() {
    // TEST-NET-1 (RFC 5737): never one of this machine's addresses.
    let out = run_on("mprotect", "counter", 2, 9, &[("TMK_ROOT", "192.0.2.1:7000")]);
    assert_ne!(out.code, Some(0), "{out:#?}");
    let want = "bad value \"192.0.2.1:7000\" for TMK_ROOT / --root: node 0 cannot listen there";
    assert!(out.stderr.contains(want), "{out:#?}");
    assert!(out.elapsed < Duration::from_secs(10), "took {:?}", out.elapsed);
}

/// Interval records cut into parts of one record each (`TMK_TEST_RECORD_BYTES=1`), sent ahead
/// of the grants and barrier messages that owe them: the counter still counts right, and the
/// statistics show the parts.
#[test]
fn interval_records_sent_ahead_of_their_message_reach_their_node() {
    let env = [("TMK_TEST_RECORD_BYTES", "1"), ("TMK_STATS", "1")];
    for (backend, out) in run_with("counter", 4, 38, &env).iter() {
        assert!(out.code == Some(0) && out.stdout.contains("PASS counter"), "{backend}: {out:#?}");
        let parts: u64 = (out.stderr.lines())
            .filter_map(|l| l.trim_start().strip_prefix("intervals "))
            .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .sum();
        assert!(parts > 0, "{backend}: no intervals message sent: {out:#?}");
    }
}

/// A job needing more open files (a connection per peer) than its processes may have: run, the
/// soft limit raised, when the hard limit allows (8 nodes: node 0 holds ~20 files, over a soft
/// limit of 16); refused at once by its node count when even the hard limit is too low.
#[test]
fn a_job_short_of_open_files_raises_the_soft_limit_or_is_refused_by_its_node_count() {
    use nix::sys::resource::{Resource, getrlimit};
    let backend = support::backends()[0];
    // The test's own hard limit: a child may not raise it.
    let (_, hard_now) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if hard_now < 128 {
        println!("skipping: a hard limit of {hard_now} open files leaves an 8-node job no room");
        return;
    }
    for (soft, hard) in [(16, hard_now), (16, 16)] {
        let mut cmd = support::command_on(backend, "counter", 8, 37, &[]);
        use nix::sys::resource::setrlimit;
        use std::os::unix::process::CommandExt;
        // SAFETY: the hook runs in the child between fork and exec, where only async-signal-safe
        // calls are allowed: it makes one system call (`setrlimit`) and builds an `io::Error`
        // from an errno, which allocates nothing and takes no lock.
        unsafe {
            cmd.pre_exec(move || {
                setrlimit(Resource::RLIMIT_NOFILE, soft, hard).map_err(std::io::Error::from)
            });
        }
        let out = Job::spawn(cmd).wait(Duration::from_secs(120));
        if hard == 16 {
            assert_ne!(out.code, Some(0), "{out:#?}");
            let want = "bad value \"8\" for TMK_NPROCS / -n: each node holds a connection to every other";
            assert!(
                out.stderr.contains(want) && out.stderr.contains("RLIMIT_NOFILE: soft 16, hard 16"),
                "{out:#?}"
            );
            assert!(out.elapsed < Duration::from_secs(10), "took {:?}", out.elapsed);
        } else {
            out.assert_pass("counter");
        }
    }
}

/// Each of `survivors` failed within 20 s, its failure line saying `why`.
fn survivors_say(backend: &str, out: &support::Outcome, survivors: &[usize], why: &str) {
    for survivor in survivors {
        let prefix = format!("treadmarks: node {survivor}: job failed: ");
        let said = out.stderr.lines().any(|l| l.starts_with(&prefix) && l.contains(why));
        assert!(said, "{backend}: node {survivor} must say {why:?}: {out:#?}");
    }
    assert!(out.elapsed < Duration::from_secs(20), "{backend}: took {:?}", out.elapsed);
}

#[test]
fn a_dead_node_makes_the_others_fail_fast_naming_it() {
    for (backend, out) in run("kill", 4, 9).iter() {
        assert_ne!(out.code, Some(0), "{backend}: {out:#?}");
        // A survivor may learn of it first-hand or from another survivor's abort; either way its
        // failure line names node 2 as the cause.
        survivors_say(backend, out, &[0, 1, 3], "node 2 closed its connection without saying goodbye");
    }
}

#[test]
fn a_node_whose_application_returns_an_error_tells_the_others_why() {
    for (backend, out) in run("give-up", 3, 20).iter() {
        assert_ne!(out.code, Some(0), "{backend}: {out:#?}");
        assert!(out.stderr.contains("node 2 gives up"), "{backend}: {out:#?}");
        let why =
            "node 2 aborted the job: its application left without calling exit (an error or an early return)";
        survivors_say(backend, out, &[0, 1], why);
    }
}

/// The peers hear of the error of the call the application left on, even one checked on the
/// application thread (an unknown lock; they were told "an error or an early return").
#[test]
fn a_node_that_leaves_on_a_failed_call_tells_the_others_that_error() {
    for (backend, out) in run("give-up-on-error", 3, 31).iter() {
        assert_ne!(out.code, Some(0), "{backend}: {out:#?}");
        let why = "node 2 aborted the job: its application left without calling exit (its last call into \
                   treadmarks failed: lock 5000 is out of range";
        survivors_say(backend, out, &[0, 1], why);
    }
}

#[test]
fn an_exit_while_a_node_waits_at_a_barrier_fails_the_job_naming_both() {
    for (backend, out) in run("exit-at-barrier", 3, 25).iter() {
        assert_ne!(out.code, Some(0), "{backend}: {out:#?}");
        let why = "called exit while node 0 waits at barrier 1";
        survivors_say(backend, out, &[0, 1, 2], why);
    }
}

#[test]
fn a_distribute_node_0_will_not_answer_fails_the_job_naming_the_waiting_node() {
    for (backend, out) in run("distribute-unanswered", 3, 29).iter() {
        assert_ne!(out.code, Some(0), "{backend}: {out:#?}");
        // Whichever of nodes 1 and 2 asked first is named.
        let why = "waits for distributed value 0 while node 0 is at barrier 1";
        survivors_say(backend, out, &[0, 1, 2], why);
    }
}

#[test]
fn a_failed_exit_is_what_the_peers_are_told() {
    for (backend, out) in run("exit-holding", 2, 26).iter() {
        assert_ne!(out.code, Some(0), "{backend}: {out:#?}");
        let why = "node 1 aborted the job: its exit failed: exit while holding lock 3";
        survivors_say(backend, out, &[0], why);
    }
}

#[test]
fn nodes_whose_launcher_dies_say_so_and_exit() {
    for (backend, out) in run("launcher-dies", 3, 28).iter() {
        assert_eq!(out.code, Some(3), "{backend}: {out:#?}");
        // Each node says node 0 is gone: the kernel's signal may come first ("the launcher
        // died"), or the end of node 0's connection ("job failed: ... node 0 closed its
        // connection"), first-hand or in another node's abort.
        for node in [1, 2] {
            let said = |l: &&str| {
                l.starts_with(&format!("treadmarks: node {node}: the launcher (node 0, pid "))
                    || (l.starts_with(&format!("treadmarks: node {node}: job failed: "))
                        && l.contains("node 0 closed its connection"))
            };
            assert!(out.stderr.lines().any(|l| said(&l)), "{backend}: node {node} must say so: {out:#?}");
        }
        assert!(out.elapsed < Duration::from_secs(20), "{backend}: took {:?}", out.elapsed);
    }
}

#[test]
fn a_job_pins_to_cpus_no_other_job_holds_and_runs_unpinned_where_they_are_held() {
    use treadmarks::mem::sched::{CpuClaim, CpuClaims, allowed_cpus};
    let cpus = allowed_cpus();
    if cpus < 2 {
        println!("skipping: {cpus} CPU allowed, nothing to pin apart");
        return;
    }
    // Claims of this test's own names (`TMK_TEST_CPU_CLAIMS`), so that no other job is touched.
    let names = format!("treadmarks-test-cpu-{}-", std::process::id());
    let env = [("TMK_TEST_CPU_CLAIMS", names.as_str())];
    let pinned = |out: &support::Outcome, node: usize, alone: bool| {
        let want = if alone { "1".to_string() } else { cpus.to_string() };
        out.stdout.lines().any(|l| l == format!("NODE {node} CPUS {want}"))
    };
    for (backend, out) in run_with("affinity", 2, 27, &env).iter() {
        out.assert_pass("affinity");
        assert!(pinned(out, 0, true) && pinned(out, 1, true), "{backend}: nobody holds them: {out:#?}");
        // Unpinned at exit: the launcher's thread (a program going on with work of its own after
        // its job, say) had stayed on one CPU, and so had every process it started next.
        for node in 0..2 {
            let after = format!("NODE {node} AFTER EXIT CPUS {cpus}");
            assert!(out.stdout.lines().any(|l| l == after), "{backend}: {after:?}: {out:#?}");
        }
    }
    // Stand-in for another job's launcher: every CPU held.
    let CpuClaim::Claimed(held) = CpuClaims::take_named(&names, cpus) else { panic!("cannot claim") };
    for (backend, out) in run_with("affinity", 2, 27, &env).iter() {
        out.assert_pass("affinity");
        assert!(pinned(out, 0, false) && pinned(out, 1, false), "{backend}: held elsewhere: {out:#?}");
    }
    // Asked for, a job pins anyway.
    let out = run_on("mprotect", "affinity", 2, 27, &[env[0], ("TMK_PIN", "1")]);
    out.assert_pass("affinity");
    assert!(pinned(&out, 1, true), "{out:#?}");
    drop(held);
}

#[test]
fn a_failed_jobs_service_thread_waits_idle_for_the_exit() {
    for (backend, out) in run("quiet-after-peer-death", 2, 21).iter() {
        // "SERVICE_CPU_TICKS <ticks> THREADS <found before> <found after>"
        let nums: Vec<u64> = out
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("SERVICE_CPU_TICKS "))
            .map(|l| l.split_whitespace().filter_map(|w| w.parse().ok()).collect())
            .unwrap_or_default();
        let [ticks, before, after] = nums[..] else {
            panic!("{backend}: node 0 printed no tick count: {out:#?}")
        };
        // The ticks are those of node 0's one service thread, measured from start to end (none
        // found would count 0 ticks).
        assert_eq!((before, after), (1, 1), "{backend}: service threads found: {out:#?}");
        // A spinning thread takes ~100 ticks a second (it took 97% of a CPU); an idle one none.
        assert!(ticks < 30, "{backend}: the service thread used {ticks} ticks in a second: {out:#?}");
    }
}

#[test]
fn a_node_blocked_in_a_fault_inside_eprintln_still_reports_and_exits() {
    for (backend, out) in run("fault-in-eprintln", 2, 19).iter() {
        assert_eq!(out.code, Some(1), "{backend}: {out:#?}");
        // (The line may follow the "sum " the print wrote before it faulted.)
        let reported = out.stderr.lines().any(|l| {
            l.contains("treadmarks: node 0: the application is blocked in a page fault and the job failed")
                && l.contains("node 1")
        });
        assert!(reported, "{backend}: node 0 must say why it exits: {out:#?}");
        assert!(out.elapsed < Duration::from_secs(20), "{backend}: took {:?}", out.elapsed);
    }
}

/// A loopback address of this test process's own: all of 127.0.0.0/8 is this host, and the
/// other jobs listen and connect on 127.0.0.1. A port found free on it (bound, then closed)
/// stays free until a node binds it, unless something binds that port on every address; and
/// what connects to it reaches this test's node, never another job's. (A pid is below 2^22.)
fn own_loopback() -> std::net::Ipv4Addr {
    let pid = std::process::id();
    std::net::Ipv4Addr::new(127, 64 + ((pid >> 16) & 63) as u8, (pid >> 8) as u8, pid as u8)
}

/// `scenario` as node 1 of 2 started by hand, node 0 at a port nobody listens on: for startups
/// refused before any meeting.
fn node_1_by_hand(scenario: &str, slot: u64) -> std::process::Command {
    let mut cmd = testnode();
    cmd.args([scenario])
        .env("TMK_NPROCS", "2")
        .env("TMK_RANK", "1")
        .env("TMK_ROOT", "127.0.0.1:9")
        .env("TMK_HEAP_SIZE", "64MiB")
        .env("TMK_HEAP_BASE", heap_base(slot));
    cmd
}

/// A node started by hand to join a job (`TMK_RANK`) whose code gives `Tmk::startup_with` a
/// launcher's configuration is refused at once, naming `TMK_RANK`: it had started a whole job of
/// its own on its host, and every host's "succeeded".
#[test]
fn a_node_joining_by_hand_with_a_launchers_configuration_is_refused() {
    let out = Job::spawn(node_1_by_hand("explicit-config", 22)).wait(Duration::from_secs(30));
    assert_ne!(out.code, Some(0), "{out:#?}");
    assert!(out.stderr.contains("bad value \"1\" for TMK_RANK: set, but Tmk::startup_with"), "{out:#?}");
    assert!(out.elapsed < Duration::from_secs(10), "took {:?}", out.elapsed);
}

/// A program a node of a launched job starts inherits the node's variables (its rank, the job's
/// root, the launcher's pid), its parent's parent the launcher: its startup is refused at once,
/// saying why and what to remove, rather than take itself for a node whose launcher is gone.
/// Here this test process plays the node, and its own parent the launcher.
#[test]
fn a_program_started_by_a_node_is_told_it_cannot_join_the_job() {
    let mut cmd = node_1_by_hand("counter", 23);
    cmd.env("TMK_LAUNCHER_PID", nix::unistd::getppid().as_raw().to_string());
    let out = Job::spawn(cmd).wait(Duration::from_secs(30));
    assert_eq!(out.code, Some(1), "{out:#?}");
    let told = format!("was started by a node of the job launched by pid {}", nix::unistd::getppid());
    assert!(out.stderr.contains(&told) && out.stderr.contains("remove TMK_RANK"), "{out:#?}");
    assert!(out.elapsed < Duration::from_secs(10), "took {:?}", out.elapsed);
}

#[test]
fn nodes_with_different_configurations_refuse_to_meet() {
    let ip = own_loopback();
    for attempt in 1.. {
        let port = std::net::TcpListener::bind((ip, 0)).unwrap().local_addr().unwrap().port();
        let root = format!("{ip}:{port}");
        let mut jobs = (0..2).map(|rank| {
            let mut cmd = testnode();
            cmd.args(["counter"])
                .env("TMK_NPROCS", "2")
                .env("TMK_RANK", rank.to_string())
                .env("TMK_ROOT", &root)
                .env("TMK_HEAP_SIZE", "64MiB")
                .env("TMK_HEAP_BASE", heap_base(10 + rank))
                .env("TMK_LOCKS", if rank == 0 { "1024" } else { "512" })
                .env("TMK_CONNECT_TIMEOUT", "10");
            if rank == 1 {
                // A typo in a node's own environment is named by that node, not only by node 0.
                cmd.env("TMK_PUSH_SKP", "0");
            }
            Job::spawn(cmd)
        });
        let (rank0, rank1) = (jobs.next().unwrap(), jobs.next().unwrap());
        let out = rank0.wait(Duration::from_secs(30));
        // Taken all the same (by a listener on every address): again on another port, rank 1
        // killed (dropped).
        if out.stderr.contains("Address already in use") && attempt < 5 {
            eprintln!("attempt {attempt}: port {port} was taken; again");
            continue;
        }
        let out1 = rank1.wait(Duration::from_secs(30));
        let typo = "TMK_PUSH_SKP is not a setting, and is ignored (did you mean TMK_PUSH_SKIP?)";
        assert!(out1.stderr.contains(typo), "{out1:#?}");
        for out in [out, out1] {
            assert_ne!(out.code, Some(0), "{out:#?}");
            assert!(out.stderr.contains("locks=512") || out.stderr.contains("rejected"), "{out:#?}");
        }
        break;
    }
}

/// A launcher started with an explicit configuration (`Tmk::startup_with`) runs its nodes with
/// it: they met it with their environment's 1,024 locks, a fingerprint mismatch, before. Every
/// node's code passes a launcher's configuration, as a program that builds its own does: the
/// nodes spawned took that role from it, and each spawned nodes of its own.
#[test]
fn a_launchers_explicit_configuration_holds_for_every_node() {
    run("explicit-config", 3, 30).assert_pass("explicit-config");
}

/// A launcher that another program starts and tells its pid, to die with it (`TMK_LAUNCHER_PID`
/// without a rank: the core bench's 4-node launcher), is a launcher still: its own
/// configuration and flags hold. Taken for a node a launcher spawned, it read its node count
/// from an environment that had none and ran alone.
#[test]
fn a_launcher_told_to_die_with_its_parent_is_a_launcher_still() {
    let pid = std::process::id().to_string();
    run_with("explicit-config", 3, 31, &[("TMK_LAUNCHER_PID", &pid)]).assert_pass("explicit-config");
}

/// A node's final statistics count its exit and all it served while it waited in exit: over a
/// job, every message and byte sent is received (node 0, in exit at once, forwarded the others'
/// lock requests uncounted when its statistics were taken as it called exit).
#[test]
fn final_statistics_count_what_a_node_served_in_exit() {
    for (backend, out) in run_with("served-in-exit", 3, 32, &[("TMK_STATS", "json")]).iter() {
        out.assert_pass("served-in-exit");
        let field = |line: &str, name: &str| -> u64 {
            let key = format!("\"{name}\":");
            let at = line.find(&key).unwrap_or_else(|| panic!("{backend}: no {name} in {line}")) + key.len();
            let digits: String = line[at..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse().unwrap()
        };
        let lines: Vec<&str> = out.stderr.lines().filter_map(|l| l.strip_prefix("TMK_STATS ")).collect();
        assert_eq!(lines.len(), 3, "{backend}: {out:#?}");
        for what in ["msgs", "bytes"] {
            let total = |dir: &str| lines.iter().map(|l| field(l, &format!("{what}_{dir}"))).sum::<u64>();
            assert_eq!(total("sent"), total("received"), "{backend}: {what}: {out:#?}");
        }
    }
}

/// On the mprotect backend, with no heap size asked for, the default 1 GiB heap shrinks to what
/// `vm.max_map_count` allows (said once, by the launcher, whose nodes take its size), where it
/// refused to start; a size asked for is used or refused.
#[test]
fn the_default_heap_fits_the_mprotect_backends_mapping_limit() {
    let limit: u64 = std::fs::read_to_string("/proc/sys/vm/max_map_count").unwrap().trim().parse().unwrap();
    // 1 GiB is 262,144 pages of 4 KiB; between the bounds, the process's own mappings decide.
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).unwrap().unwrap() as u64;
    let pages = (1u64 << 30) / page;
    let (shrinks, fits) = (limit < pages, limit > pages + 8192);
    // An empty TMK_HEAP_SIZE is unset: the default applies.
    let out = run_on("mprotect", "counter", 3, 33, &[("TMK_HEAP_SIZE", "")]);
    out.assert_pass("counter");
    let said = out.stderr.matches("allows a heap of").count();
    assert!(said <= 1, "said by one node only: {out:#?}");
    assert!(!shrinks || said == 1, "vm.max_map_count = {limit}: {out:#?}");
    assert!(!fits || said == 0, "vm.max_map_count = {limit}: {out:#?}");
    if shrinks {
        let out = run_on("mprotect", "counter", 2, 34, &[("TMK_HEAP_SIZE", "1GiB")]);
        assert_ne!(out.code, Some(0), "{out:#?}");
        assert!(out.stderr.contains("more than vm.max_map_count"), "{out:#?}");
    }
}

#[test]
fn a_node_that_dies_while_the_job_starts_stops_the_launcher_at_once() {
    for (_, out) in
        run_with("counter", 3, 11, &[("TMK_TEST_DIE_AT_STARTUP", "2"), ("TMK_CONNECT_TIMEOUT", "60")]).iter()
    {
        assert_ne!(out.code, Some(0), "{out:#?}");
        assert!(out.stderr.contains("node 2 exited while the job was starting"), "{out:#?}");
        assert!(
            out.elapsed < Duration::from_secs(20),
            "took {:?} (the meeting timeout is 60 s)",
            out.elapsed
        );
    }
}

#[test]
fn a_fault_right_after_a_polled_reply_waits_for_its_own_resolution() {
    run("reply-then-fault", 2, 12).assert_pass("reply-then-fault");
}

#[test]
fn diffs_are_served_correctly_while_the_owner_keeps_writing_the_page() {
    run("serve-while-writing", 2, 13).assert_pass("serve-while-writing");
    run("serve-while-writing", 3, 14).assert_pass("serve-while-writing");
}

/// A mutable view's slice written by a scoped thread while the application thread fetches
/// through other views and the runtime serves the writer's pages: nothing aborts, no write is
/// lost.
#[test]
fn a_scoped_thread_writes_through_a_view_while_the_node_fetches_and_serves() {
    run("scoped-writer", 2, 40).assert_pass("scoped-writer");
}

/// The caller's `TMK_*` settings reach no job: a re-run of this binary whose environment says
/// 8 locks, and rank 5 of a 7-node job at a root nobody runs, still passes the `errors` test,
/// whose scenario expects the default 1,024 locks.
#[test]
fn the_callers_tmk_settings_reach_no_job() {
    let test = "bad_ids_and_sizes_are_typed_errors_naming_the_value";
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--test-threads=1"])
        .env("TMK_LOCKS", "8")
        .env("TMK_NPROCS", "7")
        .env("TMK_RANK", "5")
        .env("TMK_ROOT", format!("{}:9", own_loopback()));
    let out = Job::spawn(cmd).wait(Duration::from_secs(120));
    assert!(out.code == Some(0) && out.stdout.contains("1 passed"), "{out:#?}");
}

/// A set of runs with none in it (a backend asked for and missing) fails a test checking them
/// all, rather than passing it having checked nothing.
#[test]
#[should_panic(expected = "no run")]
fn no_runs_fail_assert_pass() {
    support::Runs(Vec::new()).assert_pass("counter");
}

#[test]
#[should_panic(expected = "no run")]
fn no_runs_fail_a_loop_over_them() {
    for _ in support::Runs(Vec::new()).iter() {}
}

/// A backend asked for that the kernel does not offer fails the test, naming it; an unknown
/// value fails it too; with none asked for, the one the kernel lacks is skipped.
#[test]
fn backends_asked_for_and_missing_fail_the_test_naming_them() {
    use std::panic::catch_unwind;
    use support::backends_for;
    let missing = || Err(treadmarks::mem::UffdUnavailable { why: "no userfaultfd here".into(), fix: "none" });
    let message = |r: std::thread::Result<Vec<&str>>| match r {
        Ok(v) => panic!("no panic, backends {v:?}"),
        Err(e) => e.downcast_ref::<String>().cloned().unwrap_or_default(),
    };
    let msg = message(catch_unwind(|| backends_for(Some("uffd"), false, missing)));
    assert!(msg.contains("TMK_FAULTS=uffd") && msg.contains("no userfaultfd here"), "{msg}");
    let msg = message(catch_unwind(|| backends_for(Some("ufd"), false, || Ok(()))));
    assert!(msg.contains("\"ufd\""), "{msg}");
    assert_eq!(backends_for(Some("uffd"), false, || Ok(())), ["uffd"]);
    assert_eq!(backends_for(Some("mprotect"), false, missing), ["mprotect"]);
    for unset in [None, Some(""), Some("auto")] {
        assert_eq!(backends_for(unset, false, missing), ["mprotect"]);
        assert_eq!(backends_for(unset, false, || Ok(())), ["mprotect", "uffd"]);
        assert_eq!(backends_for(unset, true, || Ok(())), ["mprotect", "uffd"]);
        let msg = message(catch_unwind(|| backends_for(unset, true, missing)));
        assert!(msg.contains("TMK_REQUIRE_UFFD=1"), "{msg}");
    }
}

/// Set in the re-run of this test binary that starts the jobs the test then orphans (not a
/// `TMK_*` name: those are for jobs).
const ORPHAN_HELPER: &str = "TMKT_ORPHAN_HELPER";
const ORPHAN_TEST: &str = "jobs_die_with_the_test_process_however_it_is_killed";

/// The live processes of process group `pgrp`.
fn group(pgrp: u32) -> Vec<Proc> {
    let pids = std::fs::read_dir("/proc").unwrap().flatten();
    let pids = pids.filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()));
    pids.filter(|&pid| proc_stat(pid).is_some_and(|f| f.get(2) == Some(&pgrp.to_string())))
        .filter_map(Proc::running)
        .collect()
}

/// Whether process `pid` has a thread named like a service thread (its node met the others).
fn meshed(pid: u32) -> bool {
    let mut tasks = std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten();
    tasks.any(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.contains("tmk-service")))
}

/// The helper's part: starts a 3-node job that hangs after its nodes met, and a node started
/// by hand (`TMK_RANK`) that waits for a root nobody runs, says their pids (each is its job's
/// process group), and waits for them, until the test kills it.
fn orphan_helper() -> ! {
    let mut cmd = testnode();
    cmd.args(["hang", "-n", "3"])
        .env("TMK_HEAP_SIZE", "64MiB")
        .env("TMK_HEAP_BASE", heap_base(35))
        .env("TMK_CONNECT_TIMEOUT", "20");
    let launched = Job::spawn(cmd);
    let mut cmd = testnode();
    // Nothing listens on this process's own loopback address.
    cmd.args(["counter"])
        .env("TMK_NPROCS", "2")
        .env("TMK_RANK", "1")
        .env("TMK_ROOT", format!("{}:9", own_loopback()))
        .env("TMK_HEAP_SIZE", "64MiB")
        .env("TMK_HEAP_BASE", heap_base(36))
        .env("TMK_CONNECT_TIMEOUT", "150");
    let by_hand = Job::spawn(cmd);
    println!("JOBS {} {}", launched.id(), by_hand.id());
    // Both jobs outlive this wait, and this (the spawning) thread waits in it.
    let out = launched.wait(Duration::from_secs(200));
    panic!("the job ended: {out:#?}")
}

/// Kills the helper and what it started, whatever happened (what is dead already is skipped).
struct Orphans {
    helper: std::process::Child,
    procs: Vec<Proc>,
}

impl Drop for Orphans {
    fn drop(&mut self) {
        let _ = self.helper.kill();
        let _ = self.helper.wait();
        for p in self.procs.iter().filter(|p| p.alive()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// A test process killed (a CI timeout, or Ctrl-C: the jobs, each in a process group of its
/// own, get no SIGINT) takes its jobs along: a launcher and its nodes, and a node started by
/// hand. The test process here is a helper, a re-run of this binary, which starts the jobs.
#[test]
fn jobs_die_with_the_test_process_however_it_is_killed() {
    use std::io::BufRead;
    if std::env::var_os(ORPHAN_HELPER).is_some() {
        orphan_helper();
    }
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", ORPHAN_TEST, "--nocapture", "--test-threads=1"])
        .env(ORPHAN_HELPER, "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    treadmarks_tests::die_with_this_thread(&mut cmd);
    let mut helper = cmd.spawn().expect("spawn the helper");
    let stdout = helper.stdout.take().unwrap();
    let mut orphans = Orphans { helper, procs: Vec::new() };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let jobs: Vec<u32> = loop {
        let line = rx.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()));
        let line = line.expect("the helper said no pids in 30 s");
        // (After libtest's "test <name> ... ", on the same line.)
        if let Some((_, pids)) = line.split_once("JOBS ") {
            break pids.split_whitespace().map(|p| p.parse().unwrap()).collect();
        }
    };
    let [launcher, by_hand] = jobs[..] else { panic!("{jobs:?}") };
    // Every node up: the launcher and its two nodes met (a service thread each), and the node
    // started by hand is waiting for its root.
    loop {
        let (job, alone) = (group(launcher), group(by_hand));
        if job.len() == 3 && job.iter().all(|p| meshed(p.pid)) && alone.len() == 1 {
            orphans.procs = job.into_iter().chain(alone).collect();
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the jobs did not start in 30 s: {job:?} {alone:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
    orphans.helper.kill().unwrap();
    orphans.helper.wait().unwrap();
    let killed = std::time::Instant::now();
    loop {
        let alive: Vec<Proc> = orphans.procs.iter().copied().filter(|p| p.alive()).collect();
        if alive.is_empty() {
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "alive 10 s after the test process died: {alive:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("the jobs were gone {:?} after the test process", killed.elapsed());
}
