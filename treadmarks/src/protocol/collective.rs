//! Allocation (node 0 keeps the allocator), `distribute` (node 0 broadcasts a value), the exit
//! rendezvous and the ping probe. None of these touch consistency state.
//!
//! Backing allocated memory: every node backs the heap pages below the end of the highest
//! allocation it has heard of with memory (`Node::back_heap`), so that the computation does not
//! pay for their first touch. Node 0 keeps the allocator; the others hear of its end with each
//! distributed value and each barrier release. A node backs only while its application is blocked
//! in a call that waits anyway: node 0 in its own allocation, the others when the distributed
//! value they wait for comes (applications allocate at node 0 and distribute the handles before
//! initializing), and every node at a barrier, as deferred work once its arrival (and its pushes)
//! are sent, passing only once that is done, so that no node leaves the barrier later than the
//! others for it (backing 8,192 pages takes ~9 ms on the 2-vCPU VM). Invariants: pages
//! `0..backed_pages` have been backed; a page is backed at most once (memory freed and allocated
//! again stays backed).

use super::ProtocolError;
use super::ids::{NodeId, PageIdx};
use super::memory::PageMemory;
use super::msg::Message;
use super::node::{AppDone, Node, Pending};

const ROOT: NodeId = NodeId(0);

/// Memory a distributed value takes while it waits for the application's call: its bytes and
/// its entry.
fn queued_size(bytes: &[u8]) -> u64 {
    (bytes.len() + size_of::<(u64, Vec<u8>)>()) as u64
}

/// Largest value [`Node::request_distribute`] sends: a frame holds 64 MiB
/// (`transport::codec::MAX_FRAME`), and a `Distribute` message's other fields take a few bytes.
pub const MAX_DISTRIBUTE: usize = (64 << 20) - 1024;

impl<M: PageMemory> Node<M> {
    /// Allocates `bytes` of shared heap aligned to `align`; completes with
    /// [`AppDone::Allocated`] carrying the heap offset.
    pub fn request_alloc(&mut self, bytes: u64, align: u64) -> Result<(), ProtocolError> {
        self.begin("alloc")?;
        self.pending = Pending::Alloc;
        self.outbox.push_back((ROOT, Message::AllocRequest { bytes, align }));
        self.deliver_local()
    }

    /// Backs the heap pages below byte `heap_end` not backed yet (see the module docs and
    /// [`PageMemory::back`]): applications allocate and initialize before the barrier that starts
    /// their computation, which then finds the pages it reads from other nodes, and those it
    /// writes first, already in memory. Off with `back_heap == false`.
    pub(crate) fn back_heap(&mut self, heap_end: u64) {
        if !self.cfg.back_heap {
            return;
        }
        let end = self.pages_below(heap_end);
        if end > self.backed_pages {
            let count = end - self.backed_pages;
            let mapped = self.mem.back(PageIdx(self.backed_pages), count);
            self.stats.pages_backed += u64::from(count);
            self.stats.pages_backed_mapped += u64::from(mapped);
            self.backed_pages = end;
        }
    }

    /// The heap pages that hold bytes below `heap_end` (at most the whole heap).
    fn pages_below(&self, heap_end: u64) -> u32 {
        let page = self.mem.page_size() as u64;
        heap_end.div_ceil(page).min(u64::from(self.mem.npages())) as u32
    }

    /// Notes that the allocations so far end at `heap_end`.
    pub(crate) fn hear_heap_end(&mut self, heap_end: u64) {
        self.heap_end_heard = self.heap_end_heard.max(heap_end);
    }

    /// True while this node waits at a barrier (not a collecting one) with heap it has heard of
    /// still to back: deferred work ([`Node::run_deferred`]) that holds the barrier's passing.
    pub(crate) fn backing_due(&self) -> bool {
        self.cfg.back_heap
            && matches!(self.pending, Pending::Barrier(_))
            && self.gc.is_none()
            && self.pages_below(self.heap_end_heard) > self.backed_pages
    }

    /// Frees the allocation at heap offset `offset`; completes with [`AppDone::Freed`].
    pub fn request_free(&mut self, offset: u64) -> Result<(), ProtocolError> {
        self.begin("free")?;
        self.pending = Pending::Free;
        self.outbox.push_back((ROOT, Message::FreeRequest { offset }));
        self.deliver_local()
    }

