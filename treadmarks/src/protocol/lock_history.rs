//! Which locks this node takes after which: the prediction behind bundled grants (`lock.rs`).
//!
//! A program that walks many locks in a pattern (SPLASH's Water takes one lock per molecule, in
//! the same order every step) pays a round trip for every acquire whose token another node holds.
//! The node remembers, for every lock it acquired, the [`LockHistory::limit`] locks it acquired
//! after it. A request for a lock carries them (its *wish*: each lock once, with the place of its
//! first acquire among them, [`Wished`], sent as a [`Wish`]); the holder grants the lock and
//! passes along the tokens of wished locks it holds and does not use, so the acquirer takes them
//! without asking. A lock taken again before `limit` acquires followed it wishes for those that
//! did (fewer: a lock taken again and again, a task queue's, wishes for the few others taken
//! between). A lock never taken yet (the first pass of a walk) wishes for the ids after it, a
//! first guess that the walk's history replaces; a queue's lock had kept that guess through its
//! first `limit` acquires, and its grants had passed the tokens of locks nobody took back and
//! forth.
//!
//! A wish names each lock once. It had named a lock as often as it was taken, each at its place,
//! and the granter skipped the repeats: a node that took lock 0 256 times after lock 1 sent 256
//! ids with every request for lock 1, and its granter walked them all.
//!
//! # Invariants
//! - `log` holds this node's last acquires (a ring of several times `limit`), `recorded` counts
//!   them all.
//! - What followed lock `l` — the locks other than `l` acquired in the `limit` acquires after
//!   it, the last time `l` was followed by that many, each at its first place among them (0 =
//!   the first acquire after `l` of a lock other than `l`) — is read from the ring after
//!   `anchor[l]` while that occurrence is in it, and from `follow[l]` (copied out as it left)
//!   after; a lock has one or the other. Recording costs O(1) per acquire, plus O(`limit`) when
//!   an anchor leaves the ring (a lock not taken again for a whole ring).
//! - A wish's places strictly increase, and it names no lock twice.
//! - With `limit == 0` nothing is recorded and every wish is empty: bundling is off.

use serde::{Deserialize, Serialize};

use super::ids::LockId;

/// A lock a request wishes for, and when the acquirer expects to take it: `place` is how many
/// acquires of other locks (not the requested one) it expects first, as last time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wished {
    pub lock: LockId,
    pub place: u32,
}

/// A wish as a request carries it: the locks in order, and their places only where they are not
/// the locks' indices, which is where a lock taken twice was left out (a lock walk's wish, of
/// locks each taken once, costs an id a lock, as when it named repeats).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wish {
    locks: Vec<LockId>,
    /// `(i, n)`: the locks from `locks[i]` on sit `n` places further on than before it; by `i`.
    gaps: Vec<(u32, u32)>,
}

impl Wish {
    /// The wish of `wished` (places strictly increasing, as [`LockHistory::wish`] makes them).
    pub fn new(wished: &[Wished]) -> Wish {
        let mut wish = Wish { locks: Vec::with_capacity(wished.len()), gaps: Vec::new() };
        let mut shift = 0u32;
        for (i, w) in (0u32..).zip(wished) {
            let at = i.saturating_add(shift);
            if w.place > at {
                wish.gaps.push((i, w.place - at));
                shift = shift.saturating_add(w.place - at);
            }
            wish.locks.push(w.lock);
        }
        wish
    }

    /// The locks wished for, each with its place. From a peer, any gaps will do: places are
    /// hints.
    pub fn iter(&self) -> impl Iterator<Item = Wished> + '_ {
        let mut gaps = self.gaps.iter().peekable();
        let mut shift = 0u32;
        (0u32..).zip(&self.locks).map(move |(i, &lock)| {
            while let Some(&&(_, n)) = gaps.peek().filter(|g| g.0 <= i) {
                shift = shift.saturating_add(n);
                gaps.next();
            }
            Wished { lock, place: i.saturating_add(shift) }
        })
    }

    /// The locks wished for.
    pub fn locks(&self) -> &[LockId] {
        &self.locks
    }

    /// How many places the wish moves its locks by (at most one a lock, as a node makes it).
    pub fn gaps(&self) -> usize {
        self.gaps.len()
    }
}

