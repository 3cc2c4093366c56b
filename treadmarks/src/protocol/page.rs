//! Per-page consistency state, twins, lazy diffs and access misses.
//!
//! # Page state
//! Protection lives in [`PageMemory::access`]; the rest here:
//! - `twin`: the page has a twin, made in interval `first` (possibly several intervals ago). While
//!   it has one the page is `ReadWrite` and in the node's twinned set, and every interval the node
//!   closes carries a write notice for it. The page is *not* write-protected at interval ends:
//!   a page written every interval (the common case) then faults once, not once per interval.
//!   The cost is that notices may name intervals in which the page was not written; a notice is a
//!   claim "there may be changes up to here", which is safe.
//! - `writers[n]`: for each writer `n`, the newest interval `noticed` for which we hold a write
//!   notice, the newest interval `applied` whose changes we have, and the newest diff `applied_seq`
//!   of `n` we have applied. The page is stale (and invalid) while some `noticed > applied`.
//! - `diffs`: our own diffs of the page, oldest first.
//!
//! # Which intervals one diff covers, and why applying diffs in timestamp order is right
//! A diff is made from the twin when somebody asks for it or when a write notice from another node
//! arrives for the page ("cutting" the twin). It covers our intervals `first ..= now`. Every write
//! notice for the page that we incorporate cuts the twin first, so for any other writer's interval
//! `s` that happened before one of the diff's intervals, `s` happened before the diff's *first*
//! interval. Hence ordering diffs by the timestamp of their first interval (any linear extension:
//! we use the entry sum, then node, then sequence) applies every pair of diffs that touch the
//! same byte in a data-race-free program in happened-before order. A requester never applies a
//! diff twice (`applied_seq`), and asks only for diffs whose first interval it knows of, so a diff
//! it applies early can never be overtaken by an older one later.

use super::ProtocolError;
use super::diff::Diff;
use super::ids::{DiffSeq, IntervalIdx, NodeId, PageIdx};
use super::memory::{Access, PageMemory};
use super::msg::{DiffWire, Message};
use super::node::{AppDone, Node, Pending};
use super::vtime::VectorTime;

/// What we know about one writer of a page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterState {
    /// Newest interval of the writer for which we hold a write notice for the page.
    pub noticed: IntervalIdx,
    /// Newest interval of the writer whose changes to the page we have.
    pub applied: IntervalIdx,
    /// Newest diff of the writer for the page that we have applied.
    pub applied_seq: DiffSeq,
}

/// One of our own diffs of a page.
#[derive(Clone, Debug)]
pub struct OwnDiff {
    pub seq: DiffSeq,
    /// The interval the twin was made in.
    pub first: IntervalIdx,
    /// Timestamp of interval `first`.
    pub first_vt: VectorTime,
    pub diff: Diff,
}

/// Consistency state of one page.
#[derive(Clone, Debug, Default)]
pub struct PageMeta {
    /// The interval our twin was made in, if the page has a twin.
    pub twin: Option<IntervalIdx>,
    /// Per writer, indexed by node; empty until a notice arrives.
    pub writers: Vec<WriterState>,
    pub diffs: Vec<OwnDiff>,
}

impl PageMeta {
    pub(crate) fn writer(&mut self, n: NodeId, nprocs: usize) -> &mut WriterState {
        if self.writers.is_empty() {
            self.writers = vec![WriterState::default(); nprocs];
        }
        &mut self.writers[n.idx()]
    }

    /// True while some write notice has not been applied.
    pub fn is_stale(&self) -> bool {
        self.writers.iter().any(|w| w.noticed > w.applied)
    }
}

/// An access miss in progress.
#[derive(Debug)]
pub(crate) struct Miss {
    pub page: PageIdx,
    pub write: bool,
    /// Writers asked, with the interval asked up to, and whether they answered.
    pub asked: Vec<(NodeId, IntervalIdx, bool)>,
    pub diffs: Vec<(NodeId, DiffWire)>,
}

impl<M: PageMemory> Node<M> {
    /// Makes a twin in the open interval and makes the page writable (slow path).
    pub(crate) fn make_twin(&mut self, p: PageIdx) {
        self.mem.make_twin(p);
        self.mem.set_access(p, 1, Access::ReadWrite);
        self.pages[p.idx()].twin = Some(self.open_interval());
        self.twinned.insert(p);
        self.stats.twins += 1;
    }

    /// Makes a diff from the twin and drops the twin; the page ends with protection `then`
    /// (`Read` when serving a request, `None` when a write notice invalidates it anyway).
    ///
    /// The page-sharing rule: all access is revoked *before* the twin and page are read. Revoking
    /// only write access would not do: a write in that window would take the fault handler's fast
    /// path, which makes a fresh twin over the one this diff needs. With no access, the write
    /// faults into the slow path and waits for the service thread, which finishes the diff first.
    pub(crate) fn cut_twin(&mut self, p: PageIdx, then: Access) {
        let Some(first) = self.pages[p.idx()].twin.take() else { return };
        self.twinned.remove(&p);
        if self.mem.access(p) != Access::None {
            self.mem.set_access(p, 1, Access::None);
        }
        let diff = Diff::make(self.mem.twin(p), self.mem.page(p));
        if then != Access::None {
            self.mem.set_access(p, 1, then);
        }
        if diff.is_empty() {
            return;
        }
        let first_vt = match self.log.get(self.me, first) {
            Some(rec) => rec.vt.clone(),
            None => panic!("{p}: twin of interval {first} cut before the interval closed (vt {:?})", self.vt),
        };
        self.diff_seq += 1;
        self.stats.diffs_created += 1;
        self.stats.diff_bytes_created += diff.encoded_len() as u64;
        self.pages[p.idx()].diffs.push(OwnDiff { seq: self.diff_seq, first, first_vt, diff });
    }

