//! [`Node`]: one node's protocol state, and the entry points the runtime drives.
//!
//! Inputs: `request_*` (application commands), [`Node::handle_fault`], [`Node::handle_twin_made`]
//! (a twin the fault handler made on its own), [`Node::handle_message`]. Outputs:
//! [`Node::poll_transmit`] (messages to send) and [`Node::poll_done`] (completions of the
//! application's pending request). Page bytes and protection go through [`PageMemory`].
//! The application has at most one request pending at a time (one application thread per node).
//!
//! Write notices are incorporated, and pages invalidated, only while the application is inside a
//! synchronization call (an acquire or a barrier): never behind its back.

use super::ProtocolError;
use super::ahead::{RecordsAhead, cut_ahead};
use super::alloc::Allocator;
use super::barrier::{BarrierEpisode, Passing};
use super::gc::{Accounting, GcRound};
use super::ids::{BarrierId, IntervalIdx, LockId, NodeId, PageIdx};
use super::interval::{IntervalLog, IntervalRecord};
use super::lock::{LockAsk, LockState};
use super::lock_history::LockHistory;
use super::memory::{Access, PageMemory};
use super::msg::{AllocFailure, DiffWire, Message, PageCopy, PageDiffs};
use super::page::{Miss, PageMeta, cut_reply};
use super::push::PushState;
use super::stats::ProtocolStats;
use super::stream::StreamState;
use super::vtime::VectorTime;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Static configuration of a node; identical on every node except `me`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeConfig {
    pub me: NodeId,
    pub nprocs: u16,
    pub nlocks: u32,
    pub nbarriers: u32,
    /// Heap size in bytes (node 0's allocator manages it).
    pub heap_size: u64,
    /// Consistency data (bytes) past which this node asks the next barrier to collect.
    pub gc_threshold: u64,
    /// Subscribe readers and push them diffs at barriers (`push.rs`); off, readers always ask.
    pub push: bool,
    /// Skip a page's push at a barrier when its write history says the next epoch writes it
    /// again (`push.rs`, "Skipping").
    pub push_skip: bool,
    /// Most lock tokens one grant passes along unasked, and most locks a request wishes for
    /// (`lock_history.rs`); 0: every lock is requested on its own. Nodes may differ.
    pub lock_bundle: usize,
    /// Back the heap's allocated pages with memory at barriers (`Node::back_heap`).
    pub back_heap: bool,
    /// A view that would fetch at least this many pages streams (`stream.rs`); 0: none does.
    pub stream_min_pages: usize,
    /// Consistency data (bytes, as the collection threshold counts it) past which a lock
    /// acquire fails instead of letting a program that never collects run the machine out of
    /// memory (`gc.rs`); `u64::MAX`: no limit.
    pub consistency_limit: u64,
    /// Sizes the protocol cuts its work at: [`Limits::default`] in a job.
    pub limits: Limits,
}

/// Sizes the protocol cuts its work at. Every node of a job has the same: the defaults, the
/// constants these name; the seeded simulation lowers them so that its tiny heaps reach them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most pages pushed to one subscriber at one barrier ([`super::push::PUSH_MAX_PAGES`]).
    pub push_max_pages: usize,
    /// Most diff bytes a lock grant carries unasked ([`super::lock::PIGGYBACK_LIMIT`]).
    pub piggyback_bytes: usize,
    /// Most pages a lock grant carries diffs of ([`super::lock::PIGGYBACK_MAX_PAGES`]).
    pub piggyback_pages: usize,
    /// Fewest write notices in a barrier episode whose application the manager defers until
    /// its releases are sent (`barrier.rs`: `DEFER_NOTICES_MIN`).
    pub defer_notices_min: usize,
    /// Pages in the first request of a batch to one writer (`page.rs`: `FIRST_REQUEST_PAGES`).
    pub first_request_pages: usize,
    /// Most pages one request names ([`super::page::PAGES_PER_REQUEST`]); a server refuses a
    /// request naming more.
    pub pages_per_request: usize,
    /// Most diff bytes one reply or push carries ([`super::page::REPLY_BYTES`]).
    pub reply_bytes: usize,
    /// Most bytes of interval records one grant, arrival or release carries; older ones go
    /// ahead of it ([`super::ahead::RECORD_BYTES`]).
    pub record_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            push_max_pages: super::push::PUSH_MAX_PAGES,
            piggyback_bytes: super::lock::PIGGYBACK_LIMIT,
            piggyback_pages: super::lock::PIGGYBACK_MAX_PAGES,
            defer_notices_min: super::barrier::DEFER_NOTICES_MIN,
            first_request_pages: super::page::FIRST_REQUEST_PAGES,
            pages_per_request: super::page::PAGES_PER_REQUEST,
            reply_bytes: super::page::REPLY_BYTES,
            record_bytes: super::ahead::RECORD_BYTES,
        }
    }
}

/// Completion of the application's pending request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppDone {
    Acquired(LockId),
    BarrierPassed(BarrierId),
    FaultResolved(PageIdx),
    /// The pages asked for with [`Node::request_validate`] are valid.
    Validated,
    Allocated(Result<u64, AllocFailure>),
    Freed(Result<(), AllocFailure>),
    Distributed(Vec<u8>),
    Exited,
    Pong(NodeId),
    /// No page of a streaming view is on its way any more ([`Node::request_settle`]).
    Settled,
}

