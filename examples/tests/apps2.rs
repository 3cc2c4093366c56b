//! water, barnes and tsp at small sizes: DSM mode on 1 to 4 nodes, threads on 1 to 4 threads
//! and one seq run each, every run checked against the sequential computation (the app prints
//! PASS); and water's check failing a run that lost one force update.

use std::process::Command;
use std::time::Duration;
use treadmarks_tests::{Job, check_app_modes, heap_base};

/// Every mode of one app at a small size; heap slots `slot .. slot + 5`.
fn all_modes(exe: &str, slot: u64, size: &[&str]) {
    check_app_modes(exe, slot, size);
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

/// A lost update fails the run: node 1 leaves out one molecule's force update in the last step
/// (the app's test hook), which moves the result far less than the old check's 1e-6 on
/// positions and energies let pass; the check of every order of the molecules' state sees it.
#[test]
fn water_fails_a_run_that_lost_a_force_update() {
    for molecule in ["0", "100"] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_water"));
        cmd.args(["-n", "2", "--molecules", "128", "--steps", "2"])
            .env("WATER_TEST_DROP_FORCE", molecule)
            .env("TMK_HEAP_BASE", heap_base(106))
            .env("TMK_HEAP_SIZE", "192MiB")
            .env("TMK_CONNECT_TIMEOUT", "20");
        let out = Job::spawn(cmd).wait(Duration::from_secs(120));
        assert_eq!(out.code, Some(1), "molecule {molecule}: {out:#?}");
        assert!(out.stdout.lines().any(|l| l == "FAIL"), "molecule {molecule}: {out:#?}");
        assert!(!out.stdout.lines().any(|l| l == "PASS"), "molecule {molecule}: {out:#?}");
    }
}
