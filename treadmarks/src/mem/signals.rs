//! Installing, restoring and chaining process-wide signal handlers, and the claim that makes
//! sure only one user of this layer (the [`FaultHandler`](super::FaultHandler) or the
//! [`probe`](super::probe)) owns SIGSEGV at a time.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

use super::error::MemError;
use super::sigsafe;

/// Signature of an `SA_SIGINFO` handler.
pub(super) type SigactionFn = unsafe extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void);

const NOBODY: u8 = 0;
const FAULT_HANDLER: u8 = 1;
const PROBE: u8 = 2;

/// Who owns this layer's SIGSEGV handler now.
static OWNER: AtomicU8 = AtomicU8::new(NOBODY);

/// Who may own the handler.
#[derive(Clone, Copy, Debug)]
pub(super) enum Owner {
    FaultHandler,
    Probe,
}

impl Owner {
    fn code(self) -> u8 {
        match self {
            Owner::FaultHandler => FAULT_HANDLER,
            Owner::Probe => PROBE,
        }
    }
}

/// Ownership of the process-wide SIGSEGV handler for this layer; released on drop.
#[derive(Debug)]
pub(super) struct Claim(());

impl Claim {
    /// Takes ownership, or says who has it.
    pub(super) fn take(owner: Owner, op: &'static str) -> Result<Claim, MemError> {
        match OWNER.compare_exchange(NOBODY, owner.code(), Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Ok(Claim(())),
            Err(current) => Err(MemError::HandlerBusy {
                op,
                owner: match current {
                    FAULT_HANDLER => "an installed treadmarks FaultHandler",
                    _ => "a running treadmarks fault probe",
                },
            }),
        }
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        OWNER.store(NOBODY, Ordering::Release);
    }
}

/// The name of a signal we handle, for messages.
pub(super) fn name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        _ => "signal",
    }
}

/// The current action for `sig`.
pub(super) fn query(sig: libc::c_int) -> Result<libc::sigaction, MemError> {
    // SAFETY: `sigaction` is plain old data; all-zero is a valid (SIG_DFL) value.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only reads the current one into `old`, a live local.
    let rc = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
    if rc != 0 {
        return Err(MemError::Sigaction {
            op: "query",
            signal: name(sig),
            source: io::Error::last_os_error(),
        });
    }
    Ok(old)
}

