//! Barriers, with node 0 as the centralized barrier manager.
//!
//! Arrival: a node closes its interval and sends the manager its own intervals the manager has
//! not been sent yet, with its vector timestamp. The manager (whose own arrival is local) waits
//! for all `nprocs` arrivals, incorporates every interval, and answers each node with exactly the
//! intervals newer than the timestamp it arrived with. All arrivals of one episode must name the
//! same barrier id; a node at another barrier is a [`ProtocolError::BarrierMismatch`].
//!
//! Pushes (`push.rs`) leave *after* the arrival: a node decides at its arrival which subscribers
//! it pushes to and names them in the arrival, which goes out at once; it cuts and sends the
//! pushes afterwards ([`Node::run_deferred`]), while the arrival travels and the manager handles
//! it. The manager tells each node, in its release, who pushes to it. A node passes the barrier
//! once it has the release (or, the manager, every arrival), every push announced to it, and has
//! sent its own pushes, so a push is in hand before the application can touch its pages, as when
//! pushes went out before the arrival. A collecting barrier waits for no push: collections drop
//! pushes. Pages whose notices the release brings and that an announced push may complete stay
//! valid until the pushes are in, and passing applies the pushes in place (`push.rs`).
//!
//! The manager logs the intervals of a completed episode at once, for its releases, but applies
//! their write notices to its own pages (cutting twins, invalidating) only after the releases are
//! sent, as deferred work, when they name many pages: its invalidations then overlap the other
//! nodes' (fft at 2 nodes invalidates 2,048 pages at each end of a transpose's barrier). Its
//! application is blocked until it passes, which waits for them.
//!
//! The manager also keeps the allocator: its release carries the end of the highest allocation so
//! far. Every node backs the heap below the end it has heard of with memory while it waits at the
//! barrier, as deferred work, and passes the barrier only once that is done (`collective.rs`).

use super::ProtocolError;
use super::ids::{BarrierId, NodeId};
use super::interval::IntervalRecord;
use super::memory::PageMemory;
use super::msg::Message;
use super::node::{AppDone, Node, Pending};
use super::vtime::VectorTime;

/// Fewest write notices in a barrier episode whose application the manager defers until its
/// releases are sent (see the module docs): SOR's and Jacobi's 16 or so pages cost less to
/// invalidate (~1-3 µs each) than the manager's resumption loses to the deferral (10-20 µs).
pub(crate) const DEFER_NOTICES_MIN: usize = 64;

/// The manager's view of the barrier episode in progress.
#[derive(Debug, Clone)]
pub struct BarrierEpisode {
    barrier: Option<BarrierId>,
    arrived: Vec<Option<VectorTime>>,
    records: Vec<IntervalRecord>,
    /// Some node asked this barrier to collect.
    gc: bool,
    /// `pushed_by[n]`: the nodes that announced a push to node `n`.
    pushed_by: Vec<Vec<NodeId>>,
}

impl BarrierEpisode {
    pub(crate) fn new(n: usize) -> Self {
        BarrierEpisode {
            barrier: None,
            arrived: vec![None; n],
            records: Vec::new(),
            gc: false,
            pushed_by: vec![Vec::new(); n],
        }
    }
}

/// A barrier this node may pass once the pushes announced to it have come and its own are sent.
#[derive(Debug, Clone)]
pub(crate) struct Passing {
    barrier: BarrierId,
    /// Announced pushers whose push has not come yet.
    waiting: Vec<NodeId>,
}

impl<M: PageMemory> Node<M> {
    /// The application arrives at `barrier`; completes with [`AppDone::BarrierPassed`].
    pub fn request_barrier(&mut self, barrier: BarrierId) -> Result<(), ProtocolError> {
        if barrier.0 >= self.cfg.nbarriers {
            return Err(ProtocolError::UnknownBarrier { barrier, nbarriers: self.cfg.nbarriers });
        }
        self.begin("barrier")?;
        if self.me == NodeId(0) {
            self.check_distribute_waits(|| format!("at {barrier}"))?;
        }
        self.close_interval(true);
        let pushes = self.plan_push();
        let mine = self.vt.get(self.me);
        let intervals = (self.sent_to_manager + 1..=mine)
            .map(|i| self.log.get(self.me, i).expect("own interval in log").clone())
            .collect();
        self.sent_to_manager = mine;
        self.pending = Pending::Barrier(barrier);
        self.note_peak();
        // Backed while this node waits (`run_deferred`), once its arrival is on its way.
        if let Some(end) = self.allocator.as_ref().map(|a| a.high_water()) {
            self.hear_heap_end(end);
        }
        let msg =
            Message::BarrierArrive { barrier, vt: self.vt.clone(), intervals, gc: self.wants_gc(), pushes };
        self.send_with_records(NodeId(0), msg);
        self.deliver_local()
    }

