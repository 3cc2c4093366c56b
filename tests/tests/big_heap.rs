//! A 2 GiB heap with a checkerboard of page states over more than 300,000 pages, on real
//! processes: it works on the userfaultfd backend; the mprotect backend refuses it at startup
//! with a clear error, never a crash or a hang, where it could need more kernel mappings than
//! `vm.max_map_count` allows (the kernel default, 65,530, allows far fewer than 2 GiB of 4 KiB
//! pages), and runs it where the limit leaves room (hosts that raise it to 1,048,576, say).
//!
//! The test re-runs its own binary as node 0 of a 2-node job (`--exact <this test>` with
//! `TMK_BIG_HEAP_CHILD=1`); node 0 spawns node 1 the same way, so both nodes run
//! [`checkerboard`].

mod support;

use std::process::Command;
use std::time::{Duration, Instant};
use support::{Job, heap_base};
use treadmarks::{Error, Shared, Tmk};

const CHILD: &str = "TMK_BIG_HEAP_CHILD";
const TEST: &str = "a_2_gib_heap_with_a_checkerboard_of_page_states";
/// Pages of the checkerboard: more than 300,000.
const PAGES: usize = 330_000;
const PAGE: usize = 4096;
/// The heap.
const HEAP: u64 = 2 << 30;

fn value(p: usize, round: usize) -> u8 {
    ((p * 7 + round) % 251) as u8 + 1
}

fn check(ok: bool, what: impl FnOnce() -> String) -> treadmarks::Result<()> {
    if ok { Ok(()) } else { Err(Error::Failed(what())) }
}

/// Node 1 writes pages 0 mod 3; after a barrier node 0 holds them invalid, writes pages 2 mod 3
/// (read-write) and leaves pages 1 mod 3 read-only: invalid / read-only / read-write alternate
/// over `PAGES` pages. Node 0 then reads a sample of the invalid pages (fetching node 1's diffs
/// while its other pages keep every state), and after a barrier node 1 checks node 0's writes.
fn checkerboard(tmk: &mut Tmk) -> treadmarks::Result<String> {
    let me = tmk.proc_id();
    let mut a = Shared::from_raw_parts(0, 0);
    if me == 0 {
        a = tmk.alloc_pages::<u8>(PAGES * PAGE)?;
    }
    tmk.distribute(&mut a)?;
    let start = Instant::now();
    if me == 1 {
        let mut v = tmk.view_mut(&a)?;
        for p in (0..PAGES).step_by(3) {
            v[p * PAGE] = value(p, 1);
        }
    }
    tmk.barrier(0)?;
    let t_first = start.elapsed();
    if me == 0 {
        let mut v = tmk.view_mut(&a)?;
        for p in (2..PAGES).step_by(3) {
            v[p * PAGE + 1] = value(p, 2);
        }
        drop(v);
        // The checkerboard is in place on this node; read a sample of the invalid pages.
        let v = tmk.view(&a)?;
        for p in (0..PAGES).step_by(3 * 97) {
            let got = v[p * PAGE];
            check(got == value(p, 1), || format!("page {p}: read {got}, want {}", value(p, 1)))?;
        }
        for p in (1..PAGES).step_by(3 * 101) {
            check(v[p * PAGE] == 0, || format!("read-only page {p} is not zero"))?;
        }
    }
    let t_checker = start.elapsed();
    tmk.barrier(1)?;
    if me == 1 {
        let v = tmk.view(&a)?;
        for p in (2..PAGES).step_by(3 * 89) {
            let got = v[p * PAGE + 1];
            check(got == value(p, 2), || format!("page {p}: read {got}, want {}", value(p, 2)))?;
        }
    }
    tmk.barrier(2)?;
    Ok(format!(
        "node {me}: first writes + barrier {t_first:?}, checkerboard + sample reads {t_checker:?}, total {:?}",
        start.elapsed()
    ))
}

/// The body of a node process.
fn node_main() -> ! {
    let result = Tmk::startup().and_then(|mut tmk| {
        let line = checkerboard(&mut tmk)?;
        let me = tmk.proc_id();
        tmk.exit()?;
        Ok((me, line))
    });
    match result {
        Ok((me, line)) => {
            println!("{line}");
            if me == 0 {
                println!("PASS checkerboard");
            }
            std::process::exit(0)
        }
        Err(e) => {
            treadmarks::report(&format!("big-heap node: {e}"));
            std::process::exit(1)
        }
    }
}

