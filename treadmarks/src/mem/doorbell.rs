//! [`Doorbell`]: the hand-off of a slow-path fault from the application thread (inside the
//! signal handler) to the service thread, and the wake-up back.
//!
//! ```text
//!  app thread (in SIGSEGV handler)              service thread (tokio, AsyncFd on service_fd)
//!  ───────────────────────────────              ─────────────────────────────────────────────
//!  slot.store(page | kind | PRESENT) ──┐
//!  ring_service(): write(service_fd,1) ┼──────▶ readable → clear_service()
//!  wait_app(): read(app_fd) blocks     │        take_fault() → Some((page, kind))
//!        ...                           │        fetch / apply diffs via HeapPages, set_access
//!  read returns ◀──────────────────────┴─────── wake_app(): write(app_fd, 1)
//!  return from handler: access retried
//! ```
//!
//! Everything the application side does is async-signal-safe: one atomic store and raw
//! `read`/`write` system calls on eventfds created up front. There is one application thread,
//! so at most one fault is pending at a time and one `AtomicU64` slot suffices.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::MemError;
use super::sigsafe;
use crate::protocol::ids::PageIdx;

/// What the faulting access was, as far as the hardware tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// A load.
    Read,
    /// A store.
    Write,
    /// The platform does not say (only x86_64 decodes the error code for now).
    Unknown,
}

const PRESENT: u64 = 1 << 63;
const KIND_SHIFT: u32 = 32;

fn encode(page: u32, kind: FaultKind) -> u64 {
    let k: u64 = match kind {
        FaultKind::Read => 0,
        FaultKind::Write => 1,
        FaultKind::Unknown => 2,
    };
    PRESENT | (k << KIND_SHIFT) | u64::from(page)
}

fn decode(word: u64) -> Option<(PageIdx, FaultKind)> {
    if word & PRESENT == 0 {
        return None;
    }
    let kind = match (word >> KIND_SHIFT) & 0x3 {
        0 => FaultKind::Read,
        1 => FaultKind::Write,
        _ => FaultKind::Unknown,
    };
    Some((PageIdx(word as u32), kind))
}

/// See the module docs. Shared as `Arc<Doorbell>` by the fault handler and the service thread.
#[derive(Debug)]
pub struct Doorbell {
    /// Nonblocking; written by the app side, polled by the service thread.
    service: OwnedFd,
    /// Blocking; read by the app side, written by the service thread.
    app: OwnedFd,
    /// The pending slow-path fault: `PRESENT | kind << 32 | page`, or 0.
    slot: AtomicU64,
    /// Faults the service thread has resolved. The application's eventfd also carries command
    /// replies, and a wake-up can arrive after its reply was taken by polling; a thread blocked
    /// in a fault therefore waits until this count moves, not merely for a wake-up.
    resolved: AtomicU64,
    /// How long a thread in a fault polls `resolved` before it sleeps, in nanoseconds.
    spin_ns: AtomicU64,
}

