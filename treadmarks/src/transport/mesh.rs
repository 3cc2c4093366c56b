//! The mesh meeting: how `nprocs` nodes find each other and end with one TCP stream per pair.
//!
//! It runs with blocking std sockets, before any tokio runtime exists.
//!
//! ```text
//!  rank 0 (root)                        rank i > 0
//!  listen on cfg.root / given listener  connect to root (retry "refused", "unreachable" and
//!                                       unanswered with backoff, until the deadline)
//!                                       bind own listener on the ip of that connection, port 0
//!  accept nprocs-1 ◄──────────────────  Hello { rank, nprocs, fingerprint, listen_addr }
//!  check: rank in 1..nprocs, not seen,
//!         same nprocs, same fingerprint
//!    bad: Reject { reason } ──────────► every connected peer; both sides return an error
//!  all in: Table { addrs } ───────────► every peer (addrs[j] = where rank j listens)
//!                                       connect to every 0 < j < i, send MeshHello { rank: i }
//!                                       accept from every j > i, check its MeshHello (watching
//!                                       the root's connection for a Reject, or its close)
//!  every peer Ready ◄──────────────────  Ready
//!  then: Go ──────────────────────────► every peer, which returns once it comes
//! ```
//!
//! The connection to the root is the link to node 0. Handshake messages travel in
//! [`codec`] frames.
//!
//! Invariants:
//! - the whole meeting is bounded by `cfg.timeout`: every connect, accept, read and write is given
//!   only the time that remains, and running out is a [`TransportError::Timeout`] that names what
//!   we were waiting for;
//! - on success `peers[j]` is `Some` exactly for `j != rank`, every stream has `TCP_NODELAY` set,
//!   is blocking and has no read or write timeout;
//! - when the root fails the meeting it tells every peer it has heard from, and not sent `Go`,
//!   why (a `Reject`), so no peer is left waiting for a table that will not come, nor for a rank
//!   that will not connect to it: the root watches every peer's connection until all are
//!   `Ready` (from its hello on), and a peer that closes it (it failed, died or was killed) or
//!   says anything else fails the meeting at once;
//! - the root reads a connection only once it has something to say: one that says nothing holds
//!   up no other, one that closes without a word (a port check) is let go, and one that says
//!   anything but a hello that fits the job fails the meeting;
//! - a peer reads nothing from the root but handshakes before `Go` (the root starts its node only
//!   once every peer has been sent `Go`), so it can watch for a `Reject` while it waits for the
//!   ranks above it.
//!
//! This module does not own the streams after the meeting: [`link`](super::link) takes them over.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::codec::{self, FrameLen, HEADER_LEN};
use super::error::{Result, TransportError};
use crate::protocol::NodeId;

const ROOT: NodeId = NodeId(0);

/// How long the root waits to deliver a `Reject` to a peer before it gives up on it.
const REJECT_WRITE_TIMEOUT: Duration = Duration::from_millis(200);

/// Most characters of a peer's configuration fingerprint that an error shows (ours is ~80).
const FINGERPRINT_SHOWN: usize = 200;

/// Sleep between polls of a nonblocking listener.
const ACCEPT_POLL: Duration = Duration::from_millis(1);

/// Longest an attempt to reach a root given by name waits for one of its addresses to answer.
const CONNECT_EACH: Duration = Duration::from_secs(2);

/// First and largest pause between attempts to reach a root that is not listening yet.
const CONNECT_BACKOFF: (Duration, Duration) = (Duration::from_millis(2), Duration::from_millis(100));

/// What every node is started with.
#[derive(Debug, Clone)]
pub struct MeshConfig {
    /// Number of nodes in the job.
    pub nprocs: u16,
    /// This node's rank, `0..nprocs`.
    pub rank: NodeId,
    /// Where rank 0 listens; the others connect here.
    pub root: SocketAddr,
    /// The host name `root` was resolved from, if it was given as one: every attempt to reach
    /// the root then tries each address the name resolves to (`root` first), so that a name with
    /// an IPv6 and an IPv4 address reaches a root listening on either.
    pub root_name: Option<String>,
    /// A summary of the configuration that must be identical on all nodes, e.g.
    /// `"heap=1073741824@0x600000000000 locks=1024 barriers=64 page=4096 proto=1"`.
    pub fingerprint: String,
    /// Bound on the whole meeting.
    pub timeout: Duration,
}

/// A full mesh: one blocking stream to every other node.
#[derive(Debug)]
pub struct Mesh {
    /// This node's rank.
    pub rank: NodeId,
    /// Number of nodes.
    pub nprocs: u16,
    /// `peers[j]` is the stream to rank `j`; `peers[rank]` is `None`.
    pub peers: Vec<Option<TcpStream>>,
}

/// The messages of the meeting, each in its own frame.
#[derive(Debug, Serialize, Deserialize)]
enum Handshake {
    /// Rank i > 0 to the root: who I am and where I listen.
    Hello { rank: NodeId, nprocs: u16, fingerprint: String, listen_addr: SocketAddr },
    /// The root to everyone: where every rank listens (`addrs[0]` is the root itself).
    Table { addrs: Vec<SocketAddr> },
    /// The root to a peer: the meeting failed, and why.
    Reject { reason: String },
    /// Rank i to rank j < i, on the connection it opened to j.
    MeshHello { rank: NodeId },
    /// Rank i to the root: I am connected to every other rank.
    Ready,
    /// The root to everyone, once every peer is `Ready`: the meeting succeeded, and what comes
    /// after on its connection is the job's.
    Go,
}

impl Handshake {
    fn kind(&self) -> &'static str {
        match self {
            Handshake::Hello { .. } => "Hello",
            Handshake::Table { .. } => "Table",
            Handshake::Reject { .. } => "Reject",
            Handshake::MeshHello { .. } => "MeshHello",
            Handshake::Ready => "Ready",
            Handshake::Go => "Go",
        }
    }
}

/// A listener on every interface at `port`, IPv6 and IPv4 alike (`[::]` with `IPV6_V6ONLY`
/// off, whatever `net.ipv6.bindv6only` says), or on every IPv4 one (`0.0.0.0`) on a host without
/// IPv6: where node 0 listens for a root named by a host that its own resolver maps to a
/// loopback address ([`crate::Config::root_listen_addr`]).
pub fn listen_everywhere(port: u16) -> io::Result<TcpListener> {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, SockaddrIn6, bind, listen, setsockopt, socket, sockopt,
    };
    use std::os::fd::AsRawFd;
    let dual = || -> nix::Result<TcpListener> {
        let fd = socket(AddressFamily::Inet6, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
        setsockopt(&fd, sockopt::Ipv6V6Only, &false)?;
        setsockopt(&fd, sockopt::ReuseAddr, &true)?;
        let any = std::net::SocketAddrV6::new(std::net::Ipv6Addr::UNSPECIFIED, port, 0, 0);
        bind(fd.as_raw_fd(), &SockaddrIn6::from(any))?;
        listen(&fd, Backlog::new(128)?)?;
        Ok(TcpListener::from(fd))
    };
    match dual() {
        Ok(listener) => Ok(listener),
        // No IPv6 here (a kernel without it, or with it off): IPv4 alone.
        Err(nix::errno::Errno::EAFNOSUPPORT | nix::errno::Errno::EADDRNOTAVAIL) => {
            TcpListener::bind(SocketAddr::from(([0, 0, 0, 0], port)))
        }
        Err(e) => Err(io::Error::from(e)),
    }
}

