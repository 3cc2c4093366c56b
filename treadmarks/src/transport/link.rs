//! Links: the tokio side of the mesh. One reader and one writer task per peer, on the node's
//! current-thread runtime (the service thread).
//!
//! ```text
//!             send(to, frame) ──► written at once if nothing is queued, else:
//!                             ──► unbounded queue ──► writer task ──► socket write half
//!  Links  ─┤  goodbye()       ──► (Goodbye, last)     drains the queue into one write
//!             counters()      ◄── atomics per peer ◄──┐
//!  events ◄── LinkEvent::Frame / Closed ◄── reader task ◄── socket read half
//! ```
//!
//! This module owns the streams once [`Links::start`] has taken them from the [`Mesh`]. It moves
//! whole frames: callers encode with [`encode_frame`](super::codec::encode_frame) (or in parts,
//! [`encode_frame_parts`](super::codec::encode_frame_parts), for [`Links::send_parts`], which
//! writes a diff's bytes from where they lie with one vectored write) and decode
//! [`LinkEvent::Frame`] payloads with [`decode_payload`](super::codec::decode_payload).
//!
//! Invariants:
//! - frames to one peer are written in the order they were passed to [`Links::send`], and a
//!   goodbye queued by [`Links::goodbye`] is written after all of them and is the last frame on
//!   that link; after it, `send` to that peer fails;
//! - `send` writes a frame itself, without a turn of the writer task, when the link has nothing
//!   queued or half written (`Link::unwritten` is zero: it counts what the writer holds, and
//!   everything runs on the one service thread, so nothing changes between the check and the
//!   write); what the socket does not take goes to the writer, ahead of anything sent later.
//!   A barrier's arrival otherwise waited behind the reader task that took in the push the
//!   other node had sent meanwhile (74 KB in jacobi3d, 5-16 µs), on the barrier's critical path;
//! - a writer coalesces everything queued when it wakes into one write (fewer syscalls and
//!   wake-ups: this matters for latency on a 2-core box);
//! - a reader delivers frames from one peer in order and ends with exactly one
//!   [`LinkEvent::Closed`] for that peer (unless the event receiver is gone); a header above
//!   [`MAX_FRAME`](super::codec::MAX_FRAME) or a stream cut inside a frame is
//!   [`CloseCause::Malformed`], never a panic (a payload buffer is allocated at the announced
//!   size, so one frame costs at most 64 MiB);
//! - a reader holds at most [`UNTAKEN_LIMIT`] bytes of frames the event receiver has not taken
//!   (dropped the [`LinkEvent`] of), each counted as at least `FRAME_COST`, or one frame if that is
//!   larger: past it, it reads no more until events are taken, and the peer's writes wait in TCP.
//!   So a peer sending faster than this node handles its frames costs bounded memory. It cannot
//!   deadlock: the receiver takes events without waiting for any link, and no send waits for the
//!   socket (the writers' queues take what it does not); only at the end, flushing its links before
//!   it drains their events, does a node wait for its writers, bounded by [`FLUSH_TIMEOUT`];
//! - counters count data frames and their bytes (header included); the goodbye frame is not
//!   counted.
//!
//! Frame buffers are recycled: a writer hands a written frame back to the links' `BufferPool`,
//! [`Links::buffer`] hands it out again to encode the next frame into, a reader fills a pooled
//! buffer with the next payload, and the caller gives the payload back with
//! [`Links::recycle`] once decoded, or wraps it with [`Links::share`] so that the diffs decoded
//! from it can point into it, and it goes back when the last of them is dropped. A bulk transfer
//! moves frames of about a megabyte; a fresh vector for each costs a page fault per 4 KiB (and
//! zeroing) on both sides, which the profile of a bulk fetch showed as the largest single cost of
//! the receiving service thread. The pool is bounded (`POOL_BYTES`), so it holds at most a few
//! frames' worth of memory. It starts with `RESERVED_BUFFERS` buffers already backed, as many
//! as a bulk transfer keeps in flight, so that their first use faults no page in either.

use std::io::{self, IoSlice};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nix::sys::socket::{MsgFlags, sendmsg};
use tokio::io::Interest;
use tokio::io::{AsyncRead, AsyncReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::mpsc::{self, UnboundedReceiver, UnboundedSender};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use super::codec::{FrameLen, FrameParts, GOODBYE_FRAME, HEADER_LEN, decode_header};
use super::error::{Result, TransportError};
use super::mesh::Mesh;
#[cfg(doc)]
use crate::protocol::decode_sharing;
use crate::protocol::{ByteOwner, NodeId};

/// How long [`Links::flush_and_close`] waits for the writers in total.
pub const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// A writer stops gathering queued frames into one write once it holds this many bytes.
const COALESCE_LIMIT: usize = 256 << 10;

/// Bytes of frames one peer's reader may hold that the event receiver has not taken yet.
pub const UNTAKEN_LIMIT: usize = 128 << 20;

/// What a frame held for the event receiver costs at least, in memory, whatever its size: its
/// payload's allocation and its event in the channel (~85 bytes for a 1-byte payload).
const FRAME_COST: usize = 128;

/// Capacity of a reader's buffer: many small frames are read with one syscall.
const READ_BUFFER: usize = 64 << 10;

/// Payloads up to this size are read into a buffer of their own size, not a pooled one: a diff
/// decoded from a small frame (a push kept aside until its page is read, for up to three
/// epochs) would otherwise keep a pooled buffer of a megabyte from the pool all that time, and
/// a malloc of a few kilobytes costs nothing like the page faults of a fresh megabyte.
const SMALL_PAYLOAD: usize = 64 << 10;

/// Most bytes of capacity the buffer pool of one node's links keeps.
const POOL_BYTES: usize = 32 << 20;

/// Most buffers the pool keeps.
const POOL_BUFFERS: usize = 16;

/// Buffers the pool starts with, already backed by memory ([`BufferPool::reserved`]).
const RESERVED_BUFFERS: usize = 8;

/// Capacity of each buffer the pool starts with: a reply of a full request's worth of whole
/// pages (256 pages of 4 KiB) and its framing.
const RESERVED_BUFFER: usize = 1152 << 10;

/// Spare frame buffers, shared by the links' tasks and their owner (on the service thread) and
/// by the application thread, which returns a buffer when it drops the last diff decoded from
/// it (a push validated on the node itself): the lock is rarely contended.
#[derive(Debug, Default)]
struct BufferPool {
    bufs: std::sync::Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// A pool holding `count` empty buffers of `bytes` capacity each, every page of which has
    /// been written once, so that the kernel backed it now. A fresh buffer's first use costs a
    /// page fault (and the zeroing of a page) per 4 KiB touched, in the middle of a transfer:
    /// in fft at 2 nodes, ~1,500 such faults a node, the service threads' largest kernel cost
    /// after the socket calls, while the pool grew to the ~8 MB of frames in flight.
    fn reserved(count: usize, bytes: usize) -> BufferPool {
        let bufs = (0..count)
            .map(|_| {
                let mut buf = vec![0u8; bytes];
                // `vec!` of zeros may take untouched zero pages from the kernel: write them.
                buf.iter_mut().step_by(4096).for_each(|b| *b = 1);
                buf.clear();
                buf
            })
            .collect();
        BufferPool { bufs: std::sync::Mutex::new(bufs) }
    }

    /// An empty buffer for `want` bytes: the smallest recycled one that holds them, else the
    /// largest one (it grows less), else a new one.
    fn take(&self, want: usize) -> Vec<u8> {
        let mut bufs = self.bufs.lock().expect("buffer pool");
        let fits =
            (0..bufs.len()).filter(|&i| bufs[i].capacity() >= want).min_by_key(|&i| bufs[i].capacity());
        let pick = fits.or_else(|| (0..bufs.len()).max_by_key(|&i| bufs[i].capacity()));
        let mut buf = pick.map(|i| bufs.swap_remove(i)).unwrap_or_default();
        buf.clear();
        buf
    }

    /// Keeps `buf` for reuse unless the pool is full or `buf` is a small payload's
    /// ([`SMALL_PAYLOAD`]), which would take a pooled buffer's place.
    fn give(&self, buf: Vec<u8>) {
        if buf.capacity() <= SMALL_PAYLOAD {
            return;
        }
        let mut bufs = self.bufs.lock().expect("buffer pool");
        let held: usize = bufs.iter().map(Vec::capacity).sum();
        if bufs.len() < POOL_BUFFERS && held + buf.capacity() <= POOL_BYTES {
            bufs.push(buf);
        }
    }
}

/// A received payload shared by the diffs decoded from it: it goes back to the pool when the
/// last of them is dropped.
struct SharedPayload {
    buf: Vec<u8>,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for SharedPayload {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for SharedPayload {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.buf));
    }
}

