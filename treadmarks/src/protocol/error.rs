//! Errors of the protocol core. Each names the value at fault.

use super::diff::DiffError;
use super::ids::{BarrierId, LockId, NodeId, PageIdx};
use super::msg::AllocFailure;

/// An error from the protocol core: bad input from the application or from a peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A lock id beyond the configured count.
    #[error("{lock} is out of range: this job has {nlocks} locks (ids 0..{nlocks})")]
    UnknownLock { lock: LockId, nlocks: u32 },
    /// A node id beyond the job's nodes (as the application gave it).
    #[error("node {node} is out of range: this job has {nprocs} nodes (ids 0..{nprocs})")]
    UnknownNode { node: u64, nprocs: u16 },
    /// A barrier id beyond the configured count.
    #[error("{barrier} is out of range: this job has {nbarriers} barriers (ids 0..{nbarriers})")]
    UnknownBarrier { barrier: BarrierId, nbarriers: u32 },
    /// Release of a lock this node does not hold.
    #[error("release of {lock}, which this node does not hold")]
    NotHeld { lock: LockId },
    /// Acquire of a lock this node already holds (locks are not recursive).
    #[error("acquire of {lock}, which this node already holds (locks are not recursive)")]
    AlreadyHeld { lock: LockId },
    /// A peer sent a message that makes no sense in our state.
    #[error("unexpected {what} from {from}")]
    Unexpected { from: NodeId, what: String },
    /// A peer named a page outside the heap.
    #[error("{from} named {page}, but the heap has {npages} pages")]
    PageOutOfRange { from: NodeId, page: PageIdx, npages: u32 },
    /// A peer sent interval records with a hole in them.
    #[error("{from} sent interval {got} of {node} while we know only up to {known}")]
    IntervalGap { from: NodeId, node: NodeId, known: u32, got: u32 },
    /// A malformed diff.
    #[error("malformed diff of {page} from {from}: {source}")]
    BadDiff { from: NodeId, page: PageIdx, source: DiffError },
    /// Nodes disagree about which barrier they are at.
    #[error("{node} arrived at {got} while the others are at {expected}")]
    BarrierMismatch { node: NodeId, expected: BarrierId, got: BarrierId },
    /// A node called exit while another waits at a barrier, or arrived at one after another
    /// called exit: they would wait for each other forever.
    #[error(
        "{exited} called exit while {waiting} waits at {barrier}{}: every node must pass the same barriers before it exits",
        collect_note(.barrier)
    )]
    ExitAtBarrier { exited: NodeId, waiting: NodeId, barrier: BarrierId },
    /// A node waits for a distributed value that node 0, at a barrier or in exit, will not send.
    #[error(
        "{waiting} waits for distributed value {value} while node 0 is {root}: every distribute call on node 0 pairs with one on every node"
    )]
    DistributeUnanswered { waiting: NodeId, value: u64, root: String },
    /// Node 0 distributed more values than this node holds untaken: its application calls
    /// `distribute` far less often than node 0's (node 0 does not wait for the others).
    #[error(
        "node 0 distributed value {value} while {held} bytes of its values wait for this node's application to take them, over the {limit} a node holds (TMK_CONSISTENCY_LIMIT, but at least 64 MiB): every distribute call on node 0 pairs with one on every node"
    )]
    DistributeBacklog { value: u64, held: u64, limit: u64 },
    /// A value to distribute larger than a message holds.
    #[error("distribute of {bytes} bytes: a value may have at most {max}")]
    DistributeTooLarge { bytes: usize, max: usize },
    /// An allocation failed.
    #[error(transparent)]
    Alloc(#[from] AllocFailure),
    /// A peer's job failed and it told us why.
    #[error("{from} aborted the job: {reason}")]
    Aborted { from: NodeId, reason: String },
    /// A node that never collects (a program synchronizing with locks alone) holds more
    /// consistency data than its limit allows.
    #[error(
        "consistency data is {bytes} bytes, over this node's limit of {limit} (TMK_CONSISTENCY_LIMIT): \
         only a barrier or Tmk::collect() (a collective) collects it, and a program that synchronizes \
         with locks alone must call one now and then"
    )]
    ConsistencyLimit { bytes: u64, limit: u64 },
    /// Exit while the application holds a lock, which nobody else could take again.
    #[error("exit while holding {lock}: release it first (the next node to ask for it would wait forever)")]
    ExitHolding { lock: LockId },
    /// The application asked for something while another request is pending.
    #[error("{what} requested while another request is still pending")]
    Busy { what: &'static str },
}

/// Barrier 0 is also `Tmk::collect`'s: a node waiting there may be in either.
fn collect_note(barrier: &BarrierId) -> &'static str {
    if barrier.0 == 0 { " (or in Tmk::collect, which is barrier 0)" } else { "" }
}
