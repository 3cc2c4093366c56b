//! The library's top-level error: one variant per layer, plus what the API itself refuses.

use crate::protocol::{NodeId, ProtocolError};

/// Result alias of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a treadmarks call.
///
/// Its `Debug` form is its message, as `Display` gives it, since that is what a program whose
/// `main` returns [`Result`] prints when it fails; `{:#?}` shows the variant and its fields.
#[derive(thiserror::Error)]
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
    /// A node process of this job was still running this long after the job's exit, and was
    /// killed ([`crate::Tmk::EXIT_REAP_WAIT`]).
    #[error("{node} was still running {waited:?} after the job's exit, and was killed")]
    NodeLingered { node: NodeId, waited: std::time::Duration },
    /// Starting a node process failed.
    #[error("cannot start {node}: {source}")]
    Spawn { node: NodeId, source: std::io::Error },
    /// The job failed; this is why, as this node saw it (the peer it names, and what it did).
    #[error("the job has failed: {0}")]
    Job(crate::failure::JobFailure),
    /// The job could not start, or failed otherwise; this is why.
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
    /// An allocation aligned more than the heap's base is (offsets are aligned, and an address
    /// is the base plus its offset).
    #[error("allocation aligned to {align} bytes: the heap's base {heap_base:#x} is not (TMK_HEAP_BASE)")]
    Misaligned { align: usize, heap_base: usize },
    /// This process started its node before ([`crate::Tmk::startup_with`]).
    #[error(
        "this process has started a treadmarks node already: a process runs one node of one job, \
         once (start another job in another process)"
    )]
    AlreadyStarted,
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !f.alternate() {
            return write!(f, "{self}");
        }
        match self {
            Error::Config(e) => f.debug_tuple("Config").field(e).finish(),
            Error::Mem(e) => f.debug_tuple("Mem").field(e).finish(),
            Error::Transport(e) => f.debug_tuple("Transport").field(e).finish(),
            Error::Protocol(e) => f.debug_tuple("Protocol").field(e).finish(),
            Error::NodeExited { node, status } => {
                f.debug_struct("NodeExited").field("node", node).field("status", status).finish()
            }
            Error::NodeLingered { node, waited } => {
                f.debug_struct("NodeLingered").field("node", node).field("waited", waited).finish()
            }
            Error::Spawn { node, source } => {
                f.debug_struct("Spawn").field("node", node).field("source", source).finish()
            }
            Error::Job(why) => f.debug_tuple("Job").field(why).finish(),
            Error::Failed(why) => f.debug_tuple("Failed").field(why).finish(),
            Error::TooLarge { count, size } => {
                f.debug_struct("TooLarge").field("count", count).field("size", size).finish()
            }
            Error::View(e) => f.debug_tuple("View").field(e).finish(),
            Error::DistributeSize { got, want } => {
                f.debug_struct("DistributeSize").field("got", got).field("want", want).finish()
            }
            Error::Misaligned { align, heap_base } => {
                f.debug_struct("Misaligned").field("align", align).field("heap_base", heap_base).finish()
            }
            Error::AlreadyStarted => f.write_str("AlreadyStarted"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_is_the_message_and_alternate_debug_the_structure() {
        let e =
            Error::Protocol(ProtocolError::UnknownLock { lock: crate::protocol::LockId(5000), nlocks: 1024 });
        // What `fn main() -> treadmarks::Result<()>` prints after "Error: ".
        assert_eq!(format!("{e:?}"), "lock 5000 is out of range: this job has 1024 locks (ids 0..1024)");
        assert!(format!("{e:#?}").starts_with("Protocol(\n    UnknownLock {"), "{e:#?}");
    }
}
