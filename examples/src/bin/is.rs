//! NAS-style integer sort (IS): rank `2^log2keys` keys in `0..2^log2max`, `--iterations` times.
//! Keys follow NAS' distribution (the mean of four uniform numbers, so a bell shape); like NAS,
//! iteration `i` (from 1) first sets key `i` to `i` and key `i + iterations` to `max - i`, then
//! ranks all keys: `ranks[k]` is the number of keys `<= k` (NAS' `key_buff1` after its prefix
//! sum; the rank of a key `k` is `ranks[k - 1]`).
//!
//! Each node owns a contiguous block of the keys and a contiguous block of the key values. The
//! reduction goes through shared memory, one shared count array per node (no lock): every node
//! counts its keys into its own row of a shared `nprocs x max` count array; barrier; every node
//! adds up all rows over its block of key values and scans them into its block of the shared
//! rank array, publishing its block's total; barrier; every node adds the totals of the blocks
//! before it to its block of ranks.
//!
//! Check (NAS' verification idea, in full): the ranks after the last iteration equal a
//! sequential ranking's, and so do those at [`SAMPLES`] fixed key values after every iteration
//! (NAS' partial verification: each iteration ranks afresh, so an error in an earlier one would
//! not show in the last). Each worker notes its samples as it goes, in private memory; they are
//! gathered after the timer.
//!
//! The sequential ranking is itself checked, wherever it is computed (seq mode, and as the others'
//! reference), independently of the counting and scanning that made it: a sorted copy of the
//! final keys must have exactly `ranks[k]` keys `<= k`, for every key value `k`
//! ([`ranks_match_sorted`]).
//!
//! `is -n 2 [--mode dsm|seq|threads] [--log2keys 22] [--log2max 19] [--iterations 10] [--seed 1]`

use std::process::ExitCode;
use std::sync::Barrier;
use treadmarks::Shared;
use treadmarks_examples::{
    App, Args, Flag, Mode, Outcome, SharedMut, Timer, block, fits_memory, keys, zeroed,
};

/// Count rows are padded to whole 4 KiB pages (1024 `u32`s).
const ROW_PAD: usize = 1024;

/// Key values whose ranks are checked after every iteration.
const SAMPLES: usize = 64;

/// The sampled key values, ascending (so each worker's block of key values holds a run of them).
fn samples(s: &Size) -> Vec<usize> {
    let mut v: Vec<usize> =
        (0..SAMPLES as u64).map(|j| (keys::mix(!s.seed, j) % s.max as u64) as usize).collect();
    v.sort_unstable();
    v
}

/// The samples in key values `k0..k1`: (sample index, key value).
fn samples_in(samples: &[usize], k0: usize, k1: usize) -> Vec<(usize, usize)> {
    samples.iter().copied().enumerate().filter(|&(_, k)| (k0..k1).contains(&k)).collect()
}

#[derive(Clone, Copy)]
struct Size {
    keys: usize,
    max: usize,
    log2max: u32,
    iterations: usize,
    seed: u64,
}

impl Size {
    fn stride(&self) -> usize {
        self.max.next_multiple_of(ROW_PAD)
    }
}

/// Keys `start..start + out.len()` of the input: NAS' bell-shaped distribution, the sum of four
/// uniform 32-bit numbers scaled to `0..2^log2max`.
fn fill_keys(out: &mut [u32], start: usize, s: &Size) {
    for (k, o) in out.iter_mut().enumerate() {
        let i = 4 * (start + k) as u64;
        let sum: u64 = (0..4).map(|j| keys::mix(s.seed, i + j) >> 32).sum();
        *o = (sum >> (34 - s.log2max)) as u32;
    }
}

/// NAS' per-iteration change to the keys, applied to the block `keys` that starts at key `start`.
fn modify(keys: &mut [u32], start: usize, iteration: usize, s: &Size) {
    for (i, v) in [(iteration, iteration), (iteration + s.iterations, s.max - iteration)] {
        if (start..start + keys.len()).contains(&i) {
            keys[i - start] = v as u32;
        }
    }
}

/// Counts `keys` by value into `row` (cleared first).
fn count(keys: &[u32], row: &mut [u32]) {
    row.fill(0);
    for &k in keys {
        row[k as usize] += 1;
    }
}

