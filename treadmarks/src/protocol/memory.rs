//! The protocol core's window onto page bytes and page protection.
//!
//! The core never calls `mprotect` or touches a mapping itself; it goes through [`PageMemory`].
//! The runtime implements it over the real heap (`mem::HeapPages`), tests over plain vectors
//! ([`VecMemory`]).
//!
//! # The page-sharing rule (checked by both implementations)
//! - [`PageMemory::page`] and [`PageMemory::make_twin`] read a page's bytes: only while the
//!   application cannot write them. That means `access == None`, or `Read` while the application
//!   thread is blocked (in a fault on that page, or inside any call into the runtime that has not
//!   returned: a synchronization call, a view's validation): a `Read` page of a running
//!   application can become writable at any moment through the fault handler's fast path, which
//!   also overwrites the twin. [`VecMemory`] checks this where the simulation tells it whether
//!   the application runs ([`VecMemory::set_app_running`]). A `ReadWrite` page is read in place
//!   ([`PageMemory::page_while_blocked`]) only while nothing can write it: the application
//!   thread waits in a synchronization call, or in a view or a fault with no mutable view open
//!   (`Node::app_still`); with one open, safe code may have handed its slice to another thread,
//!   which writes a page already writable without faulting. [`VecMemory`] checks this too, where
//!   the simulation says another thread may be writing ([`VecMemory::set_others_writing`]).
//! - While the application runs, access is taken from a `Read` page only by
//!   [`PageMemory::revoke`], which returns what the fast path made of it meanwhile:
//!   [`PageMemory::set_access`] or [`PageMemory::freeze`] would not say that the page had become
//!   writable and twinned, nor that a store went in. [`VecMemory`] checks this too.
//! - [`PageMemory::page_mut`] writes them: only while the application has no access (`None`,
//!   not frozen: a frozen page stays readable), so it cannot observe a half-applied diff: a
//!   load of the page faults and waits (the application may run meanwhile, as while a
//!   streaming view's pages arrive).
//! - The one read of a page the application may be writing at the same time is
//!   [`PageMemory::snapshot`] of a `ReadWrite` page, whose copy then becomes the page's twin
//!   ([`PageMemory::set_twin`]): every byte is read once, so each byte of the copy is a value
//!   the byte held during the copy, and the next diff (page against that twin) holds every
//!   byte written since it was read. Each aligned 8-byte word is read in one load, so an
//!   aligned store of up to a word is in the copy whole or not at all: a copy that tore such a
//!   store would hand a racing reader a value nobody wrote (a variant of the simulation whose
//!   stores in the middle of a copy tore at any byte failed so at racy seed 9). No write is
//!   lost, and none is needed by whoever gets a diff cut from the copy: a data-race-free program
//!   writes those bytes concurrently only in an interval the requester has not synchronized
//!   with.

use super::ids::PageIdx;

/// Protection of a page in the application view.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum Access {
    /// Invalid: any access faults.
    None,
    /// Valid, write-protected: a write faults (and makes a twin).
    Read,
    /// Valid and writable: the page has a twin (or the job has one node).
    ReadWrite,
}

