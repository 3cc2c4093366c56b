//! The protocol core: lazy release consistency as a pure state machine.
#![forbid(unsafe_code)]

pub mod ids;
pub mod memory;
pub mod vtime;

pub use ids::{BarrierId, DiffSeq, IntervalIdx, LockId, NodeId, PageIdx};
pub use memory::{Access, PageMemory, VecMemory};
pub use vtime::VectorTime;
