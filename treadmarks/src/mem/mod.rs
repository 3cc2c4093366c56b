//! Shared heap mapping, page protection and fault capture: the only `unsafe` code of the crate.
//!
//! # What this module owns
//! - the shared heap ([`Heap`]): one memfd mapped twice, plus a twin area (design decision 2);
//! - the per-page protection state, kept in step with the application view's real protection;
//! - the process-wide SIGSEGV/SIGBUS handler ([`FaultHandler`]) and its hand-off to the runtime's
//!   service thread ([`Doorbell`]) (design decisions 3 and 4);
//! - [`HeapPages`], the protocol core's [`PageMemory`](crate::protocol::memory::PageMemory) over
//!   the real heap.
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
//!   twin area (MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, `size` bytes, committed on touch)
//!                 ┌────────┬────────┬────────┬─────┬──────────┐
//!                 │ twin 0 │ twin 1 │ twin 2 │ ... │ twin n-1 │   twin p at twin_base + p*page_size
//!                 └────────┴────────┴────────┴─────┴──────────┘
//!
//!   states: [AtomicU8; n]   INVALID | READ_ONLY | READ_WRITE | BUSY   (see below)
//!   ring:   SPSC [u32; n]   pages twinned by the handler, drained by the service thread
//! ```
//!
//! # Page state (one `AtomicU8` per page)
//! `INVALID` (PROT_NONE), `READ_ONLY` (PROT_READ), `READ_WRITE` (PROT_READ|PROT_WRITE) and
//! `BUSY`: a transition is in progress and only the thread that CASed the page to `BUSY` may store
//! the next state. Owners of `BUSY`:
//! - the signal handler on the application thread: `READ_ONLY → BUSY → READ_WRITE` (fast path);
//! - `HeapPages::set_access` on the service thread: any stable state `→ BUSY →` the new one,
//!   with one `mprotect` for the whole run in between;
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
//! - Violations are bugs in the caller and panic with the page and its state.
//!
//! # Faults
//! The [`FaultHandler`] handles faults whose address lies inside the heap's application view and
//! chains every other SIGSEGV/SIGBUS to the previously installed action.
//! - A fault from a thread other than the registered application thread aborts with a message
//!   (it could otherwise deadlock or break the page-sharing rule).
//! - **Fast path**: a write to a `READ_ONLY` page is resolved in the handler: copy the page
//!   (runtime view) to its twin, `mprotect` it read-write, mark it `READ_WRITE`, push it onto the
//!   ring ([`Heap::drain_fast_twins`]). No wake-up: the service thread drains the ring before each
//!   protocol step.
//! - **Slow path**: an access to an `INVALID` page stores `(page, kind)` in the [`Doorbell`]
//!   slot, rings the service eventfd and blocks on the app eventfd until the service thread
//!   calls [`Doorbell::wake_app`]; then the access is retried (and may fault again).
//! - A fault that finds the page already accessible (its protection changed while the fault was
//!   delivered) or `BUSY` is simply retried.
//!
//! # Hazards the runtime must respect
//! - The fast path twins any `READ_ONLY` page on the first write, overwriting the twin slot.
//!   A page made `Read` while its twin is still needed (a diff not yet made: lazy diffing) loses
//!   that twin at the next application write. Make the diff before re-protecting to `Read`, or
//!   revoke to `None` (slow path, the service thread decides), while a twin is pending.
//! - A `READ_ONLY` page can become writable at any instant through the fast path, so a slice
//!   from `page()`/`twin()` of a `Read` page may observe concurrent application stores. To read a
//!   page stably, revoke to `None` first (or accept racy bytes, as TreadMarks does).
//! - The service thread must tolerate a slow-path fault for a page that is valid by the time it
//!   looks (just call `wake_app`), and must always wake the application thread eventually: it
//!   is blocked inside a signal handler.
//! - An `mprotect` failure in `set_access` panics (the trait cannot return it); the runtime should
//!   turn a panic of the service thread into a process exit, or the application thread stays
//!   blocked.

mod backend;
mod doorbell;
mod error;
mod fault;
mod heap;
mod pages;
pub mod probe;
mod ring;
mod service_fd;
mod signals;
mod sigsafe;
mod state;
mod uffd;
mod view;

#[cfg(test)]
mod tests;

pub use backend::{FaultBackend, FaultsMode, MAP_COUNT_MARGIN, select_backend, uffd_support};
pub use doorbell::{Doorbell, FaultKind};
pub use error::MemError;
pub use fault::FaultHandler;
pub use heap::{FaultCounters, Heap, HeapLayout};
pub use pages::HeapPages;
pub use service_fd::{ServiceFd, register_service_fd};
pub use uffd::Unavailable as UffdUnavailable;
pub use view::{BorrowTracker, Shared, View, ViewError, ViewMut};
