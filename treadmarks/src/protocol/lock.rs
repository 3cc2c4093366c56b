//! Locks: a static manager per lock (`lock % nprocs`), requests forwarded along the
//! last-requester chain, grants straight from releaser to acquirer carrying every interval the
//! acquirer lacks, and *bundled grants*: a grant also passes along the tokens of locks the
//! acquirer expects to take next (its wish, from `lock_history.rs`) that the granter holds unused.
//!
//! # Lock state (per node, per lock)
//! - `token`: this node was the lock's last holder and has not passed it on. Initially the
//!   manager has every token it manages. Re-acquiring a lock whose token we have costs no message.
//! - `held`: the application holds the lock (implies `token`).
//! - `requested`: we asked for the lock and wait for its grant.
//! - `requests`: how many requests we made for the lock; a request carries its number.
//! - `next`: the request forwarded to us to be served after us; we grant to it at our release, or
//!   at once if we have the token and do not hold the lock.
//! - `tail` (manager only): the node the manager forwards the next request to, and which of its
//!   requests made it the last requester (`None`: no request did: the manager itself, at the
//!   start or after a bundled token came back, or a node a bundled grant gave the token). The chain
//!   of forwards gives every requester at most one successor, so `next` is a single slot.
//!
//! # Bundled tokens, and why the chain stays sound
//! The manager's `tail` must name the node that holds the token or waits for it last; a token
//! that moves without a request would leave it stale. So a token `b` travels in a grant to `to`
//! only if it is unused here (token, not held, nobody in `next`), we do not expect to take it
//! sooner ourselves (`LockHistory::expected_order`), and either
//! 1. we are `b`'s manager and its tail is ourselves: we set the tail to `to` (nothing is in
//!    flight, the chain is exact); or
//! 2. `to` is `b`'s manager: on receipt it sets the tail to itself if the tail was still us.
//!    Otherwise a request reached the manager after we became its tail, and its forward is on
//!    its way to us; we send it back to the manager, in order behind the grant, and the manager
//!    still holds the token when it comes: while its tail is another node it cannot bundle the
//!    token (case 1), and no forward but this one reaches it.
//!
//! A forward is queued (`next`) only by the token's holder, or by a node waiting for the lock when
//! the forward's `tail` is its current request, i.e. the manager ordered the requester after it.
//! A forward that reaches a node without the token for an older request of its (or, with `tail`
//! `None`, after case 2 took the token away) is the in-flight one of case 2 and goes back to the
//! manager. So nobody waits behind a node that waits behind it: the manager's order is the queue.
//!
//! The grant's intervals are everything the granter knows that the acquirer lacks, which covers
//! every release of a bundled lock before it (all were ours or known to us), so the acquirer may
//! take a bundled lock later without a message and see what LRC requires. It incorporates them
//! once, inside the acquire that the grant completes.
//!
//! # Diffs on grants
//! A grant also carries diffs, so that the acquirer need not fetch what it reads next: those of
//! the data the granted locks protect, and those of the pages the acquirer subscribes to
//! (`push.rs`), whatever lock they were written under (`Node::diffs_for_grant`). Each page goes
//! with the diff the granter assumed the acquirer had (`after_seq`); the acquirer applies them
//! only if it had that one (applied, or in a push it holds unused), so a page is never made valid
//! with a gap.

use super::ProtocolError;
use super::ids::{DiffSeq, IntervalIdx, LockId, NodeId, PageIdx};
use super::interval::IntervalRecord;
use super::lock_history::{Wish, Wished};
use super::memory::PageMemory;
use super::msg::{Message, UnaskedDiffs};
use super::node::{AppDone, Node, Pending};
use super::page::WriterState;
use super::vtime::VectorTime;

/// A request for a lock on its way to the token: who asks, what it knows, and the locks it
/// expects to take next.
#[derive(Clone, Debug)]
pub struct LockAsk {
    pub requester: NodeId,
    pub vt: VectorTime,
    pub wish: Wish,
}

/// Where the manager sends the next request for a lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tail {
    pub node: NodeId,
    /// The node's request that made it the tail; `None` when none did (the manager itself, or a
    /// node a bundled grant gave the token).
    pub request: Option<u32>,
}

/// One lock as one node sees it.
#[derive(Clone, Debug)]
pub struct LockState {
    pub id: LockId,
    pub held: bool,
    pub token: bool,
    pub requested: bool,
    pub requests: u32,
    pub next: Option<LockAsk>,
    /// Meaningful on the lock's manager only.
    pub tail: Tail,
    /// Noted in `Node::interval_locks`: held during the open interval.
    pub in_interval: bool,
}

