//! Running job processes from tests: bounded waits, and every process reaped even when a test
//! fails (each job runs in its own process group, killed whole on timeout or drop) or the test
//! process is killed (each job's first process dies with the test's thread that spawned it:
//! [`die_with_this_thread`]). Jobs see only the `TMK_*` settings their test gives them, plus
//! `TMK_FAULTS` ([`hermetic`]). Shared by the tests of this package and of the example
//! applications.

use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What a finished job printed and how it ended.
#[derive(Debug)]
pub struct Outcome {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Outcome {
    pub fn assert_pass(&self, scenario: &str) {
        assert!(
            self.code == Some(0) && self.stdout.contains(&format!("PASS {scenario}")),
            "{scenario} failed: {self:#?}"
        );
    }
}

/// A process group that is killed when dropped.
#[derive(Debug)]
pub struct Job {
    child: Option<Child>,
}

impl Job {
    /// Starts `cmd` in a process group of its own, [`hermetic`], dying with the calling thread
    /// ([`die_with_this_thread`]): call it on the thread that waits for the job or drops it (a
    /// test's own thread), never on one that ends before the job.
    pub fn spawn(mut cmd: Command) -> Job {
        hermetic(&mut cmd);
        die_with_this_thread(&mut cmd);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        Job { child: Some(cmd.spawn().expect("spawn test node")) }
    }

    /// The pid of the job's first process, which is also its process group's id.
    pub fn id(&self) -> u32 {
        self.child.as_ref().expect("not waited yet").id()
    }