/// Page bytes, twins and protection, as the protocol core sees them.
pub trait PageMemory {
    /// Bytes per page.
    fn page_size(&self) -> usize;
    /// Pages in the heap.
    fn npages(&self) -> u32;
    /// Current protection of page `p` in the application view.
    fn access(&self, p: PageIdx) -> Access;
    /// Sets the protection of pages `first .. first + count`.
    fn set_access(&mut self, first: PageIdx, count: u32, access: Access);
    /// Makes page `p` inaccessible and returns the access it had, read in the same step (an
    /// inaccessible page, frozen ones included, is left as it is). Where
    /// the application runs meanwhile, [`PageMemory::access`] may be out of date by the time
    /// its answer is acted on: the fault handler may have twinned the page and made it
    /// writable since (a twin the protocol hears of only at its next step).
    fn revoke(&mut self, p: PageIdx) -> Access;
    /// Takes write access from valid pages `first .. first + count` while their twins are cut:
    /// the application may still read them, and a write waits for the runtime, as on an invalid
    /// page, until the next [`PageMemory::set_access`]. [`PageMemory::access`] reports `None`
    /// meanwhile (for the page-sharing rule, the page is not writable), but the runtime must not
    /// write it ([`PageMemory::page_mut`]): the application can read it.
    fn freeze(&mut self, first: PageIdx, count: u32);
    /// Takes write access from `pages` (ascending, however scattered): [`PageMemory::freeze`]s
    /// them (`freeze`), or sets them [`Access::Read`] (invalid ones among them are made
    /// readable). By default one call per run of consecutive pages; the heap on userfaultfd
    /// bridges gaps where that changes nothing.
    fn write_protect_pages(&mut self, pages: &[PageIdx], freeze: bool) {
        for (first, count) in runs_of(pages) {
            if freeze {
                self.freeze(first, count);
            } else {
                self.set_access(first, count, Access::Read);
            }
        }
    }
    /// The bytes of page `p`. Requires `access(p) != ReadWrite`.
    fn page(&self, p: PageIdx) -> &[u8];
    /// The bytes of page `p`, writable. Requires `access(p) == None`.
    fn page_mut(&mut self, p: PageIdx) -> &mut [u8];
    /// The twin of page `p` (valid only after [`PageMemory::make_twin`]).
    fn twin(&self, p: PageIdx) -> &[u8];
    /// Copies page `p` into its twin slot. Requires `access(p) != ReadWrite`.
    fn make_twin(&mut self, p: PageIdx);
    /// Page `p` is about to be overwritten in full and diffed whole, so its twin is never read:
    /// nothing is copied, and [`PageMemory::twin`] of `p` may not be read until the next
    /// [`PageMemory::make_twin`] (the heap only notes that the page may no longer hold zeros).
    /// Requires `access(p) != ReadWrite`, as [`PageMemory::make_twin`].
    fn skip_twin(&mut self, p: PageIdx);
    /// About to twin `pages` (ascending) one by one: a chance to prepare them together (the heap
    /// backs pages nobody touched yet with memory in one call). Changes no byte.
    fn prepare_twins(&mut self, _pages: &[PageIdx]) {}
    /// Backs pages `first .. first + count` with memory ahead of their first touch (the heap
    /// allocates them and maps the valid ones, see `Heap::back`). Changes no byte and no
    /// protection. Returns the pages made accessible without a fault.
    fn back(&mut self, _first: PageIdx, _count: u32) -> u32 {
        0
    }
    /// True if page `p` equals its twin (nothing written since the twin was made). May be called
    /// on a `ReadWrite` page only while nothing writes it meanwhile: the application thread
    /// waits in a synchronization call, or in a view's validation or a fault with no mutable
    /// view open (`Node::app_still`).
    fn same_as_twin(&self, p: PageIdx) -> bool;
    /// The bytes of valid page `p`, `ReadWrite` included, while nothing writes the page, as for
    /// [`PageMemory::same_as_twin`].
    fn page_while_blocked(&self, p: PageIdx) -> &[u8];
    /// Copies valid page `p`, `ReadWrite` included, into its twin slot, under the contract of
    /// [`PageMemory::page_while_blocked`].
    fn renew_twin_while_blocked(&mut self, p: PageIdx);
    /// Copies the bytes of `ReadWrite` page `p` into `out` (a page long) while the application
    /// may be writing the page: every byte is read once, each aligned 8-byte word in one load
    /// (see the module docs).
    fn snapshot(&self, p: PageIdx, out: &mut [u8]);
    /// Replaces the twin of `ReadWrite` page `p` with `bytes` (a page long): a
    /// [`PageMemory::snapshot`] of the page, taken since the page was last made writable.
    fn set_twin(&mut self, p: PageIdx, bytes: &[u8]);
    /// The bytes of read-only page `p`, writable, while the application thread is inside a
    /// synchronization call (so that nothing reads the page meanwhile): the page is brought up to
    /// date where it stands, without revoking and restoring the application's access.
    fn page_mut_while_blocked(&mut self, p: PageIdx) -> &mut [u8];
}

/// The runs of consecutive pages in `pages` (ascending), as (first, count).
pub fn runs_of(pages: &[PageIdx]) -> impl Iterator<Item = (PageIdx, u32)> + '_ {
    let mut rest = pages;
    std::iter::from_fn(move || {
        let first = *rest.first()?;
        let count = rest.iter().enumerate().take_while(|&(k, p)| p.0 == first.0 + k as u32).count();
        rest = &rest[count..];
        Some((first, count as u32))
    })
}

