//! The apps' allocator: every allocation of [`LARGE`] bytes or more starts on a page boundary,
//! as the arrays of the DSM heap do (`Tmk::alloc_pages`) and as SPLASH-2's programs align theirs
//! (FFT rounds its arrays up to a page). Smaller ones go to the system allocator unchanged.
//!
//! Without it the baselines' arrays started 16 bytes into a page (glibc's header before a
//! mapped chunk) while the DSM's started on one, and layout alone moves a run by a few percent
//! either way (a tile of 16-byte complex values spans a cache line more when misaligned; why
//! barnes runs slower aligned is not traced). Old binaries against new, alternated, medians
//! (session 27): fft's sequential run 0.0383 → 0.0369 s and 0.0410 → 0.0397 s (9 and 15 runs),
//! barnes's 0.680 → 0.703 s and 0.677 → 0.712 s (9 and 11 runs), the other apps' within their
//! noise. Comparisons are only fair on the same layout.
//!
//! Invariant: an allocation's alignment is a function of its size and requested alignment
//! alone (the private `layout`), so `dealloc` and `realloc` hand the system allocator the very
//! layout it allocated with. Nothing here panics: an allocator must not.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations of at least this many bytes are page-aligned.
pub const LARGE: usize = 64 * 1024;

/// The page size the large allocations are aligned to (4 KiB: every page size treadmarks runs on
/// is a multiple of it, and a multiple of every cache line).
pub const PAGE: usize = 4096;

/// The system allocator, large allocations aligned to [`PAGE`].
#[derive(Debug)]
pub struct PageAligned;

/// The layout `layout` is really allocated with.
fn layout(layout: Layout) -> Layout {
    if layout.size() >= LARGE && layout.align() < PAGE {
        // A size within a page of `isize::MAX` cannot be rounded up to a page: left as asked.
        Layout::from_size_align(layout.size(), PAGE).unwrap_or(layout)
    } else {
        layout
    }
}

// SAFETY: every method forwards to `System` with the layout `layout` derives, the same for the
// same input layout, so memory is always freed or resized with the layout it was allocated with;
// a stricter alignment still satisfies the caller's.
unsafe impl GlobalAlloc for PageAligned {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: `l` has a non-zero size (the caller's contract), and so has its derived layout.
        unsafe { System.alloc(layout(l)) }
    }

    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout(l)) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, l: Layout) {
        // SAFETY: `ptr` was allocated by this allocator with `l`, hence by `System` with
        // `layout(l)`.
        unsafe { System.dealloc(ptr, layout(l)) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, l: Layout, new_size: usize) -> *mut u8 {
        let Ok(new) = Layout::from_size_align(new_size, l.align()) else {
            return std::ptr::null_mut(); // not a valid size: a failed allocation
        };
        let (old, new) = (layout(l), layout(new));
        if old.align() == new.align() {
            // SAFETY: `ptr` came from `System` with `old`; `new_size` is non-zero and valid for
            // this alignment (the caller's contract).
            return unsafe { System.realloc(ptr, old, new.size()) };
        }
        // Crossing `LARGE` changes the alignment, which `System.realloc` keeps: move by hand.
        // SAFETY: `new` has a non-zero size.
        let moved = unsafe { System.alloc(new) };
        if !moved.is_null() {
            // SAFETY: both blocks are live, distinct, and at least the smaller size long; the old
            // one came from `System` with `old`.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr, moved, old.size().min(new.size()));
                System.dealloc(ptr, old);
            }
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_allocations_start_on_a_page_small_ones_as_asked() {
        let big: Vec<[f64; 2]> = vec![[0.0; 2]; LARGE / 16];
        assert_eq!(big.as_ptr() as usize % PAGE, 0);
        let small: Vec<u64> = vec![0; 10];
        assert_eq!(small.as_ptr() as usize % align_of::<u64>(), 0);
        assert_eq!(layout(Layout::new::<[u64; 10]>()), Layout::new::<[u64; 10]>());
        // Too big to round up to a page: left as asked, not a panic.
        let huge = Layout::from_size_align(isize::MAX as usize - 100, 8).unwrap();
        assert_eq!(layout(huge), huge);
    }

    #[test]
    fn growing_and_shrinking_across_the_limit_keeps_the_bytes() {
        let mut v: Vec<u32> = (0..100).collect();
        v.extend(100..(LARGE as u32));
        assert_eq!(v.as_ptr() as usize % PAGE, 0);
        assert!(v.iter().enumerate().all(|(i, &x)| x == i as u32));
        v.truncate(10);
        v.shrink_to_fit();
        assert_eq!(v, (0..10).collect::<Vec<u32>>());
    }
}
