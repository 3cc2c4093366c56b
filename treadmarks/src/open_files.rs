//! Room for a job's connections among the files a process may have open.
//!
//! Every node holds a connection to every other (the mesh), so a node of an `n`-node job has
//! `n - 1` sockets open besides the files open when it starts (the program's), the runtime's
//! own (the heap's memory file, the fault backend's descriptors, eventfds, epoll sets, the
//! listener: about ten) and, in a launcher, a socket for each CPU it claims for the job. A soft
//! `RLIMIT_NOFILE` below that made a large job fail while its nodes met, on an `accept` or a
//! `connect` that said only "Too many open files". Now each node, before it meets the others,
//! raises its soft limit where it is short of what the job needs, to twice that (room for the
//! program's later files) or the hard limit if lower, and a job the hard limit cannot hold is
//! refused by its node count. Processes the program starts inherit the raised limit.
//!
//! Invariants: the soft limit is only ever raised, never past the hard limit, and left alone
//! where it has room; the nodes a launcher spawns inherit the raised limit; a limit that cannot
//! be read limits nothing.
#![forbid(unsafe_code)]

use crate::config::ConfigError;
use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Files a node may hold open besides those open at its start, one connection per peer and a
/// launcher's CPU claims: the runtime's ten or so, with room to spare.
pub const RUNTIME_FILES: u64 = 24;

/// What to do about the soft limit.
#[derive(Debug, PartialEq, Eq)]
enum Room {
    /// The soft limit has room.
    Enough,
    /// Raise the soft limit to this.
    Raise(u64),
    /// Even the hard limit is too low: the job needs at least this many.
    TooFew(u64),
}

/// What a node needs, `needed` files open at once, makes of limits `soft` and `hard`.
fn room(needed: u64, soft: u64, hard: u64) -> Room {
    match () {
        _ if needed <= soft => Room::Enough,
        _ if needed <= hard => Room::Raise(needed.saturating_mul(2).min(hard)),
        _ => Room::TooFew(needed),
    }
}

/// Files a node of a job of `nprocs` nodes needs open at once: those open now, a connection per
/// peer, `claims` CPU-claim sockets (a launcher's), and the runtime's.
fn needed(nprocs: u16, open_now: u64, claims: u64) -> u64 {
    open_now + u64::from(nprocs.saturating_sub(1)) + claims + RUNTIME_FILES
}

/// Makes room for the connections of a job of `nprocs` nodes (see the module docs); `claims`:
/// the CPU-claim sockets this node may hold (a launcher's, one a node at most).
pub(crate) fn make_room(nprocs: u16, claims: u64) -> Result<(), ConfigError> {
    if nprocs < 2 {
        return Ok(());
    }
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return Ok(()) };
    let open_now = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    match room(needed(nprocs, open_now, claims), soft, hard) {
        Room::Enough => Ok(()),
        // Failing to raise it leaves things as they were: the job then fails as before.
        Room::Raise(to) => {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, to, hard);
            Ok(())
        }
        Room::TooFew(needed) => Err(ConfigError::Invalid {
            name: "TMK_NPROCS / -n",
            value: nprocs.to_string(),
            why: format!(
                "each node holds a connection to every other, and this one needs at least {needed} open \
                 files ({open_now} open already), more than this process may have (RLIMIT_NOFILE: soft \
                 {soft}, hard {hard}): run fewer nodes, or raise the hard limit (`ulimit -Hn`, as root, \
                 or the service's LimitNOFILE)"
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_only_when_short_and_the_hard_one_allows() {
        assert_eq!(needed(8, 5, 2), 5 + 7 + 2 + RUNTIME_FILES);
        assert_eq!(room(40, 40, 40), Room::Enough);
        assert_eq!(room(40, 39, 1000), Room::Raise(80));
        assert_eq!(room(40, 39, 50), Room::Raise(50), "never past the hard limit");
        assert_eq!(room(40, 16, 16), Room::TooFew(40));
        assert!(make_room(1, 0).is_ok(), "a lone node connects to nobody");
    }

    #[test]
    fn a_job_the_hard_limit_cannot_hold_is_named_by_its_node_count() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        if hard >= u64::from(u16::MAX) + RUNTIME_FILES {
            return; // This machine could hold any job.
        }
        let err = make_room(u16::MAX, 0).unwrap_err().to_string();
        assert!(
            err.contains("TMK_NPROCS / -n") && err.contains("65535") && err.contains("RLIMIT_NOFILE"),
            "{err}"
        );
    }
}
