//! [`Heap`]: one memfd mapped twice (application view at a fixed address, runtime view anywhere)
//! plus a lazily committed twin area, and the per-page state that follows the app view's
//! protection.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};

use super::backend::{self, FaultBackend};
use super::error::MemError;
use super::ring::TwinRing;
use super::sigsafe;
use super::state;
use super::uffd::Uffd;
use crate::protocol::ids::PageIdx;

/// A page that was never twinned has no twin slot.
const NO_SLOT: u32 = u32::MAX;

/// Where and how big the shared heap is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapLayout {
    /// Fixed virtual address of the application view (page aligned). Same on every node.
    pub base: usize,
    /// Bytes (a non-zero multiple of the page size).
    pub size: usize,
    /// `false` for a 1-node job: the application view is mapped read-write and never faults.
    pub protect: bool,
}

/// Fault statistics of a heap. All counts since [`Heap::map`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultCounters {
    /// Write faults on read-only pages resolved in the signal handler (page twinned, unprotected).
    pub fast_write_faults: u64,
    /// Faults handed to the service thread through the [`Doorbell`](super::Doorbell).
    pub handoffs: u64,
    /// Faults that found the page in transition (`BUSY`) and were retried.
    pub busy_retries: u64,
    /// Faults that found the page already accessible when the handler looked (a protection
    /// change raced with the access) and were simply retried.
    pub spurious_faults: u64,
    /// Protection changes made by [`HeapPages::set_access`](super::HeapPages) (one per run).
    pub protect_calls: u64,
    /// Faults on a valid page that was not mapped in the application view (userfaultfd backend
    /// only: a minor fault on a page the runtime touched first), mapped in the handler.
    pub minor_maps: u64,
    /// First twins of pages never written, which needed no copy (see `Heap::copy_to_twin`).
    pub zero_twins: u64,
}

#[derive(Debug, Default)]
pub(super) struct AtomicCounters {
    pub(super) fast_write_faults: AtomicU64,
    pub(super) handoffs: AtomicU64,
    pub(super) busy_retries: AtomicU64,
    pub(super) spurious_faults: AtomicU64,
    pub(super) protect_calls: AtomicU64,
    pub(super) minor_maps: AtomicU64,
    pub(super) zero_twins: AtomicU64,
}

impl AtomicCounters {
    /// Async-signal-safe increment.
    pub(super) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The shared heap of one node. See the [module docs](super) for the layout and invariants.
#[derive(Debug)]
pub struct Heap {
    /// Application view: `size` bytes at exactly `layout.base`, protection per page state.
    app: NonNull<u8>,
    /// Runtime view of the same memfd: always read-write, used only by this module.
    runtime: NonNull<u8>,
    /// Twin area: private anonymous, `size` bytes: a slot of `page_size` bytes for each page
    /// ever twinned, handed out in the order pages are first twinned (`twin_slots`).
    twins: NonNull<u8>,
    /// The twin slot of each page, [`NO_SLOT`] until its first twin; then fixed for the heap's
    /// life. Set by whoever makes the page's first twin (one maker at a time per page: the
    /// handler owning the page's `BUSY` state, or the holder of the node).
    twin_slots: Box<[AtomicU32]>,
    /// Twin slots handed out so far: slots `0..twin_slots_used` are some page's.
    twin_slots_used: AtomicU32,
    /// Twin slots backed by [`Heap::reserve_twins`].
    twin_slots_reserved: AtomicU32,
    size: usize,
    page_size: usize,
    npages: u32,
    /// The backing object of both views. The userfaultfd backend allocates its pages before it
    /// invalidates them (`fallocate`), so an invalid page always takes a minor fault.
    memfd: OwnedFd,
    /// The userfaultfd descriptor of the application view, if the heap uses that backend and is
    /// protected. Closing it (on drop) unregisters the view.
    uffd: Option<Uffd>,
    /// Pages known to exist in the memfd: populated before they were first twinned ahead, or
    /// (userfaultfd backend) allocated by `fallocate` before their first invalidation. Pages
    /// are never freed, so this only grows: set by the holder of the node, and by the
    /// application thread when it commits an allocation (`Heap::commit`).
    allocated: Box<[AtomicBool]>,
    /// Userfaultfd backend: pages the application view maps, as far as we know: set when a
    /// `UFFDIO_CONTINUE` maps a page (service thread or fault handler), cleared when an
    /// invalidation drops the mapping. A hint, never trusted for correctness: a page the kernel
    /// mapped or dropped behind our back costs one failed ioctl or one minor fault.
    mapped: Box<[AtomicBool]>,
    /// Pages whose bytes may no longer be the zeros a fresh memfd holds: set before the runtime
    /// writes a page (`HeapPages::page_mut*`) and when a page is first twinned (the application
    /// may write it from then on). The only other writer of a page is the application, and in a
    /// protected heap it writes only twinned pages; in an unprotected one, every page counts as
    /// written from the start. Set with `Relaxed`: the page's state word, which every maker of a
    /// twin acquires after the writer released it, orders it.
    written: Box<[AtomicBool]>,
    pub(super) states: Box<[AtomicU8]>,
    pub(super) ring: TwinRing,
    pub(super) counters: AtomicCounters,
    /// Whether this heap's one [`HeapPages`](super::HeapPages) and its one
    /// [`BorrowTracker`](super::BorrowTracker) were handed out (`Heap::claim`): each hands out
    /// references into the heap's bytes that are exclusive only if it is the only one.
    pub(super) pages_claimed: AtomicBool,
    pub(super) tracker_claimed: AtomicBool,
    /// How many calls into the runtime the application thread is inside ([`Heap::app_inside`]),
    /// the fault handler's wait for the service thread among them: what `HeapPages`' reads of
    /// pages the application could write otherwise check (`HeapPages::check_app_inside`).
    app_inside: AtomicU32,
    /// How many mutable views of this heap are alive ([`BorrowTracker`](super::BorrowTracker)
    /// counts them). Their slices can be handed to other threads (a scoped thread's), which
    /// write pages already writable without faulting, so while one is alive the protocol core
    /// does not read writable pages in place when the application thread waits in a view or a
    /// fault (`Node::app_still`). Views are made and dropped on the application thread (they
    /// are not `Send`); the service thread reads the count while the application thread waits
    /// in such a call, whose hand-over orders the two.
    mutable_views: AtomicU32,
}

/// The application thread is inside a call into the runtime while this lives
/// ([`Heap::app_inside`]).
#[must_use = "the application counts as inside only while the guard lives"]
pub(crate) struct AppInside<'a>(&'a Heap);

