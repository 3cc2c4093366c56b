//! The sorting apps (`qsort`, `is`, `radix`) at small sizes: DSM mode on 1 to 4 nodes, and one
//! `threads` and one `seq` run each, every run checked against the sequential result.

use std::process::Command;
use std::time::Duration;
use treadmarks_tests::{Job, heap_base};

/// Runs `bin` with `args` on heap slot `slot` and asserts it passed.
fn run(bin: &str, slot: u64, args: &[&str]) {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env("TMK_HEAP_SIZE", "256MiB")
        .env("TMK_HEAP_BASE", heap_base(slot))
        .env("TMK_CONNECT_TIMEOUT", "20");
    let out = Job::spawn(cmd).wait(Duration::from_secs(120));
    assert!(out.code == Some(0) && out.stdout.contains("PASS"), "{bin} {args:?} failed: {out:#?}");
}

/// DSM runs on 1 to 4 nodes (heap slots `slot0 + n`), then one `threads` and one `seq` run.
fn all_modes(bin: &str, slot0: u64, size: &[&str]) {
    for n in 1..=4u64 {
        run(bin, slot0 + n, &[&["-n", &n.to_string(), "--mode", "dsm"], size].concat());
    }
    run(bin, slot0 + 5, &[&["-n", "3", "--mode", "threads"], size].concat());
    run(bin, slot0 + 6, &[&["--mode", "seq"], size].concat());
}

#[test]
fn qsort_sorts_on_one_to_four_nodes() {
    all_modes(env!("CARGO_BIN_EXE_qsort"), 150, &["--keys", "100000", "--threshold", "4096"]);
}

#[test]
fn is_ranks_on_one_to_four_nodes() {
    all_modes(env!("CARGO_BIN_EXE_is"), 160, &["--log2keys", "16", "--log2max", "12", "--iterations", "10"]);
}

#[test]
fn radix_sorts_on_one_to_four_nodes() {
    all_modes(env!("CARGO_BIN_EXE_radix"), 170, &["--keys", "100003", "--bits", "8"]);
}