/// What the readers report.
#[derive(Debug)]
pub enum LinkEvent {
    /// A frame's payload (header removed).
    Frame {
        /// The sender.
        from: NodeId,
        /// The payload, for [`decode_payload`](super::codec::decode_payload).
        payload: Vec<u8>,
        /// The frame's share of its reader's [`UNTAKEN_LIMIT`], given back when dropped.
        untaken: Untaken,
    },
    /// The link from `from` is closed for reading; no more events come from it.
    Closed {
        /// The peer.
        from: NodeId,
        /// Why.
        cause: CloseCause,
    },
}

/// A frame's share of its reader's [`UNTAKEN_LIMIT`]: while the event holding it lives, the
/// reader counts the frame as not yet taken.
#[derive(Debug)]
pub struct Untaken(#[expect(dead_code, reason = "held for its drop")] OwnedSemaphorePermit);

/// Why a link closed for reading.
#[derive(Debug)]
pub enum CloseCause {
    /// The peer sent the goodbye frame: an orderly close.
    Goodbye,
    /// The stream ended between frames without a goodbye (the peer exited or dropped it).
    Eof,
    /// Reading failed.
    Error(io::Error),
    /// The peer sent something that is not a frame (oversize header, stream cut mid-frame).
    Malformed(TransportError),
}

/// A snapshot of one link's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkCounters {
    /// Data frames written to the peer.
    pub frames_sent: u64,
    /// Bytes of those frames, headers included.
    pub bytes_sent: u64,
    /// Data frames read from the peer.
    pub frames_received: u64,
    /// Bytes of those frames, headers included.
    pub bytes_received: u64,
}

#[derive(Debug, Default)]
struct Counters {
    frames_sent: AtomicU64,
    bytes_sent: AtomicU64,
    frames_received: AtomicU64,
    bytes_received: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> LinkCounters {
        LinkCounters {
            frames_sent: self.frames_sent.load(Ordering::Relaxed),
            bytes_sent: self.bytes_sent.load(Ordering::Relaxed),
            frames_received: self.frames_received.load(Ordering::Relaxed),
            bytes_received: self.bytes_received.load(Ordering::Relaxed),
        }
    }

    fn add_sent(&self, frames: u64, bytes: u64) {
        self.frames_sent.fetch_add(frames, Ordering::Relaxed);
        self.bytes_sent.fetch_add(bytes, Ordering::Relaxed);
    }

    fn add_received(&self, bytes: u64) {
        self.frames_received.fetch_add(1, Ordering::Relaxed);
        self.bytes_received.fetch_add(bytes, Ordering::Relaxed);
    }
}

/// What a writer is asked to write.
enum Outgoing {
    Frame(Vec<u8>),
    /// The part of a frame that [`Links::send`] could not write at once (the frame is already
    /// counted).
    Rest(Vec<u8>),
    Goodbye,
}

/// The sending side of one peer's link.
#[derive(Debug)]
struct Link {
    queue: UnboundedSender<Outgoing>,
    /// Set once a goodbye is queued: nothing may follow it.
    said_goodbye: AtomicBool,
    writer: JoinHandle<()>,
    /// The socket's write half, shared with the writer task.
    half: Arc<OwnedWriteHalf>,
    /// Items queued for the writer and not yet written (the one being written included).
    unwritten: Arc<AtomicUsize>,
    /// Why the writer stopped, if a write failed: the cause a closed link is reported with.
    write_error: Arc<OnceLock<String>>,
}

/// The links of one node to all others.
#[derive(Debug)]
pub struct Links {
    rank: NodeId,
    nprocs: u16,
    /// `links[j]` sends to rank `j`; `links[rank]` is `None`.
    links: Vec<Option<Link>>,
    counters: Arc<[Counters]>,
    pool: Arc<BufferPool>,
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outgoing::Frame(frame) => write!(f, "Frame({} bytes)", frame.len()),
            Outgoing::Rest(rest) => write!(f, "Rest({} bytes)", rest.len()),
            Outgoing::Goodbye => f.write_str("Goodbye"),
        }
    }
}

