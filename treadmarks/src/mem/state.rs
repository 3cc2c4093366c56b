//! Per-page protection state, kept in step with the application view's real protection.
//!
//! | value        | app-view protection | meaning                                               |
//! |--------------|---------------------|-------------------------------------------------------|
//! | `INVALID`    | `PROT_NONE`         | any access faults and is handed to the service thread |
//! | `READ_ONLY`  | `PROT_READ`         | valid; a write faults and is twinned in the handler   |
//! | `READ_WRITE` | `PROT_READ|WRITE`   | valid and writable; has a twin (or the job has 1 node) |
//! | `FROZEN`     | `PROT_READ`         | valid, its twin being cut: reads go on, a write is handed to the service thread like a miss |
//! | `BUSY`       | in transition       | one owner is changing protection or copying the page  |
//!
//! Transitions: only the owner of `BUSY` (whoever CASed a stable value to it) may store the next
//! stable value. Owners are the signal handler (`READ_ONLY → BUSY → READ_WRITE`, never blocking
//! while it holds `BUSY`) and `HeapPages` on the service thread (`set_access`, `make_twin`), which
//! also never wait on the application thread while holding `BUSY`. So `BUSY` is always released
//! in bounded time, once its owner runs, and everybody else waits it out ([`Backoff`]): yielding
//! at first, then sleeping, because the owner may be the application's fault handler on the
//! waiter's own CPU at a lower priority than a real-time service thread, which a yield never
//! hands the CPU to.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::protocol::memory::Access;

/// `PROT_NONE`.
pub(super) const INVALID: u8 = 0;
/// `PROT_READ`.
pub(super) const READ_ONLY: u8 = 1;
/// `PROT_READ | PROT_WRITE`.
pub(super) const READ_WRITE: u8 = 2;
/// A transition is in progress; only its owner may finish it.
pub(super) const BUSY: u8 = 3;
/// `PROT_READ` (write-protected on userfaultfd) while the service thread cuts the page's twin:
/// the application may read it, and a write waits in the slow path until the cut is done.
/// Reported to the protocol core as [`Access::None`].
pub(super) const FROZEN: u8 = 4;

/// The stable state for an [`Access`].
pub(super) fn from_access(access: Access) -> u8 {
    match access {
        Access::None => INVALID,
        Access::Read => READ_ONLY,
        Access::ReadWrite => READ_WRITE,
    }
}

/// The [`Access`] of a stable state. Panics on `BUSY` or garbage (a bug in this module).
pub(super) fn to_access(state: u8) -> Access {
    match state {
        INVALID | FROZEN => Access::None,
        READ_ONLY => Access::Read,
        READ_WRITE => Access::ReadWrite,
        other => panic!("page state {other} has no Access (bug in treadmarks::mem)"),
    }
}

/// The name of a state, for messages.
pub(super) fn name(state: u8) -> &'static str {
    match state {
        INVALID => "INVALID",
        READ_ONLY => "READ_ONLY",
        READ_WRITE => "READ_WRITE",
        BUSY => "BUSY",
        FROZEN => "FROZEN",
        _ => "corrupt",
    }
}

/// The `mprotect` flags of a stable state.
pub(super) fn prot(state: u8) -> libc::c_int {
    match state {
        INVALID => libc::PROT_NONE,
        READ_ONLY | FROZEN => libc::PROT_READ,
        READ_WRITE => libc::PROT_READ | libc::PROT_WRITE,
        other => panic!("page state {other} has no protection (bug in treadmarks::mem)"),
    }
}

/// Waiting out another thread's `BUSY`: a few yields (an owner on another CPU is done within
/// microseconds), then sleeps of 1 µs doubling up to 64 µs (a thread of normal priority sleeps
/// at least its timer slack, 50 µs by default; a real-time one, no more than asked). A sleep lets the owner run where a
/// yield may not: the service thread runs at real-time priority on the application's CPU in a
/// local job, and its `sched_yield` never gives the CPU to the application thread, whose fault
/// handler may hold the `BUSY` it waits for; yielding alone, it waited until the kernel's
/// real-time throttling stopped it, ~0.95 s.
#[derive(Debug, Default)]
pub(super) struct Backoff(u32);

impl Backoff {
    /// Yields before sleeping.
    const YIELDS: u32 = 8;

    pub(super) fn wait(&mut self) {
        if self.0 < Self::YIELDS {
            std::thread::yield_now();
        } else {
            let shift = (self.0 - Self::YIELDS).min(6);
            std::thread::sleep(std::time::Duration::from_micros(1 << shift));
        }
        self.0 = self.0.saturating_add(1);
    }
}

/// Waits ([`Backoff`]) until `state` is stable, then CASes it to `BUSY`. Returns the stable
/// value it replaced, which the caller must eventually store back or replace. Not for signal
/// handlers.
pub(super) fn acquire_busy(state: &AtomicU8) -> u8 {
    let mut backoff = Backoff::default();
    loop {
        let s = state.load(Ordering::Acquire);
        if s != BUSY && state.compare_exchange_weak(s, BUSY, Ordering::Acquire, Ordering::Relaxed).is_ok() {
            return s;
        }
        backoff.wait();
    }
}

/// Waits ([`Backoff`]) until `state` is stable and returns it. Not for signal handlers.
pub(super) fn load_stable(state: &AtomicU8) -> u8 {
    let mut backoff = Backoff::default();
    loop {
        let s = state.load(Ordering::Acquire);
        if s != BUSY {
            return s;
        }
        backoff.wait();
    }
}
