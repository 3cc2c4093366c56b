//! `cargo bench -p treadmarks-benches --bench bulk`: how fast a node pulls a peer's writes.
//!
//! Two nodes on 127.0.0.1. For each size, node 1 rewrites `pages` whole pages (every word
//! changes, as a transpose or a scatter does), both pass a barrier, and node 0 takes a view of
//! them: one validation that asks node 1 for every diff and applies them. That is timed against
//! sending the same number of bytes over a plain TCP socket between the same two processes, in
//! the same run, so the ratio says what the diff path (freezing, diffing, encoding, framing,
//! applying) costs on top of the wire.
//!
//! Without `--bench` (e.g. under `cargo test --benches`) it runs fewer rounds, as a smoke run.
//! Timings are reported, never asserted.

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use treadmarks::{Config, Shared, Tmk};
use treadmarks_benches::summary::Summary;
use treadmarks_benches::{Result, faults, job};

/// Pages per figure: a few boundary rows, a slab, a whole array half.
const SIZES: [usize; 3] = [16, 256, 2048];
const IO_TIMEOUT: Duration = Duration::from_secs(20);

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("treadmarks-benches bulk: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let full = std::env::args().any(|a| a == "--bench");
    let page = faults::page_size()?;
    let mut tmk = if std::env::var("TMK_RANK").is_ok_and(|v| !v.is_empty()) {
        let (config, _) = Config::from_env_and_args(vec![])?;
        Tmk::startup_with(config, vec![])?
    } else {
        Tmk::startup_with(Config { nprocs: 2, ..Config::default() }, vec![])?
    };
    let mut rounds: u64 = if full { 20 } else { 3 };
    tmk.distribute(&mut rounds)?;
    let me = tmk.proc_id();

    // The raw socket: node 0 listens and distributes its port, node 1 connects.
    let listener = if me == 0 { Some(TcpListener::bind(("127.0.0.1", 0))?) } else { None };
    let mut port = listener.as_ref().map_or(Ok(0), |l| l.local_addr().map(|a| a.port()))?;
    tmk.distribute(&mut port)?;
    let mut raw = match listener {
        Some(l) => configure(job::accept(l)?)?,
        None => connect(port)?,
    };

    let largest = SIZES.iter().max().copied().unwrap_or(0);
    let words = page / 8;
    let mut data: Shared<[u64]> = Shared::from_raw_parts(0, 0);
    if me == 0 {
        data = tmk.alloc_pages::<u64>(largest * words)?;
    }
    tmk.distribute(&mut data)?;

    let mut rows = Vec::new();
    for pages in SIZES {
        let part = data.slice(0, pages * words);
        let (mut dsm, mut wire) = (Vec::new(), Vec::new());
        let before = tmk.stats()?.protocol.diff_bytes_applied;
        for round in 0..=rounds {
            // Round 0 warms up (first-touch faults, twins made for the first time).
            if me == 1 {
                for (i, x) in tmk.view_mut(&part)?.iter_mut().enumerate() {
                    *x = (i as u64 ^ round.rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                }
            }
            tmk.barrier(0)?;
            if me == 0 {
                let t = Instant::now();
                let sum: u64 = tmk.view(&part)?.iter().fold(0, |a, &x| a.wrapping_add(x));
                let d = t.elapsed();
                std::hint::black_box(sum);
                let w = raw_transfer(&mut raw, pages * page, true)?;
                if round > 0 {
                    dsm.push(d);
                    wire.push(w);
                }
            } else {
                raw_transfer(&mut raw, pages * page, false)?;
            }
            tmk.barrier(0)?;
        }
        let diff_bytes = tmk.stats()?.protocol.diff_bytes_applied - before;
        rows.push((pages, Summary::of(&dsm), Summary::of(&wire), diff_bytes));
    }
    drop(raw);
    if me == 0 {
        report(&rows, page, rounds);
    }
    tmk.exit()?;
    Ok(())
}

/// Node 0 (`receiver`) sends one byte and reads `bytes` back; node 1 waits for the byte and
/// sends them. Returns node 0's time from its byte to the last byte received.
fn raw_transfer(s: &mut TcpStream, bytes: usize, receiver: bool) -> Result<Duration> {
    let mut buf = vec![0x5au8; bytes.min(1 << 20)];
    let t = Instant::now();
    if receiver {
        s.write_all(&[1])?;
        let mut left = bytes;
        while left > 0 {
            let n = s.read(&mut buf[..left.min(1 << 20)])?;
            if n == 0 {
                return Err("raw transfer: node 1 closed the socket".into());
            }
            left -= n;
        }
    } else {
        s.read_exact(&mut [0u8; 1])?;
        let mut left = bytes;
        while left > 0 {
            let n = left.min(buf.len());
            s.write_all(&buf[..n])?;
            left -= n;
        }
    }
    Ok(t.elapsed())
}

fn report(rows: &[(usize, Summary, Summary, u64)], page: usize, rounds: u64) {
    println!(
        "\ntreadmarks bulk fetch: node 0 views pages node 1 rewrote, 2 nodes on 127.0.0.1, {rounds} rounds"
    );
    println!(
        "  {:>6} {:>9} {:>12} {:>12} {:>10} {:>11} {:>12}",
        "pages", "MB", "view µs", "raw TCP µs", "view/raw", "view MB/s", "diff B/page"
    );
    for (pages, dsm, wire, diff_bytes) in rows {
        let mb = (pages * page) as f64 / 1e6;
        println!(
            "  {:>6} {:>9.2} {:>12.1} {:>12.1} {:>10.2} {:>11.0} {:>12.0}",
            pages,
            mb,
            dsm.p50_us,
            wire.p50_us,
            dsm.p50_us / wire.p50_us,
            mb / (dsm.p50_us / 1e6),
            *diff_bytes as f64 / (*pages as f64 * (rounds + 1) as f64),
        );
    }
    let fields: Vec<String> = rows
        .iter()
        .flat_map(|(pages, dsm, wire, _)| {
            [
                format!("\"view_{pages}_p50_us\":{:.1}", dsm.p50_us),
                format!("\"raw_{pages}_p50_us\":{:.1}", wire.p50_us),
            ]
        })
        .collect();
    println!("{{{}}}", fields.join(","));
}

fn connect(port: u16) -> Result<TcpStream> {
    configure(TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), IO_TIMEOUT)?)
}

fn configure(s: TcpStream) -> Result<TcpStream> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(s)
}
