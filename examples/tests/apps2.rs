//! water, barnes and tsp at small sizes: DSM mode on 1 to 4 nodes, plus one threads and one seq
//! run each, every run checked against the sequential computation (the app prints PASS).

use treadmarks_tests::check_app_modes;

/// Every mode of one app at a small size; heap slots `slot .. slot + 6`.
fn all_modes(exe: &str, slot: u64, size: &[&str]) {
    check_app_modes(exe, slot, 2, size);
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