impl Links {
    /// Takes over the mesh's streams and spawns one reader and one writer task per peer. Events
    /// from every reader go to `events`.
    ///
    /// Must be called inside a tokio runtime (the service thread's current-thread runtime) with
    /// I/O enabled; [`flush_and_close`](Self::flush_and_close) also needs its timer.
    ///
    /// # Errors
    ///
    /// [`TransportError::Io`] if a stream cannot be made nonblocking or registered with the
    /// runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn start(mesh: Mesh, events: UnboundedSender<LinkEvent>) -> Result<Links> {
        Self::start_with_limit(mesh, events, UNTAKEN_LIMIT)
    }

    /// [`Links::start`] with readers that hold at most `untaken_limit` bytes of frames not taken.
    fn start_with_limit(
        mesh: Mesh,
        events: UnboundedSender<LinkEvent>,
        untaken_limit: usize,
    ) -> Result<Links> {
        let Mesh { rank, nprocs, peers } = mesh;
        let counters: Arc<[Counters]> = (0..nprocs).map(|_| Counters::default()).collect();
        let pool = Arc::new(BufferPool::reserved(RESERVED_BUFFERS, RESERVED_BUFFER));
        let mut links = Vec::with_capacity(peers.len());
        for (j, stream) in peers.into_iter().enumerate() {
            let Some(stream) = stream else {
                links.push(None);
                continue;
            };
            let peer = NodeId(u16::try_from(j).expect("a mesh has at most u16::MAX peers"));
            let addr = stream.peer_addr().unwrap_or_else(|_| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
            let stream =
                stream.set_nonblocking(true).and_then(|()| tokio::net::TcpStream::from_std(stream)).map_err(
                    |source| TransportError::Io { op: "hand to the runtime the connection to", addr, source },
                )?;
            let (read_half, write_half) = stream.into_split();
            let (queue, outgoing) = mpsc::unbounded_channel();
            let half = Arc::new(write_half);
            let unwritten = Arc::new(AtomicUsize::new(0));
            let write_error = Arc::new(OnceLock::new());
            let writer = tokio::spawn(write_loop(
                Arc::clone(&half),
                outgoing,
                Writer {
                    unwritten: Arc::clone(&unwritten),
                    error: Arc::clone(&write_error),
                    to: peer,
                    counters: Arc::clone(&counters),
                    pool: Arc::clone(&pool),
                },
            ));
            tokio::spawn(read_loop(
                read_half,
                peer,
                events.clone(),
                untaken_limit,
                Arc::clone(&counters),
                Arc::clone(&pool),
            ));
            links.push(Some(Link {
                queue,
                said_goodbye: AtomicBool::new(false),
                writer,
                half,
                unwritten,
                write_error,
            }));
        }
        Ok(Links { rank, nprocs, links, counters, pool })
    }

    /// An empty buffer to encode a frame into for [`send`](Self::send): a recycled one (with its
    /// capacity, so encoding a large frame does not grow a fresh vector) if there is one.
    pub fn buffer(&self) -> Vec<u8> {
        self.pool.take(usize::MAX)
    }

    /// Gives back a [`LinkEvent::Frame`] payload (or any buffer) once it is no longer needed, so
    /// that a later frame reuses its memory.
    pub fn recycle(&self, buf: Vec<u8>) {
        self.pool.give(buf);
    }

    /// Wraps a [`LinkEvent::Frame`] payload for [`decode_sharing`]: diffs decoded from it point
    /// into it, and it goes back to the pool once the last of them is dropped.
    pub fn share(&self, payload: Vec<u8>) -> Arc<dyn ByteOwner> {
        Arc::new(SharedPayload { buf: payload, pool: Arc::clone(&self.pool) })
    }

    /// This node's rank.
    pub fn rank(&self) -> NodeId {
        self.rank
    }

    /// Number of nodes.
    pub fn nprocs(&self) -> u16 {
        self.nprocs
    }

    /// Sends a frame made by [`encode_frame`](super::codec::encode_frame) to `to`: writes it at
    /// once if nothing is queued for `to` and the socket takes it, else queues (the rest of) it
    /// for the writer task. Must be called on the runtime's thread (see the module docs).
    ///
    /// # Errors
    ///
    /// [`TransportError::NoSuchLink`] for ourselves or a rank out of range;
    /// [`TransportError::LinkClosed`] after a goodbye on that link or once its writer stopped
    /// after a write error.
    ///
    /// # Panics
    ///
    /// If `frame` is not one whole data frame (its header must announce the rest of it): that
    /// would corrupt the stream for the peer.
    pub fn send(&self, to: NodeId, frame: Vec<u8>) -> Result<()> {
        let len = frame.len();
        let link = self.open_link(to, &frame, len)?;
        // A write error (or a full socket) leaves the frame to the writer, which meets the error
        // itself and stops the link, or waits until the socket takes it.
        let written =
            if link.unwritten.load(Ordering::Acquire) == 0 { link.half.try_write(&frame).ok() } else { None };
        let item = match written {
            None => Outgoing::Frame(frame),
            Some(n) => {
                self.counters[to.idx()].add_sent(1, len as u64);
                if n == len {
                    self.pool.give(frame);
                    return Ok(());
                }
                let mut rest = frame;
                rest.drain(..n);
                Outgoing::Rest(rest)
            }
        };
        Self::queue(link, to, item, len)
    }

    /// [`send`](Self::send) of a frame in parts made by
    /// [`encode_frame_parts`](super::codec::encode_frame_parts): written at once with one
    /// vectored write if nothing is queued for `to` (the shared slices go from where they lie to
    /// the socket), else what is left of it is copied into one buffer and queued. Errors and
    /// panics as [`send`](Self::send).
    pub fn send_parts(&self, to: NodeId, parts: FrameParts) -> Result<()> {
        if parts.shared.is_empty() {
            return self.send(to, parts.head);
        }
        let len = parts.len();
        let link = self.open_link(to, &parts.head, len)?;
        let written = if link.unwritten.load(Ordering::Acquire) == 0 {
            try_write_vectored_nosignal(&link.half, &parts.io_slices()).ok()
        } else {
            None
        };
        if let Some(n) = written {
            self.counters[to.idx()].add_sent(1, len as u64);
            if n == len {
                self.pool.give(parts.head);
                return Ok(());
            }
        }
        let skip = written.unwrap_or(0);
        let mut rest = self.pool.take(len - skip);
        parts.copy_from(skip, &mut rest);
        self.pool.give(parts.head);
        let item = if written.is_some() { Outgoing::Rest(rest) } else { Outgoing::Frame(rest) };
        Self::queue(link, to, item, len)
    }

    /// The link to `to`, open for a frame of `len` bytes that starts with `start`.
    fn open_link(&self, to: NodeId, start: &[u8], len: usize) -> Result<&Link> {
        assert!(
            len > HEADER_LEN
                && start.len() >= HEADER_LEN
                && start[..HEADER_LEN] == u32::try_from(len - HEADER_LEN).unwrap_or(0).to_le_bytes(),
            "Links::send to {to} takes one frame from encode_frame, got {len} bytes starting {:?}",
            &start[..start.len().min(HEADER_LEN)],
        );
        let link = self.link(to)?;
        if link.said_goodbye.load(Ordering::Acquire) || link.writer.is_finished() {
            return Err(Self::closed(link, to, len));
        }
        Ok(link)
    }

    /// The error of a send of `len` bytes on `link`, closed: why, if a write failed.
    fn closed(link: &Link, to: NodeId, len: usize) -> TransportError {
        let why = match link.write_error.get() {
            Some(e) => format!("writing to it failed: {e}"),
            None if link.said_goodbye.load(Ordering::Acquire) => "a goodbye was sent on it".to_owned(),
            None => "its writer stopped".to_owned(),
        };
        TransportError::LinkClosed { to, len, why }
    }

    /// Why writing to `peer` failed, if it did (the link then sends nothing more): the cause
    /// behind a peer's connection found closed, which the reading side may see only as its end.
    pub fn write_error(&self, peer: NodeId) -> Option<&str> {
        self.links.get(peer.idx())?.as_ref()?.write_error.get().map(String::as_str)
    }

    /// Hands `item` (of a frame of `len` bytes) to `link`'s writer.
    fn queue(link: &Link, to: NodeId, item: Outgoing, len: usize) -> Result<()> {
        link.unwritten.fetch_add(1, Ordering::AcqRel);
        link.queue.send(item).map_err(|_| {
            link.unwritten.fetch_sub(1, Ordering::AcqRel);
            Self::closed(link, to, len)
        })
    }

    /// Queues a goodbye frame on every link, after everything already queued. Later sends fail.
    pub fn goodbye(&self) {
        for link in self.links.iter().flatten() {
            if !link.said_goodbye.swap(true, Ordering::AcqRel) {
                // A writer that already stopped cannot say goodbye; its reader reports why.
                link.unwritten.fetch_add(1, Ordering::AcqRel);
                let _ = link.queue.send(Outgoing::Goodbye);
            }
        }
    }

    /// Per-peer counters, indexed by rank (our own entry stays zero).
    pub fn counters(&self) -> Vec<LinkCounters> {
        self.counters.iter().map(Counters::snapshot).collect()
    }

    /// Waits until every writer has written everything queued (a goodbye included, if one was
    /// queued) and shut down its half of the stream, for at most [`FLUSH_TIMEOUT`] in total;
    /// writers still busy then are stopped. Readers keep running until their peers close, so
    /// the caller still receives their [`LinkEvent::Closed`].
    pub async fn flush_and_close(self) {
        self.flush_and_close_within(FLUSH_TIMEOUT).await;
    }

    /// [`Links::flush_and_close`], waiting at most `within` in total.
    pub async fn flush_and_close_within(self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        for (j, link) in self.links.into_iter().enumerate() {
            let Some(Link { queue, writer, half, .. }) = link else {
                continue;
            };
            // With its queue closed, the writer ends after the last queued frame, and shuts the
            // write half down as it drops the last reference to it.
            drop(queue);
            drop(half);
            let abort = writer.abort_handle();
            if tokio::time::timeout_at(deadline, writer).await.is_err() {
                tracing::warn!(rank = %self.rank, peer = j, "link not flushed within {within:?}; closing it anyway");
                abort.abort();
            }
        }
    }

    fn link(&self, to: NodeId) -> Result<&Link> {
        self.links.get(to.idx()).and_then(Option::as_ref).ok_or(TransportError::NoSuchLink {
            to,
            rank: self.rank,
            nprocs: self.nprocs,
        })
    }
}

