//! The multi-node figures. Every node of the job calls [`run`] with the same sequence of
//! collective calls; node 0 times and gets the [`JobReport`], node 1 is the partner of every
//! two-party figure, and any further nodes only take part in the barriers.
//!
//! | figure | what node 0 times |
//! |---|---|
//! | `raw_rtt` | 64-byte write + 64-byte read over a plain blocking TCP socket to an echo thread of node 1 |
//! | `raw_rtt_polled` | the same over a second socket, both ends polling it as the runtime polls its own (node 0 spins while it waits; node 1's echo thread spins for node 1's service-thread budget (`Tmk::service_spin`) after each message, then blocks) |
//! | `ping` | `tmk.ping(1)`: app thread → runtime → node 1's runtime → back |
//! | `lock` | `lock_acquire(1)` with the token at node 1, lock 1's manager (1 request, 1 grant) |
//! | `barrier` | `barrier(0)`, back to back |
//! | `diff_miss` | the first read of a page node 1 wrote before the last barrier (1 diff fetched) |
//! | `local_lock` | `lock_acquire(0)` + `lock_release(0)` with the token at node 0, per pair (batches of [`LOCAL_BATCH`]) |
//!
//! Node 1 tells node 0 its budget over the polled socket once connected. At the start of every
//! round node 0 waits out that budget before the raw round trips: node 1's application goes
//! straight into a barrier, where its service thread polls for the budget on node 1's CPU, which
//! the echo threads share (they inherit the application thread's pinning), so a first round trip
//! sent at once would wait for the poll to end.

use crate::Result;
use crate::summary::Summary;
use std::hint::black_box;
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};
use treadmarks::protocol::MsgKind;
use treadmarks::{Shared, Stats, Tmk};

/// The lock of the `lock` figure: its manager is node `1 % nprocs` = node 1.
pub const LOCK: u32 = 1;
/// The lock of the `local_lock` figure: node 0 manages it and nobody else takes it.
pub const LOCAL_LOCK: u32 = 0;
/// Lock and release pairs per `local_lock` sample (one pair is too short to time alone).
pub const LOCAL_BATCH: u32 = 1000;
const BARRIER: u32 = 0;
const RAW_MSG: usize = 64;
/// Bound on any single blocking socket operation of the raw round trip (and on node 1's connect).
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long node 0 pauses before a "settled" measurement (see [`JobReport::lock_settled`]).
pub const SETTLE: Duration = Duration::from_micros(300);

/// Iteration counts (fixed, no adaptive loops) and the page size. Node 0's are distributed, so
/// the other nodes may pass anything. The figures are measured in `rounds` interleaved rounds
/// (each round runs every figure once with `figure / rounds` iterations) after one warm-up
/// round of `warmup` iterations each, so a change of the machine's mood (vCPU placement, host
/// load) hits every figure alike and the ratios stay meaningful.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Params {
    pub rounds: u64,
    pub warmup: u64,
    pub raw_rtt: u64,
    pub ping: u64,
    pub lock: u64,
    pub barrier: u64,
    pub diff_miss: u64,
    pub settled: u64,
    /// Samples (batches) of the `local_lock` figure.
    pub local_lock: u64,
    pub page_size: u64,
}

impl Params {
    fn to_array(self) -> [u64; 10] {
        [
            self.rounds,
            self.warmup,
            self.raw_rtt,
            self.ping,
            self.lock,
            self.barrier,
            self.diff_miss,
            self.settled,
            self.local_lock,
            self.page_size,
        ]
    }

    fn from_array(a: [u64; 10]) -> Params {
        let [rounds, warmup, raw_rtt, ping, lock, barrier, diff_miss, settled, local_lock, page_size] = a;
        Params { rounds, warmup, raw_rtt, ping, lock, barrier, diff_miss, settled, local_lock, page_size }
    }

    /// Iterations per round of a figure with `total` iterations.
    fn per_round(&self, total: u64) -> u64 {
        total / self.rounds.max(1)
    }
}

/// Node 0's counters that the per-operation figures come from, summed over the timed rounds.
#[derive(Clone, Debug, Default)]
struct Counts {
    sent: Vec<u64>,
    received: Vec<u64>,
    read_misses: u64,
    diffs_applied: u64,
    lock_acquires_remote: u64,
    barriers: u64,
}

