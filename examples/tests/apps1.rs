//! sor, jacobi3d, matmul, lu and fft at small sizes: DSM mode on 1 to 4 nodes (3 catches
//! partitioning off-by-ones), threads on 1 to 4 threads and one seq run each, every run verified
//! against the sequential computation by the app itself (it prints PASS and exits 0).

use treadmarks_tests::check_app_modes;

/// App `index` uses heap slots `30 + 6 * index ..`.
fn check_app(exe: &str, index: u64, args: &[&str]) {
    check_app_modes(exe, 30 + 6 * index, args);
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

#[test]
fn sor_matches_sequential() {
    check_app(env!("CARGO_BIN_EXE_sor"), 4, &["--rows", "67", "--cols", "130", "--iterations", "7"]);
}