impl Drop for AppInside<'_> {
    fn drop(&mut self) {
        self.0.app_leaves();
    }
}

// SAFETY: the raw pointers are addresses of mappings owned by the `Heap` for its whole life
// (unmapped only in `Drop`); all shared mutable state reachable through `&Heap` is atomic
// (`states`, `ring`, `counters`, `app_inside`, and the per-page flags and slots), and the page
// bytes behind the pointers are only handed out by `HeapPages` under the page-sharing rule,
// never through `&Heap` itself.
unsafe impl Send for Heap {}
// SAFETY: see `Send` above.
unsafe impl Sync for Heap {}

/// Stops the process on pages `first..first + count` outside a heap of `npages` pages: a bug in
/// this module, found perhaps inside the fault handler, where a panic could not unwind and its
/// message would allocate (deadlocking if the interrupted code held the allocator's lock).
/// Async-signal-safe.
fn out_of_range(first: u32, count: u32, npages: u32) -> ! {
    let end = sigsafe::Dec::new(u64::from(first) + u64::from(count));
    sigsafe::abort_with(&[
        b"treadmarks: pages ",
        sigsafe::Dec::new(u64::from(first)).as_bytes(),
        b"..",
        end.as_bytes(),
        b" out of range: the heap has ",
        sigsafe::Dec::new(u64::from(npages)).as_bytes(),
        b" pages (a bug in treadmarks::mem)\n",
    ])
}

/// The system page size.
pub(crate) fn system_page_size() -> usize {
    // SAFETY: `sysconf` has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n <= 0 { 4096 } else { n as usize }
}

