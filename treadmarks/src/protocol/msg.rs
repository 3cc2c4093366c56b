//! Wire messages between nodes. Pure data: the codec lives in `transport::codec`.

use super::diff::Diff;
use super::ids::{BarrierId, DiffSeq, IntervalIdx, LockId, NodeId, PageIdx};
use super::interval::IntervalRecord;
use super::lock_history::Wish;
use super::vtime::VectorTime;
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;

/// A page's diffs from one writer, as a message carries them: usually one (a writer's diffs
/// of a page since the reader last applied one), kept inline so that a reply of hundreds of
/// pages takes no allocation per page to build or decode.
pub type DiffList = SmallVec<[DiffWire; 1]>;

/// One diff as it travels in a [`Message::DiffReply`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffWire {
    /// The writer's sequence number of this diff (per writer, increasing).
    pub seq: DiffSeq,
    /// Timestamp of the first interval the diff covers (the interval its twin was made in).
    pub first_vt: VectorTime,
    /// The changed bytes.
    pub diff: Diff,
}

/// One page's worth of a [`Message::DiffRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffAsk {
    pub page: PageIdx,
    /// Send diffs for the writer's intervals up to this one...
    pub want: IntervalIdx,
    /// ...newer than this diff, which the requester has already applied.
    pub after_seq: DiffSeq,
}

/// One page's worth of a [`Message::DiffReply`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageDiffs {
    pub page: PageIdx,
    #[serde(deserialize_with = "super::cautious::small_vec")]
    pub diffs: DiffList,
}

/// One page's worth of diffs sent unasked: pushed at a barrier ([`Message::DiffPush`]) or
/// piggybacked on a [`Message::LockGrant`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnaskedDiffs {
    pub page: PageIdx,
    /// The writer's newest diff of the page it assumes the receiver has (applied, or pushed to
    /// it): the diffs are every one after it, up to the writer's newest interval the message
    /// makes known.
    pub after_seq: DiffSeq,
    #[serde(deserialize_with = "super::cautious::small_vec")]
    pub diffs: DiffList,
}

/// One page's worth of a [`Message::PageReply`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageCopy {
    pub page: PageIdx,
    pub bytes: serde_bytes::ByteBuf,
    /// Per node, what the copy holds of its writes to the page: the receiver applies only the
    /// diffs it does not hold over it.
    pub holds: Vec<Held>,
}

/// What a [`PageCopy`] holds of one node's writes to its page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// Every diff up to this one.
    pub seq: DiffSeq,
    /// Every diff whose first interval is at most this one: superseded by the holder's overwrite
    /// of the whole page, which the copy holds or the requester will apply.
    pub superseded: IntervalIdx,
}

/// Why an allocation failed, as node 0's allocator reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum AllocFailure {
    /// No free range is large enough.
    #[error("shared heap exhausted: {requested} bytes requested, largest free block is {largest_free} bytes")]
    OutOfMemory { requested: u64, largest_free: u64 },
    /// Zero-sized, or an alignment that is not a power of two.
    #[error("invalid allocation of {bytes} bytes aligned to {align}")]
    Invalid { bytes: u64, align: u64 },
    /// `free` of an offset that is not the start of a live allocation.
    #[error("free of offset {offset:#x}, which is not a live allocation")]
    NotAllocated { offset: u64 },
}

