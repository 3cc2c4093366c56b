//! Storage for the diffs a node makes: appended to 2 MiB chunks of anonymous memory backed by a
//! transparent huge page where the kernel offers one.
//!
//! A writer keeps every diff it makes until a collection, so a node making diffs of thousands of
//! pages allocates that much fresh memory, and each fresh 4 KiB page costs a page fault (a trap
//! and a zeroed page; on a virtual machine, microseconds). Profiles of bulk transfers showed these
//! faults as a leading cost of the writer. Appending diffs to huge-page chunks takes one fault
//! per 2 MiB instead of one per diff.
//!
//! Each thread appends to a chunk of its own ([`store`]); a diff is a [`SharedBytes`] slice of
//! its chunk. A chunk wastes at most the tail that did not fit the next diff. Each chunk is a
//! mapping: the consistency data a node holds before it collects (32 MiB by default) is about
//! 16 of them, well inside the mappings the `mprotect` backend leaves spare
//! ([`MAP_COUNT_MARGIN`](super::MAP_COUNT_MARGIN)).
//!
//! When its last diff is dropped (a collection drops them together) a chunk goes to a pool of
//! at most [`POOL_CHUNKS`], and the next chunk any thread needs comes from there: memory in
//! use, already backed, instead of a new mapping whose first touch the kernel must zero (on a
//! virtual machine the host may have to back it too). Profiles of jacobi3d showed that zeroing
//! as 12% of its service threads' time, for diffs that fill ~75 KB an iteration. Chunks past
//! the pool's bound are unmapped.
//!
//! Invariants (what makes the `unsafe` sound):
//! - bytes below a chunk's `filled` mark are never written again, so shared slices of them
//!   stay valid; [`AsRef`] exposes only those bytes;
//! - bytes at or above `filled` are written only by the one thread whose arena made the chunk,
//!   before `filled` moves past them (release order, read with acquire order);
//! - a mapping in the pool belongs to no chunk: its last chunk was dropped, so no slice of it
//!   exists, and it is handed to exactly one new chunk (under the pool's mutex).

use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::protocol::shared_bytes::{ByteOwner, SharedBytes};

/// Bytes in a chunk: one x86-64 huge page.
pub const CHUNK: usize = 2 << 20;

/// Largest piece appended to a chunk; bigger ones get an allocation of their own.
const MAX_PIECE: usize = CHUNK / 16;

/// Most retired chunks kept for reuse (64 MiB: twice the consistency data a node holds before
/// it collects, by default).
pub const POOL_CHUNKS: usize = 32;

/// Retired chunks' mappings, for reuse. Addresses, so that the pool is `Send` without `unsafe`.
static POOL: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Chunks mapped fresh and taken from the pool, by this process (see [`counts`]).
static MAPPED: AtomicU64 = AtomicU64::new(0);
static REUSED: AtomicU64 = AtomicU64::new(0);

/// How many chunks this process has mapped fresh, and how many it took from the pool instead.
pub fn counts() -> (u64, u64) {
    (MAPPED.load(Ordering::Relaxed), REUSED.load(Ordering::Relaxed))
}

/// A 2 MiB-aligned anonymous mapping, filled from the start.
struct Chunk {
    base: NonNull<u8>,
    filled: AtomicUsize,
}

// SAFETY: the chunk owns its mapping; shared access reads only bytes below `filled`, which are
// immutable (module invariants), and writing above it is confined to the arena's thread.
unsafe impl Send for Chunk {}
// SAFETY: as for `Send`: `&Chunk` gives access to immutable bytes only.
unsafe impl Sync for Chunk {}

impl Chunk {
    /// A retired chunk from the pool, else a fresh mapping; `None` if the kernel refuses one.
    fn take() -> Option<Chunk> {
        let reused = POOL.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match reused.and_then(|a| NonNull::new(a as *mut u8)) {
            Some(base) => {
                REUSED.fetch_add(1, Ordering::Relaxed);
                Some(Chunk { base, filled: AtomicUsize::new(0) })
            }
            None => Chunk::map().inspect(|_| {
                MAPPED.fetch_add(1, Ordering::Relaxed);
            }),
        }
    }

