//! Why a job failed: what a node's calls return once it has ([`crate::Error::Job`]), typed so
//! that a program can tell a peer that died from one that sent something wrong, and name it.
//!
//! The node that sees a failure first tells every peer (`Message::Abort`), so the others fail
//! with [`JobFailure::PeerMessage`] naming it and carrying [`ProtocolError::Aborted`] with its
//! reason: every node names the real cause, not only the connection that closed next.

use crate::protocol::{LockId, MsgKind, NodeId, PageIdx, ProtocolError};

/// Why a job failed, as this node saw it. The peer it names is the one this node heard it from:
/// a peer's abort names the node that passed it on, its reason the cause.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum JobFailure {
    /// A peer's connection ended or failed: it died, was killed, left the job early, or the
    /// network failed. `how` says which, as the connection showed it; `write_error` is what
    /// writing to the peer met, if anything, which the reading side may not see.
    #[error("{node} {how}{}", write_error.as_ref().map_or(String::new(), |e| format!(" (writing to it had failed: {e})")))]
    PeerLost { node: NodeId, how: String, write_error: Option<String> },
    /// A peer sent a message that does not decode (a frame that is not one ends the peer's
    /// connection: [`JobFailure::PeerLost`], saying so).
    #[error("malformed message from {node}: {reason}")]
    Malformed { node: NodeId, reason: String },
    /// A peer's message broke the protocol, or was its abort ([`ProtocolError::Aborted`]).
    #[error("protocol error on a message from {node}: {error}")]
    PeerMessage { node: NodeId, error: ProtocolError },
    /// A message to a peer could not be sent.
    #[error("cannot send {kind:?} to {node}: {reason}")]
    Send { node: NodeId, kind: MsgKind, reason: String },
    /// Handling the application's page fault failed.
    #[error("page fault on {page}: {error}")]
    Fault { page: PageIdx, error: ProtocolError },
    /// A release handed to the service thread failed.
    #[error("release of {lock}: {error}")]
    Release { lock: LockId, error: ProtocolError },
    /// Work the node deferred until its messages had left failed.
    #[error("deferred work: {0}")]
    Deferred(ProtocolError),
    /// Every connection is gone.
    #[error("all connections are gone")]
    AllConnectionsGone,
    /// This node's application shut the job down (a panic, or an exit before the job's end).
    #[error("{0}")]
    ShutDown(String),
}

impl JobFailure {
    /// The peer the failure names, if one.
    pub fn node(&self) -> Option<NodeId> {
        match self {
            JobFailure::PeerLost { node, .. }
            | JobFailure::Malformed { node, .. }
            | JobFailure::PeerMessage { node, .. }
            | JobFailure::Send { node, .. } => Some(*node),
            _ => None,
        }
    }
}
