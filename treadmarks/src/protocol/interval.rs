//! Intervals and the log of every interval a node knows about.
//!
//! A node's execution is cut into intervals. A node closes its open interval when it releases a
//! lock, arrives at a barrier, or incorporates remote intervals (an acquire or barrier that brings
//! in new information) — but only if the interval wrote something; an interval without writes
//! carries no information and is not recorded.
//!
//! An [`IntervalRecord`] carries the interval's vector timestamp (its own entry is the interval's
//! index) and its write notices: the pages written in it. Records are what lock grants and the
//! barrier manager carry; garbage collection builds on them, a grant picks the pages whose
//! diffs it carries by the locks they name, and a race checker (to come) can too.
//!
//! Invariant: for every node `n`, the log holds the records of `n`'s intervals
//! `base[n]+1..=vt[n]` (the knowledge of a node is closed under happened-before, so it is always
//! a prefix per node). Garbage collection drops everything up to the timestamp of a collecting
//! barrier, which every node has reached: `base` is that timestamp, and nobody ever asks for a
//! record below it again.

use super::ids::{IntervalIdx, LockId, NodeId, PageIdx};
use super::vtime::VectorTime;
use serde::{Deserialize, Serialize};

/// One closed interval of one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntervalRecord {
    /// The node whose interval this is.
    pub node: NodeId,
    /// Its index (1 for the node's first interval).
    pub index: IntervalIdx,
    /// What the node knew during the interval; `vt[node] == index`.
    pub vt: VectorTime,
    /// Write notices: pages the node (possibly) wrote in this interval, ascending.
    pub pages: Vec<PageIdx>,
    /// Locks the node held during the interval: a grant carries the diffs of pages twinned
    /// under the locks it passes on (`lock.rs`).
    pub locks: Vec<LockId>,
}

/// Every interval record this node knows, per node, as a prefix `1..=len`.
#[derive(Debug, Clone)]
pub struct IntervalLog {
    per_node: Vec<Vec<IntervalRecord>>,
    base: Vec<IntervalIdx>,
}

impl IntervalLog {
    /// An empty log for `n` nodes.
    pub fn new(n: usize) -> Self {
        IntervalLog { per_node: vec![Vec::new(); n], base: vec![0; n] }
    }

    /// Highest interval of `n` in the log (or dropped by garbage collection).
    pub fn known(&self, n: NodeId) -> IntervalIdx {
        self.base[n.idx()] + self.per_node[n.idx()].len() as IntervalIdx
    }

    /// Record `index` of node `n`, if held.
    pub fn get(&self, n: NodeId, index: IntervalIdx) -> Option<&IntervalRecord> {
        let i = (index as usize).checked_sub(self.base[n.idx()] as usize + 1)?;
        self.per_node[n.idx()].get(i)
    }

    /// Appends the next record of its node. Panics if it is not the next one (callers check).
    pub fn push(&mut self, rec: IntervalRecord) {
        let next = self.known(rec.node) + 1;
        assert_eq!(rec.index, next, "interval log gap for {}", rec.node);
        self.per_node[rec.node.idx()].push(rec);
    }

    /// Records of every node newer than `vt`: what a node at `vt` lacks. `vt` must not be older
    /// than the last collection (every node passed that barrier).
    pub fn newer_than(&self, vt: &VectorTime) -> Vec<IntervalRecord> {
        let mut out = Vec::new();
        for (n, log) in self.per_node.iter().enumerate() {
            let from = (vt.entries()[n].saturating_sub(self.base[n]) as usize).min(log.len());
            out.extend_from_slice(&log[from..]);
        }
        out
    }

    /// Every record held, oldest first per node.
    pub fn iter(&self) -> impl Iterator<Item = &IntervalRecord> {
        self.per_node.iter().flatten()
    }

    /// Drops every record: the new base is `vt`, which must be what the log knows.
    pub fn collect(&mut self, vt: &VectorTime) {
        for (n, log) in self.per_node.iter_mut().enumerate() {
            invariant_eq!(self.base[n] + log.len() as IntervalIdx, vt.entries()[n]);
            self.base[n] = vt.entries()[n];
            *log = Vec::new();
        }
    }

    /// Total records held.
    pub fn len(&self) -> usize {
        self.per_node.iter().map(Vec::len).sum()
    }

    /// True if no record is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(node: u16, index: u32, vt: &[u32]) -> IntervalRecord {
        IntervalRecord {
            node: NodeId(node),
            index,
            vt: VectorTime::from_entries(vt.to_vec()),
            pages: vec![PageIdx(index)],
            locks: vec![],
        }
    }

    #[test]
    fn newer_than_gives_exactly_what_is_lacking() {
        let mut log = IntervalLog::new(2);
        log.push(rec(0, 1, &[1, 0]));
        log.push(rec(0, 2, &[2, 0]));
        log.push(rec(1, 1, &[1, 1]));
        let lacking = log.newer_than(&VectorTime::from_entries(vec![1, 0]));
        let ids: Vec<_> = lacking.iter().map(|r| (r.node.0, r.index)).collect();
        assert_eq!(ids, vec![(0, 2), (1, 1)]);
        assert!(log.newer_than(&VectorTime::from_entries(vec![2, 1])).is_empty());
        assert_eq!(log.known(NodeId(0)), 2);
    }

    #[test]
    fn collection_keeps_indices_and_drops_records() {
        let mut log = IntervalLog::new(2);
        log.push(rec(0, 1, &[1, 0]));
        log.push(rec(1, 1, &[1, 1]));
        log.collect(&VectorTime::from_entries(vec![1, 1]));
        assert!(log.is_empty());
        assert_eq!(log.known(NodeId(0)), 1);
        log.push(rec(0, 2, &[2, 1]));
        assert_eq!(log.get(NodeId(0), 2).map(|r| r.index), Some(2));
        assert!(log.get(NodeId(0), 1).is_none());
        let lacking = log.newer_than(&VectorTime::from_entries(vec![1, 1]));
        assert_eq!(lacking.len(), 1);
    }

    #[test]
    #[should_panic(expected = "gap")]
    fn gaps_are_refused() {
        let mut log = IntervalLog::new(1);
        log.push(rec(0, 2, &[2]));
    }
}
