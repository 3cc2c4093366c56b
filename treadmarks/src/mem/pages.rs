//! [`HeapPages`]: the protocol core's [`PageMemory`] over the real heap, used only by the
//! runtime's node, through its mutex (the service thread, or the application thread running an
//! operation that needs no message: never while it touches the application view).
//!
//! Bytes are read and written through the runtime view, twins through the twin area; the
//! application view only ever has its protection changed (`mprotect`, or `MADV_DONTNEED`,
//! `UFFDIO_CONTINUE` and `UFFDIO_WRITEPROTECT` on the userfaultfd backend). Every call checks the page-sharing rule against
//! the page's atomic state and panics with context if the caller breaks it.

use smallvec::SmallVec;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::backend::FaultBackend;
use super::heap::{AtomicCounters, Heap};
use super::state;
use crate::protocol::ids::PageIdx;
use crate::protocol::memory::{Access, PageMemory, runs_of};

/// Longest gap [`PageMemory::write_protect_pages`] bridges on userfaultfd: write-protecting a
/// page table's worth of entries costs less than a call.
const PROTECT_BRIDGE_PAGES: u32 = 256;

/// A state whose pages are write-protected already.
fn write_protected(s: u8) -> bool {
    s == state::READ_ONLY || s == state::FROZEN
}

/// A state whose pages a write protection leaves as they are: write-protected, or invalid
/// (no entry to protect; on shared memory the kernel notes the protection on the empty entry,
/// as it does when it unmaps a write-protected page, and the next mapping replaces it).
fn bridgeable(s: u8) -> bool {
    write_protected(s) || s == state::INVALID
}

/// [`PageMemory`] over a real [`Heap`]: the node's, one per heap (`HeapPages::claim`), since
/// two could hand out aliasing `&mut` slices of one page; and only this crate makes one, since
/// its bytes alias those a view hands out (the runtime keeps the two apart). (This crate's own
/// tests make more, to read a page's twin beside the node's.)
#[derive(Debug)]
pub struct HeapPages(pub(crate) Arc<Heap>);

impl HeapPages {
    /// The [`PageMemory`] of `heap`, the first time it is asked for; `None` after.
    pub(crate) fn claim(heap: Arc<Heap>) -> Option<HeapPages> {
        Heap::claim(&heap.pages_claimed).then_some(HeapPages(heap))
    }

    /// Copies page `p` into its twin slot, owning the page's BUSY state meanwhile so that the
    /// fault handler cannot twin it at the same time. Panics with `refused()` (the state left as
    /// it was) if the page is in state `refuse`: the state in which the caller's contract does
    /// not keep writers away.
    fn twin_unless(&mut self, p: PageIdx, refuse: u8, refused: impl FnOnce() -> String) {
        let i = self.check(p);
        let heap = &*self.0;
        let s = state::acquire_busy(heap.state(i));
        if s == refuse {
            heap.state(i).store(s, Ordering::Release);
            panic!("{}", refused());
        }
        // SAFETY: we own the page's BUSY state, so the handler does not twin it concurrently,
        // and outside state `refuse` the callers' contracts keep every writer of the page away.
        unsafe { heap.copy_to_twin(i) };
        heap.state(i).store(s, Ordering::Release);
    }

    /// Panics unless the application thread is inside a call into the runtime (`Heap::app_inside`)
    /// when page `p` is valid in the application view (read-only or writable): `what` reads
    /// bytes that its stores, or the fault handler's twin at its next write, could change
    /// meanwhile. And when it is writable, unless at most one mutable view is open: another
    /// thread may write it through the slice of one (a view being validated is counted while its
    /// slice is not handed out yet, so one is allowed). The protocol core calls these on a
    /// writable page only while `Node::app_still` says nothing writes it (the simulation checks
    /// it of the core); this checks that the runtime agrees, as far as the heap can tell.
    fn check_app_inside(&self, i: u32, s: u8, what: &str) {
        assert!(
            !(s == state::READ_ONLY || s == state::READ_WRITE) || self.0.app_is_inside(),
            "HeapPages::{what}(page {i}) of a {} page while the application runs: it may be \
             writing it (bug: the protocol core thinks it waits in a call)",
            state::name(s)
        );
        let views = self.0.mutable_views();
        assert!(
            s != state::READ_WRITE || views <= 1,
            "HeapPages::{what}(page {i}) of a writable page with {views} mutable views open: another \
             thread may be writing it through one (bug: the protocol core thinks nothing writes it)"
        );
    }

