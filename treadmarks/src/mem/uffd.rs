//! A minimal userfaultfd binding over `libc`: the few ioctls the userfaultfd fault backend needs,
//! with the ioctl numbers and struct layouts of `<linux/userfaultfd.h>` written out.
//!
//! The `userfaultfd` crate is not used on purpose: it needs libclang at build time and carries
//! Linux 6.1 bindings (no `UFFDIO_CONTINUE_MODE_WP`).
//!
//! The descriptor is created with `UFFD_USER_MODE_ONLY` (allowed without privileges since Linux
//! 5.11) and `UFFD_FEATURE_SIGBUS`: a fault in a registered range raises SIGBUS in the faulting
//! thread instead of queueing an event, so nobody ever reads the descriptor. Its only uses are the
//! ioctls below; closing it unregisters every range.
//!
//! Every ioctl wrapper here is async-signal-safe (raw system calls on a descriptor and a stack
//! struct, `errno` read right after) so the fault handler may call it.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::sigsafe;

/// `UFFD_API`.
const UFFD_API: u64 = 0xAA;
/// `UFFD_USER_MODE_ONLY`: flag of `userfaultfd(2)`; faults from kernel mode are not handled
/// (a system call touching a protected page fails with EFAULT, as with `mprotect`).
const UFFD_USER_MODE_ONLY: libc::c_int = 1;

/// `UFFD_FEATURE_SIGBUS`: deliver faults as SIGBUS to the faulting thread.
pub(super) const FEATURE_SIGBUS: u64 = 1 << 7;
/// `UFFD_FEATURE_MINOR_SHMEM`: minor faults on shmem (our memfd).
pub(super) const FEATURE_MINOR_SHMEM: u64 = 1 << 10;
/// `UFFD_FEATURE_WP_HUGETLBFS_SHMEM`: write protection on shmem (Linux 5.19).
pub(super) const FEATURE_WP_SHMEM: u64 = 1 << 12;
/// What the backend needs, with a name for messages.
pub(super) const REQUIRED_FEATURES: [(u64, &str, &str); 3] = [
    (FEATURE_SIGBUS, "UFFD_FEATURE_SIGBUS", "Linux 4.14"),
    (FEATURE_MINOR_SHMEM, "UFFD_FEATURE_MINOR_SHMEM", "Linux 5.13"),
    (FEATURE_WP_SHMEM, "UFFD_FEATURE_WP_HUGETLBFS_SHMEM", "Linux 5.19"),
];

/// `UFFDIO_REGISTER_MODE_WP`.
const REGISTER_MODE_WP: u64 = 1 << 1;
/// `UFFDIO_REGISTER_MODE_MINOR`.
const REGISTER_MODE_MINOR: u64 = 1 << 2;
/// `UFFDIO_WRITEPROTECT_MODE_WP`: set (1) or clear (0) write protection.
const WRITEPROTECT_MODE_WP: u64 = 1 << 0;
/// `UFFDIO_WRITEPROTECT_MODE_DONTWAKE`: no thread waits on the descriptor (SIGBUS mode).
const WRITEPROTECT_MODE_DONTWAKE: u64 = 1 << 1;
/// `UFFDIO_CONTINUE_MODE_DONTWAKE`.
const CONTINUE_MODE_DONTWAKE: u64 = 1 << 0;
/// `UFFDIO_CONTINUE_MODE_WP`: map the page write-protected (Linux 6.2). No writable window.
const CONTINUE_MODE_WP: u64 = 1 << 1;

/// `_UFFDIO_WRITEPROTECT` and `_UFFDIO_CONTINUE`: bit numbers in `uffdio_register.ioctls`.
const IOCTL_BIT_WRITEPROTECT: u64 = 1 << 0x06;
const IOCTL_BIT_CONTINUE: u64 = 1 << 0x07;

/// `struct uffdio_api`.
#[repr(C)]
#[derive(Default)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

/// `struct uffdio_range`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

/// `struct uffdio_register`.
#[repr(C)]
#[derive(Default)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

/// `struct uffdio_writeprotect`.
#[repr(C)]
#[derive(Default)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

/// `struct uffdio_continue`.
#[repr(C)]
#[derive(Default)]
struct UffdioContinue {
    range: UffdioRange,
    mode: u64,
    /// Bytes mapped, or a negated errno if nothing was.
    mapped: i64,
}