/// `mmap` returning the address or the OS error.
///
/// # Safety
/// Same as `libc::mmap`; with `MAP_FIXED` flags the caller must own the target range.
unsafe fn mmap(
    addr: usize,
    len: usize,
    prot: libc::c_int,
    flags: libc::c_int,
    fd: libc::c_int,
) -> io::Result<NonNull<u8>> {
    // SAFETY: forwarded to the caller.
    let p = unsafe { libc::mmap(addr as *mut libc::c_void, len, prot, flags, fd, 0) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned address 0"))
}

/// Unmaps a region this module mapped. Failure is impossible for a region we mapped ourselves.
///
/// # Safety
/// `ptr..ptr+len` must be a mapping created by this module that nothing uses any more.
unsafe fn munmap(ptr: NonNull<u8>, len: usize) {
    // SAFETY: forwarded to the caller.
    unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
}

/// Unmaps a region on early return from `Heap::map`.
struct Unmap(Option<(NonNull<u8>, usize)>);

impl Unmap {
    fn keep(mut self) -> NonNull<u8> {
        self.0.take().expect("mapping kept twice").0
    }
}

impl Drop for Unmap {
    fn drop(&mut self) {
        if let Some((p, len)) = self.0 {
            // SAFETY: `p..p+len` was just mapped by `Heap::map` and not yet handed out.
            unsafe { munmap(p, len) };
        }
    }
}

impl Heap {
    /// [`Heap::map_with`] on the `mprotect` backend.
    pub fn map(layout: HeapLayout) -> Result<Arc<Heap>, MemError> {
        Heap::map_with(layout, FaultBackend::Mprotect)
    }

    /// Maps the shared heap: the application view at exactly `layout.base`, a runtime view and a
    /// twin area. Every page starts zeroed and valid (`Read` if `protect`, else `ReadWrite`).
    ///
    /// With `protect`, `backend` says how page protection is enforced (see the module docs):
    /// - [`FaultBackend::Mprotect`] refuses a heap with more pages than `vm.max_map_count`
    ///   leaves room for ([`MemError::MapCountTooLow`]);
    /// - [`FaultBackend::Uffd`] maps the view read-write, registers it with a new userfaultfd
    ///   (minor faults and write protection, SIGBUS delivery) and write-protects it whole; it
    ///   fails with [`MemError::UffdUnavailable`] if the kernel cannot do that.
    pub fn map_with(layout: HeapLayout, backend: FaultBackend) -> Result<Arc<Heap>, MemError> {
        let HeapLayout { base, size, protect } = layout;
        let page_size = system_page_size();
        let invalid = |reason| MemError::InvalidLayout { base, size, page_size, reason };
        if base == 0 || base % page_size != 0 {
            return Err(invalid("base must be a non-zero multiple of the page size"));
        }
        if size == 0 || size % page_size != 0 {
            return Err(invalid("size must be a non-zero multiple of the page size"));
        }
        if base.checked_add(size).is_none() {
            return Err(invalid("base + size overflows the address space"));
        }
        let npages = u32::try_from(size / page_size).map_err(|_| invalid("more than 2^32 - 1 pages"))?;
        let use_uffd = protect && backend == FaultBackend::Uffd;
        if protect && backend == FaultBackend::Mprotect {
            backend::check_map_count(npages, size)?;
        }
        let uffd = if use_uffd {
            Some(Uffd::open().map_err(|u| MemError::UffdUnavailable { why: u.why, fix: u.fix })?)
        } else {
            None
        };

        const NAME: &CStr = c"treadmarks-heap";
        // SAFETY: `NAME` is a NUL-terminated string that outlives the call.
        let fd = unsafe { libc::memfd_create(NAME.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(MemError::Sys {
                op: "create the shared heap memfd",
                size,
                source: io::Error::last_os_error(),
            });
        }
        // SAFETY: `fd` was just returned by `memfd_create` and is owned by nobody else.
        let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
        let len = libc::off_t::try_from(size).map_err(|_| invalid("size does not fit off_t"))?;
        // SAFETY: plain syscall on a descriptor we own.
        if unsafe { libc::ftruncate(memfd.as_raw_fd(), len) } != 0 {
            return Err(MemError::Sys {
                op: "size the shared heap memfd",
                size,
                source: io::Error::last_os_error(),
            });
        }

        // The userfaultfd backend keeps the view read-write and protects it per PTE.
        let app_prot =
            if protect && !use_uffd { libc::PROT_READ } else { libc::PROT_READ | libc::PROT_WRITE };
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping; it fails with EEXIST.
        let app = unsafe {
            mmap(base, size, app_prot, libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE, memfd.as_raw_fd())
        }
        .map_err(|source| match source.raw_os_error() {
            Some(libc::EEXIST) => MemError::AddressInUse { base, size },
            _ => MemError::MapFixed { base, size, source },
        })?;
        let app = Unmap(Some((app, size)));
        let got = app.0.expect("just mapped").0.as_ptr() as usize;
        if got != base {
            // Kernel before 4.17: the flag was ignored and taken as a hint.
            return Err(MemError::PlacedElsewhere { base, size, got });
        }
        // SAFETY: no fixed address: the kernel picks a free range.
        let runtime =
            unsafe { mmap(0, size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, memfd.as_raw_fd()) }
                .map_err(|source| MemError::Sys {
                    op: "map the runtime view of the shared heap",
                    size,
                    source,
                })?;
        let runtime = Unmap(Some((runtime, size)));
        if let Some(uffd) = &uffd {
            // Register, then write-protect every page: on shmem this leaves a write-protect
            // marker in every PTE, populated or not, so the first write to any page faults
            // (and a read of a page the memfd does not hold yet simply allocates it).
            uffd.register(base, size).map_err(|u| MemError::UffdUnavailable { why: u.why, fix: u.fix })?;
            uffd.writeprotect(base, size, true).map_err(|errno| MemError::Sys {
                op: "write-protect the application view with userfaultfd",
                size,
                source: io::Error::from_raw_os_error(errno),
            })?;
        }
        // SAFETY: no fixed address; anonymous memory, committed page by page on first touch.
        let twins = unsafe {
            mmap(
                0,
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
            )
        }
        .map_err(|source| MemError::Sys { op: "reserve the twin area", size, source })?;
        // Twins of neighbouring pages are made together (a bulk validate twins every page it
        // will write): transparent huge pages turn 512 first-touch faults into one. Where the
        // kernel offers none this fails, harmlessly.
        // SAFETY: advice on the mapping just made, which nothing uses yet; it changes no data.
        let _ = unsafe { libc::madvise(twins.as_ptr().cast(), size, libc::MADV_HUGEPAGE) };

        let initial = if protect { state::READ_ONLY } else { state::READ_WRITE };
        Ok(Arc::new(Heap {
            app: app.keep(),
            runtime: runtime.keep(),
            twins,
            size,
            page_size,
            npages,
            memfd,
            twin_slots: (0..npages).map(|_| AtomicU32::new(NO_SLOT)).collect(),
            twin_slots_used: AtomicU32::new(0),
            twin_slots_reserved: AtomicU32::new(0),
            allocated: (0..npages).map(|_| AtomicBool::new(false)).collect(),
            // Unprotected, the application writes any page at any time.
            written: (0..npages).map(|_| AtomicBool::new(!protect)).collect(),
            mapped: (0..if uffd.is_some() { npages } else { 0 }).map(|_| AtomicBool::new(false)).collect(),
            uffd,
            states: (0..npages).map(|_| AtomicU8::new(initial)).collect(),
            ring: TwinRing::new(npages),
            counters: AtomicCounters::default(),
            pages_claimed: AtomicBool::new(false),
            tracker_claimed: AtomicBool::new(false),
            app_inside: AtomicU32::new(0),
            mutable_views: AtomicU32::new(0),
        }))
    }

    /// A mutable view of this heap opened (`true`) or closed (see `Heap::mutable_views`).
    pub(super) fn count_mutable_view(&self, opened: bool) {
        // A read-modify-write, though views are not `Send` today: the count stays right if that
        // changes. It saturates (4 G views leaked by `mem::forget` cannot wrap it to none open).
        let step = |n: u32| Some(if opened { n.saturating_add(1) } else { n.saturating_sub(1) });
        let _ = self.mutable_views.fetch_update(Ordering::Relaxed, Ordering::Relaxed, step);
    }

    /// How many mutable views of this heap are alive (see `Heap::mutable_views`).
    pub(crate) fn mutable_views(&self) -> u32 {
        self.mutable_views.load(Ordering::Relaxed)
    }

    /// Takes `flag` (one of the `*_claimed` fields) if nobody has: true the first time only.
    pub(super) fn claim(flag: &AtomicBool) -> bool {
        !flag.swap(true, Ordering::AcqRel)
    }

    /// Base of the application view (== `layout.base`).
    pub fn app_base(&self) -> *mut u8 {
        self.app.as_ptr()
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Bytes per page (from `sysconf`).
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Number of pages.
    pub fn npages(&self) -> u32 {
        self.npages
    }

    /// Calls `f` once for every page the signal handler twinned (and made writable) since the
    /// last drain. One thread at a time may call it: the runtime drains while it holds the node
    /// (`runtime::lock_node`); panics if two threads drain at once.
    pub fn drain_fast_twins(&self, f: impl FnMut(PageIdx)) {
        self.ring.drain(f);
    }

    /// A snapshot of the fault counters.
    pub fn counters(&self) -> FaultCounters {
        let c = &self.counters;
        FaultCounters {
            fast_write_faults: c.fast_write_faults.load(Ordering::Relaxed),
            handoffs: c.handoffs.load(Ordering::Relaxed),
            busy_retries: c.busy_retries.load(Ordering::Relaxed),
            spurious_faults: c.spurious_faults.load(Ordering::Relaxed),
            protect_calls: c.protect_calls.load(Ordering::Relaxed),
            minor_maps: c.minor_maps.load(Ordering::Relaxed),
            zero_twins: c.zero_twins.load(Ordering::Relaxed),
        }
    }

    /// Backs the pages under `bytes` bytes at heap offset `offset` with memfd pages now, as
    /// `MAP_POPULATE` would, so that the first access of each only maps a page that exists. One
    /// `fallocate` for the range costs less than allocating the pages one fault at a time: a
    /// first write to a memfd hole took about 3.3 µs per page on the 2-vCPU VM, against 1.1 µs
    /// per page to `fallocate` plus 1.4 µs to map it afterwards (an anonymous first write:
    /// 2.1 µs). `Tmk`'s allocation calls it on the allocating node.
    ///
    /// Under the userfaultfd backend it does nothing: there, an existing page without a mapping
    /// raises a minor fault (a signal, the handler and an ioctl, ~4.6 µs), dearer than the
    /// kernel's own first-touch allocation. The pages backed are recorded as allocated. Best
    /// effort: if the kernel refuses (no memory), nothing changes and the pages are allocated
    /// when first touched, as before. Never changes data (holes read as zeros either way).
    /// Returns whether the pages were backed.
    pub fn commit(&self, offset: u64, bytes: u64) -> bool {
        if self.uffd.is_some() || bytes == 0 {
            return false;
        }
        let page = self.page_size as u64;
        let start = offset / page * page;
        let Some(end) = offset.checked_add(bytes).and_then(|e| e.checked_next_multiple_of(page)) else {
            return false;
        };
        if end > self.size as u64 {
            return false;
        }
        self.ensure_allocated((start / page) as u32, ((end - start) / page) as u32).is_ok()
    }

    /// Userfaultfd backend: records that pages `first..first + count` are (`true`) or are not
    /// mapped in the application view. Async-signal-safe.
    pub(super) fn note_mapped(&self, first: u32, count: u32, mapped: bool) {
        let pages = first as usize..(first + count) as usize;
        if let Some(bits) = self.mapped.get(pages) {
            bits.iter().for_each(|b| b.store(mapped, Ordering::Relaxed));
        }
    }

    /// Populates the runtime view of those of `pages` (ascending) that may be memfd holes,
    /// one `MADV_POPULATE_READ` per run. Called before pages are twinned ahead of writes:
    /// copying a hole into its twin reads it through the runtime view, and a read fault that
    /// allocates a memfd page cost 3.7-3.9 µs on the 2-vCPU VM, against 2.8 µs a page to
    /// populate a run (the allocation itself; a fresh 2,048-page array took 11 ms to twin, now
    /// about 8.8 ms). Best effort: where the kernel lacks the advice (before Linux 5.14) or
    /// refuses it, the pages are allocated as they are touched, as before. Changes no byte.
    pub(super) fn populate(&self, pages: impl IntoIterator<Item = u32>) {
        let populate_run = |run: Option<(u32, u32)>| {
            let Some((first, count)) = run else { return };
            let len = count as usize * self.page_size;
            // SAFETY: the range lies inside the runtime view this heap maps (pages checked by
            // the caller); populating a shared file mapping only allocates and maps the pages,
            // and changes no byte.
            let rc = unsafe { libc::madvise(self.runtime_page(first).cast(), len, libc::MADV_POPULATE_READ) };
            if rc == 0 {
                (first..first + count)
                    .for_each(|p| self.allocated[p as usize].store(true, Ordering::Relaxed));
            }
        };
        let mut run: Option<(u32, u32)> = None;
        for p in pages.into_iter().filter(|&p| !self.allocated[p as usize].load(Ordering::Relaxed)) {
            run = match run {
                Some((first, count)) if first + count == p => Some((first, count + 1)),
                other => {
                    populate_run(other);
                    Some((p, 1))
                }
            };
        }
        populate_run(run);
    }

    /// Backs pages `first..first + count` with memory ahead of their first touch, given the
    /// stable state of each (`states`, which the caller holds `BUSY`): the memfd pages are
    /// allocated (one `fallocate`), all of them are mapped in the runtime view (one
    /// `MADV_POPULATE_WRITE`: the service thread otherwise took a fault on the first diff it
    /// applied, twin it made or page it served of each, ~400-870 a node in fft at 2 nodes), and
    /// the pages the application may touch without the runtime are mapped in the application
    /// view, so that touching them takes no fault at all:
    ///
    /// - userfaultfd: `READ_ONLY` pages not mapped yet, with `UFFDIO_CONTINUE` in write-protect
    ///   mode (a first read took a minor fault, a signal and an ioctl, ~4.6 µs);
    /// - `mprotect`: `READ_ONLY` pages with `MADV_POPULATE_READ`, and `READ_WRITE` pages (an
    ///   unprotected heap's, a one-node job's, and writable pages of a protected one) with
    ///   `MADV_POPULATE_WRITE`, which changes no byte.
    ///
    /// A first touch of a memfd hole cost ~3.3 µs a page on the 2-vCPU VM (the allocation and
    /// zeroing of the page, the mapping, and on this VM often the host's fault too), against
    /// ~1.1 µs to allocate it here. Invalid and frozen pages are only allocated. Best effort:
    /// what the kernel refuses is left to the first touch, as before. Changes no byte and no
    /// protection. Returns the pages mapped.
    pub(super) fn back(&self, first: u32, count: u32, states: &[u8]) -> u32 {
        assert_eq!(states.len(), count as usize, "one state per page");
        if count == 0 || self.ensure_allocated(first, count).is_err() {
            return 0;
        }
        let ps = self.page_size;
        // Best effort: on failure the runtime's first touch of each page maps it, as before.
        let (runtime, len) = (self.runtime_page(first).cast(), count as usize * ps);
        // SAFETY: the range lies inside the runtime view this heap maps (`first + count` is at
        // most `npages`: `ensure_allocated` indexed `allocated` with it); populating a shared
        // file mapping for writing maps the memfd pages just allocated and changes no byte.
        unsafe { libc::madvise(runtime, len, libc::MADV_POPULATE_WRITE) };
        let mut mapped = 0;
        let mut i = 0usize;
        while i < states.len() {
            let p = first + i as u32;
            let mappable = |k: usize| {
                let q = (first + k as u32) as usize;
                match self.uffd {
                    Some(_) => states[k] == state::READ_ONLY && !self.mapped[q].load(Ordering::Relaxed),
                    None => states[k] == state::READ_ONLY || states[k] == state::READ_WRITE,
                }
            };
            if !mappable(i) {
                i += 1;
                continue;
            }
            let j = (i + 1..states.len())
                .find(|&k| !mappable(k) || states[k] != states[i])
                .unwrap_or(states.len());
            let (start, len) = (self.app_page(p) as usize, (j - i) * ps);
            let done = match &self.uffd {
                Some(uffd) => {
                    let ok = uffd.continue_range(start, len, true, ps).is_ok();
                    if ok {
                        self.note_mapped(p, (j - i) as u32, true);
                    }
                    ok
                }
                None => {
                    let advice = if states[i] == state::READ_WRITE {
                        libc::MADV_POPULATE_WRITE
                    } else {
                        libc::MADV_POPULATE_READ
                    };
                    // SAFETY: the range is inside the application view this heap owns, and its pages'
                    // protection allows the access populating simulates: it maps memfd pages just
                    // allocated and changes no byte under a live view (`view.rs`).
                    unsafe { libc::madvise(start as *mut libc::c_void, len, advice) == 0 }
                }
            };
            if done {
                mapped += (j - i) as u32;
            }
            i = j;
        }
        mapped
    }

    /// Makes sure the memfd pages `first..first + count` exist, so that an
    /// access to them is a minor fault and `UFFDIO_CONTINUE` can map them.
    fn ensure_allocated(&self, first: u32, count: u32) -> Result<(), i32> {
        let pages = first as usize..(first + count) as usize;
        if !self.allocated[pages.clone()].iter().all(|a| a.load(Ordering::Relaxed)) {
            let ps = self.page_size as u64;
            self.allocate(u64::from(first) * ps, u64::from(count) * ps)?;
            self.allocated[pages].iter().for_each(|a| a.store(true, Ordering::Relaxed));
        }
        Ok(())
    }

    /// Allocates the memfd pages of bytes `offset..offset + len` (inside the heap) that do not
    /// exist yet; returns errno on failure.
    fn allocate(&self, offset: u64, len: u64) -> Result<(), i32> {
        assert!(offset.saturating_add(len) <= self.size as u64, "memfd range outside the heap");
        let (fd, offset, len) = (self.memfd.as_raw_fd(), offset as libc::off_t, len as libc::off_t);
        // SAFETY: plain system call on the memfd this heap owns, for a range inside its size
        // (asserted above). Mode 0 only allocates the holes of the range; it changes no byte
        // (holes read as zeros either way).
        let rc = unsafe { libc::fallocate(fd, 0, offset, len) };
        if rc == 0 { Ok(()) } else { Err(super::sigsafe::errno()) }
    }

    /// Bytes of memfd pages that exist (test helper).
    #[cfg(test)]
    pub(super) fn backed_bytes(&self) -> u64 {
        let st = nix::sys::stat::fstat(&self.memfd).expect("fstat the heap memfd");
        st.st_blocks as u64 * 512
    }

    /// How this heap's page protection is enforced. An unprotected heap (`protect == false`)
    /// reports [`FaultBackend::Mprotect`]: it never changes protection.
    pub fn backend(&self) -> FaultBackend {
        if self.uffd.is_some() { FaultBackend::Uffd } else { FaultBackend::Mprotect }
    }

    /// The userfaultfd of the application view (userfaultfd backend only).
    pub(super) fn uffd(&self) -> Option<&Uffd> {
        self.uffd.as_ref()
    }

    /// The page holding application-view address `addr`, if it is inside the heap.
    pub(super) fn page_of(&self, addr: usize) -> Option<u32> {
        let off = addr.checked_sub(self.app.as_ptr() as usize)?;
        (off < self.size).then(|| (off / self.page_size) as u32)
    }

    /// The state word of page `p`. Panics if `p` is out of range.
    pub(super) fn state(&self, p: u32) -> &AtomicU8 {
        &self.states[p as usize]
    }

    fn offset(&self, p: u32) -> usize {
        if p >= self.npages {
            out_of_range(p, 1, self.npages);
        }
        p as usize * self.page_size
    }

    /// Start of page `p` in the runtime view.
    pub(super) fn runtime_page(&self, p: u32) -> *mut u8 {
        // `offset` < size, so this stays inside the runtime mapping.
        self.runtime.as_ptr().wrapping_add(self.offset(p))
    }

    /// Start of the twin of page `p`, which has one (a twin was made since the heap was mapped).
    pub(super) fn twin_page(&self, p: u32) -> *mut u8 {
        let slot = self.twin_slots[p as usize].load(Ordering::Acquire);
        assert_ne!(slot, NO_SLOT, "page {p} was never twinned");
        self.slot_start(slot)
    }

    /// Start of twin slot `slot` (< `npages`, so inside the twin area).
    fn slot_start(&self, slot: u32) -> *mut u8 {
        self.twins.as_ptr().wrapping_add(self.offset(slot))
    }

    /// Start of page `p`'s twin slot, handing it the next free slot if it has none yet.
    /// Async-signal-safe (atomics only). A page keeps its slot: the slots in use are the pages
    /// ever twinned, packed from the start of the twin area, whose first
    /// [`Heap::reserve_twins`] bytes are backed ahead of need.
    fn twin_slot_for(&self, p: u32) -> *mut u8 {
        let entry = &self.twin_slots[p as usize];
        let slot = entry.load(Ordering::Acquire);
        if slot != NO_SLOT {
            return self.slot_start(slot);
        }
        // One maker at a time per page (see `twin_slots`), so the exchange cannot lose; if it
        // did, the winner's slot serves and this one stays unused.
        let fresh = self.twin_slots_used.fetch_add(1, Ordering::Relaxed);
        if fresh >= self.npages {
            sigsafe::abort_with(&[b"treadmarks: twin slots exhausted (a bug in treadmarks::mem)\n"]);
        }
        match entry.compare_exchange(NO_SLOT, fresh, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => self.slot_start(fresh),
            Err(winner) => self.slot_start(winner),
        }
    }

    /// Backs the first `bytes` of the twin area (the slots of the first pages to be twinned)
    /// with memory now, so that those twins take no page fault when made; returns the bytes
    /// backed. Meant for startup: on this project's VM a first touch of fresh memory cost
    /// 0.25-6 ms per 2 MiB, and twins are made in the middle of the computation.
    pub fn reserve_twins(&self, bytes: usize) -> usize {
        let len = bytes.min(self.size).next_multiple_of(self.page_size).min(self.size);
        if len == 0 {
            return 0;
        }
        // SAFETY: the range lies inside the twin area; populating private anonymous memory
        // maps zeroed pages and changes no byte: a slot not handed out yet stays zero, which
        // `copy_to_twin` relies on for a never-written page's first twin.
        let rc = unsafe { libc::madvise(self.twins.as_ptr().cast(), len, libc::MADV_POPULATE_WRITE) };
        if rc != 0 {
            return 0; // Kernels before 5.14: slots are backed on first touch, as without this.
        }
        let slots = (len / self.page_size) as u32;
        self.twin_slots_reserved.fetch_max(slots, Ordering::Relaxed);
        len
    }

    /// Twin slots handed out (pages ever twinned), and twin slots backed at startup.
    pub fn twin_slots(&self) -> (u64, u64) {
        let used = self.twin_slots_used.load(Ordering::Relaxed).min(self.npages);
        (u64::from(used), u64::from(self.twin_slots_reserved.load(Ordering::Relaxed)))
    }

    /// Start of page `p` in the application view.
    pub(super) fn app_page(&self, p: u32) -> *mut u8 {
        self.app.as_ptr().wrapping_add(self.offset(p))
    }

    /// Copies page `p` from the runtime view into its twin slot. Async-signal-safe.
    ///
    /// # Safety
    /// The caller must own page `p`'s `BUSY` state or otherwise know that nobody writes the page
    /// (in either view) or its twin slot during the copy.
    ///
    /// A page never written (`written`) holds zeros, and so does the fresh slot its first twin
    /// gets (the twin area is zeroed anonymous memory, and slots are handed out once): that twin
    /// takes no copy, which spares both reading the page and writing the slot. Async-signal-safe
    /// (atomics and a copy).
    pub(super) unsafe fn copy_to_twin(&self, p: u32) {
        let first_twin = self.twin_slots[p as usize].load(Ordering::Acquire) == NO_SLOT;
        let slot = self.twin_slot_for(p);
        if !self.written[p as usize].swap(true, Ordering::Relaxed) && first_twin {
            AtomicCounters::bump(&self.counters.zero_twins);
            return;
        }
        // SAFETY: both ranges are `page_size` bytes inside live mappings of this heap (offset
        // checked), in distinct mappings so they do not overlap; the caller excludes writers.
        unsafe { std::ptr::copy_nonoverlapping(self.runtime_page(p), slot, self.page_size) };
    }

    /// Marks the application thread inside a call into the runtime until the guard drops: it
    /// runs no application code meanwhile, so the protocol core may read pages and twins that
    /// are read-only in the application view (nothing else makes one writable: a fault from
    /// another thread aborts), and writable ones while `Node::app_still` says nothing writes
    /// them (another thread may, through an open mutable view's slice). The runtime takes it
    /// around every call; the fault handler takes it while it waits for the service thread
    /// ([`Heap::app_waits_in_handler`]).
    ///
    /// Only the application thread changes the count (its fault handler runs on it too, and
    /// leaves it as it found it), so a load and a store do, without a read-modify-write: a
    /// local lock operation's two calls cost 20-25 ns more with `fetch_add`/`fetch_sub`.
    pub(crate) fn app_inside(&self) -> AppInside<'_> {
        self.app_enters();
        AppInside(self)
    }

    fn app_enters(&self) {
        let n = self.app_inside.load(Ordering::Relaxed);
        self.app_inside.store(n + 1, Ordering::Release);
    }

    fn app_leaves(&self) {
        let n = self.app_inside.load(Ordering::Relaxed);
        self.app_inside.store(n - 1, Ordering::Release);
    }

    /// [`Heap::app_inside`] for the fault handler, around `f` (its wait for the service thread):
    /// no guard, whose drop a signal handler would have to rely on. Async-signal-safe.
    pub(super) fn app_waits_in_handler(&self, f: impl FnOnce()) {
        self.app_enters();
        f();
        self.app_leaves();
    }

    /// Whether the application thread is inside a call into the runtime ([`Heap::app_inside`]).
    pub(super) fn app_is_inside(&self) -> bool {
        self.app_inside.load(Ordering::Acquire) > 0
    }

    /// The fault handler's twin of page `p`, at a write fault on it: a copy of the page
    /// ([`Heap::copy_to_twin`]), unless its last twin is still in the ring, untaken: the node has
    /// not heard of that twin, so no diff holds the writes made since it, and it stays (the page
    /// was made read-only again without the node's knowledge: recopied, those writes would be in
    /// no diff). Async-signal-safe.
    ///
    /// # Safety
    /// As [`Heap::copy_to_twin`].
    pub(super) unsafe fn twin_at_fault(&self, p: u32) {
        if !self.ring.is_queued(p) {
            // SAFETY: the caller's contract is `copy_to_twin`'s.
            unsafe { self.copy_to_twin(p) };
        }
    }

    /// The runtime is about to write page `p` (through the runtime view): it may no longer hold
    /// zeros (see `copy_to_twin`).
    pub(super) fn note_written(&self, p: u32) {
        self.written[p as usize].store(true, Ordering::Relaxed);
    }

    /// `mprotect`s pages `first..first+count` of the application view to the protection of
    /// stable state `st`. Async-signal-safe. Does not touch the state words.
    pub(super) fn protect_run(&self, first: u32, count: u32, st: u8) -> io::Result<()> {
        if u64::from(first) + u64::from(count) > u64::from(self.npages) {
            out_of_range(first, count, self.npages);
        }
        let len = count as usize * self.page_size;
        let start = self.app.as_ptr().wrapping_add(first as usize * self.page_size);
        // SAFETY: the range is inside the application view this heap mapped and owns (checked
        // above). A protection change changes no byte under a live view (`view.rs`): an access
        // it now forbids faults, and is resolved before it completes.
        let rc = unsafe { libc::mprotect(start.cast(), len, state::prot(st)) };
        if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
    }
}

impl Heap {
    /// Changes the application-view protection of pages `first..first+count`, all in stable
    /// state `old`, to stable state `new`. Does not touch the state words: the caller owns the
    /// pages' `BUSY` state. Returns the operation and errno on failure.
    ///
    /// - `mprotect` backend: one `mprotect` (whatever `old` is).
    /// - userfaultfd backend:
    ///   - to `INVALID`: `fallocate` the memfd range (so the pages exist and every later access
    ///     is a *minor* fault, never a silent zero-fill), then `MADV_DONTNEED` on the application
    ///     view. The memfd keeps the data; the runtime view still reads and writes it.
    ///   - `INVALID` to valid: `UFFDIO_CONTINUE`, in write-protect mode for `READ_ONLY` (no
    ///     writable window before a twin exists).
    ///   - to `READ_WRITE` from `READ_ONLY` or `FROZEN`: `UFFDIO_WRITEPROTECT` clear on short
    ///     runs of pages the application view maps, `MADV_DONTNEED` and writable
    ///     `UFFDIO_CONTINUE` on longer ones, `UFFDIO_CONTINUE` on the pages it does not map (see
    ///     `make_writable`).
    ///   - to `READ_ONLY` or `FROZEN` from `READ_WRITE`: `UFFDIO_WRITEPROTECT` set (nothing
    ///     between `READ_ONLY` and `FROZEN`, both write-protected).
    pub(super) fn change_run(
        &self,
        first: u32,
        count: u32,
        old: u8,
        new: u8,
    ) -> Result<(), (&'static str, i32)> {
        let Some(uffd) = &self.uffd else {
            return self
                .protect_run(first, count, new)
                .map_err(|e| ("mprotect", e.raw_os_error().unwrap_or(0)));
        };
        assert!(
            u64::from(first) + u64::from(count) <= u64::from(self.npages),
            "pages {first}..{} out of range: the heap has {} pages",
            u64::from(first) + u64::from(count),
            self.npages
        );
        let start = self.app.as_ptr() as usize + first as usize * self.page_size;
        let len = count as usize * self.page_size;
        let write_protected = |s: u8| s == state::READ_ONLY || s == state::FROZEN;
        match (old, new) {
            _ if old == new => Ok(()),
            _ if write_protected(old) && write_protected(new) => Ok(()),
            (_, state::INVALID) => {
                self.ensure_allocated(first, count).map_err(|e| ("fallocate", e))?;
                // SAFETY: the range is inside the application view this heap owns (checked above).
                // MADV_DONTNEED on a shared mapping only drops the PTEs (the memfd keeps the bytes);
                // an access through a live view (`view.rs`) faults and is resolved before it ends.
                if unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) } != 0 {
                    return Err(("madvise(MADV_DONTNEED)", super::sigsafe::errno()));
                }
                self.note_mapped(first, count, false);
                Ok(())
            }
            (state::INVALID, _) => {
                uffd.continue_range(start, len, new != state::READ_WRITE, self.page_size)
                    .map_err(|e| ("UFFDIO_CONTINUE", e))?;
                self.note_mapped(first, count, true);
                Ok(())
            }
            (_, state::READ_WRITE) => self.make_writable(uffd, first, count),
            (_, _) => uffd
                .writeprotect(start, len, new != state::READ_WRITE)
                .map_err(|e| ("UFFDIO_WRITEPROTECT", e)),
        }
    }
}