    fn check(&self, p: PageIdx) -> u32 {
        assert!(p.0 < self.0.npages(), "{p} out of range: the heap has {} pages", self.0.npages());
        p.0
    }

    /// Moves `pages` (ascending, a span from [`PageMemory::write_protect_pages`], each valid) to
    /// write-protected state `new` (`FROZEN` or `READ_ONLY`): on userfaultfd with one write
    /// protection of the whole span, gaps included, if every gap page is still write-protected
    /// or invalid once held (the change leaves them as they were: a protection they have, or
    /// none on an entry they lack); otherwise, and on `mprotect` (where it would make invalid
    /// pages readable), one change per run. One call instead of one per run: on this project's
    /// VM a write protection costs ~1.5 µs a call and ~10 ns a page (256 runs of 8 pages
    /// 400 µs, one span of 4,096 pages 42 µs), and radix sort serves its runs of ~8 pages with
    /// the other node's between.
    fn write_protect_span(&mut self, pages: &[PageIdx], new: u8) {
        let heap = &*self.0;
        let (first, last) = (pages[0].0, pages[pages.len() - 1].0);
        for &p in pages {
            self.check(p);
        }
        let count = last - first + 1;
        let by_runs = |this: &mut Self| {
            for (run, count) in runs_of(pages) {
                this.set_state(run, count, new);
            }
        };
        if heap.backend() != FaultBackend::Uffd || count as usize == pages.len() {
            return by_runs(self);
        }
        // Hold the whole span (the handler holds BUSY only briefly and never waits on us).
        let old: Vec<u8> = (first..=last).map(|p| state::acquire_busy(heap.state(p))).collect();
        let listed = |q: u32| pages.binary_search(&PageIdx(q)).is_ok();
        let release = || {
            for (k, s) in old.iter().enumerate() {
                heap.state(first + k as u32).store(*s, Ordering::Release);
            }
        };
        let span_ok = (first..=last).all(|q| {
            let s = old[(q - first) as usize];
            if listed(q) { s == state::READ_WRITE || write_protected(s) } else { bridgeable(s) }
        });
        if !span_ok {
            // A page changed since it was looked at: release all, then by runs.
            release();
            return by_runs(self);
        }
        AtomicCounters::bump(&heap.counters.protect_calls);
        if let Err((op, errno)) = heap.change_run(first, count, state::READ_WRITE, new) {
            // The span's protection is now unknown, part changed, part not: its pages stay BUSY
            // (the handler waits, rather than act on a state that may be wrong) until the
            // process ends on this panic (`runtime`).
            panic!(
                "{op} of pages {first}..{} to {} failed: {} (errno {errno})",
                last + 1,
                state::name(new),
                std::io::Error::from_raw_os_error(errno)
            );
        }
        for q in first..=last {
            let s = if listed(q) { new } else { old[(q - first) as usize] };
            heap.state(q).store(s, Ordering::Release);
        }
    }

    /// Panics naming the first of `pages` that is invalid: freezing one would make its stale
    /// bytes readable without a fault (`PageMemory::freeze` is for valid pages).
    fn refuse_freezing_invalid(&self, mut pages: impl Iterator<Item = PageIdx>) {
        if let Some(p) = pages.find(|&p| state::load_stable(self.0.state(self.check(p))) == state::INVALID) {
            panic!(
                "HeapPages::freeze({p}): the page is invalid; only valid pages are frozen (bug in the caller)"
            );
        }
    }