impl LockState {
    pub(crate) fn new(id: LockId, me: NodeId, nprocs: u16) -> Self {
        let manager = NodeId((id.0 % u32::from(nprocs)) as u16);
        LockState {
            id,
            held: false,
            token: manager == me,
            requested: false,
            requests: 0,
            next: None,
            tail: Tail { node: manager, request: None },
            in_interval: false,
        }
    }
}

/// Most diff bytes one lock grant carries.
pub const PIGGYBACK_LIMIT: usize = 64 << 10;

/// Most pages one lock grant carries diffs of, however small: a page whose diffs the acquirer
/// has already (an empty list) costs no diff bytes, so [`PIGGYBACK_LIMIT`] alone did not bound
/// the list, and a receiver can refuse a longer one by its length (`cautious.rs`). Water's
/// grants carry 4-5 pages, qsort's ~16 whole-page diffs.
pub const PIGGYBACK_MAX_PAGES: usize = 1024;

/// Pages of a grant's candidates whose twins are cut together (`Node::diffs_for_grant`): cut
/// one by one, each froze and restored its page, ~4.5 µs a page in water's grants.
const GRANT_CUT_BATCH: usize = 8;

impl<M: PageMemory> Node<M> {
    fn manager_of(&self, lock: LockId) -> NodeId {
        NodeId((lock.0 % u32::from(self.cfg.nprocs)) as u16)
    }

    fn check_lock(&self, lock: LockId) -> Result<(), ProtocolError> {
        if lock.0 >= self.cfg.nlocks {
            return Err(ProtocolError::UnknownLock { lock, nlocks: self.cfg.nlocks });
        }
        Ok(())
    }

    /// Whether an acquire of `lock` would complete at once, with no message: its token is here,
    /// nobody holds it, and the application waits for nothing else.
    pub fn token_here(&self, lock: LockId) -> bool {
        matches!(self.pending, Pending::None)
            && self.locks.get(lock.idx()).is_some_and(|st| st.token && !st.held)
    }

    /// Acquires `lock` at once if [`Node::token_here`] says it can, and returns whether it did:
    /// [`Node::request_acquire`] without a completion to poll (the application thread runs it
    /// itself, on every lock operation of a walk like water's).
    pub fn acquire_if_here(&mut self, lock: LockId) -> Result<bool, ProtocolError> {
        self.check_lock(lock)?;
        if !self.token_here(lock) {
            return Ok(false);
        }
        self.check_consistency_data()?;
        self.lock_history.record(lock);
        self.take_token_here(lock);
        Ok(true)
    }

    /// The application takes `lock`, whose token is here.
    fn take_token_here(&mut self, lock: LockId) {
        self.locks[lock.idx()].held = true;
        self.stats.lock_acquires_local += 1;
        self.held_locks.push(lock);
        self.note_interval_lock(lock);
    }

    /// The application acquires `lock`; completes with [`AppDone::Acquired`].
    pub fn request_acquire(&mut self, lock: LockId) -> Result<(), ProtocolError> {
        self.check_lock(lock)?;
        self.begin("acquire")?;
        self.check_consistency_data()?;
        if self.locks[lock.idx()].held {
            return Err(ProtocolError::AlreadyHeld { lock });
        }
        if self.locks[lock.idx()].token {
            self.lock_history.record(lock);
            self.take_token_here(lock);
            self.done.push_back(AppDone::Acquired(lock));
            return Ok(());
        }
        let wish = Wish::new(&self.lock_history.wish(lock));
        self.lock_history.record(lock);
        let st = &mut self.locks[lock.idx()];
        st.requested = true;
        st.requests = st.requests.wrapping_add(1);
        let seq = st.requests;
        self.stats.lock_acquires_remote += 1;
        self.pending = Pending::Acquire(lock);
        let msg = Message::LockRequest { lock, seq, vt: self.vt.clone(), wish };
        self.outbox.push_back((self.manager_of(lock), msg));
        self.deliver_local()
    }

    /// The application releases `lock`: ends the interval, and passes the lock on if somebody
    /// asked for it. Handed to another thread, so the application may be writing already (the
    /// runtime releases on the application thread, [`Node::release_here`], and posts a release
    /// only once the job failed, when nothing runs it; the simulation runs this one with the
    /// application going on, a store maybe in the middle of it).
    pub fn request_release(&mut self, lock: LockId) -> Result<(), ProtocolError> {
        self.release(lock, false)
    }

