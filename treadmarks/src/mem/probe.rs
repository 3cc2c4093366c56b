//! Micro-benchmark of the bare cost of an `mprotect` write fault, to compare the fast path
//! (which also copies a twin) against.

use std::io;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::error::MemError;
use super::heap::system_page_size;
use super::signals::{self, Claim, Owner, Previous};
use super::sigsafe::ErrnoGuard;

/// The probe region and the action to chain to, published while the probe runs.
struct ProbeContext {
    base: usize,
    len: usize,
    page_size: usize,
    prev: Previous,
}

static PROBE: AtomicPtr<ProbeContext> = AtomicPtr::new(ptr::null_mut());
static PROBE_IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// The probe's SIGSEGV handler: unprotect the faulting page if it is in the probe region,
/// chain otherwise.
///
/// # Safety
/// Only the kernel calls it, as an `SA_SIGINFO` handler, with valid `info` and `uctx`.
unsafe extern "C" fn probe_handler(sig: libc::c_int, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
    let _errno = ErrnoGuard::save();
    PROBE_IN_FLIGHT.fetch_add(1, Ordering::SeqCst);
    let ctx = PROBE.load(Ordering::SeqCst);
    // SAFETY: `info` is the kernel's siginfo for a SIGSEGV.
    let (addr, code) = unsafe { ((*info).si_addr() as usize, (*info).si_code) };
    let mut chain_to = None;
    if ctx.is_null() {
        if code <= 0 {
            // SAFETY: async-signal-safe; delivered to the restored handler after we return.
            unsafe { libc::raise(sig) };
        }
    } else {
        // SAFETY: live until `bare_fault_ns` sees PROBE null and PROBE_IN_FLIGHT zero.
        let ctx = unsafe { &*ctx };
        if code > 0 && addr >= ctx.base && addr - ctx.base < ctx.len {
            let page = addr & !(ctx.page_size - 1);
            // SAFETY: one page of the probe region, which the probe mapped and owns.
            unsafe {
                libc::mprotect(page as *mut libc::c_void, ctx.page_size, libc::PROT_READ | libc::PROT_WRITE)
            };
        } else {
            chain_to = Some(ctx.prev.take());
        }
    }
    PROBE_IN_FLIGHT.fetch_sub(1, Ordering::SeqCst);
    if let Some(prev) = chain_to {
        // SAFETY: we are the SIGSEGV handler with the kernel's arguments; `prev` was installed
        // before us.
        unsafe { signals::chain(&prev, sig, info, uctx) };
    }
}

/// A bare write-fault measurement ([`bare_fault`]).
#[derive(Debug, Clone, Copy)]
pub struct BareFault {
    /// Mean nanoseconds per write fault.
    pub ns_per_fault: f64,
    /// Page faults the kernel resolved itself (`ru_minflt`) while the writes were timed: none
    /// when every fault is a protection fault only, `pages` if each also allocated a page.
    pub minor_faults: u64,
}

/// Mean nanoseconds per write fault whose handler only `mprotect`s the page read-write, over
/// `pages` read-only pages ([`bare_fault`]).
pub fn bare_fault_ns(pages: usize) -> Result<f64, MemError> {
    bare_fault(pages).map(|b| b.ns_per_fault)
}

