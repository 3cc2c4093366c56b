//! Barriers, with node 0 as the centralized barrier manager.
//!
//! Arrival: a node closes its interval and sends the manager its own intervals the manager has
//! not been sent yet, with its vector timestamp. The manager (whose own arrival is local) waits
//! for all `nprocs` arrivals, incorporates every interval, and answers each node with exactly the
//! intervals newer than the timestamp it arrived with. All arrivals of one episode must name the
//! same barrier id; a node at another barrier is a [`ProtocolError::BarrierMismatch`].
//!
//! The manager also keeps the allocator: its release carries the end of the highest allocation so
//! far, and every node backs the heap below it with memory before it leaves the barrier
//! ([`Node::back_heap`]).

use super::ProtocolError;
use super::ids::{BarrierId, NodeId};
use super::interval::IntervalRecord;
use super::memory::PageMemory;
use super::msg::Message;
use super::node::{AppDone, Node, Pending};
use super::vtime::VectorTime;

/// The manager's view of the barrier episode in progress.
#[derive(Debug, Clone)]
pub struct BarrierEpisode {
    barrier: Option<BarrierId>,
    arrived: Vec<Option<VectorTime>>,
    records: Vec<IntervalRecord>,
    /// Some node asked this barrier to collect.
    gc: bool,
}

impl BarrierEpisode {
    pub(crate) fn new(n: usize) -> Self {
        BarrierEpisode { barrier: None, arrived: vec![None; n], records: Vec::new(), gc: false }
    }
}

impl<M: PageMemory> Node<M> {
    /// The application arrives at `barrier`; completes with [`AppDone::BarrierPassed`].
    pub fn request_barrier(&mut self, barrier: BarrierId) -> Result<(), ProtocolError> {
        if barrier.0 >= self.cfg.nbarriers {
            return Err(ProtocolError::UnknownBarrier { barrier, nbarriers: self.cfg.nbarriers });
        }
        self.begin("barrier")?;
        self.close_interval(true);
        self.push_to_subscribers();
        let mine = self.vt.get(self.me);
        let intervals = (self.sent_to_manager + 1..=mine)
            .map(|i| self.log.get(self.me, i).expect("own interval in log").clone())
            .collect();
        self.sent_to_manager = mine;
        self.pending = Pending::Barrier(barrier);
        self.note_peak();
        // The manager backs what has been allocated while it waits for the others to arrive.
        if let Some(end) = self.allocator.as_ref().map(|a| a.high_water()) {
            self.back_heap(end);
        }
        let msg = Message::BarrierArrive { barrier, vt: self.vt.clone(), intervals, gc: self.wants_gc() };
        self.outbox.push_back((NodeId(0), msg));
        self.deliver_local()
    }

    pub(crate) fn handle_barrier_arrive(
        &mut self,
        from: NodeId,
        barrier: BarrierId,
        vt: VectorTime,
        intervals: Vec<IntervalRecord>,
        gc: bool,
    ) -> Result<(), ProtocolError> {
        if self.me != NodeId(0) || vt.len() != self.nprocs() || self.barrier.arrived[from.idx()].is_some() {
            return Err(ProtocolError::Unexpected { from, what: format!("arrival at {barrier}") });
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
        if ep.arrived.iter().all(Option::is_some) {
            self.complete_barrier(barrier)?;
        }
        Ok(())
    }

    fn complete_barrier(&mut self, barrier: BarrierId) -> Result<(), ProtocolError> {
        let n = self.nprocs();
        let records = std::mem::take(&mut self.barrier.records);
        let arrived = std::mem::replace(&mut self.barrier.arrived, vec![None; n]);
        let gc = std::mem::take(&mut self.barrier.gc);
        self.barrier.barrier = None;
        self.incorporate(self.me, records)?;
        let heap_end = self.allocator.as_ref().map_or(0, |a| a.high_water());
        self.back_heap(heap_end);
        for (i, vt) in arrived.into_iter().enumerate() {
            let to = NodeId(i as u16);
            if to == self.me {
                continue;
            }
            let vt = vt.expect("all arrived");
            let intervals = self.log.newer_than(&vt);
            self.outbox.push_back((to, Message::BarrierRelease { barrier, intervals, gc, heap_end }));
        }
        if gc {
            return self.start_gc(barrier);
        }
        self.finish_barrier(barrier);
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
    ) -> Result<(), ProtocolError> {
        if from != NodeId(0)
            || !matches!(self.pending, Pending::Barrier(b) if b == barrier)
            || self.gc.is_some()
        {
            return Err(ProtocolError::Unexpected { from, what: format!("release of {barrier}") });
        }
        self.incorporate(from, intervals)?;
        self.back_heap(heap_end);
        if gc {
            return self.start_gc(barrier);
        }
        self.finish_barrier(barrier);
        Ok(())
    }
}
