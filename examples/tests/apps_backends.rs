//! A subset of the apps on the other fault backend, `mprotect` (the suites in `apps1`..`apps3`
//! run on the default, userfaultfd where the kernel offers it), and the apps whose large views
//! stream (`protocol/stream.rs`) with streaming from 4 pages on, on both backends, so that their
//! small runs stream too: at 2 and 3 nodes, each run verified against the sequential computation.

use treadmarks_tests::check_app_dsm;

/// The mprotect backend refuses heaps of more than ~250 MiB (one mapping per page at worst).
const MPROTECT: &[(&str, &str)] = &[("TMK_FAULTS", "mprotect"), ("TMK_HEAP_SIZE", "64MiB")];
/// Streaming from 4 pages on, on the default backend.
const STREAMING: &[(&str, &str)] = &[("TMK_STREAM_MIN_PAGES", "4"), ("TMK_HEAP_SIZE", "64MiB")];
/// Both.
const MPROTECT_STREAMING: &[(&str, &str)] =
    &[("TMK_FAULTS", "mprotect"), ("TMK_STREAM_MIN_PAGES", "4"), ("TMK_HEAP_SIZE", "64MiB")];

/// `app` at 2 and 3 nodes with `env`; heap slots `slot`, `slot + 1` (distinct modulo 64 across
/// this file's tests, which run at once).
fn on(exe: &str, slot: u64, args: &[&str], env: &[(&str, &str)]) {
    check_app_dsm(exe, slot, &[2, 3], args, env);
}

#[test]
fn sor_on_mprotect() {
    let args = ["--rows", "67", "--cols", "130", "--iterations", "7"];
    on(env!("CARGO_BIN_EXE_sor"), 0, &args, MPROTECT);
}

#[test]
fn lu_on_mprotect() {
    on(env!("CARGO_BIN_EXE_lu"), 2, &["--size", "288", "--block", "32"], MPROTECT);
}

#[test]
fn water_on_mprotect() {
    on(env!("CARGO_BIN_EXE_water"), 4, &["--molecules", "128", "--steps", "2"], MPROTECT);
}

#[test]
fn qsort_streaming_on_both_backends() {
    let args = ["--keys", "100000", "--threshold", "4096"];
    on(env!("CARGO_BIN_EXE_qsort"), 6, &args, STREAMING);
    on(env!("CARGO_BIN_EXE_qsort"), 8, &args, MPROTECT_STREAMING);
}

#[test]
fn radix_streaming_on_both_backends() {
    let args = ["--keys", "100003", "--bits", "8"];
    on(env!("CARGO_BIN_EXE_radix"), 10, &args, STREAMING);
    on(env!("CARGO_BIN_EXE_radix"), 12, &args, MPROTECT_STREAMING);
}

#[test]
fn matmul_and_barnes_streaming_on_both_backends() {
    on(env!("CARGO_BIN_EXE_matmul"), 14, &["--size", "131"], STREAMING);
    on(env!("CARGO_BIN_EXE_matmul"), 16, &["--size", "131"], MPROTECT_STREAMING);
    let args = ["--bodies", "4096", "--steps", "2"];
    on(env!("CARGO_BIN_EXE_barnes"), 18, &args, STREAMING);
    on(env!("CARGO_BIN_EXE_barnes"), 20, &args, MPROTECT_STREAMING);
}