impl Counts {
    fn of(s: &Stats) -> Counts {
        Counts {
            sent: s.sent_by_kind.iter().map(|t| t.msgs).collect(),
            received: s.received_by_kind.iter().map(|t| t.msgs).collect(),
            read_misses: s.protocol.read_misses,
            diffs_applied: s.protocol.diffs_applied,
            lock_acquires_remote: s.protocol.lock_acquires_remote,
            barriers: s.protocol.barriers,
        }
    }

    /// Adds `after - before`.
    fn add_delta(&mut self, before: &Counts, after: &Counts) {
        let grow = |v: &mut Vec<u64>, b: &[u64], a: &[u64]| {
            v.resize(a.len(), 0);
            for (i, x) in v.iter_mut().enumerate() {
                *x += a[i] - b[i];
            }
        };
        grow(&mut self.sent, &before.sent, &after.sent);
        grow(&mut self.received, &before.received, &after.received);
        self.read_misses += after.read_misses - before.read_misses;
        self.diffs_applied += after.diffs_applied - before.diffs_applied;
        self.lock_acquires_remote += after.lock_acquires_remote - before.lock_acquires_remote;
        self.barriers += after.barriers - before.barriers;
    }
}

/// Node 0's samples and counter deltas of one figure, over the timed rounds.
#[derive(Debug, Default)]
struct Acc {
    samples: Vec<Duration>,
    ops: u64,
    counts: Counts,
}

impl Acc {
    fn figure(&self) -> Figure {
        Figure { time: Summary::of(&self.samples), per_op: PerOp::of(&self.counts, self.ops) }
    }
}

/// Node 0 records while timed: samples and the counter delta around the phase.
struct Recorder<'a> {
    acc: Option<&'a mut Acc>,
    before: Option<Counts>,
}

impl<'a> Recorder<'a> {
    /// Starts recording on node 0 of a timed round (`acc` given); otherwise records nothing.
    fn start(tmk: &mut Tmk, acc: Option<&'a mut Acc>) -> Result<Recorder<'a>> {
        let before = match (&acc, tmk.proc_id()) {
            (Some(_), 0) => Some(Counts::of(&tmk.stats()?)),
            _ => None,
        };
        Ok(Recorder { acc, before })
    }

    fn sample(&mut self, d: Duration) {
        if let (Some(acc), Some(_)) = (&mut self.acc, &self.before) {
            acc.samples.push(d);
        }
    }

    fn finish(self, tmk: &mut Tmk, ops: u64) -> Result<()> {
        if let (Some(acc), Some(before)) = (self.acc, self.before) {
            acc.counts.add_delta(&before, &Counts::of(&tmk.stats()?));
            acc.ops += ops;
        }
        Ok(())
    }
}

/// Messages of one kind node 0 sent and received, per operation.
#[derive(Clone, Copy, Debug)]
pub struct KindRate {
    pub kind: MsgKind,
    pub sent: f64,
    pub received: f64,
}

/// What one timed phase cost node 0, per operation (from [`Tmk::stats`] deltas).
#[derive(Clone, Debug, Default)]
pub struct PerOp {
    /// Message kinds node 0 sent or received during the phase.
    pub msgs: Vec<KindRate>,
    pub read_misses: f64,
    pub diffs_applied: f64,
    pub lock_acquires_remote: f64,
    pub barriers: f64,
}

impl PerOp {
    fn of(c: &Counts, ops: u64) -> PerOp {
        let per = |x: u64| x as f64 / ops.max(1) as f64;
        let msgs = MsgKind::ALL
            .iter()
            .enumerate()
            .filter_map(|(i, &kind)| {
                let (s, r) = (c.sent.get(i).copied().unwrap_or(0), c.received.get(i).copied().unwrap_or(0));
                (s + r > 0).then(|| KindRate { kind, sent: per(s), received: per(r) })
            })
            .collect();
        PerOp {
            msgs,
            read_misses: per(c.read_misses),
            diffs_applied: per(c.diffs_applied),
            lock_acquires_remote: per(c.lock_acquires_remote),
            barriers: per(c.barriers),
        }
    }

