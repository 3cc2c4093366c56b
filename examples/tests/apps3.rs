//! The sorting apps (`qsort`, `is`, `radix`) at small sizes: DSM mode on 1 to 4 nodes, `threads`
//! on 1 to 4 threads and one `seq` run each, every run checked against the sequential result;
//! radix's message-passing version on 1 to 4 processes too.

use treadmarks_tests::{check_app_in_mode, check_app_modes};

/// Every mode of one app at a small size; heap slots `slot .. slot + 5`.
fn all_modes(exe: &str, slot: u64, size: &[&str]) {
    check_app_modes(exe, slot, size);
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

#[test]
fn radix_message_passing_sorts_on_one_to_four_processes() {
    let size = ["--keys", "100003", "--bits", "8"];
    check_app_in_mode(env!("CARGO_BIN_EXE_radix"), "mp", 176, &[1, 2, 3, 4], &size);
}
