//! Running node processes from tests: bounded waits, and every process reaped even when a test
//! fails (each job runs in its own process group, killed whole on timeout or drop) or the test
//! process is killed (`treadmarks_tests::die_with_this_thread`). Jobs inherit no `TMK_*`
//! variable but `TMK_FAULTS` (`treadmarks_tests::hermetic`).
//!
//! [`run`] and [`run_with`] run a scenario once per fault backend (`TMK_FAULTS=mprotect`, then
//! `TMK_FAULTS=uffd`), so every cluster test covers both. The userfaultfd run is skipped, with the
//! reason printed, where the kernel does not offer it (a failure with `TMK_REQUIRE_UFFD=1`).
//! Setting `TMK_FAULTS=mprotect` or `TMK_FAULTS=uffd` in the test environment runs only that
//! backend; asked for and not offered by the kernel, it fails every test that runs jobs, naming
//! it, rather than letting them pass with no run.

#![allow(dead_code)]

use std::process::Command;
use std::time::Duration;
pub use treadmarks_tests::{Job, Outcome, heap_base};

/// The test node binary.
pub fn testnode() -> Command {
    // `Job::spawn` removes the caller's `TMK_*` variables (`TMK_RANK`, `TMK_LOCKS`, ...) but
    // `TMK_FAULTS`, which `run_on` sets anyway.
    Command::new(env!("CARGO_BIN_EXE_tmk-testnode"))
}

/// The fault backends to test: both, or the one `TMK_FAULTS` names; userfaultfd only where the
/// kernel offers it (otherwise the reason is printed once per call, or, with
/// `TMK_REQUIRE_UFFD=1`, the test fails). Never empty: a backend asked for that the kernel does
/// not offer, or a `TMK_FAULTS` naming none, panics.
pub fn backends() -> Vec<&'static str> {
    let faults = std::env::var("TMK_FAULTS").ok();
    backends_for(faults.as_deref(), treadmarks_tests::uffd_required(), treadmarks::mem::uffd_support)
}

/// [`backends`] with `TMK_FAULTS` = `faults`, `TMK_REQUIRE_UFFD=1` or not, and `uffd` saying
/// whether the kernel offers it.
pub fn backends_for(
    faults: Option<&str>,
    require_uffd: bool,
    uffd: impl FnOnce() -> Result<(), treadmarks::mem::UffdUnavailable>,
) -> Vec<&'static str> {
    match faults.unwrap_or("") {
        // Unset or empty (unset, to the runtime), or the runtime's default: both.
        "" | "auto" => match uffd() {
            Ok(()) => vec!["mprotect", "uffd"],
            Err(u) if require_uffd => panic!(
                "TMK_REQUIRE_UFFD=1, and this kernel does not offer the uffd fault backend: {} ({})",
                u.why, u.fix
            ),
            Err(u) => {
                println!("skipping the uffd backend: {} ({})", u.why, u.fix);
                vec!["mprotect"]
            }
        },
        "mprotect" => vec!["mprotect"],
        "uffd" => match uffd() {
            Ok(()) => vec!["uffd"],
            Err(u) => panic!(
                "TMK_FAULTS=uffd asks for the uffd fault backend only, and this kernel does not offer \
                 it: {} ({}); unset TMK_FAULTS to test the mprotect backend alone",
                u.why, u.fix
            ),
        },
        other => panic!("TMK_FAULTS={other:?} names no fault backend (auto, uffd or mprotect)"),
    }
}

/// What a scenario did on each backend it ran on.
#[derive(Debug)]
pub struct Runs(pub Vec<(&'static str, Outcome)>);

impl Runs {
    /// Every run exited 0 and printed `PASS <scenario>`; there was at least one.
    pub fn assert_pass(&self, scenario: &str) {
        for (backend, out) in self.iter() {
            assert!(
                out.code == Some(0) && out.stdout.contains(&format!("PASS {scenario}")),
                "{scenario} failed on the {backend} fault backend: {out:#?}"
            );
        }
    }

    /// The runs, with their backend; panics if there are none (a test checking each would pass
    /// having checked nothing).
    pub fn iter(&self) -> impl Iterator<Item = &(&'static str, Outcome)> {
        assert!(!self.0.is_empty(), "no run: the scenario ran on no fault backend");
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
    Job::spawn(command_on(backend, scenario, n, slot, env)).wait(Duration::from_secs(120))
}

/// The command [`run_on`] runs.
pub fn command_on(backend: &str, scenario: &str, n: usize, slot: u64, env: &[(&str, &str)]) -> Command {
    let mut cmd = testnode();
    cmd.args([scenario, "-n", &n.to_string()])
        .env("TMK_FAULTS", backend)
        .env("TMK_HEAP_SIZE", "64MiB")
        .env("TMK_HEAP_BASE", heap_base(slot))
        .env("TMK_CONNECT_TIMEOUT", "20");
    cmd.envs(env.iter().copied());
    cmd
}