    /// Moves pages `first .. first + count` to stable state `new`, changing the application
    /// view's protection to match. Returns the states they had, each read as it was taken.
    fn set_state(&mut self, first: PageIdx, count: u32, new: u8) -> SmallVec<[u8; 64]> {
        let heap = &*self.0;
        let end = u64::from(first.0) + u64::from(count);
        assert!(
            end <= u64::from(heap.npages()),
            "set_state({first}, {count}, {}) out of range: the heap has {} pages",
            state::name(new),
            heap.npages()
        );
        if count == 0 {
            return SmallVec::new();
        }
        // Take every page of the run (the handler holds BUSY only briefly and never waits on us).
        // (Inline for runs of up to 64 pages: most runs, changed thousands of times a second.)
        let old: SmallVec<[u8; 64]> =
            (first.0..first.0 + count).map(|p| state::acquire_busy(heap.state(p))).collect();
        AtomicCounters::bump(&heap.counters.protect_calls);
        // userfaultfd: one change per sub-run of equal old state (the operation depends on it;
        // runs are almost always homogeneous), but for invalidation, which drops the entries of
        // the whole run at once whatever they were (pages invalid already have none; the
        // protocol invalidates runs that go on across them). mprotect: one call for the run.
        let split = heap.backend() == FaultBackend::Uffd && new != state::INVALID;
        let mut i = 0usize;
        while i < old.len() {
            let mut j = i + 1;
            while j < old.len() && (!split || old[j] == old[i]) {
                j += 1;
            }
            let sub_first = first.0 + i as u32;
            // The operation follows the old state; an invalidation's, any page's but an invalid
            // one (whose change alone would be none).
            let from = if new == state::INVALID {
                old[i..j].iter().copied().find(|&s| s != state::INVALID).unwrap_or(state::INVALID)
            } else {
                old[i]
            };
            if let Err((op, errno)) = heap.change_run(sub_first, (j - i) as u32, from, new) {
                // The sub-runs before this one changed, those after it did not; this one may have
                // in part, so its pages stay BUSY (the handler waits, rather than act on a state
                // that may be wrong: a page said invalid but readable, say) until the process
                // ends on this panic (`runtime`).
                for (k, &s) in old.iter().enumerate().filter(|&(k, _)| k < i || k >= j) {
                    heap.state(first.0 + k as u32).store(if k < i { new } else { s }, Ordering::Release);
                }
                let hint = match op {
                    "mprotect" if errno == libc::ENOMEM => {
                        "; ENOMEM from mprotect usually means the heap is split into more \
                         differently-protected runs than vm.max_map_count allows (raise it with \
                         `sysctl vm.max_map_count=...`, or use TMK_FAULTS=uffd)"
                    }
                    "fallocate" => {
                        "; the heap's memory file could not grow: its tmpfs is full, or the \
                         process's memory limit (cgroup) is reached"
                    }
                    _ => "",
                };
                panic!(
                    "{op} of pages {}..{} ({} bytes at {:p}, {} backend) to {} failed: {} \
                     (errno {errno}){hint}",
                    sub_first,
                    first.0 as usize + j,
                    (j - i) * heap.page_size(),
                    heap.app_page(sub_first),
                    heap.backend().name(),
                    state::name(new),
                    std::io::Error::from_raw_os_error(errno),
                );
            }
            i = j;
        }
        for p in first.0..first.0 + count {
            // A writable page may be written unseen: its first twin must be a copy, never the
            // zero page `copy_to_twin` assumes of a page never written.
            if new == state::READ_WRITE {
                heap.note_written(p);
            }
            heap.state(p).store(new, Ordering::Release);
        }
        old
    }
}

impl PageMemory for HeapPages {
    fn page_size(&self) -> usize {
        self.0.page_size()
    }

    fn npages(&self) -> u32 {
        self.0.npages()
    }

    fn access(&self, p: PageIdx) -> Access {
        let p = self.check(p);
        state::to_access(state::load_stable(self.0.state(p)))
    }

    fn set_access(&mut self, first: PageIdx, count: u32, access: Access) {
        self.set_state(first, count, state::from_access(access));
    }

