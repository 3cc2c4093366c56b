//! Locks: a static manager per lock (`lock % nprocs`), requests forwarded along the
//! last-requester chain, grants straight from releaser to acquirer carrying every interval the
//! acquirer lacks.
//!
//! # Lock state (per node, per lock)
//! - `token`: this node was the lock's last holder and has not passed it on. Initially the
//!   manager has every token it manages. Re-acquiring a lock whose token we have costs no message.
//! - `held`: the application holds the lock (implies `token`).
//! - `requested`: we asked for the lock and wait for its grant.
//! - `next`: the node that asked for the lock after us (forwarded by the manager); we grant to it
//!   at our release, or at once if we have the token and do not hold the lock.
//! - `last_requester` (manager only): the node the manager forwards the next request to. The
//!   chain of forwards gives every requester at most one successor, so `next` is a single slot.

use super::ProtocolError;
use super::ids::{IntervalIdx, LockId, NodeId, PageIdx};
use super::interval::IntervalRecord;
use super::memory::PageMemory;
use super::msg::{DiffWire, Message, PageDiffs};
use super::node::{AppDone, Node, Pending};
use super::vtime::VectorTime;

/// One lock as one node sees it.
#[derive(Clone, Debug)]
pub struct LockState {
    pub id: LockId,
    pub held: bool,
    pub token: bool,
    pub requested: bool,
    pub next: Option<(NodeId, VectorTime)>,
    /// Meaningful on the lock's manager only.
    pub last_requester: NodeId,
}

impl LockState {
    pub(crate) fn new(id: LockId, me: NodeId, nprocs: u16) -> Self {
        let manager = NodeId((id.0 % u32::from(nprocs)) as u16);
        LockState {
            id,
            held: false,
            token: manager == me,
            requested: false,
            next: None,
            last_requester: manager,
        }
    }
}