/// What the application is waiting for.
#[derive(Debug, Default)]
pub(crate) enum Pending {
    #[default]
    None,
    Acquire(LockId),
    Barrier(BarrierId),
    /// `views_open`: as said before the fault ([`Node::set_mutable_views_open`]).
    Fault {
        views_open: bool,
    },
    /// Pages still to validate for [`Node::request_validate`], the pages to twin ahead of
    /// writes once they are valid, and those of them declared overwritten (to diff whole).
    Validate {
        left: usize,
        then_write: Vec<PageIdx>,
        whole: Vec<PageIdx>,
        /// Pages of `whole` superseded unfetched, still unmapped: twinned ahead with the rest.
        superseded: Vec<PageIdx>,
        /// As said before the validation ([`Node::set_mutable_views_open`]).
        views_open: bool,
    },
    Alloc,
    Free,
    Distribute(u64),
    Exit,
    Ping(NodeId),
    /// The pages of streaming views to arrive ([`Node::request_settle`]).
    Settle,
}

/// Most pages, invalid already, that a run of pages being invalidated goes on across
/// ([`Node::set_access_in_runs`]).
pub(crate) const INVALID_BRIDGE_PAGES: u32 = 16;

/// One node's protocol state machine.
#[derive(Debug)]
pub struct Node<M> {
    pub(crate) cfg: NodeConfig,
    pub(crate) me: NodeId,
    pub(crate) mem: M,
    /// Knowledge: `vt[n]` = newest closed interval of `n` we know; `vt[me]` = our closed count.
    pub(crate) vt: VectorTime,
    pub(crate) log: IntervalLog,
    pub(crate) pages: Vec<PageMeta>,
    /// Pages with a twin, i.e. written since their last diff.
    pub(crate) twinned: BTreeSet<PageIdx>,
    /// Pages given a twin in the open interval, in the order they got it (a page may repeat,
    /// or have lost that twin since): closing the interval looks at these, not at every
    /// twinned page (SOR keeps a thousand pages twinned and twins a handful per interval).
    pub(crate) opened_twins: Vec<PageIdx>,
    /// A page's worth of scratch for [`PageMemory::snapshot`] (`Node::cut_diff`).
    pub(crate) snapshot: Vec<u8>,
    pub(crate) diff_seq: u64,
    pub(crate) locks: Vec<LockState>,
    /// Locks held at some point during the open interval, each once (`LockState::in_interval`):
    /// a lock taken again and again while nothing is recorded is noted once.
    pub(crate) interval_locks: Vec<LockId>,
    /// Locks held now (those whose `held` is set; a closing interval hands them to the next
    /// one without scanning every lock).
    pub(crate) held_locks: Vec<LockId>,
    /// The locks we acquired, and which followed which (wishes for bundled grants).
    pub(crate) lock_history: LockHistory,
    pub(crate) barrier: BarrierEpisode,
    /// A barrier we were released from and pass once its pushes are in (`barrier.rs`).
    pub(crate) passing: Option<Passing>,
    /// Records the barrier manager logged when it released a barrier, whose write notices it
    /// applies once the releases are sent (`barrier.rs`): empty but between the two.
    pub(crate) notices_due: Vec<(NodeId, IntervalIdx)>,
    /// Our newest interval the barrier manager has been sent.
    pub(crate) sent_to_manager: IntervalIdx,
    pub(crate) allocator: Option<Allocator>,
    /// Pages `0..backed_pages` have been backed with memory (`Node::back_heap`).
    pub(crate) backed_pages: u32,
    /// The end of the highest allocation this node has heard of (its own allocator's, at node
    /// 0; else the last distribute's or barrier release's): what it backs while it waits at
    /// its next barrier.
    pub(crate) heap_end_heard: u64,
    pub(crate) distribute_seq: u64,
    pub(crate) distributed: VecDeque<(u64, Vec<u8>)>,
    /// Memory the values of `distributed` take (bounded like the parts of a peer's replies:
    /// [`Accounting::parts_limit`]).
    pub(crate) distributed_bytes: u64,
    pub(crate) exit_arrived: Vec<bool>,
    /// At node 0: per node, the distributed value its application waits for, unsent when it
    /// asked (`Message::DistributeWait`).
    pub(crate) distribute_waits: Vec<Option<u64>>,
    pub(crate) pending: Pending,
    /// What the runtime said of the application's mutable views for its next validation or
    /// fault ([`Node::set_mutable_views_open`]), which takes it; unsaid counts as open.
    pub(crate) views_said: Option<bool>,
    /// Access misses in flight (the application's, or a collection's validations).
    pub(crate) misses: BTreeMap<PageIdx, Miss>,
    /// Pages of the validation in progress that are up to date, to be made readable together.
    pub(crate) validated: Vec<PageIdx>,
    /// The pages of the application's write view, sorted, until the interval ends (a view does
    /// not outlive it): one served meanwhile has its twin renewed, however old, rather than
    /// being frozen, since the application is about to write it (`Node::request_view`).
    pub(crate) writing: Vec<PageIdx>,
    pub(crate) acct: Accounting,
    /// Pages of streaming views on their way, and those that just arrived.
    pub(crate) stream: StreamState,
    /// Subscribers of our pages, and diffs pushed to us.
    pub(crate) push: PushState,
    pub(crate) gc: Option<GcRound>,
    /// Manager only: who has sent `GcDone` in this collection.
    pub(crate) gc_done: Vec<bool>,
    /// The application asked the next barrier to collect.
    pub(crate) gc_force: bool,
    /// The consistency data last warned about (0: none since the last collection), so that
    /// each doubling past the overdue mark is said once (`gc.rs`).
    pub(crate) gc_warned_at: u64,
    pub(crate) warnings: VecDeque<String>,
    /// Interval records peers sent ahead of their next grant, arrival or release.
    pub(crate) ahead: RecordsAhead,
    /// Per peer, the memory the diffs of its `continued` replies take in misses not finished
    /// (bounded by [`Accounting::parts_limit`]; `Miss::continued` says which).
    pub(crate) held_continued: Vec<u64>,
    pub(crate) outbox: VecDeque<(NodeId, Message)>,
    pub(crate) done: VecDeque<AppDone>,
    pub(crate) stats: ProtocolStats,
}

