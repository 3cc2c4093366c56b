//! Garbage collection of consistency data, at barriers.
//!
//! Interval records, write notices and diffs pile up with every interval. When any node's
//! reclaimable consistency data (those three: twins are the working set, and come back at once)
//! passes the threshold (or the application asks, [`Node::request_collect`]),
//! the next barrier collects; the decision rides on the barrier messages:
//!
//! 1. Arrivals carry "I am over the threshold"; the release carries the manager's decision. At a
//!    barrier every node has every interval, so every node computes the same writers `W(p)` of
//!    each page since the last collection, from the interval records.
//! 2. Each node brings up to date every page it wrote (`me ∈ W(p)`) whose copy is stale, by
//!    fetching the other writers' diffs. A node that did not write a page and holds a stale copy
//!    drops it: its copy stays invalid, and its first access later fetches a whole copy from
//!    `min(W(p))`, a writer, which is certain to hold a valid one. Valid copies are kept.
//! 3. Each node then sends `GcDone` to the manager; other nodes may still be fetching diffs from
//!    it until everybody is done. The manager answers everybody with `GcRelease`.
//! 4. Only then does each node drop all interval records, write notices, diffs and twins (the
//!    pages with twins are write-protected again, so the next write makes a fresh one), and the
//!    barrier completes.
//!
//! Between collections, the memory held is accounted as it grows ([`Accounting`]), so deciding
//! costs nothing.

use super::ProtocolError;
use super::ids::{BarrierId, NodeId, PageIdx};
use super::interval::IntervalRecord;
use super::memory::{Access, PageMemory};
use super::msg::Message;
use super::node::{Node, Pending};
use super::page::MissFor;
use std::collections::BTreeMap;

/// Bytes of consistency data held, by kind (twins are counted from the twinned set).
#[derive(Debug, Clone, Default)]
pub struct Accounting {
    /// Interval records in the log (ours and others'; not those a barrier manager holds for
    /// an episode until it completes).
    pub record_bytes: u64,
    /// Our diffs.
    pub diff_bytes: u64,
    /// Pages with a per-writer notice table, each once: those named by write notices, and
    /// those whose whole copy came with the diffs it holds (`Node::try_finish_miss`), which no
    /// notice may name.
    pub tabled: Vec<PageIdx>,
}

impl Accounting {
    /// What one interval record costs to hold.
    pub fn record_size(r: &IntervalRecord) -> u64 {
        (size_of::<IntervalRecord>() + 4 * (r.vt.len() + r.pages.len() + r.locks.len())) as u64
    }

    /// Most memory a node gives one kind of part a peer sends before the parts are used:
    /// interval records sent ahead of one message (`ahead.rs`), or the diffs of a peer's
    /// `continued` replies over all unfinished misses (`Node::held_continued`). The node's
    /// consistency limit, but at least 64 MiB: a barrier may bring more than a low limit, which
    /// only lock acquires enforce. A peer past it is refused by name, rather than growing this
    /// node's memory without end.
    pub fn parts_limit(consistency_limit: u64) -> u64 {
        consistency_limit.max(64 << 20)
    }
}

/// A collection in progress on this node.
#[derive(Debug)]
pub(crate) struct GcRound {
    pub barrier: BarrierId,
    /// Pages still being validated.
    pub validating: usize,
    /// Every page named by an interval record since the last collection: the only pages that
    /// can hold our diffs (made from twins whose interval was recorded). Write-notice tables
    /// are noted as they are made (`Accounting::tabled`).
    pub pages: Vec<PageIdx>,
}

/// How many times the collection threshold a node's consistency data reaches before it warns
/// that no barrier collects it (`Node::check_consistency_data`).
pub(crate) const OVERDUE_FACTOR: u64 = 2;

/// The threshold the warning counts from where the collection threshold is 0.
pub(crate) const ZERO_THRESHOLD_WARNS_AS: u64 = 1 << 20;

