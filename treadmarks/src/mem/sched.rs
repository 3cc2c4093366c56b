//! Scheduling of a node's threads. On a machine whose cores are all busy with application
//! threads, a woken service thread otherwise waits up to a scheduler slice (milliseconds) for a
//! CPU, and every remote request it must answer waits with it. And a node whose two threads run
//! on two CPUs pays a cross-CPU TLB shootdown (an IPI, a VM exit on a virtual machine) for every
//! protection change that takes access away. So a node of a local job is pinned to one CPU and
//! its service thread asks for real-time priority, which makes it preempt its own application
//! thread as soon as it wakes.

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

/// How many CPUs the calling thread may run on.
pub fn allowed_cpus() -> usize {
    use nix::sched::{CpuSet, sched_getaffinity};
    use nix::unistd::Pid;
    match sched_getaffinity(Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).count(),
        Err(_) => 1,
    }
}

/// Pins the calling thread, and the threads it starts afterwards, to one CPU among those it may
/// run on: the `index`-th, modulo their number. Returns the CPU, or `None` if the kernel refused.
pub fn pin_to_cpu(index: usize) -> Option<usize> {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use nix::unistd::Pid;
    let allowed = sched_getaffinity(Pid::from_raw(0)).ok()?;
    let cpus: Vec<usize> = (0..CpuSet::count()).filter(|&c| allowed.is_set(c).unwrap_or(false)).collect();
    let cpu = *cpus.get(index % cpus.len().max(1))?;
    let mut one = CpuSet::new();
    one.set(cpu).ok()?;
    sched_setaffinity(Pid::from_raw(0), &one).ok()?;
    Some(cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinning_leaves_one_allowed_cpu_and_wraps_around() {
        use nix::sched::{CpuSet, sched_getaffinity};
        use nix::unistd::Pid;
        let allowed = sched_getaffinity(Pid::from_raw(0)).unwrap();
        let ncpus = (0..CpuSet::count()).filter(|&c| allowed.is_set(c).unwrap()).count();
        // In threads of their own: affinity is per thread, and the test harness's stays as is.
        let first = std::thread::spawn(|| pin_to_cpu(0)).join().unwrap().expect("pinned");
        let (again, now) = std::thread::spawn(move || {
            let cpu = pin_to_cpu(ncpus).expect("pinned");
            let set = sched_getaffinity(Pid::from_raw(0)).unwrap();
            (cpu, (0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap()).collect::<Vec<_>>())
        })
        .join()
        .unwrap();
        assert_eq!(again, first, "index {ncpus} wraps around to the first CPU");
        assert_eq!(now, vec![first]);
    }
}
