//! Scheduling of the service thread. On a machine whose cores are all busy with application
//! threads, a woken service thread otherwise waits up to a scheduler slice (milliseconds) for a
//! CPU, and every remote request it must answer waits with it.

/// How the service thread was scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServicePriority {
    /// `SCHED_FIFO`: it runs as soon as it wakes (needs `CAP_SYS_NICE`, e.g. root).
    RealTime,
    /// The default policy: it competes with the application threads.
    Normal,
}

/// Asks for real-time (`SCHED_FIFO`, lowest priority) scheduling of the calling thread, which
/// is the service thread: it sleeps in `epoll` except while it handles an event, so it cannot
/// starve anybody (and the kernel's real-time throttling bounds it anyway).
pub fn prioritize_service_thread() -> ServicePriority {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: `sched_setscheduler` with pid 0 affects only the calling thread and reads `param`,
    // a valid `sched_param` on the stack; failure (EPERM without privilege) changes nothing.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc == 0 { ServicePriority::RealTime } else { ServicePriority::Normal }
}
