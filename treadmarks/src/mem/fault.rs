//! [`FaultHandler`]: the process-wide SIGSEGV/SIGBUS handler that resolves write faults on
//! read-only pages in place (fast path) and hands every other heap fault to the service thread
//! (slow path). See the [module docs](super) for the protocol.
//!
//! On the userfaultfd backend the kernel raises SIGBUS for a uffd fault and the same handler
//! serves it (`handle_uffd`); a SIGBUS on an mprotect heap is a failure of the memfd and aborts.
//!
//! The handler is async-signal-safe: it touches only atomics, raw pointers into mappings made up
//! front, and raw system calls (`mprotect`, userfaultfd `ioctl`s, `read`, `write`,
//! `sched_yield`, `sigaction`, `abort`); it allocates nothing, takes no lock, logs nothing, and saves and restores `errno`.
//! It uses a few hundred bytes of stack (a copy of one `sigaction` to chain, a hex buffer).

use std::marker::PhantomData;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

use super::doorbell::{Doorbell, FaultKind};
use super::error::MemError;
use super::heap::{AtomicCounters, Heap};
use super::signals::{self, Claim, Owner, Previous};
use super::sigsafe::{self, ErrnoGuard, Hex};
use super::state;
use super::uffd::{Continued, Uffd};

/// What the handler reads, published through [`CONTEXT`] while a [`FaultHandler`] is installed.
struct Context {
    heap: Arc<Heap>,
    doorbell: Arc<Doorbell>,
    /// Kernel tid of the node's application thread.
    app_tid: libc::pid_t,
    prev_segv: Previous,
    prev_bus: Previous,
}

/// The installed context, or null. Set by `install`, swapped to null by `Drop` before freeing.
static CONTEXT: AtomicPtr<Context> = AtomicPtr::new(ptr::null_mut());
/// Handlers currently between loading [`CONTEXT`] and their last use of it. `Drop` waits for 0
/// before freeing the context. Chaining to a previous handler happens after leaving this count
/// (that handler may never return).
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Installs the heap's fault handler and unregisters it on drop. See [`FaultHandler::install`].
///
/// Not `Send`: it must be dropped on the application thread that installed it, which is then
/// certainly not blocked inside the handler.
#[derive(Debug)]
pub struct FaultHandler {
    ctx: *mut Context,
    _claim: Claim,
    _not_send: PhantomData<*const ()>,
}

impl FaultHandler {
    /// Installs the process-wide SIGSEGV and SIGBUS handler for `heap` (with `SA_SIGINFO |
    /// SA_ONSTACK`), saving the previous actions, and registers the calling thread as the node's
    /// application thread. At most one may be installed per process at a time (and not while
    /// [`probe::bare_fault_ns`](super::probe::bare_fault_ns) runs).
    pub fn install(heap: Arc<Heap>, doorbell: Arc<Doorbell>) -> Result<FaultHandler, MemError> {
        let claim = Claim::take(Owner::FaultHandler, "install the treadmarks fault handler")?;
        // Query the previous actions first, so the context is complete before our handler can
        // run on any thread.
        let prev_segv = Previous::query(libc::SIGSEGV)?;
        let prev_bus = Previous::query(libc::SIGBUS)?;
        let ctx = Box::into_raw(Box::new(Context {
            heap,
            doorbell,
            app_tid: sigsafe::gettid(),
            prev_segv,
            prev_bus,
        }));
        CONTEXT.store(ctx, Ordering::SeqCst);
        let guard = FaultHandler { ctx, _claim: claim, _not_send: PhantomData };
        // On error, dropping `guard` restores both saved actions and frees the context.
        signals::install(libc::SIGSEGV, handle_signal)?;
        signals::install(libc::SIGBUS, handle_signal)?;
        Ok(guard)
    }
}