const _: () = assert!(size_of::<UffdioApi>() == 24);
const _: () = assert!(size_of::<UffdioRange>() == 16);
const _: () = assert!(size_of::<UffdioRegister>() == 32);
const _: () = assert!(size_of::<UffdioWriteprotect>() == 24);
const _: () = assert!(size_of::<UffdioContinue>() == 32);

/// `_IOWR(0xAA, nr, T)` in the generic Linux encoding (x86, arm64, riscv): direction bits 30-31
/// (read|write = 3), size bits 16-29, type bits 8-15, number bits 0-7.
const fn iowr(nr: u64, size: usize) -> libc::c_ulong {
    ((3u64 << 30) | ((size as u64) << 16) | (UFFD_API << 8) | nr) as libc::c_ulong
}

const UFFDIO_API: libc::c_ulong = iowr(0x3F, size_of::<UffdioApi>());
const UFFDIO_REGISTER: libc::c_ulong = iowr(0x00, size_of::<UffdioRegister>());
const UFFDIO_WRITEPROTECT: libc::c_ulong = iowr(0x06, size_of::<UffdioWriteprotect>());
const UFFDIO_CONTINUE: libc::c_ulong = iowr(0x07, size_of::<UffdioContinue>());
const _: () = assert!(UFFDIO_API == 0xC018_AA3F);
const _: () = assert!(UFFDIO_REGISTER == 0xC020_AA00);
const _: () = assert!(UFFDIO_WRITEPROTECT == 0xC018_AA06);
const _: () = assert!(UFFDIO_CONTINUE == 0xC020_AA07);

/// How many times an ioctl is retried on EAGAIN before giving up. EAGAIN means "the address
/// space is changing" (`mmap_changing`), which only non-cooperative event features (fork, remap,
/// remove, unmap events) set; we enable none, so a retry or two covers any surprise.
const EAGAIN_RETRIES: u32 = 10_000;

/// Why the userfaultfd backend cannot be had, and how to fix it.
#[derive(Debug, Clone)]
pub struct Unavailable {
    /// What failed, e.g. "userfaultfd(2) failed: Operation not permitted (os error 1)".
    pub why: String,
    /// What to do about it.
    pub fix: &'static str,
}

/// An open userfaultfd descriptor in SIGBUS mode with the backend's features enabled.
#[derive(Debug)]
pub(super) struct Uffd {
    fd: OwnedFd,
}

/// What `continue_range` did with a page that turned out to be mapped already.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Continued {
    /// Every page of the range was mapped by this call.
    All,
    /// At least one page was already mapped (EEXIST); it was given the requested write
    /// protection with `UFFDIO_WRITEPROTECT` instead.
    SomeExisted,
}

/// `userfaultfd(2)` with `O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY`.
fn new_fd() -> Result<OwnedFd, Unavailable> {
    let flags = libc::O_CLOEXEC | libc::O_NONBLOCK | UFFD_USER_MODE_ONLY;
    // SAFETY: plain system call with integer arguments.
    let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
    if fd < 0 {
        let err = io::Error::last_os_error();
        let fix = match err.raw_os_error() {
            Some(libc::ENOSYS) => "the kernel was built without CONFIG_USERFAULTFD; use TMK_FAULTS=mprotect",
            Some(libc::EPERM) => {
                "userfaultfd is not permitted here (vm.unprivileged_userfaultfd=0 without \
                 CAP_SYS_PTRACE, or a seccomp filter, as in default container profiles): run with \
                 `sysctl vm.unprivileged_userfaultfd=1`, allow the userfaultfd syscall in the \
                 seccomp profile, or use TMK_FAULTS=mprotect"
            }
            _ => "use TMK_FAULTS=mprotect",
        };
        return Err(Unavailable { why: format!("userfaultfd(2) failed: {err}"), fix });
    }
    // SAFETY: `fd` was just returned by the kernel and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// The kernel's supported userfaultfd features (a throw-away descriptor, `UFFDIO_API` with no
/// feature requested reports them all).
pub(super) fn supported_features() -> Result<u64, Unavailable> {
    let fd = new_fd()?;
    let mut api = UffdioApi { api: UFFD_API, ..Default::default() };
    // SAFETY: `api` is a live, correctly laid out `uffdio_api` (size asserted above).
    if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api) } != 0 {
        return Err(Unavailable {
            why: format!("UFFDIO_API failed: {}", io::Error::last_os_error()),
            fix: "use TMK_FAULTS=mprotect",
        });
    }
    Ok(api.features)
}