/// Installs `handler` for `sig` with `SA_SIGINFO | SA_ONSTACK`, blocking nothing extra.
pub(super) fn install(sig: libc::c_int, handler: SigactionFn) -> Result<(), MemError> {
    // SAFETY: as in `query`.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = handler as usize;
    action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: `sa_mask` is a live field of a local; `sigemptyset` only writes it.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: `action` is fully initialized and `handler` is an `extern "C"` SA_SIGINFO function
    // that stays valid for the life of the process (it is a static function).
    let rc = unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(MemError::Sigaction {
            op: "install",
            signal: name(sig),
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// The action that was installed for a signal before ours, which a signal that is not ours goes
/// to ([`chain`]).
///
/// Invariant: it behaves as the kernel would have without us. A one-shot action
/// (`SA_RESETHAND`) is delivered once; after that the signal's action is `SIG_DFL`, both for
/// what we pass on and for what [`restore`](Previous::restore) puts back. (Passed on again and
/// again, a one-shot handler that returns would see the same fault forever, where the kernel
/// alone would have killed the process on its second delivery.)
#[derive(Debug)]
pub(super) struct Previous {
    action: libc::sigaction,
    /// A one-shot action has had its delivery.
    spent: AtomicBool,
}

impl Previous {
    /// The current action for `sig`, to be replaced by ours.
    pub(super) fn query(sig: libc::c_int) -> Result<Previous, MemError> {
        Ok(Previous { action: query(sig)?, spent: AtomicBool::new(false) })
    }

    /// The action a signal that is not ours goes to now, as a copy (the caller may pass it on
    /// after the context holding `self` is gone). Async-signal-safe.
    pub(super) fn take(&self) -> libc::sigaction {
        // The kernel resets a one-shot action when it runs its handler; an ignored or default
        // one stays as it is.
        let handler = self.action.sa_sigaction;
        let runs = handler != libc::SIG_DFL && handler != libc::SIG_IGN;
        if runs && self.action.sa_flags & libc::SA_RESETHAND != 0 && self.spent.swap(true, Ordering::AcqRel) {
            return default_action();
        }
        self.action
    }

    /// After [`restore`](Previous::restore) and once no handler of ours runs any more: if a
    /// handler that was already delivered to ours when the action was put back passed the
    /// signal on to a one-shot action, that action has had its delivery, so `SIG_DFL` goes in
    /// its place (otherwise the kernel would run it once more).
    pub(super) fn settle(&self, sig: libc::c_int) {
        if self.spent.load(Ordering::Acquire) {
            self.restore(sig);
        }
    }

    /// Puts the action back for `sig` (`SIG_DFL` if it was a one-shot action that was
    /// delivered). Failure is impossible for a valid signal and a previously valid action; it
    /// is reported on stderr if it happens anyway.
    pub(super) fn restore(&self, sig: libc::c_int) {
        let action = if self.spent.load(Ordering::Acquire) { default_action() } else { self.action };
        // SAFETY: `action` was returned by the kernel for this signal, or is SIG_DFL, so it is a
        // valid action.
        let rc = unsafe { libc::sigaction(sig, &action, std::ptr::null_mut()) };
        if rc != 0 {
            sigsafe::write_stderr(&[
                b"treadmarks: cannot restore the previous ",
                name(sig).as_bytes(),
                b" handler\n",
            ]);
        }
    }
}

/// `SIG_DFL` with no flags and an empty mask.
fn default_action() -> libc::sigaction {
    // SAFETY: `sigaction` is plain old data; all-zero is SIG_DFL with no flags and an empty mask.
    let mut dfl: libc::sigaction = unsafe { std::mem::zeroed() };
    dfl.sa_sigaction = libc::SIG_DFL;
    dfl
}

/// Passes a signal that is not ours to the handler that was installed before us, as the kernel
/// would have delivered it.
///
/// A `SA_SIGINFO` handler gets the same three arguments; a plain handler gets the signal number.
/// Either runs with the signal mask the kernel would have given it: the interrupted code's mask
/// (`uc_sigmask`) plus the action's `sa_mask`, plus `sig` itself unless `SA_NODEFER`; our mask
/// is back when it returns. `SIG_DFL` makes us reset the signal to its default action and
/// return, so the faulting access runs again and the process dies the way it would have without
/// us (a signal a process sent is raised again). `SIG_IGN` ignores a signal a process sent, as
/// the kernel would have; a fault cannot be ignored (the kernel kills the process for it), so it
/// is handled as `SIG_DFL`. `prev` comes from [`Previous::take`], which has already turned a
/// one-shot action that was delivered into `SIG_DFL`.
///
/// # Safety
/// Must be called from a handler for `sig`, with the `info` and `uctx` the kernel gave it, and
/// `prev` must be the action that was installed for `sig` before ours (it holds function pointers
/// that get called).
pub(super) unsafe fn chain(
    prev: &libc::sigaction,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uctx: *mut libc::c_void,
) {
    let handler = prev.sa_sigaction;
    // SAFETY: `info` is the kernel's siginfo for this delivery.
    let sent = unsafe { (*info).si_code } <= 0;
    if handler == libc::SIG_IGN && sent {
        return;
    }
    if handler == libc::SIG_DFL || handler == libc::SIG_IGN {
        let dfl = default_action();
        // SAFETY: installing SIG_DFL is always valid; `sigaction` is async-signal-safe.
        unsafe { libc::sigaction(sig, &dfl, std::ptr::null_mut()) };
        // A signal sent by a process (not a fault) does not recur when we return: resend it.
        if sent {
            // SAFETY: `raise` is async-signal-safe; the signal stays blocked until we return.
            unsafe { libc::raise(sig) };
        }
        return;
    }
    // SAFETY: `uctx` is the kernel's ucontext for this delivery, which records the interrupted
    // code's mask.
    let ours = unsafe { mask_for(prev, sig, uctx) };
    if prev.sa_flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous owner installed this value as an SA_SIGINFO handler, so it is a
        // function with this signature (the caller guarantees `prev` is that action).
        let f: SigactionFn = unsafe { std::mem::transmute::<usize, SigactionFn>(handler) };
        // SAFETY: the same arguments the kernel gave us, as that handler expects.
        unsafe { f(sig, info, uctx) };
    } else {
        // SAFETY: a non-SA_SIGINFO, non-default handler is a `void (*)(int)`.
        let f: extern "C" fn(libc::c_int) =
            unsafe { std::mem::transmute::<usize, extern "C" fn(libc::c_int)>(handler) };
        f(sig);
    }
    // SAFETY: `ours` is the mask this handler ran with, read by `mask_for`;
    // `pthread_sigmask` is async-signal-safe.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &ours, std::ptr::null_mut()) };
}

/// Sets the calling thread's mask to the one the kernel would have given `prev`'s handler for
/// `sig` and returns the mask it replaced.
///
/// # Safety
/// `uctx` must be the `ucontext_t` the kernel passed to a handler for `sig`.
unsafe fn mask_for(prev: &libc::sigaction, sig: libc::c_int, uctx: *mut libc::c_void) -> libc::sigset_t {
    // SAFETY: the caller's contract: a live `ucontext_t`, which holds the interrupted mask.
    let mut mask = unsafe { (*uctx.cast::<libc::ucontext_t>()).uc_sigmask };
    // Linux's signals are 1..=64 (`_NSIG` is 65); glibc's `sigaddset` leaves alone the two it
    // keeps for itself (32 and 33), which its `pthread_sigmask` would not change anyway.
    for s in 1..65 {
        // SAFETY: `sa_mask` is an initialized set; `s` is a valid signal number.
        if unsafe { libc::sigismember(&prev.sa_mask, s) } == 1 {
            // SAFETY: `mask` is an initialized set.
            unsafe { libc::sigaddset(&mut mask, s) };
        }
    }
    // SAFETY: `mask` is an initialized set and `sig` a valid signal number.
    unsafe {
        if prev.sa_flags & libc::SA_NODEFER == 0 {
            libc::sigaddset(&mut mask, sig);
        } else {
            libc::sigdelset(&mut mask, sig);
        }
    }
    // SAFETY: zeroed is a valid (empty) set, filled in by `pthread_sigmask`.
    let mut ours: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: both sets are live locals; `pthread_sigmask` is async-signal-safe.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &mask, &mut ours) };
    ours
}