    /// A fault on page `p`. `write` is true if the fault is known to be a write.
    pub(crate) fn fault(&mut self, p: PageIdx, write: bool) -> Result<(), ProtocolError> {
        match self.mem.access(p) {
            Access::ReadWrite => self.done.push_back(AppDone::FaultResolved(p)),
            Access::Read => {
                self.stats.write_faults += 1;
                self.make_twin(p);
                self.done.push_back(AppDone::FaultResolved(p));
            }
            Access::None => {
                self.stats.read_misses += 1;
                let mut asked = Vec::new();
                for (n, w) in self.pages[p.idx()].writers.iter().enumerate() {
                    if w.noticed > w.applied {
                        asked.push((NodeId(n as u16), w.noticed, false));
                        let req = Message::DiffRequest { page: p, want: w.noticed, after_seq: w.applied_seq };
                        self.outbox.push_back((NodeId(n as u16), req));
                    }
                }
                self.stats.diff_requests_sent += asked.len() as u64;
                self.pending = Pending::Miss(Miss { page: p, write, asked, diffs: Vec::new() });
                return self.try_finish_miss();
            }
        }
        Ok(())
    }

    /// Serves a diff request: cuts the twin if it holds changes the requester wants, then sends
    /// every diff it has not applied yet whose first interval it knows of.
    pub(crate) fn serve_diffs(&mut self, from: NodeId, p: PageIdx, want: IntervalIdx, after_seq: DiffSeq) {
        self.stats.diff_requests_served += 1;
        let closed = self.vt.get(self.me);
        if self.pages[p.idx()].twin.is_some_and(|first| first <= want.min(closed)) {
            self.cut_twin(p, Access::Read);
        }
        let diffs = self.pages[p.idx()]
            .diffs
            .iter()
            .filter(|d| d.seq > after_seq && d.first <= want)
            .map(|d| DiffWire { seq: d.seq, first_vt: d.first_vt.clone(), diff: d.diff.clone() })
            .collect();
        self.outbox.push_back((from, Message::DiffReply { page: p, diffs }));
    }

    pub(crate) fn handle_diff_reply(
        &mut self,
        from: NodeId,
        p: PageIdx,
        diffs: Vec<DiffWire>,
    ) -> Result<(), ProtocolError> {
        let unexpected = || ProtocolError::Unexpected { from, what: format!("diff reply for {p}") };
        let Pending::Miss(miss) = &mut self.pending else { return Err(unexpected()) };
        if miss.page != p {
            return Err(unexpected());
        }
        let slot = miss.asked.iter_mut().find(|(n, _, answered)| *n == from && !answered);
        let Some(slot) = slot else { return Err(unexpected()) };
        slot.2 = true;
        miss.diffs.extend(diffs.into_iter().map(|d| (from, d)));
        self.try_finish_miss()
    }

    /// Applies the gathered diffs once every writer has answered, in timestamp order.
    fn try_finish_miss(&mut self) -> Result<(), ProtocolError> {
        let Pending::Miss(miss) = &self.pending else { return Ok(()) };
        if miss.asked.iter().any(|a| !a.2) {
            return Ok(());
        }
        let Pending::Miss(mut miss) = std::mem::take(&mut self.pending) else { unreachable!() };
        let p = miss.page;
        miss.diffs.sort_by_key(|(n, d)| (d.first_vt.sum(), *n, d.seq));
        let nprocs = self.nprocs();
        for (n, d) in &miss.diffs {
            let w = self.pages[p.idx()].writer(*n, nprocs);
            if d.seq <= w.applied_seq {
                continue;
            }
            w.applied_seq = d.seq;
            d.diff.apply(self.mem.page_mut(p)).map_err(|source| ProtocolError::BadDiff {
                from: *n,
                page: p,
                source,
            })?;
            self.stats.diffs_applied += 1;
            self.stats.diff_bytes_applied += d.diff.encoded_len() as u64;
        }
        for (n, want, _) in &miss.asked {
            let w = self.pages[p.idx()].writer(*n, nprocs);
            w.applied = w.applied.max(*want);
        }
        debug_assert!(!self.pages[p.idx()].is_stale(), "{p} still stale after its miss");
        if miss.write {
            self.make_twin(p);
        } else {
            self.mem.set_access(p, 1, Access::Read);
        }
        self.done.push_back(AppDone::FaultResolved(p));
        Ok(())
    }
}
