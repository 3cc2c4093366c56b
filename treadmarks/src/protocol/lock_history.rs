//! Which locks this node takes after which: the prediction behind bundled grants (`lock.rs`).
//!
//! A program that walks many locks in a pattern (SPLASH's Water takes one lock per molecule, in
//! the same order every step) pays a round trip for every acquire whose token another node holds.
//! The node remembers, for every lock it acquired, the [`LockHistory::limit`] locks it acquired
//! after it (repeats kept; the granter skips them). A request for a lock carries that list (its
//! *wish*); the holder grants the lock and passes along the tokens of wished locks it holds and
//! does not use, so the acquirer takes them without asking. A lock never followed yet (the first
//! pass of a walk) wishes for the ids after it, a first guess that the walk's history replaces.
//!
//! # Invariants
//! - `recent` holds this node's last `limit` acquires, oldest first (fewer at the start).
//! - `follow[l]` lists the locks other than `l` acquired in the `limit` acquires after `l`, the
//!   last time `l` was followed by that many, in order (a lock taken twice appears twice; the
//!   granter skips repeats). Recording costs O(`limit`) per acquire.
//! - With `limit == 0` nothing is recorded and every wish is empty: bundling is off.

use super::ids::LockId;
use std::collections::{HashMap, VecDeque};

/// A node's recent acquires and what followed each lock.
#[derive(Debug, Default)]
pub struct LockHistory {
    limit: usize,
    recent: VecDeque<LockId>,
    follow: HashMap<LockId, Vec<LockId>>,
    /// Locks in the job (ids `0..nlocks`).
    nlocks: u32,
}

impl LockHistory {
    /// A history that predicts up to `limit` locks after each of `nlocks`; 0 turns prediction off.
    pub fn new(limit: usize, nlocks: u32) -> Self {
        LockHistory { limit, recent: VecDeque::with_capacity(limit + 1), follow: HashMap::new(), nlocks }
    }

    /// Most locks one wish names, and most tokens one grant passes along.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The application acquired `lock` (locally or not).
    pub fn record(&mut self, lock: LockId) {
        if self.limit == 0 {
            return;
        }
        self.recent.push_back(lock);
        if self.recent.len() <= self.limit {
            return;
        }
        let anchor = self.recent.pop_front().expect("window holds limit + 1 locks");
        let after = self.follow.entry(anchor).or_default();
        after.clear();
        after.extend(self.recent.iter().filter(|&&l| l != anchor));
    }

    /// The locks we expect to take after `lock`, as we did last time.
    ///
    /// A lock we never saw followed (the first pass of a walk) gets the ids after it: programs
    /// keep a lock per array element and walk them in order, and a wish is only a hint.
    pub fn wish(&self, lock: LockId) -> Vec<LockId> {
        match self.follow.get(&lock) {
            Some(after) => after.clone(),
            None if self.limit > 0 => {
                let end = lock.0.saturating_add(1 + self.limit as u32).min(self.nlocks);
                (lock.0 + 1..end).map(LockId).collect()
            }
            None => Vec::new(),
        }
    }

    /// When we expect to take each lock next, as we did last time: the lock we took last at 0,
    /// then the locks that followed it, each at its first place in that list (0 = our next
    /// acquire). Locks we do not expect are absent.
    ///
    /// A granter keeps a wished token it expects to take no later than the acquirer, which
    /// wishes its `i`-th lock `i` acquires ahead, and passes along the others: a token goes to
    /// whichever node takes it sooner. Keeping every expected token bundled none once a history
    /// was as long as a whole lock walk (water at 2 nodes with `TMK_LOCK_BUNDLE=512`: 1.4 s
    /// against 0.09 s); keeping the next 32 only gave away tokens the granter took in its next
    /// hundred acquires, which then came back one grant at a time (0.105 s against 0.086 s).
    pub fn expected_order(&self) -> HashMap<LockId, usize> {
        let mut order = HashMap::new();
        if let Some(&last) = self.recent.back() {
            order.insert(last, 0);
            for (j, &l) in self.follow.get(&last).into_iter().flatten().enumerate() {
                order.entry(l).or_insert(j);
            }
        }
        order
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[u32]) -> Vec<LockId> {
        v.iter().copied().map(LockId).collect()
    }

    #[test]
    fn a_lock_is_followed_by_the_other_locks_taken_after_it() {
        let mut h = LockHistory::new(3, 100);
        for l in [1, 2, 2, 1, 5, 6] {
            h.record(LockId(l));
        }
        // After 1: 2, 2, 1 -> [2, 2] (itself left out); after the second 2: 1, 5, 6.
        assert_eq!(h.wish(LockId(1)), ids(&[2, 2]));
        assert_eq!(h.wish(LockId(2)), ids(&[1, 5, 6]));
        // 5 was not yet followed by three acquires: the ids after it, as a first guess.
        assert_eq!(h.wish(LockId(5)), ids(&[6, 7, 8]));
        // We took 6 last; nothing followed 6 yet.
        assert_eq!(h.expected_order(), HashMap::from([(LockId(6), 0)]));
        h.record(LockId(2));
        // Now 2 is the last, and 1, 5 and 6 followed it last time.
        let order = h.expected_order();
        assert_eq!(order, HashMap::from([(LockId(2), 0), (LockId(1), 0), (LockId(5), 1), (LockId(6), 2)]));
    }

    #[test]
    fn a_history_as_long_as_the_walk_orders_every_lock_of_it() {
        let mut h = LockHistory::new(100, 100);
        for l in 0..200 {
            h.record(LockId(l % 100));
        }
        // 99 was taken last, and followed last time by 0..=98, in that order.
        assert_eq!(h.wish(LockId(99)).len(), 99);
        let order = h.expected_order();
        assert_eq!(order.len(), 100);
        assert!((0..99).all(|l| order[&LockId(l)] == l as usize) && order[&LockId(99)] == 0);
    }

    #[test]
    fn repeats_count_at_their_first_place() {
        let mut h = LockHistory::new(4, 100);
        for l in [1, 2, 3, 2, 4, 1] {
            h.record(LockId(l));
        }
        // 1 is the last; last time 2, 3, 2, 4 followed it.
        assert_eq!(h.expected_order()[&LockId(2)], 0);
        assert_eq!(h.expected_order()[&LockId(4)], 3);
    }

    #[test]
    fn the_last_pass_wins() {
        let mut h = LockHistory::new(2, 100);
        for l in [1, 2, 3, 1, 7, 8] {
            h.record(LockId(l));
        }
        assert_eq!(h.wish(LockId(1)), ids(&[7, 8]));
    }

    #[test]
    fn a_lock_never_followed_wishes_for_the_ids_after_it_within_the_job() {
        let h = LockHistory::new(4, 10);
        assert_eq!(h.wish(LockId(2)), ids(&[3, 4, 5, 6]));
        assert_eq!(h.wish(LockId(8)), ids(&[9]));
        assert!(h.wish(LockId(9)).is_empty());
    }

    #[test]
    fn limit_zero_predicts_nothing() {
        let mut h = LockHistory::new(0, 100);
        for l in 0..10 {
            h.record(LockId(l % 3));
        }
        assert!(h.wish(LockId(0)).is_empty());
        assert!(h.expected_order().is_empty());
    }
}