impl<M: PageMemory> Node<M> {
    /// A node at the start of a job: every page valid (zeros) and, with more than one node,
    /// write-protected; `mem` must already be in that state.
    pub fn new(cfg: NodeConfig, mem: M) -> Self {
        let n = cfg.nprocs as usize;
        let npages = mem.npages() as usize;
        let me = cfg.me;
        let locks = (0..cfg.nlocks).map(|l| LockState::new(LockId(l), me, cfg.nprocs)).collect();
        Node {
            me,
            vt: VectorTime::zero(n),
            log: IntervalLog::new(n),
            pages: vec![PageMeta::default(); npages],
            twinned: BTreeSet::new(),
            opened_twins: Vec::new(),
            snapshot: Vec::new(),
            diff_seq: 0,
            locks,
            interval_locks: Vec::new(),
            held_locks: Vec::new(),
            lock_history: LockHistory::new(cfg.lock_bundle, cfg.nlocks),
            barrier: BarrierEpisode::new(n),
            passing: None,
            notices_due: Vec::new(),
            sent_to_manager: 0,
            allocator: (me == NodeId(0)).then(|| Allocator::new(cfg.heap_size)),
            backed_pages: 0,
            heap_end_heard: 0,
            distribute_seq: 0,
            distributed: VecDeque::new(),
            distributed_bytes: 0,
            exit_arrived: vec![false; n],
            distribute_waits: vec![None; n],
            pending: Pending::None,
            views_said: None,
            misses: BTreeMap::new(),
            validated: Vec::new(),
            writing: Vec::new(),
            acct: Accounting::default(),
            stream: StreamState::default(),
            push: PushState::default(),
            gc: None,
            gc_done: vec![false; n],
            gc_force: false,
            gc_warned_at: 0,
            warnings: VecDeque::new(),
            ahead: RecordsAhead::new(n),
            held_continued: vec![0; n],
            outbox: VecDeque::new(),
            done: VecDeque::new(),
            stats: ProtocolStats::default(),
            cfg,
            mem,
        }
    }

    /// This node's id.
    pub fn id(&self) -> NodeId {
        self.me
    }

    /// Number of nodes.
    pub fn nprocs(&self) -> usize {
        self.cfg.nprocs as usize
    }

    /// The page memory.
    pub fn mem(&self) -> &M {
        &self.mem
    }

    /// The page memory, mutably (the runtime and tests act as the application through it).
    pub fn mem_mut(&mut self) -> &mut M {
        &mut self.mem
    }

    /// Protocol counters.
    pub fn stats(&self) -> &ProtocolStats {
        &self.stats
    }

    /// Our vector timestamp.
    pub fn vt(&self) -> &VectorTime {
        &self.vt
    }

    /// Interval records held (ours and others').
    pub fn log(&self) -> &IntervalLog {
        &self.log
    }

    /// Consistency state of page `p`.
    pub fn page_meta(&self, p: PageIdx) -> &PageMeta {
        &self.pages[p.idx()]
    }

    /// The next message to send, if any.
    pub fn poll_transmit(&mut self) -> Option<(NodeId, Message)> {
        self.outbox.pop_front()
    }