impl Drop for FaultHandler {
    fn drop(&mut self) {
        // SAFETY: `self.ctx` came from `Box::into_raw` in `install` and is freed only below.
        let ctx = unsafe { &*self.ctx };
        ctx.prev_segv.restore(libc::SIGSEGV);
        ctx.prev_bus.restore(libc::SIGBUS);
        CONTEXT.store(ptr::null_mut(), Ordering::SeqCst);
        // A handler that loaded the context before the store may still be reading it. Only the
        // application thread (this one) can block in the handler, so this wait is short.
        while IN_FLIGHT.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        ctx.prev_segv.settle(libc::SIGSEGV);
        ctx.prev_bus.settle(libc::SIGBUS);
        // SAFETY: unpublished and no handler is using it any more (IN_FLIGHT is 0 after the
        // null store, so later handlers see null); `install` created it with `Box::into_raw`.
        drop(unsafe { Box::from_raw(self.ctx) });
    }
}

/// What to do after the heap logic ran.
enum Outcome {
    /// Return from the handler: the faulting access is retried.
    Retry,
    /// Not ours: pass to the previous handler (a copy of its action).
    Chain(libc::sigaction),
}

/// The SIGSEGV/SIGBUS entry point.
///
/// # Safety
/// Only the kernel calls it, as an `SA_SIGINFO` handler, with valid `info` and `uctx`.
unsafe extern "C" fn handle_signal(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    let _errno = ErrnoGuard::save();
    IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    let ctx = CONTEXT.load(Ordering::SeqCst);
    let outcome = if ctx.is_null() {
        // Uninstalled between the kernel choosing us and now; the previous action is back in
        // place. A fault recurs on return and goes there; a sent signal must be sent again.
        // SAFETY: `info` is valid (kernel contract).
        if unsafe { (*info).si_code } <= 0 {
            // SAFETY: async-signal-safe; delivered after we return.
            unsafe { libc::raise(sig) };
        }
        Outcome::Retry
    } else {
        // SAFETY: non-null CONTEXT points to a live `Context`: `Drop` frees it only after
        // swapping CONTEXT to null and seeing IN_FLIGHT drop to 0, and we are counted.
        let ctx = unsafe { &*ctx };
        // SAFETY: forwarded from the kernel.
        unsafe { handle_in_context(ctx, sig, info, uctx) }
    };
    IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    if let Outcome::Chain(prev) = outcome {
        // SAFETY: we are the handler for `sig` with the kernel's arguments; `prev` is the action
        // that was installed before ours.
        unsafe { signals::chain(&prev, sig, info, uctx) };
    }
}

/// `si_code` of a SIGSEGV for an access the mapping's protection forbids (Linux's
/// `asm-generic/siginfo.h`; the `libc` crate does not export it).
const SEGV_ACCERR: libc::c_int = 2;

