//! Handles to shared allocations and the application's views of them.
//!
//! A [`Shared<T>`] is a plain (offset, length) pair into the shared heap: `Copy`, `Pod`, the same
//! on every node, so it can be distributed. A view ([`View`], [`ViewMut`]) is a `&[T]` /
//! `&mut [T]` into the application view of the heap, created through a [`BorrowTracker`] that
//! refuses a view overlapping a live mutable one (and a mutable view overlapping any live view),
//! as `RefCell` does. Views borrow the node context immutably and every synchronization call
//! takes it mutably, so no view lives across a lock, unlock or barrier: the compiler cannot keep
//! a value from before the synchronization in a register after it.
//!
//! Why handing out references into DSM memory is sound here: the runtime changes the bytes of a
//! page only while the application view of that page is inaccessible (an invalid page, whose
//! first access faults and blocks the application thread until the page is up to date) or while
//! the application thread is inside a synchronization call (when no view exists). So every load
//! through a view returns the page's settled value, and bytes never change under a live read.
//! `T: Pod` because other processes write these bytes: every bit pattern must be a valid `T`.

use super::heap::Heap;
use bytemuck::{Pod, Zeroable};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

/// A typed allocation in the shared heap: `Shared<[T]>` for an array, `Shared<T>` for one value.
#[repr(C)]
pub struct Shared<T: ?Sized + 'static> {
    offset: u64,
    len: u64,
    _type: PhantomData<&'static T>,
}

impl<T: ?Sized> Clone for Shared<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: ?Sized> Copy for Shared<T> {}

impl<T: ?Sized> std::fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shared {{ offset: {:#x}, len: {} }}", self.offset, self.len)
    }
}

// SAFETY: `Shared` is `repr(C)` with two `u64` fields and a zero-sized `PhantomData`: no padding,
// every bit pattern is a valid value (a handle whose range is bad is refused when viewed, see
// `BorrowTracker::range`), and all zeros is a valid (empty) handle.
unsafe impl<T: ?Sized + 'static> Zeroable for Shared<T> {}
// SAFETY: as above; `Shared<T>` is `Copy + 'static` for every `T: 'static`.
unsafe impl<T: ?Sized + 'static> Pod for Shared<T> {}

impl<T: ?Sized> Shared<T> {
    /// Byte offset from the heap base.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl<T> Shared<[T]> {
    /// A handle to `len` elements at heap `offset` (as returned by the allocator).
    pub fn from_raw_parts(offset: u64, len: u64) -> Self {
        Shared { offset, len, _type: PhantomData }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True for an empty array.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sub-array `start..end`. A handle too large for the address space (one made up, or
    /// garbled on its way) gives one that no heap holds, which views refuse
    /// ([`ViewError::OutOfBounds`]), rather than one wrapped around to other bytes.
    ///
    /// # Panics
    /// If `start > end` or `end > self.len()`, as slicing `[start..end]` does, naming the
    /// bounds. Parts of a view given as ranges ([`crate::Tmk::view_parts`]) are checked instead,
    /// a typed error ([`ViewError::PartOutOfBounds`]).
    pub fn slice(&self, start: usize, end: usize) -> Shared<[T]> {
        match self.try_slice(start, end) {
            Some(part) => part,
            None => panic!("slice {start}..{end} of a {}-element array", self.len),
        }
    }

    /// [`Shared::slice`], or `None` where it would panic (bounds computed from data).
    pub fn try_slice(&self, start: usize, end: usize) -> Option<Shared<[T]>> {
        if start > end || end > self.len() {
            return None;
        }
        let offset =
            (start as u64).checked_mul(size_of::<T>() as u64).and_then(|b| self.offset.checked_add(b));
        Some(Shared::from_raw_parts(offset.unwrap_or(u64::MAX), (end - start) as u64))
    }
}

impl<T> Shared<T> {
    /// A handle to one value at heap `offset`.
    pub fn from_offset(offset: u64) -> Self {
        Shared { offset, len: 1, _type: PhantomData }
    }

    /// The same value as a one-element array.
    pub fn as_array(&self) -> Shared<[T]> {
        Shared::from_raw_parts(self.offset, 1)
    }
}

/// A view that conflicts with a live one, or reaches outside what it views.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ViewError {
    #[error("bytes {start:#x}..{end:#x} of the heap are already borrowed{}", if *.mutably { " mutably" } else { "" })]
    Borrowed { start: u64, end: u64, mutably: bool },
    #[error(
        "handle {offset:#x}+{bytes} bytes is outside the {heap_size}-byte heap or misaligned for its type"
    )]
    OutOfBounds { offset: u64, bytes: u64, heap_size: u64 },
    #[error("part {start}..{end} is outside the {len}-element array viewed")]
    PartOutOfBounds { start: usize, end: usize, len: usize },
}

/// Live views of one node's heap, by byte range. One per heap (`BorrowTracker::claim`): a
/// view is exclusive only against the other views of its tracker.
#[derive(Debug)]
pub struct BorrowTracker {
    heap: Arc<Heap>,
    live: RefCell<Vec<(u64, u64, bool)>>,
}

impl BorrowTracker {
    /// The tracker of `heap`'s views, the first time one is asked for; `None` after.
    pub(crate) fn claim(heap: Arc<Heap>) -> Option<BorrowTracker> {
        Heap::claim(&heap.tracker_claimed).then(|| BorrowTracker { heap, live: RefCell::default() })
    }