fn eventfd(which: &'static str, flags: libc::c_int) -> Result<OwnedFd, MemError> {
    // SAFETY: plain syscall, no pointers.
    let fd = unsafe { libc::eventfd(0, flags | libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(MemError::Eventfd { which, source: io::Error::last_os_error() });
    }
    // SAFETY: `fd` was just returned by `eventfd` and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds 1 to an eventfd counter. Async-signal-safe. Only fails if the counter would overflow
/// (2^64 - 2 unread wake-ups), which cannot happen with one waiter.
fn post(fd: RawFd) {
    let one: u64 = 1;
    loop {
        // SAFETY: writes 8 bytes from a live local, as eventfd requires.
        let n = unsafe { libc::write(fd, (&raw const one).cast(), 8) };
        if n == 8 || sigsafe::errno() != libc::EINTR {
            return;
        }
    }
}

impl Doorbell {
    /// Creates the two eventfds and an empty fault slot.
    pub fn new() -> Result<Arc<Doorbell>, MemError> {
        Ok(Arc::new(Doorbell {
            service: eventfd("service", libc::EFD_NONBLOCK)?,
            app: eventfd("app", 0)?,
            slot: AtomicU64::new(0),
            resolved: AtomicU64::new(0),
            spin_ns: AtomicU64::new(0),
        }))
    }

    /// How long the application thread, blocked in a fault or waiting for the service thread's
    /// reply, polls for it (yielding the CPU between looks) before it sleeps on its eventfd:
    /// waking a sleeping thread costs tens of microseconds on some machines, more than a miss
    /// of local data takes. Zero (the default) sleeps at once.
    pub fn set_spin(&self, spin: std::time::Duration) {
        self.spin_ns.store(u64::try_from(spin.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// The polling budget [`Doorbell::set_spin`] set.
    pub fn spin(&self) -> std::time::Duration {
        std::time::Duration::from_nanos(self.spin_ns.load(Ordering::Relaxed))
    }

    /// The nonblocking eventfd the service thread waits on (e.g. in `tokio::io::unix::AsyncFd`).
    /// Readable when a slow-path fault is pending. Owned by the doorbell: do not close it.
    pub fn service_fd(&self) -> RawFd {
        self.service.as_raw_fd()
    }

    /// App side: tells the service thread a fault is pending. Async-signal-safe.
    pub fn ring_service(&self) {
        post(self.service.as_raw_fd());
    }

    /// Service side: resets the service eventfd so it can signal again. Nonblocking.
    pub fn clear_service(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live local; the fd is nonblocking, so EAGAIN
        // (nothing pending) just returns.
        unsafe { libc::read(self.service.as_raw_fd(), (&raw mut value).cast(), 8) };
    }

    /// App side: blocks until the service thread calls [`Doorbell::wake_app`], retrying on
    /// EINTR. Async-signal-safe. Consumes all wake-ups posted so far.
    pub fn wait_app(&self) {
        let mut value: u64 = 0;
        loop {
            // SAFETY: reads at most 8 bytes into a live local.
            let n = unsafe { libc::read(self.app.as_raw_fd(), (&raw mut value).cast(), 8) };
            if n == 8 {
                return;
            }
            let err = sigsafe::errno();
            if n < 0 && err == libc::EINTR {
                continue;
            }
            // EBADF/EINVAL: the doorbell is broken; nobody can ever wake us. Do not deadlock.
            sigsafe::abort_with(&[
                b"treadmarks: the application thread cannot wait on the fault doorbell (errno ",
                sigsafe::Dec::new(err as u64).as_bytes(),
                b")\n",
            ]);
        }
    }

    /// Service side: lets the application thread blocked in [`Doorbell::wait_app`] go on.
    pub fn wake_app(&self) {
        post(self.app.as_raw_fd());
    }

    /// Service side: takes the pending slow-path fault, if any, clearing the slot.
    pub fn take_fault(&self) -> Option<(PageIdx, FaultKind)> {
        decode(self.slot.swap(0, Ordering::Acquire))
    }

    /// App side: publishes a fault for the service thread. Async-signal-safe.
    pub(super) fn post_fault(&self, page: u32, kind: FaultKind) {
        self.slot.store(encode(page, kind), Ordering::Release);
    }

    /// App side, in the fault handler: hands the fault to the service thread and blocks until
    /// the service thread has resolved it ([`Doorbell::fault_resolved`]); a stale wake-up (left
    /// over from a command reply) does not end the wait. Async-signal-safe.
    pub(super) fn hand_off_fault(&self, page: u32, kind: FaultKind) {
        let seen = self.resolved.load(Ordering::Acquire);
        self.post_fault(page, kind);
        self.ring_service();
        let spin = self.spin_ns.load(Ordering::Relaxed);
        if spin > 0 {
            let start = sigsafe::monotonic_ns();
            while sigsafe::monotonic_ns().saturating_sub(start) < spin {
                if self.resolved.load(Ordering::Acquire) != seen {
                    // The wake-up posted with the resolution stays unread; a later wait
                    // returns early once and re-checks, as for any stale wake-up.
                    return;
                }
                // SAFETY: no arguments; async-signal-safe. Lets the service thread run here.
                unsafe { libc::sched_yield() };
            }
        }
        loop {
            self.wait_app();
            if self.resolved.load(Ordering::Acquire) != seen {
                return;
            }
        }
    }

    /// Service side: the fault taken with [`Doorbell::take_fault`] is resolved; wakes the
    /// application thread blocked in it.
    pub fn fault_resolved(&self) {
        self.resolved.fetch_add(1, Ordering::Release);
        self.wake_app();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_round_trip() {
        for kind in [FaultKind::Read, FaultKind::Write, FaultKind::Unknown] {
            for page in [0, 1, 77, u32::MAX] {
                assert_eq!(decode(encode(page, kind)), Some((PageIdx(page), kind)));
            }
        }
        assert_eq!(decode(0), None);
    }

    #[test]
    fn doorbell_hand_off_between_threads() {
        let bell = Doorbell::new().unwrap();
        assert_eq!(bell.take_fault(), None);
        bell.clear_service(); // nothing pending: EAGAIN is fine
        let service = {
            let bell = bell.clone();
            std::thread::spawn(move || {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
                loop {
                    assert!(std::time::Instant::now() < deadline, "no fault posted within 20 s");
                    bell.clear_service();
                    if let Some(f) = bell.take_fault() {
                        bell.wake_app();
                        return f;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            })
        };
        bell.post_fault(42, FaultKind::Write);
        bell.ring_service();
        bell.wait_app();
        assert_eq!(service.join().unwrap(), (PageIdx(42), FaultKind::Write));
    }
}
