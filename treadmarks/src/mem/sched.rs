//! Scheduling of a node's threads. On a machine whose cores are all busy with application
//! threads, a woken service thread otherwise waits up to a scheduler slice (milliseconds) for a
//! CPU, and every remote request it must answer waits with it. And a node whose two threads run
//! on two CPUs pays a cross-CPU TLB shootdown (an IPI, a VM exit on a virtual machine) for every
//! protection change that takes access away. So a node of a local job is pinned to one CPU and
//! its service thread asks for real-time priority, which makes it preempt its own application
//! thread as soon as it wakes.

/// The CPUs a job started here pins its nodes to, held against other treadmarks jobs on this
/// machine while its launcher lives: an exclusive `flock` on `treadmarks-cpu<N>.lock` in the
/// temporary directory for each, which the kernel drops when the process exits, however it
/// exits. Two jobs pinned to the same CPUs would each take ~4 times as long as alone where
/// sharing the CPUs unpinned costs each twice: their polling and real-time service threads
/// compete on every CPU.
#[derive(Debug)]
pub struct CpuClaims(Vec<nix::fcntl::Flock<std::fs::File>>);

impl CpuClaims {
    /// Claims the first `count` of the CPUs this process may run on (those [`pin_to_cpu`] gives
    /// indices `0..count`), all or none: `None` if another process holds any of them.
    pub fn take(count: usize) -> Option<CpuClaims> {
        use nix::fcntl::{Flock, FlockArg};
        let cpus = allowed_cpu_list()?;
        let mut held = Vec::new();
        for &cpu in cpus.iter().take(count) {
            let path = std::env::temp_dir().join(format!("treadmarks-cpu{cpu}.lock"));
            // Anyone may lock a file they can read: another user's lock file is opened read-only.
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .or_else(|_| std::fs::File::open(&path))
                .ok()?;
            held.push(Flock::lock(file, FlockArg::LockExclusiveNonblock).ok()?);
        }
        Some(CpuClaims(held))
    }

    /// CPUs held.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The CPUs this process may run on, in ascending order.
fn allowed_cpu_list() -> Option<Vec<usize>> {
    use nix::sched::{CpuSet, sched_getaffinity};
    use nix::unistd::Pid;
    let allowed = sched_getaffinity(Pid::from_raw(0)).ok()?;
    Some((0..CpuSet::count()).filter(|&c| allowed.is_set(c).unwrap_or(false)).collect())
}

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
    allowed_cpu_list().map_or(1, |cpus| cpus.len())
}

/// Pins the calling thread, and the threads it starts afterwards, to one CPU among those it may
/// run on: the `index`-th, modulo their number. Returns the CPU, or `None` if the kernel refused.
pub fn pin_to_cpu(index: usize) -> Option<usize> {
    use nix::sched::{CpuSet, sched_setaffinity};
    use nix::unistd::Pid;
    let cpus = allowed_cpu_list()?;
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