/// Runs the meeting and returns the mesh.
///
/// Rank 0 listens on `root_listener` if given (a launcher may pre-bind `127.0.0.1:0` and pass the
/// real address to the other nodes), else it binds `cfg.root`. Other ranks ignore
/// `root_listener`.
pub fn connect_mesh(cfg: &MeshConfig, root_listener: Option<TcpListener>) -> Result<Mesh> {
    if cfg.nprocs == 0 || cfg.rank.0 >= cfg.nprocs {
        return Err(TransportError::BadConfig { rank: cfg.rank, nprocs: cfg.nprocs });
    }
    let deadline = Deadline::after(cfg.timeout);
    let mut peers: Vec<Option<TcpStream>> = (0..cfg.nprocs).map(|_| None).collect();
    if cfg.nprocs > 1 {
        if cfg.rank == ROOT {
            meet_as_root(cfg, root_listener, &deadline, &mut peers)?;
        } else {
            meet_as_peer(cfg, &deadline, &mut peers)?;
        }
    }
    for stream in peers.iter().flatten() {
        let clear = stream
            .set_read_timeout(None)
            .and_then(|()| stream.set_write_timeout(None))
            .and_then(|()| stream.set_nonblocking(false));
        clear.map_err(|source| TransportError::Io {
            op: "clear the timeouts of the connection to",
            addr: peer_addr_or_unspecified(stream),
            source,
        })?;
        detect_dead_peers(stream).map_err(|source| TransportError::Io {
            op: "set keepalive on the connection to",
            addr: peer_addr_or_unspecified(stream),
            source,
        })?;
    }
    tracing::debug!(rank = %cfg.rank, nprocs = cfg.nprocs, "mesh complete");
    Ok(Mesh { rank: cfg.rank, nprocs: cfg.nprocs, peers })
}

/// Seconds a link may go silent before the kernel probes it, then between probes; probes
/// unanswered before it is declared dead.
const KEEPALIVE: (u32, u32, u32) = (10, 5, 3);

/// Makes a peer whose host dies, or a network that partitions, without a reset an error within
/// about half a minute, instead of a job that waits forever: TCP keepalive probes a silent link,
/// and data left unacknowledged for as long fails the connection (`TCP_USER_TIMEOUT`). Either
/// way the link's reader gets an error, which names the peer.
fn detect_dead_peers(stream: &TcpStream) -> std::io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    let (idle, interval, count) = KEEPALIVE;
    let set = || -> nix::Result<()> {
        setsockopt(stream, sockopt::KeepAlive, &true)?;
        setsockopt(stream, sockopt::TcpKeepIdle, &idle)?;
        setsockopt(stream, sockopt::TcpKeepInterval, &interval)?;
        setsockopt(stream, sockopt::TcpKeepCount, &count)?;
        setsockopt(stream, sockopt::TcpUserTimeout, &((idle + interval * count) * 1000))
    };
    set().map_err(std::io::Error::from)
}

/// A peer that sent its Hello to the root.
struct Joined {
    stream: TcpStream,
    from: SocketAddr,
    listen_addr: SocketAddr,
}

fn meet_as_root(
    cfg: &MeshConfig,
    root_listener: Option<TcpListener>,
    deadline: &Deadline,
    peers: &mut [Option<TcpStream>],
) -> Result<()> {
    let listener = match root_listener {
        Some(listener) => listener,
        None => TcpListener::bind(cfg.root).map_err(|source| TransportError::Io {
            op: "bind the root listener at",
            addr: cfg.root,
            source,
        })?,
    };
    let root_addr = listener.local_addr().map_err(|source| TransportError::Io {
        op: "read the address of the root listener bound for",
        addr: cfg.root,
        source,
    })?;
    let mut joined: Vec<Option<Joined>> = (0..cfg.nprocs).map(|_| None).collect();
    match gather_hellos(cfg, &listener, root_addr, deadline, &mut joined) {
        Ok(()) => {}
        Err((err, current)) => {
            let reason = err.to_string();
            let streams =
                joined.iter_mut().filter_map(|j| j.take().map(|j| (j.stream, j.from))).chain(current);
            for (stream, from) in streams {
                reject(stream, from, &reason);
            }
            return Err(err);
        }
    }
    let mut addrs = Vec::with_capacity(joined.len());
    addrs.push(root_addr);
    addrs.extend(
        joined.iter().skip(1).map(|j| j.as_ref().expect("gather_hellos fills every rank but 0").listen_addr),
    );
    let mut joined: Vec<Joined> =
        joined.into_iter().skip(1).map(|j| j.expect("gather_hellos fills every rank but 0")).collect();
    let table = Handshake::Table { addrs };
    let failed = (joined.iter_mut().enumerate())
        .find_map(|(i, j)| {
            send(&mut j.stream, j.from, &table, deadline, "send the table to").err().map(|e| (i, e))
        })
        .or_else(|| gather_ready(&mut joined, deadline).err());
    if let Some((i, err)) = failed {
        // Every rank is told why: those still to be sent the table that it will not come, those
        // that have it that the rank will not connect to them, and the rank itself (alive, maybe,
        // only the first still missing at a timeout: a closed connection alone would read as
        // the root's death). Best effort, each bounded by `REJECT_WRITE_TIMEOUT`.
        let reason = format!("node {}: {err}", i + 1);
        for j in joined {
            reject(j.stream, j.from, &reason);
        }
        return Err(err);
    }
    let mut joined = joined.into_iter().enumerate();
    while let Some((i, mut j)) = joined.next() {
        if let Err(err) = send(&mut j.stream, j.from, &Handshake::Go, deadline, "send go to") {
            // Those sent Go already run their nodes, and will find this one's connection
            // closed; those still waiting for it are told why.
            let reason = format!("node {}: {err}", i + 1);
            for (_, j) in joined {
                reject(j.stream, j.from, &reason);
            }
            return Err(err);
        }
        peers[i + 1] = Some(j.stream);
    }
    Ok(())
}

/// Waits until every peer of `joined` (rank `i + 1` at `i`) said it is `Ready`, watching all
/// their connections at once. On error, also returns the index of the peer that caused it (the
/// first still missing on a timeout).
fn gather_ready(
    joined: &mut [Joined],
    deadline: &Deadline,
) -> std::result::Result<(), (usize, TransportError)> {
    let mut ready = vec![false; joined.len()];
    loop {
        for (i, j) in joined.iter_mut().enumerate() {
            if ready[i] {
                continue;
            }
            match poll_handshake(&mut j.stream, j.from, deadline, "receive ready from") {
                Ok(None) => {}
                Ok(Some(Handshake::Ready)) => ready[i] = true,
                Ok(Some(other)) => {
                    let err = TransportError::UnexpectedMessage {
                        got: other.kind(),
                        expected: "Ready",
                        addr: j.from,
                    };
                    return Err((i, err));
                }
                Err(err) => return Err((i, err)),
            }
        }
        let Some(first) = ready.iter().position(|r| !r) else { return Ok(()) };
        let waiting_for = || {
            let missing: Vec<NodeId> = (ready.iter().enumerate())
                .filter(|&(_, r)| !r)
                .map(|(i, _)| NodeId(u16::try_from(i + 1).expect("ranks fit in u16")))
                .collect();
            format!("{} to say it is connected to every other node", rank_list(&missing))
        };
        let remaining = deadline.remaining(waiting_for).map_err(|e| (first, e))?;
        thread::sleep(ACCEPT_POLL.min(remaining));
    }
}

/// What a connection holds for us to read, found without waiting.
enum Peeked {
    Nothing,
    Bytes,
    Closed,
}

/// Looks at `stream` without waiting or taking anything.
fn peek(stream: &TcpStream) -> io::Result<Peeked> {
    stream.set_nonblocking(true)?;
    let peeked = stream.peek(&mut [0]);
    stream.set_nonblocking(false)?;
    match peeked {
        Ok(0) => Ok(Peeked::Closed),
        Ok(_) => Ok(Peeked::Bytes),
        Err(err) if matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {
            Ok(Peeked::Nothing)
        }
        Err(err) => Err(err),
    }
}

/// The next handshake on `stream` if one has begun to arrive, without waiting for one to begin;
/// a connection closed meanwhile is an error.
fn poll_handshake(
    stream: &mut TcpStream,
    addr: SocketAddr,
    deadline: &Deadline,
    op: &'static str,
) -> Result<Option<Handshake>> {
    match peek(stream).map_err(|source| TransportError::Io { op, addr, source })? {
        Peeked::Nothing => Ok(None),
        Peeked::Bytes => {
            recv(stream, addr, deadline, op, || format!("the rest of a message from {addr}")).map(Some)
        }
        Peeked::Closed => Err(TransportError::Io {
            op,
            addr,
            source: io::Error::new(io::ErrorKind::UnexpectedEof, "the peer closed the connection"),
        }),
    }
}