    /// Work left for after this node's messages are on their way: the pushes planned at its
    /// barrier arrival, the write notices of a big episode the manager released, and backing the
    /// heap it has heard of while it waits there. The runtime calls [`Node::run_deferred`] once
    /// it has sent them.
    pub fn has_deferred(&self) -> bool {
        self.push_planned() || !self.notices_due.is_empty() || self.backing_due()
    }

    /// Cuts and queues the pushes planned at this node's barrier arrival, applies the write
    /// notices of a barrier the manager released, then backs the heap (the pushes first: other
    /// nodes wait for them), then passes the barrier if nothing else holds it.
    pub fn run_deferred(&mut self) -> Result<(), ProtocolError> {
        if !self.has_deferred() {
            return Ok(());
        }
        if self.push_planned() {
            self.send_planned_push();
        }
        let notices = std::mem::take(&mut self.notices_due);
        self.apply_notices(notices);
        if self.backing_due() {
            self.back_heap(self.heap_end_heard);
        }
        self.try_pass()
    }

    pub(crate) fn handle_barrier_arrive(
        &mut self,
        from: NodeId,
        barrier: BarrierId,
        vt: VectorTime,
        intervals: Vec<IntervalRecord>,
        gc: bool,
        pushes: Vec<NodeId>,
    ) -> Result<(), ProtocolError> {
        if barrier.0 >= self.cfg.nbarriers {
            return Err(ProtocolError::Unexpected {
                from,
                what: format!("arrival at {barrier} (this job has {} barriers)", self.cfg.nbarriers),
            });
        }
        if self.me != NodeId(0) || vt.len() != self.nprocs() || self.barrier.arrived[from.idx()].is_some() {
            return Err(ProtocolError::Unexpected { from, what: format!("arrival at {barrier}") });
        }
        if let Some(bad) = pushes.iter().find(|n| n.idx() >= self.nprocs() || **n == from) {
            return Err(ProtocolError::Unexpected {
                from,
                what: format!("arrival announcing a push to {bad}"),
            });
        }
        // A node sends its own intervals, oldest first: checked now, so that a bad one is its
        // sender's error, not the last arriver's when the episode completes.
        if let Some(r) = intervals.iter().find(|r| r.node != from) {
            return Err(ProtocolError::Unexpected {
                from,
                what: format!("arrival carrying an interval of {}", r.node),
            });
        }
        self.check_records(from, &intervals)?;
        if let Some(exited) = self.exit_arrived.iter().position(|&e| e) {
            return Err(ProtocolError::ExitAtBarrier {
                exited: NodeId(exited as u16),
                waiting: from,
                barrier,
            });
        }
        let ep = &mut self.barrier;
        match ep.barrier {
            Some(expected) if expected != barrier => {
                return Err(ProtocolError::BarrierMismatch { node: from, expected, got: barrier });
            }
            _ => ep.barrier = Some(barrier),
        }
        ep.arrived[from.idx()] = Some(vt);
        ep.records.extend(intervals);
        ep.gc |= gc;
        for to in pushes {
            if !ep.pushed_by[to.idx()].contains(&from) {
                ep.pushed_by[to.idx()].push(from);
            }
        }
        if ep.arrived.iter().all(Option::is_some) {
            self.complete_barrier(barrier)?;
        }
        Ok(())
    }

    /// Whether node `n` waits at the episode open at the manager (this node).
    pub(crate) fn arrived_at_open_barrier(&self, n: NodeId) -> bool {
        self.barrier.arrived[n.idx()].is_some()
    }

    /// The barrier an episode is open at (at the manager), and the first node waiting there.
    pub(crate) fn open_barrier(&self) -> Option<(BarrierId, NodeId)> {
        let waiting = self.barrier.arrived.iter().position(Option::is_some)?;
        Some((self.barrier.barrier?, NodeId(waiting as u16)))
    }