/// The heap logic of the handler: decide whether the fault is ours and resolve or hand it off.
///
/// # Safety
/// Called from `handle_signal` with the kernel's `info` and `uctx`.
unsafe fn handle_in_context(
    ctx: &Context,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    uctx: *mut libc::c_void,
) -> Outcome {
    // SAFETY: `info` is the kernel's siginfo for a SIGSEGV/SIGBUS, which carries `si_addr`.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    let heap = &*ctx.heap;
    // Ours: a fault the kernel raised (a signal a process sent has a code of 0 or less) on the
    // heap; a SIGBUS only for an address it could not back (userfaultfd's SIGBUS mode, a full
    // tmpfs), not a hardware memory error (`BUS_MCEERR_*`), which every retry would meet again.
    let ours = code > 0 && (sig != libc::SIGBUS || code == libc::BUS_ADRERR);
    let page = match heap.page_of(addr) {
        Some(p) if ours => p,
        _ => {
            return Outcome::Chain(if sig == libc::SIGBUS { &ctx.prev_bus } else { &ctx.prev_segv }.take());
        }
    };
    if sigsafe::gettid() != ctx.app_tid {
        sigsafe::abort_with(&[
            b"treadmarks: shared heap accessed at ",
            Hex::new(addr).as_bytes(),
            b" from a thread that is not the node's application thread\n",
        ]);
    }
    if let Some(uffd) = heap.uffd() {
        if sig != libc::SIGBUS {
            // The userfaultfd view is mapped read-write: a SIGSEGV there is not a protection
            // fault of ours (the heap being unmapped, say). Let the previous action have it.
            return Outcome::Chain(ctx.prev_segv.take());
        }
        // SAFETY: `uctx` is the kernel's ucontext for this fault.
        let (kind, present) = unsafe { (fault_kind(uctx), fault_present(uctx)) };
        return handle_uffd(ctx, uffd, page, addr, kind, present);
    }
    if sig == libc::SIGBUS {
        sigsafe::abort_with(&[
            b"treadmarks: SIGBUS in the shared heap at ",
            Hex::new(addr).as_bytes(),
            b": the memfd could not supply the page (out of memory or tmpfs limit?)\n",
        ]);
    }
    if code != SEGV_ACCERR {
        // Every page of the view is mapped, so a protection fault of ours is an access error;
        // another code is not ours (a hole the application cut in the heap: `SEGV_MAPERR`; a
        // protection key: `SEGV_PKUERR`), and retrying would meet it again forever.
        return Outcome::Chain(ctx.prev_segv.take());
    }
    // SAFETY: `uctx` is the kernel's ucontext for this fault.
    let kind = unsafe { fault_kind(uctx) };
    let st = heap.state(page);
    let counters = &heap.counters;
    loop {
        match st.load(Ordering::Acquire) {
            state::READ_ONLY if kind == FaultKind::Read => {
                // Became readable while the fault was being delivered.
                AtomicCounters::bump(&counters.spurious_faults);
                return Outcome::Retry;
            }
            state::READ_ONLY => {
                if st
                    .compare_exchange(state::READ_ONLY, state::BUSY, Ordering::Acquire, Ordering::Relaxed)
                    .is_err()
                {
                    continue;
                }
                fast_write(heap, page, addr);
                return Outcome::Retry;
            }
            state::READ_WRITE => {
                AtomicCounters::bump(&counters.spurious_faults);
                return Outcome::Retry;
            }
            state::BUSY => {
                // The service thread is changing this page's protection; it never waits on us
                // while holding BUSY. Let it run, then retry the access.
                AtomicCounters::bump(&counters.busy_retries);
                // SAFETY: no arguments; async-signal-safe.
                unsafe { libc::sched_yield() };
                return Outcome::Retry;
            }
            _ => {
                // INVALID, or FROZEN (a write while the twin is cut): needs the service thread
                // (and maybe the network).
                AtomicCounters::bump(&counters.handoffs);
                ctx.heap.app_waits_in_handler(|| ctx.doorbell.hand_off_fault(page, kind));
                return Outcome::Retry;
            }
        }
    }
}

/// Fast path: the caller owns `page`'s BUSY state, taken from READ_ONLY. Twin, unprotect,
/// publish READ_WRITE, report the twin.
fn fast_write(heap: &Heap, page: u32, addr: usize) {
    // SAFETY: we own BUSY (taken from READ_ONLY), so `make_twin` and `set_access` cannot touch
    // the page or its twin; the page is read-only in the application view and the only thread
    // allowed to touch the app view is this one (we are in its handler), so nobody writes it.
    unsafe { heap.twin_at_fault(page) };
    if let Err(err) = heap.protect_run(page, 1, state::READ_WRITE) {
        heap.state(page).store(state::READ_ONLY, Ordering::Release);
        let errno = err.raw_os_error().unwrap_or(0) as u64;
        sigsafe::abort_with(&[
            b"treadmarks: cannot unprotect the shared heap page at ",
            Hex::new(addr).as_bytes(),
            b" after a write fault (mprotect errno ",
            sigsafe::Dec::new(errno).as_bytes(),
            b"; ENOMEM usually means vm.max_map_count is too low)\n",
        ]);
    }
    heap.state(page).store(state::READ_WRITE, Ordering::Release);
    heap.ring.push(page);
    AtomicCounters::bump(&heap.counters.fast_write_faults);
}