impl Uffd {
    /// Opens a descriptor with SIGBUS delivery, minor faults and write protection on shmem, or
    /// says what is missing.
    pub(super) fn open() -> Result<Uffd, Unavailable> {
        let have = supported_features()?;
        let missing: Vec<String> = REQUIRED_FEATURES
            .iter()
            .filter(|(bit, ..)| have & bit == 0)
            .map(|(_, name, since)| format!("{name} (since {since})"))
            .collect();
        if !missing.is_empty() {
            return Err(Unavailable {
                why: format!("the kernel lacks userfaultfd features {}", missing.join(", ")),
                fix: "run on Linux 6.2 or later, or use TMK_FAULTS=mprotect",
            });
        }
        let fd = new_fd()?;
        let mut api = UffdioApi {
            api: UFFD_API,
            features: FEATURE_SIGBUS | FEATURE_MINOR_SHMEM | FEATURE_WP_SHMEM,
            ioctls: 0,
        };
        // SAFETY: as in `supported_features`.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api) } != 0 {
            return Err(Unavailable {
                why: format!("UFFDIO_API with the needed features failed: {}", io::Error::last_os_error()),
                fix: "use TMK_FAULTS=mprotect",
            });
        }
        Ok(Uffd { fd })
    }

    /// Registers `start..start+len` (a shared memfd mapping) for minor faults and write
    /// protection.
    pub(super) fn register(&self, start: usize, len: usize) -> Result<(), Unavailable> {
        let mut reg = UffdioRegister {
            range: UffdioRange { start: start as u64, len: len as u64 },
            mode: REGISTER_MODE_MINOR | REGISTER_MODE_WP,
            ioctls: 0,
        };
        // SAFETY: `reg` is a live, correctly laid out `uffdio_register`; registering changes no
        // memory contents, only how faults in the range are handled (the caller owns it).
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER, &mut reg) } != 0 {
            return Err(Unavailable {
                why: format!(
                    "UFFDIO_REGISTER (minor | write-protect) of the heap failed: {}",
                    io::Error::last_os_error()
                ),
                fix: "run on Linux 6.2 or later with shmem userfaultfd support, or use TMK_FAULTS=mprotect",
            });
        }
        let want = IOCTL_BIT_CONTINUE | IOCTL_BIT_WRITEPROTECT;
        if reg.ioctls & want != want {
            return Err(Unavailable {
                why: format!(
                    "UFFDIO_REGISTER offers ioctls {:#x}, without CONTINUE or WRITEPROTECT",
                    reg.ioctls
                ),
                fix: "run on Linux 6.2 or later, or use TMK_FAULTS=mprotect",
            });
        }
        Ok(())
    }

    /// Sets (`wp`) or clears write protection of `start..start+len`. Async-signal-safe.
    /// Returns the errno on failure.
    pub(super) fn writeprotect(&self, start: usize, len: usize, wp: bool) -> Result<(), i32> {
        let mut tries = 0;
        loop {
            let mut arg = UffdioWriteprotect {
                range: UffdioRange { start: start as u64, len: len as u64 },
                mode: if wp { WRITEPROTECT_MODE_WP } else { WRITEPROTECT_MODE_DONTWAKE },
            };
            // SAFETY: `arg` is a live `uffdio_writeprotect`; the range is inside the registered
            // application view (the caller's contract). It changes no byte under a live view
            // (`view.rs`): a write it now forbids faults and is resolved before it completes.
            if unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_WRITEPROTECT, &mut arg) } == 0 {
                return Ok(());
            }
            let err = sigsafe::errno();
            // Hazard "EAGAIN while events are pending": the address space is changing
            // (`mmap_changing`); nothing was done, so retrying the same call is right.
            if err == libc::EAGAIN && tries < EAGAIN_RETRIES {
                tries += 1;
                // SAFETY: no arguments; async-signal-safe.
                unsafe { libc::sched_yield() };
                continue;
            }
            return Err(err);
        }
    }

    /// Maps the pages `start..start+len` of the registered view onto the memfd's pages (which
    /// must exist), write-protected if `wp`: `UFFDIO_CONTINUE`, with `UFFDIO_CONTINUE_MODE_WP`
    /// so a read-only page is never writable, not even for an instant. Async-signal-safe.
    ///
    /// A page found already mapped (EEXIST) gets the requested protection with
    /// `UFFDIO_WRITEPROTECT` and the call goes on with the next page. Returns the errno of any
    /// other failure.
    pub(super) fn continue_range(
        &self,
        start: usize,
        len: usize,
        wp: bool,
        page_size: usize,
    ) -> Result<Continued, i32> {
        let end = start + len;
        let mut at = start;
        let mut outcome = Continued::All;
        let mut tries = 0;
        while at < end {
            let mut arg = UffdioContinue {
                range: UffdioRange { start: at as u64, len: (end - at) as u64 },
                mode: CONTINUE_MODE_DONTWAKE | if wp { CONTINUE_MODE_WP } else { 0 },
                mapped: 0,
            };
            // SAFETY: `arg` is a live `uffdio_continue`; the range is inside the registered
            // application view and its memfd pages exist (the caller's contract). Mapping a
            // page changes none of its bytes under a live view (`view.rs`).
            let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_CONTINUE, &mut arg) };
            if rc == 0 {
                return Ok(outcome);
            }
            let err = sigsafe::errno();
            if arg.mapped > 0 {
                // Partial progress (reported as EAGAIN): go on after what was mapped.
                at += arg.mapped as usize;
                continue;
            }
            match err {
                libc::EAGAIN if tries < EAGAIN_RETRIES => {
                    // Hazard "EAGAIN while events are pending": see `writeprotect`.
                    tries += 1;
                    // SAFETY: no arguments; async-signal-safe.
                    unsafe { libc::sched_yield() };
                }
                libc::EEXIST => {
                    // Hazard "a fault on a page being installed": the page at `at` is mapped
                    // already (a valid page the application touched first, say). Give it the
                    // protection asked for and skip it.
                    self.writeprotect(at, page_size, wp)?;
                    outcome = Continued::SomeExisted;
                    at += page_size;
                }
                _ => return Err(err),
            }
        }
        Ok(outcome)
    }
}