/// Write faults whose handler only `mprotect`s the page read-write, over `pages` read-only
/// pages that are backed by memory of their own (written, then protected), so a fault costs
/// the signal and the `mprotect` and nothing else: not the allocation a write to a never-written
/// page (the kernel's shared zero page) would add. Fails if a
/// [`FaultHandler`](super::FaultHandler) is installed.
pub fn bare_fault(pages: usize) -> Result<BareFault, MemError> {
    let op = "probe the bare write-fault cost";
    if pages == 0 {
        return Err(MemError::InvalidArgument { op, reason: "pages must be at least 1".into() });
    }
    let claim = Claim::take(Owner::Probe, op)?;
    let page_size = system_page_size();
    let len = pages.checked_mul(page_size).ok_or_else(|| MemError::InvalidArgument {
        op,
        reason: format!("{pages} pages overflow the address space"),
    })?;
    // SAFETY: no fixed address: the kernel picks a free range we then own.
    let base = unsafe {
        libc::mmap(
            ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(MemError::Sys {
            op: "map the fault probe region",
            size: len,
            source: io::Error::last_os_error(),
        });
    }
    let base = base.cast::<u8>();
    // Write every page, so each is backed by a page of its own, then protect them all: the
    // timing sees protection faults, neither first-touch faults nor copies of the zero page.
    for i in 0..pages {
        // SAFETY: inside the writable region just mapped.
        unsafe { ptr::write_volatile(base.add(i * page_size), 0u8) };
    }
    let result = (|| {
        // SAFETY: the region mapped above, which this function owns.
        if unsafe { libc::mprotect(base.cast(), len, libc::PROT_READ) } != 0 {
            let source = io::Error::last_os_error();
            return Err(MemError::Sys { op: "protect the fault probe region", size: len, source });
        }
        let prev = Previous::query(libc::SIGSEGV)?;
        let ctx = Box::into_raw(Box::new(ProbeContext { base: base as usize, len, page_size, prev }));
        PROBE.store(ctx, Ordering::SeqCst);
        let installed = signals::install(libc::SIGSEGV, probe_handler);
        let timed = installed.as_ref().ok().map(|()| {
            let faults_before = thread_minor_faults().unwrap_or(0);
            let start = Instant::now();
            for i in 0..pages {
                // SAFETY: inside the probe region; the write faults once and the handler makes
                // the page writable, then the store completes.
                unsafe { ptr::write_volatile(base.add(i * page_size), 1u8) };
            }
            (start.elapsed(), thread_minor_faults().unwrap_or(0).saturating_sub(faults_before))
        });
        // SAFETY: `ctx` came from `Box::into_raw` above and is freed only below.
        unsafe { &(*ctx).prev }.restore(libc::SIGSEGV);
        PROBE.store(ptr::null_mut(), Ordering::SeqCst);
        while PROBE_IN_FLIGHT.load(Ordering::SeqCst) != 0 {
            std::thread::yield_now();
        }
        // SAFETY: as above; still not freed.
        unsafe { &(*ctx).prev }.settle(libc::SIGSEGV);
        // SAFETY: unpublished, no handler uses it any more, created by `Box::into_raw` above.
        drop(unsafe { Box::from_raw(ctx) });
        installed?;
        let (elapsed, minor_faults) = timed.expect("timed when installed");
        Ok(BareFault { ns_per_fault: elapsed.as_nanos() as f64 / pages as f64, minor_faults })
    })();
    // SAFETY: the region mapped above; nothing refers to it any more.
    unsafe { libc::munmap(base.cast(), len) };
    drop(claim);
    result
}

/// Page faults this thread has taken that the kernel resolved without I/O (`ru_minflt`).
pub(crate) fn thread_minor_faults() -> io::Result<u64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` fills the `rusage` it is given; `RUSAGE_THREAD` is always valid.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: filled in by the successful call above (and zeroed before it).
    Ok(unsafe { usage.assume_init() }.ru_minflt as u64)
}

/// Times of write faults through the treadmarks fault handler's fast path ([`twin_fault_times`]).
#[derive(Debug, Clone)]
pub struct TwinFaultTimes {
    /// The first pass: the pages were never written, so their first twins are zeros and take
    /// no copy (`Heap::copy_to_twin`).
    pub cold: Duration,
    /// Each warm pass.
    pub warm: Vec<Duration>,
    /// One more pass, write by write.
    pub per_write: Vec<Duration>,
}

/// Write faults on `pages` read-only pages of a heap of `size` bytes at `base` (any free range),
/// with a treadmarks fault handler installed on this thread: every write takes the fast path
/// (twin and unprotect in the handler). Their twin slots are backed up front, as a job's are
/// (`Heap::reserve_twins`). Pass 0 writes pages never written (zero twins, no copy); then
/// `rounds` warm passes copy every page to its twin, and one more is timed write by write. The
/// pages are protected read-only again between passes. The heap and the handler are dropped at
/// the end. Fails if a handler is installed already.
pub fn twin_fault_times(
    base: usize,
    size: usize,
    pages: usize,
    rounds: usize,
) -> Result<TwinFaultTimes, MemError> {
    use super::{BorrowTracker, Doorbell, FaultHandler, Heap, HeapLayout, HeapPages, Shared};
    use crate::protocol::{Access, PageIdx, PageMemory};
    use std::hint::black_box;
    let op = "time twin faults";
    let heap = Heap::map(HeapLayout { base, size, protect: true })?;
    let ps = heap.page_size();
    if pages == 0 || pages > heap.npages() as usize {
        let reason = format!("{pages} pages do not fit the {size}-byte heap");
        return Err(MemError::InvalidArgument { op, reason });
    }
    heap.reserve_twins(pages * ps);
    let handler = FaultHandler::install(heap.clone(), Doorbell::new()?)?;
    // This function's own heap: nobody else holds its page memory or its views.
    let tracker = BorrowTracker::claim(heap.clone()).expect("a fresh heap's tracker");
    let mut pages_mem = HeapPages::claim(heap.clone()).expect("a fresh heap's pages");
    let all: Shared<[u8]> = Shared::from_raw_parts(0, (pages * ps) as u64);
    // Map every page into the application view (reads of read-only pages do not fault), so the
    // passes see protection faults, not first-touch faults of the memfd.
    let view_failed = |e: super::ViewError| MemError::InvalidArgument { op, reason: e.to_string() };
    {
        let v = tracker.view(&all).map_err(view_failed)?;
        black_box((0..pages).map(|p| u64::from(v[p * ps])).sum::<u64>());
    }
    let mut pass = |value: u8, per_write: bool| -> Result<(Duration, Vec<Duration>), MemError> {
        let mut samples = Vec::with_capacity(if per_write { pages } else { 0 });
        let t = Instant::now();
        {
            let mut v = tracker.view_mut(&all).map_err(view_failed)?;
            for p in 0..pages {
                if per_write {
                    let t = Instant::now();
                    *black_box(&mut v[p * ps]) = value;
                    samples.push(t.elapsed());
                } else {
                    *black_box(&mut v[p * ps]) = value;
                }
            }
        }
        let total = t.elapsed();
        let mut twinned = 0usize;
        heap.drain_fast_twins(|_| twinned += 1);
        if twinned != pages {
            let reason = format!("{twinned} fast-path twins for {pages} writes");
            return Err(MemError::InvalidArgument { op, reason });
        }
        pages_mem.set_access(PageIdx(0), pages as u32, Access::Read);
        Ok((total, samples))
    };
    let (cold, _) = pass(1, false)?;
    let zero_twins = heap.counters().zero_twins;
    if zero_twins != pages as u64 {
        let reason = format!("{zero_twins} zero twins in the first pass over {pages} pages");
        return Err(MemError::InvalidArgument { op, reason });
    }
    let warm = (0..rounds).map(|r| pass((2 + r) as u8, false).map(|p| p.0)).collect::<Result<_, _>>()?;
    let (_, per_write) = pass(1, true)?;
    drop(handler);
    Ok(TwinFaultTimes { cold, warm, per_write })
}
