//! Garbage collection at barriers, on real processes.

mod support;

use support::{run, run_with};

#[test]
fn a_long_run_with_a_small_threshold_collects_and_stays_bounded() {
    // 2000 barriers; 256 KiB threshold, checked against peak + 256 KiB slack on every node, and
    // diff memory reserved at startup for it (two 2 MiB chunks), none mapped afterwards (the
    // node checks both).
    let runs = run_with("gc-long", 4, 20, &[("TMK_GC_THRESHOLD", "262144")]);
    runs.assert_pass("gc-long");
    for (backend, out) in runs.iter() {
        assert_eq!(out.stdout.matches("collections, peak").count(), 4, "{backend}: {out:#?}");
    }
}

#[test]
fn lock_protected_updates_survive_collections() {
    run("gc-counter", 4, 21).assert_pass("gc-counter");
}

#[test]
fn a_node_that_dropped_a_page_fetches_a_whole_copy() {
    run("gc-base-copy", 3, 22).assert_pass("gc-base-copy");
    run("gc-base-copy", 4, 23).assert_pass("gc-base-copy");
}
