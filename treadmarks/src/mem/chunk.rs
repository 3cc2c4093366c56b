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
//! ([`MAP_COUNT_MARGIN`](super::MAP_COUNT_MARGIN)). A program that never collects may hold far
//! more (up to its consistency limit, gigabytes), so at most [`MAX_CHUNKS`] chunks are mapped at
//! once, half that margin; past it diffs get allocations of their own, as big ones do, and the
//! heap's protection changes keep the mappings they may need (an `mprotect` refused for want of
//! one would stop the node inside a fault).
//!
//! When its last diff is dropped (a collection drops them together) a chunk goes to a pool of
//! at most [`POOL_CHUNKS`], and the next chunk any thread needs comes from there: memory in
//! use, already backed, instead of a new mapping whose first touch the kernel must zero (on a
//! virtual machine the host may have to back it too). Profiles of jacobi3d showed that zeroing
//! as 12% of its service threads' time, for diffs that fill ~75 KB an iteration. Chunks past
//! the pool's bound are unmapped.
//!
//! A node of a multi-node job also fills the pool at startup ([`reserve`]): as many chunks as
//! the diffs it holds before its first collection, backed at once with one
//! `MADV_POPULATE_WRITE` each. Otherwise the first touch of each chunk falls in the middle of
//! the computation, usually while a barrier pushes diffs, with every node waiting: on this
//! project's VM such a touch took 0.25 ms when the guest reused memory it had just freed and
//! 5-6 ms when the host had to back it (jacobi3d at 2 nodes: 17 fresh chunks a node cost 4-95
//! ms a run, against 3-15 ms to reserve 16 at startup).
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

/// Most chunks mapped at once, pooled ones included (1 GiB).
pub const MAX_CHUNKS: usize = super::MAP_COUNT_MARGIN as usize / 2;

/// Chunks mapped now, pooled ones included.
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Retired chunks' mappings, for reuse. Addresses, so that the pool is `Send` without `unsafe`.
static POOL: Mutex<Vec<usize>> = Mutex::new(Vec::new());

/// Chunks mapped fresh (reserved ones included), reserved, and taken from the pool, by this
/// process (see [`counts`]).
static MAPPED: AtomicU64 = AtomicU64::new(0);
static RESERVED: AtomicU64 = AtomicU64::new(0);
static REUSED: AtomicU64 = AtomicU64::new(0);

/// What this process did with chunks so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkCounts {
    /// Chunks mapped fresh, the reserved ones included.
    pub mapped: u64,
    /// Chunks mapped and backed ahead of need by [`reserve`].
    pub reserved: u64,
    /// Chunks taken from the pool (retired or reserved) instead of mapped when needed.
    pub reused: u64,
}

/// What this process did with chunks so far.
pub fn counts() -> ChunkCounts {
    ChunkCounts {
        mapped: MAPPED.load(Ordering::Relaxed),
        reserved: RESERVED.load(Ordering::Relaxed),
        reused: REUSED.load(Ordering::Relaxed),
    }
}

