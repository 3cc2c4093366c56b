//! The one error type of the transport layer.
//!
//! Every variant carries typed fields naming the operation, the peer (rank or address) and the
//! offending value, so a message read in a log of one node says what went wrong without the logs of
//! the others. Nothing a peer sends may panic this layer: malformed input becomes one of these.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::protocol::NodeId;

use super::codec::MAX_FRAME;

/// A `Result` whose error is [`TransportError`].
pub type Result<T, E = TransportError> = std::result::Result<T, E>;

/// Everything that can go wrong in the transport layer.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// A message could not be serialized (a type postcard cannot encode).
    #[error("cannot encode a message: {source}")]
    Encode {
        /// What postcard reported.
        source: postcard::Error,
    },

    /// A message serialized to more than `MAX_FRAME` (64 MiB) bytes.
    #[error("cannot encode a message: it exceeds the {} MiB frame limit (gave up after {len} bytes)", MAX_FRAME >> 20)]
    MessageTooLarge {
        /// How many bytes had been produced when the encoder gave up.
        len: usize,
    },

    /// A message serialized to zero bytes; that frame length is reserved for goodbye.
    #[error("cannot encode a message of 0 bytes: a 0-length frame is the goodbye frame")]
    EmptyMessage,

    /// A handshake message from `addr` that does not decode (garbage, or another program).
    #[error("bad handshake message from {addr} while trying to {op}: {source}")]
    BadHandshake {
        /// What we were doing.
        op: &'static str,
        /// Who sent it.
        addr: std::net::SocketAddr,
        /// Why it does not decode.
        source: Box<TransportError>,
    },

    /// A payload could not be deserialized.
    #[error("cannot decode a payload of {len} bytes: {source}")]
    Decode {
        /// Length of the payload.
        len: usize,
        /// What postcard reported.
        source: postcard::Error,
    },

    /// A payload decoded to a message but left bytes over.
    #[error("payload of {len} bytes decoded with {extra} bytes left over")]
    TrailingBytes {
        /// Length of the payload.
        len: usize,
        /// Bytes not consumed by the message.
        extra: usize,
    },

    /// A frame header announced more than `MAX_FRAME` (64 MiB) bytes.
    #[error("frame of {len} bytes {} exceeds the {} MiB limit", from_label(.from), MAX_FRAME >> 20)]
    FrameTooLarge {
        /// Announced payload length.
        len: u64,
        /// The sender, when known.
        from: Option<NodeId>,
    },

    /// The byte stream ended inside a frame.
    #[error("stream ended inside a frame {}: {have} of {want} bytes present", from_label(.from))]
    TruncatedFrame {
        /// Bytes of the frame (header included) present.
        have: usize,
        /// Bytes the frame needs (header included; 4 if the header itself is incomplete).
        want: usize,
        /// The sender, when known.
        from: Option<NodeId>,
    },

    /// A socket operation failed.
    #[error("{op} {addr}: {source}")]
    Io {
        /// The operation, phrased so that the address reads after it ("connect to root at").
        op: &'static str,
        /// The address involved (the peer's, or our own for a bind).
        addr: SocketAddr,
        /// What the OS reported.
        source: io::Error,
    },

    /// The mesh meeting did not complete in time.
    #[error("timed out after {timeout:?} waiting for {waiting_for}")]
    Timeout {
        /// What we were still waiting for, naming ranks or addresses.
        waiting_for: String,
        /// The bound on the whole meeting.
        timeout: Duration,
    },

    /// This node's own configuration is impossible.
    #[error("started as rank {rank} of {nprocs} nodes: rank must be below nprocs and nprocs at least 1")]
    BadConfig {
        /// Our rank.
        rank: NodeId,
        /// Our node count.
        nprocs: u16,
    },

    /// A peer announced a node count other than ours.
    #[error("{node} announced {theirs} nodes, we were started with {ours}")]
    NprocsMismatch {
        /// The peer.
        node: NodeId,
        /// Our node count.
        ours: u16,
        /// The peer's node count.
        theirs: u16,
    },

    /// A peer announced a configuration fingerprint other than ours.
    #[error("{node} announced configuration {theirs:?}, we were started with {ours:?}")]
    ConfigMismatch {
        /// The peer.
        node: NodeId,
        /// Our fingerprint.
        ours: String,
        /// The peer's fingerprint.
        theirs: String,
    },

    /// A peer announced a rank outside the range it may have on that connection.
    #[error("peer at {addr} announced rank {rank}, expected one of {expected}")]
    RankOutOfRange {
        /// The announced rank.
        rank: u16,
        /// The ranks that would have been valid, e.g. "1..4".
        expected: String,
        /// Where the connection came from.
        addr: SocketAddr,
    },

    /// Two peers announced the same rank.
    #[error("{rank} announced twice: first from {first}, again from {second}")]
    DuplicateRank {
        /// The rank announced twice.
        rank: NodeId,
        /// Address of the first connection with that rank.
        first: SocketAddr,
        /// Address of the second.
        second: SocketAddr,
    },

    /// The root refused us (or gave up on the meeting) and said why.
    #[error("rejected by {by}: {reason}")]
    Rejected {
        /// Who rejected us (always node 0 today).
        by: NodeId,
        /// The root's reason, as its own error message.
        reason: String,
    },

    /// A handshake message arrived where another was expected.
    #[error("unexpected {got} from {addr} while waiting for {expected}")]
    UnexpectedMessage {
        /// The message kind received.
        got: &'static str,
        /// The message kind expected.
        expected: &'static str,
        /// Who sent it.
        addr: SocketAddr,
    },

    /// A node that had joined the meeting closed its connection, or spoke out of turn, before
    /// the meeting could end.
    #[error("{node}: {source}")]
    JoinedNodeLost {
        /// The node.
        node: NodeId,
        /// What the root found on its connection.
        source: Box<TransportError>,
    },

    /// The root's address table does not fit our configuration.
    #[error("root sent a table of {len} addresses, we were started with {nprocs} nodes")]
    BadTable {
        /// Addresses in the table.
        len: usize,
        /// Our node count.
        nprocs: u16,
    },

    /// A send named a node that has no link (ourselves, or out of range).
    #[error("cannot send to {to}: no link to it (we are {rank} of {nprocs} nodes)")]
    NoSuchLink {
        /// The destination.
        to: NodeId,
        /// Our rank.
        rank: NodeId,
        /// Our node count.
        nprocs: u16,
    },

    /// A send on a link that is closed (goodbye queued, or its writer stopped after an error).
    #[error("cannot send a frame of {len} bytes to {to}: the link is closed ({why})")]
    LinkClosed {
        /// The destination.
        to: NodeId,
        /// Size of the frame that was not sent.
        len: usize,
        /// Why: the write error that stopped it, or the goodbye sent on it.
        why: String,
    },
}

/// "from node 3", or "from the stream" when the sender is not known.
fn from_label(from: &Option<NodeId>) -> String {
    match from {
        Some(node) => format!("from {node}"),
        None => "from the stream".to_owned(),
    }
}
