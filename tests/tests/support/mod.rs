//! Running node processes from tests: bounded waits, and every process reaped even when a test
//! fails (each job runs in its own process group, killed whole on timeout or drop).

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

/// Runs `scenario` on `n` local nodes.
pub fn run(scenario: &str, n: usize, slot: u64) -> Outcome {
    run_with(scenario, n, slot, &[])
}

/// Runs `scenario` on `n` local nodes with extra environment variables.
pub fn run_with(scenario: &str, n: usize, slot: u64, env: &[(&str, &str)]) -> Outcome {
    let mut cmd = testnode();
    cmd.envs(env.iter().copied());
    cmd.args([scenario, "-n", &n.to_string()])
        .env("TMK_HEAP_SIZE", "64MiB")
        .env("TMK_HEAP_BASE", heap_base(slot))
        .env("TMK_CONNECT_TIMEOUT", "20");
    Job::spawn(cmd).wait(Duration::from_secs(120))
}