/// Every message of the protocol.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// Acquirer → the lock's manager: the acquirer's `seq`-th request for the lock, and the
    /// locks it expects to take next (its wish, `lock_history.rs`).
    LockRequest { lock: LockId, seq: u32, vt: VectorTime, wish: Wish },
    /// Manager → the last requester of the lock: `requester` wants it after you. `tail` is the
    /// request of yours that made you the last requester (`None`: a grant passed you the token
    /// unasked). A former holder that passed the token to the manager sends a forward that was
    /// still on its way back to the manager (see `lock.rs`).
    LockForward { lock: LockId, requester: NodeId, vt: VectorTime, wish: Wish, tail: Option<u32> },
    /// Releaser → acquirer: the lock, with every interval the acquirer lacks, the releaser's
    /// diffs of the pages it wrote while holding this lock or a bundled one and of those the
    /// acquirer reads (see `lock.rs`), and the tokens of
    /// locks the acquirer wished for that the releaser held unused (`bundled`; see `lock.rs`).
    LockGrant {
        lock: LockId,
        #[serde(deserialize_with = "super::cautious::records")]
        intervals: Vec<IntervalRecord>,
        #[serde(deserialize_with = "super::cautious::grant_pages")]
        diffs: Vec<UnaskedDiffs>,
        bundled: Vec<LockId>,
    },
    /// Client → barrier manager (node 0): arrival, with the client's intervals the manager lacks;
    /// `gc`: the client's consistency data is over the threshold (or it asked to collect).
    /// `pushes`: the nodes this one pushes diffs to at this barrier, after this message
    /// (`push.rs`).
    BarrierArrive {
        barrier: BarrierId,
        vt: VectorTime,
        #[serde(deserialize_with = "super::cautious::records")]
        intervals: Vec<IntervalRecord>,
        gc: bool,
        pushes: Vec<NodeId>,
    },
    /// Barrier manager → client: every interval the client lacks; `gc`: this barrier collects.
    /// `heap_end`: the end of the highest allocation so far (`Node::back_heap`).
    /// `pushed_by`: the nodes that push diffs to the receiver at this barrier, which it waits for
    /// before it passes.
    BarrierRelease {
        barrier: BarrierId,
        #[serde(deserialize_with = "super::cautious::records")]
        intervals: Vec<IntervalRecord>,
        gc: bool,
        heap_end: u64,
        pushed_by: Vec<NodeId>,
    },
    /// Node → barrier manager: I have validated every page I must keep (collecting barrier).
    GcDone,
    /// Barrier manager → all: everybody has validated; drop consistency data and go on.
    GcRelease,
    /// Faulting node → writer: one request per writer, for every page it needs from it.
    DiffRequest { asks: Vec<DiffAsk> },
    /// Writer → faulting node: the diffs, page by page, in the order asked; one request's
    /// answer comes in several replies when its diffs are larger than `limits.reply_bytes`.
    /// `continued`: this reply's last page has more diffs in the next reply.
    DiffReply {
        #[serde(deserialize_with = "super::cautious::request_pages")]
        pages: Vec<PageDiffs>,
        continued: bool,
    },
    /// Writer → a node that read these pages before, at the writer's arrival at a barrier: its
    /// diffs of them up to interval `upto`, before they are asked for (see `push.rs`).
    /// `episode`: the number of barriers passed once this one completes.
    DiffPush {
        episode: u64,
        upto: IntervalIdx,
        #[serde(deserialize_with = "super::cautious::push_pages")]
        pages: Vec<UnaskedDiffs>,
    },
    /// Reader → writer: pushes of these pages went unused; stop pushing them.
    Unsubscribe { pages: Vec<PageIdx> },
    /// Node that dropped pages at a collection → a node holding copies: send them whole.
    PageRequest { pages: Vec<PageIdx> },
    /// The whole pages.
    PageReply {
        #[serde(deserialize_with = "super::cautious::request_pages")]
        pages: Vec<PageCopy>,
    },
    /// Any node → node 0: allocate.
    AllocRequest { bytes: u64, align: u64 },
    /// Node 0 → requester: the heap offset, or why not.
    AllocReply { result: Result<u64, AllocFailure> },
    /// Any node → node 0: free the allocation at `offset`.
    FreeRequest { offset: u64 },
    /// Node 0 → requester: the free is done, or why not.
    FreeReply { result: Result<(), AllocFailure> },
    /// Node 0 → all: the `seq`-th distributed value, and the end of the highest allocation so
    /// far (backed at the next barrier).
    Distribute { seq: u64, bytes: serde_bytes::ByteBuf, heap_end: u64 },
    /// Node → node 0: my application has finished.
    ExitArrive,
    /// Node 0 → all: everybody has finished; nobody will ask you for anything any more.
    ExitRelease,
    /// Runtime round trip probe.
    Ping { token: u64 },
    /// Answer to [`Message::Ping`].
    Pong { token: u64 },
    /// The sender's job failed, for this reason; the receiver fails too, naming the cause.
    Abort { reason: String },
    /// Node → node 0: my application waits for the `seq`-th distributed value, which has not
    /// come (so that node 0 can tell, rather than wait forever, when it goes into a barrier or
    /// exit instead of sending it).
    DistributeWait { seq: u64 },
    /// The head of the interval records of the next `LockGrant`, `BarrierArrive` or
    /// `BarrierRelease` its sender sends to the receiver, sent ahead when the records take more
    /// than `limits.record_bytes` (see `ahead.rs`).
    Intervals {
        #[serde(deserialize_with = "super::cautious::records")]
        intervals: Vec<IntervalRecord>,
    },
}