/// What a writer task shares with its [`Link`].
struct Writer {
    /// Items queued and not yet written.
    unwritten: Arc<AtomicUsize>,
    /// Set to the error of a failed write.
    error: Arc<OnceLock<String>>,
    to: NodeId,
    counters: Arc<[Counters]>,
    pool: Arc<BufferPool>,
}

/// Writes queued frames to one peer, coalescing what is queued into one write, until the queue
/// closes, a goodbye is written or a write fails (its error kept for the link's errors); then
/// drops its reference to the write half (the last one shuts it down).
async fn write_loop(half: Arc<OwnedWriteHalf>, mut queue: UnboundedReceiver<Outgoing>, w: Writer) {
    let Writer { unwritten, error, to, counters, pool } = w;
    let counters = &counters[to.idx()];
    let mut batch: Vec<u8> = Vec::new();
    while let Some(first) = queue.recv().await {
        // The only frame so far, written as it is unless more are queued behind it.
        let mut held: Option<Vec<u8>> = None;
        let mut frames = 0u64;
        // Bytes already counted (the rest of a frame `send` began to write).
        let mut counted = 0;
        let mut items = 0;
        let mut goodbye = false;
        batch.clear();
        let mut next = first;
        loop {
            items += 1;
            match next {
                Outgoing::Rest(rest) => {
                    // Always first in its batch (`send` leaves a rest only when nothing is
                    // queued); kept in order all the same.
                    if let Some(held) = held.take() {
                        batch.extend_from_slice(&held);
                        pool.give(held);
                    }
                    counted += rest.len();
                    batch.extend_from_slice(&rest);
                    pool.give(rest);
                }
                Outgoing::Frame(frame) => {
                    frames += 1;
                    if held.is_none() && batch.is_empty() {
                        held = Some(frame);
                    } else {
                        if let Some(held) = held.take() {
                            batch.extend_from_slice(&held);
                            pool.give(held);
                        }
                        batch.extend_from_slice(&frame);
                        pool.give(frame);
                    }
                }
                Outgoing::Goodbye => {
                    if let Some(held) = held.take() {
                        batch.extend_from_slice(&held);
                        pool.give(held);
                    }
                    batch.extend_from_slice(&GOODBYE_FRAME);
                    goodbye = true;
                    break;
                }
            }
            if held.as_ref().map_or(batch.len(), Vec::len) >= COALESCE_LIMIT {
                break;
            }
            match queue.try_recv() {
                Ok(more) => next = more,
                Err(_) => break,
            }
        }
        let bytes: &[u8] = held.as_deref().unwrap_or(&batch);
        if let Err(err) = write_all(&half, bytes).await {
            tracing::debug!(%to, %err, "write failed; the link stops sending");
            let _ = error.set(err.to_string());
            return;
        }
        unwritten.fetch_sub(items, Ordering::AcqRel);
        let data = bytes.len() - counted - if goodbye { HEADER_LEN } else { 0 };
        counters.add_sent(frames, data as u64);
        if let Some(held) = held {
            pool.give(held);
        }
        if goodbye {
            break;
        }
        if batch.capacity() > 4 * COALESCE_LIMIT {
            batch = Vec::new();
        }
    }
}

/// `try_write_vectored` with `MSG_NOSIGNAL`: tokio's is a plain `writev`, which raises SIGPIPE
/// on a connection the peer reset, and that kills the process, with no word of which peer died,
/// in a program that set SIGPIPE back to its default (a command line tool piped into `head`). Its
/// scalar writes go through `send` with the flag, as does this.
fn try_write_vectored_nosignal(half: &OwnedWriteHalf, parts: &[IoSlice<'_>]) -> io::Result<usize> {
    let stream: &TcpStream = half.as_ref();
    stream.try_io(Interest::WRITABLE, || {
        sendmsg::<()>(stream.as_raw_fd(), parts, &[], MsgFlags::MSG_NOSIGNAL, None).map_err(io::Error::from)
    })
}

/// Writes all of `bytes` to the shared write half, waiting whenever the socket is full.
async fn write_all(half: &OwnedWriteHalf, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        half.writable().await?;
        match half.try_write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(err) if matches!(err.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(err) => return Err(err),
        }
    }
    Ok(())
}

