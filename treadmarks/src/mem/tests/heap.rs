//! In-process tests: mapping, `HeapPages` checks, the probe. None of them faults on the heap.

use std::panic::{AssertUnwindSafe, catch_unwind};

use super::{layout, present, test_base, uffd_write_protected};
use crate::mem::state;
use crate::mem::{FaultBackend, Heap, HeapLayout, HeapPages, MemError, probe};
use crate::protocol::ids::PageIdx;
use crate::protocol::memory::{Access, PageMemory};

#[test]
fn maps_at_fixed_base_and_refuses_overlap() {
    let l = layout(1, 64);
    let heap = Heap::map(l).expect("map the first heap");
    // The test is the runtime, its application waiting in a call.
    let _inside = heap.app_inside();
    assert_eq!(heap.app_base() as usize, l.base);
    assert_eq!(heap.size(), l.size);
    assert_eq!(heap.page_size(), 4096);
    assert_eq!(heap.npages(), 64);
    // Every page starts valid and zero (read-only, so reading does not fault).
    // SAFETY: inside the application view, readable (protect = true gives PROT_READ).
    let byte = unsafe { std::ptr::read_volatile(heap.app_base().add(l.size - 1)) };
    assert_eq!(byte, 0);
    let pages = HeapPages::claim(heap.clone()).expect("the heap's pages");
    assert_eq!(pages.access(PageIdx(63)), Access::Read);
    assert!(pages.page(PageIdx(63)).iter().all(|&b| b == 0));
    // One page memory and one view tracker per heap: a second of either could hand out a
    // `&mut` aliasing the first's.
    assert!(HeapPages::claim(heap.clone()).is_none(), "a second HeapPages");
    let tracker = crate::mem::BorrowTracker::claim(heap.clone()).expect("the heap's tracker");
    assert!(crate::mem::BorrowTracker::claim(heap.clone()).is_none(), "a second tracker");
    // A made-up handle whose slice would wrap around the address space is refused, not turned
    // into a view of other bytes.
    let huge = crate::mem::Shared::<[u64]>::from_raw_parts(8, u64::MAX / 4);
    let wrapped = huge.slice(1 << 61, (1 << 61) + 1);
    let err = tracker.view(&wrapped).map(|v| v.len()).expect_err("no heap holds it");
    assert!(matches!(err, crate::mem::ViewError::OutOfBounds { .. }), "{err:?}");
    drop(tracker);

    let err = Heap::map(l).expect_err("a second heap over the same range must fail");
    assert!(matches!(err, MemError::AddressInUse { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("{:#x}", l.base)), "message should name the address: {msg}");
    assert!(msg.contains("TMK_HEAP_BASE"), "{msg}");

    // Partial overlap fails too.
    let shifted = HeapLayout { base: l.base + 32 * 4096, ..l };
    assert!(matches!(Heap::map(shifted), Err(MemError::AddressInUse { .. })));

    drop(pages);
    drop(_inside);
    drop(heap);
    Heap::map(l).expect("the range is free again after drop");
}

#[test]
fn rejects_bad_layouts() {
    let base = test_base(2);
    for (l, what) in [
        (HeapLayout { base: base + 1, size: 4096, protect: true }, "misaligned base"),
        (HeapLayout { base, size: 100, protect: true }, "size not a page multiple"),
        (HeapLayout { base, size: 0, protect: true }, "zero size"),
        (HeapLayout { base: 0, size: 4096, protect: true }, "null base"),
    ] {
        let err = Heap::map(l).expect_err(what);
        assert!(matches!(err, MemError::InvalidLayout { .. }), "{what}: {err:?}");
        assert!(err.to_string().contains(&format!("{:#x}", l.base)), "{what}: {err}");
    }
}

#[test]
fn unprotected_heap_is_writable_without_a_handler() {
    let l = HeapLayout { protect: false, ..layout(3, 4) };
    let heap = Heap::map(l).unwrap();
    // The test is the runtime, its application waiting in a call.
    let _inside = heap.app_inside();
    let p = heap.app_base();
    // SAFETY: inside the application view, mapped read-write because protect = false.
    unsafe { std::ptr::write_volatile(p.add(4096 + 7), 42u8) };
    let mut pages = HeapPages(heap.clone());
    assert_eq!(pages.access(PageIdx(1)), Access::ReadWrite);
    pages.set_access(PageIdx(1), 1, Access::Read);
    assert_eq!(pages.page(PageIdx(1))[7], 42, "the runtime view sees the application's store");
    assert_eq!(heap.counters().fast_write_faults, 0);
}

#[test]
fn the_first_twin_of_a_never_written_page_takes_no_copy() {
    let heap = Heap::map(layout(30, 4)).unwrap();
    // The test is the runtime, its application waiting in a call.
    let _inside = heap.app_inside();
    let mut pages = HeapPages(heap.clone());
    // Page 1 was never written: its twin is the fresh slot's zeros, made without a copy.
    pages.make_twin(PageIdx(1));
    assert!(pages.twin(PageIdx(1)).iter().all(|&b| b == 0));
    assert_eq!(heap.counters().zero_twins, 1);
    // Page 2 was written by the runtime first: its twin is a copy.
    pages.set_access(PageIdx(2), 1, Access::None);
    pages.page_mut(PageIdx(2))[9] = 7;
    pages.set_access(PageIdx(2), 1, Access::Read);
    pages.make_twin(PageIdx(2));
    assert_eq!(pages.twin(PageIdx(2))[9], 7);
    // Page 1 again: no longer its first twin (the application may have written it since).
    pages.set_access(PageIdx(1), 1, Access::None);
    pages.page_mut(PageIdx(1))[0] = 3;
    pages.set_access(PageIdx(1), 1, Access::Read);
    pages.make_twin(PageIdx(1));
    assert_eq!(pages.twin(PageIdx(1))[0], 3);
    assert_eq!(heap.counters().zero_twins, 1);

    // Unprotected, the application may have written any page: a first twin is always a copy.
    let heap = Heap::map(HeapLayout { protect: false, ..layout(31, 2) }).unwrap();
    let _inside = heap.app_inside();
    // SAFETY: inside the application view, mapped read-write because protect = false.
    unsafe { std::ptr::write_volatile(heap.app_base().add(5), 42u8) };
    let mut pages = HeapPages(heap.clone());
    pages.set_access(PageIdx(0), 1, Access::Read);
    pages.make_twin(PageIdx(0));
    assert_eq!(pages.twin(PageIdx(0))[5], 42);
    assert_eq!(heap.counters().zero_twins, 0);
}

#[test]
fn a_skipped_twin_copies_nothing_but_the_next_twin_of_the_page_is_a_copy() {
    let heap = Heap::map(layout(50, 2)).unwrap();
    // The test is the runtime, its application waiting in a call.
    let _inside = heap.app_inside();
    let mut pages = HeapPages(heap.clone());
    // Page 1, never written, is declared overwritten: no twin, not even a zero one. The page
    // is made writable and the application writes it.
    pages.set_access(PageIdx(1), 1, Access::Read);
    pages.skip_twin(PageIdx(1));
    assert_eq!(heap.counters().zero_twins, 0);
    pages.set_access(PageIdx(1), 1, Access::ReadWrite);
    // SAFETY: inside the application view, page 1 just made writable.
    unsafe { std::ptr::write_volatile(heap.app_base().add(4096 + 3), 8u8) };
    pages.set_access(PageIdx(1), 1, Access::Read);
    // Its first real twin cannot take the fresh slot's zeros: the page was written.
    pages.make_twin(PageIdx(1));
    assert_eq!(pages.twin(PageIdx(1))[3], 8);
    assert_eq!(heap.counters().zero_twins, 0);
}

#[test]
fn a_page_made_writable_without_a_twin_is_copied_at_its_first_twin() {
    let heap = Heap::map(layout(52, 2)).unwrap();
    // The test is the runtime, its application waiting in a call.
    let _inside = heap.app_inside();
    let mut pages = HeapPages(heap.clone());
    // Page 0, never written nor twinned, made writable straight away: the application may
    // write it unseen (a writable page never faults), so its first twin must be a copy.
    pages.set_access(PageIdx(0), 1, Access::ReadWrite);
    // SAFETY: inside the application view, page 0 just made writable.
    unsafe { std::ptr::write_volatile(heap.app_base().add(11), 5u8) };
    pages.set_access(PageIdx(0), 1, Access::Read);
    pages.make_twin(PageIdx(0));
    assert_eq!(pages.twin(PageIdx(0))[11], 5);
    assert_eq!(heap.counters().zero_twins, 0);
}

#[test]
fn reading_a_valid_page_while_the_application_runs_is_refused() {
    let heap = Heap::map(layout(55, 2)).unwrap();
    let mut pages = HeapPages(heap.clone());
    // Read-only: the handler may twin it at a write, and the application write it, meanwhile.
    let refused = |pages: &HeapPages, what: &str| {
        let r = catch_unwind(AssertUnwindSafe(|| match what {
            "page" => pages.page(PageIdx(0)).len(),
            "twin" => pages.twin(PageIdx(0)).len(),
            _ => pages.page_while_blocked(PageIdx(0)).len(),
        }));
        let msg = r.expect_err(what);
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("while the application runs"), "{what}: {msg}");
    };
    for what in ["page", "twin", "page_while_blocked"] {
        refused(&pages, what);
    }
    // Inside a call it may; and an invalid page may always be read (nothing writes it).
    let inside = heap.app_inside();
    assert_eq!(pages.page(PageIdx(0)).len(), 4096);
    drop(inside);
    pages.set_access(PageIdx(1), 1, Access::None);
    assert_eq!(pages.page(PageIdx(1)).len(), 4096);
}

