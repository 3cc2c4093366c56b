//! Shared heap mapping, page protection and fault capture: the only `unsafe` code of the crate.
//!
//! # What this module owns
//! - the shared heap ([`Heap`]): one memfd mapped twice, plus a twin area (design decision 2);
//! - the per-page protection state, kept in step with the application view's real protection;
//! - the process-wide SIGSEGV/SIGBUS handler ([`FaultHandler`]) and its hand-off to the runtime's
//!   service thread ([`Doorbell`]) (design decisions 3 and 4);
//! - the two fault backends ([`FaultBackend`]: `mprotect` and userfaultfd) and their selection
//!   ([`FaultsMode`], [`select_backend`]);
//! - [`HeapPages`], the protocol core's [`PageMemory`](crate::protocol::memory::PageMemory) over
//!   the real heap;
//! - [`bytes`]: the SIMD byte-compare kernel of diff making (pure, no heap: it is here only
//!   because its intrinsics are `unsafe`);
//! - [`chunk`]: huge-page chunks the diffs a node makes are stored in (one fault per 2 MiB).
//!
//! It does not own the protocol (which pages are valid, diffs, write notices) nor any I/O other
//! than its eventfds: the runtime drives it.
//!
//! # Heap layout
//!
//! ```text
//!                 one memfd, `size` bytes (MAP_SHARED twice)
//!                 ┌────────┬────────┬────────┬─────┬──────────┐
//!                 │ page 0 │ page 1 │ page 2 │ ... │ page n-1 │
//!                 └────────┴────────┴────────┴─────┴──────────┘
//!                      ▲                                 ▲
//!   application view   │ layout.base (MAP_FIXED_NOREPLACE), same address on every node;
//!                      │ per-page protection = page state: NONE / READ / READ|WRITE;
//!                      │ loads and stores of the application thread only
//!   runtime view       │ anywhere, always READ|WRITE; HeapPages and the handler's twin copy only
//!
//!   twin area (MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, `size` bytes, huge pages advised)
//!                 ┌────────┬────────┬────────┬─────┬──────────┐
//!                 │ slot 0 │ slot 1 │ slot 2 │ ... │ slot n-1 │   slot s at twin_base + s*page_size
//!                 └────────┴────────┴────────┴─────┴──────────┘
//!                 ◄── backed at startup (reserve_twins) ──►      later slots: committed on touch
//!   twin_slots: [AtomicU32; n]   page p's slot, NO_SLOT until p is first twinned; then fixed.
//!                 Slots are handed out in the order pages are first twinned (an atomic counter,
//!                 async-signal-safe), so the twins in use are packed at the start of the area,
//!                 in memory backed ahead of need, whichever pages of the heap they belong to.
//!
//!   states: [AtomicU8; n]   INVALID | READ_ONLY | READ_WRITE | BUSY   (see below)
//!   ring:   SPSC [u32; n]   pages twinned by the handler, drained by whoever holds the node
//! ```
//!
//! # Fault backends
//! Both enforce the same page states and report faults to the same handler; only how a state is
//! put into the application view and how a fault arrives differ.
//!
//! | | `mprotect` | userfaultfd (`uffd`) |
//! |---|---|---|
//! | app view mapping | protection per run of pages | always `PROT_READ|PROT_WRITE`, registered MINOR|WP |
//! | `INVALID` | `PROT_NONE` | PTE dropped (`MADV_DONTNEED`); memfd page kept (`fallocate` once) |
//! | `READ_ONLY` | `PROT_READ` | PTE write-protected (`UFFDIO_WRITEPROTECT`, or `UFFDIO_CONTINUE` + `MODE_WP`) |
//! | `READ_WRITE` | `PROT_READ|PROT_WRITE` | PTE writable (WP cleared, or `UFFDIO_CONTINUE`) |
//! | fault arrives as | SIGSEGV | SIGBUS (`UFFD_FEATURE_SIGBUS`), in the faulting thread |
//! | limit | one kernel mapping per differently-protected run: `vm.max_map_count` | none (per PTE) |
//!
//! - **mprotect**: a heap of P pages can need P mappings (a checkerboard of states), plus the
//!   process's own. [`Heap::map_with`] refuses a protected heap when `P + mappings in use +`
//!   [`MAP_COUNT_MARGIN`] exceeds `vm.max_map_count` (65530 by default: about 250 MiB of heap),
//!   naming the limit and suggesting `TMK_FAULTS=uffd`, instead of failing with ENOMEM mid-run.
//!   A new allocation's pages are backed at once ([`Heap::commit`], one `fallocate`), so a first
//!   touch only maps an existing page; never on userfaultfd, where that would be a minor fault.
//! - **userfaultfd** (Linux 6.2+: `UFFD_FEATURE_SIGBUS`, `MINOR_SHMEM`, `WP_HUGETLBFS_SHMEM`,
//!   `UFFDIO_CONTINUE_MODE_WP`): the view is write-protected whole at map time, which on shmem
//!   leaves a write-protect marker in every PTE, populated or not, so the first write to any page
//!   faults. An invalid page's memfd page always exists, so touching it raises a *minor* fault
//!   (never a silent zero-fill); re-validation maps the memfd page back with `UFFDIO_CONTINUE`, in
//!   write-protect mode for `READ_ONLY`, so there is no writable window before the twin exists.
//!   The memfd keeps the data while the app view has no PTE; the runtime view reads and writes it
//!   as on the mprotect backend. SIGBUS does not say which uffd fault it was: the page state does
//!   (`INVALID`: a miss; `READ_ONLY`: a write, or a minor fault on a valid page the runtime
//!   touched first, told apart by the x86_64 error code's present bit, else by trying
//!   `UFFDIO_CONTINUE`, whose EEXIST means "mapped").
//!
//! `TMK_FAULTS=auto` (the default) self-checks the userfaultfd mechanism once per process
//! ([`uffd_support`]) and uses it if it works, else falls back to mprotect saying so once;
//! `TMK_FAULTS=uffd` fails with [`MemError::UffdUnavailable`] saying why and how to fix it.
//!
//! # Page state (one `AtomicU8` per page)
//! `INVALID` (PROT_NONE), `READ_ONLY` (PROT_READ), `READ_WRITE` (PROT_READ|PROT_WRITE) and
//! `BUSY`: a transition is in progress and only the thread that CASed the page to `BUSY` may store
//! the next state. Every change of the page's protection or PTE, on either backend, is made by
//! the owner of its `BUSY` state. Owners of `BUSY`:
//! - the signal handler on the application thread: `READ_ONLY → BUSY → READ_WRITE` (fast path);
//!   on userfaultfd also `s → BUSY → s` to map a valid page whose PTE is missing;
//! - `HeapPages::set_access` on the thread that holds the node (the service thread, or the
//!   application thread running an operation that needs no message): any stable state `→ BUSY →` the new one,
//!   with one `mprotect` for the whole run in between (userfaultfd: one operation per sub-run
//!   of equal old state);
//! - `HeapPages::make_twin`: `s → BUSY → s` around the copy, so the handler cannot twin the
//!   same page at the same time.
//!
//! Nobody waits on the application thread while holding `BUSY`, so it is always released in
//! bounded time; a fault that finds `BUSY` yields and retries the access.
//!
//! # The page-sharing rule (from `protocol::memory`, checked here)
//! - The runtime reads a page's bytes ([`HeapPages`]'s `page`, `make_twin`) only while the
//!   application view of the page is not writable.
//! - The runtime writes a page's bytes (`page_mut`) only while the application has no access;
//!   the application thread then either is outside the page or is blocked in a slow-path fault.
//! - Violations the page's state shows (a read of a writable page, a write to an accessible
//!   one) are bugs in the caller and panic with the page and its state. Whether the application
//!   is blocked is not visible here: the protocol core reads a `READ_ONLY` page only after
//!   revoking or freezing it, or while the application waits in a call (`Cut::Blocked`), and
//!   the simulation's `VecMemory` checks that it does.
//!
//! # Faults
//! The [`FaultHandler`] handles faults whose address lies inside the heap's application view and
//! chains every other SIGSEGV/SIGBUS to the previously installed action.
//! - A fault from a thread other than the registered application thread aborts with a message
//!   (it could otherwise deadlock or break the page-sharing rule).
//! - **Fast path**: a write to a `READ_ONLY` page is resolved in the handler: copy the page
//!   (runtime view) to its twin, make it writable (`mprotect`, or `UFFDIO_WRITEPROTECT` clearing
//!   WP), mark it `READ_WRITE`, push it onto the ring ([`Heap::drain_fast_twins`]). No wake-up: whoever takes the node next
//!   drains the ring before its protocol step.
//! - **Slow path**: an access to an `INVALID` page (or a write to a `FROZEN` one) stores
//!   `(page, kind)` in the [`Doorbell`] slot, rings the service eventfd, polls for the
//!   resolution for a while ([`Doorbell::set_spin`]) and then blocks on the app eventfd until the
//!   service thread calls [`Doorbell::fault_resolved`]; then the access is retried (and may
//!   fault again).
//! - A fault that finds the page already accessible (its protection changed while the fault was
//!   delivered) or `BUSY` is simply retried.
//!
//! # Event-ordering hazards (userfaultfd), each named in a comment where it is met
//! - *A fault racing an invalidation*: the handler reads the page state after the fault, so a
//!   page invalidated between the access and the handler is handed off like any miss
//!   (`fault.rs`, `handle_uffd`).
//! - *EAGAIN while events are pending*: `UFFDIO_CONTINUE`/`WRITEPROTECT` fail with EAGAIN while
//!   the address space changes (`mmap_changing`, set only by non-cooperative event features,
//!   which we do not enable); the call is retried, after any partial progress (`uffd.rs`).
//! - *A fault on a page being installed*: the application faults on a page whose PTE the
//!   service thread is installing: it finds `BUSY` and retries; and `UFFDIO_CONTINUE` that finds
//!   the PTE present already (EEXIST) gives it the protection asked for instead (`uffd.rs`,
//!   `fault.rs`).
//! - System calls that *read* a heap page (e.g. `write(2)` from a heap buffer) fail with EFAULT
//!   on userfaultfd when the page's PTE is missing, even if the page is valid (the uffd is
//!   `UFFD_USER_MODE_ONLY`): copy through private memory, as for writes into the heap.
//!
//! # Hazards the runtime must respect
//! - The fast path twins any `READ_ONLY` page on the first write, overwriting the twin slot,
//!   unless the page's last twin is still in the ring, untaken (`Heap::twin_at_fault`): a twin
//!   the node has not heard of stays. A page made `Read` while a twin the node *has* taken is
//!   still needed (a diff not yet made: lazy diffing) loses that twin at the next application
//!   write. Make the diff before re-protecting to `Read`, or revoke to `None` or freeze (slow
//!   path, the service thread decides), while a twin is pending.
//! - A `READ_ONLY` page can become writable at any instant through the fast path, so a slice
//!   from `page()`/`twin()` of a `Read` page may observe concurrent application stores. To read a
//!   page stably, revoke to `None` or freeze it first; to copy a page the application may be
//!   writing, use `snapshot` (atomic word loads, no reference to the bytes).
//! - The service thread must tolerate a slow-path fault for a page that is valid by the time it
//!   looks (just call `fault_resolved`), and must always wake the application thread eventually: it
//!   is blocked inside a signal handler.
//! - An `mprotect` (or userfaultfd) failure in `set_access` panics (the trait cannot return it); the runtime
//!   turns such a panic, on the service thread or on the application thread running an
//!   operation itself, into a process exit, or the application thread could stay blocked.