/// A node's recent acquires and what followed each lock.
#[derive(Debug, Default)]
pub struct LockHistory {
    limit: usize,
    /// The last [`LockHistory::log_len`] acquires, as a ring indexed by absolute position.
    log: Vec<LockId>,
    /// Acquires recorded so far (the absolute position of the next one).
    recorded: u64,
    /// Per lock (indexed by id), the position of its last occurrence that `limit` acquires
    /// followed. Vectors rather than hash maps: recording runs in every acquire, local ones too,
    /// and two hashed lookups cost a local acquire a fifth of its time.
    anchor: Vec<Option<u64>>,
    /// Per lock, what followed such an occurrence whose position has left the ring (copied out
    /// when it left).
    follow: Vec<Option<Vec<Wished>>>,
    /// Per lock, the position of its last occurrence (in the ring or not).
    last: Vec<Option<u64>>,
    /// The locks a list being built names already.
    seen: Seen,
    /// Locks in the job (ids `0..nlocks`).
    nlocks: u32,
}

impl LockHistory {
    /// A history that predicts up to `limit` locks after each of `nlocks`; 0 turns prediction off.
    pub fn new(limit: usize, nlocks: u32) -> Self {
        let per_lock = if limit == 0 { 0 } else { nlocks as usize };
        LockHistory {
            limit,
            log: Vec::new(),
            recorded: 0,
            anchor: vec![None; per_lock],
            follow: vec![None; per_lock],
            last: vec![None; per_lock],
            seen: Seen { list: vec![0; per_lock], stamp: 0 },
            nlocks,
        }
    }

    /// Most locks one wish names, and most tokens one grant passes along.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Ring size: a lock walk of several times the limit stays in it, so that recording costs
    /// O(1) and only an occurrence leaving the ring copies its followers out (O(`limit`)).
    fn log_len(&self) -> usize {
        8 * self.limit + 8
    }

    fn at(&self, pos: u64) -> LockId {
        self.log[(pos % self.log.len() as u64) as usize]
    }

    /// The application acquired `lock` (locally or not).
    pub fn record(&mut self, lock: LockId) {
        if self.limit == 0 {
            return;
        }
        let (len, pos) = (self.log_len(), self.recorded);
        if self.log.len() < len {
            self.log.push(lock);
        } else {
            // The occurrence leaving the ring takes its followers along if it is its lock's anchor.
            let gone = pos - len as u64;
            let old = self.at(gone);
            if self.anchor[old.idx()] == Some(gone) {
                self.follow[old.idx()] = Some(self.window(gone));
                self.anchor[old.idx()] = None;
            }
            self.log[(pos % len as u64) as usize] = lock;
        }
        self.last[lock.idx()] = Some(pos);
        self.recorded += 1;
        // The occurrence `limit` acquires back is now followed by `limit` of them.
        if let Some(a) = self.recorded.checked_sub(self.limit as u64 + 1) {
            let l = self.at(a);
            self.anchor[l.idx()] = Some(a);
            self.follow[l.idx()] = None;
        }
    }

    /// What followed the occurrence at `pos` in the `limit` acquires after it (in the ring).
    fn window(&mut self, pos: u64) -> Vec<Wished> {
        let lock = self.at(pos);
        self.seen.first_places(lock, span(&self.log, pos + 1, pos + 1 + self.limit as u64))
    }

    /// What followed `lock` the last time `limit` acquires did, if it was; else, if it was taken
    /// at all, what followed its last occurrence (fewer than `limit`: it is in the ring).
    fn followers(&mut self, lock: LockId) -> Option<Vec<Wished>> {
        if let Some(pos) = self.anchor.get(lock.idx()).copied().flatten() {
            return Some(self.window(pos));
        }
        if let Some(after) = self.follow.get(lock.idx()).cloned().flatten() {
            return Some(after);
        }
        let pos = self.last.get(lock.idx()).copied().flatten()?;
        Some(self.seen.first_places(lock, span(&self.log, pos + 1, self.recorded)))
    }

    /// The locks we expect to take after `lock`, as we did last time.
    ///
    /// A lock we never took (the first pass of a walk) gets the ids after it: programs keep a
    /// lock per array element and walk them in order, and a wish is only a hint.
    pub fn wish(&mut self, lock: LockId) -> Vec<Wished> {
        match self.followers(lock) {
            Some(after) => after,
            None if self.limit > 0 => {
                let end = lock.0.saturating_add(1 + self.limit as u32).min(self.nlocks);
                (lock.0 + 1..end).zip(0..).map(|(l, place)| Wished { lock: LockId(l), place }).collect()
            }
            None => Vec::new(),
        }
    }