    /// Messages node 0 sent plus received, per operation.
    pub fn total_msgs(&self) -> f64 {
        self.msgs.iter().map(|k| k.sent + k.received).sum()
    }
}

/// A timed figure and what it cost in messages.
#[derive(Clone, Debug)]
pub struct Figure {
    pub time: Summary,
    pub per_op: PerOp,
}

/// One node's totals at the end of the job (before the last barrier and exit).
#[derive(Clone, Copy, Debug, Default)]
pub struct NodeTotals {
    pub node: usize,
    pub sent_msgs: u64,
    pub sent_bytes: u64,
    pub received_msgs: u64,
    pub received_bytes: u64,
    pub fast_write_faults: u64,
    pub fault_handoffs: u64,
    pub read_misses: u64,
    pub diffs_applied: u64,
}

impl NodeTotals {
    const WORDS: usize = 8;

    fn of(node: usize, s: &Stats) -> NodeTotals {
        let received = s.received_by_kind.iter().fold((0, 0), |(m, b), t| (m + t.msgs, b + t.bytes));
        NodeTotals {
            node,
            sent_msgs: s.sent().msgs,
            sent_bytes: s.sent().bytes,
            received_msgs: received.0,
            received_bytes: received.1,
            fast_write_faults: s.fast_write_faults,
            fault_handoffs: s.fault_handoffs,
            read_misses: s.protocol.read_misses,
            diffs_applied: s.protocol.diffs_applied,
        }
    }

    fn to_words(self) -> [u64; Self::WORDS] {
        [
            self.sent_msgs,
            self.sent_bytes,
            self.received_msgs,
            self.received_bytes,
            self.fast_write_faults,
            self.fault_handoffs,
            self.read_misses,
            self.diffs_applied,
        ]
    }

    fn from_words(node: usize, w: &[u64]) -> NodeTotals {
        NodeTotals {
            node,
            sent_msgs: w[0],
            sent_bytes: w[1],
            received_msgs: w[2],
            received_bytes: w[3],
            fast_write_faults: w[4],
            fault_handoffs: w[5],
            read_misses: w[6],
            diffs_applied: w[7],
        }
    }
}

/// Everything node 0 measured.
#[derive(Clone, Debug)]
pub struct JobReport {
    pub nprocs: usize,
    pub params: Params,
    pub raw_rtt: Summary,
    /// `raw_rtt` with both ends polling (for information).
    pub raw_rtt_polled: Summary,
    /// How long node 1's echo thread polled after each message of `raw_rtt_polled`: node 1's
    /// service-thread budget (`Tmk::service_spin`).
    pub poll_budget: Duration,
    pub ping: Figure,
    pub lock: Figure,
    pub barrier: Figure,
    pub diff_miss: Figure,
    /// `lock` and `diff_miss` again, with node 0 pausing [`SETTLE`] after the barrier before it
    /// times, so every other thread is idle (blocked) when it starts: the cost when each hop
    /// has to wake a sleeping thread (and, in a VM, maybe a halted vCPU).
    pub lock_settled: Figure,
    pub diff_miss_settled: Figure,
    /// Per lock and release pair with the token here, no message (what a lock walk like water's
    /// costs per lock beyond its own work).
    pub local_lock: Summary,
    pub nodes: Vec<NodeTotals>,
}

impl JobReport {
    /// The figures as `(name, µs)` pairs for the JSON line: `<figure>_us` and `<figure>_p50_us`,
    /// and node 1's polling budget, `raw_rtt_polled_budget_us`.
    pub fn fields(&self) -> Vec<(String, f64)> {
        let mut out = vec![
            ("nprocs".to_string(), self.nprocs as f64),
            ("raw_rtt_polled_budget_us".to_string(), self.poll_budget.as_secs_f64() * 1e6),
        ];
        for (name, s) in self.summaries() {
            out.push((format!("{name}_us"), s.mean_us));
            out.push((format!("{name}_p50_us"), s.p50_us));
        }
        out
    }