    /// Whether a message waits to be sent.
    pub fn has_transmit(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// Whether a warning waits for [`Node::poll_warning`].
    pub fn has_warning(&self) -> bool {
        !self.warnings.is_empty()
    }

    /// A warning for the user (e.g. consistency data over the threshold with no barrier).
    pub fn poll_warning(&mut self) -> Option<String> {
        self.warnings.pop_front()
    }

    /// Completion of the pending application request, if it completed.
    pub fn poll_done(&mut self) -> Option<AppDone> {
        self.done.pop_front()
    }

    /// A fault on page `p`: resolves it locally (twin) or starts an access miss.
    pub fn handle_fault(&mut self, p: PageIdx, write: bool) -> Result<(), ProtocolError> {
        let views_open = self.take_views_open();
        self.check_page(self.me, p)?;
        self.begin("fault")?;
        self.fault(p, write, views_open)?;
        self.deliver_local()
    }

    /// The fault handler made a twin of `p` by itself and made it writable.
    pub fn handle_twin_made(&mut self, p: PageIdx) {
        invariant_eq!(self.mem.access(p), Access::ReadWrite);
        let (open, under_lock) = (self.open_interval(), !self.held_locks.is_empty());
        let meta = &mut self.pages[p.idx()];
        (meta.twin, meta.under_lock) = (Some(open), under_lock);
        self.twinned.insert(p);
        self.opened_twins.push(p);
        self.stats.fast_twins += 1;
    }

    /// A message from a peer.
    pub fn handle_message(&mut self, from: NodeId, msg: Message) -> Result<(), ProtocolError> {
        if from.idx() >= self.nprocs() {
            return Err(ProtocolError::Unexpected {
                from,
                what: "message from a node outside the job".into(),
            });
        }
        self.dispatch(from, msg)?;
        self.deliver_local()?;
        self.map_arrived();
        Ok(())
    }

    pub(crate) fn dispatch(&mut self, from: NodeId, msg: Message) -> Result<(), ProtocolError> {
        match &msg {
            Message::DiffReply { pages, .. } => {
                for pd in pages {
                    self.check_diffs(from, pd.page, &pd.diffs)?;
                }
            }
            Message::DiffPush { pages, .. } | Message::LockGrant { diffs: pages, .. } => {
                for pd in pages {
                    self.check_diffs(from, pd.page, &pd.diffs)?;
                }
            }
            _ => {}
        }
        match msg {
            Message::LockRequest { lock, seq, vt, wish } => {
                self.handle_lock_request(from, lock, seq, LockAsk { requester: from, vt, wish })
            }
            Message::LockForward { lock, requester, vt, wish, tail } => {
                self.handle_lock_forward(from, lock, LockAsk { requester, vt, wish }, tail)
            }
            Message::LockGrant { lock, intervals, diffs, bundled } => {
                let intervals = self.ahead.complete(from, intervals);
                self.handle_lock_grant(from, lock, intervals, diffs, bundled)
            }
            Message::BarrierArrive { barrier, vt, intervals, gc, pushes } => {
                let intervals = self.ahead.complete(from, intervals);
                self.handle_barrier_arrive(from, barrier, vt, intervals, gc, pushes)
            }
            Message::BarrierRelease { barrier, intervals, gc, heap_end, pushed_by } => {
                let intervals = self.ahead.complete(from, intervals);
                self.handle_barrier_release(from, barrier, intervals, gc, heap_end, pushed_by)
            }
            Message::Intervals { intervals } => {
                // A release may bring every other node's records: the bound is per node.
                let limit =
                    Accounting::parts_limit(self.cfg.consistency_limit).saturating_mul(self.nprocs() as u64);
                self.ahead.hold(from, intervals, limit)
            }
            Message::DiffRequest { asks } => {
                self.check_request_len(from, "diff", asks.len())?;
                for a in &asks {
                    self.check_page(from, a.page)?;
                }
                self.note_fetched_after_skip(from, &asks);
                let pages = self.serve_diff_request(&asks, self.app_still());
                self.note_subscribers(from, &asks, &pages);
                for (pages, continued) in cut_reply(pages, self.cfg.limits.reply_bytes) {
                    self.outbox.push_back((from, Message::DiffReply { pages, continued }));
                }
                Ok(())
            }
            Message::DiffPush { episode, upto, pages } => self.handle_diff_push(from, episode, upto, pages),
            Message::Unsubscribe { pages } => self.handle_unsubscribe(from, pages),
            Message::DiffReply { pages, continued } => {
                if continued && pages.is_empty() {
                    return Err(ProtocolError::Unexpected {
                        from,
                        what: "continued diff reply of no page".into(),
                    });
                }
                let last = pages.len().saturating_sub(1);
                for (i, PageDiffs { page, diffs }) in pages.into_iter().enumerate() {
                    self.check_page(from, page)?;
                    self.handle_diff_reply(from, page, diffs, !(continued && i == last))?;
                }
                Ok(())
            }
            Message::PageRequest { pages } => {
                self.check_request_len(from, "page", pages.len())?;
                for &p in &pages {
                    self.check_page(from, p)?;
                }
                let pages = pages.into_iter().map(|p| self.serve_page(p)).collect();
                self.outbox.push_back((from, Message::PageReply { pages }));
                Ok(())
            }
            Message::PageReply { pages } => {
                for PageCopy { page, bytes, holds } in pages {
                    self.check_page(from, page)?;
                    self.handle_page_reply(from, page, bytes.into_vec(), holds)?;
                }
                Ok(())
            }
            Message::GcDone => self.handle_gc_done(from),
            Message::GcRelease => self.handle_gc_release(from),
            other => self.handle_collective(from, other),
        }
    }

    /// Queues `msg`, a grant, arrival or release carrying interval records, for `to`, sending
    /// the oldest ahead of it if they take more than `limits.record_bytes` (`ahead.rs`). A
    /// message to this node itself is not cut: it never goes over a link.
    pub(crate) fn send_with_records(&mut self, to: NodeId, mut msg: Message) {
        if let Message::LockGrant { intervals, .. }
        | Message::BarrierArrive { intervals, .. }
        | Message::BarrierRelease { intervals, .. } = &mut msg
            && to != self.me
        {
            for part in cut_ahead(intervals, self.cfg.limits.record_bytes) {
                self.stats.records_sent_ahead += part.len() as u64;
                self.outbox.push_back((to, Message::Intervals { intervals: part }));
            }
        }
        self.outbox.push_back((to, msg));
    }

    /// Messages a node sends itself (it manages a lock it wants, node 0 arriving at a barrier)
    /// are handled right away, without touching the network.
    pub(crate) fn deliver_local(&mut self) -> Result<(), ProtocolError> {
        while let Some(i) = self.outbox.iter().position(|(to, _)| *to == self.me) {
            let (_, msg) = self.outbox.remove(i).expect("index from position");
            self.dispatch(self.me, msg)?;
        }
        Ok(())
    }

    pub(crate) fn begin(&self, what: &'static str) -> Result<(), ProtocolError> {
        match self.pending {
            Pending::None => Ok(()),
            _ => Err(ProtocolError::Busy { what }),
        }
    }

    /// Whether the application has a mutable view open as it asks for the validation or takes
    /// the fault that comes next (the view being validated aside): the runtime says so before
    /// each, from the heap's count of views. Unsaid, the next one takes it that one is open,
    /// so a caller that forgets costs a copy of the pages served meanwhile, never a lost write.
    pub fn set_mutable_views_open(&mut self, open: bool) {
        self.views_said = Some(open);
    }

    /// Takes what the runtime said of the views for this validation or fault (see
    /// [`Node::set_mutable_views_open`]).
    pub(crate) fn take_views_open(&mut self) -> bool {
        self.views_said.take().unwrap_or(true)
    }

    /// Whether another thread of the application may be writing the writable pages now: the
    /// application thread waits in a view or a fault with a mutable view open (the simulation
    /// runs such a thread's stores).
    #[cfg(test)]
    pub(crate) fn others_may_write(&self) -> bool {
        matches!(
            self.pending,
            Pending::Fault { views_open: true } | Pending::Validate { views_open: true, .. }
        )
    }

    /// True while nothing writes a page, writable or not, because the application thread waits
    /// inside a call into the runtime that has not completed: a synchronization call (an
    /// acquire, a barrier, an allocation, a distribute...), which takes the `Tmk` mutably, so
    /// that no view outlives its start; or a view's validation or a fault while no mutable view
    /// is open. Those run with views alive, and safe code can hand a mutable view's slice to
    /// another thread (a scoped one), which writes the pages already writable without faulting;
    /// so while one is open, a writable page is cut as while the application runs, from a
    /// snapshot or frozen, never read in place.
    pub(crate) fn app_still(&self) -> bool {
        match self.pending {
            Pending::None => false,
            Pending::Fault { views_open } | Pending::Validate { views_open, .. } => !views_open,
            Pending::Acquire(_)
            | Pending::Barrier(_)
            | Pending::Alloc
            | Pending::Free
            | Pending::Distribute(_)
            | Pending::Exit
            | Pending::Ping(_)
            | Pending::Settle => true,
        }
    }

    /// Checks `diffs` of `page` from `from`: a timestamp of one entry per node, and no more
    /// bytes than a diff of a page takes ([`Diff::most_encoded_len`](super::diff::Diff::most_encoded_len)).
    fn check_diffs(&self, from: NodeId, page: PageIdx, diffs: &[DiffWire]) -> Result<(), ProtocolError> {
        let (n, most) = (self.nprocs(), super::diff::Diff::most_encoded_len(self.mem.page_size()));
        // One pass over the list: replies carry thousands of diffs.
        let bad = diffs.iter().find_map(|d| {
            if d.first_vt.len() != n {
                Some(format!(
                    "diff of {page} with a timestamp of {} entries (the job has {n} nodes)",
                    d.first_vt.len()
                ))
            } else if d.diff.encoded_len() > most {
                Some(format!(
                    "diff of {page} of {} bytes (a diff of a page takes at most {most})",
                    d.diff.encoded_len()
                ))
            } else {
                None
            }
        });
        bad.map_or(Ok(()), |what| Err(ProtocolError::Unexpected { from, what }))
    }

    pub(crate) fn check_page(&self, from: NodeId, page: PageIdx) -> Result<(), ProtocolError> {
        let npages = self.mem.npages();
        if page.0 >= npages {
            return Err(ProtocolError::PageOutOfRange { from, page, npages });
        }
        Ok(())
    }

    /// Refuses a request naming more pages than any node sends in one (`limits.pages_per_request`):
    /// serving one costs about a page of memory per entry, a page named twice included.
    fn check_request_len(&self, from: NodeId, what: &str, len: usize) -> Result<(), ProtocolError> {
        let most = self.cfg.limits.pages_per_request.max(1);
        if len > most {
            return Err(ProtocolError::Unexpected {
                from,
                what: format!("{what} request of {len} pages (at most {most})"),
            });
        }
        Ok(())
    }

    /// Index of the open interval.
    ///
    /// Panics once the node has recorded `IntervalIdx::MAX` intervals (at ~5 µs an interval,
    /// some six hours of nothing else): a wrapped index would be taken by every peer for one it
    /// already has, and its write notices dropped without a word. The runtime ends the process
    /// on the panic, with its message, and the other nodes with it.
    pub(crate) fn open_interval(&self) -> IntervalIdx {
        self.vt.get(self.me).checked_add(1).unwrap_or_else(|| {
            panic!(
                "{} has recorded {} intervals, the most an interval index counts; the job cannot go on",
                self.me,
                IntervalIdx::MAX
            )
        })
    }

    /// Closes the open interval if it made a twin: records a write notice for every page whose
    /// twin was made in it, and the locks held during it.
    ///
    /// A page whose twin survives from an earlier interval is not listed again, though it may
    /// have been written again: its earlier notice already covers those writes. Whoever holds
    /// that notice asks for the page's diffs up to at least the twin's interval, which cuts the
    /// twin, so the diff it gets holds every write made until then; once the twin is cut, the
    /// next write makes a fresh twin, and a fresh notice. So a page written every interval faults
    /// once and is noticed once per diff, not once per interval, and an interval that made no
    /// twin carries no information and is not recorded.
    ///
    /// A renewed twin (made when a diff was served, the page left writable, or made ahead of
    /// writes by a view) may not have been written since, so its page is compared with the twin.
    /// Unchanged, the twin still equals the page, so it serves as the next interval's twin and
    /// the page stays writable; unchanged at that interval's close too, the twin is dropped and
    /// the page write-protected (the next write faults and makes a fresh twin). A page written
    /// every other interval (the two grids of Jacobi, SOR's red and black arrays, whose boundary
    /// pages a push cuts and renews every time) so keeps its twin, instead of being
    /// write-protected at one close and twinned again by the next view. When the application is
    /// `blocked` (an acquire, a barrier, or a release it runs itself: `Node::release_here`)
    /// nothing writes the page meanwhile. At a release handed to another thread the application
    /// is already running again and may be writing it, so those pages are frozen first, one
    /// protection change per run (a write waits in the slow path until the interval is closed),
    /// and changed and kept ones are made writable again. Noticing them unseen instead
    /// cost qsort a notice for every page a node had served: 1,024 pages invalidated, cut and
    /// asked for again by the next acquirer of the queue's lock, for nothing.
    pub(crate) fn close_interval(&mut self, blocked: bool) {
        self.writing.clear();
        if matches!(self.pending, Pending::Barrier(_)) {
            // A barrier's release: our arrival closed the interval and the application has been
            // blocked since, so it wrote nothing and every twin opened since (a push renewing
            // it) still equals its page. Nothing to record; the twins stay for the interval the
            // release opens (comparing them here found them unchanged and dropped them, so the
            // next view twinned the pushed pages again, every barrier).
            return;
        }
        if self.opened_twins.is_empty() {
            // Nothing twinned in this interval: nothing to record (a release after reading
            // only, or a lock taken again before its page was written).
            return;
        }
        let index = self.open_interval();
        let mut fresh = Vec::new();
        let mut unchanged = Vec::new();
        let mut opened = std::mem::take(&mut self.opened_twins);
        opened.sort_unstable();
        opened.dedup();
        opened.retain(|p| self.pages[p.idx()].twin == Some(index));
        let frozen: Vec<PageIdx> = if blocked {
            Vec::new()
        } else {
            let renewed_writable =
                |p: &PageIdx| self.pages[p.idx()].renewed && self.mem.access(*p) == Access::ReadWrite;
            opened.iter().copied().filter(renewed_writable).collect()
        };
        self.freeze_in_runs(frozen.iter().copied());
        for &p in &opened {
            let comparable = blocked || frozen.binary_search(&p).is_ok();
            let meta = &self.pages[p.idx()];
            // A page declared overwritten is noticed even if it equals its (stale) twin.
            if meta.renewed && !meta.whole && comparable && self.mem.same_as_twin(p) {
                unchanged.push(p);
            } else {
                fresh.push(p);
            }
        }
        let (dropped, kept): (Vec<PageIdx>, Vec<PageIdx>) =
            unchanged.into_iter().partition(|p| self.pages[p.idx()].idle);
        let mut rewritable: Vec<PageIdx> =
            fresh.iter().chain(&kept).copied().filter(|p| frozen.binary_search(p).is_ok()).collect();
        rewritable.sort_unstable();
        self.set_access_in_runs(rewritable, Access::ReadWrite);
        for &p in &dropped {
            let meta = &mut self.pages[p.idx()];
            meta.twin = None;
            meta.renewed = false;
            self.twinned.remove(&p);
        }
        self.set_access_in_runs(dropped, Access::Read);
        // The interval opened next: this one's successor if it is recorded, else this one again.
        let next = if fresh.is_empty() { index } else { index + 1 };
        for &p in &kept {
            let meta = &mut self.pages[p.idx()];
            meta.twin = Some(next);
            meta.idle = true;
            self.opened_twins.push(p);
        }
        if fresh.is_empty() {
            return;
        }
        for &p in &fresh {
            self.pages[p.idx()].renewed = false;
        }
        self.vt.set(self.me, index);
        let rec = IntervalRecord {
            node: self.me,
            index,
            vt: self.vt.clone(),
            pages: fresh,
            locks: std::mem::take(&mut self.interval_locks),
        };
        for l in &rec.locks {
            self.locks[l.idx()].in_interval = false;
        }
        self.stats.intervals += 1;
        self.stats.write_notices_made += rec.pages.len() as u64;
        self.acct.record_bytes += Accounting::record_size(&rec);
        self.log.push(rec);
        self.note_peak();
        for i in 0..self.held_locks.len() {
            self.note_interval_lock(self.held_locks[i]);
        }
    }

    /// Notes that `lock` is held during the open interval.
    pub(crate) fn note_interval_lock(&mut self, lock: LockId) {
        if !std::mem::replace(&mut self.locks[lock.idx()].in_interval, true) {
            self.interval_locks.push(lock);
        }
        invariant_eq!(
            self.interval_locks.len(),
            self.locks.iter().filter(|l| l.in_interval).count(),
            "the locks noted in the open interval are those flagged, once each"
        );
    }

    /// Takes in remote interval records (from a lock grant or a barrier): closes our open
    /// interval if there is anything new, cuts twins of pages named by new write notices, and
    /// invalidates those pages. Returns whether anything was new.
    pub(crate) fn incorporate(
        &mut self,
        from: NodeId,
        recs: Vec<IntervalRecord>,
    ) -> Result<bool, ProtocolError> {
        let new = self.log_records(from, recs)?;
        let any = !new.is_empty();
        self.apply_notices(new);
        Ok(any)
    }

    /// Checks interval records `from` sent, sorted by node and index, against what we know:
    /// each names a node of the job, has a timestamp of one entry per node and pages of the heap,
    /// and each node's records follow on from the newest interval of it we know of, without a gap.
    pub(crate) fn check_records(&self, from: NodeId, recs: &[IntervalRecord]) -> Result<(), ProtocolError> {
        let (n, npages) = (self.nprocs(), self.mem.npages());
        let mut known: Vec<IntervalIdx> = (0..n).map(|i| self.log.known(NodeId(i as u16))).collect();
        for r in recs {
            if r.node.idx() >= n || r.vt.len() != n {
                return Err(ProtocolError::Unexpected {
                    from,
                    what: format!("interval record of {} with {} vt entries", r.node, r.vt.len()),
                });
            }
            if let Some(&page) = r.pages.iter().find(|p| p.0 >= npages) {
                return Err(ProtocolError::PageOutOfRange { from, page, npages });
            }
            let bad = |what: String| ProtocolError::Unexpected {
                from,
                what: format!("interval record {}.{}: {what}", r.node, r.index),
            };
            if r.vt.get(r.node) != r.index {
                return Err(bad(format!("its own vt entry is {}", r.vt.get(r.node))));
            }
            if let Some(w) = r.pages.windows(2).find(|w| w[0] >= w[1]) {
                return Err(bad(format!("pages not ascending ({} then {})", w[0], w[1])));
            }
            let k = &mut known[r.node.idx()];
            if r.index > k.saturating_add(1) {
                return Err(ProtocolError::IntervalGap { from, node: r.node, known: *k, got: r.index });
            }
            *k = (*k).max(r.index);
        }
        Ok(())
    }

    /// The first half of [`Node::incorporate`]: checks `recs`, closes our open interval if any
    /// is new (before our timestamp takes in theirs), and logs the new ones, merging their
    /// timestamps into ours. Returns the `(node, index)` of each new record, whose write notices
    /// [`Node::apply_notices`] must apply before the application touches the heap again. Between
    /// the two, the log and timestamp are ahead of the pages' notices, which is safe: cutting a
    /// twin reads only our own timestamp entry and records, and serving a diff only our own diffs.
    pub(crate) fn log_records(
        &mut self,
        from: NodeId,
        mut recs: Vec<IntervalRecord>,
    ) -> Result<Vec<(NodeId, IntervalIdx)>, ProtocolError> {
        recs.retain(|r| r.node != self.me);
        recs.sort_by_key(|r| (r.node, r.index));
        recs.dedup_by_key(|r| (r.node, r.index));
        // Validate everything before changing anything.
        self.check_records(from, &recs)?;
        recs.retain(|r| r.index > self.log.known(r.node));
        if recs.is_empty() {
            return Ok(Vec::new());
        }
        self.close_interval(true);
        let new = recs.iter().map(|r| (r.node, r.index)).collect();
        for rec in recs {
            self.vt.set(rec.node, rec.index.max(self.vt.get(rec.node)));
            self.acct.record_bytes += Accounting::record_size(&rec);
            self.log.push(rec);
        }
        self.note_peak();
        Ok(new)
    }

    /// The second half of [`Node::incorporate`]: applies the write notices of the logged records
    /// `new`: cuts our twins of the pages they name, notes the notices, invalidates the pages.
    pub(crate) fn apply_notices(&mut self, new: Vec<(NodeId, IntervalIdx)>) {
        if new.is_empty() {
            return;
        }
        assert!(
            !self.streaming(),
            "write notices applied while {} streamed pages are on their way (settle first)",
            self.stream.in_flight
        );
        let n = self.nprocs();
        fn logged(log: &IntervalLog, node: NodeId, index: IntervalIdx) -> &[PageIdx] {
            &log.get(node, index).expect("a logged record stays until its notices apply").pages
        }
        // Our twins of pages others wrote are cut (their diffs made) before the notices are
        // recorded, all revoked first with one protection change per run of pages. Where no
        // invalidation can wait for a push, every other page the notices name is invalidated in
        // the same runs: our twinned pages lie between theirs (radix sort's pages written by
        // both nodes, one at each end of every run of the other's), and revoked on their own,
        // each was a run, and a system call, of its own.
        let mut named: Vec<PageIdx> =
            new.iter().flat_map(|&(node, index)| logged(&self.log, node, index).iter().copied()).collect();
        named.sort_unstable();
        named.dedup();
        let cut: Vec<PageIdx> =
            named.iter().copied().filter(|p| self.pages[p.idx()].twin.is_some()).collect();
        let at_once = !self.may_defer_invalidations();
        let revoke: Vec<PageIdx> = (if at_once { &named } else { &cut })
            .iter()
            .copied()
            .filter(|&p| self.mem.access(p) != Access::None)
            .collect();
        if at_once {
            // Counted as `invalidate` counts them: the pages it would have found valid.
            let others = revoke.iter().filter(|p| self.pages[p.idx()].twin.is_none()).count();
            self.stats.invalidations += others as u64;
        }
        self.set_access_in_runs(revoke, Access::None);
        for p in cut {
            self.cut_revoked(p, Access::None, false);
        }
        for (node, index) in new {
            let pages = logged(&self.log, node, index);
            for &p in pages {
                let w = self.pages[p.idx()].writer(p, node, n, &mut self.acct.tabled);
                w.noticed = w.noticed.max(index);
            }
            self.stats.intervals_incorporated += 1;
            self.stats.write_notices_received += pages.len() as u64;
        }
        self.note_peak();
        self.invalidate(&named);
    }

    /// Revokes all access to `pages` (ascending), in runs; while a barrier is passed, those a push
    /// may complete in place wait for it (`push.rs`).
    pub(crate) fn invalidate(&mut self, pages: &[PageIdx]) {
        let (deferred, valid): (Vec<PageIdx>, Vec<PageIdx>) = (pages.iter().copied())
            .filter(|&p| self.mem.access(p) != Access::None)
            .partition(|&p| self.defers_invalidation(p));
        self.defer_invalidation(deferred);
        self.stats.invalidations += valid.len() as u64;
        self.set_access_in_runs(valid, Access::None);
    }

    /// Sets the protection of `pages` (ascending), one call per run of consecutive pages. Taking
    /// all access, a run goes on across up to [`INVALID_BRIDGE_PAGES`] pages that are invalid
    /// already (for which the call changes nothing), so that pages invalidated in a comb (fft's
    /// two-page column blocks of the other node's rows, whose pages in between this node never
    /// read) cost one call, not one per tooth. Making pages readable goes through
    /// [`PageMemory::write_protect_pages`], whose runs may go on across gaps too.
    pub(crate) fn set_access_in_runs(&mut self, pages: impl IntoIterator<Item = PageIdx>, access: Access) {
        if access == Access::Read {
            return self.write_protect(pages, false);
        }
        let bridge = if access == Access::None { INVALID_BRIDGE_PAGES } else { 0 };
        self.in_runs(pages, bridge, |mem, first, count| mem.set_access(first, count, access));
    }

    /// [`PageMemory::freeze`] on `pages` (ascending), in runs
    /// ([`PageMemory::write_protect_pages`]).
    pub(crate) fn freeze_in_runs(&mut self, pages: impl IntoIterator<Item = PageIdx>) {
        self.write_protect(pages, true);
    }

    /// [`PageMemory::write_protect_pages`] on `pages` (ascending), if there are any.
    fn write_protect(&mut self, pages: impl IntoIterator<Item = PageIdx>, freeze: bool) {
        let pages: Vec<PageIdx> = pages.into_iter().collect();
        if !pages.is_empty() {
            self.mem.write_protect_pages(&pages, freeze);
        }
    }

    /// Calls `f` once per run of `pages` (ascending); a run goes on across gaps of up to `bridge`
    /// pages that are all invalid.
    fn in_runs(
        &mut self,
        pages: impl IntoIterator<Item = PageIdx>,
        bridge: u32,
        mut f: impl FnMut(&mut M, PageIdx, u32),
    ) {
        let mut run: Option<(PageIdx, u32)> = None;
        for p in pages {
            run = match run {
                Some((first, count)) if first.0 + count == p.0 => Some((first, count + 1)),
                Some((first, count))
                    if p.0.checked_sub(first.0 + count).is_some_and(|gap| gap <= bridge)
                        && (first.0 + count..p.0).all(|q| self.mem.access(PageIdx(q)) == Access::None) =>
                {
                    Some((first, p.0 - first.0 + 1))
                }
                Some((first, count)) => {
                    f(&mut self.mem, first, count);
                    Some((p, 1))
                }
                None => Some((p, 1)),
            };
        }
        if let Some((first, count)) = run {
            f(&mut self.mem, first, count);
        }
    }
}