impl<M: PageMemory> Node<M> {
    /// Bytes of consistency data this node holds now.
    pub fn consistency_bytes(&self) -> u64 {
        let a = &self.acct;
        let twins = (self.twinned.len() * self.mem.page_size()) as u64;
        let tables = (a.tabled.len() * self.nprocs() * size_of::<super::page::WriterState>()) as u64;
        a.record_bytes + a.diff_bytes + twins + tables
    }

    /// True while a collection is in progress on this node.
    pub fn collecting(&self) -> bool {
        self.gc.is_some()
    }

    pub(crate) fn note_peak(&mut self) {
        let now = self.consistency_bytes();
        self.stats.peak_consistency_bytes = self.stats.peak_consistency_bytes.max(now);
    }

    /// Consistency data a collection reclaims for good: interval records, write notices, diffs.
    /// Twins are left out: a collection drops them, but the pages being written get new ones at
    /// once, so counting them would make a working set larger than the threshold collect at
    /// every barrier.
    pub fn reclaimable_bytes(&self) -> u64 {
        let a = &self.acct;
        let tables = (a.tabled.len() * self.nprocs() * size_of::<super::page::WriterState>()) as u64;
        a.record_bytes + a.diff_bytes + tables
    }

    pub(crate) fn wants_gc(&self) -> bool {
        self.gc_force || self.reclaimable_bytes() > self.cfg.gc_threshold
    }

    /// Lock-only programs never collect by themselves: say so when it is overdue, and again at
    /// every doubling, and fail past [`NodeConfig::consistency_limit`](super::NodeConfig::consistency_limit) (an error naming the
    /// bytes) rather than run the machine out of memory, where the process would die on some
    /// allocation with no word of why. The data passes the threshold between two barriers of a
    /// program that has them, and the next one collects it; only at [`OVERDUE_FACTOR`] times
    /// the threshold has no barrier come when one would have (water at 2,000 steps was told to
    /// call barriers, which it does). Checked at lock acquires.
    pub(crate) fn check_consistency_data(&mut self) -> Result<(), ProtocolError> {
        let bytes = self.reclaimable_bytes();
        if bytes > self.cfg.consistency_limit {
            return Err(ProtocolError::ConsistencyLimit { bytes, limit: self.cfg.consistency_limit });
        }
        // A threshold of 0 asks every barrier to collect; warned of as if it were 1 MiB, or a
        // program with a few lock operations between barriers would be told to add some.
        let base = if self.cfg.gc_threshold == 0 { ZERO_THRESHOLD_WARNS_AS } else { self.cfg.gc_threshold };
        let overdue = base.saturating_mul(OVERDUE_FACTOR);
        if bytes > overdue && bytes > self.gc_warned_at.saturating_mul(2) {
            self.gc_warned_at = bytes;
            let limit = match self.cfg.consistency_limit {
                u64::MAX => String::new(),
                limit => format!(" (the job fails at {limit} bytes)"),
            };
            self.warnings.push_back(format!(
                "consistency data is {bytes} bytes{limit}, over {OVERDUE_FACTOR} times the collection \
                 threshold of {base} bytes, and only a barrier collects it: a program that synchronizes \
                 with locks alone should call Tmk::collect() (a collective) or a barrier now and then"
            ));
        }
        Ok(())
    }

    /// Like [`Node::request_barrier`], and the barrier collects whatever the threshold says.
    pub fn request_collect(&mut self, barrier: BarrierId) -> Result<(), ProtocolError> {
        self.begin("collect")?;
        let forced = std::mem::replace(&mut self.gc_force, true);
        let arrived = self.request_barrier(barrier);
        if arrived.is_err() {
            self.gc_force = forced; // A refused call changes nothing.
        }
        arrived
    }