    /// When we expect to take each lock next, as we did last time: the lock we took last at 0,
    /// then the locks that followed it, each at its first place among them (0 = our next
    /// acquire). Locks we do not expect are absent.
    ///
    /// A granter keeps a wished token it expects to take no later than the acquirer, which
    /// wishes for each lock at its place, and passes along the others: a token goes to
    /// whichever node takes it sooner. Keeping every expected token bundled none once a history
    /// was as long as a whole lock walk (water at 2 nodes with `TMK_LOCK_BUNDLE=512`: 1.4 s
    /// against 0.09 s); keeping the next 32 only gave away tokens the granter took in its next
    /// hundred acquires, which then came back one grant at a time (0.105 s against 0.086 s).
    pub fn expected_order(&mut self) -> ExpectedOrder {
        let mut order = ExpectedOrder { place: Vec::new(), len: 0 };
        if let Some(pos) = self.recorded.checked_sub(1) {
            let last = self.at(pos);
            order.note(last, 0);
            for w in self.followers(last).into_iter().flatten() {
                order.note(w.lock, w.place as usize);
            }
        }
        order
    }
}

/// The locks acquired at positions `from..to` of the ring `log`, oldest first; all must be in it
/// (fewer than `log.len()` positions, none older than the ring holds).
fn span(log: &[LockId], from: u64, to: u64) -> impl Iterator<Item = LockId> + '_ {
    let n = (to - from) as usize;
    let start = (from % log.len().max(1) as u64) as usize;
    let first = &log[start..(start + n).min(log.len())];
    first.iter().chain(&log[..n - first.len()]).copied()
}

/// Which locks the list being built names already: a stamp per lock, so that starting a list
/// clears nothing.
#[derive(Debug, Default)]
struct Seen {
    /// Per lock, the stamp of the last list that named it.
    list: Vec<u32>,
    /// The current list's stamp (never 0 while a list is built).
    stamp: u32,
}

impl Seen {
    /// Each lock of `after` other than `lock`, once, at its first place among them (the places
    /// count the acquires of other locks than `lock`).
    fn first_places(&mut self, lock: LockId, after: impl Iterator<Item = LockId>) -> Vec<Wished> {
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.list.fill(0);
            self.stamp = 1;
        }
        let mut out = Vec::new();
        for (place, l) in (0..).zip(after.filter(|&l| l != lock)) {
            if let Some(seen) = self.list.get_mut(l.idx())
                && *seen != self.stamp
            {
                *seen = self.stamp;
                out.push(Wished { lock: l, place });
            }
        }
        out
    }
}

/// When this node expects to take each lock next ([`LockHistory::expected_order`]): built at
/// every grant, so a table indexed by lock id (a hash map of the 128 entries cost water ~10 µs
/// a grant, and a sorted list with a search per wished lock still ~8 µs of 256).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedOrder {
    /// Per lock id, its place, or `NOT_EXPECTED`; as long as the largest expected id.
    place: Vec<u32>,
    len: usize,
}

const NOT_EXPECTED: u32 = u32::MAX;

impl ExpectedOrder {
    /// Records `lock` at `place`, unless it already has an earlier one.
    fn note(&mut self, lock: LockId, place: usize) {
        let i = lock.idx();
        if self.place.len() <= i {
            self.place.resize(i + 1, NOT_EXPECTED);
        }
        if self.place[i] == NOT_EXPECTED {
            self.place[i] = place as u32;
            self.len += 1;
        }
    }

    /// The place of `lock` (0 = our next acquire), if we expect it.
    pub fn get(&self, lock: LockId) -> Option<usize> {
        self.place.get(lock.idx()).filter(|&&p| p != NOT_EXPECTED).map(|&p| p as usize)
    }

