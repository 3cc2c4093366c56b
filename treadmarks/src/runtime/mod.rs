//! The runtime: where the protocol core, the memory layer and the transport meet.
//!
//! ```text
//!  application thread                         service thread (tokio, current-thread)
//!  ──────────────────                         ──────────────────────────────────────
//!  Tmk::barrier / alloc / remote lock ──cmd──► Mailbox ─┐
//!  page fault (signal handler) ──fault slot──► Doorbell ┼─► protocol::Node ──► Links (TCP)
//!        blocks on the app eventfd ◄──wake──── replies ◄┘   ▲     ▲
//!  release, local acquire / validation ───── (mutex) ───────┘     └── peers
//! ```
//! The node sits behind a mutex ([`SharedNode`]). An operation that needs no message — a
//! release, an acquire whose token is here, a view validation whose diffs were all pushed to us
//! or that only twins ahead — the application thread runs on the node itself (and rings the
//! service thread only if it queued a message, such as a grant), which saves two context
//! switches per operation: Water takes ~9,500 such locks per node, SOR validates ~2,000 views
//! from pushed diffs. Anything that waits for a peer goes to the service thread as a command,
//! in program order (the application waits for every command's reply, so none is queued when it
//! runs an operation itself).
//!
//! With one node there is nobody to talk to: the node runs on the application thread
//! ([`Engine::Local`]) and nothing is protected, so nothing faults.

#![forbid(unsafe_code)]

pub(crate) mod launch;
pub(crate) mod service;

use crate::error::{Error, Result};
use crate::mem::{Doorbell, Heap, HeapPages};
use crate::protocol::{AppDone, BarrierId, LockId, Node, NodeId, PageIdx, ProtocolError};
use crate::stats::Stats;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

/// The node of a multi-node job, shared by its service and application threads.
pub(crate) type SharedNode = Arc<Mutex<Node<HeapPages>>>;

/// Locks `node` and reports to it the twins the fault handler made since the last step (so it
/// knows every writable page before it closes an interval or serves a diff). The ring of twins
/// has one consumer at a time: whoever holds this lock.
pub(crate) fn lock_node<'a>(
    heap: &Heap,
    node: &'a Mutex<Node<HeapPages>>,
) -> MutexGuard<'a, Node<HeapPages>> {
    let mut node = node.lock().expect("a thread panicked holding the node");
    heap.drain_fast_twins(|p| node.handle_twin_made(p));
    node
}

/// An application request to the node.
#[derive(Debug)]
pub(crate) enum Command {
    Acquire(LockId),
    Release(LockId),
    Barrier(BarrierId),
    /// A barrier that collects consistency data whatever the threshold says.
    Collect(BarrierId),
    Alloc {
        bytes: u64,
        align: u64,
    },
    Free(u64),
    Distribute(Option<Vec<u8>>),
    Exit,
    Ping(NodeId),
    /// Bring these pages up to date (a view is about to be used); with `write`, twin them ahead
    /// of the writes too. The pages of `whole` (only with `write`) are about to be overwritten
    /// entirely: not fetched if stale (`Node::request_overwrite`).
    Validate {
        pages: Vec<PageIdx>,
        write: bool,
        whole: Vec<PageIdx>,
        /// The view may stream (`protocol/stream.rs`).
        stream: bool,
        /// Another mutable view is open (`Node::set_mutable_views_open`).
        views_open: bool,
    },
    /// Wait for the completion of the request the application thread started itself (a view's
    /// validation that [`Node::overwrites_locally`] said would complete there) and that asked a
    /// peer after all, as for a command's: answered with the completion, or with the job's
    /// failure. The simulation checks that it never happens; this keeps it sound if it does.
    AwaitStarted,
    Stats,
    /// Stop the service thread (the application left without [`crate::Tmk::exit`], after an
    /// error or a panic, or its exit failed): tell the peers `why`, flush what is queued, notably
    /// abort messages, then answer.
    Shutdown {
        why: String,
    },
}

/// The answer to a [`Command`].
#[derive(Debug)]
pub(crate) enum Reply {
    Done(AppDone),
    Released,
    Stats(Box<Stats>),
    /// The exit completed: every node called it. With the node's final statistics.
    Exited(Box<Stats>),
    ShutDown,
}

/// `base` with the node's protocol statistics and consistency data now (the peak noted first:
/// it is noted at points of the protocol, and the snapshot's own value counts too).
pub(crate) fn node_snapshot(base: &Stats, node: &mut Node<HeapPages>) -> Stats {
    let mut s = base.clone();
    node.note_peak();
    s.protocol = node.stats().clone();
    s.consistency_bytes = node.consistency_bytes();
    s
}