    /// [`Node::request_release`] run by the application thread itself, inside its call into the
    /// runtime: nothing writes a page meanwhile, so the interval closes as under an acquire or a
    /// barrier, comparing its renewed twins without freezing their pages first (a protection
    /// change per run of them each way: water's release of the energy lock, after `correct`
    /// rewrote its 18 molecule pages through a view that twinned them ahead, took ~52 µs,
    /// while the other node's request for the lock waited on it).
    pub fn release_here(&mut self, lock: LockId) -> Result<(), ProtocolError> {
        self.release(lock, true)
    }

    /// A release; `app_inside`: the application thread runs it (see [`Node::release_here`]).
    fn release(&mut self, lock: LockId, app_inside: bool) -> Result<(), ProtocolError> {
        self.check_lock(lock)?;
        self.begin("release")?;
        if !self.locks[lock.idx()].held {
            return Err(ProtocolError::NotHeld { lock });
        }
        self.locks[lock.idx()].held = false;
        self.held_locks.retain(|&l| l != lock);
        self.close_interval(app_inside);
        if let Some(ask) = self.locks[lock.idx()].next.take() {
            self.grant(lock, ask, app_inside);
        }
        self.deliver_local()
    }

    /// Grants `lock` to `ask`; `blocked`: nothing writes a page meanwhile ([`Node::app_still`],
    /// or the application runs this release itself), so twins are cut without revoking write
    /// access first (`Node::serve_diff_request`).
    fn grant(&mut self, lock: LockId, ask: LockAsk, blocked: bool) {
        self.locks[lock.idx()].token = false;
        let to = ask.requester;
        let bundled = self.bundle(lock, to, &ask.wish);
        let intervals = self.log.newer_than(&ask.vt);
        let mut locks = bundled.clone();
        locks.push(lock);
        let diffs = self.diffs_for_grant(to, &locks, &ask.vt, &intervals, blocked);
        self.send_with_records(to, Message::LockGrant { lock, intervals, diffs, bundled });
    }

    /// The tokens of wished-for locks a grant of `lock` to `to` passes along, taken from this
    /// node (the module docs say which qualify and why).
    fn bundle(&mut self, lock: LockId, to: NodeId, wish: &Wish) -> Vec<LockId> {
        let mut out = Vec::new();
        let ours = self.lock_history.expected_order();
        for Wished { lock: b, place } in wish.iter() {
            if out.len() >= self.lock_history.limit() {
                break;
            }
            // A token we expect to take no later than the acquirer stays (`expected_order`). A
            // lock a peer wished for twice is bundled once: its token is gone the first time.
            if b == lock || ours.get(b).is_some_and(|j| j <= place as usize) {
                continue;
            }
            let manager = self.manager_of(b);
            let me = self.me;
            let st = &mut self.locks[b.idx()];
            if !st.token || st.held || st.next.is_some() {
                continue;
            }
            if manager == me && st.tail.node == me {
                st.tail = Tail { node: to, request: None };
            } else if manager != to {
                continue;
            }
            st.token = false;
            out.push(b);
        }
        self.stats.lock_tokens_bundled += out.len() as u64;
        out
    }