    /// The timed figures by name.
    pub fn summaries(&self) -> [(&'static str, Summary); 9] {
        [
            ("raw_rtt", self.raw_rtt),
            ("raw_rtt_polled", self.raw_rtt_polled),
            ("ping", self.ping.time),
            ("lock", self.lock.time),
            ("barrier", self.barrier.time),
            ("diff_miss", self.diff_miss.time),
            ("lock_settled", self.lock_settled.time),
            ("diff_miss_settled", self.diff_miss_settled.time),
            ("local_lock", self.local_lock),
        ]
    }
}

/// Runs every figure on this node. Node 0's `proposed` parameters are used by all nodes;
/// `service_spin` is this node's service-thread budget (`Tmk::service_spin`), node 1's the one its
/// polling echo uses. Returns the report on node 0, `None` elsewhere. Needs at least two nodes.
pub fn run(tmk: &mut Tmk, proposed: Params, service_spin: Duration) -> Result<Option<JobReport>> {
    if tmk.nprocs() < 2 {
        return Err("the job figures need at least two nodes".into());
    }
    let mut a = proposed.to_array();
    tmk.distribute(&mut a)?;
    let p = Params::from_array(a);
    if p.page_size < 8 || !p.page_size.is_power_of_two() || p.rounds == 0 {
        return Err(format!("bad parameters {p:?}").into());
    }
    let me = tmk.proc_id();

    // The raw sockets: node 0 listens on two ephemeral ports and distributes them; node 1
    // connects to each and echoes from a plain thread until node 0 closes, blocking on the
    // first, polling the second for its budget, which it sends node 0 first.
    let listeners = if me == 0 {
        Some([TcpListener::bind(("127.0.0.1", 0))?, TcpListener::bind(("127.0.0.1", 0))?])
    } else {
        None
    };
    let mut ports: [u16; 2] = [0; 2];
    if let Some(ls) = &listeners {
        ports = [ls[0].local_addr()?.port(), ls[1].local_addr()?.port()];
    }
    tmk.distribute(&mut ports)?;
    let echoes = if me == 1 {
        let connect = |port: u16| -> Result<TcpStream> {
            let s = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), IO_TIMEOUT)?;
            s.set_nodelay(true)?;
            s.set_read_timeout(Some(IO_TIMEOUT))?;
            Ok(s)
        };
        let (blocking, mut polled) = (connect(ports[0])?, connect(ports[1])?);
        let budget = u64::try_from(service_spin.as_micros()).unwrap_or(u64::MAX);
        polled.write_all(&budget.to_le_bytes())?;
        Some([
            std::thread::spawn(move || echo(blocking)),
            std::thread::spawn(move || echo_polled(polled, service_spin)),
        ])
    } else {
        None
    };
    let (mut raw, mut polled) = match listeners {
        Some([l, p]) => (Some(accept(l)?), Some(accept(p)?)),
        None => (None, None),
    };
    let mut poll_budget = Duration::ZERO;
    if let Some(s) = &mut polled {
        let mut us = [0u8; 8];
        s.read_exact(&mut us).map_err(|e| format!("node 1 did not send its polling budget: {e}"))?;
        poll_budget = Duration::from_micros(u64::from_le_bytes(us));
    }

    // Fresh pages for every diff miss: warm-up and timed, normal and settled.
    let words = (p.page_size / 8) as usize;
    let pages = (p.warmup + p.diff_miss) + (p.warmup + p.settled);
    let mut data: Shared<[u64]> = Shared::from_raw_parts(0, 0);
    if me == 0 {
        data = tmk.alloc_pages::<u64>(pages as usize * words)?;
    }
    tmk.distribute(&mut data)?;
    let mut pages = Pages { data, words, next: 0 };

