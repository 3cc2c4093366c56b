//! [`MemError`]: what went wrong in the memory layer, with the values involved.

use std::fmt;
use std::io;

/// Errors of the memory layer. Every message names the operation and the values involved.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// The requested [`HeapLayout`](super::HeapLayout) cannot be mapped as given.
    #[error(
        "invalid shared heap layout (base {base:#x}, size {size} bytes, page size {page_size}): {reason}"
    )]
    InvalidLayout {
        /// Requested base address.
        base: usize,
        /// Requested size in bytes.
        size: usize,
        /// The system page size.
        page_size: usize,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Something is already mapped inside the requested range.
    #[error("cannot map {} shared heap at {base:#x}: address in use (set TMK_HEAP_BASE)", Bytes(*size))]
    AddressInUse {
        /// Requested base address.
        base: usize,
        /// Requested size in bytes.
        size: usize,
    },
    /// The application view cannot be mapped at its fixed address for another reason (outside
    /// the user address space, say).
    #[error("cannot map {} shared heap at {base:#x}: {source} (set TMK_HEAP_BASE)", Bytes(*size))]
    MapFixed {
        /// Requested base address.
        base: usize,
        /// Requested size in bytes.
        size: usize,
        /// The OS error.
        source: io::Error,
    },
    /// The kernel ignored `MAP_FIXED_NOREPLACE` (Linux < 4.17) and placed the view elsewhere.
    #[error(
        "cannot map {} shared heap at {base:#x}: the kernel placed it at {got:#x} instead \
         (MAP_FIXED_NOREPLACE needs Linux 4.17; set TMK_HEAP_BASE to a free range)",
        Bytes(*size)
    )]
    PlacedElsewhere {
        /// Requested base address.
        base: usize,
        /// Requested size in bytes.
        size: usize,
        /// Where the kernel put the mapping.
        got: usize,
    },
    /// A system call failed while setting up a mapping or a descriptor.
    #[error("cannot {op} ({}): {source}", Bytes(*size))]
    Sys {
        /// The operation, e.g. "map the runtime view of the shared heap".
        op: &'static str,
        /// Bytes involved.
        size: usize,
        /// The OS error.
        source: io::Error,
    },
    /// Creating an eventfd of the fault doorbell failed.
    #[error("cannot create the {which} eventfd of the fault doorbell: {source}")]
    Eventfd {
        /// "service" or "app".
        which: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The process-wide SIGSEGV handler is already taken by this layer.
    #[error("cannot {op}: the process-wide SIGSEGV handler is already owned by {owner}")]
    HandlerBusy {
        /// What the caller tried to do.
        op: &'static str,
        /// Who holds it now.
        owner: &'static str,
    },
    /// `sigaction` failed.
    #[error("cannot {op} the {signal} handler: {source}")]
    Sigaction {
        /// "install" or "query".
        op: &'static str,
        /// "SIGSEGV" or "SIGBUS".
        signal: &'static str,
        /// The OS error.
        source: io::Error,
    },
    /// The userfaultfd fault backend was asked for (`TMK_FAULTS=uffd`) but cannot be had.
    #[error("cannot use the userfaultfd fault backend (TMK_FAULTS=uffd): {why}; to fix: {fix}")]
    UffdUnavailable {
        /// What failed.
        why: String,
        /// How to fix it.
        fix: &'static str,
    },
    /// The heap is too large for the `mprotect` backend under this `vm.max_map_count`.
    #[error(
        "a {} shared heap has {npages} pages; on the mprotect fault backend each differently \
         protected page can be a kernel mapping of its own, so it may need up to {need} mappings \
         ({npages} + {in_use} in use + margin), more than vm.max_map_count = {max_map_count} allows \
         (it would fail with ENOMEM in the middle of a run). Use the userfaultfd backend \
         (TMK_FAULTS=uffd, Linux 6.2+), a heap of at most {max_heap} (TMK_HEAP_SIZE), or raise the \
         limit (sysctl vm.max_map_count={need})",
        Bytes(*size)
    )]
    MapCountTooLow {
        /// Heap bytes.
        size: usize,
        /// Heap pages.
        npages: u32,
        /// `/proc/sys/vm/max_map_count`.
        max_map_count: u64,
        /// Mappings the process had when it checked.
        in_use: u64,
        /// The largest heap that would fit, e.g. "251 MiB".
        max_heap: String,
        /// Mappings the heap could need, with the rest of the process.
        need: u64,
    },
    /// An argument out of range.
    #[error("{op}: {reason}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        reason: String,
    },
}

/// A byte count printed the way people say it: "1 GiB", "64 MiB", "12 KiB", "1000 bytes".
pub(crate) struct Bytes(pub usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(usize, &str); 4] =
            [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
        for (unit, name) in UNITS {
            if self.0 >= unit && self.0 & (unit - 1) == 0 {
                return write!(f, "{} {name}", self.0 / unit);
            }
        }
        write!(f, "{} bytes", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_display() {
        assert_eq!(Bytes(1 << 30).to_string(), "1 GiB");
        assert_eq!(Bytes(3 << 20).to_string(), "3 MiB");
        assert_eq!(Bytes(4096).to_string(), "4 KiB");
        assert_eq!(Bytes(1000).to_string(), "1000 bytes");
    }

    #[test]
    fn address_in_use_message() {
        let e = MemError::AddressInUse { base: 0x6000_0000_0000, size: 1 << 30 };
        assert_eq!(
            e.to_string(),
            "cannot map 1 GiB shared heap at 0x600000000000: address in use (set TMK_HEAP_BASE)"
        );
    }
}