    /// Maps a fresh chunk, or `None` if the kernel refuses.
    fn map() -> Option<Chunk> {
        let span = 2 * CHUNK;
        // SAFETY: no fixed address: a new private anonymous mapping that nothing else uses.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return None;
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(CHUNK);
        let (head, tail) = (aligned - start, start + span - (aligned + CHUNK));
        // SAFETY: the head and tail lie inside the mapping just made and are not used; what
        // stays is `aligned..aligned + CHUNK`, also inside it.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + CHUNK) as *mut libc::c_void, tail);
            }
            // Advice only (fails harmlessly where huge pages are off); changes no data.
            libc::madvise(aligned as *mut libc::c_void, CHUNK, libc::MADV_HUGEPAGE);
        }
        Some(Chunk { base: NonNull::new(aligned as *mut u8)?, filled: AtomicUsize::new(0) })
    }

    /// Appends `bytes` if they fit, returning where they start. Only the arena's thread calls it.
    fn append(&self, bytes: &[u8]) -> Option<usize> {
        let at = self.filled.load(Ordering::Relaxed);
        if CHUNK - at < bytes.len() {
            return None;
        }
        // SAFETY: `at..at + len` lies inside the mapping, above `filled`: no slice covers it
        // yet and only this thread writes there (module invariants).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.as_ptr().add(at), bytes.len()) };
        self.filled.store(at + bytes.len(), Ordering::Release);
        Some(at)
    }
}

impl AsRef<[u8]> for Chunk {
    fn as_ref(&self) -> &[u8] {
        let filled = self.filled.load(Ordering::Acquire);
        // SAFETY: `base..base + filled` is mapped, initialized and never written again.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), filled) }
    }
}

impl Drop for Chunk {
    fn drop(&mut self) {
        let mut pool = POOL.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < POOL_CHUNKS {
            // The last reference is gone, so no slice of the mapping exists (module invariants).
            pool.push(self.base.as_ptr() as usize);
            return;
        }
        drop(pool);
        // SAFETY: the mapping is ours and, the last reference being gone, unused.
        unsafe { libc::munmap(self.base.as_ptr().cast(), CHUNK) };
    }
}

thread_local! {
    /// The chunk this thread appends to.
    static CURRENT: RefCell<Option<Arc<Chunk>>> = const { RefCell::new(None) };
}

/// A shared copy of `bytes`, appended to this thread's current chunk (a new one when it is
/// full); pieces too big for a chunk, or a failed mapping, get an allocation of their own.
pub fn store(bytes: &[u8]) -> SharedBytes {
    if bytes.len() > MAX_PIECE {
        return SharedBytes::copy_of(bytes);
    }
    CURRENT.with_borrow_mut(|current| {
        for fresh in [false, true] {
            if fresh {
                *current = Chunk::take().map(Arc::new);
            }
            let Some(chunk) = current.as_ref() else { continue };
            if let Some(at) = chunk.append(bytes) {
                let owner: Arc<dyn ByteOwner> = Arc::clone(chunk) as Arc<dyn ByteOwner>;
                let whole = (*owner).as_ref();
                let piece = &whole[at..at + bytes.len()];
                return SharedBytes::slice_of(&owner, piece).expect("a piece of its own chunk");
            }
        }
        SharedBytes::copy_of(bytes)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_share_a_chunk_until_it_is_full_and_keep_their_bytes() {
        let piece: Vec<u8> = (0..MAX_PIECE).map(|i| i as u8).collect();
        let first = std::thread::spawn(move || {
            let stored: Vec<SharedBytes> = (0..CHUNK / MAX_PIECE + 1).map(|_| store(&piece)).collect();
            for s in &stored {
                assert_eq!(&**s, &piece[..]);
            }
            // 16 pieces fill the first chunk exactly; the 17th starts a second.
            assert!(stored[..CHUNK / MAX_PIECE].iter().all(|s| s.owner_len() == CHUNK));
            assert_eq!(stored[CHUNK / MAX_PIECE].owner_len(), MAX_PIECE, "second chunk, one piece so far");
            stored
        })
        .join()
        .unwrap();
        // Read on another thread after the writer is gone.
        assert!(first.iter().all(|s| s.len() == MAX_PIECE && s[1] == 1));
        // The first chunk's pieces are gone now: its mapping is retired to the pool, and a new
        // thread's chunk is taken from the pool (this one's, or another test thread's), never
        // showing the bytes it held before.
        let (_, reused) = counts();
        drop(first);
        let piece = vec![9u8; 100];
        let again = std::thread::spawn(move || store(&piece)).join().unwrap();
        assert_eq!(&*again, &[9u8; 100][..]);
        assert!(counts().1 > reused, "a retired chunk was reused");
        let big = vec![7u8; MAX_PIECE + 1];
        assert_eq!(store(&big).owner_len(), MAX_PIECE + 1, "too big for a chunk: copied");
        assert!(store(&[]).is_empty());
    }
}