    let mut acc: [Acc; 9] = Default::default();
    let [raw_acc, ping_acc, lock_acc, barrier_acc, diff_acc, lock_s_acc, diff_s_acc, local_acc, polled_acc] =
        &mut acc;
    for round in 0..=p.rounds {
        // Round 0 warms up: nothing is recorded.
        let timed = round > 0;
        let n = |total: u64| if timed { p.per_round(total) } else { p.warmup };
        tmk.barrier(BARRIER)?;
        if raw.is_some() && !poll_budget.is_zero() {
            // Node 1's service thread polls this long in the barrier it has just entered.
            std::thread::sleep(poll_budget + SETTLE);
        }
        if let Some(s) = &mut raw {
            round_trips(s, n(p.raw_rtt), false, pick(timed, raw_acc))?;
        }
        if let Some(s) = &mut polled {
            round_trips(s, n(p.raw_rtt), true, pick(timed, polled_acc))?;
        }
        ping(tmk, n(p.ping), pick(timed, ping_acc))?;
        lock(tmk, n(p.lock), None, pick(timed, lock_acc))?;
        barrier(tmk, n(p.barrier), pick(timed, barrier_acc))?;
        diff_miss(tmk, &mut pages, n(p.diff_miss), None, pick(timed, diff_acc))?;
        lock(tmk, n(p.settled), Some(SETTLE), pick(timed, lock_s_acc))?;
        diff_miss(tmk, &mut pages, n(p.settled), Some(SETTLE), pick(timed, diff_s_acc))?;
        local_lock(tmk, n(p.local_lock), pick(timed, local_acc))?;
    }
    drop((raw, polled));
    tmk.barrier(BARRIER)?;
    // Both joined, the first failure reported.
    let ended: Vec<_> = echoes.into_iter().flatten().map(|h| h.join()).collect();
    for e in ended {
        e.map_err(|_| "an echo thread panicked")??;
    }
    let nodes = totals(tmk, &p)?;
    if me != 0 {
        return Ok(None);
    }
    Ok(Some(JobReport {
        nprocs: tmk.nprocs(),
        params: p,
        raw_rtt: Summary::of(&acc[0].samples),
        raw_rtt_polled: Summary::of(&acc[8].samples),
        poll_budget,
        ping: acc[1].figure(),
        lock: acc[2].figure(),
        barrier: acc[3].figure(),
        diff_miss: acc[4].figure(),
        lock_settled: acc[5].figure(),
        diff_miss_settled: acc[6].figure(),
        local_lock: Summary::of(&acc[7].samples),
        nodes,
    }))
}

fn pick(timed: bool, acc: &mut Acc) -> Option<&mut Acc> {
    timed.then_some(acc)
}