/// Adds up `rows` (all of the same block of key values) and writes the inclusive prefix sum into
/// `out`; returns the block's total. Row by row, then the scan: a loop over the rows inside the
/// loop over the values ran as a scalar loop whenever the number of rows was not known where it
/// was compiled (the DSM and threads versions), and took 15% longer at one node than the
/// sequential version's, compiled for one row.
fn reduce_scan(rows: &[&[u32]], out: &mut [u32]) -> u32 {
    out.fill(0);
    for row in rows {
        for (o, &c) in out.iter_mut().zip(row.iter()) {
            *o += c;
        }
    }
    let mut sum = 0;
    for o in out.iter_mut() {
        sum += *o;
        *o = sum;
    }
    sum
}

/// Adds `offset` to every rank of a block. The workers call it only with a non-zero offset: the
/// first block's is always 0, and it skips the pass.
fn add(ranks: &mut [u32], offset: u32) {
    for r in ranks {
        *r += offset;
    }
}

fn input(s: &Size) -> Vec<u32> {
    let mut v = vec![0; s.keys];
    fill_keys(&mut v, 0, s);
    v
}

/// The sequential ranking of `keys` into `ranks`, counting into `counts`; with `trace`, the
/// ranks of the samples after every iteration (iteration `i`'s at `(i - 1) * SAMPLES`).
fn rank(s: &Size, keys: &mut [u32], counts: &mut [u32], ranks: &mut [u32], mut trace: Option<&mut [u32]>) {
    let samples = samples(s);
    for it in 1..=s.iterations {
        modify(keys, 0, it, s);
        count(keys, counts);
        reduce_scan(&[&*counts], ranks);
        if let Some(trace) = trace.as_deref_mut() {
            for (j, &k) in samples.iter().enumerate() {
                trace[(it - 1) * SAMPLES + j] = ranks[k];
            }
        }
    }
}

/// The sequential result: the final ranks, and the samples' ranks after every iteration; `None`
/// (and a message) if its final ranks fail the independent check ([`ranks_match_sorted`]).
fn expected(s: &Size) -> Option<(Vec<u32>, Vec<u32>)> {
    let (mut counts, mut ranks) = (zeroed(s.max), zeroed(s.max));
    let mut trace = vec![0; s.iterations * SAMPLES];
    let mut keys = input(s);
    rank(s, &mut keys, &mut counts, &mut ranks, Some(&mut trace));
    drop(counts);
    ranks_match_sorted(&keys, &ranks).then_some((ranks, trace))
}

/// Whether `ranks` ranks `keys`: for every key value `k` (one per entry of `ranks`), `ranks[k]` is
/// the number of keys `<= k`, `sorted.partition_point(|&x| x <= k)` of a sorted copy of the keys
/// (taken for all `k` in one pass), and every key has a value in range. Says so if not. It does
/// not share code with [`rank`]: a ranking shared by every mode is checked against something else.
fn ranks_match_sorted(keys: &[u32], ranks: &[u32]) -> bool {
    let mut sorted = keys.to_vec();
    sorted.sort_unstable();
    let mut at_most = 0;
    let ok = sorted.last().is_none_or(|&top| (top as usize) < ranks.len())
        && ranks.iter().enumerate().all(|(k, &r)| {
            while at_most < sorted.len() && sorted[at_most] as usize <= k {
                at_most += 1;
            }
            r as usize == at_most
        });
    if !ok {
        treadmarks::report("is: the sequential ranks disagree with a sorted copy of the keys");
    }
    ok
}