/// Maps enough chunks to hold `bytes` of diffs, backs them with memory at once, and puts them in
/// the pool, short of [`POOL_CHUNKS`] in the pool in all or of a mapping the kernel refuses;
/// returns how many it added. Meant for startup, before any diff is made.
pub fn reserve(bytes: u64) -> usize {
    let wanted = usize::try_from(bytes.div_ceil(CHUNK as u64)).unwrap_or(usize::MAX);
    let mut added = 0;
    while added < wanted && POOL.lock().unwrap_or_else(|e| e.into_inner()).len() < POOL_CHUNKS {
        let Some(chunk) = Chunk::map() else { break };
        chunk.populate();
        MAPPED.fetch_add(1, Ordering::Relaxed);
        RESERVED.fetch_add(1, Ordering::Relaxed);
        // Unused, so dropping it retires its mapping to the pool, which has room.
        drop(chunk);
        added += 1;
    }
    added
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
    /// A retired chunk from the pool, else a fresh mapping; `None` if [`MAX_CHUNKS`] are mapped
    /// already or the kernel refuses one.
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

    /// Maps a fresh chunk, or `None` if [`MAX_CHUNKS`] are mapped already or the kernel refuses.
    fn map() -> Option<Chunk> {
        // Counted before it is made, so that threads mapping at once stay within the bound.
        if LIVE
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < MAX_CHUNKS).then_some(n + 1))
            .is_err()
        {
            return None;
        }
        let chunk = Chunk::map_fresh();
        if chunk.is_none() {
            LIVE.fetch_sub(1, Ordering::Relaxed);
        }
        chunk
    }

    /// Maps a fresh chunk, or `None` if the kernel refuses.
    fn map_fresh() -> Option<Chunk> {
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

    /// Backs the whole (still empty) mapping with memory now, so that appending to it takes no
    /// page fault.
    fn populate(&self) {
        // SAFETY: the range is this chunk's mapping; populating writable anonymous memory maps
        // zeroed pages and changes no data.
        let rc = unsafe { libc::madvise(self.base.as_ptr().cast(), CHUNK, libc::MADV_POPULATE_WRITE) };
        if rc != 0 {
            // Kernels before 5.14: touch every page instead.
            for offset in (0..CHUNK).step_by(4096) {
                // SAFETY: inside the mapping, above `filled` (nothing is appended yet), and the
                // chunk is not shared: nothing else reads or writes these bytes.
                unsafe { self.base.as_ptr().add(offset).write_volatile(0) };
            }
        }
    }

    /// Appends the concatenation of `parts` (`len` bytes in all) if it fits, returning where it
    /// starts. Only the arena's thread calls it.
    fn append(&self, parts: &[&[u8]], len: usize) -> Option<usize> {
        let at = self.filled.load(Ordering::Relaxed);
        if CHUNK - at < len {
            return None;
        }
        let mut end = at;
        for part in parts {
            // SAFETY: `end..end + part.len()` lies inside `at..at + len`, inside the mapping and
            // above `filled`: no slice covers it yet and only this thread writes there (module
            // invariants).
            unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), self.base.as_ptr().add(end), part.len()) };
            end += part.len();
        }
        self.filled.store(end, Ordering::Release);
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
        LIVE.fetch_sub(1, Ordering::Relaxed);
    }
}

thread_local! {
    /// The chunk this thread appends to.
    static CURRENT: RefCell<Option<Arc<Chunk>>> = const { RefCell::new(None) };
}

/// A shared copy of `bytes`, appended to this thread's current chunk (a new one when it is
/// full); pieces too big for a chunk, or that find no chunk ([`MAX_CHUNKS`] mapped, or a mapping
/// refused), get an allocation of their own.
pub fn store(bytes: &[u8]) -> SharedBytes {
    store_parts(&[bytes])
}

