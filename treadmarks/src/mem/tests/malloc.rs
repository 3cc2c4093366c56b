//! The service thread's allocator heap, backed at startup (`mem/malloc.rs`). The allocator's
//! settings are process-wide, so each case runs in a child process.

use super::{run_in_child, test_name};
use crate::mem::malloc::{keep_freed, warm_thread_heap};
use crate::mem::probe::thread_minor_faults;

/// On a fresh thread, after `prepare`: the minor faults taken while 4 MiB of state is built in
/// 256 KiB pieces, written, and dropped, twice (as a fetch's misses and replies are).
fn faults_building_state(prepare: impl FnOnce() + Send + 'static) -> u64 {
    std::thread::spawn(move || {
        prepare();
        let before = thread_minor_faults().expect("getrusage(RUSAGE_THREAD)");
        for _ in 0..2 {
            let pieces: Vec<Vec<u8>> = (0..16).map(|k| vec![k as u8 + 1; 256 << 10]).collect();
            std::hint::black_box(&pieces);
        }
        thread_minor_faults().expect("getrusage(RUSAGE_THREAD)") - before
    })
    .join()
    .expect("the state-building thread")
}

#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn a_warmed_thread_heap_takes_no_fault_for_state_built_later() {
    let out = run_in_child(test_name!(a_warmed_thread_heap_takes_no_fault_for_state_built_later), || {
        let faults = faults_building_state(|| {
            assert!(keep_freed(), "glibc took the settings");
            warm_thread_heap(8 << 20);
        });
        println!("faults {faults}");
        assert!(faults < 64, "{faults} faults building 4 MiB twice on a warmed heap");
    });
    out.assert_success();
}

#[test]
fn without_it_the_same_state_faults_in_every_time() {
    let out = run_in_child(test_name!(without_it_the_same_state_faults_in_every_time), || {
        let faults = faults_building_state(|| {});
        println!("faults {faults}");
        // 256 KiB pieces are mapped on their own and unmapped when freed: 2 x 4 MiB of fresh pages.
        assert!(faults >= 1024, "only {faults} faults building 4 MiB twice on a cold heap");
    });
    out.assert_success();
}