    /// The diffs a grant to `to` carries. Two kinds of pages qualify, both with a write notice
    /// in the grant (written in an interval the acquirer lacks):
    ///
    /// - **the data the locks protect**: pages we began writing (made the twin) while holding a
    ///   lock, in an interval in which we held one of `locks` (the granted lock and the bundled
    ///   ones), most likely what the acquirer reads next. An interval runs from one release to
    ///   the next, so a page twinned before the acquire counts only if a lock was held then:
    ///   water rewrites its molecules, 14 pages a node, just before taking the energy lock, and
    ///   its grants carried them all, cut on the spot (64 KB; 250-270 µs acquires);
    /// - **pages the acquirer reads**: pages written under some lock that it subscribes to (it
    ///   fetched them from us before, `push.rs`) and has kept up with (it has every diff of ours
    ///   it knows of: a page it read once and left is not sent again and again). The notice the
    ///   grant carries would make it fetch them when it next reads them, and a later grant of
    ///   the lock they were written under could not complete them (the acquirer would know their
    ///   intervals by then without having their diffs). Water's force pages, each written under
    ///   some 57 molecule locks that bundles split, were so fetched five times a step per node.
    ///
    /// Pages written outside any lock go with barriers (pushes) or are fetched when read.
    ///
    /// Each page goes as a diff request would be answered: every diff of ours after the one we
    /// assume the acquirer has (`after_seq`: the newest whose first interval it knows of, or the
    /// one its subscription records if older), cutting the twin if need be (the acquirer needs all
    /// of them to consider the page complete). Pages merely still twinned from before are not sent.
    /// Bounded by [`PIGGYBACK_LIMIT`] bytes and [`PIGGYBACK_MAX_PAGES`] pages, the protected data
    /// first, in page order; the twins are cut [`GRANT_CUT_BATCH`] pages at a time, so those of
    /// pages more than a batch past the limit are not cut (cutting every candidate's made qsort,
    /// whose task-queue grants name most of the pages a node sorts, 50% slower in write faults).
    /// Beyond the limit the acquirer fetches as usual. `blocked`: as for [`Node::grant`].
    fn diffs_for_grant(
        &mut self,
        to: NodeId,
        locks: &[LockId],
        vt: &VectorTime,
        intervals: &[IntervalRecord],
        blocked: bool,
    ) -> Vec<UnaskedDiffs> {
        let ours: Vec<&IntervalRecord> = intervals.iter().filter(|r| r.node == self.me).collect();
        let began_under_lock = |first: IntervalIdx| {
            ours.iter().any(|r| r.index == first && r.locks.iter().any(|l| locks.contains(l)))
        };
        let mut pages: Vec<PageIdx> = ours.iter().flat_map(|r| r.pages.iter().copied()).collect();
        pages.sort_unstable();
        pages.dedup();
        let known = vt.get(self.me);
        let mut candidates: Vec<(bool, PageIdx, DiffSeq)> = pages
            .into_iter()
            .filter_map(|p| {
                let meta = &self.pages[p.idx()];
                let protected = (meta.under_lock && meta.twin.is_some_and(began_under_lock))
                    || meta.diffs.iter().any(|d| d.under_lock && began_under_lock(d.first));
                let subscribed = self.subscription(p, to);
                let known_seq =
                    meta.diffs.iter().take_while(|d| d.first <= known).last().map_or(0, |d| d.seq);
                let after_seq = subscribed.map_or(known_seq, |s| s.min(known_seq));
                let written_under_lock = meta.under_lock || meta.diffs.iter().any(|d| d.under_lock);
                let kept_up = subscribed.is_some_and(|s| s >= known_seq) && written_under_lock;
                (protected || kept_up).then_some((!protected, p, after_seq))
            })
            .collect();
        candidates.sort_unstable();
        let closed = self.vt.get(self.me);
        let mut out = Vec::new();
        let mut bytes = 0;
        for (i, &(_, p, after_seq)) in candidates.iter().enumerate().take(self.cfg.limits.piggyback_pages) {
            // Twins cut a batch at a time, as for a diff request (one protection change per run
            // of pages, none for pages renewed from a snapshot), but no further than the limit
            // may need: cutting every candidate's made qsort's grants far slower.
            if i % GRANT_CUT_BATCH == 0 {
                let batch = candidates[i..].iter().take(GRANT_CUT_BATCH).map(|c| (c.1, closed));
                self.cut_for_serving(batch, blocked);
            }
            let diffs = self.serve_diffs(p, closed, after_seq).diffs;
            bytes += diffs.iter().map(|d| d.diff.encoded_len()).sum::<usize>();
            if bytes > self.cfg.limits.piggyback_bytes {
                break;
            }
            self.stats.diffs_piggybacked += diffs.len() as u64;
            self.sent_to_subscriber(p, to, &diffs);
            out.push(UnaskedDiffs { page: p, after_seq, diffs });
        }
        out
    }

    /// Checks the locks a peer's bundle names.
    fn check_locks(&self, locks: &[LockId]) -> Result<(), ProtocolError> {
        locks.iter().try_for_each(|&l| self.check_lock(l))
    }

    /// Checks the locks a peer's wish names (its places are hints, any will do): each a lock of
    /// the job, and no more of them than the job has, as a node wishes for each lock once
    /// (`LockHistory::wish`), so that a wish, which waits with its request until the lock is
    /// released, stays that short. A longer one names some lock twice: the error names it (looked
    /// for only then, off the path of every request).
    fn check_wish(&self, wish: &Wish, from: NodeId) -> Result<(), ProtocolError> {
        self.check_locks(wish.locks())?;
        let what = if wish.locks().len() > self.cfg.nlocks as usize {
            let mut sorted = wish.locks().to_vec();
            sorted.sort_unstable();
            let twice = sorted.windows(2).find(|w| w[0] == w[1]).expect("more ids than locks")[0];
            format!("a wish of {} locks naming {twice} twice", wish.locks().len())
        } else if wish.gaps() > wish.locks().len() {
            format!("a wish of {} locks with {} gaps", wish.locks().len(), wish.gaps())
        } else {
            return Ok(());
        };
        Err(ProtocolError::Unexpected { from, what })
    }