    fn complete_barrier(&mut self, barrier: BarrierId) -> Result<(), ProtocolError> {
        let n = self.nprocs();
        let records = std::mem::take(&mut self.barrier.records);
        let arrived = std::mem::replace(&mut self.barrier.arrived, vec![None; n]);
        let mut pushed_by = std::mem::replace(&mut self.barrier.pushed_by, vec![Vec::new(); n]);
        let gc = std::mem::take(&mut self.barrier.gc);
        self.barrier.barrier = None;
        // The records are logged now, for the releases; their notices are applied here only
        // once the releases are on their way (`run_deferred`), so that invalidating the pages the
        // others wrote overlaps their own taking in of the release. Worth it only for many pages:
        // the deferral costs the manager's own resumption a turn of the runtime's loop.
        let notices: usize = records.iter().filter(|r| r.node != self.me).map(|r| r.pages.len()).sum();
        let new = self.log_records(self.me, records)?;
        if !gc {
            self.expect_pushes(pushed_by[self.me.idx()].clone());
        }
        if gc || notices < self.cfg.limits.defer_notices_min {
            self.apply_notices(new);
        } else {
            self.notices_due = new;
        }
        let heap_end = self.allocator.as_ref().map_or(0, |a| a.high_water());
        self.hear_heap_end(heap_end);
        for (i, vt) in arrived.into_iter().enumerate() {
            let to = NodeId(i as u16);
            if to == self.me {
                continue;
            }
            let vt = vt.expect("all arrived");
            let intervals = self.log.newer_than(&vt);
            let pushed_by = std::mem::take(&mut pushed_by[i]);
            self.send_with_records(
                to,
                Message::BarrierRelease { barrier, intervals, gc, heap_end, pushed_by },
            );
        }
        if gc {
            return self.start_gc(barrier);
        }
        let mine = std::mem::take(&mut pushed_by[self.me.idx()]);
        self.enter_passing(barrier, mine)
    }

    /// Released from `barrier`: passes it once `pushed_by` have pushed and our pushes are sent.
    fn enter_passing(&mut self, barrier: BarrierId, pushed_by: Vec<NodeId>) -> Result<(), ProtocolError> {
        let episode = self.stats.barriers + 1;
        let waiting = pushed_by.into_iter().filter(|&n| !self.push_arrived(episode, n)).collect();
        self.passing = Some(Passing { barrier, waiting });
        self.try_pass()
    }

    /// A push of barrier episode `episode` came from `from`: one less to wait for.
    pub(crate) fn note_push_for_passing(&mut self, from: NodeId, episode: u64) -> Result<(), ProtocolError> {
        if episode != self.stats.barriers + 1 {
            return Ok(());
        }
        if let Some(p) = &mut self.passing {
            p.waiting.retain(|&n| n != from);
            return self.try_pass();
        }
        Ok(())
    }

    /// Passes the barrier being passed, if nothing holds it any more.
    fn try_pass(&mut self) -> Result<(), ProtocolError> {
        let ready = self.passing.as_ref().is_some_and(|p| p.waiting.is_empty())
            && !self.push_planned()
            && self.notices_due.is_empty()
            && !self.backing_due();
        if ready {
            let Passing { barrier, .. } = self.passing.take().expect("checked");
            self.settle_deferred()?;
            self.finish_barrier(barrier);
        }
        Ok(())
    }

    pub(crate) fn finish_barrier(&mut self, barrier: BarrierId) {
        self.stats.barriers += 1;
        self.sweep_pushed();
        self.pending = Pending::None;
        self.done.push_back(AppDone::BarrierPassed(barrier));
    }

    pub(crate) fn handle_barrier_release(
        &mut self,
        from: NodeId,
        barrier: BarrierId,
        intervals: Vec<IntervalRecord>,
        gc: bool,
        heap_end: u64,
        pushed_by: Vec<NodeId>,
    ) -> Result<(), ProtocolError> {
        if from != NodeId(0)
            || !matches!(self.pending, Pending::Barrier(b) if b == barrier)
            || self.gc.is_some()
            || self.passing.is_some()
        {
            return Err(ProtocolError::Unexpected { from, what: format!("release of {barrier}") });
        }
        if let Some(bad) = pushed_by.iter().find(|n| n.idx() >= self.nprocs() || **n == self.me) {
            return Err(ProtocolError::Unexpected {
                from,
                what: format!("release naming a push from {bad}"),
            });
        }
        // Each pusher once: the list is scanned for every page the release invalidates.
        if (1..pushed_by.len()).any(|i| pushed_by[..i].contains(&pushed_by[i])) {
            return Err(ProtocolError::Unexpected {
                from,
                what: format!("release naming a pusher twice: {pushed_by:?}"),
            });
        }
        if !gc {
            self.expect_pushes(pushed_by.clone());
        }
        self.incorporate(from, intervals)?;
        self.hear_heap_end(heap_end);
        if gc {
            return self.start_gc(barrier);
        }
        self.enter_passing(barrier, pushed_by)
    }
}
