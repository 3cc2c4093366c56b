//! Starting a job on this machine: the first process is node 0 and spawns nodes `1..n` as copies
//! of itself (same executable, same arguments) told their rank and node 0's address through the
//! environment. Every spawned process is reaped: by [`Children::wait`] after an orderly exit, or
//! killed and reaped on drop. A spawned node dies with its launcher (`PR_SET_PDEATHSIG`).

use crate::config::Config;
use crate::error::{Error, Result};
use crate::protocol::NodeId;
use std::net::SocketAddr;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Node processes this process spawned.
#[derive(Debug, Default)]
pub(crate) struct Children {
    procs: Vec<(NodeId, Child)>,
}

/// How long the startup watch lets the meeting end on its own after a node exited, before it
/// stops the process itself: a root that failed the meeting rejects each peer (each reject
/// bounded by 200 ms) before its error comes back, and the peers exit on the reject.
const MEETING_GRACE: Duration = Duration::from_secs(2);

/// Watches spawned nodes while the job meets: a node that exits before the meeting ends (a heap
/// it cannot map, say) would otherwise leave this process waiting out the meeting's timeout.
/// [`StartupWatch::finish`] ends the watch and hands the nodes back; dropped instead (the
/// launcher failed to start), the watch ends and the nodes are killed and reaped.
#[derive(Debug)]
pub(crate) struct StartupWatch {
    stop: Arc<AtomicBool>,
    children: Arc<Mutex<Children>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StartupWatch {
    /// Watches `children` from a thread until dropped; a node that exits meanwhile ends this
    /// process with a message naming it and its exit status.
    pub fn new(children: Children) -> StartupWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let children = Arc::new(Mutex::new(children));
        let (s, c) = (stop.clone(), children.clone());
        let thread = std::thread::Builder::new()
            .name("tmk-startup-watch".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    let exited = c.lock().expect("children").first_exited();
                    if let Some((node, status)) = exited {
                        // The meeting may be failing already, the node exiting on the root's
                        // reject: the meeting's own error, naming the cause, is the one to give.
                        let grace = Instant::now() + MEETING_GRACE;
                        while Instant::now() < grace && !s.load(Ordering::Acquire) {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        if s.load(Ordering::Acquire) {
                            return;
                        }
                        crate::report(&format!(
                            "treadmarks: {node} exited while the job was starting ({status}); stopping"
                        ));
                        drop(c.lock().map(|mut ch| std::mem::take(&mut *ch)));
                        std::process::exit(1);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
            .ok();
        StartupWatch { stop, children, thread }
    }

    /// Ends the watch and hands the children back.
    pub fn finish(mut self) -> Children {
        self.end();
        std::mem::take(&mut *self.children.lock().expect("children"))
    }

    fn end(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for StartupWatch {
    /// Ends the watch; the children, unless [`StartupWatch::finish`] took them, go with it
    /// (killed and reaped by [`Children`]'s drop).
    fn drop(&mut self) {
        self.end();
    }
}

impl Children {
    /// The first node found to have exited, and how: its status, or that it was reaped behind
    /// our back (an application that ignores `SIGCHLD` has its children reaped by the kernel,
    /// and their deaths had gone unseen).
    fn first_exited(&mut self) -> Option<(NodeId, String)> {
        self.procs.iter_mut().find_map(|(node, child)| match child.try_wait() {
            Ok(Some(status)) => Some((*node, status.to_string())),
            Err(e) if e.raw_os_error() == Some(libc::ECHILD) => {
                Some((*node, "reaped elsewhere, its status unknown: is SIGCHLD ignored?".into()))
            }
            _ => None,
        })
    }

    /// Spawns nodes `1..config.nprocs`, meeting at `root`, with the launcher's settings
    /// ([`Config::to_vars`]: a configuration given to [`Tmk::startup_with`](crate::Tmk::startup_with)
    /// holds for every node, not only the launcher).
    /// `pin`: the launcher's decision to pin the job's nodes, passed on as `TMK_PIN`, and the
    /// CPUs it claimed for them, if it did (`TMK_LAUNCHER_CPUS`, read by [`claimed_cpus`]).
    pub fn spawn(config: &Config, root: SocketAddr, pin: bool, cpus: Option<&[usize]>) -> Result<Children> {
        let exe = std::env::current_exe().map_err(|e| {
            Error::Failed(format!("cannot find this program to start nodes 1..{}: {e}", config.nprocs))
        })?;
        let mut children = Children::default();
        let cpus = cpus.map(|c| c.iter().map(usize::to_string).collect::<Vec<_>>().join(","));
        let nprocs = config.nprocs;
        let settings = config.to_vars();
        for rank in 1..nprocs {
            let node = NodeId(rank);
            let mut cmd = Command::new(&exe);
            if let Some(cpus) = &cpus {
                cmd.env("TMK_LAUNCHER_CPUS", cpus);
            }
            for (name, value) in &settings {
                match value {
                    Some(v) => cmd.env(name, v),
                    None => cmd.env_remove(name),
                };
            }
            let child = cmd
                .args(std::env::args_os().skip(1))
                .env("TMK_RANK", rank.to_string())
                .env("TMK_NPROCS", nprocs.to_string())
                .env("TMK_ROOT", root.to_string())
                .env("TMK_LAUNCHER_PID", std::process::id().to_string())
                .env("TMK_PIN", if pin { "1" } else { "0" })
                .spawn()
                .map_err(|source| Error::Spawn { node, source })?;
            children.procs.push((node, child));
        }
        Ok(children)
    }

    /// Waits (at most `timeout`) for every node to exit; reports the first that failed.
    pub fn wait(mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut first_error = None;
        while !self.procs.is_empty() {
            let mut i = 0;
            while i < self.procs.len() {
                match self.procs[i].1.try_wait() {
                    Ok(Some(status)) => {
                        let (node, _) = self.procs.swap_remove(i);
                        if !status.success() && first_error.is_none() {
                            first_error = Some(Error::NodeExited { node, status: status.to_string() });
                        }
                    }
                    Ok(None) => i += 1,
                    // Reaped already, by someone else (`SIGCHLD` ignored, say): its status is
                    // gone, and its exit rendezvous passed or the job failed without it.
                    Err(e) if e.raw_os_error() == Some(libc::ECHILD) => {
                        self.procs.swap_remove(i);
                    }
                    // Left in the list, to be killed and reaped at the deadline.
                    Err(e) => {
                        let node = self.procs[i].0;
                        first_error
                            .get_or_insert(Error::NodeExited { node, status: format!("unknown ({e})") });
                        i += 1;
                    }
                }
            }
            if let Some(&(node, _)) = self.procs.first().filter(|_| Instant::now() > deadline) {
                first_error.get_or_insert(Error::NodeLingered { node, waited: timeout });
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(self);
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for (_, child) in &mut self.procs {
            // One reaped elsewhere is gone, and its pid may be another process's by now.
            if child.try_wait().is_err_and(|e| e.raw_os_error() == Some(libc::ECHILD)) {
                continue;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// In a node a launcher spawned: the CPUs the launcher claimed for the job, if it did.
pub(crate) fn claimed_cpus() -> Option<Vec<usize>> {
    let list = std::env::var("TMK_LAUNCHER_CPUS").ok()?;
    list.split(',').map(|c| c.trim().parse().ok()).collect()
}

/// True in a node a launcher spawned on its own machine: told its rank and the launcher's pid,
/// which is its parent's. A launcher that another program started and told its pid
/// (`TMK_LAUNCHER_PID` alone, to die with it: the core bench's re-executed 4-node launcher) is
/// not one, nor is a program a node starts, which inherits the node's environment
/// ([`started_by_a_node`]: its startup is refused, saying why).
pub(crate) fn spawned_by_launcher() -> bool {
    spawned_by_launcher_in(|k| std::env::var_os(k))
}

/// [`spawned_by_launcher`] in the environment `var` gives (the configuration reads its own):
/// both variables set and not empty, as the configuration reads settings, and the pid this
/// process's parent's.
pub(crate) fn spawned_by_launcher_in(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> bool {
    let set = |k: &str| var(k).is_some_and(|v| !v.is_empty());
    let parent = nix::unistd::getppid().as_raw().to_string();
    set("TMK_RANK") && var("TMK_LAUNCHER_PID").is_some_and(|pid| pid.to_str() == Some(parent.as_str()))
}

/// The launcher's pid, in a program that a node of a launched job started: its environment is
/// the node's (`TMK_RANK`, `TMK_LAUNCHER_PID`, ...), and its parent's parent is the launcher.
/// Such a program cannot join that job, and would take itself for a node of it.
pub(crate) fn started_by_a_node() -> Option<i32> {
    let pid: i32 = std::env::var("TMK_LAUNCHER_PID").ok()?.parse().ok()?;
    std::env::var_os("TMK_RANK").filter(|r| !r.is_empty())?;
    let parent = nix::unistd::getppid().as_raw();
    (parent != pid && parent_of(parent) == Some(pid)).then_some(pid)
}

/// The parent of process `pid` (`/proc/<pid>/stat`'s fourth field, after the command's `)`).
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// In a node spawned by a launcher (node `me`): die with the launcher, even if it is killed,
/// saying so (`mem/orphan.rs`), or silently where that cannot be set up.
pub(crate) fn follow_launcher(me: NodeId) {
    let Some(pid) = std::env::var("TMK_LAUNCHER_PID").ok().and_then(|p| p.parse::<i32>().ok()) else {
        return;
    };
    let said = format!("treadmarks: {me}: the launcher (node 0, pid {pid}) died; exiting\n");
    let following = crate::mem::orphan::die_with_parent(pid, &said).is_ok()
        || nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).is_ok();
    if following && nix::unistd::getppid().as_raw() != pid {
        crate::report(&format!("treadmarks: the launcher (pid {pid}) is gone; exiting"));
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child running `cmd`, as node 1.
    fn child(cmd: &str, arg: &str) -> Children {
        let c = Command::new(cmd).arg(arg).spawn().expect("spawn");
        Children { procs: vec![(NodeId(1), c)] }
    }

    /// Whether process `pid` exists (a zombie counts: it is not reaped yet).
    fn exists(pid: u32) -> bool {
        std::path::Path::new(&format!("/proc/{pid}")).exists()
    }

    /// A launcher that fails to start after spawning its nodes drops the watch: the nodes are
    /// killed and reaped then, not left to call on a closed listener until the meeting times out
    /// (and the watch then to end the launcher).
    #[test]
    fn a_dropped_startup_watch_kills_and_reaps_the_nodes() {
        let children = child("sleep", "30");
        let pid = children.procs[0].1.id();
        drop(StartupWatch::new(children));
        assert!(!exists(pid), "node {pid} outlived the watch");
    }

    /// A node still running at the bound (its `main` went on after the job's exit) is killed,
    /// reaped and named as such, not as one that exited badly.
    #[test]
    fn a_node_still_running_at_the_bound_is_killed_and_named() {
        let children = child("sleep", "30");
        let pid = children.procs[0].1.id();
        let e = children.wait(Duration::from_millis(50)).unwrap_err();
        assert!(matches!(e, Error::NodeLingered { node: NodeId(1), .. }), "{e:#?}");
        assert!(e.to_string().contains("still running 50ms after the job's exit"), "{e}");
        assert!(!exists(pid), "node {pid} not reaped");
    }

    /// The last node exiting just as the bound passes: no node is left to name as late, and
    /// none is (this indexed an empty list and panicked).
    #[test]
    fn waiting_past_the_bound_for_nodes_that_all_exited_reports_none() {
        let children = child("true", "");
        let pid = children.procs[0].1.id();
        let zombie = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')))
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !zombie(pid) {
            assert!(Instant::now() < deadline, "`true` did not exit within 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(children.wait(Duration::ZERO).is_ok());
        assert!(!exists(pid));
    }

    /// A node reaped behind the launcher's back (an application ignoring `SIGCHLD` has its
    /// children reaped by the kernel) is gone, not failed: a clean job's exit reported it.
    #[test]
    fn a_node_reaped_elsewhere_is_not_a_failure() {
        let children = child("true", "");
        let pid = nix::unistd::Pid::from_raw(children.procs[0].1.id() as i32);
        nix::sys::wait::waitpid(pid, None).expect("reap it");
        assert!(children.wait(Duration::from_secs(10)).is_ok());
    }

    /// While the job starts, a node reaped behind the launcher's back has died: the startup
    /// watch names it (it had taken it for alive, and the launcher waited out the meeting).
    #[test]
    fn a_node_reaped_elsewhere_during_startup_is_seen_to_have_exited() {
        let mut children = child("sleep", "30");
        assert_eq!(children.first_exited(), None, "alive");
        let pid = nix::unistd::Pid::from_raw(children.procs[0].1.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("kill it");
        nix::sys::wait::waitpid(pid, None).expect("reap it");
        let (node, how) = children.first_exited().expect("seen to have exited");
        assert_eq!(node, NodeId(1));
        assert!(how.contains("reaped elsewhere"), "{how}");
    }
}