/// A [`PageMemory`] over plain vectors, for tests and the simulation. It checks the page-sharing
/// rule on every call and panics if the core breaks it: with [`VecMemory::set_app_running`], the
/// simulation says when the application thread runs (outside any call into the runtime), and
/// then a `Read` page's bytes may not be read, and nothing `*_while_blocked` may be called.
#[derive(Debug, Clone)]
pub struct VecMemory {
    page_size: usize,
    pages: Vec<Vec<u8>>,
    twins: Vec<Option<Vec<u8>>>,
    access: Vec<Access>,
    /// Frozen ([`PageMemory::freeze`]) since the page's protection last changed.
    frozen: Vec<bool>,
    /// How many times [`PageMemory::back`] covered each page.
    backed: Vec<u32>,
    /// How many protection changes ([`PageMemory::set_access`], [`PageMemory::freeze`]) each page
    /// has had.
    changes: Vec<u32>,
    /// Calls of [`PageMemory::set_access`] that took all access.
    invalidating_calls: u32,
    /// Whether the application thread runs meanwhile (the simulation's view, not the core's).
    app_running: bool,
    /// Whether another thread of the application may write the writable pages meanwhile,
    /// through an open mutable view's slice, while the application thread waits in a view or a
    /// fault (the simulation's view).
    others_writing: bool,
    /// A store the running application is about to make, which may run in the middle of the
    /// service thread's step ([`VecMemory::arm_store`]).
    store: Option<MidStore>,
    /// How the armed store ran, once it did (a cell: [`PageMemory::snapshot`] reads only).
    store_ran: std::cell::Cell<Option<StoreRan>>,
}

/// A store of the running application ([`VecMemory::arm_store`]).
#[derive(Debug, Clone)]
pub struct MidStore {
    pub page: PageIdx,
    pub offset: usize,
    pub bytes: Vec<u8>,
    /// On a read-only page: the store completes before the revocation; else it faults again on
    /// the revoked page.
    pub lands: bool,
    /// On a writable page: a snapshot taken while the store runs already sees it. Whole or not
    /// at all: the heap reads each aligned word of a page in one load (`HeapPages::snapshot`),
    /// and the simulation's stores are of aligned words.
    pub seen: bool,
}

impl MidStore {
    /// Writes the store into `page` (its page's bytes, or a copy of them).
    fn write_into(&self, page: &mut [u8]) {
        page[self.offset..][..self.bytes.len()].copy_from_slice(&self.bytes);
    }
}

/// How an armed store ran in the middle of a step ([`VecMemory::take_store_ran`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreRan {
    /// The page was read-only and about to be revoked: the fault handler's fast path twinned it
    /// and made it writable first, and the store landed (`true`) or faults again.
    FastPath(PageIdx, bool),
    /// The page was writable and being copied ([`PageMemory::snapshot`]): the copy holds the
    /// store or not, and the page holds it.
    DuringSnapshot,
}

impl VecMemory {
    /// `npages` zeroed pages of `page_size` bytes, all with protection `access`.
    pub fn new(npages: u32, page_size: usize, access: Access) -> Self {
        VecMemory {
            page_size,
            pages: vec![vec![0; page_size]; npages as usize],
            twins: vec![None; npages as usize],
            access: vec![access; npages as usize],
            frozen: vec![false; npages as usize],
            backed: vec![0; npages as usize],
            changes: vec![0; npages as usize],
            invalidating_calls: 0,
            app_running: false,
            others_writing: false,
            store: None,
            store_ran: std::cell::Cell::new(None),
        }
    }

    /// The running application stores `store.bytes` next, and may do so in the middle of the
    /// service thread's step: on a read-only page, when the step revokes it, the fault handler's
    /// fast path twins it and makes it writable first (the store lands, or faults again); on a
    /// writable page, while the step copies it ([`PageMemory::snapshot`]), the copy reading
    /// its word before the store or after it. [`VecMemory::take_store_ran`] says whether it ran.
    /// The simulation's way to run the application beside the service thread.
    pub fn arm_store(&mut self, store: MidStore) {
        self.store = Some(store);
        self.store_ran.set(None);
    }

    /// Disarms the store and says how it ran, if it did; a store that ran during a snapshot is
    /// in the page from here on.
    pub fn take_store_ran(&mut self) -> Option<StoreRan> {
        let store = self.store.take();
        let ran = self.store_ran.take();
        if let (Some(StoreRan::DuringSnapshot), Some(s)) = (ran, store) {
            s.write_into(&mut self.pages[s.page.idx()]);
        }
        ran
    }