#[test]
#[should_panic(expected = "skip_twin(page 0)")]
fn skipping_the_twin_of_a_writable_page_is_refused() {
    let heap = Heap::map(layout(51, 1)).unwrap();
    let mut pages = HeapPages(heap);
    pages.set_access(PageIdx(0), 1, Access::ReadWrite);
    pages.skip_twin(PageIdx(0));
}

#[test]
fn an_invalidation_runs_across_pages_invalid_already() {
    invalidation_across_invalid_on(FaultBackend::Mprotect, 32);
    if super::uffd_or_skip() {
        invalidation_across_invalid_on(FaultBackend::Uffd, 33);
    }
}

fn invalidation_across_invalid_on(backend: FaultBackend, slot: usize) {
    let heap = Heap::map_with(layout(slot, 4), backend).unwrap();
    let mut pages = HeapPages(heap.clone());
    // Pages 0 and 2 valid and mapped; pages 1 and 3 invalid, page 1 with bytes of its own.
    pages.set_access(PageIdx(0), 4, Access::None);
    pages.page_mut(PageIdx(1))[0] = 5;
    pages.set_access(PageIdx(0), 1, Access::Read);
    pages.set_access(PageIdx(2), 1, Access::Read);
    let addr = |p: usize| heap.app_base() as usize + p * 4096;
    if backend == FaultBackend::Uffd {
        assert!(present(addr(0)) && present(addr(2)) && !present(addr(1)));
    }
    // One call over pages 1-3, which starts and ends on pages invalid already.
    let calls = heap.counters().protect_calls;
    pages.set_access(PageIdx(1), 3, Access::None);
    assert_eq!(heap.counters().protect_calls - calls, 1);
    for p in 1..4 {
        assert_eq!(pages.access(PageIdx(p)), Access::None, "page {p}");
    }
    assert_eq!(pages.access(PageIdx(0)), Access::Read);
    if backend == FaultBackend::Uffd {
        assert!(!present(addr(2)), "the valid page inside the run lost its entry");
        assert!(present(addr(0)), "the page before the run kept its entry");
    }
    assert_eq!(pages.page_mut(PageIdx(1))[0], 5, "bytes kept");
}