/// Starts `cmd` on `node`. Returns `Some` for a command that needs no completion (release);
/// every other command completes through [`Node::poll_done`], possibly at once.
pub(crate) fn start(
    node: &mut Node<HeapPages>,
    cmd: Command,
) -> std::result::Result<Option<Reply>, ProtocolError> {
    match cmd {
        Command::Acquire(l) => node.request_acquire(l)?,
        Command::Release(l) => {
            node.request_release(l)?;
            return Ok(Some(Reply::Released));
        }
        Command::Barrier(b) => node.request_barrier(b)?,
        Command::Collect(b) => node.request_collect(b)?,
        Command::Alloc { bytes, align } => node.request_alloc(bytes, align)?,
        Command::Free(offset) => node.request_free(offset)?,
        Command::Distribute(bytes) => node.request_distribute(bytes)?,
        Command::Exit => node.request_exit()?,
        Command::Ping(peer) => node.request_ping(peer)?,
        Command::Validate { pages, write, whole, stream, views_open } => {
            node.set_mutable_views_open(views_open);
            node.request_view(&pages, write, &whole, stream)?
        }
        Command::AwaitStarted | Command::Stats | Command::Shutdown { .. } => {
            unreachable!("answered by the service thread itself")
        }
    }
    Ok(None)
}

/// The app-thread ↔ service-thread hand-off for commands (faults use the doorbell's slot).
/// Commands queue in program order; all but releases wait for their reply, so at most one
/// command awaits a reply at a time, and it is the last in the queue.
#[derive(Debug)]
pub(crate) struct Mailbox {
    pub command: Mutex<std::collections::VecDeque<Command>>,
    pub reply: Mutex<Option<Result<Reply>>>,
    pub doorbell: Arc<Doorbell>,
    /// The job failed (set by the service thread): the application stops running operations
    /// itself, so its next call gets the error from the service thread.
    pub failed: AtomicBool,
    /// Counted by the application thread: lock operations and view validations it ran itself,
    /// commands it posted.
    pub lock_ops_here: AtomicU64,
    pub validations_here: AtomicU64,
    pub commands: AtomicU64,
}

/// Where this node's protocol runs.
#[derive(Debug)]
pub(crate) enum Engine {
    /// One-node job: on the application thread (`heap`: the node's, for `Heap::app_inside`).
    Local { node: Box<Node<HeapPages>>, stats: Box<Stats>, heap: Arc<Heap> },
    /// On the service thread, but for the lock operations and validations that need no message.
    Remote { mailbox: Arc<Mailbox>, node: SharedNode, heap: Arc<Heap>, service: Option<JoinHandle<()>> },
}

impl Engine {
    /// Acquires `lock` on the application thread if its token is here (no message, nothing to
    /// wait for), and returns whether it did; false in a one-node job (where [`Engine::call`]
    /// does it).
    pub fn acquire_here(&mut self, lock: LockId) -> Result<bool> {
        match self {
            Engine::Local { .. } => Ok(false),
            Engine::Remote { mailbox, node, heap, .. } => {
                Self::lock_op_here(mailbox, node, heap, |node| node.acquire_if_here(lock))
            }
        }
    }

    /// Runs `cmd` to completion.
    pub fn call(&mut self, cmd: Command) -> Result<Reply> {
        match self {
            Engine::Local { node, stats, heap } => {
                let _inside = heap.app_inside();
                if matches!(cmd, Command::Shutdown { .. }) {
                    return Ok(Reply::ShutDown);
                }
                let snapshot = |node: &mut Node<HeapPages>| Box::new(node_snapshot(stats, node));
                if matches!(cmd, Command::Stats) {
                    return Ok(Reply::Stats(snapshot(node)));
                }
                let started = start(node, cmd)?;
                node.run_deferred()?;
                let reply = started.or_else(|| match node.poll_done()? {
                    AppDone::Exited => Some(Reply::Exited(snapshot(node))),
                    done => Some(Reply::Done(done)),
                });
                debug_assert!(node.poll_transmit().is_none(), "a one-node job sent a message");
                Ok(reply.expect("a one-node job completes every request at once"))
            }
            Engine::Remote { mailbox, node, heap, .. } => {
                let _inside = heap.app_inside();
                // A release runs on the application thread; a waiting acquirer gets its grant
                // from the service thread, which sends it.
                if let Command::Release(lock) = cmd
                    && Self::lock_op_here(mailbox, node, heap, |node| node.release_here(lock).map(|()| true))?
                {
                    return Ok(Reply::Released);
                }
                Self::call_remote(mailbox, cmd)
            }
        }
    }