/// The threads version: its time, final ranks and trace (as [`expected`]'s).
fn threads(s: &Size, n: usize) -> (f64, (Vec<u32>, Vec<u32>)) {
    let mut keys = input(s);
    let mut counts = zeroed(n * s.stride());
    let mut ranks = zeroed(s.max);
    let mut totals = vec![0; n];
    let samples = samples(s);
    let barrier = Barrier::new(n);
    let t = Timer::start();
    let noted: Vec<Vec<u32>> = {
        let (keys, counts) = (SharedMut::new(&mut keys), SharedMut::new(&mut counts));
        let (ranks, totals) = (SharedMut::new(&mut ranks), SharedMut::new(&mut totals));
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..n)
                .map(|me| {
                    let (keys, counts, ranks, totals, barrier) = (&keys, &counts, &ranks, &totals, &barrier);
                    let samples = &samples;
                    scope.spawn(move || {
                        let (begin, end) = block(s.keys, me, n);
                        let (k0, k1) = block(s.max, me, n);
                        let sampled = samples_in(samples, k0, k1);
                        let mut noted = Vec::with_capacity(s.iterations * sampled.len());
                        let row = me * s.stride()..me * s.stride() + s.max;
                        for it in 1..=s.iterations {
                            // SAFETY: each thread writes only its own block of keys and its own count
                            // row; nobody reads them in this phase.
                            unsafe {
                                let mine = keys.slice_mut(begin..end);
                                modify(mine, begin, it, s);
                                count(mine, counts.slice_mut(row.clone()));
                            }
                            barrier.wait();
                            // SAFETY: nobody writes the count rows in this phase; each thread writes
                            // only its own block of ranks and its own total.
                            unsafe {
                                let rows: Vec<&[u32]> = (0..n)
                                    .map(|p| counts.slice(p * s.stride() + k0..p * s.stride() + k1))
                                    .collect();
                                totals.slice_mut(me..me + 1)[0] = reduce_scan(&rows, ranks.slice_mut(k0..k1));
                            }
                            barrier.wait();
                            // SAFETY: nobody writes the totals in this phase; each thread writes, then
                            // reads back, only its own block of ranks (the next write of a total
                            // follows a barrier).
                            unsafe {
                                let offset = totals.slice(0..me).iter().sum();
                                if offset != 0 {
                                    add(ranks.slice_mut(k0..k1), offset);
                                }
                                let done = ranks.slice(k0..k1);
                                noted.extend(sampled.iter().map(|&(_, k)| done[k - k0]));
                            }
                        }
                        noted
                    })
                })
                .collect();
            workers.into_iter().map(|w| w.join().expect("a worker panicked")).collect()
        })
    };
    let secs = t.secs();
    let mut trace = vec![0; s.iterations * SAMPLES];
    for (me, noted) in noted.iter().enumerate() {
        let (k0, k1) = block(s.max, me, n);
        note_trace(&mut trace, &samples_in(&samples, k0, k1), noted);
    }
    (secs, (ranks, trace))
}

/// Puts a worker's notes (its samples' ranks, iteration after iteration) in their places in
/// `trace`.
fn note_trace(trace: &mut [u32], mine: &[(usize, usize)], noted: &[u32]) {
    if mine.is_empty() {
        return;
    }
    for (it, ranks) in noted.chunks(mine.len()).enumerate() {
        for (&(j, _), &r) in mine.iter().zip(ranks) {
            trace[it * SAMPLES + j] = r;
        }
    }
}

fn dsm(app: &mut App, s: &Size) -> treadmarks::Result<(f64, bool)> {
    let tmk = app.tmk();
    let (me, n) = (tmk.proc_id(), tmk.nprocs());
    let mut arrays: [Shared<[u32]>; 5] = [Shared::from_raw_parts(0, 0); 5];
    if me == 0 {
        arrays = [
            tmk.alloc_pages::<u32>(s.keys)?,
            tmk.alloc_pages::<u32>(n * s.stride())?,
            tmk.alloc_pages::<u32>(s.max)?,
            tmk.alloc_pages::<u32>(n)?,
            tmk.alloc_pages::<u32>(s.iterations * SAMPLES)?,
        ];
    }
    tmk.distribute(&mut arrays)?;
    let [keys, counts, ranks, totals, trace] = arrays;
    let (begin, end) = block(s.keys, me, n);
    let (k0, k1) = block(s.max, me, n);
    let my_keys = keys.slice(begin, end);
    let my_row = counts.slice(me * s.stride(), me * s.stride() + s.max);
    let my_ranks = ranks.slice(k0, k1);
    let sampled = samples_in(&samples(s), k0, k1);
    let mut noted = Vec::with_capacity(s.iterations * sampled.len());
    fill_keys(&mut tmk.view_mut(&my_keys)?, begin, s);
    tmk.barrier(0)?;
    let t = Timer::start();
    for it in 1..=s.iterations {
        {
            let mut mine = tmk.view_mut(&my_keys)?;
            modify(&mut mine, begin, it, s);
            count(&mine, &mut tmk.view_mut(&my_row)?);
        }
        tmk.barrier(0)?;
        {
            let views = (0..n)
                .map(|p| tmk.view(&counts.slice(p * s.stride() + k0, p * s.stride() + k1)))
                .collect::<treadmarks::Result<Vec<_>>>()?;
            let rows: Vec<&[u32]> = views.iter().map(|v| &v[..]).collect();
            let total = reduce_scan(&rows, &mut tmk.view_mut(&my_ranks)?);
            tmk.view_mut(&totals.slice(me, me + 1))?[0] = total;
        }
        tmk.barrier(0)?;
        let offset = tmk.view(&totals.slice(0, me))?.iter().sum();
        if offset != 0 {
            let mut done = tmk.view_mut(&my_ranks)?;
            add(&mut done, offset);
            noted.extend(sampled.iter().map(|&(_, k)| done[k - k0]));
        } else if !sampled.is_empty() {
            let done = tmk.view(&my_ranks)?;
            noted.extend(sampled.iter().map(|&(_, k)| done[k - k0]));
        }
    }
    tmk.barrier(0)?;
    let secs = t.stop(tmk)?;
    // After the timer: every node's notes into the shared trace, for node 0 to check.
    if !sampled.is_empty() {
        note_trace(&mut tmk.view_mut(&trace)?, &sampled, &noted);
    }
    tmk.barrier(0)?;
    let ok = me != 0
        || match expected(s) {
            Some((want, want_trace)) => {
                *tmk.view(&ranks)? == want[..] && *tmk.view(&trace)? == want_trace[..]
            }
            None => false,
        };
    Ok((secs, ok))
}

