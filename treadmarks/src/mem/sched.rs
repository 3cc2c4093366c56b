//! Scheduling of a node's threads. On a machine whose cores are all busy with application
//! threads, a woken service thread otherwise waits up to a scheduler slice (milliseconds) for a
//! CPU, and every remote request it must answer waits with it. And a node whose two threads run
//! on two CPUs pays a cross-CPU TLB shootdown (an IPI, a VM exit on a virtual machine) for every
//! protection change that takes access away. So a node of a local job is pinned to one CPU and
//! its service thread asks for real-time priority, which makes it preempt its own application
//! thread as soon as it wakes.

/// The CPUs a job started here pins its nodes to, held against other treadmarks jobs on this
/// machine while its launcher lives. A claim on CPU `N` is a bound abstract Unix socket named
/// `treadmarks-cpu<N>`: no file, no permission, visible to every user of the machine's network
/// namespace, and released by the kernel when the process exits, however it exits. Two jobs
/// pinned to the same CPUs took ~4 times as long each as alone, where sharing the CPUs unpinned
/// costs each about twice: their polling and real-time service threads compete on every CPU.
#[derive(Debug)]
pub struct CpuClaims {
    cpus: Vec<usize>,
    _held: Vec<std::os::unix::net::UnixListener>,
}

/// What [`CpuClaims::take`] found.
#[derive(Debug)]
pub enum CpuClaim {
    /// The CPUs are this process's.
    Claimed(CpuClaims),
    /// Other processes hold too many of the CPUs: run unpinned.
    Busy,
    /// Claims cannot be made here (no Unix sockets): pin as if alone.
    Unavailable,
}

impl CpuClaim {
    /// Whether to pin, as the claim says: where claimed, yes; where others hold the CPUs, no;
    /// where claims cannot be made, it has no say.
    pub fn pin(&self) -> Option<bool> {
        match self {
            CpuClaim::Claimed(_) => Some(true),
            CpuClaim::Busy => Some(false),
            CpuClaim::Unavailable => None,
        }
    }

    /// The claims, if they were made.
    pub fn into_claims(self) -> Option<CpuClaims> {
        match self {
            CpuClaim::Claimed(claims) => Some(claims),
            _ => None,
        }
    }
}

impl CpuClaims {
    /// Claims `count` CPUs this process may run on, the first ones no other process holds, all
    /// or none.
    pub fn take(count: usize) -> CpuClaim {
        Self::take_named("treadmarks-cpu", count)
    }

    /// [`CpuClaims::take`] with claims named `<prefix><N>` (tests use names of their own).
    pub fn take_named(prefix: &str, count: usize) -> CpuClaim {
        use std::os::linux::net::SocketAddrExt;
        use std::os::unix::net::{SocketAddr, UnixListener};
        let Some(allowed) = allowed_cpu_list() else { return CpuClaim::Unavailable };
        let (mut cpus, mut held) = (Vec::new(), Vec::new());
        for cpu in allowed {
            if cpus.len() == count {
                break;
            }
            let Ok(name) = SocketAddr::from_abstract_name(format!("{prefix}{cpu}")) else {
                return CpuClaim::Unavailable;
            };
            match UnixListener::bind_addr(&name) {
                Ok(listener) => {
                    cpus.push(cpu);
                    held.push(listener);
                }
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {}
                Err(_) => return CpuClaim::Unavailable,
            }
        }
        if cpus.len() < count {
            return CpuClaim::Busy;
        }
        CpuClaim::Claimed(CpuClaims { cpus, _held: held })
    }

    /// The CPUs claimed, in ascending order.
    pub fn cpus(&self) -> &[usize] {
        &self.cpus
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
    let cpus = allowed_cpu_list()?;
    pin_to(*cpus.get(index % cpus.len().max(1))?)
}

/// A thread's CPU affinity, taken before it is pinned, to be put back once its node is done
/// ([`Affinity::restore`]): a program that goes on after its job, or starts another, is not
/// left on one CPU.
#[derive(Debug, Clone, Copy)]
pub struct Affinity(nix::sched::CpuSet);

impl Affinity {
    /// The calling thread's, if the kernel says.
    pub fn current() -> Option<Affinity> {
        nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).ok().map(Affinity)
    }

    /// Makes it the calling thread's again (nothing if the kernel refuses).
    pub fn restore(&self) {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &self.0);
    }
}

/// The calling thread's affinity, put back when this is dropped unless it was
/// [`AffinityGuard::disarm`]ed: a startup that pins its thread and then fails leaves it as it
/// found it.
#[derive(Debug)]
pub struct AffinityGuard(Option<Affinity>);

impl AffinityGuard {
    /// Takes the calling thread's affinity now.
    pub fn take() -> AffinityGuard {
        AffinityGuard(Affinity::current())
    }

    /// Hands the affinity over (to be put back later by its new holder) instead of on drop.
    pub fn disarm(mut self) -> Option<Affinity> {
        self.0.take()
    }
}

impl Drop for AffinityGuard {
    fn drop(&mut self) {
        if let Some(a) = self.0.take() {
            a.restore();
        }
    }
}

/// Pins the calling thread, and the threads it starts afterwards, to CPU `cpu`. Returns it, or
/// `None` if the kernel refused.
pub fn pin_to(cpu: usize) -> Option<usize> {
    use nix::sched::{CpuSet, sched_setaffinity};
    use nix::unistd::Pid;
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

    /// A guard puts the affinity it took back when dropped (a startup that fails after
    /// pinning), and leaves it to its new holder once disarmed.
    #[test]
    fn an_affinity_guard_restores_unless_disarmed() {
        use nix::sched::{CpuSet, sched_getaffinity};
        use nix::unistd::Pid;
        let cpus = || {
            let set = sched_getaffinity(Pid::from_raw(0)).unwrap();
            (0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap()).collect::<Vec<_>>()
        };
        let (before, dropped, disarmed, restored) = std::thread::spawn(move || {
            let before = cpus();
            let guard = AffinityGuard::take();
            pin_to_cpu(0).expect("pinned");
            drop(guard);
            let dropped = cpus();
            let guard = AffinityGuard::take();
            pin_to_cpu(0).expect("pinned");
            let kept = guard.disarm().expect("the kernel said");
            let disarmed = cpus();
            kept.restore();
            (before, dropped, disarmed, cpus())
        })
        .join()
        .unwrap();
        assert_eq!((&dropped, &restored), (&before, &before));
        assert_eq!(disarmed.len(), 1, "{disarmed:?}");
    }
}