#[test]
fn a_freeze_of_scattered_pages_is_one_call_across_gaps_that_it_leaves_as_they_are() {
    // mprotect: one call per run (a span would make the invalid gap pages readable).
    freeze_scattered_on(FaultBackend::Mprotect, 53, 3);
    if super::uffd_or_skip() {
        freeze_scattered_on(FaultBackend::Uffd, 54, 1);
    }
}

fn freeze_scattered_on(backend: FaultBackend, slot: usize, calls_expected: u64) {
    let heap = Heap::map_with(layout(slot, 12), backend).unwrap();
    let mut pages = HeapPages(heap.clone());
    let addr = |p: usize| heap.app_base() as usize + p * 4096;
    // Pages 0, 3 and 6 written (to be frozen), 1 read-only, 2, 4 and 5 invalid, 7 writable;
    // then pages 8 and 10 written, with page 9 writable between them.
    pages.set_access(PageIdx(0), 12, Access::None);
    for p in [0, 3, 6, 7, 8, 9, 10] {
        pages.set_access(PageIdx(p), 1, Access::ReadWrite);
        // SAFETY: inside the application view, the page just made writable.
        unsafe { std::ptr::write_volatile((addr(p as usize) + 8) as *mut u8, p as u8 + 1) };
    }
    pages.set_access(PageIdx(1), 1, Access::Read);
    let calls = heap.counters().protect_calls;
    pages.write_protect_pages(&[PageIdx(0), PageIdx(3), PageIdx(6)], true);
    assert_eq!(heap.counters().protect_calls - calls, calls_expected);
    let state = |p: u32| state::name(state::load_stable(heap.state(p)));
    let states: Vec<&str> = (0..8).map(state).collect();
    assert_eq!(
        states,
        ["FROZEN", "READ_ONLY", "INVALID", "FROZEN", "INVALID", "INVALID", "FROZEN", "READ_WRITE"]
    );
    if backend == FaultBackend::Uffd {
        for p in [0, 1, 3, 6] {
            assert!(present(addr(p)) && uffd_write_protected(addr(p)), "page {p} mapped write-protected");
        }
        assert!(present(addr(7)) && !uffd_write_protected(addr(7)), "the page after the span untouched");
        assert!(!present(addr(2)) && !present(addr(4)), "invalid gap pages stay unmapped");
    }
    // SAFETY: frozen and read-only pages of the application view are readable.
    let read = |p: usize| unsafe { std::ptr::read_volatile((addr(p) + 8) as *const u8) };
    assert_eq!((read(0), read(3), read(6)), (1, 4, 7));
    // A writable page in a gap splits the span: pages 8 and 10 are frozen apart, page 9 kept.
    let calls = heap.counters().protect_calls;
    pages.write_protect_pages(&[PageIdx(8), PageIdx(10)], true);
    assert_eq!(heap.counters().protect_calls - calls, 2);
    assert_eq!((state(8), state(9), state(10)), ("FROZEN", "READ_WRITE", "FROZEN"));
    // Made read-only the same way, invalid pages among them mapped: pages 9 and 11 (writable,
    // invalid) with page 10 (frozen) between them, then page 2 (invalid, a gap of the first
    // span, given bytes meanwhile).
    pages.write_protect_pages(&[PageIdx(9), PageIdx(11)], false);
    assert_eq!((state(9), state(10), state(11)), ("READ_ONLY", "FROZEN", "READ_ONLY"));
    pages.page_mut(PageIdx(2))[8] = 42;
    pages.write_protect_pages(&[PageIdx(2)], false);
    assert_eq!(read(2), 42, "an invalid gap page maps as usual afterwards");
    if backend == FaultBackend::Uffd {
        assert!(present(addr(11)) && uffd_write_protected(addr(11)));
    }
    // A frozen page is made writable again.
    pages.set_access(PageIdx(3), 1, Access::ReadWrite);
    // SAFETY: inside the application view, the page just made writable.
    unsafe { std::ptr::write_volatile((addr(3) + 8) as *mut u8, 9) };
    assert_eq!(read(3), 9);
}

