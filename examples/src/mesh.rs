//! A mesh of TCP connections between `n` local processes, for the hand-written message-passing
//! baselines (`radix --mode mp`): what the DSM is compared with when a target is missed.
//!
//! Rank 0 is the process the user started. It listens on a loopback port and starts ranks
//! `1..n` as copies of itself (the same arguments, the rank and port in [`RANK_ENV`] and
//! [`ROOT_ENV`]). Each of them listens too, connects to rank 0 and says who it is and where it
//! listens; rank 0 answers with every rank's port, and each rank connects to the ranks below it.
//!
//! # Invariants
//! - Every pair of ranks shares one connection; `peers[q]` is this rank's (reads) and
//!   `writers[q]` a second handle of it (writes, from another thread), `None` for `q == me`.
//! - Every wait is bounded: connections time out after [`TIMEOUT`], reads and writes too, so a
//!   rank whose peer died exits with an error instead of hanging.
//! - Rank 0 reaps its children in [`Mesh::finish`] and reports any that failed; on any early
//!   return, from the start-up on, they are killed and reaped (`Ranks`). A child that exits
//!   before it joins fails the start-up at once, by its rank and exit status. A child whose
//!   rank 0 died sees its connection close and exits with an error.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Environment variable naming a started rank.
pub const RANK_ENV: &str = "MESH_RANK";
/// Environment variable naming rank 0's port, for the ranks it starts.
pub const ROOT_ENV: &str = "MESH_ROOT";
/// For the tests: the rank named here exits (status 3) before it joins the mesh.
pub const TEST_EXIT_ENV: &str = "MESH_TEST_EXIT_RANK";
/// Longest wait for a connection, a read or a write.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// This process's place in the mesh and its connections to every other rank.
#[derive(Debug)]
pub struct Mesh {
    me: usize,
    peers: Vec<Option<TcpStream>>,
    writers: Vec<Option<TcpStream>>,
    children: Ranks,
}

/// The ranks rank 0 started (`children[k]` is rank `k + 1`): killed and reaped when dropped,
/// unless [`Mesh::finish`] reaped them first.
#[derive(Debug, Default)]
struct Ranks(Vec<Child>);

impl Ranks {
    /// Fails if a rank has exited already (before the mesh is complete, any exit is a failure).
    fn check_running(&mut self) -> io::Result<()> {
        for (k, child) in self.0.iter_mut().enumerate() {
            if let Some(status) = child.try_wait()? {
                return Err(invalid(format!(
                    "rank {} ended with {status} before the mesh was complete",
                    k + 1
                )));
            }
        }
        Ok(())
    }
}

impl Drop for Ranks {
    /// Rank 0 leaving early (an error) takes its children with it.
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Mesh {
    /// Starts a mesh of `n` ranks (in the process the user started) or joins it (in a rank that
    /// process started).
    pub fn start(n: usize) -> io::Result<Mesh> {
        Self::start_with(n, &[])
    }

    /// Whether [`Mesh::start`] starts the mesh in this process (rank 0), rather than joining it.
    pub fn starts_here() -> bool {
        std::env::var_os(RANK_ENV).is_none()
    }

    /// [`Mesh::start`], the ranks it starts given the variables `env` besides.
    pub fn start_with(n: usize, env: &[(&str, &str)]) -> io::Result<Mesh> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        let mut peers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        let mut children = Ranks::default();
        let me = match std::env::var(RANK_ENV) {
            Err(_) => {
                for rank in 1..n {
                    let exe = std::env::current_exe()?;
                    let args = std::env::args_os().skip(1);
                    let cmd = Command::new(exe)
                        .args(args)
                        .envs(env.iter().copied())
                        .env(RANK_ENV, rank.to_string())
                        .env(ROOT_ENV, port.to_string())
                        .spawn();
                    children.0.push(cmd?);
                }
                let mut ports = vec![port; n];
                for _ in 1..n {
                    let mut s = accept(&listener, &mut children)?;
                    let hello = read_u32s(&mut s, 2)?;
                    let (rank, their_port) = (hello[0] as usize, hello[1] as u16);
                    if rank == 0 || rank >= n || peers[rank].is_some() {
                        return Err(invalid(format!("a rank said it was {rank} (of {n})")));
                    }
                    ports[rank] = their_port;
                    peers[rank] = Some(s);
                }
                let table: Vec<u32> = ports.iter().map(|&p| u32::from(p)).collect();
                for s in peers.iter_mut().flatten() {
                    write_u32s(s, &table)?;
                }
                0
            }
            Ok(rank) => {
                if std::env::var(TEST_EXIT_ENV).is_ok_and(|r| r == rank) {
                    std::process::exit(3);
                }
                let me: usize = rank.parse().map_err(|_| invalid(format!("bad {RANK_ENV} {rank:?}")))?;
                let root: u16 = std::env::var(ROOT_ENV)
                    .ok()
                    .and_then(|p| p.parse().ok())
                    .ok_or_else(|| invalid(format!("{RANK_ENV} set without a valid {ROOT_ENV}")))?;
                let mut s = connect(root)?;
                write_u32s(&mut s, &[me as u32, u32::from(port)])?;
                let table = read_u32s(&mut s, n)?;
                peers[0] = Some(s);
                for (q, &their_port) in table.iter().enumerate().take(me).skip(1) {
                    let mut s = connect(their_port as u16)?;
                    write_u32s(&mut s, &[me as u32])?;
                    peers[q] = Some(s);
                }
                for _ in me + 1..n {
                    let mut s = accept(&listener, &mut children)?;
                    let q = read_u32s(&mut s, 1)?[0] as usize;
                    if q <= me || q >= n || peers[q].is_some() {
                        return Err(invalid(format!("rank {me} was called by a rank {q}")));
                    }
                    peers[q] = Some(s);
                }
                me
            }
        };
        let mut writers = Vec::with_capacity(n);
        for p in &peers {
            writers.push(match p {
                Some(s) => {
                    s.set_nodelay(true)?;
                    s.set_read_timeout(Some(TIMEOUT))?;
                    s.set_write_timeout(Some(TIMEOUT))?;
                    Some(s.try_clone()?)
                }
                None => None,
            });
        }
        Ok(Mesh { me, peers, writers, children })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.me
    }

