//! The C allocator's memory for the service thread, backed before the computation.
//!
//! A node's service thread builds per-page state for thousands of pages at every fetch (its
//! misses, the replies it decodes, the diffs it keeps until a collection). glibc gives it an
//! arena of its own, hands the free top of a heap back to the kernel past 128 KiB, and maps
//! blocks of 128 KiB or more on their own, unmapped when freed: so that state kept landing on
//! fresh memory, each page of it a page fault in the middle of the computation (a trap, and
//! often a VM exit, on this project's VM: ~700 a node in a radix run's timed region, counted
//! with `perf record -e exceptions:page_fault_user`). [`keep_freed`] has the allocator keep
//! what is freed and take blocks under 32 MiB from its heaps, and [`warm_thread_heap`] grows
//! the service thread's heap by a block up front, every page written, then frees it for later:
//! none of those faults is left. As `chunk::reserve` and `Heap::reserve_twins` do for the
//! runtime's diff and twin memory.
//!
//! Process-wide: the application's own freed memory is kept too. glibc only; elsewhere
//! nothing is changed.

/// Free memory at the top of a heap that glibc keeps rather than hands back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const KEEP_TRIM: libc::c_int = 256 << 20;

/// Allocations at least this large get a mapping of their own, fresh pages each time: glibc's
/// largest threshold, which setting the trim threshold would otherwise fix at 128 KiB.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const KEEP_MMAP: libc::c_int = 32 << 20;

/// Asks the C allocator to keep memory freed at the top of its heaps (up to 256 MiB), and to
/// take allocations below 32 MiB from its heaps. Returns whether it took both settings.
pub fn keep_freed() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: `mallopt` only changes the allocator's tunables, under the allocator's own
        // lock; it takes no pointer and may be called at any time.
        let trim = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, KEEP_TRIM) };
        // SAFETY: as above.
        let mmap = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, KEEP_MMAP) };
        trim == 1 && mmap == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Grows the calling thread's allocator heap by `bytes`, backed (every page written), and frees
/// them for its later allocations. Worth it only after [`keep_freed`].
pub fn warm_thread_heap(bytes: usize) {
    let mut block: Vec<u8> = Vec::with_capacity(bytes);
    block.resize(bytes, 1);
    std::hint::black_box(&block);
}

#[cfg(test)]
mod tests {
    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_the_settings() {
        assert!(super::keep_freed());
        super::warm_thread_heap(1 << 20);
    }
}