/// Accepts and checks a Hello from every rank but 0. On error, also returns the connection that
/// caused it (if any), so that it too can be told.
///
/// A connection is read only once it has something to say, so one that says nothing (anything
/// may connect to a port a job listens on) holds up no other, and one that closes without a word
/// (a port check: `nc -z host 7000`) is let go, as a `tracing` event. A connection that does speak
/// must say a Hello that fits the job, or the meeting fails. A rank that joined and then closes
/// its connection (it failed, died or was killed) fails the meeting at once, naming it, rather
/// than when the last rank comes.
fn gather_hellos(
    cfg: &MeshConfig,
    listener: &TcpListener,
    root_addr: SocketAddr,
    deadline: &Deadline,
    joined: &mut [Option<Joined>],
) -> Result<(), (TransportError, Option<(TcpStream, SocketAddr)>)> {
    let nprocs = cfg.nprocs;
    listener.set_nonblocking(true).map_err(|source| {
        (TransportError::Io { op: "accept a connection on", addr: root_addr, source }, None)
    })?;
    // Accepted, and silent so far.
    let mut quiet: Vec<(TcpStream, SocketAddr)> = Vec::new();
    loop {
        while let Some(accepted) = accept_ready(listener, root_addr).map_err(|e| (e, None))? {
            quiet.push(accepted);
        }
        let mut i = 0;
        while i < quiet.len() {
            match peek(&quiet[i].0) {
                Ok(Peeked::Nothing) => i += 1,
                Ok(Peeked::Closed) | Err(_) => {
                    let (_, from) = quiet.swap_remove(i);
                    tracing::warn!(%from, "a connection to the root closed without a word; ignored");
                }
                Ok(Peeked::Bytes) => {
                    let (mut stream, from) = quiet.swap_remove(i);
                    let hello = recv(&mut stream, from, deadline, "receive a hello from", || {
                        format!("a hello from the connection from {from}")
                    });
                    match hello.and_then(|hello| check_hello(cfg, hello, from, joined)) {
                        Ok((rank, listen_addr)) => {
                            tracing::debug!(%rank, %from, %listen_addr, "joined the mesh");
                            joined[rank.idx()] = Some(Joined { stream, from, listen_addr });
                        }
                        Err(err) => return Err((err, Some((stream, from)))),
                    }
                }
            }
        }
        let count = joined.iter().skip(1).filter(|j| j.is_some()).count();
        if count == usize::from(nprocs - 1) {
            return Ok(());
        }
        watch_joined(joined, deadline).map_err(|e| (e, None))?;
        let waiting_for = || {
            let missing = missing_ranks(joined.iter().map(Option::is_some), ROOT);
            format!(
                "hello from {} at the root {root_addr} ({count} of {} peers joined)",
                rank_list(&missing),
                nprocs - 1
            )
        };
        let remaining = deadline.remaining(waiting_for).map_err(|e| (e, None))?;
        thread::sleep(ACCEPT_POLL.min(remaining));
    }
}

/// Fails if a rank that joined has closed its connection, or said anything: it has nothing to say
/// until it has the table.
fn watch_joined(joined: &mut [Option<Joined>], deadline: &Deadline) -> Result<()> {
    for (rank, j) in joined.iter_mut().enumerate() {
        let Some(j) = j else { continue };
        let node = NodeId(u16::try_from(rank).expect("ranks fit in u16"));
        let lost = |source| TransportError::JoinedNodeLost { node, source: Box::new(source) };
        match poll_handshake(&mut j.stream, j.from, deadline, "watch the connection from").map_err(lost)? {
            None => {}
            Some(other) => {
                let addr = j.from;
                return Err(lost(TransportError::UnexpectedMessage {
                    got: other.kind(),
                    expected: "nothing",
                    addr,
                }));
            }
        }
    }
    Ok(())
}

fn check_hello(
    cfg: &MeshConfig,
    hello: Handshake,
    from: SocketAddr,
    joined: &[Option<Joined>],
) -> Result<(NodeId, SocketAddr)> {
    let Handshake::Hello { rank, nprocs, fingerprint, listen_addr } = hello else {
        return Err(TransportError::UnexpectedMessage { got: hello.kind(), expected: "Hello", addr: from });
    };
    if nprocs != cfg.nprocs {
        return Err(TransportError::NprocsMismatch { node: rank, ours: cfg.nprocs, theirs: nprocs });
    }
    if fingerprint != cfg.fingerprint {
        // Told to every node and printed: a peer's up to 64 MiB is cut to what a reader needs.
        let theirs = match fingerprint.char_indices().nth(FINGERPRINT_SHOWN) {
            Some((cut, _)) => format!("{}...", &fingerprint[..cut]),
            None => fingerprint,
        };
        return Err(TransportError::ConfigMismatch { node: rank, ours: cfg.fingerprint.clone(), theirs });
    }
    if rank == ROOT || rank.0 >= cfg.nprocs {
        return Err(TransportError::RankOutOfRange {
            rank: rank.0,
            expected: format!("1..{}", cfg.nprocs),
            addr: from,
        });
    }
    if let Some(first) = &joined[rank.idx()] {
        return Err(TransportError::DuplicateRank { rank, first: first.from, second: from });
    }
    Ok((rank, listen_addr))
}

/// Best effort: tells a peer why the meeting failed, then closes our side.
fn reject(mut stream: TcpStream, addr: SocketAddr, reason: &str) {
    let msg = Handshake::Reject { reason: reason.to_owned() };
    let Ok(frame) = codec::frame(&msg) else {
        return;
    };
    let sent = stream.set_write_timeout(Some(REJECT_WRITE_TIMEOUT)).and_then(|()| stream.write_all(&frame));
    if let Err(err) = sent {
        tracing::debug!(%addr, %err, "could not deliver a reject");
    }
    let _ = stream.shutdown(Shutdown::Write);
}