    /// Step 2: validate the pages we wrote, drop the stale copies of pages we did not.
    pub(crate) fn start_gc(&mut self, barrier: BarrierId) -> Result<(), ProtocolError> {
        // A collecting barrier defers nothing: it backs the heap now and sends no push.
        self.back_heap(self.heap_end_heard);
        self.drop_planned_push();
        let mut writers: BTreeMap<PageIdx, (NodeId, bool)> = BTreeMap::new();
        for rec in self.log.iter() {
            for &p in &rec.pages {
                let e = writers.entry(p).or_insert((rec.node, false));
                e.0 = e.0.min(rec.node);
                e.1 |= rec.node == self.me;
            }
        }
        self.gc = Some(GcRound { barrier, validating: 0, pages: writers.keys().copied().collect() });
        let mut validate = Vec::new();
        for (p, (first_writer, we_wrote)) in writers {
            if !self.pages[p.idx()].is_stale() {
                continue;
            }
            if we_wrote {
                validate.push(p);
            } else {
                invariant_eq!(self.mem.access(p), Access::None);
                self.pages[p.idx()].base_from = Some(first_writer);
                self.stats.pages_dropped += 1;
            }
        }
        self.gc.as_mut().expect("just set").validating = validate.len();
        if validate.is_empty() {
            self.outbox.push_back((NodeId(0), Message::GcDone));
        }
        self.start_misses(&validate, false, MissFor::Gc)
    }

    pub(crate) fn gc_page_validated(&mut self) {
        let round = self.gc.as_mut().expect("a collection is in progress");
        round.validating -= 1;
        if round.validating == 0 {
            self.outbox.push_back((NodeId(0), Message::GcDone));
        }
    }

    pub(crate) fn handle_gc_done(&mut self, from: NodeId) -> Result<(), ProtocolError> {
        if self.me != NodeId(0) || self.gc.is_none() || std::mem::replace(&mut self.gc_done[from.idx()], true)
        {
            return Err(ProtocolError::Unexpected { from, what: "gc done".into() });
        }
        if self.gc_done.iter().all(|&d| d) {
            self.gc_done.iter_mut().for_each(|d| *d = false);
            for n in 0..self.cfg.nprocs {
                self.outbox.push_back((NodeId(n), Message::GcRelease));
            }
        }
        Ok(())
    }

    /// Step 4: everybody has validated; drop records, notices, diffs and twins.
    pub(crate) fn handle_gc_release(&mut self, from: NodeId) -> Result<(), ProtocolError> {
        let ok = match (&self.gc, &self.pending) {
            (Some(round), Pending::Barrier(b)) => {
                from == NodeId(0) && round.barrier == *b && round.validating == 0
            }
            _ => false,
        };
        if !ok {
            return Err(ProtocolError::Unexpected { from, what: "gc release".into() });
        }
        let round = self.gc.take().expect("checked above");
        let before = self.consistency_bytes();
        self.log.collect(&self.vt);
        let twinned = std::mem::take(&mut self.twinned);
        self.opened_twins.clear();
        for &p in &twinned {
            let meta = &mut self.pages[p.idx()];
            meta.twin = None;
            meta.renewed = false;
            // Every node has validated: the page holds the epoch's final bytes everywhere it is
            // valid, so an overwrite's stale twin no longer matters.
            meta.whole = false;
        }
        self.set_access_in_runs(twinned, Access::Read);
        for p in round.pages.iter().chain(&self.acct.tabled) {
            let meta = &mut self.pages[p.idx()];
            meta.writers = Vec::new();
            meta.diffs = Vec::new();
        }
        invariant!(self.pages.iter().all(|m| m.writers.is_empty() && m.diffs.is_empty()));
        self.acct = Accounting::default();
        self.forget_pushes();
        self.sent_to_manager = self.vt.get(self.me);
        self.stats.collections += 1;
        self.stats.gc_bytes_reclaimed += before.saturating_sub(self.consistency_bytes());
        self.gc_force = false;
        self.gc_warned_at = 0;
        self.finish_barrier(round.barrier);
        Ok(())
    }
}
