//! `cargo bench -p treadmarks-benches --bench bulk`: how fast a node pulls a peer's writes.
//!
//! Two nodes on 127.0.0.1. For each size, in each round, node 1 rewrites `pages` whole pages
//! (every word changes, as a transpose or a scatter does), both pass a barrier, and node 0 takes
//! a view of them. Two cases, timed in the same run against sending the same number of bytes
//! over a plain TCP socket between the same two processes:
//!
//! - **fetch**: fresh pages every round, which node 0 never touched before: the view is one
//!   validation that asks node 1 for every diff and applies them (freezing, diffing, encoding,
//!   framing, applying, on top of the wire; and the first touch of the memory at both ends);
//! - **reread**: the same pages every round: node 0 read them last round, so node 1 pushes their
//!   diffs at the barrier (`protocol/push.rs`) and the view only applies them, for up to
//!   `PUSH_MAX_PAGES` (64) pages; beyond that, and with `TMK_PUSH=0`, this is a fetch of warm
//!   pages instead.
//!
//! Each timer stops once node 0 has touched one word of every page (enough to wait for a
//! streaming view's pages, as the raw receiver waits for its bytes); the pages are then checked
//! against what node 1 wrote, untimed. `diff B/page` is the diff bytes node 0 applied over the
//! diffs it applied (one a page and round).
//!
//! No barrier may collect on its own during the run: a collection at a barrier before a view
//! drops node 0's stale copies, and the view then fetches them whole from node 1
//! (`protocol/gc.rs`), with no diff, which is not what the rows name. Node 1's diffs would pass
//! the collection threshold in the larger sizes, so there the bench collects itself
//! (`Tmk::collect`) at the end of every round, untimed, when node 0's copies are all valid and
//! none is dropped; the diffs' memory is then reused, as in a program that collects. A size whose
//! diffs stay well under the threshold never collects: a collection drops every push
//! subscription, and the 16-page reread is a push. A size during which a barrier collected on
//! its own, or a timed view that fetched a whole page, fails the bench with a message.
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
/// The multiplier of the rewritten words (node 1 writes `value(i, round)` at word `i`).
const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// What node 1 writes at word `i` of a region in round `round`: every word changes from the
/// zeros of a fresh page, and from round to round but in its 17 low bits (a product's low bits
/// depend only on the factors' low bits, and `round` is shifted past them).
fn value(i: usize, round: u64) -> u64 {
    (i as u64 ^ round.rotate_left(17)).wrapping_mul(K)
}