fn echo(mut s: TcpStream) -> std::io::Result<()> {
    let mut buf = [0u8; RAW_MSG];
    loop {
        match s.read_exact(&mut buf) {
            Ok(()) => s.write_all(&buf)?,
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Echoes 64-byte messages until the stream ends, polling: after each message it spins on the
/// nonblocking socket for `budget`, then waits in a blocking read (bounded by the socket's
/// timeout) until the next one comes.
fn echo_polled(s: TcpStream, budget: Duration) -> std::io::Result<()> {
    let mut buf = [0u8; RAW_MSG];
    s.set_nonblocking(true)?;
    while read_polled(&s, &mut buf, budget)? {
        write_polled(&s, &buf)?;
    }
    Ok(())
}

/// Fills `buf` from the nonblocking socket `s`, spinning for at most `budget` before it blocks
/// (and makes `s` nonblocking again); false if the stream ended first.
fn read_polled(mut s: &TcpStream, buf: &mut [u8], budget: Duration) -> std::io::Result<bool> {
    let start = Instant::now();
    let mut filled = 0;
    while filled < buf.len() {
        match s.read(&mut buf[filled..]) {
            Ok(0) => return Ok(false),
            Ok(k) => filled += k,
            Err(e) if e.kind() == ErrorKind::WouldBlock && start.elapsed() < budget => std::hint::spin_loop(),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                // Out of budget: wait for the rest in a blocking read.
                s.set_nonblocking(false)?;
                let r = s.read_exact(&mut buf[filled..]);
                s.set_nonblocking(true)?;
                return match r {
                    Ok(()) => Ok(true),
                    Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(false),
                    Err(e) => Err(e),
                };
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Writes all of `buf` to the nonblocking socket `s`, spinning while it is full (for at most
/// [`IO_TIMEOUT`]).
fn write_polled(mut s: &TcpStream, mut buf: &[u8]) -> std::io::Result<()> {
    let start = Instant::now();
    while !buf.is_empty() {
        match s.write(buf) {
            Ok(k) => buf = &buf[k..],
            Err(e) if e.kind() == ErrorKind::WouldBlock && start.elapsed() < IO_TIMEOUT => {
                std::hint::spin_loop()
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Accepts node 1's connection on `listener` (waiting a bounded time), as a blocking
/// socket with `TCP_NODELAY` and an I/O timeout.
pub fn accept(listener: TcpListener) -> Result<TcpStream> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + IO_TIMEOUT;
    let s = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(format!("node 1 did not connect to node 0's raw socket: {e}").into()),
        }
    };
    s.set_nonblocking(false)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    Ok(s)
}

/// Node 0 only: `n` round trips of 64 bytes to node 1's echo thread on `s`: blocking, or with
/// `polled` spinning for each answer (for at most [`IO_TIMEOUT`], then blocking) against the
/// polling echo thread.
fn round_trips(s: &mut TcpStream, n: u64, polled: bool, acc: Option<&mut Acc>) -> Result<()> {
    let name = if polled { "raw_rtt_polled" } else { "raw_rtt" };
    let (mut out, mut back) = ([0u8; RAW_MSG], [0u8; RAW_MSG]);
    let mut samples = Vec::with_capacity(n as usize);
    s.set_nonblocking(polled)?;
    for i in 0..n {
        out.fill(i as u8 ^ u8::from(polled));
        let t = Instant::now();
        if polled {
            write_polled(s, &out)?;
            if !read_polled(s, &mut back, IO_TIMEOUT)? {
                return Err(format!("{name}: node 1 closed the socket at round trip {i}").into());
            }
        } else {
            s.write_all(&out)?;
            s.read_exact(&mut back)?;
        }
        samples.push(t.elapsed());
        if back != out {
            return Err(format!("{name}: round trip {i} came back altered").into());
        }
    }
    if let Some(acc) = acc {
        acc.samples.extend(samples);
        acc.ops += n;
    }
    Ok(())
}

/// Node 0 pings node 1 `n` times while the others wait in a barrier.
fn ping(tmk: &mut Tmk, n: u64, acc: Option<&mut Acc>) -> Result<()> {
    tmk.barrier(BARRIER)?;
    let mut rec = Recorder::start(tmk, acc)?;
    if tmk.proc_id() == 0 {
        for _ in 0..n {
            let t = Instant::now();
            tmk.ping(1)?;
            rec.sample(t.elapsed());
        }
    }
    rec.finish(tmk, n)?;
    tmk.barrier(BARRIER)?;
    Ok(())
}

/// Per iteration: node 1 takes and releases lock 1 (so the token rests at node 1, its manager),
/// barrier, node 0 (after pausing `settle`, if given) times its acquire alone and releases,
/// barrier.
fn lock(tmk: &mut Tmk, n: u64, settle: Option<Duration>, acc: Option<&mut Acc>) -> Result<()> {
    let me = tmk.proc_id();
    let mut rec = Recorder::start(tmk, acc)?;
    for _ in 0..n {
        if me == 1 {
            tmk.lock_acquire(LOCK)?;
            tmk.lock_release(LOCK)?;
        }
        tmk.barrier(BARRIER)?;
        if me == 0 {
            if let Some(d) = settle {
                std::thread::sleep(d);
            }
            let t = Instant::now();
            tmk.lock_acquire(LOCK)?;
            rec.sample(t.elapsed());
            tmk.lock_release(LOCK)?;
        }
        tmk.barrier(BARRIER)?;
    }
    rec.finish(tmk, n)
}

/// Node 0 only: `n` batches of [`LOCAL_BATCH`] acquires and releases of [`LOCAL_LOCK`], whose
/// token it holds; a sample is a batch's time per pair.
fn local_lock(tmk: &mut Tmk, n: u64, acc: Option<&mut Acc>) -> Result<()> {
    if tmk.proc_id() != 0 {
        return Ok(());
    }
    let mut samples = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let t = Instant::now();
        for _ in 0..LOCAL_BATCH {
            tmk.lock_acquire(LOCAL_LOCK)?;
            tmk.lock_release(LOCAL_LOCK)?;
        }
        samples.push(t.elapsed() / LOCAL_BATCH);
    }
    if let Some(acc) = acc {
        acc.samples.extend(samples);
        acc.ops += n * u64::from(LOCAL_BATCH);
    }
    Ok(())
}

/// Every node calls `barrier(0)` back to back `n` times; node 0 (the barrier manager) times each.
fn barrier(tmk: &mut Tmk, n: u64, acc: Option<&mut Acc>) -> Result<()> {
    let mut rec = Recorder::start(tmk, acc)?;
    for _ in 0..n {
        let t = Instant::now();
        tmk.barrier(BARRIER)?;
        rec.sample(t.elapsed());
    }
    rec.finish(tmk, n)
}

/// Fresh pages for [`diff_miss`], handed out in the same order on every node.
struct Pages {
    data: Shared<[u64]>,
    words: usize,
    next: usize,
}

impl Pages {
    fn take(&mut self) -> (usize, Shared<[u64]>) {
        let k = self.next;
        self.next += 1;
        (k, self.data.slice(k * self.words, (k + 1) * self.words))
    }
}

/// Per iteration, with a fresh page k: node 1 writes one word into page k, barrier (node 0
/// learns of the write and invalidates page k), node 0 (after pausing `settle`, if given) times
/// the first read of page k (a fault handed to the runtime, a miss served by one diff from
/// node 1) and checks the value, barrier. Node 0 checks that every read faulted.
fn diff_miss(
    tmk: &mut Tmk,
    pages: &mut Pages,
    n: u64,
    settle: Option<Duration>,
    acc: Option<&mut Acc>,
) -> Result<()> {
    let me = tmk.proc_id();
    let marker = |k: usize| 0xD1FF_0000_0000_0000 | k as u64;
    let mut rec = Recorder::start(tmk, acc)?;
    let mut wrong = Vec::new();
    let handoffs_before = tmk.stats()?.fault_handoffs;
    for _ in 0..n {
        let (k, page) = pages.take();
        if me == 1 {
            tmk.view_mut(&page)?[0] = marker(k);
        }
        tmk.barrier(BARRIER)?;
        if me == 0 {
            if let Some(d) = settle {
                std::thread::sleep(d);
            }
            let t = Instant::now();
            // No part declared: the view fetches nothing, the read faults (as a raw pointer's).
            let v = tmk.view_parts(&page, std::iter::empty())?;
            let got = black_box(v[0]);
            let dt = t.elapsed();
            drop(v);
            rec.sample(dt);
            if got != marker(k) && wrong.len() < 4 {
                wrong.push(format!("page {k}: read {got:#x}, node 1 wrote {:#x}", marker(k)));
            }
        }
        tmk.barrier(BARRIER)?;
    }
    if !wrong.is_empty() {
        return Err(format!("diff_miss read wrong values: {}", wrong.join("; ")).into());
    }
    let handoffs = tmk.stats()?.fault_handoffs - handoffs_before;
    if me == 0 && handoffs != n {
        return Err(format!("diff_miss: {handoffs} faults handed to the runtime for {n} misses").into());
    }
    rec.finish(tmk, n)
}

/// Every node writes its totals into its own page of a shared array; node 0 reads them all
/// after a barrier (through the DSM itself: one diff miss per other node).
fn totals(tmk: &mut Tmk, p: &Params) -> Result<Vec<NodeTotals>> {
    let (me, n) = (tmk.proc_id(), tmk.nprocs());
    let words = (p.page_size / 8) as usize;
    let mut table: Shared<[u64]> = Shared::from_raw_parts(0, 0);
    if me == 0 {
        table = tmk.alloc_pages::<u64>(n * words)?;
    }
    tmk.distribute(&mut table)?;
    let mine = NodeTotals::of(me, &tmk.stats()?).to_words();
    tmk.view_mut(&table.slice(me * words, me * words + mine.len()))?.copy_from_slice(&mine);
    tmk.barrier(BARRIER)?;
    let mut out = Vec::new();
    if me == 0 {
        let v = tmk.view(&table)?;
        for node in 0..n {
            out.push(NodeTotals::from_words(node, &v[node * words..node * words + NodeTotals::WORDS]));
        }
    }
    tmk.barrier(BARRIER)?;
    Ok(out)
}