    /// Collective: node 0 passes `Some(bytes)`, the others `None`; every node completes with
    /// [`AppDone::Distributed`] carrying node 0's bytes. Calls pair up in order.
    /// A value larger than [`MAX_DISTRIBUTE`] is refused, nothing sent: no frame would hold it.
    pub fn request_distribute(&mut self, bytes: Option<Vec<u8>>) -> Result<(), ProtocolError> {
        if let Some(b) = bytes.as_ref().filter(|b| b.len() > MAX_DISTRIBUTE) {
            return Err(ProtocolError::DistributeTooLarge { bytes: b.len(), max: MAX_DISTRIBUTE });
        }
        self.begin("distribute")?;
        let seq = self.distribute_seq;
        self.distribute_seq += 1;
        if self.me == ROOT {
            for wait in &mut self.distribute_waits {
                *wait = wait.filter(|&s| s > seq);
            }
            let bytes = bytes.unwrap_or_default();
            let heap_end = self.allocator.as_ref().map_or(0, |a| a.high_water());
            for n in 1..self.cfg.nprocs {
                let msg =
                    Message::Distribute { seq, bytes: serde_bytes::ByteBuf::from(bytes.clone()), heap_end };
                self.outbox.push_back((NodeId(n), msg));
            }
            self.done.push_back(AppDone::Distributed(bytes));
        } else if self.distributed.front().is_some_and(|(s, _)| *s == seq) {
            let (_, bytes) = self.distributed.pop_front().expect("checked");
            self.distributed_bytes -= queued_size(&bytes);
            self.back_heap(self.heap_end_heard);
            self.done.push_back(AppDone::Distributed(bytes));
        } else {
            self.pending = Pending::Distribute(seq);
            self.outbox.push_back((ROOT, Message::DistributeWait { seq }));
        }
        Ok(())
    }

    /// At node 0, about to wait in a barrier or exit (`root`, what it is in): an error if
    /// some node waits for a value node 0 has not distributed, which it now never would.
    pub(crate) fn check_distribute_waits(&self, root: impl FnOnce() -> String) -> Result<(), ProtocolError> {
        let unsent = |(n, w): (usize, &Option<u64>)| w.filter(|&v| v >= self.distribute_seq).map(|v| (n, v));
        match self.distribute_waits.iter().enumerate().find_map(unsent) {
            Some((n, value)) => {
                Err(ProtocolError::DistributeUnanswered { waiting: NodeId(n as u16), value, root: root() })
            }
            None => Ok(()),
        }
    }

    /// The application is done; completes with [`AppDone::Exited`] once every node is done.
    pub fn request_exit(&mut self) -> Result<(), ProtocolError> {
        self.begin("exit")?;
        // A lock held at exit would keep everybody who asks for it next waiting forever.
        if let Some(&lock) = self.held_locks.first() {
            return Err(ProtocolError::ExitHolding { lock });
        }
        if self.me == ROOT {
            self.check_distribute_waits(|| "in exit".into())?;
        }
        if let Some(&(seq, _)) = self.distributed.front() {
            let n = self.distributed.len();
            self.warnings.push_back(format!(
                "exiting with {n} distributed value{} from value {seq} on never taken: every distribute \
                 call on node 0 pairs with one on every node",
                if n == 1 { "" } else { "s" }
            ));
        }
        self.pending = Pending::Exit;
        self.outbox.push_back((ROOT, Message::ExitArrive));
        self.deliver_local()
    }

    /// Round trip to `peer` through both runtimes; completes with [`AppDone::Pong`].
    pub fn request_ping(&mut self, peer: NodeId) -> Result<(), ProtocolError> {
        if peer.idx() >= self.nprocs() {
            return Err(ProtocolError::UnknownNode { node: peer.0.into(), nprocs: self.cfg.nprocs });
        }
        self.begin("ping")?;
        self.pending = Pending::Ping(peer);
        self.outbox.push_back((peer, Message::Ping { token: self.distribute_seq }));
        self.deliver_local()
    }

