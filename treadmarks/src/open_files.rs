//! Room for a job's connections among the files a process may have open.
//!
//! Every node holds a connection to every other (the mesh), so a node of an `n`-node job has
//! `n - 1` sockets open besides the runtime's own files (the heap's memory file, the fault
//! backend's descriptors, eventfds, epoll sets, the listener) and the program's. A soft
//! `RLIMIT_NOFILE` below that made a large job fail while its nodes met, on an `accept` or a
//! `connect` that said only "Too many open files". Now each node, before it meets the others,
//! raises its soft limit to its hard limit where the soft one is short of what the job needs
//! (as Go's runtime does at every start, and only then), and a job the hard limit cannot hold is
//! refused by its node count.
//!
//! Invariants: the soft limit is only ever raised, never past the hard limit, and left alone
//! where it has room; the nodes a launcher spawns inherit the raised limit; a limit that cannot
//! be read limits nothing.

use crate::config::ConfigError;
use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Files a node may hold open besides one connection per peer: the runtime's dozen or so and
/// room for the program's.
pub const BESIDES_PEERS: u64 = 32;

/// What to do about the soft limit for a job of `nprocs` nodes, given the limits.
#[derive(Debug, PartialEq, Eq)]
enum Room {
    /// The soft limit has room.
    Enough,
    /// Raise the soft limit to the hard one.
    Raise,
    /// Even the hard limit is too low: the job needs this many.
    TooFew(u64),
}

fn room(nprocs: u16, soft: u64, hard: u64) -> Room {
    let needed = u64::from(nprocs).saturating_sub(1) + BESIDES_PEERS;
    match () {
        _ if nprocs < 2 || needed <= soft => Room::Enough,
        _ if needed <= hard => Room::Raise,
        _ => Room::TooFew(needed),
    }
}

/// Makes room for the connections of a job of `nprocs` nodes (see the module docs).
pub(crate) fn make_room(nprocs: u16) -> Result<(), ConfigError> {
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else { return Ok(()) };
    match room(nprocs, soft, hard) {
        Room::Enough => Ok(()),
        // Failing to raise it leaves things as they were: the job then fails as before.
        Room::Raise => {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
            Ok(())
        }
        Room::TooFew(needed) => Err(ConfigError::Invalid {
            name: "TMK_NPROCS / -n",
            value: nprocs.to_string(),
            why: format!(
                "each node holds a connection to every other, and needs up to {needed} open files, more \
                 than this process may have (RLIMIT_NOFILE: soft {soft}, hard {hard}): run fewer nodes, \
                 or raise the hard limit (`ulimit -Hn`, as root, or the service's LimitNOFILE)"
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_only_when_short_and_the_hard_one_allows() {
        let need = |n: u16| u64::from(n) - 1 + BESIDES_PEERS;
        assert_eq!(room(1, 0, 0), Room::Enough, "a lone node connects to nobody");
        assert_eq!(room(8, need(8), need(8)), Room::Enough);
        assert_eq!(room(8, need(8) - 1, need(8)), Room::Raise);
        assert_eq!(room(8, 16, 16), Room::TooFew(need(8)));
        assert_eq!(room(u16::MAX, 1024, u64::MAX), Room::Raise, "RLIM_INFINITY hard limit");
    }

    #[test]
    fn a_job_the_hard_limit_cannot_hold_is_named_by_its_node_count() {
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        if hard >= u64::from(u16::MAX) + BESIDES_PEERS {
            return; // This machine could hold any job.
        }
        let err = make_room(u16::MAX).unwrap_err().to_string();
        assert!(
            err.contains("TMK_NPROCS / -n") && err.contains("65535") && err.contains("RLIMIT_NOFILE"),
            "{err}"
        );
    }
}