fn panic_message(r: Result<(), Box<dyn std::any::Any + Send>>) -> String {
    let payload = r.expect_err("should have panicked");
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[test]
fn heap_pages_enforce_the_page_sharing_rule() {
    page_sharing_rule_on(FaultBackend::Mprotect, 4);
}

#[test]
fn heap_pages_enforce_the_page_sharing_rule_on_userfaultfd() {
    // No fault is taken: every application-view access below is to a page whose PTE is mapped
    // readable (or that the kernel fills in itself), so no handler is needed in-process.
    if super::uffd_or_skip() {
        page_sharing_rule_on(FaultBackend::Uffd, 5);
    }
}

fn page_sharing_rule_on(backend: FaultBackend, slot: usize) {
    let heap = Heap::map_with(layout(slot, 8), backend).unwrap();
    // The test is the runtime, its application waiting in a call.
    let _inside = heap.app_inside();
    let mut pages = HeapPages(heap.clone());

    pages.set_access(PageIdx(0), 2, Access::ReadWrite);
    assert_eq!(pages.access(PageIdx(0)), Access::ReadWrite);
    let msg = panic_message(catch_unwind(AssertUnwindSafe(|| {
        pages.page(PageIdx(0));
    })));
    assert!(msg.contains("page 0") && msg.contains("ReadWrite"), "{msg}");
    let msg = panic_message(catch_unwind(AssertUnwindSafe(|| pages.make_twin(PageIdx(1)))));
    assert!(msg.contains("make_twin(page 1)"), "{msg}");
    assert_eq!(pages.access(PageIdx(1)), Access::ReadWrite, "a refused make_twin leaves the state alone");

    assert_eq!(pages.access(PageIdx(2)), Access::Read);
    let msg = panic_message(catch_unwind(AssertUnwindSafe(|| {
        pages.page_mut(PageIdx(2));
    })));
    assert!(msg.contains("page_mut(page 2)") && msg.contains("READ_ONLY"), "{msg}");
    let msg = panic_message(catch_unwind(AssertUnwindSafe(|| pages.set_access(PageIdx(7), 2, Access::None))));
    assert!(msg.contains("out of range"), "{msg}");

    // A frozen page (its twin being cut): reported as no access, readable by the runtime and
    // the application, never written by the runtime.
    pages.set_access(PageIdx(2), 1, Access::None);
    pages.set_access(PageIdx(2), 1, Access::ReadWrite); // mapped (UFFDIO_CONTINUE) and writable
    pages.freeze(PageIdx(2), 1);
    assert_eq!(pages.access(PageIdx(2)), Access::None);
    let msg = panic_message(catch_unwind(AssertUnwindSafe(|| {
        pages.page_mut(PageIdx(2));
    })));
    assert!(msg.contains("page_mut(page 2)") && msg.contains("FROZEN"), "{msg}");
    pages.make_twin(PageIdx(2));
    assert_eq!(pages.page(PageIdx(2)), pages.twin(PageIdx(2)));
    // SAFETY: a frozen page of the application view is readable.
    let byte = unsafe { std::ptr::read_volatile(heap.app_base().add(2 * 4096 + 100)) };
    assert_eq!(byte, 0, "a frozen page reads");
    pages.set_access(PageIdx(2), 1, Access::Read);
    assert_eq!(pages.access(PageIdx(2)), Access::Read);

    pages.set_access(PageIdx(3), 1, Access::None);
    // Freezing an invalid page would let its stale bytes be read: refused, naming it.
    for freeze in [
        |p: &mut HeapPages| p.freeze(PageIdx(2), 2),
        |p: &mut HeapPages| p.write_protect_pages(&[PageIdx(3)], true),
    ] {
        let msg = panic_message(catch_unwind(AssertUnwindSafe(|| freeze(&mut pages))));
        assert!(msg.contains("freeze(page 3)") && msg.contains("invalid"), "{msg}");
        assert_eq!((pages.access(PageIdx(2)), pages.access(PageIdx(3))), (Access::Read, Access::None));
    }
    // Allowed uses: write an invalid page, twin it, read it back.
    pages.page_mut(PageIdx(3)).fill(0x5a);
    pages.make_twin(PageIdx(3));
    assert_eq!(pages.access(PageIdx(3)), Access::None, "make_twin keeps the state");
    assert!(pages.twin(PageIdx(3)).iter().all(|&b| b == 0x5a));
    pages.set_access(PageIdx(3), 1, Access::Read);
    assert!(pages.page(PageIdx(3)).iter().all(|&b| b == 0x5a));
    // SAFETY: page 3 of the application view is readable now.
    let byte = unsafe { std::ptr::read_volatile(heap.app_base().add(3 * 4096 + 100)) };
    assert_eq!(byte, 0x5a, "the application view shows the runtime's write");

    // While the application waits in a synchronization call, the runtime reads a writable
    // page and renews its twin without revoking access; never an invalid page.
    pages.make_twin(PageIdx(3));
    pages.set_access(PageIdx(3), 1, Access::ReadWrite);
    // SAFETY: page 3 of the application view is writable now, and no reference to it lives.
    unsafe { std::ptr::write_bytes(heap.app_base().add(3 * 4096), 0x66, 4096) };
    assert!(pages.page_while_blocked(PageIdx(3)).iter().all(|&b| b == 0x66));
    assert!(pages.twin(PageIdx(3)).iter().all(|&b| b == 0x5a), "the old twin");
    pages.renew_twin_while_blocked(PageIdx(3));
    assert!(pages.twin(PageIdx(3)).iter().all(|&b| b == 0x66), "the renewed twin");
    assert_eq!(pages.access(PageIdx(3)), Access::ReadWrite, "renewing keeps the state");
    pages.set_access(PageIdx(4), 1, Access::None);
    let msg = panic_message(catch_unwind(AssertUnwindSafe(|| {
        pages.page_while_blocked(PageIdx(4));
    })));
    assert!(msg.contains("page_while_blocked(page 4)") && msg.contains("invalid"), "{msg}");
    let msg = panic_message(catch_unwind(AssertUnwindSafe(|| pages.renew_twin_while_blocked(PageIdx(4)))));
    assert!(msg.contains("renew_twin_while_blocked(page 4)"), "{msg}");
    assert_eq!(pages.access(PageIdx(4)), Access::None, "a refused renewal leaves the state alone");

    // It also brings a read-only page up to date where it stands: the application view shows
    // the write at once, still read-only, with no protection change; never a writable page.
    pages.set_access(PageIdx(3), 1, Access::Read);
    let calls = heap.counters().protect_calls;
    pages.page_mut_while_blocked(PageIdx(3)).fill(0x77);
    // SAFETY: page 3 of the application view is readable.
    let byte = unsafe { std::ptr::read_volatile(heap.app_base().add(3 * 4096 + 100)) };
    assert_eq!(byte, 0x77, "the application view shows the write in place");
    assert_eq!((pages.access(PageIdx(3)), heap.counters().protect_calls), (Access::Read, calls));
    pages.set_access(PageIdx(5), 1, Access::ReadWrite);
    let msg = panic_message(catch_unwind(AssertUnwindSafe(|| {
        pages.page_mut_while_blocked(PageIdx(5));
    })));
    assert!(msg.contains("page_mut_while_blocked(page 5)") && msg.contains("not read-only"), "{msg}");
    assert_eq!(heap.counters().protect_calls, 11);
}

#[test]
fn probe_measures_a_positive_fault_cost_of_protection_faults_only() {
    let bare = probe::bare_fault(256).expect("probe");
    assert!(bare.ns_per_fault > 0.0 && bare.ns_per_fault.is_finite(), "{bare:?}");
    // Its pages are backed before they are protected: a timed write allocates no page (were
    // they the zero page, each of the 256 would).
    assert!(bare.minor_faults < 64, "{bare:?}");
    assert!(probe::bare_fault_ns(0).is_err());
}

/// The refusal of a 2 GiB mprotect heap of `pages` pages, checked.
fn assert_map_count_refusal(err: &MemError, pages: u64, limit: u64) {
    let npages = u32::try_from(pages).unwrap();
    assert!(matches!(err, MemError::MapCountTooLow { npages: n, .. } if *n == npages), "{err:?}");
    let msg = err.to_string();
    for want in ["vm.max_map_count", "TMK_FAULTS=uffd", "TMK_HEAP_SIZE", "2 GiB"] {
        assert!(msg.contains(want), "the message should name {want:?} (limit {limit}): {msg}");
    }
}

/// A 2 GiB mprotect heap is refused where its pages and the margin alone pass
/// `vm.max_map_count` (the kernel default, 65,530, with 4 KiB pages), and mapped where the limit
/// leaves room for them and far more mappings than this test process has (hosts that raise it
/// to 1,048,576): `check_map_count` counts the mappings in use, which other tests change.
#[test]
fn mprotect_refuses_a_heap_past_the_map_count_and_names_the_limit() {
    let l = HeapLayout { base: test_base(6), size: 2 << 30, protect: true };
    let limit: u64 = std::fs::read_to_string("/proc/sys/vm/max_map_count").unwrap().trim().parse().unwrap();
    let pages = (l.size / super::super::heap::system_page_size()) as u64;
    let need = pages + crate::mem::MAP_COUNT_MARGIN;
    match Heap::map_with(l, FaultBackend::Mprotect) {
        Err(err) => {
            assert!(need + 65_536 > limit, "limit {limit} leaves room for {pages} pages: {err}");
            assert_map_count_refusal(&err, pages, limit);
        }
        Ok(heap) => {
            assert!(need < limit, "limit {limit} leaves no room for {pages} pages, yet mapped");
            assert_eq!(heap.backend(), FaultBackend::Mprotect);
            println!("vm.max_map_count = {limit} leaves room for a 2 GiB mprotect heap");
        }
    }
    // Unprotected (1-node) heaps never split, so they are not bounded.
    Heap::map_with(HeapLayout { protect: false, ..l }, FaultBackend::Mprotect)
        .expect("unprotected 2 GiB heap");
    // The same heap is fine on userfaultfd.
    if super::uffd_or_skip() {
        let heap = Heap::map_with(l, FaultBackend::Uffd).expect("a 2 GiB uffd heap");
        assert_eq!(heap.backend(), FaultBackend::Uffd);
    }
}

#[test]
fn commit_backs_the_pages_of_a_range_without_changing_them() {
    let page = super::super::heap::system_page_size();
    let l = HeapLayout { protect: false, ..layout(40, 8) };
    let heap = Heap::map(l).unwrap();
    assert_eq!(heap.backed_bytes(), 0, "a fresh heap holds no pages");
    // SAFETY: an unprotected heap's application view is readable and writable; page 1 is inside.
    unsafe { heap.app_base().add(page + 7).write_volatile(42) };
    assert_eq!(heap.backed_bytes(), page as u64);
    // Bytes 100 into page 1 through 100 into page 4: pages 1 to 4.
    assert!(heap.commit(page as u64 + 100, 3 * page as u64));
    assert_eq!(heap.backed_bytes(), 4 * page as u64);
    // SAFETY: as above.
    assert_eq!(unsafe { heap.app_base().add(page + 7).read_volatile() }, 42, "commit changed data");
    // SAFETY: as above; page 4 is inside and was a hole, so it reads as zeros.
    assert_eq!(unsafe { heap.app_base().add(4 * page).read_volatile() }, 0);
    assert!(!heap.commit(7 * page as u64, 2 * page as u64), "beyond the heap");
    assert!(!heap.commit(u64::MAX - 10, 20), "overflowing range");
    assert!(!heap.commit(u64::MAX - 10, 5), "a range whose end rounds past u64::MAX");
    assert!(!heap.commit(0, 0), "empty range");
    assert_eq!(heap.backed_bytes(), 4 * page as u64);
}

#[test]
fn preparing_twins_backs_the_holes_among_the_pages_without_changing_them() {
    use crate::mem::HeapPages;
    use crate::protocol::ids::PageIdx;
    use crate::protocol::memory::PageMemory;
    let page = super::super::heap::system_page_size();
    let heap = Heap::map(HeapLayout { protect: false, ..layout(41, 8) }).unwrap();
    // SAFETY: an unprotected heap's application view is readable and writable; page 2 is inside.
    unsafe { heap.app_base().add(2 * page + 7).write_volatile(42) };
    assert_eq!(heap.backed_bytes(), page as u64);
    let mut pages = HeapPages(heap.clone());
    pages.prepare_twins(&[PageIdx(1), PageIdx(2), PageIdx(3), PageIdx(6)]);
    assert_eq!(heap.backed_bytes(), 4 * page as u64, "pages 1, 3 and 6 backed, page 2 was already");
    // SAFETY: as above; pages 2 and 6 are inside.
    let (kept, hole) = unsafe {
        (heap.app_base().add(2 * page + 7).read_volatile(), heap.app_base().add(6 * page + 9).read_volatile())
    };
    assert_eq!(kept, 42, "preparing changed data");
    assert_eq!(hole, 0, "a backed hole reads as zeros");
}

/// Whether each of the `n` pages from `addr` is backed by memory.
fn resident(addr: *mut u8, n: usize) -> Vec<bool> {
    let page = super::super::heap::system_page_size();
    let mut vec = vec![0u8; n];
    // SAFETY: the caller passes a page-aligned range of a live mapping; `vec` has a byte a page.
    let rc = unsafe { libc::mincore(addr.cast(), n * page, vec.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().map(|b| b & 1 == 1).collect()
}

#[test]
fn twins_take_slots_in_the_order_pages_are_first_twinned_and_the_reserve_is_backed() {
    let page = super::super::heap::system_page_size();
    let heap = Heap::map(layout(42, 16)).unwrap();
    // The test is the runtime, its application waiting in a call.
    let _inside = heap.app_inside();
    assert_eq!(heap.reserve_twins(3 * page - 1), 3 * page, "whole slots");
    assert_eq!(heap.reserve_twins(0), 0);
    let mut pages = HeapPages(heap.clone());
    // Distinct bytes in pages 3 and 0 (written while invalid, as the runtime does).
    for (p, byte) in [(3, 0x33), (0, 0x44)] {
        pages.set_access(PageIdx(p), 1, Access::None);
        pages.page_mut(PageIdx(p)).fill(byte);
        pages.set_access(PageIdx(p), 1, Access::Read);
    }
    pages.make_twin(PageIdx(9));
    let first = heap.twin_page(9);
    assert_eq!(resident(first, 3), [true; 3], "the reserved slots are backed before use");
    pages.make_twin(PageIdx(3));
    pages.make_twin(PageIdx(9));
    pages.make_twin(PageIdx(0));
    assert_eq!(heap.twin_page(9), first, "a page keeps its slot");
    assert_eq!(heap.twin_page(3), first.wrapping_add(page), "slots are packed in twinning order");
    assert_eq!(heap.twin_page(0), first.wrapping_add(2 * page));
    assert!(pages.twin(PageIdx(3)).iter().all(|&b| b == 0x33));
    assert!(pages.twin(PageIdx(0)).iter().all(|&b| b == 0x44));
    assert!(pages.twin(PageIdx(9)).iter().all(|&b| b == 0));
    assert_eq!(heap.twin_slots(), (3, 3), "three pages twinned, three slots reserved");
    let msg = panic_message(catch_unwind(AssertUnwindSafe(|| {
        heap.twin_page(5);
    })));
    assert!(msg.contains("page 5 was never twinned"), "{msg}");
    // Setting the twin of a writable page never twinned is refused before its state is owned:
    // the page stays writable, not `BUSY` (which every later fault on it would wait for).
    pages.set_access(PageIdx(5), 1, Access::ReadWrite);
    let msg = panic_message(catch_unwind(AssertUnwindSafe(|| {
        pages.set_twin(PageIdx(5), &vec![0; page]);
    })));
    assert!(msg.contains("page 5 was never twinned"), "{msg}");
    assert_eq!(heap.state(5).load(std::sync::atomic::Ordering::Acquire), state::READ_WRITE);
}

#[test]
fn a_snapshot_taken_while_the_page_is_written_holds_whole_words_and_becomes_its_twin() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let heap = Heap::map_with(layout(43, 2), FaultBackend::Mprotect).unwrap();
    // The test is the runtime, its application waiting in a call.
    let _inside = heap.app_inside();
    let mut pages = HeapPages(heap.clone());
    pages.make_twin(PageIdx(0));
    pages.set_access(PageIdx(0), 1, Access::ReadWrite);
    let words = heap.page_size() / 8;
    let page = heap.app_base() as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    // A writer stores words whose eight bytes are equal, a new value each sweep, so that a word
    // read torn would show two different bytes.
    let writer = std::thread::spawn({
        let (stop, rounds) = (stop.clone(), rounds.clone());
        move || {
            while !stop.load(Ordering::Relaxed) {
                let round = rounds.load(Ordering::Relaxed) + 1;
                for k in 0..words {
                    let value = (round + k as u64) % 255 * 0x0101_0101_0101_0101;
                    // SAFETY: word `k` of page 0 of the application view, which is writable.
                    unsafe { std::ptr::write_volatile((page as *mut u64).add(k), value) };
                }
                rounds.store(round, Ordering::Relaxed);
            }
        }
    });
    // Snapshots until the writer has swept the page a few times meanwhile (bounded wait).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let start = rounds.load(Ordering::Relaxed);
    let mut snap = vec![0u8; heap.page_size()];
    let mut taken = 0;
    while taken < 100 || rounds.load(Ordering::Relaxed) < start + 3 {
        assert!(std::time::Instant::now() < deadline, "the writer made no progress in 20 s");
        pages.snapshot(PageIdx(0), &mut snap);
        taken += 1;
        for word in snap.chunks_exact(8) {
            assert!(word.iter().all(|&b| b == word[0]), "a torn word: {word:?}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    // With the writer gone, a snapshot set as the twin equals the page; a later write does not.
    pages.snapshot(PageIdx(0), &mut snap);
    pages.set_twin(PageIdx(0), &snap);
    assert!(pages.same_as_twin(PageIdx(0)));
    assert_eq!(pages.twin(PageIdx(0)), &snap[..]);
    // SAFETY: inside page 0 of the application view, which is writable.
    unsafe { std::ptr::write_volatile((page as *mut u8).add(100), !snap[100]) };
    assert!(!pages.same_as_twin(PageIdx(0)));
    // Only a writable page has a snapshot taken or its twin set.
    pages.set_access(PageIdx(0), 1, Access::Read);
    let refused = catch_unwind(AssertUnwindSafe(|| pages.set_twin(PageIdx(0), &snap)));
    assert!(refused.is_err(), "set_twin of a read-only page");
}

#[test]
fn a_view_is_aligned_where_it_lies_in_memory_not_only_in_the_heap() {
    /// Aligned more than a page.
    #[repr(C, align(8192))]
    #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
    struct Block([u8; 4096], [u8; 4096]);
    let page = crate::mem::heap::system_page_size();
    // A base one page past a multiple of 8 KiB: offset 0 of the heap is not 8 KiB-aligned.
    let l = HeapLayout { base: test_base(23) + page, size: 16 * page, protect: false };
    let heap = Heap::map_with(l, FaultBackend::Mprotect).unwrap();
    let tracker = crate::mem::BorrowTracker::claim(heap.clone()).unwrap();
    let at = |offset: u64| crate::mem::Shared::<[Block]>::from_raw_parts(offset, 1);
    let err = tracker.view(&at(0)).map(|v| v.len()).expect_err("a misaligned view");
    assert!(matches!(err, crate::mem::ViewError::OutOfBounds { offset: 0, .. }), "{err:?}");
    assert_eq!(tracker.view(&at(page as u64)).map(|v| v.len()).unwrap(), 1, "aligned in memory");
}

#[test]
fn the_heap_counts_the_mutable_views_alive() {
    // What the runtime tells the protocol core before a validation or a fault: while a mutable
    // view is open, another thread may be writing through its slice.
    let heap = Heap::map_with(layout(56, 4), FaultBackend::Mprotect).unwrap();
    let tracker = crate::mem::BorrowTracker::claim(heap.clone()).unwrap();
    let page = |p: u64| crate::mem::Shared::<[u8]>::from_raw_parts(p * heap.page_size() as u64, 8);
    let read = tracker.view(&page(0)).unwrap();
    assert_eq!(heap.mutable_views(), 0, "a shared view is not counted");
    let a = tracker.view_mut(&page(1)).unwrap();
    let b = tracker.view_mut(&page(2)).unwrap();
    assert_eq!(heap.mutable_views(), 2);
    assert!(tracker.view_mut(&page(1)).is_err(), "an overlapping view is refused");
    assert_eq!(heap.mutable_views(), 2, "and not counted");
    drop(a);
    assert_eq!(heap.mutable_views(), 1);
    drop((b, read));
    assert_eq!(heap.mutable_views(), 0);
}

#[test]
fn page_queries_name_only_pages_within_the_heap_whatever_the_range() {
    let heap = Heap::map_with(layout(24, 4), FaultBackend::Mprotect).unwrap();
    let size = heap.size() as u64;
    let pages =
        |offset: u64, len: u64| heap.overlapping_pages(offset, len).iter().map(|p| p.0).collect::<Vec<_>>();
    assert_eq!(pages(size - 1, 1), [3], "the last byte");
    assert_eq!(pages(0, u64::MAX), [0, 1, 2, 3], "a range past the end");
    assert_eq!(pages(u64::MAX, 2), [] as [u32; 0], "a range that wraps around");
    assert_eq!(pages(size, 1), [] as [u32; 0]);
    assert_eq!(pages(1 << 44, 1), [] as [u32; 0], "an offset whose page number overflows a u32");
    assert_eq!(pages(5, 0), [] as [u32; 0]);
    assert!(heap.invalid_pages(0, u64::MAX).is_empty(), "a fresh heap's pages are valid");
    // One readable page, or nothing: a view of the bytes has nothing to validate.
    let ps = heap.page_size() as u64;
    assert!(heap.readable_in_one_page(size - 1, 1), "the last byte");
    assert!(heap.readable_in_one_page(ps, ps), "a whole page");
    assert!(!heap.readable_in_one_page(ps - 1, 2), "a range across a page boundary");
    assert!(heap.readable_in_one_page(u64::MAX, 2), "a range that wraps around: no bytes");
    assert!(heap.readable_in_one_page(1 << 44, 1), "an offset past the heap: no bytes");
    assert!(heap.readable_in_one_page(5, 0));
    let mut pages = HeapPages(heap.clone());
    pages.set_access(PageIdx(2), 1, Access::None);
    assert!(!heap.readable_in_one_page(2 * ps + 8, 8), "an invalid page");
    pages.set_access(PageIdx(2), 1, Access::Read);
    assert!(heap.readable_in_one_page(2 * ps + 8, 8), "a read-only page");
    for (offset, len) in [(size - 1, 1), (ps, ps), (2 * ps + 8, 8), (u64::MAX, 2), (5, 0)] {
        assert!(heap.invalid_pages(offset, len).is_empty(), "{offset} {len}: readable means none invalid");
    }
}