    pub(crate) fn handle_lock_request(
        &mut self,
        from: NodeId,
        lock: LockId,
        seq: u32,
        ask: LockAsk,
    ) -> Result<(), ProtocolError> {
        self.check_lock(lock)?;
        self.check_wish(&ask.wish, from)?;
        let bad = |what: &str| ProtocolError::Unexpected { from, what: format!("{what} for {lock}") };
        if self.manager_of(lock) != self.me || ask.vt.len() != self.nprocs() {
            return Err(bad("lock request"));
        }
        if self.locks[lock.idx()].tail.node == from {
            return Err(bad("second lock request without a grant in between"));
        }
        let tail = Tail { node: from, request: Some(seq) };
        let last = std::mem::replace(&mut self.locks[lock.idx()].tail, tail);
        let LockAsk { requester, vt, wish } = ask;
        let msg = Message::LockForward { lock, requester, vt, wish, tail: last.request };
        self.outbox.push_back((last.node, msg));
        Ok(())
    }

    pub(crate) fn handle_lock_forward(
        &mut self,
        from: NodeId,
        lock: LockId,
        ask: LockAsk,
        tail: Option<u32>,
    ) -> Result<(), ProtocolError> {
        self.check_lock(lock)?;
        self.check_wish(&ask.wish, from)?;
        let bad = |what: &str| ProtocolError::Unexpected { from, what: format!("{what} of {lock}") };
        let manager = self.manager_of(lock);
        // From the manager, or sent back to us, the manager, by a node that bundled us the token.
        let sender_ok = from == manager || manager == self.me;
        if !sender_ok || ask.requester.idx() >= self.nprocs() || ask.vt.len() != self.nprocs() {
            return Err(bad("lock forward"));
        }
        let st = &mut self.locks[lock.idx()];
        let after_our_request = st.requested && tail == Some(st.requests);
        if st.token && !st.held {
            self.grant(lock, ask, self.app_still());
        } else if (st.token || after_our_request) && st.next.is_none() {
            st.next = Some(ask);
        } else if !st.token && !after_our_request && manager != self.me {
            // We were the tail when we bundled the token to the manager: it holds it.
            self.stats.lock_forwards_returned += 1;
            let LockAsk { requester, vt, wish } = ask;
            self.outbox.push_back((manager, Message::LockForward { lock, requester, vt, wish, tail: None }));
        } else {
            return Err(bad("lock forward while neither holding nor awaiting"));
        }
        Ok(())
    }

    pub(crate) fn handle_lock_grant(
        &mut self,
        from: NodeId,
        lock: LockId,
        intervals: Vec<IntervalRecord>,
        diffs: Vec<UnaskedDiffs>,
        bundled: Vec<LockId>,
    ) -> Result<(), ProtocolError> {
        self.check_lock(lock)?;
        self.check_locks(&bundled)?;
        if !matches!(self.pending, Pending::Acquire(l) if l == lock) || !self.locks[lock.idx()].requested {
            return Err(ProtocolError::Unexpected { from, what: format!("grant of {lock}") });
        }
        let mut distinct = bundled.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let repeated = distinct.len() < bundled.len();
        for &b in &bundled {
            let st = &self.locks[b.idx()];
            let manager = self.manager_of(b);
            let ours = st.token || st.held || st.requested || b == lock || repeated;
            if ours || (manager != from && manager != self.me) {
                return Err(ProtocolError::Unexpected { from, what: format!("{b} bundled with {lock}") });
            }
        }
        for d in &diffs {
            self.check_page(from, d.page)?;
        }
        // A piggybacked page can be completed only if we had every diff of the granter's up to
        // the one it assumed we had, applied or pushed to us (then its diffs after that one are
        // all we lack of it): judged on our state before the grant's notices.
        let before: Vec<Option<WriterState>> =
            diffs.iter().map(|d| self.pages[d.page.idx()].writers.get(from.idx()).copied()).collect();
        self.incorporate(from, intervals)?;
        for (d, st) in diffs.into_iter().zip(before) {
            self.apply_piggybacked(from, d, st.unwrap_or_default())?;
        }
        let st = &mut self.locks[lock.idx()];
        st.requested = false;
        st.held = true;
        st.token = true;
        for b in bundled {
            let me = self.me;
            let manager = self.manager_of(b);
            let st = &mut self.locks[b.idx()];
            st.token = true;
            if manager == me && st.tail.node == from {
                st.tail = Tail { node: me, request: None };
            }
            self.stats.lock_tokens_received += 1;
        }
        self.held_locks.push(lock);
        self.note_interval_lock(lock);
        self.pending = Pending::None;
        self.done.push_back(AppDone::Acquired(lock));
        Ok(())
    }
}
