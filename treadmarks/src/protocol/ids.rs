//! Identifier newtypes. Every id on the wire or in a table is one of these, never a bare integer.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id {
    ($(#[$m:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl $name {
            /// The id as an index into a table.
            #[inline]
            pub fn idx(self) -> usize {
                self.0 as usize
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id!(
    /// A node (process) of the job: `0..nprocs`.
    NodeId(u16), "node "
);
id!(
    /// A page of the shared heap, counted from the heap base.
    PageIdx(u32), "page "
);
id!(
    /// A lock: `0..nlocks`. Its manager is `lock % nprocs`.
    LockId(u32), "lock "
);
id!(
    /// A barrier: `0..nbarriers`. Node 0 manages every barrier.
    BarrierId(u32), "barrier "
);

/// Index of one of a node's intervals. Interval 1 is a node's first; 0 means "none".
pub type IntervalIdx = u32;

/// Sequence number of a diff made by one node (per node, increasing, starting at 1).
pub type DiffSeq = u64;