    /// Runs `op` on the node on the application thread (an operation that needs no message),
    /// then rings the service thread if `op` queued a message (a grant, say) or a warning (which
    /// had waited for the service thread's next wake-up: an acquire of a lock whose token is here
    /// queues no message). A panic in there (a
    /// broken invariant, or a protection change the kernel refused) ends the process, as one on
    /// the service thread does: unwinding would leave the node's lock poisoned under a job that
    /// the other nodes would wait on.
    fn on_app_thread<T>(
        mailbox: &Mailbox,
        node: &Mutex<Node<HeapPages>>,
        heap: &Heap,
        op: impl FnOnce(&mut Node<HeapPages>) -> T,
    ) -> T {
        let _inside = heap.app_inside();
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut node = lock_node(heap, node);
            let out = op(&mut node);
            // A warning (consistency data past its threshold) is printed by the service thread.
            (out, node.has_transmit() || node.has_warning())
        }));
        match ran {
            Ok((out, queued)) => {
                if queued {
                    mailbox.doorbell.ring_service();
                }
                out
            }
            Err(_) => {
                crate::report("treadmarks: internal error in the runtime on the application thread; exiting");
                std::process::exit(101)
            }
        }
    }

    /// Runs a lock operation on the application thread (`op` says whether it could run there)
    /// and counts it (`lock_ops_here`); false once the job failed, when the service thread
    /// answers every call with the failure.
    fn lock_op_here(
        mailbox: &Mailbox,
        node: &Mutex<Node<HeapPages>>,
        heap: &Heap,
        op: impl FnOnce(&mut Node<HeapPages>) -> std::result::Result<bool, ProtocolError>,
    ) -> Result<bool> {
        if mailbox.failed.load(Ordering::Acquire) {
            return Ok(false);
        }
        let ran = Self::on_app_thread(mailbox, node, heap, op)?;
        if ran {
            mailbox.lock_ops_here.fetch_add(1, Ordering::Relaxed);
        }
        Ok(ran)
    }

    /// Brings `pages` up to date before a view of them is used. Needs no `&mut`: the
    /// application's views may be alive, and only invalid pages (which no view has touched since
    /// the last synchronization) change. A one-node job has no invalid pages.
    /// `whole`: pages (of `pages`, only with `write`) the application overwrites entirely.
    /// `views_open`: another mutable view is open (`Node::set_mutable_views_open`).
    pub fn validate(
        &self,
        pages: Vec<PageIdx>,
        write: bool,
        whole: Vec<PageIdx>,
        stream: bool,
        views_open: bool,
    ) -> Result<()> {
        match self {
            Engine::Local { .. } => Ok(()),
            Engine::Remote { mailbox, node, heap, .. } => {
                let _inside = heap.app_inside();
                if !mailbox.failed.load(Ordering::Acquire) {
                    // Some(completed at once) if the node said it needs no message.
                    let here = Self::on_app_thread(mailbox, node, heap, |node| -> Result<Option<bool>> {
                        if !node.overwrites_locally(&pages, &whole) {
                            return Ok(None);
                        }
                        node.set_mutable_views_open(views_open);
                        node.request_view(&pages, write, &whole, stream)?;
                        Ok(Some(node.poll_done() == Some(AppDone::Validated)))
                    })?;
                    match here {
                        Some(true) => {
                            mailbox.validations_here.fetch_add(1, Ordering::Relaxed);
                            return Ok(());
                        }
                        // Said local but asked a peer after all (the simulation checks it never
                        // does): the service thread sends the request and answers, as for a
                        // command.
                        Some(false) => {
                            return Self::validated(Self::call_remote(mailbox, Command::AwaitStarted)?);
                        }
                        None => {}
                    }
                }
                Self::validated(Self::call_remote(
                    mailbox,
                    Command::Validate { pages, write, whole, stream, views_open },
                )?)
            }
        }
    }

    fn validated(reply: Reply) -> Result<()> {
        match reply {
            Reply::Done(AppDone::Validated) => Ok(()),
            other => unreachable!("validate answered with {other:?}"),
        }
    }

    fn call_remote(mailbox: &Mailbox, cmd: Command) -> Result<Reply> {
        mailbox.commands.fetch_add(1, Ordering::Relaxed);
        let posted_only = matches!(cmd, Command::Release(_));
        mailbox.command.lock().expect("mailbox").push_back(cmd);
        mailbox.doorbell.ring_service();
        if posted_only {
            return Ok(Reply::Released);
        }
        Self::wait_reply(mailbox)
    }

    /// Waits for the service thread's answer to the pending command.
    fn wait_reply(mailbox: &Mailbox) -> Result<Reply> {
        // Poll a little before sleeping: waking a sleeping thread costs tens of microseconds on
        // some machines, more than a short reply takes. Yielding lets anything else runnable on
        // this CPU (the service thread, a peer's) go first.
        let spin = mailbox.doorbell.spin();
        if !spin.is_zero() {
            let start = std::time::Instant::now();
            while start.elapsed() < spin {
                if let Some(reply) = mailbox.reply.lock().expect("mailbox").take() {
                    return reply;
                }
                std::thread::yield_now();
            }
        }
        loop {
            mailbox.doorbell.wait_app();
            if let Some(reply) = mailbox.reply.lock().expect("mailbox").take() {
                return reply;
            }
        }
    }

    /// Waits for the service thread to finish (after exit).
    pub fn join(&mut self) -> Result<()> {
        if let Engine::Remote { service, .. } = self
            && let Some(handle) = service.take()
        {
            handle.join().map_err(|_| Error::Failed("the service thread panicked".into()))?;
        }
        Ok(())
    }
}