/// The size flags and their defaults (`--help` lists them).
const FLAGS: &[Flag] = &[
    Flag { name: "log2keys", default: "22", help: "log2 of the keys", aliases: &[] },
    Flag { name: "log2max", default: "19", help: "log2 of the key range", aliases: &[] },
    Flag { name: "iterations", default: "10", help: "rankings", aliases: &[] },
    Flag { name: "seed", default: "1", help: "key generator seed", aliases: &[] },
];

fn size(args: &Args) -> Result<Size, String> {
    let log2keys: u32 = args.get("log2keys");
    let log2max: u32 = args.get("log2max");
    let iterations: usize = args.get("iterations");
    if log2keys > 30 || log2max > 31 || (1 << log2keys) <= 2 * iterations || (1 << log2max) <= iterations {
        return Err(
            "need log2keys <= 30, log2max <= 31, 2^log2keys > 2 iterations, 2^log2max > iterations".into()
        );
    }
    let s = Size { keys: 1 << log2keys, max: 1 << log2max, log2max, iterations, seed: args.get("seed") };
    // The keys, a count row per worker and the ranks; the reference's keys, counts and ranks; the
    // check's sorted copy of the keys; the samples' ranks (the run's, the workers' notes and the
    // reference's).
    let (keys, max) = (s.keys as u128, s.max as u128);
    let rows = args.nprocs() as u128 * s.stride() as u128;
    let bytes = 4 * (3 * keys + rows + 3 * max + 3 * (SAMPLES * iterations) as u128);
    fits_memory(&format!("--log2keys {log2keys} --log2max {log2max} --iterations {iterations}"), bytes)?;
    Ok(s)
}

fn main() -> ExitCode {
    treadmarks_examples::run_app("is", FLAGS, size, |app, s| {
        let detail = format!(
            "2^{} keys in 0..2^{}, {} iterations; sequential ranks checked against a sorted copy of the keys",
            s.keys.trailing_zeros(),
            s.log2max,
            s.iterations
        );
        let (secs, ok) = match app.mode {
            Mode::Seq => {
                let mut keys = input(&s);
                let (mut counts, mut ranks) = (zeroed(s.max), zeroed(s.max));
                let t = Timer::start();
                rank(&s, &mut keys, &mut counts, &mut ranks, None);
                let secs = t.secs();
                drop(counts);
                (secs, ranks_match_sorted(&keys, &ranks))
            }
            Mode::Threads => {
                let (secs, got) = threads(&s, app.nprocs);
                (secs, expected(&s).is_some_and(|want| got == want))
            }
            Mode::Dsm => dsm(app, &s)?,
        };
        Ok(Outcome { secs, ok, detail })
    })
}
