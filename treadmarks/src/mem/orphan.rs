//! A node a launcher spawned dies with the launcher, saying so. The kernel sends it
//! [`orphan_signal`] when the launcher exits, however it exits (`PR_SET_PDEATHSIG`), and the
//! handler writes the message set up here to standard error and exits with status 1: a node
//! whose launcher dies (node 0 itself, by `process::exit` or a crash) otherwise waits for a
//! job that is gone, or, killed outright, leaves no word of why.
//!
//! Invariant: the message is set before the handler is installed, and never changes after.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI32, Ordering};

use super::error::MemError;
use super::signals;
use super::sigsafe;

/// What the handler writes.
static MESSAGE: OnceLock<Box<[u8]>> = OnceLock::new();

/// The launcher's pid.
static PARENT: AtomicI32 = AtomicI32::new(0);

/// The signal the launcher's death sends: a real-time one, which no user of a terminal sends
/// by accident and applications rarely use.
pub fn orphan_signal() -> libc::c_int {
    libc::SIGRTMAX() - 1
}

extern "C" fn on_orphaned(_sig: libc::c_int, _info: *mut libc::siginfo_t, _uctx: *mut libc::c_void) {
    // The signal comes when the launcher's thread that spawned this process ends, which may
    // not be the launcher's end: still its child, this process goes on (the launcher's own
    // end closes its connections later, which the node reports).
    // SAFETY: `getppid` has no preconditions and is async-signal-safe.
    if unsafe { libc::getppid() } == PARENT.load(Ordering::Relaxed) {
        return;
    }
    // `OnceLock::get` is one atomic load; `write` and `_exit` are async-signal-safe.
    if let Some(message) = MESSAGE.get() {
        sigsafe::write_stderr(&[message]);
    }
    // SAFETY: `_exit` has no preconditions and never returns; it runs no user code, so it is
    // safe in a signal handler whatever the interrupted thread held.
    unsafe { libc::_exit(1) }
}

/// Makes this process print `message` and exit with status 1 when the process that spawned it,
/// `parent`, exits. Call once, before any other thread starts.
pub fn die_with_parent(parent: i32, message: &str) -> Result<(), MemError> {
    let _ = MESSAGE.set(message.as_bytes().into());
    PARENT.store(parent, Ordering::Relaxed);
    signals::install(orphan_signal(), on_orphaned)?;
    // (A real-time signal is none of nix's `Signal`s: the raw call.)
    // SAFETY: `prctl(PR_SET_PDEATHSIG, sig)` only records a signal number for this process.
    let rc = unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, orphan_signal() as libc::c_ulong, 0, 0, 0) };
    if rc != 0 {
        let source = std::io::Error::last_os_error();
        return Err(MemError::Sigaction {
            op: "die with the launcher",
            signal: "a real-time signal",
            source,
        });
    }
    Ok(())
}

/// Makes the process `cmd` starts die (SIGKILL) when the thread calling this ends, however it
/// ends, or the process with it: for the programs a test or a benchmark runner starts, which
/// must not outlive it even when it is killed outright and runs no `Drop`.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child ends, not the process: the
/// calling thread must outlive the child, or wait for it. The signal survives an `exec` of a
/// program that is not set-user-ID, and is cleared in the children the child forks. If this
/// process died between the fork and the hook, the child is already an orphan that no signal will
/// reach: it checks that its parent is still this process and otherwise exits at once (std's
/// `_exit(1)` after a failed hook).
pub fn die_with_this_thread(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as i32;
    // SAFETY: the hook runs in the child between fork and exec, where only async-signal-safe
    // calls are allowed: it makes two system calls (`prctl`, `getppid`) and builds an
    // `io::Error` from an errno, which allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            if nix::unistd::getppid().as_raw() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}