    fn revoke(&mut self, p: PageIdx) -> Access {
        // Invalid and frozen pages change only at the hand of the node's holder (the caller):
        // left as they are. The fault handler moves a page from read-only to writable only, so
        // for the others the state `set_state` takes is the true one.
        if self.access(p) == Access::None {
            return Access::None;
        }
        state::to_access(self.set_state(p, 1, state::INVALID)[0])
    }

    fn freeze(&mut self, first: PageIdx, count: u32) {
        self.refuse_freezing_invalid((first.0..first.0.saturating_add(count)).map(PageIdx));
        self.set_state(first, count, state::FROZEN);
    }

    fn write_protect_pages(&mut self, pages: &[PageIdx], freeze: bool) {
        let new = if freeze { state::FROZEN } else { state::READ_ONLY };
        // Invalid pages (made read-only, never frozen) are mapped, by runs; the others are
        // write-protected in spans, which may take the invalid ones in as gaps (they are mapped
        // after, with their own protection).
        let (invalid, valid): (Vec<PageIdx>, Vec<PageIdx>) =
            pages.iter().partition(|&&p| state::load_stable(self.0.state(self.check(p))) == state::INVALID);
        if freeze {
            self.refuse_freezing_invalid(invalid.iter().copied());
        }
        let mut i = 0;
        while i < valid.len() {
            // A span: the pages from `valid[i]` on whose gaps are short and hold no writable page.
            let mut j = i + 1;
            while j < valid.len()
                && valid[j].0 - valid[j - 1].0 <= PROTECT_BRIDGE_PAGES + 1
                && (valid[j - 1].0 + 1..valid[j].0).all(|q| bridgeable(state::load_stable(self.0.state(q))))
            {
                j += 1;
            }
            self.write_protect_span(&valid[i..j], new);
            i = j;
        }
        for (run, count) in runs_of(&invalid) {
            self.set_state(run, count, new);
        }
    }

    fn page(&self, p: PageIdx) -> &[u8] {
        let i = self.check(p);
        let s = state::load_stable(self.0.state(i));
        assert!(
            s != state::READ_WRITE,
            "HeapPages::page({p}): the application view of the page is ReadWrite; revoke write \
             access before reading it (page-sharing rule, bug in the caller)"
        );
        // The page is not writable in the application view, so the application thread cannot
        // store to it without faulting first; the runtime (the node's one `HeapPages`, behind
        // its mutex) writes it only through `page_mut`, which needs `&mut self`. A write fault on
        // a read-only page is resolved in the handler, though (module docs, "hazards"): callers
        // revoke or freeze the page first, or read it only while the application is blocked in
        // a call into the runtime (`Cut::Blocked` in the protocol core).
        self.check_app_inside(i, s, "page");
        // SAFETY: one page of the runtime view, live while `self.0` is, not written meanwhile
        // (invalid or frozen, or read-only with the application blocked: see above, checked).
        unsafe { std::slice::from_raw_parts(self.0.runtime_page(i), self.0.page_size()) }
    }

    fn page_mut(&mut self, p: PageIdx) -> &mut [u8] {
        let i = self.check(p);
        let s = state::load_stable(self.0.state(i));
        assert!(
            s == state::INVALID,
            "HeapPages::page_mut({p}): the application view of the page is {}; the runtime may \
             write a page only while the application has no access (page-sharing rule, bug in the \
             caller)",
            state::name(s)
        );
        // The application has no access (INVALID): any access faults and blocks in the slow path
        // until the service thread changes the state, which it cannot do while this `&mut self`
        // borrow lives. Only one `HeapPages` exists per heap (type docs).
        self.0.note_written(i);
        // SAFETY: one page of the runtime view, live while `self.0` is; nothing else aliases it.
        unsafe { std::slice::from_raw_parts_mut(self.0.runtime_page(i), self.0.page_size()) }
    }