    /// Whether the application thread runs during the calls that follow (set by the
    /// simulation around the service thread's steps): while it does, any `Read` page may turn
    /// writable under the fault handler's fast path, which also overwrites its twin.
    pub fn set_app_running(&mut self, running: bool) {
        self.app_running = running;
    }

    /// Whether another thread of the application may write the writable pages during the calls
    /// that follow (set by the simulation around the service thread's steps while the
    /// application thread waits in a view or a fault with a mutable view open): then no
    /// writable page's bytes may be read in place (`*_while_blocked`), and a store armed to a
    /// writable page may run in the middle of the step, as the application's would.
    pub fn set_others_writing(&mut self, writing: bool) {
        self.others_writing = writing;
    }

    /// The armed store, if it is to page `p` and may run now: the application, or another thread
    /// of it, runs, and the store has not run yet.
    fn store_to(&self, p: PageIdx) -> Option<&MidStore> {
        let may_run = (self.app_running || self.others_writing) && self.store_ran.get().is_none();
        self.store.as_ref().filter(|s| may_run && s.page == p)
    }

    /// Sets the protection of pages `first .. first + count`, counting the changes.
    fn protect(&mut self, first: PageIdx, count: u32, access: Access) {
        self.invalidating_calls += u32::from(access == Access::None);
        let pages = first.idx()..first.idx() + count as usize;
        self.frozen[pages.clone()].fill(false);
        for (a, c) in self.access[pages.clone()].iter_mut().zip(&mut self.changes[pages]) {
            *c += u32::from(*a != access);
            *a = access;
        }
    }

    /// Panics if the application may be writing page `p` while the runtime reads its bytes.
    fn check_readable(&self, p: PageIdx, what: &str) {
        assert!(
            !(self.app_running && self.access[p.idx()] == Access::Read),
            "{what} of read-only {p} while the application runs (its fast path may write it)"
        );
    }

    /// Panics if the application runs: a `*_while_blocked` call requires it to wait in the
    /// runtime, and of a writable page, with no other thread writing it.
    fn check_blocked(&self, p: PageIdx, what: &str) {
        assert!(!self.app_running, "{what} of {p} while the application runs");
        assert!(
            !(self.others_writing && self.access[p.idx()] == Access::ReadWrite),
            "{what} of writable {p} while another thread may write it through a mutable view"
        );
    }

    /// How many calls of [`PageMemory::set_access`] took all access from their run of pages.
    pub fn invalidating_calls(&self) -> u32 {
        self.invalidating_calls
    }

    /// How many protection changes page `p` has had: calls of [`PageMemory::set_access`] or
    /// [`PageMemory::freeze`] that covered it and changed its protection.
    pub fn protection_changes(&self, p: PageIdx) -> u32 {
        self.changes[p.idx()]
    }

    /// How many times [`PageMemory::back`] covered page `p`.
    pub fn times_backed(&self, p: PageIdx) -> u32 {
        self.backed[p.idx()]
    }

    /// The application's view of a page: what a load would see. Panics if the page is invalid
    /// (a real load would fault instead).
    pub fn app_read(&self, p: PageIdx) -> &[u8] {
        assert_ne!(self.access[p.idx()], Access::None, "app read of invalid {p}");
        &self.pages[p.idx()]
    }

    /// The application's store. Panics unless the page is writable.
    pub fn app_write(&mut self, p: PageIdx) -> &mut [u8] {
        assert_eq!(self.access[p.idx()], Access::ReadWrite, "app write of non-writable {p}");
        &mut self.pages[p.idx()]
    }
}

impl PageMemory for VecMemory {
    fn page_size(&self) -> usize {
        self.page_size
    }

    fn npages(&self) -> u32 {
        self.pages.len() as u32
    }

    fn access(&self, p: PageIdx) -> Access {
        self.access[p.idx()]
    }

    fn set_access(&mut self, first: PageIdx, count: u32, access: Access) {
        if self.app_running && access == Access::None {
            for q in (first.0..first.0 + count).map(PageIdx) {
                assert_ne!(
                    self.access[q.idx()],
                    Access::Read,
                    "access taken from read-only {q} while the application runs, not by a revocation"
                );
            }
        }
        self.protect(first, count, access);
    }