fn job(backend: &str, slot: u64) -> support::Outcome {
    let mut cmd = Command::new(std::env::current_exe().expect("path of the test binary"));
    cmd.args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("TMK_NPROCS", "2")
        .env("TMK_FAULTS", backend)
        .env("TMK_HEAP_SIZE", "2GiB")
        .env("TMK_HEAP_BASE", heap_base(slot))
        .env("TMK_CONNECT_TIMEOUT", "20");
    Job::spawn(cmd).wait(Duration::from_secs(120))
}

/// What the mprotect backend must do with the 2 GiB heap under this host's limit.
#[derive(Debug, PartialEq)]
enum Mprotect {
    /// Refuse it: its pages and the margin alone pass `vm.max_map_count`.
    Refuses,
    /// Run it: the limit leaves room for its pages, the margin and far more mappings than a node
    /// has of its own (a few hundred).
    Runs,
    /// Either, depending on the mappings the node has when it checks.
    Either,
}

/// The heap's pages, `vm.max_map_count`, and what the mprotect backend must do: it refuses a
/// heap of `pages` when `pages + mappings in use + MAP_COUNT_MARGIN > vm.max_map_count`
/// (`treadmarks/src/mem/backend.rs`, `check_map_count`).
fn mprotect_verdict() -> (u64, u64, Mprotect) {
    let limit: u64 = std::fs::read_to_string("/proc/sys/vm/max_map_count").unwrap().trim().parse().unwrap();
    let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE).unwrap().unwrap() as u64;
    let pages = HEAP / page;
    let need = pages + treadmarks::mem::MAP_COUNT_MARGIN;
    let verdict = if need >= limit {
        Mprotect::Refuses
    } else if need + 8192 <= limit {
        Mprotect::Runs
    } else {
        Mprotect::Either
    };
    (pages, limit, verdict)
}

/// The mprotect job's refusal, checked: at startup, with an error naming the limit, the way out
/// and the heap's `pages`.
fn assert_refused(out: &support::Outcome, pages: u64, limit: u64) {
    assert!(out.code.is_some(), "refused with an error, not a crash: {out:#?}");
    for want in ["vm.max_map_count".to_string(), "TMK_FAULTS=uffd".into(), format!("{pages} pages")] {
        assert!(out.stderr.contains(&want), "the error must name {want:?} (limit {limit}): {out:#?}");
    }
    assert!(out.elapsed < Duration::from_secs(20), "refused at startup, took {:?}", out.elapsed);
}

/// Whether `out` is a checkerboard job that passed.
fn passed(out: &support::Outcome) -> bool {
    out.code == Some(0) && out.stdout.contains("PASS checkerboard")
}

#[test]
fn a_2_gib_heap_with_a_checkerboard_of_page_states() {
    if std::env::var(CHILD).is_ok() {
        node_main();
    }
    let backends = support::backends();
    if backends.contains(&"mprotect") {
        let (pages, limit, verdict) = mprotect_verdict();
        let out = job("mprotect", 40);
        match verdict {
            Mprotect::Refuses => {
                assert_ne!(out.code, Some(0), "mprotect must refuse a 2 GiB heap (limit {limit}): {out:#?}");
                assert_refused(&out, pages, limit);
            }
            Mprotect::Runs => {
                assert!(passed(&out), "mprotect must run a 2 GiB heap (limit {limit}): {out:#?}");
            }
            Mprotect::Either if passed(&out) => {}
            Mprotect::Either => assert_refused(&out, pages, limit),
        }
        println!("mprotect, vm.max_map_count {limit}, {pages} pages: {verdict:?}; took {:?}", out.elapsed);
    }
    if backends.contains(&"uffd") {
        let out = job("uffd", 41);
        assert!(passed(&out), "uffd: {out:#?}");
        for line in out.stdout.lines().filter(|l| l.starts_with("node ")) {
            println!("{line}");
        }
        println!("uffd 2 GiB checkerboard job took {:?}", out.elapsed);
    }
}