/// [`store`] of the concatenation of `parts`, copied once (a whole page's diff is its header
/// and the page).
pub fn store_parts(parts: &[&[u8]]) -> SharedBytes {
    let len = parts.iter().map(|p| p.len()).sum();
    if len > MAX_PIECE {
        return SharedBytes::copy_of(&parts.concat());
    }
    CURRENT.with_borrow_mut(|current| {
        for fresh in [false, true] {
            if fresh {
                *current = Chunk::take().map(Arc::new);
            }
            let Some(chunk) = current.as_ref() else { continue };
            if let Some(at) = chunk.append(parts, len) {
                let owner: Arc<dyn ByteOwner> = Arc::clone(chunk) as Arc<dyn ByteOwner>;
                let whole = (*owner).as_ref();
                let piece = &whole[at..at + len];
                return SharedBytes::slice_of(&owner, piece).expect("a piece of its own chunk");
            }
        }
        SharedBytes::copy_of(&parts.concat())
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
        let reused = counts().reused;
        drop(first);
        let piece = vec![9u8; 100];
        let again = std::thread::spawn(move || store(&piece)).join().unwrap();
        assert_eq!(&*again, &[9u8; 100][..]);
        assert!(counts().reused > reused, "a retired chunk was reused");
        let big = vec![7u8; MAX_PIECE + 1];
        assert_eq!(store(&big).owner_len(), MAX_PIECE + 1, "too big for a chunk: copied");
        assert!(store(&[]).is_empty());
    }

    /// Pages of `chunk` the kernel has backed with memory.
    fn resident_pages(chunk: &Chunk) -> usize {
        let mut vec = vec![0u8; CHUNK / 4096];
        // SAFETY: the range is the chunk's mapping and `vec` has a byte per 4 KiB page of it.
        let rc = unsafe { libc::mincore(chunk.base.as_ptr().cast(), CHUNK, vec.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        vec.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn populate_backs_every_page_of_a_chunk() {
        let chunk = Chunk::map().expect("map a chunk");
        assert_eq!(resident_pages(&chunk), 0, "a fresh mapping has no memory yet");
        chunk.populate();
        assert_eq!(resident_pages(&chunk), CHUNK / 4096);
        assert_eq!(chunk.append(&[&[5; 10]], 10), Some(0));
        assert_eq!(chunk.as_ref(), &[5; 10][..]);
        assert_eq!(chunk.append(&[&[1, 2], &[], &[3]], 3), Some(10), "parts land back to back");
        assert_eq!(&chunk.as_ref()[10..], &[1, 2, 3][..]);
    }

    /// At most `MAX_CHUNKS` chunks are mapped at once; past it a piece gets an allocation of its
    /// own, and a chunk retired to the pool serves again. In a process of its own: the bound is
    /// the process's, and holding every chunk would starve the other tests' stores.
    #[test]
    fn no_more_chunks_are_mapped_than_the_bound_and_pieces_then_are_copied() {
        use crate::mem::tests::{run_in_child, test_name};
        run_in_child(test_name!(no_more_chunks_are_mapped_than_the_bound_and_pieces_then_are_copied), || {
            let mut held = Vec::new();
            while let Some(chunk) = Chunk::map() {
                held.push(chunk);
                assert!(held.len() <= MAX_CHUNKS, "{} chunks mapped", held.len());
            }
            assert_eq!((held.len(), LIVE.load(Ordering::Relaxed)), (MAX_CHUNKS, MAX_CHUNKS));
            let copied = std::thread::spawn(|| store(&[1u8; 64])).join().unwrap();
            assert_eq!((&*copied, copied.owner_len()), (&[1u8; 64][..], 64), "an allocation of its own");
            // Dropped, the first go to the pool, the rest are unmapped.
            drop(held);
            assert_eq!(LIVE.load(Ordering::Relaxed), POOL_CHUNKS);
            let reused = counts().reused;
            let stored = std::thread::spawn(|| store(&[2u8; 64])).join().unwrap();
            assert_eq!(&*stored, &[2u8; 64][..]);
            assert_eq!(counts().reused, reused + 1, "a pooled chunk serves");
            assert_eq!(LIVE.load(Ordering::Relaxed), POOL_CHUNKS);
        })
        .assert_success();
    }

    #[test]
    fn reserved_chunks_go_to_the_pool_and_serve_the_next_store() {
        let before = counts();
        assert_eq!(reserve(0), 0);
        // Other tests of this process take and retire chunks meanwhile: the pool may fill, so
        // count only what this call says it added.
        let added = reserve(2 * CHUNK as u64 + 1);
        assert!(added <= 3);
        let after = counts();
        assert!(after.reserved >= before.reserved + added as u64);
        assert!(after.mapped >= before.mapped + added as u64, "reserved chunks count as mapped");
        let full = POOL.lock().unwrap().len() >= POOL_CHUNKS;
        assert!(added > 0 || full, "nothing reserved into a pool with room");
        if full {
            return;
        }
        // Only `take` removes chunks from the pool, counting each as reused: whoever took the
        // reserved ones (this new thread, or another test's), the count rises.
        let stored = std::thread::spawn(|| store(&[3u8; 64])).join().unwrap();
        assert_eq!(&*stored, &[3u8; 64][..]);
        assert!(counts().reused > after.reused, "the reserved chunks serve stores");
    }
}
