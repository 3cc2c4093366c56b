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

/// A program synchronizing with locks alone, each node with a lock of its own (no message goes
/// out): its consistency data grows until an acquire fails with a typed error naming it, after
/// warnings at twice the collection threshold and at each doubling; a collection then lets the
/// node go on.
#[test]
fn a_lock_only_program_is_warned_then_stopped_at_its_consistency_limit() {
    let env = [("TMK_GC_THRESHOLD", "8192"), ("TMK_CONSISTENCY_LIMIT", "98304")];
    let runs = run_with("lock-only", 2, 24, &env);
    runs.assert_pass("lock-only");
    for (backend, out) in runs.iter() {
        for node in 0..2 {
            let limit = format!("NODE {node} LIMIT AFTER ");
            assert!(out.stdout.contains(&limit), "{backend}: node {node} never failed: {out:#?}");
            let warned = format!("node {node}: warning: consistency data is ");
            assert!(out.stderr.matches(&warned).count() >= 2, "{backend}: node {node}: {out:#?}");
        }
        assert!(out.stdout.contains("over this node's limit of 98304"), "{backend}: {out:#?}");
    }
}
