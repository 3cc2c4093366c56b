//! Single-process fault costs, measured before any `Tmk` exists (a process holds at most one
//! fault handler, and the bare probe refuses to run while one is installed).

use crate::Result;
use crate::summary::Summary;
use std::time::Duration;
use treadmarks::mem::{Heap, HeapLayout, probe};

/// Where the twin-fault heap lives: clear of a job's heap (default `0x6000_0000_0000`).
pub const TWIN_HEAP_BASE: usize = 0x5800_0000_0000;

/// Size of the twin-fault heap for `pages` pages of `page` bytes: twice the pages probed, so a
/// kernel's larger pages (64 KiB on some arm64 systems) get a heap of their own size.
pub fn twin_heap_size(pages: usize, page: usize) -> usize {
    2 * pages * page
}

/// Fault costs of this process.
#[derive(Clone, Copy, Debug)]
pub struct FaultCosts {
    /// A write fault whose handler only `mprotect`s (the library's probe; mean only).
    pub bare: Summary,
    /// The fast path: write fault on a read-only heap page, twin copy, `mprotect`, warm pages.
    pub twin: Summary,
    /// The same on the first pass, over pages never written: their twins are zeros, not copies.
    pub twin_cold: Summary,
}

/// Both fault costs: [`bare_fault`], then [`twin_fault`].
pub fn measure(pages: usize, rounds: usize) -> Result<FaultCosts> {
    let bare = bare_fault(pages, rounds)?;
    let (twin, twin_cold) = twin_fault(pages, rounds)?;
    Ok(FaultCosts { bare, twin, twin_cold })
}

/// Mean of `bare_fault_ns(pages)` over `rounds` calls, after one warm-up call.
pub fn bare_fault(pages: usize, rounds: usize) -> Result<Summary> {
    probe::bare_fault_ns(pages)?;
    let mut total_ns = 0.0;
    for _ in 0..rounds {
        total_ns += probe::bare_fault_ns(pages)?;
    }
    Ok(Summary::mean_only(pages * rounds, total_ns / rounds as f64 / 1e3))
}

/// Write faults through the treadmarks fault handler's fast path (twin and unprotect in the
/// handler), on `pages` pages of a heap of its own at [`TWIN_HEAP_BASE`] ([`twin_heap_size`])
/// (`treadmarks::mem::probe::twin_fault_times`): `rounds` warm passes timed as a whole (the
/// mean), one more write by write (the median), and the first pass over never-written pages
/// (zero twins). Returns the warm and the first pass's figures.
pub fn twin_fault(pages: usize, rounds: usize) -> Result<(Summary, Summary)> {
    let size = twin_heap_size(pages, page_size()?);
    let t = probe::twin_fault_times(TWIN_HEAP_BASE, size, pages, rounds)?;
    let per = |d: Duration, n: usize| d.as_secs_f64() * 1e6 / n as f64;
    let warm: Duration = t.warm.iter().sum();
    Ok((
        Summary {
            n: pages * rounds,
            mean_us: per(warm, pages * rounds),
            p50_us: Summary::of(&t.per_write).p50_us,
        },
        Summary::mean_only(pages, per(t.cold, pages)),
    ))
}

/// The system page size, from a small unprotected heap mapped and dropped at once.
pub fn page_size() -> Result<usize> {
    Ok(Heap::map(HeapLayout { base: TWIN_HEAP_BASE, size: 64 << 10, protect: false })?.page_size())
}