/// The userfaultfd side of the handler: the kernel raised SIGBUS for a uffd fault on `page`.
///
/// SIGBUS does not say which uffd fault it was; the page state does, with the page-fault error
/// code's present bit (x86_64) to tell a write-protect fault (page mapped) from a minor fault
/// (page not mapped in the application view):
/// - `INVALID`: a miss. Hand it to the service thread exactly as on the mprotect backend.
/// - `FROZEN`: a write while the service thread cuts the page's twin: handed off the same way,
///   and so is a read (of a page valid but not mapped here), taken for a write.
/// - `READ_ONLY`, page mapped: a write-protect fault, so a write. Fast path: twin, clear WP.
/// - `READ_ONLY`, not mapped (a valid page whose memfd page the runtime view touched first, so
///   the kernel raised a minor fault): a write twins and maps it writable at once; a read maps
///   it write-protected (`UFFDIO_CONTINUE_MODE_WP`) and retries.
/// - `READ_WRITE`, not mapped: map it writable and retry.
/// - `BUSY`: the service thread is changing the page; yield and retry.
///
/// Every PTE change of a page happens while its owner holds the page's `BUSY` state, so the
/// handler and `HeapPages::set_access` never race on the kernel side either.
fn handle_uffd(
    ctx: &Context,
    uffd: &Uffd,
    page: u32,
    addr: usize,
    kind: FaultKind,
    present: Option<bool>,
) -> Outcome {
    let heap = &*ctx.heap;
    let st = heap.state(page);
    let counters = &heap.counters;
    loop {
        let s = st.load(Ordering::Acquire);
        match s {
            state::BUSY => {
                // Hazard "a fault on a page being installed": the service thread is mapping
                // (UFFDIO_CONTINUE) or protecting this page right now and never waits on us
                // while it holds BUSY. Let it finish, then retry the access.
                AtomicCounters::bump(&counters.busy_retries);
                // SAFETY: no arguments; async-signal-safe.
                unsafe { libc::sched_yield() };
                return Outcome::Retry;
            }
            state::INVALID | state::FROZEN => {
                // FROZEN: a write while the service thread cuts the twin; it waits like a miss.
                // A read (a page valid but not mapped here, frozen) goes the same way, and the
                // service thread takes it for a write, twinning a page that may only be read.
                // Mapping it write-protected here instead (session 31) made radix 5-6% slower in
                // two sets of 12 alternated runs, and at par with that branch turned off: its
                // reads of such pages tend to be followed by writes, each then a second fault.
                // Hazard "a fault racing an invalidation": the state is read after the fault,
                // so a page invalidated (MADV_DONTNEED) between the access and here is handed
                // off like any miss; the service thread tolerates a hand-off for a page that is
                // valid again by the time it looks.
                AtomicCounters::bump(&counters.handoffs);
                ctx.heap.app_waits_in_handler(|| ctx.doorbell.hand_off_fault(page, kind));
                return Outcome::Retry;
            }
            state::READ_ONLY | state::READ_WRITE => {
                if s == state::READ_ONLY && kind == FaultKind::Read && present == Some(true) {
                    // A read never write-protect-faults: the page was mapped while the fault was
                    // being delivered.
                    AtomicCounters::bump(&counters.spurious_faults);
                    return Outcome::Retry;
                }
                if s == state::READ_WRITE && present == Some(true) {
                    // Write protection cleared while the fault was being delivered.
                    AtomicCounters::bump(&counters.spurious_faults);
                    return Outcome::Retry;
                }
                if st.compare_exchange(s, state::BUSY, Ordering::Acquire, Ordering::Relaxed).is_err() {
                    continue;
                }
                resolve_valid_uffd(heap, uffd, page, addr, s, kind, present);
                return Outcome::Retry;
            }
            _ => sigsafe::abort_with(&[b"treadmarks: corrupt page state in the fault handler\n"]),
        }
    }
}

