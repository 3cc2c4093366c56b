//! Async-signal-safe helpers for the fault handlers: errno preservation, thread ids, and
//! messages to stderr without allocation or locks.
//!
//! Everything here may run inside a SIGSEGV handler: no allocation, no locks, no formatting
//! machinery, only raw system calls and stack buffers.

/// Saves `errno` on creation and restores it on drop, so a handler does not clobber the errno
/// of the code it interrupted.
pub(super) struct ErrnoGuard(libc::c_int);

impl ErrnoGuard {
    pub(super) fn save() -> Self {
        // SAFETY: `__errno_location` returns this thread's errno slot, valid for the thread's
        // lifetime; reading it is async-signal-safe.
        ErrnoGuard(unsafe { *libc::__errno_location() })
    }
}

impl Drop for ErrnoGuard {
    fn drop(&mut self) {
        // SAFETY: as in `save`: the slot belongs to the current thread, which is running us.
        unsafe { *libc::__errno_location() = self.0 };
    }
}

/// The kernel thread id of the calling thread (async-signal-safe: a raw system call).
pub(super) fn gettid() -> libc::pid_t {
    // SAFETY: `gettid` takes no arguments, cannot fail and touches no memory.
    unsafe { libc::syscall(libc::SYS_gettid) as libc::pid_t }
}

/// `CLOCK_MONOTONIC` in nanoseconds (async-signal-safe).
pub(super) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `clock_gettime` is async-signal-safe and writes only the live local `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).wrapping_mul(1_000_000_000).wrapping_add(ts.tv_nsec as u64)
}

/// The current `errno` of this thread.
pub(super) fn errno() -> libc::c_int {
    // SAFETY: see `ErrnoGuard::save`.
    unsafe { *libc::__errno_location() }
}

/// Writes `parts` to stderr with raw `write` calls, ignoring errors (there is nobody to tell).
pub(super) fn write_stderr(parts: &[&[u8]]) {
    for part in parts {
        let mut rest = *part;
        while !rest.is_empty() {
            // SAFETY: `rest` is a live byte slice; `write` reads at most `rest.len()` bytes of it.
            let n = unsafe { libc::write(libc::STDERR_FILENO, rest.as_ptr().cast(), rest.len()) };
            if n > 0 {
                rest = &rest[n as usize..];
            } else if n < 0 && errno() == libc::EINTR {
                continue;
            } else {
                break;
            }
        }
    }
}

/// Writes `parts` to stderr and aborts the process (SIGABRT). Async-signal-safe.
pub(super) fn abort_with(parts: &[&[u8]]) -> ! {
    write_stderr(parts);
    // SAFETY: `abort` is async-signal-safe and never returns.
    unsafe { libc::abort() }
}

/// `0x` and 16 lowercase hex digits, leading zeros trimmed, in a stack buffer.
pub(super) struct Hex {
    buf: [u8; 18],
    start: usize,
}

impl Hex {
    pub(super) fn new(value: usize) -> Self {
        let mut buf = [b'0'; 18];
        let mut v = value as u64;
        let mut i = buf.len();
        loop {
            i -= 1;
            buf[i] = b"0123456789abcdef"[(v & 0xf) as usize];
            v >>= 4;
            if v == 0 {
                break;
            }
        }
        i -= 2;
        buf[i] = b'0';
        buf[i + 1] = b'x';
        Hex { buf, start: i }
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

/// Decimal digits of `value` in a stack buffer.
pub(super) struct Dec {
    buf: [u8; 20],
    start: usize,
}

impl Dec {
    pub(super) fn new(value: u64) -> Self {
        let mut buf = [b'0'; 20];
        let mut v = value;
        let mut i = buf.len();
        loop {
            i -= 1;
            buf[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        Dec { buf, start: i }
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_dec_format() {
        assert_eq!(Hex::new(0).as_bytes(), b"0x0");
        assert_eq!(Hex::new(0x6000_0000_1234).as_bytes(), b"0x600000001234");
        assert_eq!(Hex::new(usize::MAX).as_bytes(), b"0xffffffffffffffff");
        assert_eq!(Dec::new(0).as_bytes(), b"0");
        assert_eq!(Dec::new(u64::MAX).as_bytes(), b"18446744073709551615");
    }
}