    fn range<T>(&self, h: &Shared<[T]>) -> Result<(u64, u64), ViewError> {
        let heap = &*self.heap;
        let bytes = h.len.checked_mul(size_of::<T>() as u64);
        let end = bytes.and_then(|b| h.offset.checked_add(b));
        // Aligned where it lies in memory: the heap's base is only page-aligned, and a `Pod`
        // type may be aligned more.
        let address = (heap.app_base() as u64).wrapping_add(h.offset);
        match end {
            Some(end) if end <= heap.size() as u64 && address.is_multiple_of(align_of::<T>() as u64) => {
                Ok((h.offset, end))
            }
            _ => Err(ViewError::OutOfBounds {
                offset: h.offset,
                bytes: bytes.unwrap_or(u64::MAX),
                heap_size: heap.size() as u64,
            }),
        }
    }

    fn enter(&self, start: u64, end: u64, mutable: bool) -> Result<(), ViewError> {
        let mut live = self.live.borrow_mut();
        if let Some(&(s, e, m)) = live.iter().find(|(s, e, m)| start < *e && *s < end && (mutable || *m)) {
            return Err(ViewError::Borrowed { start: s.max(start), end: e.min(end), mutably: m });
        }
        live.push((start, end, mutable));
        if mutable {
            self.heap.count_mutable_view(true);
        }
        Ok(())
    }

    fn leave(&self, start: u64, end: u64, mutable: bool) {
        let mut live = self.live.borrow_mut();
        let i = live.iter().position(|&x| x == (start, end, mutable)).expect("view was registered");
        live.swap_remove(i);
        if mutable {
            self.heap.count_mutable_view(false);
        }
    }

    /// True if no view is alive.
    pub fn is_idle(&self) -> bool {
        self.live.borrow().is_empty()
    }

    /// A shared view of `h`.
    pub fn view<'a, T: Pod>(&'a self, h: &Shared<[T]>) -> Result<View<'a, T>, ViewError> {
        let (start, end) = self.range(h)?;
        self.enter(start, end, false)?;
        // `range` checked that `start..end` lies inside the mapped application view and is aligned
        // for `T`; `T: Pod` makes any bytes a valid `T`. While the view lives the runtime writes
        // only pages it cannot load from (a streaming view's pages on their way, a page outside
        // a view's declared parts: a load faults and waits until the page is final).
        let ptr = self.heap.app_base().wrapping_add(start as usize) as *const T;
        // SAFETY: in bounds, aligned, valid for `T`, no overlapping `ViewMut` (the heap's one
        // tracker), and no byte a load can see changes while the view lives (module docs).
        let slice = unsafe { std::slice::from_raw_parts(ptr, h.len()) };
        Ok(View { slice, tracker: self, start, end })
    }

    /// A mutable view of `h`.
    pub fn view_mut<'a, T: Pod>(&'a self, h: &Shared<[T]>) -> Result<ViewMut<'a, T>, ViewError> {
        let (start, end) = self.range(h)?;
        self.enter(start, end, true)?;
        let ptr = self.heap.app_base().wrapping_add(start as usize) as *mut T;
        // SAFETY: as in `view`, and this heap's one tracker (`claim`) has no other live view
        // overlapping this one, so this is the only reference to these bytes in this process.
        let slice = unsafe { std::slice::from_raw_parts_mut(ptr, h.len()) };
        Ok(ViewMut { slice, tracker: self, start, end })
    }
}

/// A shared view of a shared array; ends before the next synchronization call.
#[derive(Debug)]
pub struct View<'a, T> {
    slice: &'a [T],
    tracker: &'a BorrowTracker,
    start: u64,
    end: u64,
}

impl<T> Deref for View<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.slice
    }
}

impl<T> Drop for View<'_, T> {
    fn drop(&mut self) {
        self.tracker.leave(self.start, self.end, false);
    }
}

/// A mutable view of a shared array; ends before the next synchronization call.
///
/// Its slice belongs to the application thread: written from another thread (a scoped one,
/// which the compiler allows), a store to a page already writable lands, but one to a page the
/// runtime took access from meanwhile aborts the process (see the rules under `Tmk`). While a
/// mutable view is alive, the heap counts it (`Heap::mutable_views`), and once its slice is
/// handed out (its own validation aside) the runtime reads no writable page in place.
#[derive(Debug)]
pub struct ViewMut<'a, T> {
    slice: &'a mut [T],
    tracker: &'a BorrowTracker,
    start: u64,
    end: u64,
}

impl<T> Deref for ViewMut<'_, T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.slice
    }
}

impl<T> DerefMut for ViewMut<'_, T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.slice
    }
}

impl<T> Drop for ViewMut<'_, T> {
    fn drop(&mut self) {
        self.tracker.leave(self.start, self.end, true);
    }
}

#[cfg(test)]
mod tests {
    use super::Shared;

    /// Bounds computed from data can be checked without a panic; in bounds, both agree.
    #[test]
    fn a_slice_out_of_bounds_is_none_or_a_panic_naming_it() {
        let a = Shared::<[u32]>::from_raw_parts(4096, 10);
        assert_eq!(a.try_slice(2, 5).map(|s| (s.offset(), s.len())), Some((4096 + 8, 3)));
        assert_eq!(a.try_slice(2, 5).map(|s| s.offset()), Some(a.slice(2, 5).offset()));
        assert!(a.try_slice(5, 2).is_none() && a.try_slice(0, 11).is_none());
        assert!(a.try_slice(10, 10).is_some_and(|s| s.is_empty()));
        let panic = std::panic::catch_unwind(|| a.slice(0, 11)).expect_err("out of bounds");
        assert_eq!(
            panic.downcast_ref::<String>().map(String::as_str),
            Some("slice 0..11 of a 10-element array")
        );
    }
}
