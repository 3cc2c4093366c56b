//! jacobi3d, matmul, lu and fft at small sizes: DSM mode on 1 to 4 nodes (3 catches
//! partitioning off-by-ones), plus one threads and one seq run each, every run verified against
//! the sequential computation by the app itself (it prints PASS and exits 0).

use std::process::Command;
use std::time::Duration;
use treadmarks_tests::{Job, Outcome, heap_base};

/// Runs `exe` with `-n nprocs --mode mode` and `args`, on heap slot `slot`.
fn run(exe: &str, mode: &str, nprocs: usize, args: &[&str], slot: u64) -> Outcome {
    let mut cmd = Command::new(exe);
    cmd.args(["-n", &nprocs.to_string(), "--mode", mode])
        .args(args)
        .env("TMK_HEAP_SIZE", "256MiB")
        .env("TMK_HEAP_BASE", heap_base(slot))
        .env("TMK_CONNECT_TIMEOUT", "20");
    Job::spawn(cmd).wait(Duration::from_secs(120))
}

/// Every DSM size from 1 to 4 nodes, then threads on 3 and seq; app `index` uses heap slots
/// `30 + 6 * index ..`.
fn check_app(exe: &str, index: u64, args: &[&str]) {
    let runs = [("dsm", 1), ("dsm", 2), ("dsm", 3), ("dsm", 4), ("threads", 3), ("seq", 1)];
    for (k, (mode, nprocs)) in runs.into_iter().enumerate() {
        let out = run(exe, mode, nprocs, args, 30 + 6 * index + k as u64);
        assert!(
            out.code == Some(0) && out.stdout.contains("PASS"),
            "{exe} --mode {mode} -n {nprocs} {args:?} failed: {out:#?}"
        );
    }
}

#[test]
fn jacobi3d_matches_sequential() {
    let args = ["--nx", "33", "--ny", "20", "--nz", "24", "--iterations", "5"];
    check_app(env!("CARGO_BIN_EXE_jacobi3d"), 0, &args);
}

#[test]
fn matmul_matches_sequential() {
    check_app(env!("CARGO_BIN_EXE_matmul"), 1, &["--size", "131"]);
}

#[test]
fn lu_matches_sequential() {
    check_app(env!("CARGO_BIN_EXE_lu"), 2, &["--size", "288", "--block", "32"]);
}

#[test]
fn fft_matches_sequential_and_inverts() {
    check_app(env!("CARGO_BIN_EXE_fft"), 3, &["--log2n", "12"]);
}
