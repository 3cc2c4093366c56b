//! [`SharedMut`]: one buffer that several threads of a `--mode threads` baseline read and write
//! in disjoint parts between barriers, the way a shared-memory program does.

use std::marker::PhantomData;

/// A mutable slice handed to several threads. Creating views is `unsafe`: the caller promises
/// that between two synchronizations (a `std::sync::Barrier` wait, say) no element is written
/// through one view while another view covers it.
#[derive(Debug)]
pub struct SharedMut<'a, T> {
    ptr: *mut T,
    len: usize,
    _life: PhantomData<&'a mut [T]>,
}

// SAFETY: `SharedMut` is a raw view of a `&mut [T]`; sending or sharing it between threads is
// sound for `T: Send + Sync` because every access goes through the `unsafe` view methods, whose
// callers promise that concurrent views never overlap with a writer.
unsafe impl<T: Send + Sync> Sync for SharedMut<'_, T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Send for SharedMut<'_, T> {}

impl<'a, T> SharedMut<'a, T> {
    /// Shares `data` for the lifetime `'a`.
    pub fn new(data: &'a mut [T]) -> Self {
        SharedMut { ptr: data.as_mut_ptr(), len: data.len(), _life: PhantomData }
    }

    /// Elements `range` for reading.
    ///
    /// # Safety
    /// No other thread writes these elements while the returned slice is alive.
    pub unsafe fn slice(&self, range: std::ops::Range<usize>) -> &[T] {
        assert!(range.start <= range.end && range.end <= self.len, "range {range:?} of {}", self.len);
        // SAFETY: in bounds (checked above), the buffer outlives `'a`, and the caller promises
        // no concurrent writer.
        unsafe { std::slice::from_raw_parts(self.ptr.add(range.start), range.end - range.start) }
    }

    /// Elements `range` for writing.
    ///
    /// # Safety
    /// No other thread reads or writes these elements while the returned slice is alive.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn slice_mut(&self, range: std::ops::Range<usize>) -> &mut [T] {
        assert!(range.start <= range.end && range.end <= self.len, "range {range:?} of {}", self.len);
        // SAFETY: in bounds (checked above), and the caller promises exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.end - range.start) }
    }
}