fn meet_as_peer(cfg: &MeshConfig, deadline: &Deadline, peers: &mut [Option<TcpStream>]) -> Result<()> {
    let rank = cfg.rank;
    let mut lookup = cfg.root_name.as_deref().map(|name| Lookup::new(name, cfg.root.port()));
    let mut by_name = lookup.as_mut().map(|l| move || l.addrs(LOOKUP_WAIT));
    let by_name = by_name.as_mut().map(|r| r as &mut dyn FnMut() -> Vec<SocketAddr>);
    let mut root = connect_root(cfg.root, by_name, deadline, TcpStream::connect_timeout)?;
    // Where the root answered: the root's address, or another its name has.
    let at = root.peer_addr().unwrap_or(cfg.root);
    let mut bind_at = root.local_addr().map_err(|source| TransportError::Io {
        op: "read our address on the connection to the root at",
        addr: at,
        source,
    })?;
    // Our address on that link, at a port of the kernel's choosing (an IPv6 link-local one keeps
    // its interface: bound without one, it is refused).
    bind_at.set_port(0);
    let listener = TcpListener::bind(bind_at).map_err(|source| TransportError::Io {
        op: "bind our mesh listener at",
        addr: bind_at,
        source,
    })?;
    let listen_addr = listener.local_addr().map_err(|source| TransportError::Io {
        op: "read the address of our mesh listener bound at",
        addr: bind_at,
        source,
    })?;
    let hello =
        Handshake::Hello { rank, nprocs: cfg.nprocs, fingerprint: cfg.fingerprint.clone(), listen_addr };
    send(&mut root, at, &hello, deadline, "send our hello to the root at")?;
    let reply = recv(&mut root, at, deadline, "receive the table from the root at", || {
        format!("the table from the root at {}", at)
    })?;
    let addrs = match reply {
        Handshake::Table { addrs } => addrs,
        Handshake::Reject { reason } => return Err(TransportError::Rejected { by: ROOT, reason }),
        other => {
            return Err(TransportError::UnexpectedMessage { got: other.kind(), expected: "Table", addr: at });
        }
    };
    if addrs.len() != usize::from(cfg.nprocs) {
        return Err(TransportError::BadTable { len: addrs.len(), nprocs: cfg.nprocs });
    }

    // Lower ranks already listen (everyone binds before sending its hello): connect to them.
    for (j, &addr) in addrs.iter().enumerate().take(rank.idx()).skip(1) {
        let addr = on_our_link(addr, bind_at);
        let mut stream = connect_once(addr, deadline, || format!("a connection to node {j} at {addr}"))?;
        send(&mut stream, addr, &Handshake::MeshHello { rank }, deadline, "send our mesh hello to")?;
        peers[j] = Some(stream);
    }

    // Higher ranks connect to us; where each connection came from, for a rank announced twice.
    let higher = cfg.nprocs - rank.0 - 1;
    let mut came_from: Vec<Option<SocketAddr>> = vec![None; usize::from(cfg.nprocs)];
    for count in 0..higher {
        let waiting_for = || {
            let missing: Vec<NodeId> =
                (rank.0 + 1..cfg.nprocs).map(NodeId).filter(|j| peers[j.idx()].is_none()).collect();
            format!(
                "{} to connect to us at {listen_addr} ({count} of {higher} connected)",
                rank_list(&missing)
            )
        };
        // The root rejects the meeting if a rank fails meanwhile: one that will not come.
        let watch = || match poll_handshake(&mut root, at, deadline, "receive from the root at")? {
            None => Ok(()),
            Some(Handshake::Reject { reason }) => Err(TransportError::Rejected { by: ROOT, reason }),
            Some(other) => {
                Err(TransportError::UnexpectedMessage { got: other.kind(), expected: "Reject", addr: at })
            }
        };
        let (mut stream, from) = accept(&listener, listen_addr, deadline, waiting_for, watch)?;
        let msg = recv(&mut stream, from, deadline, "receive a mesh hello from", || {
            format!("a mesh hello from the connection from {from}")
        })?;
        let Handshake::MeshHello { rank: theirs } = msg else {
            return Err(TransportError::UnexpectedMessage {
                got: msg.kind(),
                expected: "MeshHello",
                addr: from,
            });
        };
        if theirs.0 <= rank.0 || theirs.0 >= cfg.nprocs {
            return Err(TransportError::RankOutOfRange {
                rank: theirs.0,
                expected: format!("{}..{}", rank.0 + 1, cfg.nprocs),
                addr: from,
            });
        }
        if let Some(first) = came_from[theirs.idx()] {
            return Err(TransportError::DuplicateRank { rank: theirs, first, second: from });
        }
        came_from[theirs.idx()] = Some(from);
        peers[theirs.idx()] = Some(stream);
    }
    send(&mut root, at, &Handshake::Ready, deadline, "send ready to the root at")?;
    let reply = recv(&mut root, at, deadline, "receive go from the root at", || {
        format!("go from the root at {} (every other node to be connected)", at)
    })?;
    root_said_go(reply, at)?;
    peers[ROOT.idx()] = Some(root);
    Ok(())
}

/// The root's last handshake: `Go`, or a `Reject` saying why the meeting failed.
/// Longest an attempt to reach the root waits for its name to be looked up.
const LOOKUP_WAIT: Duration = Duration::from_millis(500);

/// A host name looked up on a thread of its own, so that a resolver that does not answer (a name
/// server gone) holds up the meeting no longer than its deadline: one lookup at a time, started
/// at most once a second (a resolver that asks a server would otherwise be asked at every
/// attempt, up to ten a second, while node 0 is not up), its answer kept meanwhile.
struct Lookup {
    name: String,
    port: u16,
    /// The lookup on its way, if one is.
    pending: Option<std::sync::mpsc::Receiver<Vec<SocketAddr>>>,
    /// When the latest lookup started.
    started: Option<Instant>,
    /// The latest answer.
    known: Vec<SocketAddr>,
}

impl Lookup {
    fn new(name: &str, port: u16) -> Lookup {
        Lookup { name: name.to_string(), port, pending: None, started: None, known: Vec::new() }
    }

    /// The name's addresses: a new answer if one comes within `wait` (a lookup is started if none
    /// is on its way and the last started a second ago or more), else the latest.
    fn addrs(&mut self, wait: Duration) -> Vec<SocketAddr> {
        if self.pending.is_none() && self.started.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
            let (tx, rx) = std::sync::mpsc::channel();
            let (name, port) = (self.name.clone(), self.port);
            thread::spawn(move || {
                use std::net::ToSocketAddrs;
                let addrs =
                    (name.as_str(), port).to_socket_addrs().map(Iterator::collect).unwrap_or_default();
                let _ = tx.send(addrs);
            });
            (self.pending, self.started) = (Some(rx), Some(Instant::now()));
        }
        let Some(pending) = &self.pending else { return self.known.clone() };
        match pending.recv_timeout(wait) {
            Ok(addrs) => {
                (self.known, self.pending) = (addrs, None);
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => self.pending = None,
        }
        self.known.clone()
    }
}

/// `addr` from the root's table, reachable from `ours` (our address on the link to the root): an
/// IPv6 link-local address travels without its interface (the table's encoding drops it, and a
/// peer's interface index means nothing here), so it takes ours, the same link's.
fn on_our_link(addr: SocketAddr, ours: SocketAddr) -> SocketAddr {
    match (addr, ours) {
        (SocketAddr::V6(mut theirs), SocketAddr::V6(ours))
            if theirs.ip().is_unicast_link_local() && theirs.scope_id() == 0 =>
        {
            theirs.set_scope_id(ours.scope_id());
            SocketAddr::V6(theirs)
        }
        _ => addr,
    }
}

fn root_said_go(reply: Handshake, addr: SocketAddr) -> Result<()> {
    match reply {
        Handshake::Go => Ok(()),
        Handshake::Reject { reason } => Err(TransportError::Rejected { by: ROOT, reason }),
        other => Err(TransportError::UnexpectedMessage { got: other.kind(), expected: "Go", addr }),
    }
}

/// Connects to the root at `root`, or at another address its name resolves to (`resolve`, asked
/// at every attempt once `root` failed: a name, unlike an address, may come to resolve), with
/// `connect`, retrying until the deadline while it is not listening yet, or not reachable yet (its
/// host starting: the kernel may give up on a connection that gets no answer, ~2 min, long before
/// a generous deadline). `resolve` must not wait long ([`Lookup`]).
fn connect_root(
    root: SocketAddr,
    mut resolve: Option<&mut dyn FnMut() -> Vec<SocketAddr>>,
    deadline: &Deadline,
    mut connect: impl FnMut(&SocketAddr, Duration) -> io::Result<TcpStream>,
) -> Result<TcpStream> {
    // A timeout names why the last attempt failed (refused, unreachable, no answer).
    let mut last: Option<(SocketAddr, io::Error)> = None;
    let waiting_for = |last: &Option<(SocketAddr, io::Error)>| match last {
        Some((at, e)) if *at == root => {
            format!("the root (node 0) to accept us at {root} (the last attempt: {e})")
        }
        Some((at, e)) => format!("the root (node 0) to accept us at {root} (the last attempt, at {at}: {e})"),
        None => format!("the root (node 0) to accept us at {root}"),
    };
    let mut pause = CONNECT_BACKOFF.0;
    loop {
        let mut addrs = vec![root];
        let (mut retry, mut fatal) = (false, None);
        let mut i = 0;
        while let Some(&addr) = addrs.get(i) {
            let remaining = deadline.remaining(|| waiting_for(&last))?;
            // One address that does not answer may not take the time of the others.
            let wait = if resolve.is_some() { remaining.min(CONNECT_EACH) } else { remaining };
            match connect(&addr, wait) {
                Ok(stream) => {
                    set_nodelay(&stream, addr)?;
                    return Ok(stream);
                }
                Err(err)
                    if is_timeout(&err)
                        || matches!(
                            err.kind(),
                            io::ErrorKind::ConnectionRefused
                                | io::ErrorKind::ConnectionReset
                                | io::ErrorKind::ConnectionAborted
                                | io::ErrorKind::Interrupted
                                | io::ErrorKind::HostUnreachable
                                | io::ErrorKind::NetworkUnreachable
                        ) =>
                {
                    (last, retry) = (Some((addr, err)), true);
                }
                // Another address may do (an IPv6 one on a host without IPv6, say); an attempt
                // in which none may be tried again fails the meeting.
                Err(source) => {
                    fatal.get_or_insert(TransportError::Io { op: "connect to the root at", addr, source });
                }
            }
            if i == 0
                && let Some(resolve) = resolve.as_mut()
            {
                addrs.extend(resolve().into_iter().filter(|a| *a != root));
            }
            i += 1;
        }
        if let Some(err) = fatal.filter(|_| !retry) {
            return Err(err);
        }
        let remaining = deadline.remaining(|| waiting_for(&last))?;
        thread::sleep(pause.min(remaining));
        pause = (pause * 2).min(CONNECT_BACKOFF.1);
    }
}