    fn twin(&self, p: PageIdx) -> &[u8] {
        let i = self.check(p);
        // Only the handler's twin of a read-only page at a write can change it under us.
        let s = state::load_stable(self.0.state(i));
        if s == state::READ_ONLY {
            self.check_app_inside(i, s, "twin");
        }
        // SAFETY: one page of the twin area, live while `self.0` is. The twin slot is written
        // only by `make_twin` (needs `&mut self`) and by the signal handler while it owns the
        // page's BUSY state on a read-only to read-write transition (see module docs, "hazards").
        unsafe { std::slice::from_raw_parts(self.0.twin_page(i), self.0.page_size()) }
    }

    fn same_as_twin(&self, p: PageIdx) -> bool {
        let i = self.check(p);
        let ps = self.0.page_size();
        // Frozen or invalid, nothing writes the page or its twin; otherwise the application
        // thread is inside a call into the runtime in which the core takes nothing to write it
        // (`Node::app_still`, partly checked), so nothing does either (the handler writes a twin
        // only when the application faults).
        self.check_app_inside(i, state::load_stable(self.0.state(i)), "same_as_twin");
        // SAFETY: a page each of the runtime view and twin area, live, not written meanwhile.
        let (page, twin) = unsafe {
            (
                std::slice::from_raw_parts(self.0.runtime_page(i), ps),
                std::slice::from_raw_parts(self.0.twin_page(i), ps),
            )
        };
        page == twin
    }

    fn page_while_blocked(&self, p: PageIdx) -> &[u8] {
        let i = self.check(p);
        let s = state::load_stable(self.0.state(i));
        assert!(
            s != state::INVALID,
            "HeapPages::page_while_blocked({p}): the page is invalid (bug in the caller)"
        );
        // As in `same_as_twin`: nothing writes the page meanwhile, writable or not.
        self.check_app_inside(i, s, "page_while_blocked");
        // SAFETY: one page of the runtime view, live while `self.0` is, not written meanwhile.
        unsafe { std::slice::from_raw_parts(self.0.runtime_page(i), self.0.page_size()) }
    }

    fn page_mut_while_blocked(&mut self, p: PageIdx) -> &mut [u8] {
        let i = self.check(p);
        let s = state::load_stable(self.0.state(i));
        assert!(
            s == state::READ_ONLY,
            "HeapPages::page_mut_while_blocked({p}): the application view of the page is {}, not \
             read-only (bug in the caller)",
            state::name(s)
        );
        // The application thread is blocked inside a synchronization call (checked that it is
        // inside a call; the core writes in place only at a barrier), where no view is open, so
        // nothing reads the page meanwhile; it cannot write it (read-only), and the
        // state stays READ_ONLY while this `&mut self` borrow lives. Only one `HeapPages` exists
        // per heap.
        self.check_app_inside(i, s, "page_mut_while_blocked");
        self.0.note_written(i);
        // SAFETY: one page of the runtime view, live while `self.0` is; nothing else aliases it.
        unsafe { std::slice::from_raw_parts_mut(self.0.runtime_page(i), self.0.page_size()) }
    }

    fn renew_twin_while_blocked(&mut self, p: PageIdx) {
        // As in `same_as_twin`: nobody writes the page, writable or not.
        let i = self.check(p);
        self.check_app_inside(i, state::load_stable(self.0.state(i)), "renew_twin_while_blocked");
        self.twin_unless(p, state::INVALID, || {
            format!("HeapPages::renew_twin_while_blocked({p}): the page is invalid (bug in the caller)")
        });
    }