/// Reads frames from one peer and reports them, until the stream closes or misbehaves.
async fn read_loop(
    half: OwnedReadHalf,
    from: NodeId,
    events: UnboundedSender<LinkEvent>,
    limit: usize,
    counters: Arc<[Counters]>,
    pool: Arc<BufferPool>,
) {
    // This reader's budget; a frame larger than it takes all of it, and is read alone.
    let untaken = Arc::new(Semaphore::new(limit));
    let counters = &counters[from.idx()];
    let mut reader = BufReader::with_capacity(READ_BUFFER, half);
    let cause = loop {
        let mut header = [0; HEADER_LEN];
        match read_fully(&mut reader, &mut header).await {
            Ok(0) => break CloseCause::Eof,
            Ok(HEADER_LEN) => {}
            Ok(have) => {
                break CloseCause::Malformed(TransportError::TruncatedFrame {
                    have,
                    want: HEADER_LEN,
                    from: Some(from),
                });
            }
            Err(err) => break CloseCause::Error(err),
        }
        let len = match decode_header(header, Some(from)) {
            Ok(FrameLen::Goodbye) => break CloseCause::Goodbye,
            Ok(FrameLen::Payload(len)) => len,
            Err(err) => break CloseCause::Malformed(err),
        };
        // Before the payload is read (and its buffer allocated): wait while the frames not taken
        // hold the budget. A frame costs at least `FRAME_COST` whatever its size (its event and
        // buffer), so that a peer flooding 1-byte frames is bounded by memory too.
        let share = u32::try_from((HEADER_LEN + len).max(FRAME_COST).min(limit)).unwrap_or(u32::MAX);
        let Ok(permit) = Arc::clone(&untaken).acquire_many_owned(share).await else {
            unreachable!("the reader's semaphore is never closed")
        };
        // Into a recycled buffer's capacity, without zeroing it first (a small payload into one
        // of its own size, `SMALL_PAYLOAD`).
        let mut payload = if len <= SMALL_PAYLOAD { Vec::with_capacity(len) } else { pool.take(len) };
        payload.reserve_exact(len);
        match read_into(&mut reader, &mut payload, len).await {
            Ok(n) if n == len => {}
            Ok(n) => {
                break CloseCause::Malformed(TransportError::TruncatedFrame {
                    have: HEADER_LEN + n,
                    want: HEADER_LEN + len,
                    from: Some(from),
                });
            }
            Err(err) => break CloseCause::Error(err),
        }
        counters.add_received((HEADER_LEN + len) as u64);
        if events.send(LinkEvent::Frame { from, payload, untaken: Untaken(permit) }).is_err() {
            return; // Nobody listens any more.
        }
    };
    tracing::debug!(%from, ?cause, "link closed for reading");
    let _ = events.send(LinkEvent::Closed { from, cause });
}

