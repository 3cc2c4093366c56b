//! water, barnes and tsp at small sizes: DSM mode on 1 to 4 nodes, plus one threads and one seq
//! run each, every run checked against the sequential computation (the app prints PASS).

use std::process::Command;
use std::time::Duration;
use treadmarks_tests::{Job, Outcome, heap_base};

/// Runs `exe` with `args`, its heap in `slot`, and checks that it passed.
fn run(exe: &str, slot: u64, args: &[&str]) -> Outcome {
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env("TMK_HEAP_SIZE", "256MiB")
        .env("TMK_HEAP_BASE", heap_base(slot))
        .env("TMK_CONNECT_TIMEOUT", "20");
    let out = Job::spawn(cmd).wait(Duration::from_secs(120));
    assert!(out.code == Some(0) && out.stdout.contains("PASS"), "{exe} {args:?} failed: {out:#?}");
    eprintln!("{:?}: {}", out.elapsed, out.stdout.lines().next().unwrap_or_default());
    out
}

/// Every mode of one app at a small size; heap slots `slot..slot + 6`.
fn all_modes(exe: &str, slot: u64, size: &[&str]) {
    for n in 1..=4u64 {
        let n_arg = n.to_string();
        let mut args = vec!["-n", &n_arg, "--mode", "dsm"];
        args.extend_from_slice(size);
        run(exe, slot + n - 1, &args);
    }
    let mut args = vec!["-n", "2", "--mode", "threads"];
    args.extend_from_slice(size);
    run(exe, slot + 4, &args);
    let mut args = vec!["--mode", "seq"];
    args.extend_from_slice(size);
    run(exe, slot + 5, &args);
}

#[test]
fn water_small() {
    all_modes(env!("CARGO_BIN_EXE_water"), 100, &["--molecules", "128", "--steps", "2"]);
}

#[test]
fn barnes_small() {
    all_modes(env!("CARGO_BIN_EXE_barnes"), 110, &["--bodies", "4096", "--steps", "2"]);
}

#[test]
fn tsp_small() {
    all_modes(env!("CARGO_BIN_EXE_tsp"), 120, &["--cities", "13", "--solve-below", "9"]);
}
