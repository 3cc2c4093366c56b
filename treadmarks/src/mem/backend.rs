//! Choosing the fault backend: what the configuration asks for ([`FaultsMode`]), what the kernel
//! offers, and the `vm.max_map_count` bound of the `mprotect` backend.

use std::sync::{Once, OnceLock};

use super::error::{Bytes, MemError};
use super::heap::system_page_size;
use super::uffd::{self, Unavailable};

/// How page protection is enforced and faults are caught (see the [module docs](super)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultBackend {
    /// `mprotect` per run of pages, SIGSEGV on a protected access. Portable; every run of pages
    /// with a protection different from its neighbours is one kernel mapping, so a heap is
    /// bounded by `vm.max_map_count`.
    Mprotect,
    /// userfaultfd on the memfd-backed view: write-protect faults and minor faults, delivered as
    /// SIGBUS to the faulting thread. Per-PTE protection, no mapping count limit. Linux 6.2+.
    Uffd,
}

impl FaultBackend {
    /// `"mprotect"` or `"uffd"`, as `TMK_FAULTS` spells it.
    pub fn name(self) -> &'static str {
        match self {
            FaultBackend::Mprotect => "mprotect",
            FaultBackend::Uffd => "uffd",
        }
    }
}

/// What the configuration asks for (`TMK_FAULTS`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FaultsMode {
    /// The faster backend this kernel offers: userfaultfd if it works, else `mprotect` (said
    /// once on standard error).
    #[default]
    Auto,
    /// userfaultfd, or fail at startup saying why and how to fix it.
    Uffd,
    /// `mprotect`.
    Mprotect,
}

impl FaultsMode {
    /// `"auto"`, `"uffd"` or `"mprotect"`, as `TMK_FAULTS` spells it.
    pub fn name(self) -> &'static str {
        match self {
            FaultsMode::Auto => "auto",
            FaultsMode::Uffd => "uffd",
            FaultsMode::Mprotect => "mprotect",
        }
    }
}

impl std::str::FromStr for FaultsMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(FaultsMode::Auto),
            "uffd" | "userfaultfd" => Ok(FaultsMode::Uffd),
            "mprotect" => Ok(FaultsMode::Mprotect),
            _ => Err("expected auto, uffd or mprotect".into()),
        }
    }
}

/// Whether this kernel and process can run the userfaultfd backend: the result of a self-check
/// on a scratch mapping, made once per process.
pub fn uffd_support() -> Result<(), Unavailable> {
    static SUPPORT: OnceLock<Result<(), Unavailable>> = OnceLock::new();
    SUPPORT.get_or_init(|| uffd::check_mechanism(system_page_size())).clone()
}

/// The backend for `mode` on this machine. `Auto` falls back to `mprotect` when userfaultfd is
/// not available and says so once per process on standard error; `Uffd` fails with
/// [`MemError::UffdUnavailable`] instead.
pub fn select_backend(mode: FaultsMode) -> Result<FaultBackend, MemError> {
    match mode {
        FaultsMode::Mprotect => Ok(FaultBackend::Mprotect),
        FaultsMode::Uffd => match uffd_support() {
            Ok(()) => Ok(FaultBackend::Uffd),
            Err(u) => Err(MemError::UffdUnavailable { why: u.why, fix: u.fix }),
        },
        FaultsMode::Auto => match uffd_support() {
            Ok(()) => Ok(FaultBackend::Uffd),
            Err(u) => {
                static SAID: Once = Once::new();
                SAID.call_once(|| {
                    crate::report(&format!(
                        "treadmarks: userfaultfd is not available ({}); using the mprotect fault \
                         backend (set TMK_FAULTS=mprotect to silence this)",
                        u.why
                    ))
                });
                Ok(FaultBackend::Mprotect)
            }
        },
    }
}

/// Mappings kept free for what the process maps after the heap (thread stacks and their guard
/// pages, allocator arenas, the runtime's buffers). The `mprotect` backend
/// ([`Heap::map_with`](super::Heap::map_with)) accepts a protected heap only if
/// `pages + mappings already in use + MAP_COUNT_MARGIN <= vm.max_map_count`.
pub const MAP_COUNT_MARGIN: u64 = 1024;

/// The `vm.max_map_count` value, or the kernel default if it cannot be read.
fn max_map_count() -> u64 {
    std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65530)
}

/// Mappings the process has now (lines of `/proc/self/maps`), or a guess if unreadable.
fn mappings_in_use() -> u64 {
    std::fs::read_to_string("/proc/self/maps").map(|s| s.lines().count() as u64).unwrap_or(256)
}

/// The largest heap (bytes, a multiple of 16 MiB) of at most `size` that an `mprotect` heap can
/// have under `vm.max_map_count` (`check_map_count`), with room for the mappings the process
/// has now and as many again that it may make before it maps the heap, and the limit itself.
pub fn fit_heap(size: usize) -> (usize, u64) {
    const STEP: usize = 16 << 20;
    let max = max_map_count();
    let spare = max.saturating_sub(2 * mappings_in_use() + 2 * MAP_COUNT_MARGIN);
    let fits = usize::try_from(spare).unwrap_or(usize::MAX).saturating_mul(system_page_size());
    (size.min(fits / STEP * STEP).max(STEP.min(size)), max)
}

/// Refuses an `mprotect` heap of `npages` pages that could need more mappings than
/// `vm.max_map_count` allows. In the worst case (a checkerboard of page states) every page is a
/// run of its own, i.e. a mapping of its own; the process's own mappings and
/// [`MAP_COUNT_MARGIN`] come on top.
pub(super) fn check_map_count(npages: u32, size: usize) -> Result<(), MemError> {
    let max = max_map_count();
    let in_use = mappings_in_use();
    let need = u64::from(npages) + in_use + MAP_COUNT_MARGIN;
    if need <= max {
        return Ok(());
    }
    let fits = max.saturating_sub(in_use + MAP_COUNT_MARGIN);
    let page = system_page_size() as u64;
    Err(MemError::MapCountTooLow {
        size,
        npages,
        max_map_count: max,
        in_use,
        max_heap: Bytes((fits * page) as usize & !((1 << 20) - 1)).to_string(),
        need,
    })
}
