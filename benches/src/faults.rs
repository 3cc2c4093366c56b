//! Single-process fault costs, measured before any `Tmk` exists (a process holds at most one
//! fault handler, and the bare probe refuses to run while one is installed).

use crate::Result;
use crate::summary::Summary;
use std::hint::black_box;
use std::time::{Duration, Instant};
use treadmarks::mem::{BorrowTracker, Doorbell, FaultHandler, Heap, HeapLayout, HeapPages, Shared, probe};
use treadmarks::protocol::{Access, PageIdx, PageMemory};

/// Where the twin-fault heap lives: clear of a job's heap (default `0x6000_0000_0000`).
pub const TWIN_HEAP_BASE: usize = 0x5800_0000_0000;
/// Size of the twin-fault heap.
pub const TWIN_HEAP_SIZE: usize = 64 << 20;

/// Fault costs of this process.
#[derive(Clone, Copy, Debug)]
pub struct FaultCosts {
    /// A write fault whose handler only `mprotect`s (the library's probe; mean only).
    pub bare: Summary,
    /// The fast path: write fault on a read-only heap page, twin copy, `mprotect`, warm pages.
    pub twin: Summary,
    /// The same on the first pass, while the twin area is touched for the first time.
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

/// Times one write per page over `pages` read-only pages of a protected [`Heap`] with the
/// treadmarks fault handler installed on this thread: every write takes the fast path (twin and
/// unprotect in the handler). Pass 0 is cold (first touch of the twin area); then `rounds` warm
/// passes are timed as a whole (the mean) and one more pass write by write (the median). The
/// pages are re-protected read-only between passes. Handler and heap are dropped at the end.
/// Returns the warm and the cold figures.
pub fn twin_fault(pages: usize, rounds: usize) -> Result<(Summary, Summary)> {
    let heap = Heap::map(HeapLayout { base: TWIN_HEAP_BASE, size: TWIN_HEAP_SIZE, protect: true })?;
    let ps = heap.page_size();
    let npages = u32::try_from(pages)?;
    if pages == 0 || pages > heap.npages() as usize {
        return Err(
            format!("twin_fault: {pages} pages do not fit the {} MiB heap", TWIN_HEAP_SIZE >> 20).into()
        );
    }
    let handler = FaultHandler::install(heap.clone(), Doorbell::new()?)?;
    let tracker = BorrowTracker::claim(heap.clone()).ok_or("the twin-fault heap's tracker was taken")?;
    let all: Shared<[u8]> = Shared::from_raw_parts(0, (pages * ps) as u64);
    let mut pages_mem = HeapPages::claim(heap.clone()).ok_or("the twin-fault heap's pages were taken")?;

    // Map every page into the application view (reads of read-only pages do not fault), so the
    // passes below see protection faults, not first-touch faults of the memfd.
    {
        let v = tracker.view(&all)?;
        let mut sum = 0u64;
        for p in 0..pages {
            sum += u64::from(v[p * ps]);
        }
        black_box(sum);
    }

    let mut pass = |value: u8, per_write: bool| -> Result<(Duration, Vec<Duration>)> {
        let mut samples = Vec::with_capacity(if per_write { pages } else { 0 });
        let t = Instant::now();
        {
            let mut v = tracker.view_mut(&all)?;
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
            return Err(format!("twin_fault: {twinned} fast-path twins for {pages} writes").into());
        }
        pages_mem.set_access(PageIdx(0), npages, Access::Read);
        Ok((total, samples))
    };

    let (cold, _) = pass(1, false)?;
    let mut warm = Duration::ZERO;
    for r in 0..rounds {
        warm += pass((2 + r) as u8, false)?.0;
    }
    let (_, samples) = pass(1, true)?;
    drop(handler);
    drop(pages_mem);
    drop(heap);

    let per = |d: Duration, n: usize| d.as_secs_f64() * 1e6 / n as f64;
    let p50 = Summary::of(&samples).p50_us;
    Ok((
        Summary { n: pages * rounds, mean_us: per(warm, pages * rounds), p50_us: p50 },
        Summary::mean_only(pages, per(cold, pages)),
    ))
}

/// The system page size, from a small unprotected heap mapped and dropped at once.
pub fn page_size() -> Result<usize> {
    Ok(Heap::map(HeapLayout { base: TWIN_HEAP_BASE, size: 64 << 10, protect: false })?.page_size())
}