    fn snapshot(&self, p: PageIdx, out: &mut [u8]) {
        let i = self.check(p);
        let ps = self.0.page_size();
        assert_eq!(out.len(), ps, "HeapPages::snapshot({p}): the copy must be a page long");
        let s = state::load_stable(self.0.state(i));
        assert!(
            s == state::READ_WRITE,
            "HeapPages::snapshot({p}): the application view of the page is {}, not writable (bug \
             in the caller)",
            state::name(s)
        );
        // The application may store to the page while we read it, so no reference to its bytes
        // is made: each aligned word is read once with an atomic load, which the compiler may
        // neither split nor merge into wider or vector loads (a volatile read promised neither),
        // so a word written meanwhile reads whole, as its old or its new value, which is all the
        // caller needs (see `PageMemory::snapshot`). The application's stores are plain ones,
        // through its own mapping of the same memory: that race is outside Rust's memory model
        // whatever load is used; what it needs, one untorn load instruction a word, an
        // atomic load gives (a relaxed one is a plain `mov` / `ldr` on x86-64 and aarch64).
        let words = self.0.runtime_page(i).cast::<u64>();
        for (k, chunk) in out.chunks_exact_mut(8).enumerate() {
            // SAFETY: word `k` of one page of the runtime view (`k < page_size / 8`), live while
            // `self.0` is, and aligned to 8 (pages are), as `AtomicU64` requires; nothing in
            // this process accesses the runtime view's word non-atomically meanwhile (the
            // application stores through its own view, see above).
            let word = unsafe { std::sync::atomic::AtomicU64::from_ptr(words.add(k)) };
            chunk.copy_from_slice(&word.load(std::sync::atomic::Ordering::Relaxed).to_ne_bytes());
        }
    }

    fn set_twin(&mut self, p: PageIdx, bytes: &[u8]) {
        let i = self.check(p);
        let heap = &*self.0;
        assert_eq!(bytes.len(), heap.page_size(), "HeapPages::set_twin({p}): the twin must be a page long");
        // Its slot first (a page keeps its slot once it has one), so that a page never twinned
        // panics here, not with its state owned.
        let twin = heap.twin_page(i);
        // Own the page's state, as every twin's maker does; a writable page takes no fault, so the
        // handler never waits for it meanwhile.
        let s = state::acquire_busy(heap.state(i));
        if s != state::READ_WRITE {
            heap.state(i).store(s, Ordering::Release);
            panic!(
                "HeapPages::set_twin({p}): the page is {}, not writable (bug in the caller)",
                state::name(s)
            );
        }
        // `twin` is the page's twin slot (it exists: looked up above), a page long, in the twin
        // area, so it does not overlap `bytes` (a copy outside the heap). Only the maker of a
        // twin writes a slot: the handler twins only pages that fault, and we own the state.
        // SAFETY: a page-long slot nobody else writes now, apart from `bytes` (above).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), twin, bytes.len()) };
        heap.state(i).store(s, Ordering::Release);
    }

    fn back(&mut self, first: PageIdx, count: u32) -> u32 {
        let heap = &*self.0;
        let end = u64::from(first.0) + u64::from(count);
        assert!(
            end <= u64::from(heap.npages()),
            "back({first}, {count}): the heap has {} pages",
            heap.npages()
        );
        // Own the pages, as `set_state` does, so that the handler does not change one meanwhile.
        let states: Vec<u8> =
            (first.0..first.0 + count).map(|p| state::acquire_busy(heap.state(p))).collect();
        let mapped = heap.back(first.0, count, &states);
        for (p, s) in (first.0..).zip(states) {
            heap.state(p).store(s, Ordering::Release);
        }
        mapped
    }

    fn prepare_twins(&mut self, pages: &[PageIdx]) {
        for &p in pages {
            self.check(p);
        }
        self.0.populate(pages.iter().map(|p| p.0));
    }

    fn skip_twin(&mut self, p: PageIdx) {
        let i = self.check(p);
        let s = state::acquire_busy(self.0.state(i));
        let writable = s == state::READ_WRITE;
        self.0.note_written(i);
        self.0.state(i).store(s, Ordering::Release);
        assert!(!writable, "HeapPages::skip_twin({p}): the page is ReadWrite (bug in the caller)");
    }

    fn make_twin(&mut self, p: PageIdx) {
        // A page not writable in the application view: nobody writes it.
        self.twin_unless(p, state::READ_WRITE, || {
            format!(
                "HeapPages::make_twin({p}): the application view of the page is ReadWrite; revoke \
                 write access before twinning it (page-sharing rule, bug in the caller)"
            )
        });
    }
}