/// Connects to a peer that is known to listen already.
fn connect_once(
    addr: SocketAddr,
    deadline: &Deadline,
    waiting_for: impl Fn() -> String,
) -> Result<TcpStream> {
    let remaining = deadline.remaining(&waiting_for)?;
    match TcpStream::connect_timeout(&addr, remaining) {
        Ok(stream) => {
            set_nodelay(&stream, addr)?;
            Ok(stream)
        }
        Err(err) if is_timeout(&err) => Err(deadline.expired(waiting_for())),
        Err(source) => Err(TransportError::Io { op: "connect to", addr, source }),
    }
}

/// Accepts one connection before the deadline (polling a nonblocking listener), calling `watch`
/// between polls: its error ends the wait.
fn accept(
    listener: &TcpListener,
    local: SocketAddr,
    deadline: &Deadline,
    waiting_for: impl Fn() -> String,
    mut watch: impl FnMut() -> Result<()>,
) -> Result<(TcpStream, SocketAddr)> {
    listener.set_nonblocking(true).map_err(|source| TransportError::Io {
        op: "accept a connection on",
        addr: local,
        source,
    })?;
    loop {
        if let Some(accepted) = accept_ready(listener, local)? {
            return Ok(accepted);
        }
        watch()?;
        let remaining = deadline.remaining(&waiting_for)?;
        thread::sleep(ACCEPT_POLL.min(remaining));
    }
}

/// A connection waiting on the nonblocking `listener` (bound at `local`), made blocking and with
/// `TCP_NODELAY`, or `None` if none waits.
fn accept_ready(listener: &TcpListener, local: SocketAddr) -> Result<Option<(TcpStream, SocketAddr)>> {
    match listener.accept() {
        Ok((stream, from)) => {
            stream.set_nonblocking(false).map_err(|source| TransportError::Io {
                op: "make blocking the connection from",
                addr: from,
                source,
            })?;
            set_nodelay(&stream, from)?;
            Ok(Some((stream, from)))
        }
        Err(err)
            if matches!(
                err.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
            ) =>
        {
            Ok(None)
        }
        Err(source) => Err(TransportError::Io { op: "accept a connection on", addr: local, source }),
    }
}

/// Sends one handshake message, bounded by the deadline.
fn send(
    stream: &mut TcpStream,
    addr: SocketAddr,
    msg: &Handshake,
    deadline: &Deadline,
    op: &'static str,
) -> Result<()> {
    let frame = codec::frame(msg)?;
    let waiting_for = || format!("{addr} to take our {}", msg.kind());
    let remaining = deadline.remaining(waiting_for)?;
    let io_err = |source| TransportError::Io { op, addr, source };
    stream.set_write_timeout(Some(remaining)).map_err(io_err)?;
    match stream.write_all(&frame) {
        Ok(()) => Ok(()),
        Err(err) if is_timeout(&err) => Err(deadline.expired(waiting_for())),
        Err(source) => Err(io_err(source)),
    }
}

/// Receives one handshake message, bounded by the deadline.
fn recv(
    stream: &mut TcpStream,
    addr: SocketAddr,
    deadline: &Deadline,
    op: &'static str,
    waiting_for: impl Fn() -> String,
) -> Result<Handshake> {
    let mut header = [0; HEADER_LEN];
    read_full(stream, addr, &mut header, deadline, op, &waiting_for)?;
    let bad = |source| TransportError::BadHandshake { op, addr, source: Box::new(source) };
    let len = match codec::decode_header(header, None).map_err(bad)? {
        FrameLen::Goodbye => {
            return Err(TransportError::UnexpectedMessage {
                got: "goodbye frame",
                expected: "a handshake message",
                addr,
            });
        }
        FrameLen::Payload(len) => len,
    };
    // Grow the buffer as bytes arrive: a header alone must not make us allocate 64 MiB.
    let mut payload = Vec::new();
    while payload.len() < len {
        let at = payload.len();
        let chunk = (len - at).min(64 << 10);
        payload.resize(at + chunk, 0);
        read_full(stream, addr, &mut payload[at..], deadline, op, &waiting_for)?;
    }
    codec::decode_payload(&payload).map_err(bad)
}

fn read_full(
    stream: &mut TcpStream,
    addr: SocketAddr,
    mut buf: &mut [u8],
    deadline: &Deadline,
    op: &'static str,
    waiting_for: &impl Fn() -> String,
) -> Result<()> {
    let io_err = |source| TransportError::Io { op, addr, source };
    while !buf.is_empty() {
        let remaining = deadline.remaining(waiting_for)?;
        stream.set_read_timeout(Some(remaining)).map_err(io_err)?;
        match stream.read(buf) {
            Ok(0) => {
                return Err(io_err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the peer closed the connection",
                )));
            }
            Ok(n) => buf = &mut buf[n..],
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) if is_timeout(&err) => return Err(deadline.expired(waiting_for())),
            Err(source) => return Err(io_err(source)),
        }
    }
    Ok(())
}

fn set_nodelay(stream: &TcpStream, addr: SocketAddr) -> Result<()> {
    stream.set_nodelay(true).map_err(|source| TransportError::Io {
        op: "set TCP_NODELAY on the connection to",
        addr,
        source,
    })
}

fn peer_addr_or_unspecified(stream: &TcpStream) -> SocketAddr {
    stream.peer_addr().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
}

