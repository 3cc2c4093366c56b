//! Vector timestamps.
//!
//! `vt[n]` is the index of the latest interval of node `n` that the owner knows about. A node's
//! own entry counts only *closed* intervals: the open interval (index `vt[self] + 1`) is not yet
//! known to anybody, so it must never appear in a timestamp that leaves the node.
//!
//! Order is the usual partial order: `a <= b` iff every entry of `a` is `<=` the entry of `b`.
//! [`VectorTime::sum`] is a linear extension of it (if `a < b` then `a.sum() < b.sum()`), which is
//! what diff application sorts by.

use super::ids::{IntervalIdx, NodeId};
use serde::{Deserialize, Serialize};
use smallvec::SmallVec;
use std::cmp::Ordering;

/// Nodes whose timestamps are kept inline: a timestamp of a job this size or smaller takes no
/// allocation to make, clone or decode (one travels with every diff a reply carries).
const INLINE_NODES: usize = 8;

/// A vector timestamp with one entry per node.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Debug, Default)]
pub struct VectorTime(
    #[serde(deserialize_with = "super::cautious::small_vec")] SmallVec<[IntervalIdx; INLINE_NODES]>,
);

impl VectorTime {
    /// All-zero timestamp for `n` nodes.
    pub fn zero(n: usize) -> Self {
        VectorTime(smallvec::smallvec![0; n])
    }

    /// Builds a timestamp from its entries.
    pub fn from_entries(v: Vec<IntervalIdx>) -> Self {
        VectorTime(SmallVec::from_vec(v))
    }

    /// Number of entries (nodes).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True for a timestamp of zero nodes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Entry of node `n`.
    #[inline]
    pub fn get(&self, n: NodeId) -> IntervalIdx {
        self.0[n.idx()]
    }

    /// Sets the entry of node `n`.
    #[inline]
    pub fn set(&mut self, n: NodeId, v: IntervalIdx) {
        self.0[n.idx()] = v;
    }

    /// Entries, indexed by node.
    pub fn entries(&self) -> &[IntervalIdx] {
        &self.0
    }

    /// Entry-wise maximum, in place.
    pub fn merge(&mut self, other: &VectorTime) {
        for (a, b) in self.0.iter_mut().zip(&other.0) {
            *a = (*a).max(*b);
        }
    }

    /// `self <= other` entry-wise: everything `self` knows, `other` knows.
    pub fn le(&self, other: &VectorTime) -> bool {
        self.0.iter().zip(&other.0).all(|(a, b)| a <= b)
    }

    /// Sum of entries: a linear extension of the partial order.
    pub fn sum(&self) -> u64 {
        self.0.iter().map(|&x| u64::from(x)).sum()
    }
}

impl PartialOrd for VectorTime {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        match (self.le(other), other.le(self)) {
            (true, true) => Some(Ordering::Equal),
            (true, false) => Some(Ordering::Less),
            (false, true) => Some(Ordering::Greater),
            (false, false) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vt(v: &[u32]) -> VectorTime {
        VectorTime::from_entries(v.to_vec())
    }

    #[test]
    fn order_is_partial() {
        assert!(vt(&[1, 2]) < vt(&[1, 3]));
        assert!(vt(&[1, 2]) <= vt(&[1, 2]));
        assert_eq!(vt(&[2, 1]).partial_cmp(&vt(&[1, 2])), None);
    }

    #[test]
    fn merge_is_entrywise_max_and_an_upper_bound() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 7) as u32
        };
        for _ in 0..500 {
            let a = vt(&[next(), next(), next(), next()]);
            let b = vt(&[next(), next(), next(), next()]);
            let mut m = a.clone();
            m.merge(&b);
            assert!(a <= m && b <= m);
            let mut m2 = b.clone();
            m2.merge(&a);
            assert_eq!(m, m2, "merge commutes");
            if a < b {
                assert!(a.sum() < b.sum(), "sum extends the order");
            }
        }
    }
}
