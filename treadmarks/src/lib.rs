//! treadmarks: TreadMarks-style lazy release consistency distributed shared memory.
//!
//! N processes (nodes), on one host or several, share one heap mapped at the same address on
//! every node. A node sees another's writes after a chain of synchronization orders them (a lock
//! acquire after the writer's release, or a barrier), so data-race-free programs see sequentially
//! consistent memory. Start with [`Tmk`].
//!
//! ```
//! use treadmarks::{Shared, Tmk};
//!
//! fn main() -> treadmarks::Result<()> {
//!     // `prog -n 4` starts four nodes on this machine; each runs this same `main`.
//!     // (Run as a doc test, it is a one-node job.)
//!     let mut tmk = Tmk::startup()?;
//!     let mut counter: Shared<[u64]> = Shared::from_raw_parts(0, 0);
//!     if tmk.proc_id() == 0 {
//!         counter = tmk.alloc::<u64>(1)?; // any node may allocate; node 0 keeps the allocator
//!     }
//!     tmk.distribute(&mut counter)?; // every node now has node 0's handle
//!     for _ in 0..1000 {
//!         let g = tmk.lock(0)?; // the guard releases on drop
//!         g.view_mut(&counter)?[0] += 1;
//!     }
//!     tmk.barrier(0)?;
//!     assert_eq!(tmk.view(&counter)?[0], 1000 * tmk.nprocs() as u64);
//!     tmk.exit()
//! }
//! ```
//!
//! The rules are in the docs of [`Tmk`]: one application thread per node; views end
//! before the next synchronization call; only `bytemuck::Pod` data in the heap.
//!
//! Layers (each in its own module; only `mem` may use `unsafe`):
//! - `protocol`: the pure LRC state machine (intervals, vector timestamps, write notices,
//!   twins and lazy diffs, locks, barriers). No I/O.
//! - `mem`: the shared heap mapping, page protection and fault capture.
//! - `transport`: TCP mesh, framing and the wire codec.
//! - `runtime`: the only place those three meet.
//!
//! The first three are public so that this workspace's benchmarks and tests can drive them
//! directly, but they are internals, not API: they are hidden from these docs and may change
//! at any time. What a program needs of them is re-exported here (the error types and the ids
//! they name). `RUSTDOCFLAGS="--cfg tmk_internals --document-private-items" cargo doc` shows
//! the internals with their invariants.

pub mod config;
pub mod error;
pub mod failure;
mod headroom;
#[cfg_attr(not(tmk_internals), doc(hidden))]
pub mod mem;
mod open_files;
#[cfg_attr(not(tmk_internals), doc(hidden))]
pub mod protocol;
mod runtime;
pub mod stats;
mod tmk;
#[cfg_attr(not(tmk_internals), doc(hidden))]
pub mod transport;

pub use config::Config;
pub use error::{Error, Result};
pub use failure::JobFailure;
pub use mem::{MemError, Shared, View, ViewError, ViewMut};
pub use protocol::{AllocFailure, BarrierId, LockId, MsgKind, NodeId, PageIdx, ProtocolError, ProtocolStats};
pub use stats::Stats;
pub use tmk::{LockGuard, Tmk};
pub use transport::TransportError;

/// Writes `text` to standard error with one `write(2)` (or, past 4 KiB, one a block of whole
/// lines), so that lines from the several node processes of a job that share one terminal or pipe
/// never interleave mid-line (a pipe keeps writes of up to 4 KiB whole; a node's statistics table
/// of a job with many peers is longer). It never takes the standard library's lock on standard
/// error: the service thread reports a failure while the application thread may hold that lock,
/// blocked in a page fault inside an `eprintln!` whose arguments read shared memory; waiting for
/// it, the node would hang instead of exiting.
pub fn report(text: &str) {
    let mut buf = String::with_capacity(text.len() + 1);
    buf.push_str(text);
    if !buf.ends_with('\n') {
        buf.push('\n');
    }
    for block in line_blocks(&buf, REPORT_WRITE) {
        mem::write_stderr(block.as_bytes());
    }
}

/// Most bytes [`report`] writes at once: what a pipe keeps whole (`PIPE_BUF`).
const REPORT_WRITE: usize = 4096;

/// `text` cut into blocks of whole lines of at most `most` bytes each (a longer line alone).
fn line_blocks(text: &str, most: usize) -> Vec<&str> {
    let mut blocks = Vec::new();
    let (mut start, mut end) = (0, 0);
    for (i, _) in text.match_indices('\n') {
        if i + 1 - start > most && end > start {
            blocks.push(&text[start..end]);
            start = end;
        }
        end = i + 1;
    }
    if end > start {
        blocks.push(&text[start..end]);
    }
    if end < text.len() {
        blocks.push(&text[end..]);
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::line_blocks;

    #[test]
    fn reports_are_written_in_blocks_of_whole_lines() {
        assert_eq!(line_blocks("a\nbb\nccc\n", 5), ["a\nbb\n", "ccc\n"]);
        assert_eq!(line_blocks("a\nbb\nccc\n", 100), ["a\nbb\nccc\n"]);
        // A line longer than a block goes alone, whole.
        assert_eq!(line_blocks("a\n0123456789\nb\n", 4), ["a\n", "0123456789\n", "b\n"]);
        let table: String = (0..200).map(|i| format!("row {i:3} {}\n", "x".repeat(60))).collect();
        let blocks = line_blocks(&table, 4096);
        assert!(blocks.iter().all(|b| b.len() <= 4096 && b.ends_with('\n')), "{blocks:?}");
        assert_eq!(blocks.concat(), table);
    }
}