/// Resolves a uffd fault on a valid page whose `BUSY` state the caller took from `s`.
fn resolve_valid_uffd(
    heap: &Heap,
    uffd: &Uffd,
    page: u32,
    addr: usize,
    s: u8,
    kind: FaultKind,
    present: Option<bool>,
) {
    let ps = heap.page_size();
    let start = heap.app_page(page) as usize;
    let fail = |op: &[u8], errno: i32, back: u8| -> ! {
        heap.state(page).store(back, Ordering::Release);
        sigsafe::abort_with(&[
            b"treadmarks: cannot resolve a userfaultfd fault on the shared heap page at ",
            Hex::new(addr).as_bytes(),
            b" (",
            op,
            b" errno ",
            sigsafe::Dec::new(errno as u64).as_bytes(),
            b"; the memfd may be out of memory)\n",
        ]);
    };
    if s == state::READ_WRITE {
        // Not mapped (or we cannot tell): map it writable. EEXIST (mapped after all) is fine.
        if let Err(e) = uffd.continue_range(start, ps, false, ps) {
            fail(b"UFFDIO_CONTINUE", e, s);
        }
        AtomicCounters::bump(&heap.counters.minor_maps);
        heap.note_mapped(page, 1, true);
        heap.state(page).store(state::READ_WRITE, Ordering::Release);
        return;
    }
    // READ_ONLY from here.
    let mapped = match present {
        Some(p) => p,
        None => {
            // Cannot tell from the hardware: try to map it write-protected; EEXIST means it
            // was mapped, i.e. this was a write-protect fault.
            match uffd.continue_range(start, ps, true, ps) {
                Ok(Continued::All) => {
                    AtomicCounters::bump(&heap.counters.minor_maps);
                    heap.note_mapped(page, 1, true);
                    heap.state(page).store(state::READ_ONLY, Ordering::Release);
                    return;
                }
                Ok(Continued::SomeExisted) => true,
                Err(e) => fail(b"UFFDIO_CONTINUE", e, s),
            }
        }
    };
    if !mapped && kind == FaultKind::Read {
        if let Err(e) = uffd.continue_range(start, ps, true, ps) {
            fail(b"UFFDIO_CONTINUE (MODE_WP)", e, s);
        }
        AtomicCounters::bump(&heap.counters.minor_maps);
        heap.note_mapped(page, 1, true);
        heap.state(page).store(state::READ_ONLY, Ordering::Release);
        return;
    }
    // A write (a write-protect fault on a mapped page, or a write to an unmapped one): the
    // fast path. Twin first, while nothing can write the page, then make it writable.
    // SAFETY: we own BUSY (taken from READ_ONLY), so `make_twin` and `set_access` cannot touch
    // the page or its twin; the page is write-protected or unmapped in the application view and
    // only this thread (in its handler) may touch that view, so nobody writes it.
    unsafe { heap.twin_at_fault(page) };
    let made = if mapped {
        uffd.writeprotect(start, ps, false)
    } else {
        uffd.continue_range(start, ps, false, ps).map(drop)
    };
    if let Err(e) = made {
        fail(b"UFFDIO_WRITEPROTECT/CONTINUE", e, s);
    }
    if !mapped {
        AtomicCounters::bump(&heap.counters.minor_maps);
        heap.note_mapped(page, 1, true);
    }
    heap.state(page).store(state::READ_WRITE, Ordering::Release);
    heap.ring.push(page);
    AtomicCounters::bump(&heap.counters.fast_write_faults);
}

/// Whether the faulting page was mapped (a protection fault) or not (bit 0 of the x86_64
/// page-fault error code), as far as the hardware tells.
///
/// # Safety
/// `uctx` must be the `ucontext_t` the kernel passed to an `SA_SIGINFO` handler.
#[cfg(target_arch = "x86_64")]
unsafe fn fault_present(uctx: *mut libc::c_void) -> Option<bool> {
    let uc = uctx.cast::<libc::ucontext_t>();
    // SAFETY: the caller passes the kernel's ucontext; REG_ERR is inside `gregs`.
    let err = unsafe { (*uc).uc_mcontext.gregs[libc::REG_ERR as usize] };
    Some(err & 1 != 0)
}

/// Other architectures do not decode the fault yet.
///
/// # Safety
/// None needed; kept `unsafe` for symmetry with the x86_64 version.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn fault_present(_uctx: *mut libc::c_void) -> Option<bool> {
    None
}

/// Read or write, from the x86_64 page-fault error code (bit 1 = write).
///
/// # Safety
/// `uctx` must be the `ucontext_t` the kernel passed to an `SA_SIGINFO` handler.
#[cfg(target_arch = "x86_64")]
unsafe fn fault_kind(uctx: *mut libc::c_void) -> FaultKind {
    let uc = uctx.cast::<libc::ucontext_t>();
    // SAFETY: the caller passes the kernel's ucontext; REG_ERR is inside `gregs`.
    let err = unsafe { (*uc).uc_mcontext.gregs[libc::REG_ERR as usize] };
    if err & 2 != 0 { FaultKind::Write } else { FaultKind::Read }
}

/// Other architectures do not decode the fault yet.
///
/// # Safety
/// None needed; kept `unsafe` for symmetry with the x86_64 version.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn fault_kind(_uctx: *mut libc::c_void) -> FaultKind {
    FaultKind::Unknown
}