    /// Waits at most `timeout`; on timeout kills the group and panics with what it printed.
    pub fn wait(mut self, timeout: Duration) -> Outcome {
        let child = self.child.take().expect("not waited yet");
        let pgid = nix::unistd::Pid::from_raw(child.id() as i32);
        let start = Instant::now();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        let out = match rx.recv_timeout(timeout) {
            Ok(out) => out.expect("wait for test node"),
            Err(_) => {
                let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
                let out = rx.recv().expect("killed job reaped").expect("output");
                panic!(
                    "job did not finish within {timeout:?}; killed.\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        };
        // Nodes are reaped by their launcher; kill any straggler of the group all the same.
        let _ = nix::sys::signal::killpg(pgid, nix::sys::signal::Signal::SIGKILL);
        Outcome {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            elapsed: start.elapsed(),
        }
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
        }
    }
}

// The jobs the tests start die with the test's thread that spawns them, however the test
// process ends: a test binary interrupted (Ctrl-C) or killed (a CI timeout) runs no `Drop`, and a
// job in a process group of its own gets neither the terminal's SIGINT nor, writing nothing, a
// SIGPIPE. A launcher takes its nodes along (`launch.rs`, `follow_launcher`); a node started by
// hand (`TMK_RANK`) follows nobody else. Every spawn in these tests is on a test's own thread
// (libtest runs each test on a thread of its own, until the test returns or unwinds), which then
// waits for the job ([`Job::wait`]) or drops it (which kills and reaps it): the job never outlives
// it. (`ip netns exec` execs the node without a fork, so the signal reaches the node.)
pub use treadmarks::mem::orphan::die_with_this_thread;

/// Removes from `cmd`'s environment every `TMK_*` variable it would inherit from this process,
/// except `TMK_FAULTS` (the tests' choice of fault backend: see `tests/tests/support`), and
/// except those `cmd` sets or removes itself: a job sees only the settings its test gives it,
/// whatever the caller's shell exports (`TMK_LOCKS`, `TMK_PIN=0`, `TMK_GC_THRESHOLD`, ...).
pub fn hermetic(cmd: &mut Command) {
    let own: Vec<_> = cmd.get_envs().map(|(k, _)| k.to_os_string()).collect();
    for (key, _) in std::env::vars_os() {
        let tmk = key.as_encoded_bytes().starts_with(b"TMK_");
        if tmk && key != OsStr::new("TMK_FAULTS") && !own.contains(&key) {
            cmd.env_remove(&key);
        }
    }
}

/// A heap base unique to this test process and `slot`, so concurrent jobs never collide:
/// 2 GiB slots in `0x5000_0000_0000..0x7000_0000_0000`, inside the 47-bit user address space.
pub fn heap_base(slot: u64) -> String {
    let base = 0x5000_0000_0000u64 + ((std::process::id() as u64 % 256) * 64 + slot % 64) * (1 << 31);
    format!("{base:#x}")
}

/// Checks one example application in every mode: DSM on 1 to 4 nodes (3 catches partitioning
/// off-by-ones), threads on 1 to 4 threads (the threads version partitions on its own), then
/// seq; each run passes `args` and must print `PASS` and exit 0. The DSM runs use heap slots
/// `slot0 .. slot0 + 4`; the others start no node and use `slot0 + 4`.
pub fn check_app_modes(exe: &str, slot0: u64, args: &[&str]) {
    let dsm = (1..=4).map(|n| ("dsm", n));
    let threads = (1..=4).map(|n| ("threads", n));
    for (k, (mode, nprocs)) in dsm.chain(threads).chain([("seq", 1)]).enumerate() {
        let slot = slot0 + (k as u64).min(4);
        check_app_run(exe, mode, nprocs, slot, args, &[("TMK_HEAP_SIZE", "192MiB")]);
    }
}

/// Checks one example application in DSM mode on each of `nodes` node counts, with `env` set
/// (a fault backend, say); run `k` uses heap slot `slot0 + k`.
pub fn check_app_dsm(exe: &str, slot0: u64, nodes: &[usize], args: &[&str], env: &[(&str, &str)]) {
    for (k, &nprocs) in nodes.iter().enumerate() {
        check_app_run(exe, "dsm", nprocs, slot0 + k as u64, args, env);
    }
}

/// Checks one example application in `mode` (`mp`: a message-passing version, which ignores the
/// heap slot) on each of `nodes` process counts; run `k` uses heap slot `slot0 + k`.
pub fn check_app_in_mode(exe: &str, mode: &str, slot0: u64, nodes: &[usize], args: &[&str]) {
    for (k, &nprocs) in nodes.iter().enumerate() {
        check_app_run(exe, mode, nprocs, slot0 + k as u64, args, &[]);
    }
}

/// Whether the tests must run the userfaultfd fault backend (`TMK_REQUIRE_UFFD=1`: for hosts
/// that have it, where skipping it would hide a broken setup): a test that would skip it fails.
pub fn uffd_required() -> bool {
    std::env::var("TMK_REQUIRE_UFFD").is_ok_and(|v| v == "1")
}

/// Has an application run by `cmd` on the runtime's default fault backend (userfaultfd where it
/// works, else mprotect) run on userfaultfd with [`uffd_required`], failing where the kernel
/// lacks it, unless `cmd` or the test's environment names a backend (`TMK_FAULTS`; `auto` is
/// whichever works, no name).
pub fn on_required_backend(cmd: &mut Command) {
    let named = |v: &OsStr| v == "uffd" || v == "mprotect";
    let own = cmd.get_envs().find(|(k, _)| *k == "TMK_FAULTS").and_then(|(_, v)| v);
    let chosen = own.is_some_and(named) || std::env::var_os("TMK_FAULTS").is_some_and(|v| named(&v));
    if uffd_required() && !chosen {
        cmd.env("TMK_FAULTS", "uffd");
    }
}

/// One run of an example application, which must print `PASS` and exit 0, on the backend
/// [`on_required_backend`] picks.
fn check_app_run(exe: &str, mode: &str, nprocs: usize, slot: u64, args: &[&str], env: &[(&str, &str)]) {
    let mut cmd = Command::new(exe);
    cmd.args(["-n", &nprocs.to_string(), "--mode", mode])
        .args(args)
        .env("TMK_HEAP_BASE", heap_base(slot))
        .env("TMK_CONNECT_TIMEOUT", "20")
        .envs(env.iter().copied());
    on_required_backend(&mut cmd);
    let out = Job::spawn(cmd).wait(Duration::from_secs(120));
    assert!(
        out.code == Some(0) && out.stdout.contains("PASS"),
        "{exe} --mode {mode} -n {nprocs} {args:?} with {env:?} failed: {out:#?}"
    );
}

/// `/proc/<pid>/stat` after the comm: state, ppid, pgrp, ... (field 3 of the file is index 0).
pub fn proc_stat(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// A process, named by its pid and its start time (a pid may be another process's later).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Proc {
    pub pid: u32,
    pub start: u64,
}

impl Proc {
    /// Process `pid` if it is running now: not gone, and not a zombie (an orphan that nobody
    /// reaps, where the machine's first process is no init, stays one, and `kill(pid, 0)` still
    /// finds it).
    pub fn running(pid: u32) -> Option<Proc> {
        let f = proc_stat(pid)?;
        let start = f.get(19)?.parse().ok()?;
        (!matches!(f[0].as_str(), "Z" | "X")).then_some(Proc { pid, start })
    }

    /// Still running, and still the same process.
    pub fn alive(self) -> bool {
        Proc::running(self.pid).is_some_and(|p| p.start == self.start)
    }
}