    /// Sends `outs[q]` to every other rank `q` and receives from each `q` the `counts[q]` values
    /// it sends this rank into `ins[q]`, all at once (a thread a destination writes, this one
    /// reads).
    pub fn exchange(&mut self, outs: &[Vec<u32>], ins: &mut [Vec<u32>], counts: &[usize]) -> io::Result<()> {
        let me = self.me;
        std::thread::scope(|scope| {
            let sends: Vec<_> = (self.writers.iter_mut().enumerate())
                .filter_map(|(q, w)| w.as_mut().map(|w| (q, w)))
                .map(|(q, w)| scope.spawn(move || w.write_all(bytemuck::cast_slice(&outs[q]))))
                .collect();
            let mut got = Ok(());
            for (q, reader) in self.peers.iter_mut().enumerate() {
                let Some(reader) = reader else { continue };
                ins[q].resize(counts[q], 0);
                if let Err(e) = reader.read_exact(bytemuck::cast_slice_mut(&mut ins[q])) {
                    got = Err(e);
                    break;
                }
            }
            for s in sends {
                s.join().map_err(|_| invalid(format!("rank {me}: a sending thread panicked")))??;
            }
            got
        })
    }

    /// Every rank's `row` (this rank's is `rows[me]`): sends its own to every other rank and
    /// fills the others' from theirs.
    pub fn all_gather(&mut self, rows: &mut [Vec<u32>]) -> io::Result<()> {
        let n = rows.len();
        let outs: Vec<Vec<u32>> = vec![rows[self.me].clone(); n];
        let counts: Vec<usize> = rows.iter().map(Vec::len).collect();
        self.exchange(&outs, rows, &counts)?;
        Ok(())
    }

    /// Returns once every rank has called it.
    pub fn barrier(&mut self) -> io::Result<()> {
        let n = self.peers.len();
        let mut ins = vec![Vec::new(); n];
        self.exchange(&vec![vec![0]; n], &mut ins, &vec![1; n])
    }

    /// Waits for the ranks this one started (rank 0) and fails if any did.
    pub fn finish(mut self) -> io::Result<()> {
        drop(std::mem::take(&mut self.peers));
        drop(std::mem::take(&mut self.writers));
        let deadline = Instant::now() + TIMEOUT;
        for (k, child) in self.children.0.iter_mut().enumerate() {
            let status = loop {
                if let Some(status) = child.try_wait()? {
                    break status;
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    break child.wait()?;
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            if !status.success() {
                return Err(invalid(format!("rank {} ended with {status}", k + 1)));
            }
        }
        Ok(())
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The next rank to connect, within [`TIMEOUT`]; fails at once if one of `children` exits.
fn accept(listener: &TcpListener, children: &mut Ranks) -> io::Result<TcpStream> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(TIMEOUT))?;
                return Ok(s);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                children.check_running()?;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "no rank connected in time"));
            }
            Err(e) => return Err(e),
        }
    }
}

fn connect(port: u16) -> io::Result<TcpStream> {
    let s = TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), TIMEOUT)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    Ok(s)
}

fn write_u32s(s: &mut TcpStream, values: &[u32]) -> io::Result<()> {
    s.write_all(bytemuck::cast_slice(values))
}

fn read_u32s(s: &mut TcpStream, n: usize) -> io::Result<Vec<u32>> {
    let mut v = vec![0u32; n];
    s.read_exact(bytemuck::cast_slice_mut(&mut v))?;
    Ok(v)
}
