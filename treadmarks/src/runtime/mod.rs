//! The runtime: where the protocol core, the memory layer and the transport meet.
//!
//! ```text
//!  application thread                         service thread (tokio, current-thread)
//!  ──────────────────                         ──────────────────────────────────────
//!  Tmk::lock / barrier / alloc ... ──cmd──►   Mailbox ─┐
//!  page fault (signal handler) ──fault slot──► Doorbell ┼─► protocol::Node ──► Links (TCP)
//!        blocks on the app eventfd ◄──wake──── replies ◄┘        ▲
//!                                                        peers ──┘
//! ```
//! With one node there is nobody to talk to: the node runs on the application thread
//! ([`Engine::Local`]) and nothing is protected, so nothing faults.

#![forbid(unsafe_code)]

pub(crate) mod launch;
pub(crate) mod service;

use crate::error::{Error, Result};
use crate::mem::{Doorbell, HeapPages};
use crate::protocol::{AppDone, BarrierId, LockId, Node, NodeId, PageIdx, ProtocolError};
use crate::stats::Stats;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

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
    /// of the writes too.
    Validate {
        pages: Vec<PageIdx>,
        write: bool,
    },
    Stats,
    /// Stop the service thread (the application gave up on a failed job): flush what is
    /// queued, notably abort messages, then answer.
    Shutdown,
}

/// The answer to a [`Command`].
#[derive(Debug)]
pub(crate) enum Reply {
    Done(AppDone),
    Released,
    Stats(Box<Stats>),
    ShutDown,
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
        Command::Validate { pages, write } => node.request_validate(&pages, write)?,
        Command::Stats | Command::Shutdown => unreachable!("answered by the engine"),
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
}

/// How long the application thread polls for a reply before it sleeps (`TMK_SPIN_US`).
pub(crate) fn spin_budget() -> std::time::Duration {
    static SPIN: std::sync::OnceLock<std::time::Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| {
        let us = std::env::var("TMK_SPIN_US").ok().and_then(|v| v.parse().ok()).unwrap_or(100);
        std::time::Duration::from_micros(us)
    })
}

/// Where this node's protocol runs.
#[derive(Debug)]
pub(crate) enum Engine {
    /// One-node job: on the application thread.
    Local { node: Box<Node<HeapPages>>, stats: Box<Stats> },
    /// On the service thread.
    Remote { mailbox: Arc<Mailbox>, service: Option<JoinHandle<()>> },
}

impl Engine {
    /// Runs `cmd` to completion.
    pub fn call(&mut self, cmd: Command) -> Result<Reply> {
        match self {
            Engine::Local { node, stats } => {
                if matches!(cmd, Command::Shutdown) {
                    return Ok(Reply::ShutDown);
                }
                if matches!(cmd, Command::Stats) {
                    let mut s = (**stats).clone();
                    s.protocol = node.stats().clone();
                    s.consistency_bytes = node.consistency_bytes();
                    return Ok(Reply::Stats(Box::new(s)));
                }
                let reply = start(node, cmd)?.or_else(|| node.poll_done().map(Reply::Done));
                debug_assert!(node.poll_transmit().is_none(), "a one-node job sent a message");
                Ok(reply.expect("a one-node job completes every request at once"))
            }
            Engine::Remote { mailbox, .. } => Self::call_remote(mailbox, cmd),
        }
    }

    /// Brings `pages` up to date before a view of them is used. Needs no `&mut`: the
    /// application's views may be alive, and only invalid pages (which no view has touched since
    /// the last synchronization) change. A one-node job has no invalid pages.
    pub fn validate(&self, pages: Vec<PageIdx>, write: bool) -> Result<()> {
        match self {
            Engine::Local { .. } => Ok(()),
            Engine::Remote { mailbox, .. } => {
                match Self::call_remote(mailbox, Command::Validate { pages, write })? {
                    Reply::Done(AppDone::Validated) => Ok(()),
                    other => unreachable!("validate answered with {other:?}"),
                }
            }
        }
    }

    fn call_remote(mailbox: &Mailbox, cmd: Command) -> Result<Reply> {
        let posted_only = matches!(cmd, Command::Release(_));
        mailbox.command.lock().expect("mailbox").push_back(cmd);
        mailbox.doorbell.ring_service();
        if posted_only {
            return Ok(Reply::Released);
        }
        // Poll a little before sleeping: waking a sleeping thread costs tens of microseconds on
        // some machines, more than a short reply takes. Yielding lets anything else runnable on
        // this CPU (the service thread, a peer's) go first.
        let spin = spin_budget();
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