/// Appends `len` bytes to `buf` (whose spare capacity they fill, uninitialized memory included)
/// unless the stream ends first; returns how many bytes were appended.
async fn read_into<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut Vec<u8>, len: usize) -> io::Result<usize> {
    let start = buf.len();
    let mut limited = reader.take(len as u64);
    while buf.len() - start < len {
        match limited.read_buf(buf).await {
            Ok(0) => break,
            Ok(_) => {}
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(buf.len() - start)
}

/// Fills `buf` unless the stream ends first; returns how many bytes were read.
async fn read_fully<R: AsyncRead + Unpin>(reader: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]).await {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
            Err(err) => return Err(err),
        }
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::SharedBytes;
    use crate::transport::codec::{decode_payload, encode_frame};
    use crate::transport::mesh::{MeshConfig, connect_mesh};
    use serde_bytes::ByteBuf;
    use std::future::Future;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::thread;
    use std::time::Instant;

    /// Bound on any single wait in these tests.
    const WAIT: Duration = Duration::from_secs(10);

    /// A real two-node mesh over loopback, meeting in two threads.
    fn two_meshes() -> (Mesh, Mesh) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let root = listener.local_addr().unwrap();
        let cfg = move |rank| MeshConfig {
            nprocs: 2,
            rank: NodeId(rank),
            root,
            root_name: None,
            fingerprint: "test".to_owned(),
            timeout: WAIT,
        };
        let peer = thread::spawn(move || connect_mesh(&cfg(1), None).unwrap());
        let zero = connect_mesh(&cfg(0), Some(listener)).unwrap();
        (zero, peer.join().unwrap())
    }

    /// Runs `f` on a fresh current-thread runtime, like the service thread does.
    fn on_runtime<F: Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    }

    async fn next_event(rx: &mut mpsc::UnboundedReceiver<LinkEvent>) -> LinkEvent {
        tokio::time::timeout(WAIT, rx.recv())
            .await
            .expect("no link event within the test bound")
            .expect("event channel closed")
    }

    fn frame_of<T: serde::Serialize>(msg: &T) -> Vec<u8> {
        let mut out = Vec::new();
        encode_frame(msg, &mut out).unwrap();
        out
    }

    fn echo_frame(payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
        out.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_le_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn body(i: u32) -> ByteBuf {
        ByteBuf::from((0..i % 300).map(|k| (k ^ i) as u8).collect::<Vec<_>>())
    }

    /// Node 1 echoes every frame until goodbye, then says goodbye itself.
    async fn echo_until_goodbye(mesh: Mesh) -> LinkCounters {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let links = Links::start(mesh, tx).unwrap();
        loop {
            match next_event(&mut rx).await {
                LinkEvent::Frame { from, payload, .. } => {
                    assert_eq!(from, NodeId(0));
                    links.send(from, echo_frame(&payload)).unwrap();
                }
                LinkEvent::Closed { from, cause } => {
                    assert_eq!(from, NodeId(0));
                    assert!(matches!(cause, CloseCause::Goodbye), "{cause:?}");
                    break;
                }
            }
        }
        links.goodbye();
        let counters = links.counters()[0];
        links.flush_and_close().await;
        counters
    }

    #[test]
    fn ping_pong_keeps_order_and_content_then_goodbye_closes() {
        let (zero, one) = two_meshes();
        let echo = thread::spawn(move || on_runtime(echo_until_goodbye(one)));
        let sent = on_runtime(async move {
            let (tx, mut rx) = mpsc::unbounded_channel();
            let links = Links::start(zero, tx).unwrap();
            // Strict ping-pong.
            for i in 0..1000u32 {
                links.send(NodeId(1), frame_of(&(i, body(i)))).unwrap();
                match next_event(&mut rx).await {
                    LinkEvent::Frame { from, payload, .. } => {
                        assert_eq!(from, NodeId(1));
                        let (j, b): (u32, ByteBuf) = decode_payload(&payload).unwrap();
                        assert_eq!((j, b), (i, body(i)));
                        // A small payload has a buffer of its size, never a pooled megabyte that
                        // a diff kept from it would hold out of the pool.
                        assert!(payload.capacity() <= SMALL_PAYLOAD, "{}", payload.capacity());
                    }
                    other => panic!("round {i}: {other:?}"),
                }
            }
            // A burst: queued faster than written, so the writer coalesces; order must hold.
            for i in 1000..3000u32 {
                links.send(NodeId(1), frame_of(&(i, body(i)))).unwrap();
            }
            for i in 1000..3000u32 {
                match next_event(&mut rx).await {
                    LinkEvent::Frame { payload, .. } => {
                        let (j, b): (u32, ByteBuf) = decode_payload(&payload).unwrap();
                        assert_eq!((j, b), (i, body(i)));
                    }
                    other => panic!("burst {i}: {other:?}"),
                }
            }
            links.goodbye();
            let err = links.send(NodeId(1), frame_of(&1u8)).unwrap_err();
            assert!(matches!(err, TransportError::LinkClosed { to: NodeId(1), .. }), "{err}");
            assert!(err.to_string().ends_with("the link is closed (a goodbye was sent on it)"), "{err}");
            match next_event(&mut rx).await {
                LinkEvent::Closed { from, cause } => {
                    assert_eq!(from, NodeId(1));
                    assert!(matches!(cause, CloseCause::Goodbye), "{cause:?}");
                }
                other => panic!("{other:?}"),
            }
            let counters = links.counters();
            links.flush_and_close().await;
            counters
        });
        let echoed = echo.join().unwrap();
        assert_eq!(sent[0], LinkCounters::default());
        assert_eq!(sent[1].frames_sent, 3000);
        assert_eq!(sent[1].frames_received, 3000);
        assert_eq!(sent[1].bytes_sent, sent[1].bytes_received);
        assert_eq!(echoed.frames_received, 3000);
        assert_eq!(echoed.bytes_received, sent[1].bytes_sent);
    }

    /// Frames `send` writes itself, in part when the socket is full, and frames queued behind
    /// the rest keep their order and content; the counters count each frame once.
    /// Node 1's raw stream from node 0, read by a thread only once `go` is sent: it returns the
    /// payloads of the frames up to the goodbye.
    fn late_raw_reader(one: &mut Mesh) -> (std::sync::mpsc::Sender<()>, thread::JoinHandle<Vec<Vec<u8>>>) {
        let mut raw = one.peers[0].take().expect("node 1's stream to node 0");
        let (go, wait) = std::sync::mpsc::channel::<()>();
        let reader = thread::spawn(move || {
            wait.recv().unwrap();
            raw.set_read_timeout(Some(WAIT)).unwrap();
            let mut frames = Vec::new();
            loop {
                let mut header = [0; HEADER_LEN];
                raw.read_exact(&mut header).unwrap();
                let len = match decode_header(header, None).unwrap() {
                    FrameLen::Goodbye => return frames,
                    FrameLen::Payload(len) => len,
                };
                let mut payload = vec![0; len];
                raw.read_exact(&mut payload).unwrap();
                frames.push(payload);
            }
        });
        (go, reader)
    }

    /// `got` (the payloads read) is `expected`, frame by frame, and `counters` counted them.
    fn assert_delivered(got: &[Vec<u8>], expected: &[Vec<u8>], counters: LinkCounters) {
        assert_eq!(got.len(), expected.len());
        for (i, (g, e)) in got.iter().zip(expected).enumerate() {
            assert!(g == e, "frame {i} differs ({} bytes, expected {})", g.len(), e.len());
        }
        assert_eq!(counters.frames_sent, expected.len() as u64);
        let bytes: usize = expected.iter().map(|e| e.len() + HEADER_LEN).sum();
        assert_eq!(counters.bytes_sent, bytes as u64);
    }

    /// Starts node 0's links (from `zero`) and, once the runtime has seen the socket to node 1
    /// writable (until then `send` leaves frames to the writer task), runs `body` on them
    /// without awaiting: the writer task writes nothing meanwhile, so every frame counted was
    /// written, in whole or in part, by `send` itself. Then lets node 1's reader go, and says
    /// goodbye and closes. Returns `body`'s value and the link's counters.
    fn to_late_reader<T>(
        zero: Mesh,
        go: std::sync::mpsc::Sender<()>,
        body: impl FnOnce(&Links, &Link) -> T,
    ) -> (T, LinkCounters) {
        on_runtime(async {
            let (tx, _rx) = mpsc::unbounded_channel();
            let links = Links::start(zero, tx).unwrap();
            let link = links.link(NodeId(1)).unwrap();
            tokio::time::timeout(WAIT, link.half.writable()).await.unwrap().unwrap();
            let out = body(&links, link);
            go.send(()).unwrap();
            links.goodbye();
            let counters = Arc::clone(&links.counters);
            links.flush_and_close().await;
            (out, counters[1].snapshot())
        })
    }

    /// A frame in parts carrying `payload`: its bytes from `SHARE_AT` on in slices of 5,000
    /// bytes by reference (the last one shorter), the rest in the head.
    fn parts_frame(payload: &[u8]) -> FrameParts {
        const SHARE_AT: usize = 100;
        let mut head = u32::try_from(payload.len()).unwrap().to_le_bytes().to_vec();
        head.extend_from_slice(&payload[..SHARE_AT.min(payload.len())]);
        let shared = (payload.get(SHARE_AT..).unwrap_or_default().chunks(5000))
            .map(|piece| (head.len(), SharedBytes::copy_of(piece)))
            .collect();
        FrameParts { head, shared }
    }

    #[test]
    fn frames_in_parts_arrive_whole_and_in_order_written_at_once_in_part_or_queued() {
        let (zero, mut one) = two_meshes();
        let (go, reader) = late_raw_reader(&mut one);
        let big = |tag: u8| (0..(3usize << 20) + 777).map(|i| (i % 253) as u8 ^ tag).collect::<Vec<u8>>();
        let mut expected = Vec::new();
        let (direct, counters) = to_late_reader(zero, go, |links, link| {
            // A small frame in parts goes at once; then big ones fill the socket (nobody reads),
            // so one is written in part and the rest queue, plain frames between them.
            expected.push(big(0)[..20_000].to_vec());
            links.send_parts(NodeId(1), parts_frame(expected.last().unwrap())).unwrap();
            let direct = link.unwritten.load(Ordering::Acquire) == 0;
            for round in 1..12u8 {
                expected.push(big(round));
                links.send_parts(NodeId(1), parts_frame(expected.last().unwrap())).unwrap();
                expected.push(vec![round; usize::from(round) * 7]);
                links.send(NodeId(1), echo_frame(expected.last().unwrap())).unwrap();
            }
            assert!(link.unwritten.load(Ordering::Acquire) > 0, "the socket never filled");
            direct
        });
        let got = reader.join().unwrap();
        assert!(direct, "the first frame was not written at once");
        assert_delivered(&got, &expected, counters);
    }

    #[test]
    fn frames_keep_order_when_a_direct_write_is_partial() {
        let (zero, mut one) = two_meshes();
        let (go, reader) = late_raw_reader(&mut one);
        // Odd sizes, so that a frame never fills the socket's buffers exactly.
        let big = |tag: u8| (0..(8usize << 20) + 12_345).map(|i| (i % 251) as u8 ^ tag).collect::<Vec<u8>>();
        let small = |i: u32| (0..i % 50 + 1).map(|k| (k ^ i) as u8).collect::<Vec<u8>>();
        let mut expected = Vec::new();
        let (partial, counters) = to_late_reader(zero, go, |links, link| {
            let mut partial = false;
            for round in 0..8u8 {
                expected.push(big(round));
                links.send(NodeId(1), echo_frame(expected.last().unwrap())).unwrap();
                expected.push(small(u32::from(round)));
                links.send(NodeId(1), echo_frame(expected.last().unwrap())).unwrap();
                if link.unwritten.load(Ordering::Acquire) > 0 {
                    // Nobody reads, so the buffers fill: the big frame was written in part
                    // (counted) or not at all.
                    partial = links.counters()[1].frames_sent == expected.len() as u64 - 1;
                    break;
                }
            }
            for i in 0..100 {
                expected.push(small(i + 1000));
                links.send(NodeId(1), echo_frame(expected.last().unwrap())).unwrap();
            }
            partial
        });
        let got = reader.join().unwrap();
        assert!(partial, "the first large frame was not left in part to the writer");
        assert_delivered(&got, &expected, counters);
    }

    #[test]
    fn buffer_pool_hands_out_fitting_buffers_and_stays_bounded() {
        let pool = BufferPool::default();
        assert_eq!(pool.take(10).capacity(), 0, "an empty pool makes new buffers");
        for cap in [100, 100 << 10, 1 << 20] {
            pool.give(Vec::with_capacity(cap));
        }
        assert_eq!(pool.bufs.lock().unwrap().len(), 2, "a small payload's buffer is not kept");
        let b = pool.take(4000);
        assert!(b.is_empty() && b.capacity() >= 100 << 10 && b.capacity() < 1 << 20, "smallest that fits");
        let b = pool.take(usize::MAX);
        assert!(b.capacity() >= 1 << 20, "nothing fits: the largest");
        let mut full = Vec::with_capacity(SMALL_PAYLOAD + 1);
        full.extend_from_slice(&[1, 2, 3]);
        pool.give(full);
        let b = pool.take(2);
        assert!(b.is_empty(), "buffers come back cleared");
        for _ in 0..2 * POOL_BUFFERS {
            pool.give(Vec::with_capacity(POOL_BYTES / 4));
        }
        let held = pool.bufs.lock().unwrap();
        assert!(held.len() <= POOL_BUFFERS);
        assert!(held.iter().map(Vec::capacity).sum::<usize>() <= POOL_BYTES);
    }

    #[test]
    fn a_reserved_pool_starts_with_backed_buffers() {
        let pool = BufferPool::reserved(3, 64 << 10);
        let bufs: Vec<Vec<u8>> = (0..3).map(|_| pool.take(10)).collect();
        for buf in &bufs {
            assert!(buf.is_empty() && buf.capacity() >= 64 << 10, "a reserved buffer, empty");
            let start = buf.as_ptr() as usize;
            for addr in (start.next_multiple_of(4096)..start + buf.capacity()).step_by(4096) {
                assert!(
                    crate::mem::tests::present(addr),
                    "a reserved buffer's page at {addr:#x} is not backed"
                );
            }
        }
        assert_eq!(pool.take(10).capacity(), 0, "three reserved, all taken");
    }

    #[test]
    fn big_frames_round_trip_through_recycled_buffers() {
        let (zero, one) = two_meshes();
        let echo = thread::spawn(move || on_runtime(echo_until_goodbye(one)));
        on_runtime(async move {
            let (tx, mut rx) = mpsc::unbounded_channel();
            let links = Links::start(zero, tx).unwrap();
            // Sizes that shrink and grow, so recycled buffers are both too big and too small.
            for (i, len) in [1 << 20, 10, 300_000, 3, 2 << 20, 70_000].into_iter().enumerate() {
                let body = ByteBuf::from((0..len).map(|k| (k * 7 + i) as u8).collect::<Vec<_>>());
                let mut frame = links.buffer();
                encode_frame(&body, &mut frame).unwrap();
                links.send(NodeId(1), frame).unwrap();
                let LinkEvent::Frame { payload, .. } = next_event(&mut rx).await else { panic!("closed") };
                assert_eq!(decode_payload::<ByteBuf>(&payload).unwrap(), body, "frame {i}");
                links.recycle(payload);
            }
            links.goodbye();
            let _ = next_event(&mut rx).await;
            links.flush_and_close().await;
        });
        echo.join().unwrap();
    }

    /// A peer sending faster than the receiver takes events: the reader holds at most its budget
    /// of frames not taken (their bytes read and counted), then reads on as events are taken;
    /// every frame arrives, in order. A frame larger than the budget is read alone.
    #[test]
    fn a_reader_holds_at_most_its_budget_of_frames_not_taken() {
        const LIMIT: usize = 256 << 10;
        const FRAMES: u32 = 256;
        let (zero, one) = two_meshes();
        let sender = thread::spawn(move || {
            on_runtime(async move {
                let (tx, mut rx) = mpsc::unbounded_channel();
                let links = Links::start(one, tx).unwrap();
                for i in 0..FRAMES {
                    links.send(NodeId(0), frame_of(&(i, ByteBuf::from(vec![i as u8; 16 << 10])))).unwrap();
                }
                links.send(NodeId(0), frame_of(&(FRAMES, ByteBuf::from(vec![1u8; 2 * LIMIT])))).unwrap();
                links.goodbye();
                loop {
                    if let LinkEvent::Closed { .. } = next_event(&mut rx).await {
                        break;
                    }
                }
                links.flush_and_close().await;
            })
        });
        on_runtime(async move {
            let (tx, mut rx) = mpsc::unbounded_channel();
            let links = Links::start_with_limit(zero, tx, LIMIT).unwrap();
            let read = || links.counters()[1].bytes_received as usize;
            // The reader fills its budget (bounded wait), and goes no further while nothing is taken.
            let deadline = tokio::time::Instant::now() + WAIT;
            while read() + (16 << 10) + 64 < LIMIT {
                assert!(tokio::time::Instant::now() < deadline, "the reader stopped at {} bytes", read());
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            for _ in 0..20 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                assert!(read() <= LIMIT, "{} bytes read and not taken, the budget is {LIMIT}", read());
            }
            for i in 0..=FRAMES {
                let LinkEvent::Frame { payload, .. } = next_event(&mut rx).await else {
                    panic!("closed at {i}")
                };
                let (got, body): (u32, ByteBuf) = decode_payload(&payload).unwrap();
                assert_eq!(got, i);
                assert_eq!(body.len(), if i < FRAMES { 16 << 10 } else { 2 * LIMIT });
            }
            assert!(matches!(
                next_event(&mut rx).await,
                LinkEvent::Closed { cause: CloseCause::Goodbye, .. }
            ));
            links.goodbye();
            links.flush_and_close().await;
        });
        sender.join().unwrap();
    }

    #[test]
    fn send_to_self_or_out_of_range_is_an_error() {
        let (zero, _one) = two_meshes();
        on_runtime(async move {
            let (tx, _rx) = mpsc::unbounded_channel();
            let links = Links::start(zero, tx).unwrap();
            for to in [NodeId(0), NodeId(2)] {
                let err = links.send(to, frame_of(&1u8)).unwrap_err();
                assert!(matches!(err, TransportError::NoSuchLink { .. }), "{err}");
            }
        });
    }

    /// A write that fails stops the link, and its error is the cause a later send reports.
    #[test]
    fn a_failed_write_is_the_cause_of_the_closed_link() {
        let (zero, mut one) = two_meshes();
        drop(one.peers[0].take());
        on_runtime(async move {
            let (tx, _rx) = mpsc::unbounded_channel();
            let links = Links::start(zero, tx).unwrap();
            let deadline = tokio::time::Instant::now() + WAIT;
            let err = loop {
                match links.send(NodeId(1), frame_of(&ByteBuf::from(vec![7u8; 64 << 10]))) {
                    Ok(()) => {
                        assert!(tokio::time::Instant::now() < deadline, "sends to a closed peer never failed")
                    }
                    Err(e) => break e,
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            };
            let TransportError::LinkClosed { to: NodeId(1), why, .. } = &err else { panic!("{err}") };
            assert!(why.starts_with("writing to it failed: "), "{err}");
            assert_eq!(links.write_error(NodeId(1)), why.strip_prefix("writing to it failed: "));
            assert_eq!(links.write_error(NodeId(0)), None);
        });
    }

    /// A vectored write to a peer that reset raises no SIGPIPE, which kills a program that set
    /// it back to its default: blocked on this thread (the runtime's), it would stay pending.
    #[test]
    fn a_vectored_write_to_a_reset_peer_raises_no_sigpipe() {
        use nix::sys::signal::{SigSet, Signal};
        use nix::sys::signalfd::{SfdFlags, SignalFd};
        let mut pipe = SigSet::empty();
        pipe.add(Signal::SIGPIPE);
        pipe.thread_block().unwrap();
        let raised = SignalFd::with_flags(&pipe, SfdFlags::SFD_NONBLOCK).unwrap();
        let (zero, mut one) = two_meshes();
        drop(one.peers[0].take());
        let sent = on_runtime(async move {
            let (tx, _rx) = mpsc::unbounded_channel();
            let links = Links::start(zero, tx).unwrap();
            let deadline = tokio::time::Instant::now() + WAIT;
            let mut direct = 0;
            while tokio::time::Instant::now() < deadline {
                let link = links.links[1].as_ref().unwrap();
                direct += usize::from(link.unwritten.load(Ordering::Acquire) == 0);
                if links.send_parts(NodeId(1), parts_frame(&[3u8; 20_000])).is_err() {
                    return direct;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            panic!("sends to a closed peer never failed");
        });
        let got = raised.read_signal().unwrap();
        pipe.thread_unblock().unwrap();
        assert!(sent >= 2, "only {sent} frames were written directly");
        assert!(got.is_none(), "a send to the reset peer raised {got:?}");
    }

    /// Node 0 runs Links; node 1 plays with its raw stream via `peer`. Returns node 0's events.
    fn against_raw_peer(peer: impl FnOnce(std::net::TcpStream) + Send + 'static) -> Vec<LinkEvent> {
        let (zero, mut one) = two_meshes();
        let stream = one.peers[0].take().unwrap();
        let raw = thread::spawn(move || peer(stream));
        let events = on_runtime(async move {
            let (tx, mut rx) = mpsc::unbounded_channel();
            let _links = Links::start(zero, tx).unwrap();
            let mut events = Vec::new();
            loop {
                let event = next_event(&mut rx).await;
                let closed = matches!(event, LinkEvent::Closed { .. });
                events.push(event);
                if closed {
                    break events;
                }
            }
        });
        raw.join().unwrap();
        events
    }

    #[test]
    fn dropping_the_stream_without_goodbye_is_eof() {
        let events = against_raw_peer(|mut stream| {
            stream.write_all(&frame_of(&42u64)).unwrap();
            drop(stream);
        });
        let [LinkEvent::Frame { payload, .. }, LinkEvent::Closed { from, cause }] = &events[..] else {
            panic!("{events:?}");
        };
        assert_eq!(decode_payload::<u64>(payload).unwrap(), 42);
        assert_eq!(*from, NodeId(1));
        assert!(matches!(cause, CloseCause::Eof), "{cause:?}");
    }

    #[test]
    fn oversize_header_is_malformed() {
        let events = against_raw_peer(|mut stream| {
            stream.write_all(&80_000_000u32.to_le_bytes()).unwrap();
            // Keep the stream open until node 0 has given up on it.
            let mut rest = Vec::new();
            let _ = stream.read_to_end(&mut rest);
        });
        let [LinkEvent::Closed { from, cause }] = &events[..] else {
            panic!("{events:?}");
        };
        assert_eq!(*from, NodeId(1));
        let CloseCause::Malformed(err) = cause else {
            panic!("{cause:?}");
        };
        assert!(
            matches!(err, TransportError::FrameTooLarge { len: 80_000_000, from: Some(NodeId(1)) }),
            "{err}"
        );
        assert_eq!(err.to_string(), "frame of 80000000 bytes from node 1 exceeds the 64 MiB limit");
    }

    #[test]
    fn stream_cut_inside_a_frame_is_malformed() {
        let events = against_raw_peer(|mut stream| {
            let frame = frame_of(&ByteBuf::from(vec![7u8; 100]));
            stream.write_all(&frame[..50]).unwrap();
        });
        let [LinkEvent::Closed { cause, .. }] = &events[..] else {
            panic!("{events:?}");
        };
        assert!(
            matches!(
                cause,
                CloseCause::Malformed(TransportError::TruncatedFrame { have: 50, want: 105, .. })
            ),
            "{cause:?}"
        );
    }

    /// Round-trip time of a 64-byte frame: Links on two current-thread runtimes vs. raw blocking
    /// std streams. Run with
    /// `cargo test --release -p treadmarks transport::link::tests::rtt -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement, not a check"]
    fn rtt_links_vs_raw_std() {
        const ROUNDS: u32 = 10_000;
        const WARMUP: u32 = 1_000;
        let ping = frame_of(&ByteBuf::from(vec![0xA5u8; 59])); // 4 + 1 (length) + 59 = 64 bytes
        assert_eq!(ping.len(), 64);

        // Links.
        let (zero, one) = two_meshes();
        let echo = thread::spawn(move || on_runtime(echo_until_goodbye(one)));
        let links_us = on_runtime({
            let ping = ping.clone();
            async move {
                let (tx, mut rx) = mpsc::unbounded_channel();
                let links = Links::start(zero, tx).unwrap();
                let mut start = Instant::now();
                for i in 0..WARMUP + ROUNDS {
                    if i == WARMUP {
                        start = Instant::now();
                    }
                    links.send(NodeId(1), ping.clone()).unwrap();
                    let LinkEvent::Frame { payload, .. } = next_event(&mut rx).await else {
                        panic!("link closed");
                    };
                    assert_eq!(payload.len(), 60);
                }
                let mean = start.elapsed().as_secs_f64() * 1e6 / f64::from(ROUNDS);
                links.goodbye();
                let _ = next_event(&mut rx).await;
                links.flush_and_close().await;
                mean
            }
        });
        echo.join().unwrap();

        // Raw blocking std streams.
        let (mut zero, mut one) = two_meshes();
        let mut a = zero.peers[1].take().unwrap();
        let mut b = one.peers[0].take().unwrap();
        let echo = thread::spawn(move || {
            let mut buf = [0u8; 64];
            for _ in 0..WARMUP + ROUNDS {
                b.read_exact(&mut buf).unwrap();
                b.write_all(&buf).unwrap();
            }
        });
        let mut buf = [0u8; 64];
        let mut start = Instant::now();
        for i in 0..WARMUP + ROUNDS {
            if i == WARMUP {
                start = Instant::now();
            }
            a.write_all(&ping).unwrap();
            a.read_exact(&mut buf).unwrap();
        }
        let raw_us = start.elapsed().as_secs_f64() * 1e6 / f64::from(ROUNDS);
        echo.join().unwrap();

        println!(
            "64-byte frame round trip, mean of {ROUNDS}: Links {links_us:.1} µs, raw std TcpStream {raw_us:.1} µs ({:.2}x)",
            links_us / raw_us
        );
    }
}