/// Most diff bytes one lock grant carries.
pub const PIGGYBACK_LIMIT: usize = 64 << 10;

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

    /// The application acquires `lock`; completes with [`AppDone::Acquired`].
    pub fn request_acquire(&mut self, lock: LockId) -> Result<(), ProtocolError> {
        self.check_lock(lock)?;
        self.begin("acquire")?;
        self.warn_if_collection_overdue();
        let st = &mut self.locks[lock.idx()];
        if st.held {
            return Err(ProtocolError::AlreadyHeld { lock });
        }
        if st.token {
            st.held = true;
            self.stats.lock_acquires_local += 1;
            self.interval_locks.push(lock);
            self.done.push_back(AppDone::Acquired(lock));
            return Ok(());
        }
        st.requested = true;
        self.stats.lock_acquires_remote += 1;
        self.pending = Pending::Acquire(lock);
        let msg = Message::LockRequest { lock, vt: self.vt.clone() };
        self.outbox.push_back((self.manager_of(lock), msg));
        self.deliver_local()
    }

    /// The application releases `lock`: ends the interval, and passes the lock on if somebody
    /// asked for it.
    pub fn request_release(&mut self, lock: LockId) -> Result<(), ProtocolError> {
        self.check_lock(lock)?;
        self.begin("release")?;
        if !self.locks[lock.idx()].held {
            return Err(ProtocolError::NotHeld { lock });
        }
        self.locks[lock.idx()].held = false;
        // Releases do not wait for the runtime: the application may be writing already.
        self.close_interval(false);
        if let Some((to, vt)) = self.locks[lock.idx()].next.take() {
            self.grant(lock, to, &vt);
        }
        self.deliver_local()
    }

    fn grant(&mut self, lock: LockId, to: NodeId, vt: &VectorTime) {
        self.locks[lock.idx()].token = false;
        let intervals = self.log.newer_than(vt);
        let diffs = self.diffs_for_grant(lock, vt, &intervals);
        self.outbox.push_back((to, Message::LockGrant { lock, intervals, diffs }));
    }

    /// The diffs a grant carries: for each page we began writing (made its twin) in an interval
    /// the acquirer lacks and in which we held this lock — the data the lock protects, most
    /// likely what the acquirer reads next — every diff of ours made after the acquirer's
    /// knowledge of us, cutting the twin if need be (the acquirer needs all of them to consider
    /// the page complete). Pages that were merely still twinned from before are not sent.
    /// Bounded by [`PIGGYBACK_LIMIT`] bytes; beyond it the acquirer fetches as usual.
    fn diffs_for_grant(
        &mut self,
        lock: LockId,
        vt: &VectorTime,
        intervals: &[IntervalRecord],
    ) -> Vec<PageDiffs> {
        let held: Vec<&IntervalRecord> =
            intervals.iter().filter(|r| r.node == self.me && r.locks.contains(&lock)).collect();
        let began_under_lock = |first: IntervalIdx| held.iter().any(|r| r.index == first);
        let mut pages: Vec<PageIdx> = held.iter().flat_map(|r| r.pages.iter().copied()).collect();
        pages.sort_unstable();
        pages.dedup();
        pages.retain(|p| {
            let meta = &self.pages[p.idx()];
            meta.twin.is_some_and(began_under_lock) || meta.diffs.iter().any(|d| began_under_lock(d.first))
        });
        let known = vt.get(self.me);
        let closed = self.vt.get(self.me);
        let mut out = Vec::new();
        let mut bytes = 0;
        for p in pages {
            let page = self.serve_diffs(p, closed, 0);
            let diffs: Vec<DiffWire> =
                page.diffs.into_iter().filter(|d| d.first_vt.get(self.me) > known).collect();
            bytes += diffs.iter().map(|d| d.diff.encoded_len()).sum::<usize>();
            if bytes > PIGGYBACK_LIMIT {
                break;
            }
            self.stats.diffs_piggybacked += diffs.len() as u64;
            out.push(PageDiffs { page: p, diffs });
        }
        out
    }

    pub(crate) fn handle_lock_request(
        &mut self,
        from: NodeId,
        lock: LockId,
        vt: VectorTime,
    ) -> Result<(), ProtocolError> {
        self.check_lock(lock)?;
        let bad = |what: &str| ProtocolError::Unexpected { from, what: format!("{what} for {lock}") };
        if self.manager_of(lock) != self.me || vt.len() != self.nprocs() {
            return Err(bad("lock request"));
        }
        let last = std::mem::replace(&mut self.locks[lock.idx()].last_requester, from);
        if last == from {
            return Err(bad("second lock request without a grant in between"));
        }
        self.outbox.push_back((last, Message::LockForward { lock, requester: from, vt }));
        Ok(())
    }

    pub(crate) fn handle_lock_forward(
        &mut self,
        from: NodeId,
        lock: LockId,
        requester: NodeId,
        vt: VectorTime,
    ) -> Result<(), ProtocolError> {
        self.check_lock(lock)?;
        let bad = |what: &str| ProtocolError::Unexpected { from, what: format!("{what} of {lock}") };
        if from != self.manager_of(lock) || requester.idx() >= self.nprocs() || vt.len() != self.nprocs() {
            return Err(bad("lock forward"));
        }
        let st = &mut self.locks[lock.idx()];
        if st.token && !st.held {
            self.grant(lock, requester, &vt);
        } else if (st.held || st.requested) && st.next.is_none() {
            st.next = Some((requester, vt));
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
        diffs: Vec<PageDiffs>,
    ) -> Result<(), ProtocolError> {
        self.check_lock(lock)?;
        if !matches!(self.pending, Pending::Acquire(l) if l == lock) || !self.locks[lock.idx()].requested {
            return Err(ProtocolError::Unexpected { from, what: format!("grant of {lock}") });
        }
        for d in &diffs {
            self.check_page(from, d.page)?;
        }
        // A piggybacked page can be completed only if we were up to date with the granter on it
        // before the grant (then its diffs made after our knowledge of it are all we lack).
        let up_to_date: Vec<bool> = diffs
            .iter()
            .map(|d| self.pages[d.page.idx()].writers.get(from.idx()).is_none_or(|w| w.applied >= w.noticed))
            .collect();
        self.incorporate(from, intervals)?;
        for (d, ok) in diffs.into_iter().zip(up_to_date) {
            if ok {
                self.apply_piggybacked(from, d)?;
            }
        }
        let st = &mut self.locks[lock.idx()];
        st.requested = false;
        st.held = true;
        st.token = true;
        self.interval_locks.push(lock);
        self.pending = Pending::None;
        self.done.push_back(AppDone::Acquired(lock));
        Ok(())
    }
}
