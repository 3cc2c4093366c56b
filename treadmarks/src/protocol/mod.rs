//! The protocol core: TreadMarks' lazy release consistency as a pure state machine.
//!
//! No sockets, signals, clocks or `mprotect` here: [`Node`] takes events (application requests,
//! faults, messages) and emits messages and completions; page bytes and protection go through
//! [`PageMemory`]. (The bytes of the diffs a node makes are stored by an allocator of the memory
//! layer, `mem::chunk`, as they would be by `malloc`.) That makes the whole protocol testable in
//! one process: see the seeded simulation in `sim.rs`, which checks every read of random
//! data-race-free programs against sequentially consistent memory.
//!
//! One file per concept: [`vtime`] (vector timestamps), [`interval`] (interval records and the
//! log), [`ahead`] (records too many for one message, sent ahead of it), [`diff`] (twin/page
//! diffs), [`page`] (page state, lazy diffs, access misses), [`lock`] (distributed lock chain,
//! diffs piggybacked on grants), [`barrier`] (centralized barrier manager), [`push`] (diffs
//! pushed at barriers to the pages' earlier readers), [`stream`] (views that return while their
//! pages arrive), [`gc`] (collection of consistency data at barriers), [`collective`]
//! (allocation, distribute, exit), [`msg`] (wire messages), [`shared_bytes`] (diffs that point
//! into the frame they arrived in), [`node`] (the state machine), [`alloc`] (node 0's heap
//! allocator), [`stats`] (counters). Readable message-by-message scenarios live in
//! `scenarios.rs`.
#![forbid(unsafe_code)]

/// Asserts an invariant of the protocol where it is checked: in the crate's own tests (the
/// seeded simulation and the scenarios, release builds included, as `cargo test --release`
/// builds them) and in debug builds; compiled out of the library's release builds, where some
/// (a scan of every page) would cost. Violations are bugs here, never a peer's bad input.
macro_rules! invariant {
    ($($arg:tt)*) => {
        if cfg!(any(test, debug_assertions)) {
            assert!($($arg)*);
        }
    };
}

/// [`invariant!`] for two values that must be equal.
macro_rules! invariant_eq {
    ($($arg:tt)*) => {
        if cfg!(any(test, debug_assertions)) {
            assert_eq!($($arg)*);
        }
    };
}

pub mod ahead;
pub mod alloc;
pub mod barrier;
pub mod cautious;
pub mod collective;
pub mod diff;
pub mod error;
pub mod gc;
pub mod ids;
pub mod interval;
pub mod lock;
pub mod lock_history;
pub mod memory;
pub mod msg;
pub mod node;
pub mod page;
pub mod push;
pub mod shared_bytes;
pub mod stats;
pub mod stream;
pub mod vtime;

#[cfg(test)]
mod scenarios;
#[cfg(test)]
mod sim;

pub use collective::MAX_DISTRIBUTE;
pub use diff::Diff;
pub use error::ProtocolError;
pub use ids::{BarrierId, DiffSeq, IntervalIdx, LockId, NodeId, PageIdx};
pub use interval::IntervalRecord;
pub use memory::{Access, MidStore, PageMemory, StoreRan, VecMemory};
pub use msg::{AllocFailure, DiffAsk, Held, Message, MsgKind, PageCopy, PageDiffs, UnaskedDiffs};
pub use node::{AppDone, Limits, Node, NodeConfig};
pub use shared_bytes::{ByteOwner, SharedBytes, decode_sharing};
pub use stats::ProtocolStats;
pub use vtime::VectorTime;