    pub(crate) fn handle_collective(&mut self, from: NodeId, msg: Message) -> Result<(), ProtocolError> {
        let unexpected = |what: &str| ProtocolError::Unexpected { from, what: what.to_string() };
        match msg {
            Message::AllocRequest { bytes, align } => {
                let alloc = self.allocator.as_mut().ok_or_else(|| unexpected("alloc request"))?;
                let result = alloc.alloc(bytes, align);
                let end = alloc.high_water();
                self.hear_heap_end(end);
                if from == self.me {
                    // Our own application waits in this allocation: back it now, before the
                    // application initializes it.
                    self.back_heap(end);
                }
                self.outbox.push_back((from, Message::AllocReply { result }));
            }
            Message::FreeRequest { offset } => {
                let alloc = self.allocator.as_mut().ok_or_else(|| unexpected("free request"))?;
                let result = alloc.free(offset);
                self.outbox.push_back((from, Message::FreeReply { result }));
            }
            // Replies to the allocator's clients, and the exit's release, come from node 0
            // alone: one from anybody else would complete the call with made-up values.
            Message::AllocReply { .. } | Message::FreeReply { .. } | Message::ExitRelease if from != ROOT => {
                let what = match msg {
                    Message::AllocReply { .. } => "alloc reply",
                    Message::FreeReply { .. } => "free reply",
                    _ => "exit release",
                };
                return Err(unexpected(&format!("{what} (only node 0 sends one)")));
            }
            Message::AllocReply { result } => {
                self.complete(|p| matches!(p, Pending::Alloc), AppDone::Allocated(result))
                    .ok_or_else(|| unexpected("alloc reply"))?;
            }
            Message::FreeReply { result } => {
                self.complete(|p| matches!(p, Pending::Free), AppDone::Freed(result))
                    .ok_or_else(|| unexpected("free reply"))?;
            }
            Message::Distribute { seq, bytes, heap_end } => {
                // Node 0 sends the values in order, one per call: the next one due is the one
                // our application waits for, or follows those queued.
                let waiting = u64::from(matches!(self.pending, Pending::Distribute(_)));
                let due = self.distribute_seq - waiting + self.distributed.len() as u64;
                if from != ROOT || seq != due {
                    return Err(ProtocolError::Unexpected {
                        from,
                        what: format!("distribute of value {seq} (value {due} is due)"),
                    });
                }
                self.hear_heap_end(heap_end);
                let bytes = bytes.into_vec();
                if matches!(self.pending, Pending::Distribute(s) if s == seq) {
                    // The application waits for this value (typically the handles of what node
                    // 0 just allocated): back the heap now, before it initializes its part.
                    self.back_heap(self.heap_end_heard);
                    self.pending = Pending::None;
                    self.done.push_back(AppDone::Distributed(bytes));
                } else {
                    // Node 0 does not wait for the others to take its values: they queue here,
                    // bounded as a peer's continued replies are. A program whose node 0 runs
                    // that far ahead (or a faulty node 0) fails, saying so, instead of growing
                    // this node's memory without end.
                    let held = self.distributed_bytes + queued_size(&bytes);
                    let limit = super::gc::Accounting::parts_limit(self.cfg.consistency_limit);
                    if held > limit {
                        return Err(ProtocolError::DistributeBacklog { value: seq, held, limit });
                    }
                    self.distributed_bytes = held;
                    self.distributed.push_back((seq, bytes));
                }
            }
            Message::ExitArrive => {
                if self.me != ROOT || std::mem::replace(&mut self.exit_arrived[from.idx()], true) {
                    return Err(unexpected("exit arrival"));
                }
                if let Some((barrier, waiting)) = self.open_barrier() {
                    return Err(ProtocolError::ExitAtBarrier { exited: from, waiting, barrier });
                }
                if self.exit_arrived.iter().all(|&a| a) {
                    for n in 1..self.cfg.nprocs {
                        self.outbox.push_back((NodeId(n), Message::ExitRelease));
                    }
                    self.complete(|p| matches!(p, Pending::Exit), AppDone::Exited)
                        .ok_or_else(|| unexpected("exit arrival (node 0 is not in exit)"))?;
                }
            }
            Message::DistributeWait { seq } => {
                if self.me != ROOT || from == ROOT {
                    return Err(unexpected("distribute wait"));
                }
                // Asked before the value reached it: answered already.
                if seq < self.distribute_seq {
                    return Ok(());
                }
                self.distribute_waits[from.idx()] = Some(seq);
                // At a barrier it has arrived at and not released (released, node 0 is on its way
                // out of it: the waiting node passed it first, and others may have arrived at the
                // next barrier already), or in exit.
                let root = match self.pending {
                    Pending::Barrier(b) if self.arrived_at_open_barrier(ROOT) => Some(format!("at {b}")),
                    Pending::Exit => Some("in exit".into()),
                    _ => None,
                };
                if let Some(root) = root {
                    return Err(ProtocolError::DistributeUnanswered { waiting: from, value: seq, root });
                }
            }
            Message::ExitRelease => {
                self.complete(|p| matches!(p, Pending::Exit), AppDone::Exited)
                    .ok_or_else(|| unexpected("exit release"))?;
            }
            Message::Abort { reason } => return Err(ProtocolError::Aborted { from, reason }),
            Message::Ping { token } => self.outbox.push_back((from, Message::Pong { token })),
            Message::Pong { .. } => {
                self.complete(|p| matches!(p, Pending::Ping(n) if *n == from), AppDone::Pong(from))
                    .ok_or_else(|| unexpected("pong"))?;
            }
            other => return Err(unexpected(&format!("{:?} message", other.kind()))),
        }
        Ok(())
    }

    /// Completes the pending request if `is` matches it.
    fn complete(&mut self, is: impl Fn(&Pending) -> bool, done: AppDone) -> Option<()> {
        if !is(&self.pending) {
            return None;
        }
        self.pending = Pending::None;
        self.done.push_back(done);
        Some(())
    }
}