/// Checks, on a scratch one-page memfd mapped once, that the whole uffd mechanism the backend
/// uses works on this kernel: open with the features, register minor | WP, write-protect,
/// `MADV_DONTNEED`, `UFFDIO_CONTINUE` in WP mode, clear WP. Does not fault.
pub(super) fn check_mechanism(page_size: usize) -> Result<(), Unavailable> {
    let uffd = Uffd::open()?;
    let fail = |what: &str, err: io::Error| Unavailable {
        why: format!("the userfaultfd self-check failed at {what}: {err}"),
        fix: "run on Linux 6.2 or later (UFFDIO_CONTINUE_MODE_WP), or use TMK_FAULTS=mprotect",
    };
    // SAFETY: a NUL-terminated name that outlives the call.
    let fd = unsafe { libc::memfd_create(c"treadmarks-uffd-check".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(fail("memfd_create", io::Error::last_os_error()));
    }
    // SAFETY: just returned by the kernel, owned by nobody else.
    let memfd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain system call on a descriptor we own.
    if unsafe { libc::fallocate(memfd.as_raw_fd(), 0, 0, page_size as libc::off_t) } != 0 {
        return Err(fail("fallocate", io::Error::last_os_error()));
    }
    // SAFETY: no fixed address: the kernel picks a free range, which we own until munmap below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            page_size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            memfd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(fail("mmap", io::Error::last_os_error()));
    }
    let start = p as usize;
    let result = (|| {
        uffd.register(start, page_size)?;
        let errno = |e: i32| io::Error::from_raw_os_error(e);
        uffd.writeprotect(start, page_size, true).map_err(|e| fail("UFFDIO_WRITEPROTECT", errno(e)))?;
        // SAFETY: the scratch page we mapped above; nothing references it.
        if unsafe { libc::madvise(p, page_size, libc::MADV_DONTNEED) } != 0 {
            return Err(fail("MADV_DONTNEED", io::Error::last_os_error()));
        }
        uffd.continue_range(start, page_size, true, page_size)
            .map_err(|e| fail("UFFDIO_CONTINUE (MODE_WP)", errno(e)))?;
        uffd.writeprotect(start, page_size, false)
            .map_err(|e| fail("UFFDIO_WRITEPROTECT (clear)", errno(e)))?;
        Ok(())
    })();
    // SAFETY: the scratch mapping made above; nothing refers to it any more.
    unsafe { libc::munmap(p, page_size) };
    result
}
