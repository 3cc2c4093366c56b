//! The library's top-level error: one variant per layer, plus what the API itself refuses.

use crate::protocol::{NodeId, ProtocolError};

/// Result alias of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a treadmarks call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Mem(#[from] crate::mem::MemError),
    #[error(transparent)]
    Transport(#[from] crate::transport::TransportError),
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// A node process of this job exited badly.
    #[error("{node} exited with {status}")]
    NodeExited { node: NodeId, status: String },
    /// Starting a node process failed.
    #[error("cannot start {node}: {source}")]
    Spawn { node: NodeId, source: std::io::Error },
    /// The job already failed; this is why.
    #[error("the job has failed: {0}")]
    Failed(String),
    /// An allocation of a size that does not fit the address space.
    #[error("allocation of {count} elements of {size} bytes overflows")]
    TooLarge { count: usize, size: usize },
    /// A view of shared memory that conflicts with a live one, or a bad handle.
    #[error(transparent)]
    View(crate::mem::ViewError),
    /// A distributed value of the wrong size.
    #[error("distribute: node 0 sent {got} bytes, this node expected {want}")]
    DistributeSize { got: usize, want: usize },
}