    fn revoke(&mut self, p: PageIdx) -> Access {
        // Only the application thread's store takes the fast path; another thread's would abort.
        if self.access[p.idx()] == Access::Read
            && self.app_running
            && let Some(store) = self.store_to(p).cloned()
        {
            // The fault handler's fast path, just before the revocation takes effect.
            self.twins[p.idx()] = Some(self.pages[p.idx()].clone());
            self.access[p.idx()] = Access::ReadWrite;
            if store.lands {
                store.write_into(&mut self.pages[p.idx()]);
            }
            self.store_ran.set(Some(StoreRan::FastPath(p, store.lands)));
        }
        let was = self.access(p);
        if was != Access::None {
            // Unchecked: a revocation may meet a read-only page of a running application, and
            // learns what the fast path did.
            self.protect(p, 1, Access::None);
        }
        was
    }

    fn freeze(&mut self, first: PageIdx, count: u32) {
        // The simulated application runs in the middle of a protocol step only at a revocation
        // or a copy (`arm_store`), never reading a frozen page, so a frozen page may as well be
        // invalid to it; but the application may read a frozen page (the heap's stays
        // readable), so the runtime must not write one: `page_mut` refuses it. Only a valid page
        // is frozen (the heap's would let its stale bytes be read).
        let run = first.idx()..first.idx() + count as usize;
        if let Some(i) = run.clone().find(|&i| self.access[i] == Access::None && !self.frozen[i]) {
            panic!("freeze of invalid page {i}");
        }
        self.set_access(first, count, Access::None);
        self.frozen[first.idx()..first.idx() + count as usize].fill(true);
    }

    fn page(&self, p: PageIdx) -> &[u8] {
        assert_ne!(self.access[p.idx()], Access::ReadWrite, "runtime read of writable {p}");
        self.check_readable(p, "runtime read");
        &self.pages[p.idx()]
    }

    fn page_mut(&mut self, p: PageIdx) -> &mut [u8] {
        assert_eq!(self.access[p.idx()], Access::None, "runtime write of accessible {p}");
        assert!(!self.frozen[p.idx()], "runtime write of frozen {p} (the application may read it)");
        &mut self.pages[p.idx()]
    }

    fn twin(&self, p: PageIdx) -> &[u8] {
        self.twins[p.idx()].as_deref().expect("twin read before make_twin")
    }

    fn make_twin(&mut self, p: PageIdx) {
        assert_ne!(self.access[p.idx()], Access::ReadWrite, "twin of writable {p}");
        self.check_readable(p, "twin");
        let copy = self.pages[p.idx()].clone();
        self.twins[p.idx()] = Some(copy);
    }

    fn skip_twin(&mut self, p: PageIdx) {
        assert_ne!(self.access[p.idx()], Access::ReadWrite, "twin of writable {p} skipped");
        self.twins[p.idx()] = None;
    }

    fn same_as_twin(&self, p: PageIdx) -> bool {
        if self.access[p.idx()] == Access::ReadWrite {
            self.check_blocked(p, "comparison with its twin");
        }
        self.check_readable(p, "comparison with its twin");
        self.twins[p.idx()].as_deref() == Some(&self.pages[p.idx()][..])
    }

    fn page_while_blocked(&self, p: PageIdx) -> &[u8] {
        assert_ne!(self.access[p.idx()], Access::None, "runtime read of invalid {p} as valid");
        self.check_blocked(p, "runtime read while blocked");
        &self.pages[p.idx()]
    }

    fn renew_twin_while_blocked(&mut self, p: PageIdx) {
        assert_ne!(self.access[p.idx()], Access::None, "twin of invalid {p} renewed");
        self.check_blocked(p, "twin renewed while blocked");
        let copy = self.pages[p.idx()].clone();
        self.twins[p.idx()] = Some(copy);
    }

    fn snapshot(&self, p: PageIdx, out: &mut [u8]) {
        assert_eq!(self.access[p.idx()], Access::ReadWrite, "snapshot of {p}, not writable");
        out.copy_from_slice(&self.pages[p.idx()]);
        if let Some(store) = self.store_to(p) {
            // The store runs while the page is copied: the copy read its word before or after.
            if store.seen {
                store.write_into(out);
            }
            self.store_ran.set(Some(StoreRan::DuringSnapshot));
        }
    }

    fn set_twin(&mut self, p: PageIdx, bytes: &[u8]) {
        assert_eq!(self.access[p.idx()], Access::ReadWrite, "twin of {p} set, not writable");
        let twin = self.twins[p.idx()].as_mut().expect("twin set before make_twin");
        twin.copy_from_slice(bytes);
    }