/// A read or write timeout, or a connect that took too long.
fn is_timeout(err: &io::Error) -> bool {
    matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// Ranks `0..` whose slot is empty, except `skip`.
fn missing_ranks(present: impl Iterator<Item = bool>, skip: NodeId) -> Vec<NodeId> {
    present
        .enumerate()
        .filter(|&(j, here)| !here && j != skip.idx())
        .map(|(j, _)| NodeId(u16::try_from(j).expect("ranks fit in u16")))
        .collect()
}

/// "node 3" or "nodes 2, 3".
fn rank_list(ranks: &[NodeId]) -> String {
    match ranks {
        [] => "no node".to_owned(),
        [one] => one.to_string(),
        many => {
            let list: Vec<String> = many.iter().map(|r| r.0.to_string()).collect();
            format!("nodes {}", list.join(", "))
        }
    }
}

/// The end of the meeting.
struct Deadline {
    end: Instant,
    timeout: Duration,
}

impl Deadline {
    fn after(timeout: Duration) -> Self {
        Self { end: Instant::now() + timeout, timeout }
    }

    /// Time left, or a `Timeout` naming what we were waiting for.
    fn remaining(&self, waiting_for: impl Fn() -> String) -> Result<Duration> {
        let left = self.end.saturating_duration_since(Instant::now());
        if left.is_zero() { Err(self.expired(waiting_for())) } else { Ok(left) }
    }

    fn expired(&self, waiting_for: String) -> TransportError {
        TransportError::Timeout { waiting_for, timeout: self.timeout }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::codec::{FrameReader, decode_payload, encode_frame};
    use serde_bytes::ByteBuf;

    const FP: &str = "heap=1073741824@0x600000000000 locks=1024 barriers=64 page=4096 proto=1";

    fn config(nprocs: u16, rank: u16, root: SocketAddr, timeout: Duration) -> MeshConfig {
        MeshConfig { nprocs, rank: NodeId(rank), root, root_name: None, fingerprint: FP.to_owned(), timeout }
    }

    fn bind_root() -> (TcpListener, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        (listener, addr)
    }

    /// Runs one meeting with a node per thread; `cfgs[0]` gets the pre-bound listener.
    fn meet(listener: TcpListener, cfgs: Vec<MeshConfig>) -> Vec<Result<Mesh>> {
        let mut listener = Some(listener);
        thread::scope(|s| {
            let handles: Vec<_> = cfgs
                .into_iter()
                .map(|cfg| {
                    let l = if cfg.rank == ROOT { listener.take() } else { None };
                    s.spawn(move || connect_mesh(&cfg, l))
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Probe {
        from: NodeId,
        to: NodeId,
        body: ByteBuf,
    }

    fn body(from: u16, to: u16) -> ByteBuf {
        ByteBuf::from(
            (0..1000u32).map(|k| (k * 31 + u32::from(from) * 7 + u32::from(to)) as u8).collect::<Vec<_>>(),
        )
    }

    /// A connection the kernel gave up on (no answer) or could not route is tried again while
    /// the meeting's deadline allows: it was reported as the meeting's own timeout, its time
    /// wrong, however much of it was left.
    #[test]
    fn the_root_is_called_again_after_a_connection_the_kernel_gave_up_on() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let root = listener.local_addr().unwrap();
        let mut failures =
            vec![io::ErrorKind::TimedOut, io::ErrorKind::HostUnreachable, io::ErrorKind::TimedOut];
        let deadline = Deadline::after(Duration::from_secs(30));
        let stream = connect_root(root, None, &deadline, |addr, left| match failures.pop() {
            Some(kind) => Err(io::Error::from(kind)),
            None => TcpStream::connect_timeout(addr, left),
        })
        .unwrap();
        assert!(failures.is_empty());
        assert_eq!(stream.peer_addr().unwrap(), root);
        // With the deadline past, the timeout is the meeting's, named.
        let deadline = Deadline::after(Duration::from_millis(20));
        let err =
            connect_root(root, None, &deadline, |_, _| Err(io::Error::from(io::ErrorKind::HostUnreachable)))
                .unwrap_err();
        assert!(matches!(err, TransportError::Timeout { .. }), "{err}");
        assert!(err.to_string().contains("the last attempt: host unreachable"), "{err}");
    }

    /// A name is looked up on a thread of its own, and its answer kept for the calls that come
    /// before the next lookup's.
    #[test]
    fn a_lookup_answers_within_its_wait_or_with_what_it_knew() {
        // Asked until its lookup has answered (bounded: a resolver gives up by itself).
        let answer = |lookup: &mut Lookup| {
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut addrs = lookup.addrs(Duration::from_millis(100));
            while lookup.pending.is_some() && Instant::now() < deadline {
                addrs = lookup.addrs(Duration::from_millis(100));
            }
            assert!(lookup.pending.is_none(), "no answer in 60 s");
            addrs
        };
        let mut local = Lookup::new("localhost", 7000);
        let addrs = answer(&mut local);
        assert!(addrs.iter().any(|a| a.ip().is_loopback() && a.port() == 7000), "{addrs:?}");
        // The next call starts another lookup and, if it has not answered yet, gives the last.
        assert!(!local.addrs(Duration::ZERO).is_empty(), "the answer is kept");
    }

    /// A link-local peer from the table takes our interface; other addresses are left as they are.
    #[test]
    fn a_link_local_peer_is_reached_on_our_link() {
        let ours: SocketAddr = "[fe80::1%3]:0".parse().unwrap();
        let theirs: SocketAddr = "[fe80::2]:7000".parse().unwrap();
        assert_eq!(on_our_link(theirs, ours), "[fe80::2%3]:7000".parse::<SocketAddr>().unwrap());
        for other in ["[2001:db8::2]:7000", "10.0.0.2:7000", "[fe80::2%5]:7000"] {
            let other: SocketAddr = other.parse().unwrap();
            assert_eq!(on_our_link(other, ours), other);
        }
        assert_eq!(on_our_link(theirs, "10.0.0.1:0".parse().unwrap()), theirs);
    }

    /// Listening everywhere takes IPv4 and, where the host has it, IPv6 connections on one port.
    #[test]
    fn a_listener_everywhere_takes_ipv4_and_ipv6() {
        let listener = listen_everywhere(0).unwrap();
        let port = listener.local_addr().unwrap().port();
        let v4 = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_, from) = listener.accept().unwrap();
        assert_eq!(from.port(), v4.local_addr().unwrap().port());
        if listener.local_addr().unwrap().is_ipv6()
            && let Ok(v6) = TcpStream::connect(("::1", port))
        {
            let (_, from) = listener.accept().unwrap();
            assert_eq!(from, v6.local_addr().unwrap());
        }
    }

    /// A root given by name is sought at every address the name resolves to, each attempt: here
    /// its first address refuses (nothing listens there) and its second answers.
    #[test]
    fn the_root_is_sought_at_every_address_of_its_name() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let second = listener.local_addr().unwrap();
        let first = {
            let closed = TcpListener::bind("127.0.0.1:0").unwrap();
            closed.local_addr().unwrap()
        };
        let deadline = Deadline::after(Duration::from_secs(30));
        let mut tried = Vec::new();
        let stream = connect_root(first, Some(&mut || vec![first, second]), &deadline, |addr, left| {
            tried.push(*addr);
            TcpStream::connect_timeout(addr, left)
        })
        .unwrap();
        assert_eq!(stream.peer_addr().unwrap(), second);
        assert_eq!(tried, [first, second], "the root's own address first, each once");
    }

    #[test]
    fn four_nodes_get_a_full_mesh() {
        let n = 4;
        let (listener, root) = bind_root();
        let cfgs = (0..n).map(|r| config(n, r, root, Duration::from_secs(10))).collect();
        let meshes: Vec<Mesh> = meet(listener, cfgs).into_iter().map(Result::unwrap).collect();

        thread::scope(|s| {
            for mut mesh in meshes {
                s.spawn(move || {
                    let me = mesh.rank;
                    assert_eq!(mesh.nprocs, n);
                    assert_eq!(mesh.peers.len(), usize::from(n));
                    for (j, peer) in mesh.peers.iter_mut().enumerate() {
                        let Some(stream) = peer else {
                            assert_eq!(j, me.idx());
                            continue;
                        };
                        assert!(stream.nodelay().unwrap());
                        assert_eq!(stream.read_timeout().unwrap(), None);
                        // A silent peer is probed, and one that stops acknowledging fails.
                        use nix::sys::socket::{getsockopt, sockopt};
                        assert!(getsockopt(&*stream, sockopt::KeepAlive).unwrap());
                        assert_eq!(getsockopt(&*stream, sockopt::TcpKeepIdle).unwrap(), KEEPALIVE.0);
                        assert!(getsockopt(&*stream, sockopt::TcpUserTimeout).unwrap() > 0);
                        let to = NodeId(j as u16);
                        let mut out = Vec::new();
                        encode_frame(&Probe { from: me, to, body: body(me.0, to.0) }, &mut out).unwrap();
                        stream.write_all(&out).unwrap();
                    }
                    for (j, peer) in mesh.peers.iter_mut().enumerate() {
                        let Some(stream) = peer else { continue };
                        let mut reader = FrameReader::from_node(NodeId(j as u16));
                        let mut buf = [0u8; 512];
                        let frame = loop {
                            if let Some(frame) = reader.next_frame().unwrap() {
                                break frame;
                            }
                            let got = stream.read(&mut buf).unwrap();
                            assert_ne!(got, 0, "{me}: node {j} closed early");
                            reader.push(&buf[..got]);
                        };
                        let codec::Frame::Payload(payload) = frame else { panic!("goodbye from {j}") };
                        let probe: Probe = decode_payload(&payload).unwrap();
                        let from = NodeId(j as u16);
                        assert_eq!(probe, Probe { from, to: me, body: body(from.0, me.0) });
                    }
                });
            }
        });
    }

    #[test]
    fn peers_wait_for_a_late_root() {
        // Reserve a port, free it, and start the root only later on that address: one of the
        // loopback network's addresses that no other test uses, so that no port another test
        // binds or connects from in between can be this one.
        let listener = TcpListener::bind("127.0.0.77:0").unwrap();
        let root = listener.local_addr().unwrap();
        drop(listener);
        let results = thread::scope(|s| {
            let peer = s.spawn(move || connect_mesh(&config(2, 1, root, Duration::from_secs(10)), None));
            thread::sleep(Duration::from_millis(100));
            let root_node = s.spawn(move || connect_mesh(&config(2, 0, root, Duration::from_secs(10)), None));
            [root_node.join().unwrap(), peer.join().unwrap()]
        });
        for r in results {
            let mesh = r.unwrap();
            assert_eq!(mesh.peers.iter().filter(|p| p.is_some()).count(), 1);
        }
    }

    #[test]
    fn single_node_needs_no_sockets() {
        let (_, root) = bind_root();
        let mesh = connect_mesh(&config(1, 0, root, Duration::from_secs(1)), None).unwrap();
        assert_eq!(mesh.peers.len(), 1);
        assert!(mesh.peers[0].is_none());
        let err = connect_mesh(&config(2, 2, root, Duration::from_secs(1)), None).unwrap_err();
        assert!(matches!(err, TransportError::BadConfig { .. }), "{err}");
    }

    #[test]
    fn fingerprint_mismatch_fails_both_sides() {
        let (listener, root) = bind_root();
        let mut odd = config(2, 1, root, Duration::from_secs(10));
        odd.fingerprint = "heap=2048 proto=1".to_owned();
        let mut results = meet(listener, vec![config(2, 0, root, Duration::from_secs(10)), odd]);
        let peer = results.pop().unwrap().unwrap_err();
        let root_err = results.pop().unwrap().unwrap_err();

        match &root_err {
            TransportError::ConfigMismatch { node, ours, theirs } => {
                assert_eq!(*node, NodeId(1));
                assert_eq!(ours, FP);
                assert_eq!(theirs, "heap=2048 proto=1");
            }
            other => panic!("root: {other}"),
        }
        let msg = root_err.to_string();
        assert!(msg.starts_with("node 1 announced configuration \"heap=2048 proto=1\""), "{msg}");
        assert!(msg.contains(FP), "{msg}");

        match &peer {
            TransportError::Rejected { by, reason } => {
                assert_eq!(*by, ROOT);
                assert!(reason.contains("heap=2048 proto=1") && reason.contains(FP), "{reason}");
            }
            other => panic!("peer: {other}"),
        }
        // A peer's fingerprint is shown cut to its first 200 characters, not whole.
        let (listener, root) = bind_root();
        let mut huge = config(2, 1, root, Duration::from_secs(10));
        huge.fingerprint = "é".repeat(1 << 20);
        let mut results = meet(listener, vec![config(2, 0, root, Duration::from_secs(10)), huge]);
        let TransportError::ConfigMismatch { theirs, .. } = results.remove(0).unwrap_err() else { panic!() };
        assert_eq!(theirs, format!("{}...", "é".repeat(200)));
    }

    #[test]
    fn nprocs_mismatch_names_both_counts() {
        let (listener, root) = bind_root();
        let mut results = meet(
            listener,
            vec![config(4, 0, root, Duration::from_secs(10)), config(3, 2, root, Duration::from_secs(10))],
        );
        let peer = results.pop().unwrap().unwrap_err();
        let root_err = results.pop().unwrap().unwrap_err();
        assert_eq!(root_err.to_string(), "node 2 announced 3 nodes, we were started with 4");
        assert!(matches!(peer, TransportError::Rejected { .. }), "{peer}");
    }

    #[test]
    fn duplicate_rank_fails_the_meeting() {
        let (listener, root) = bind_root();
        let t = Duration::from_secs(10);
        let mut results =
            meet(listener, vec![config(3, 0, root, t), config(3, 1, root, t), config(3, 1, root, t)]);
        let peers = results.split_off(1);
        let root_err = results.pop().unwrap().unwrap_err();
        assert!(matches!(root_err, TransportError::DuplicateRank { rank: NodeId(1), .. }), "{root_err}");
        assert!(root_err.to_string().starts_with("node 1 announced twice"), "{root_err}");
        for p in peers {
            let err = p.unwrap_err();
            assert!(
                matches!(&err, TransportError::Rejected { reason, .. } if reason.contains("announced twice")),
                "{err}"
            );
        }
    }

    #[test]
    fn rank_out_of_range_is_refused() {
        let (listener, root) = bind_root();
        let mut raw = TcpStream::connect(root).unwrap();
        let hello =
            Handshake::Hello { rank: NodeId(9), nprocs: 2, fingerprint: FP.to_owned(), listen_addr: root };
        raw.write_all(&codec::frame(&hello).unwrap()).unwrap();
        let err = connect_mesh(&config(2, 0, root, Duration::from_secs(5)), Some(listener)).unwrap_err();
        assert!(matches!(err, TransportError::RankOutOfRange { rank: 9, .. }), "{err}");
        assert!(err.to_string().contains("announced rank 9, expected one of 1..2"), "{err}");
        // The impostor is told.
        let mut bytes = Vec::new();
        raw.read_to_end(&mut bytes).unwrap();
        let reply: Handshake = decode_payload(&bytes[HEADER_LEN..]).unwrap();
        assert!(matches!(reply, Handshake::Reject { .. }), "{reply:?}");
    }

    /// A rank whose connection breaks after its hello fails the meeting, and the ranks that
    /// joined are told why (they were left to find the root's connection closed): the root finds
    /// the break watching the connection, or writing the table to it.
    #[test]
    fn a_rank_lost_before_the_table_fails_the_meeting_and_the_rest_are_told() {
        let (listener, root) = bind_root();
        let t = Duration::from_secs(10);
        let root_node = thread::spawn(move || connect_mesh(&config(3, 0, root, t), Some(listener)));
        let hello = |rank| {
            let raw = TcpStream::connect(root).unwrap();
            let hello = Handshake::Hello {
                rank: NodeId(rank),
                nprocs: 3,
                fingerprint: FP.to_owned(),
                listen_addr: root,
            };
            (&raw).write_all(&codec::frame(&hello).unwrap()).unwrap();
            raw
        };
        let mut rank_2 = hello(2);
        let rank_1 = hello(1);
        // Closed with a reset: the root still reads the hello (received data stays readable
        // after a reset).
        let linger = nix::sys::socket::sockopt::Linger;
        nix::sys::socket::setsockopt(&rank_1, linger, &libc::linger { l_onoff: 1, l_linger: 0 }).unwrap();
        drop(rank_1);
        let root_err = root_node.join().unwrap().unwrap_err();
        // Found watching its connection, writing the table to it, or (the table out before the
        // reset) waiting for its ready.
        assert!(
            matches!(root_err, TransportError::Io { op: "send the table to" | "receive ready from", .. })
                || matches!(root_err, TransportError::JoinedNodeLost { node: NodeId(1), .. }),
            "{root_err}"
        );
        let deadline = Deadline::after(t);
        let mut told = recv(&mut rank_2, root, &deadline, "receive from", || "the reject".into());
        if matches!(told, Ok(Handshake::Table { .. })) {
            told = recv(&mut rank_2, root, &deadline, "receive from", || "the reject".into());
        }
        assert!(
            matches!(&told, Ok(Handshake::Reject { reason }) if reason.starts_with("node 1: ")),
            "{told:?}"
        );
    }

    /// A rank lost after it took the table, with a reset or closing in order (as a process that
    /// exits or is killed does): the root hears nothing but the close where its `Ready` should
    /// come, and the rank that has the table, waiting for the lost one to connect, is told at
    /// once instead of waiting out the meeting.
    #[test]
    fn a_rank_lost_after_the_table_fails_the_ranks_that_got_it_at_once() {
        for reset in [true, false] {
            let (listener, root) = bind_root();
            let t = Duration::from_secs(20);
            let started = Instant::now();
            let root_node = thread::spawn(move || connect_mesh(&config(3, 0, root, t), Some(listener)));
            let mut raw = TcpStream::connect(root).unwrap();
            let hello = Handshake::Hello {
                rank: NodeId(2),
                nprocs: 3,
                fingerprint: FP.to_owned(),
                listen_addr: root,
            };
            (&raw).write_all(&codec::frame(&hello).unwrap()).unwrap();
            let rank_1 = thread::spawn(move || connect_mesh(&config(3, 1, root, t), None));
            let deadline = Deadline::after(t);
            let table = recv(&mut raw, root, &deadline, "receive from", || "the table".into()).unwrap();
            assert!(matches!(table, Handshake::Table { .. }), "{table:?}");
            if reset {
                let linger = nix::sys::socket::sockopt::Linger;
                nix::sys::socket::setsockopt(&raw, linger, &libc::linger { l_onoff: 1, l_linger: 0 })
                    .unwrap();
            }
            drop(raw);
            let root_err = root_node.join().unwrap().unwrap_err();
            let peer = rank_1.join().unwrap().unwrap_err();
            assert!(
                matches!(root_err, TransportError::Io { op: "receive ready from", .. }),
                "reset {reset}: {root_err}"
            );
            assert!(
                matches!(&peer, TransportError::Rejected { reason, .. } if reason.starts_with("node 2: ")),
                "reset {reset}: {peer}"
            );
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "reset {reset}: took {:?}",
                started.elapsed()
            );
        }
    }

    /// The rank a meeting fails on is told why too: here rank 1 joins, takes the table and then
    /// says nothing (alive, only the first still missing when the root's time runs out), and it
    /// reads the root's reason instead of a closed connection that would read as the root's death.
    #[test]
    fn the_rank_a_meeting_fails_on_is_told_why() {
        let (listener, root) = bind_root();
        // Rank 1's listener takes connections into its backlog and never answers.
        let quiet = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut raw = TcpStream::connect(root).unwrap();
        let hello = Handshake::Hello {
            rank: NodeId(1),
            nprocs: 3,
            fingerprint: FP.to_owned(),
            listen_addr: quiet.local_addr().unwrap(),
        };
        (&raw).write_all(&codec::frame(&hello).unwrap()).unwrap();
        let rank_2 = thread::spawn(move || connect_mesh(&config(3, 2, root, Duration::from_secs(10)), None));
        // The root last, its time counted from when both ranks are on their way (the listener,
        // bound, holds their connections meanwhile), so that only the missing ready runs it out.
        let root_node =
            thread::spawn(move || connect_mesh(&config(3, 0, root, Duration::from_secs(2)), Some(listener)));
        let deadline = Deadline::after(Duration::from_secs(20));
        let table = recv(&mut raw, root, &deadline, "receive from", || "the table".into()).unwrap();
        assert!(matches!(table, Handshake::Table { .. }), "{table:?}");
        let told = recv(&mut raw, root, &deadline, "receive from", || "the reject".into());
        let root_err = root_node.join().unwrap().unwrap_err();
        assert!(matches!(root_err, TransportError::Timeout { .. }), "{root_err}");
        assert!(
            matches!(&told, Ok(Handshake::Reject { reason }) if reason.starts_with("node 1: ")),
            "rank 1 was told {told:?}"
        );
        let peer = rank_2.join().unwrap().unwrap_err();
        assert!(matches!(&peer, TransportError::Rejected { .. }), "{peer}");
        drop(quiet);
    }

    /// A rank lost after its hello fails the meeting at once, naming it, with no other rank to
    /// come: the root had noticed only when the last rank joined, or at the meeting's timeout.
    #[test]
    fn a_rank_lost_while_others_are_awaited_fails_the_meeting_at_once() {
        let (listener, root) = bind_root();
        let started = Instant::now();
        let root_node =
            thread::spawn(move || connect_mesh(&config(3, 0, root, Duration::from_secs(60)), Some(listener)));
        let raw = TcpStream::connect(root).unwrap();
        let hello =
            Handshake::Hello { rank: NodeId(1), nprocs: 3, fingerprint: FP.to_owned(), listen_addr: root };
        (&raw).write_all(&codec::frame(&hello).unwrap()).unwrap();
        drop(raw);
        let err = root_node.join().unwrap().unwrap_err();
        assert!(matches!(err, TransportError::JoinedNodeLost { node: NodeId(1), .. }), "{err}");
        assert!(err.to_string().starts_with("node 1: watch the connection from"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
    }

    /// Connections that close without a word (a port check) or say nothing are not ranks: they
    /// neither fail the meeting nor hold up the ranks that come after them.
    #[test]
    fn connections_that_say_nothing_neither_fail_nor_hold_up_the_meeting() {
        let (listener, root) = bind_root();
        let t = Duration::from_secs(20);
        let root_node = thread::spawn(move || connect_mesh(&config(3, 0, root, t), Some(listener)));
        drop(TcpStream::connect(root).unwrap());
        let silent = TcpStream::connect(root).unwrap();
        let started = Instant::now();
        let ranks: Vec<_> =
            (1..3).map(|r| thread::spawn(move || connect_mesh(&config(3, r, root, t), None))).collect();
        assert!(root_node.join().unwrap().is_ok());
        for rank in ranks {
            assert!(rank.join().unwrap().is_ok());
        }
        assert!(started.elapsed() < Duration::from_secs(15), "took {:?}", started.elapsed());
        drop(silent);
    }

    #[test]
    fn garbage_hello_is_an_error_not_a_panic() {
        let (listener, root) = bind_root();
        let mut raw = TcpStream::connect(root).unwrap();
        raw.write_all(&[5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff]).unwrap();
        let err = connect_mesh(&config(2, 0, root, Duration::from_secs(5)), Some(listener)).unwrap_err();
        // The error names who sent it.
        let from = raw.local_addr().unwrap();
        assert!(err.to_string().contains(&format!("from {from}")), "{err}");
        let TransportError::BadHandshake { source, .. } = err else { panic!("{err}") };
        assert!(matches!(*source, TransportError::Decode { len: 5, .. }), "{source}");

        let (listener, root) = bind_root();
        let mut raw = TcpStream::connect(root).unwrap();
        raw.write_all(&[0xff, 0xff, 0xff, 0xff]).unwrap();
        let err = connect_mesh(&config(2, 0, root, Duration::from_secs(5)), Some(listener)).unwrap_err();
        let TransportError::BadHandshake { source, .. } = err else { panic!("{err}") };
        assert!(matches!(*source, TransportError::FrameTooLarge { .. }), "{source}");
    }

    #[test]
    fn missing_node_times_out_naming_it() {
        let (listener, root) = bind_root();
        let started = Instant::now();
        // Rank 2 never comes. Rank 1 waits longer than the root, so it hears the root's reason;
        // the root's 2 s leave rank 1 time to join however loaded the machine.
        let mut results = meet(
            listener,
            vec![config(3, 0, root, Duration::from_secs(2)), config(3, 1, root, Duration::from_secs(10))],
        );
        assert!(started.elapsed() < Duration::from_secs(9));
        let peer = results.pop().unwrap().unwrap_err();
        let root_err = results.pop().unwrap().unwrap_err();
        match &root_err {
            TransportError::Timeout { waiting_for, timeout } => {
                assert_eq!(*timeout, Duration::from_secs(2));
                assert!(waiting_for.starts_with("hello from node 2 "), "{waiting_for}");
                assert!(waiting_for.contains("1 of 2 peers joined"), "{waiting_for}");
            }
            other => panic!("root: {other}"),
        }
        assert!(
            matches!(&peer, TransportError::Rejected { reason, .. } if reason.contains("node 2")),
            "{peer}"
        );
    }

    #[test]
    fn missing_root_times_out() {
        let (listener, root) = bind_root();
        drop(listener);
        let err = connect_mesh(&config(2, 1, root, Duration::from_millis(300)), None).unwrap_err();
        assert!(
            matches!(&err, TransportError::Timeout { waiting_for, .. } if waiting_for.contains("root (node 0)")),
            "{err}"
        );
    }
}