/// Whether a size collects after every round: when its diffs over the run (two cases a round,
/// warm-up included, a page's worth each) could reach half the collection `threshold`.
fn collects(pages: usize, page: usize, rounds: u64, threshold: u64) -> bool {
    2 * (pages * page) as u64 * (rounds + 1) > threshold / 2
}

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
    // The environment's settings, which the launcher passes its node.
    let (config, _) = Config::from_env_and_args(vec![])?;
    let config = if std::env::var("TMK_RANK").is_ok_and(|v| !v.is_empty()) {
        config
    } else {
        Config { nprocs: 2, ..config }
    };
    let mut tmk = Tmk::startup_with(config, vec![])?;
    // Node 0's collection threshold, which every node's decisions to collect follow.
    let mut threshold = tmk.collection_threshold();
    let mut rounds: u64 = if full { 20 } else { 3 };
    tmk.distribute(&mut rounds)?;
    tmk.distribute(&mut threshold)?;
    let me = tmk.proc_id();

    // The raw socket: node 0 listens and distributes its port, node 1 connects.
    let listener = if me == 0 { Some(TcpListener::bind(("127.0.0.1", 0))?) } else { None };
    let mut port = listener.as_ref().map_or(Ok(0), |l| l.local_addr().map(|a| a.port()))?;
    tmk.distribute(&mut port)?;
    let mut raw = match listener {
        Some(l) => configure(job::accept(l)?)?,
        None => connect(port)?,
    };

    // Each size's own regions: fresh ones for the fetch case (one per round, round 0 included),
    // and one reread every round.
    let words = page / 8;
    let regions = rounds as usize + 2;
    let mut data: Shared<[u64]> = Shared::from_raw_parts(0, 0);
    if me == 0 {
        data = tmk.alloc_pages::<u64>(SIZES.iter().sum::<usize>() * regions * words)?;
    }
    tmk.distribute(&mut data)?;

    let mut rows = Vec::new();
    for (size, pages) in SIZES.into_iter().enumerate() {
        let first = SIZES[..size].iter().sum::<usize>() * regions;
        let region = |r: usize| data.slice((first + r * pages) * words, (first + (r + 1) * pages) * words);
        let (mut fetch, mut reread, mut wire) = (Vec::new(), Vec::new(), Vec::new());
        let collect = collects(pages, page, rounds, threshold);
        let stage = tmk.stats()?.protocol;
        for round in 0..=rounds {
            // Round 0 warms up (first-touch faults, twins made for the first time, and the
            // first read of the reused region, which subscribes node 0 to it).
            for (case, part) in [(0, region(round as usize)), (1, region(regions - 1))] {
                if me == 1 {
                    for (i, x) in tmk.view_mut(&part)?.iter_mut().enumerate() {
                        *x = value(i, round);
                    }
                }
                tmk.barrier(0)?;
                if me == 0 {
                    let before = tmk.stats()?.protocol;
                    let t = Instant::now();
                    let v = tmk.view(&part)?;
                    // One word a page, as a streaming view's pages are waited for.
                    let touched = (0..pages).fold(0u64, |a, p| a.wrapping_add(v[p * words]));
                    let d = t.elapsed();
                    std::hint::black_box(touched);
                    let wrong =
                        v.iter().enumerate().find(|&(i, &x)| x != value(i, round)).map(|(i, &x)| (i, x));
                    drop(v);
                    let name = ["fetch", "reread"][case];
                    if let Some((i, x)) = wrong {
                        let want = value(i, round);
                        return Err(format!(
                            "round {round}: the {name} of {pages} pages read {x:#x} at word {i}, node 1 \
                             wrote {want:#x}"
                        )
                        .into());
                    }
                    let after = tmk.stats()?.protocol;
                    let misses = after.view_misses - before.view_misses;
                    if case == 0 && misses != pages as u64 {
                        return Err(format!("a fetch of {pages} fresh pages missed on {misses}").into());
                    }
                    let whole = after.page_requests_sent - before.page_requests_sent;
                    if whole > 0 {
                        return Err(format!(
                            "round {round}: the {name} of {pages} pages fetched {whole} of them whole, \
                             after a barrier collected (threshold {threshold} bytes): it timed copies, not \
                             diffs"
                        )
                        .into());
                    }
                    if round > 0 {
                        if case == 0 { &mut fetch } else { &mut reread }.push(d);
                    }
                }
                tmk.barrier(0)?;
            }
            if me == 0 {
                let w = raw_transfer(&mut raw, pages * page, true)?;
                if round > 0 {
                    wire.push(w);
                }
            } else {
                raw_transfer(&mut raw, pages * page, false)?;
            }
            if collect {
                tmk.collect()?;
            }
        }
        let end = tmk.stats()?.protocol;
        let (collections, asked) =
            (end.collections - stage.collections, if collect { rounds + 1 } else { 0 });
        if collections != asked {
            return Err(format!(
                "node {me} collected {collections} times during the {pages}-page rounds, {asked} of them \
                 asked for (threshold {threshold} bytes): a view after a collection at a barrier fetches \
                 whole pages, not the diffs its row times"
            )
            .into());
        }
        let (bytes, diffs) =
            (end.diff_bytes_applied - stage.diff_bytes_applied, end.diffs_applied - stage.diffs_applied);
        rows.push(Row {
            pages,
            fetch: Summary::of(&fetch),
            reread: Summary::of(&reread),
            wire: Summary::of(&wire),
            per_page: bytes as f64 / diffs as f64,
        });
    }
    drop(raw);
    if me == 0 {
        report(&rows, page, rounds, threshold);
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

/// One size's figures.
struct Row {
    pages: usize,
    fetch: Summary,
    reread: Summary,
    wire: Summary,
    /// Diff bytes node 0 applied over the diffs it applied (a diff a page and round).
    per_page: f64,
}

fn report(rows: &[Row], page: usize, rounds: u64, threshold: u64) {
    println!(
        "\ntreadmarks bulk fetch: node 0 views pages node 1 rewrote, 2 nodes on 127.0.0.1, {rounds} rounds, medians"
    );
    let collecting: Vec<String> = rows
        .iter()
        .filter(|r| collects(r.pages, page, rounds, threshold))
        .map(|r| r.pages.to_string())
        .collect();
    let collected = match collecting.len() {
        0 => "no collection".to_string(),
        _ => format!("collected after every round, untimed, at {} pages", collecting.join(" and ")),
    };
    println!("  (collection threshold {} MiB; {collected})", threshold >> 20);
    println!(
        "  {:>6} {:>7} {:>10} {:>10} {:>11} {:>10} {:>11} {:>10} {:>11}",
        "pages",
        "MB",
        "fetch µs",
        "fetch/raw",
        "fetch MB/s",
        "reread µs",
        "reread/raw",
        "raw µs",
        "diff B/page"
    );
    for r in rows {
        let mb = (r.pages * page) as f64 / 1e6;
        println!(
            "  {:>6} {:>7.2} {:>10.1} {:>10.2} {:>11.0} {:>10.1} {:>11.2} {:>10.1} {:>11.0}",
            r.pages,
            mb,
            r.fetch.p50_us,
            r.fetch.p50_us / r.wire.p50_us,
            mb / (r.fetch.p50_us / 1e6),
            r.reread.p50_us,
            r.reread.p50_us / r.wire.p50_us,
            r.wire.p50_us,
            r.per_page,
        );
    }
    let fields: Vec<String> = rows
        .iter()
        .flat_map(|r| {
            [
                format!("\"fetch_{}_p50_us\":{:.1}", r.pages, r.fetch.p50_us),
                format!("\"reread_{}_p50_us\":{:.1}", r.pages, r.reread.p50_us),
                format!("\"raw_{}_p50_us\":{:.1}", r.pages, r.wire.p50_us),
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