    /// How many locks we expect.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether we expect none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every expected lock and its place, by lock id.
    #[cfg(test)]
    fn entries(&self) -> Vec<(LockId, usize)> {
        (0..self.place.len() as u32).filter_map(|l| self.get(LockId(l)).map(|p| (LockId(l), p))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn ids(v: &[u32]) -> Vec<LockId> {
        v.iter().copied().map(LockId).collect()
    }

    /// The locks a wish names, in order.
    fn locks(w: Vec<Wished>) -> Vec<LockId> {
        w.into_iter().map(|w| w.lock).collect()
    }

    /// The plain definition of a wish from the locks that followed: each once, at the index of
    /// its first occurrence.
    fn firsts(after: Vec<LockId>) -> Vec<Wished> {
        let mut seen = std::collections::HashSet::new();
        (0..)
            .zip(after)
            .filter(|&(_, l)| seen.insert(l))
            .map(|(place, lock)| Wished { lock, place })
            .collect()
    }

    #[test]
    fn a_lock_is_followed_by_the_other_locks_taken_after_it() {
        let mut h = LockHistory::new(3, 100);
        for l in [1, 2, 2, 1, 5, 6] {
            h.record(LockId(l));
        }
        // After 1: 2, 2, 1 -> 2 at place 0 (once; itself left out); after the second 2: 1, 5, 6.
        assert_eq!(h.wish(LockId(1)), vec![Wished { lock: LockId(2), place: 0 }]);
        assert_eq!(locks(h.wish(LockId(2))), ids(&[1, 5, 6]));
        // 5 was followed by one acquire so far: that one. 7 was never taken: the ids after it,
        // as a first guess.
        assert_eq!(locks(h.wish(LockId(5))), ids(&[6]));
        assert_eq!(h.wish(LockId(7)), firsts(ids(&[8, 9, 10])));
        // We took 6 last; nothing followed 6 yet.
        assert_eq!(h.expected_order().entries(), vec![(LockId(6), 0)]);
        h.record(LockId(2));
        // Now 2 is the last, and 1, 5 and 6 followed it last time.
        let order = h.expected_order();
        assert_eq!(order.entries(), vec![(LockId(1), 0), (LockId(2), 0), (LockId(5), 1), (LockId(6), 2)]);
        assert_eq!((order.get(LockId(5)), order.get(LockId(7))), (Some(1), None));
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
        assert!(
            (0..99).all(|l| order.get(LockId(l)) == Some(l as usize)) && order.get(LockId(99)) == Some(0)
        );
    }

    #[test]
    fn repeats_count_at_their_first_place() {
        let mut h = LockHistory::new(4, 100);
        for l in [1, 2, 3, 2, 4, 1] {
            h.record(LockId(l));
        }
        // 1 is the last; last time 2, 3, 2, 4 followed it.
        assert_eq!(h.expected_order().get(LockId(2)), Some(0));
        assert_eq!(h.expected_order().get(LockId(4)), Some(3));
        let w = |lock, place| Wished { lock: LockId(lock), place };
        assert_eq!(h.wish(LockId(1)), vec![w(2, 0), w(3, 1), w(4, 3)]);
    }

    /// A wish travels as its locks, with places only where a repeat was left out, and reads
    /// back as it was made.
    #[test]
    fn a_wish_carries_places_only_where_repeats_were_left_out() {
        let w = |lock, place| Wished { lock: LockId(lock), place };
        let walk: Vec<Wished> = (0..256).map(|i| w(i + 1, i)).collect();
        let wish = Wish::new(&walk);
        assert!(wish.gaps.is_empty(), "a walk's wish needs no places");
        assert_eq!(wish.iter().collect::<Vec<_>>(), walk);
        let repeats = [w(2, 0), w(3, 1), w(4, 3), w(9, 7), w(5, 8)];
        let wish = Wish::new(&repeats);
        assert_eq!(wish.gaps, vec![(2, 1), (3, 3)]);
        assert_eq!(wish.iter().collect::<Vec<_>>(), repeats);
        assert_eq!(wish.locks(), &ids(&[2, 3, 4, 9, 5])[..]);
        // From a peer, gaps out of order or past the end are hints like any other.
        let odd = Wish { locks: ids(&[1, 2]), gaps: vec![(5, 1), (0, u32::MAX), (1, 7)] };
        assert_eq!(odd.iter().map(|w| w.lock).collect::<Vec<_>>(), ids(&[1, 2]));
    }

    /// A lock taken once and then another 256 times wishes for that other once (it had named it
    /// 256 times, and its granter walked them all).
    #[test]
    fn a_wish_names_a_lock_once() {
        let mut h = LockHistory::new(256, 1024);
        h.record(LockId(1));
        for _ in 0..300 {
            h.record(LockId(0));
        }
        assert_eq!(h.wish(LockId(1)), vec![Wished { lock: LockId(0), place: 0 }]);
        h.record(LockId(1));
        assert_eq!(h.wish(LockId(1)), vec![Wished { lock: LockId(0), place: 0 }], "from the ring");
    }

    #[test]
    fn the_last_pass_wins() {
        let mut h = LockHistory::new(2, 100);
        for l in [1, 2, 3, 1, 7, 8] {
            h.record(LockId(l));
        }
        assert_eq!(locks(h.wish(LockId(1))), ids(&[7, 8]));
    }

    #[test]
    fn a_lock_never_followed_wishes_for_the_ids_after_it_within_the_job() {
        let mut h = LockHistory::new(4, 10);
        assert_eq!(h.wish(LockId(2)), firsts(ids(&[3, 4, 5, 6])));
        assert_eq!(locks(h.wish(LockId(8))), ids(&[9]));
        assert!(h.wish(LockId(9)).is_empty());
    }

    /// A lock taken again and again (a task queue's) wishes for the few others taken between,
    /// not for the ids after it: its grants passed the tokens of locks nobody took back and
    /// forth, 256 a grant, through its first `limit` acquires.
    #[test]
    fn a_lock_taken_again_before_it_is_followed_wishes_for_what_came_between() {
        let mut h = LockHistory::new(256, 1024);
        for _ in 0..10 {
            h.record(LockId(1));
        }
        assert!(h.wish(LockId(1)).is_empty());
        h.record(LockId(5));
        h.record(LockId(1));
        assert!(h.wish(LockId(1)).is_empty());
        assert_eq!(locks(h.wish(LockId(5))), ids(&[1]));
        assert_eq!(h.wish(LockId(6)).len(), 256, "never taken: the first guess");
    }

    /// The plain definition: a window of the last `limit` acquires, copied out at every acquire;
    /// a lock not yet followed by that many, what followed its last occurrence.
    struct Reference {
        limit: usize,
        recent: std::collections::VecDeque<LockId>,
        follow: HashMap<LockId, Vec<LockId>>,
        all: Vec<LockId>,
    }

    impl Reference {
        fn wish(&self, l: LockId, nlocks: u32) -> Vec<LockId> {
            if let Some(f) = self.follow.get(&l) {
                return f.clone();
            }
            match self.all.iter().rposition(|&x| x == l) {
                Some(i) => self.all[i + 1..].iter().copied().filter(|&x| x != l).collect(),
                None => (l.0 + 1..(l.0 + 1 + self.limit as u32).min(nlocks)).map(LockId).collect(),
            }
        }

        fn record(&mut self, lock: LockId) {
            self.all.push(lock);
            self.recent.push_back(lock);
            if self.recent.len() > self.limit {
                let anchor = self.recent.pop_front().unwrap();
                let after = self.recent.iter().copied().filter(|&l| l != anchor).collect();
                self.follow.insert(anchor, after);
            }
        }
    }

    #[test]
    fn the_ring_answers_as_the_plain_definition_across_wraps() {
        // Walks with repeats and detours, some locks left for longer than the ring holds.
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for limit in [1, 3, 8] {
            let mut h = LockHistory::new(limit, 64);
            let mut r =
                Reference { limit, recent: Default::default(), follow: HashMap::new(), all: Vec::new() };
            let mut previous = LockId(0);
            for step in 0..5_000u64 {
                let lock = match next(8) {
                    0 | 1 => LockId(next(64) as u32),
                    // Runs of one lock, some longer than the limit (a queue's lock).
                    2 => previous,
                    _ => LockId((step % 24) as u32 + if step % 1000 < 500 { 0 } else { 30 }),
                };
                let times = if lock == previous { 1 + next(12) } else { 1 };
                for _ in 0..times {
                    h.record(lock);
                    r.record(lock);
                }
                previous = lock;
                for l in (0..64).map(LockId) {
                    assert_eq!(h.wish(l), firsts(r.wish(l, 64)), "limit {limit}, step {step}, {l:?}");
                }
                let last = h.expected_order();
                assert_eq!(last.get(lock), Some(0), "limit {limit}, step {step}");
            }
        }
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