    fn page_mut_while_blocked(&mut self, p: PageIdx) -> &mut [u8] {
        assert_eq!(self.access[p.idx()], Access::Read, "runtime write of {p} in place");
        self.check_blocked(p, "runtime write in place");
        &mut self.pages[p.idx()]
    }

    fn back(&mut self, first: PageIdx, count: u32) -> u32 {
        let pages = first.idx()..first.idx() + count as usize;
        self.backed[pages.clone()].iter_mut().for_each(|b| *b += 1);
        // As the heap maps them: the valid pages.
        self.access[pages].iter().filter(|&&a| a != Access::None).count() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two pages: 0 read-only, 1 invalid; the application running.
    fn running() -> VecMemory {
        let mut m = VecMemory::new(2, 64, Access::Read);
        m.set_access(PageIdx(1), 1, Access::None);
        m.set_app_running(true);
        m
    }

    #[test]
    fn while_the_application_runs_invalid_pages_may_be_read_and_twinned() {
        let mut m = running();
        assert_eq!(m.page(PageIdx(1)).len(), 64);
        m.make_twin(PageIdx(1));
        assert!(m.same_as_twin(PageIdx(1)));
        m.set_app_running(false);
        assert_eq!(m.page(PageIdx(0)).len(), 64);
        m.make_twin(PageIdx(0));
        assert_eq!(m.page_mut_while_blocked(PageIdx(0)).len(), 64);
    }

    #[test]
    #[should_panic(expected = "runtime read of read-only page 0 while the application runs")]
    fn while_the_application_runs_a_read_only_page_is_not_read() {
        let _ = running().page(PageIdx(0));
    }

    #[test]
    #[should_panic(expected = "twin of read-only page 0 while the application runs")]
    fn while_the_application_runs_a_read_only_page_is_not_twinned() {
        running().make_twin(PageIdx(0));
    }

    fn store(page: u32, lands: bool, seen: bool) -> MidStore {
        MidStore { page: PageIdx(page), offset: 8, bytes: vec![7; 4], lands, seen }
    }

    #[test]
    fn a_store_armed_on_a_read_only_page_runs_at_its_revocation() {
        let mut m = running();
        m.arm_store(store(0, true, false));
        assert_eq!(m.revoke(PageIdx(1)), Access::None, "another page: no store");
        assert_eq!(m.revoke(PageIdx(0)), Access::ReadWrite, "the fast path made it writable first");
        assert_eq!(m.take_store_ran(), Some(StoreRan::FastPath(PageIdx(0), true)));
        assert_eq!(&m.pages[0][8..12], &[7; 4], "the store landed");
        assert_eq!(m.twin(PageIdx(0)), &[0; 64][..], "the twin is the page before it");
        assert_eq!(m.take_store_ran(), None, "disarmed");
    }

    #[test]
    fn a_store_armed_on_a_writable_page_runs_during_its_copy() {
        for seen in [false, true] {
            let mut m = running();
            m.set_app_running(false);
            m.set_access(PageIdx(1), 1, Access::ReadWrite);
            m.set_app_running(true);
            m.arm_store(store(1, false, seen));
            let mut copy = vec![0; 64];
            m.snapshot(PageIdx(1), &mut copy);
            assert_eq!(copy[8..12] == [7; 4], seen, "the copy read the word after the store or before");
            assert_eq!(m.take_store_ran(), Some(StoreRan::DuringSnapshot));
            assert_eq!(&m.app_read(PageIdx(1))[8..12], &[7; 4], "the page holds it either way");
        }
    }

    #[test]
    #[should_panic(expected = "access taken from read-only page 0 while the application runs")]
    fn while_the_application_runs_a_read_only_page_is_only_revoked() {
        let mut m = running();
        assert_eq!(m.revoke(PageIdx(1)), Access::None);
        m.set_access(PageIdx(1), 1, Access::Read);
        assert_eq!(m.revoke(PageIdx(1)), Access::Read);
        m.freeze(PageIdx(0), 1);
    }

    #[test]
    #[should_panic(expected = "runtime write in place of page 0 while the application runs")]
    fn while_the_application_runs_nothing_waits_for_it() {
        let _ = running().page_mut_while_blocked(PageIdx(0));
    }
}