mod backend;
pub mod bytes;
pub mod chunk;
mod doorbell;
mod error;
mod fault;
mod heap;
pub mod malloc;
pub mod orphan;
pub mod pack;
mod pages;
pub mod probe;
mod query;
mod ring;
pub mod sched;
mod service_fd;
mod signals;
mod sigsafe;
mod state;
mod uffd;
mod view;

#[cfg(test)]
pub(crate) mod tests;

pub use backend::{FaultBackend, FaultsMode, MAP_COUNT_MARGIN, fit_heap, select_backend, uffd_support};
pub use doorbell::{Doorbell, FaultKind};
pub(crate) use error::Bytes;
pub use error::MemError;
pub use fault::FaultHandler;
pub(crate) use heap::system_page_size;
pub use heap::{FaultCounters, Heap, HeapLayout};
pub use pages::HeapPages;
pub use service_fd::{ServiceFd, register_service_fd};
pub use uffd::Unavailable as UffdUnavailable;
pub use view::{BorrowTracker, Shared, View, ViewError, ViewMut};

/// Writes `bytes` to standard error with `write(2)` directly, never through the standard
/// library's lock on it (see [`crate::report`]).
pub(crate) fn write_stderr(bytes: &[u8]) {
    sigsafe::write_stderr(&[bytes]);
}
