//! Running node processes from tests: bounded waits, and every process reaped even when a test
//! fails (each job runs in its own process group, killed whole on timeout or drop).
//!
//! [`run`] and [`run_with`] run a scenario once per fault backend (`TMK_FAULTS=mprotect`, then
//! `TMK_FAULTS=uffd`), so every cluster test covers both. The userfaultfd run is skipped, with the
//! reason printed, where the kernel does not offer it. Setting `TMK_FAULTS=mprotect` or
//! `TMK_FAULTS=uffd` in the test environment runs only that backend.

#![allow(dead_code)]

use std::process::Command;
use std::time::Duration;
pub use treadmarks_tests::{Job, Outcome, heap_base};

/// The test node binary.
pub fn testnode() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tmk-testnode"));
    // Parallel tests must not collide on the fixed heap address: each job gets its own.
    cmd.env_remove("TMK_RANK").env_remove("TMK_ROOT").env_remove("TMK_NPROCS");
    cmd
}

/// The fault backends to test: both, or the one `TMK_FAULTS` names; userfaultfd only where the
/// kernel offers it (otherwise the reason is printed once per call).
pub fn backends() -> Vec<&'static str> {
    let only = std::env::var("TMK_FAULTS").ok().filter(|v| v == "mprotect" || v == "uffd");
    let mut out = Vec::new();
    for b in ["mprotect", "uffd"] {
        if only.as_deref().is_some_and(|o| o != b) {
            continue;
        }
        if b == "uffd"
            && let Err(u) = treadmarks::mem::uffd_support()
        {
            println!("skipping the uffd backend: {} ({})", u.why, u.fix);
            continue;
        }
        out.push(b);
    }
    out
}

/// What a scenario did on each backend it ran on.
#[derive(Debug)]
pub struct Runs(pub Vec<(&'static str, Outcome)>);

impl Runs {
    /// Every run exited 0 and printed `PASS <scenario>`.
    pub fn assert_pass(&self, scenario: &str) {
        for (backend, out) in &self.0 {
            assert!(
                out.code == Some(0) && out.stdout.contains(&format!("PASS {scenario}")),
                "{scenario} failed on the {backend} fault backend: {out:#?}"
            );
        }
    }

    /// The runs, with their backend.
    pub fn iter(&self) -> impl Iterator<Item = &(&'static str, Outcome)> {
        self.0.iter()
    }
}

/// Runs `scenario` on `n` local nodes, once per fault backend.
pub fn run(scenario: &str, n: usize, slot: u64) -> Runs {
    run_with(scenario, n, slot, &[])
}

/// Runs `scenario` on `n` local nodes with extra environment variables (applied last, so they
/// may override the heap size), once per fault backend.
pub fn run_with(scenario: &str, n: usize, slot: u64, env: &[(&str, &str)]) -> Runs {
    Runs(backends().into_iter().map(|b| (b, run_on(b, scenario, n, slot, env))).collect())
}

/// Runs `scenario` on `n` local nodes on fault backend `backend` (`TMK_FAULTS`).
pub fn run_on(backend: &str, scenario: &str, n: usize, slot: u64, env: &[(&str, &str)]) -> Outcome {
    let mut cmd = testnode();
    cmd.args([scenario, "-n", &n.to_string()])
        .env("TMK_FAULTS", backend)
        .env("TMK_HEAP_SIZE", "64MiB")
        .env("TMK_HEAP_BASE", heap_base(slot))
        .env("TMK_CONNECT_TIMEOUT", "20");
    cmd.envs(env.iter().copied());
    Job::spawn(cmd).wait(Duration::from_secs(120))
}
