//! Questions the application thread asks about page states, without the runtime.

use super::heap::Heap;
use super::state;
use crate::protocol::{Access, PageIdx};

impl Heap {
    /// Pages overlapping bytes `offset .. offset + len` of the heap (those within it) that the
    /// application may not be able to read now (invalid in its view). A snapshot: only the
    /// runtime changes states, and it makes pages invalid for good only while the application
    /// is inside a synchronization call; a page it serves meanwhile is invalid or frozen for a
    /// moment (frozen pages are listed, though readable), and validating such a page is
    /// harmless (nothing to fetch).
    pub fn invalid_pages(&self, offset: u64, len: u64) -> Vec<PageIdx> {
        self.pages_with(offset, len, |a| a == Access::None)
    }

    /// What the application may do with page `p` now. A snapshot, as for
    /// [`Heap::invalid_pages`].
    pub fn access(&self, p: PageIdx) -> Access {
        state::to_access(state::load_stable(self.state(p.0)))
    }

    /// Whether bytes `offset .. offset + len` (those within the heap) lie inside one page that
    /// the application may read now, or are none: a view of them has nothing to validate. A
    /// snapshot, as for [`Heap::invalid_pages`]; no list is built, as a view of one record
    /// taken under its lock (water: 512 a step a node) would otherwise build three.
    pub fn readable_in_one_page(&self, offset: u64, len: u64) -> bool {
        let end = offset.saturating_add(len).min(self.size() as u64);
        if offset >= end {
            return true;
        }
        let ps = self.page_size() as u64;
        // Below `npages`, a `u32`: `offset` is within the heap.
        let first = offset / ps;
        first == (end - 1) / ps && self.access(PageIdx(first as u32)) != Access::None
    }

    /// Every page overlapping bytes `offset .. offset + len` (those within the heap), whatever
    /// its state.
    pub fn overlapping_pages(&self, offset: u64, len: u64) -> Vec<PageIdx> {
        self.pages_with(offset, len, |_| true)
    }

    /// The pages overlapping the bytes in the heap (the part of the range past its end has
    /// none) whose access `keep` keeps.
    fn pages_with(&self, offset: u64, len: u64, keep: impl Fn(Access) -> bool) -> Vec<PageIdx> {
        let end = offset.saturating_add(len).min(self.size() as u64);
        if offset >= end {
            return Vec::new();
        }
        let ps = self.page_size() as u64;
        // Both below `npages`, a `u32`: `end` is within the heap.
        let (first, last) = ((offset / ps) as u32, ((end - 1) / ps) as u32);
        (first..=last).map(PageIdx).filter(|&p| keep(self.access(p))).collect()
    }
}