/// Shortest run of mapped pages that [`Heap::make_writable`] unmaps and maps again writable
/// rather than clearing its write protection.
///
/// Clearing the write protection of a shared (memfd) page leaves its page-table entry
/// read-only (Linux 6.18 does not upgrade it, dirty or not), so the application's first write
/// after it takes a kernel write fault. Measured on the 2-vCPU VM (a probe of 4,096 pages,
/// µs per page): clearing then writing costs 0.10 + 0.77 in runs of 16 and 0.06 + 0.74 in
/// runs of 256; `MADV_DONTNEED` + writable `UFFDIO_CONTINUE` costs 0.50 and 0.31, and the
/// write after it none. For one or two pages the two syscalls cost more (2.2 and 1.4 against
/// 1.6 and 1.2), hence the threshold.
const REMAP_MIN_RUN: u32 = 4;

impl Heap {
    /// Userfaultfd backend: write-protected pages `first..first+count` become writable. Pages
    /// the application view does not map yet (never touched there since they were allocated or
    /// last invalidated) are mapped writable at once, which spares each a minor fault on its
    /// first write (a signal and an ioctl, ~4 µs). Mapped runs of [`REMAP_MIN_RUN`] pages or
    /// more are unmapped and mapped again writable, which spares each a kernel write fault;
    /// shorter ones lose their write protection in place. The pages are held `BUSY` throughout,
    /// so an application access between the unmapping and the mapping faults and waits in the
    /// handler (which yields and retries on `BUSY`) until the mapping is done: no writable window
    /// opens before the twin exists, and nothing else maps the page meanwhile.
    fn make_writable(&self, uffd: &Uffd, first: u32, count: u32) -> Result<(), (&'static str, i32)> {
        let ps = self.page_size;
        let mut i = first;
        let end = first + count;
        while i < end {
            let mapped = self.mapped[i as usize].load(Ordering::Relaxed);
            let j =
                (i..end).find(|&k| self.mapped[k as usize].load(Ordering::Relaxed) != mapped).unwrap_or(end);
            let start = self.app.as_ptr() as usize + i as usize * ps;
            let len = (j - i) as usize * ps;
            if mapped && j - i < REMAP_MIN_RUN {
                uffd.writeprotect(start, len, false).map_err(|e| ("UFFDIO_WRITEPROTECT", e))?;
            } else if mapped {
                // SAFETY: the range is inside the application view this heap owns (the caller
                // checked it). MADV_DONTNEED on a shared mapping only drops the PTEs; the mapping
                // below maps the memfd's bytes again, and a view's access between faults.
                if unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) } != 0 {
                    return Err(("madvise(MADV_DONTNEED)", super::sigsafe::errno()));
                }
                uffd.continue_range(start, len, false, ps).map_err(|e| ("UFFDIO_CONTINUE", e))?;
            } else {
                self.ensure_allocated(i, j - i).map_err(|e| ("fallocate", e))?;
                uffd.continue_range(start, len, false, ps).map_err(|e| ("UFFDIO_CONTINUE", e))?;
                self.note_mapped(i, j - i, true);
            }
            i = j;
        }
        Ok(())
    }
}

impl Drop for Heap {
    fn drop(&mut self) {
        // Every `Arc` of the heap is gone: the views and page memories that hold references into
        // its regions hold the `Arc`. Raw pointers the application kept (`Tmk::ptr`) are its own
        // to stop using: an access through one faults while the range stays unmapped, and
        // reaches whatever is mapped there later otherwise.
        // SAFETY: the three regions were mapped by `map` with these sizes and are unmapped only
        // here, when nothing refers to them any more (above).
        unsafe {
            munmap(self.app, self.size);
            munmap(self.runtime, self.size);
            munmap(self.twins, self.size);
        }
    }
}
