//! Questions the application thread asks about page states, without the runtime.

use super::heap::Heap;
use super::state;
use crate::protocol::{Access, PageIdx};

impl Heap {
    /// Pages overlapping bytes `offset .. offset + len` of the heap that the application cannot
    /// read now (invalid in its view). A snapshot: only the runtime changes states, and it makes
    /// pages invalid only while the application is inside a synchronization call.
    pub fn invalid_pages(&self, offset: u64, len: u64) -> Vec<PageIdx> {
        self.pages_with(offset, len, |a| a == Access::None)
    }

    /// What the application may do with page `p` now. A snapshot, as for
    /// [`Heap::invalid_pages`].
    pub fn access(&self, p: PageIdx) -> Access {
        state::to_access(state::load_stable(self.state(p.0)))
    }

    /// Every page overlapping bytes `offset .. offset + len`, whatever its state.
    pub fn overlapping_pages(&self, offset: u64, len: u64) -> Vec<PageIdx> {
        self.pages_with(offset, len, |_| true)
    }

    fn pages_with(&self, offset: u64, len: u64, keep: impl Fn(Access) -> bool) -> Vec<PageIdx> {
        if len == 0 {
            return Vec::new();
        }
        let ps = self.page_size() as u64;
        let first = (offset / ps) as u32;
        let last = ((offset + len - 1) / ps).min(u64::from(self.npages()) - 1) as u32;
        (first..=last).map(PageIdx).filter(|&p| keep(self.access(p))).collect()
    }
}