/// The kind of a message, for statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MsgKind {
    LockRequest,
    LockForward,
    LockGrant,
    BarrierArrive,
    BarrierRelease,
    Intervals,
    DiffRequest,
    DiffReply,
    DiffPush,
    Unsubscribe,
    Page,
    Gc,
    Alloc,
    Distribute,
    Exit,
    Ping,
    Abort,
}

impl MsgKind {
    /// Every kind, in display order.
    pub const ALL: [MsgKind; 17] = [
        MsgKind::LockRequest,
        MsgKind::LockForward,
        MsgKind::LockGrant,
        MsgKind::BarrierArrive,
        MsgKind::BarrierRelease,
        MsgKind::Intervals,
        MsgKind::DiffRequest,
        MsgKind::DiffReply,
        MsgKind::DiffPush,
        MsgKind::Unsubscribe,
        MsgKind::Page,
        MsgKind::Gc,
        MsgKind::Alloc,
        MsgKind::Distribute,
        MsgKind::Exit,
        MsgKind::Ping,
        MsgKind::Abort,
    ];

    /// Short name.
    pub fn name(self) -> &'static str {
        match self {
            MsgKind::LockRequest => "lock_request",
            MsgKind::LockForward => "lock_forward",
            MsgKind::LockGrant => "lock_grant",
            MsgKind::BarrierArrive => "barrier_arrive",
            MsgKind::BarrierRelease => "barrier_release",
            MsgKind::Intervals => "intervals",
            MsgKind::DiffRequest => "diff_request",
            MsgKind::DiffReply => "diff_reply",
            MsgKind::DiffPush => "diff_push",
            MsgKind::Unsubscribe => "unsubscribe",
            MsgKind::Page => "page",
            MsgKind::Gc => "gc",
            MsgKind::Alloc => "alloc",
            MsgKind::Distribute => "distribute",
            MsgKind::Exit => "exit",
            MsgKind::Ping => "ping",
            MsgKind::Abort => "abort",
        }
    }
}

impl Message {
    /// The message's kind.
    pub fn kind(&self) -> MsgKind {
        match self {
            Message::LockRequest { .. } => MsgKind::LockRequest,
            Message::LockForward { .. } => MsgKind::LockForward,
            Message::LockGrant { .. } => MsgKind::LockGrant,
            Message::BarrierArrive { .. } => MsgKind::BarrierArrive,
            Message::BarrierRelease { .. } => MsgKind::BarrierRelease,
            Message::Intervals { .. } => MsgKind::Intervals,
            Message::DiffRequest { .. } => MsgKind::DiffRequest,
            Message::DiffReply { .. } => MsgKind::DiffReply,
            Message::DiffPush { .. } => MsgKind::DiffPush,
            Message::Unsubscribe { .. } => MsgKind::Unsubscribe,
            Message::PageRequest { .. } | Message::PageReply { .. } => MsgKind::Page,
            Message::GcDone | Message::GcRelease => MsgKind::Gc,
            Message::AllocRequest { .. }
            | Message::AllocReply { .. }
            | Message::FreeRequest { .. }
            | Message::FreeReply { .. } => MsgKind::Alloc,
            Message::Distribute { .. } | Message::DistributeWait { .. } => MsgKind::Distribute,
            Message::ExitArrive | Message::ExitRelease => MsgKind::Exit,
            Message::Ping { .. } | Message::Pong { .. } => MsgKind::Ping,
            Message::Abort { .. } => MsgKind::Abort,
        }
    }
}
