//! SPLASH-2 radix sort: least-significant digit first, `2^bits`-way digits. Each node owns a
//! contiguous block of the keys. Per digit: every node counts its keys' digits into its own
//! (page-padded) row of a shared histogram array; barrier; every node reads all rows and computes
//! where its keys of each digit value go (the prefix sum over digit values, then over the nodes
//! before it, done redundantly by each node on the small histogram array); every node moves its
//! keys into the destination array, writing one run per digit value that starts wherever the
//! lower nodes' run ends (writes land on everybody's pages, the DSM's hard case); barrier; the
//! arrays swap roles.
//!
//! `--mode mp` runs a hand-written message-passing version instead, on `-n` processes joined by
//! TCP (`mesh.rs`), to compare the DSM with: each rank sorts its keys by digit into a private
//! buffer, sends every other rank, in one message a pass, the keys that land in its block
//! (packed in destination order: the histograms, exchanged first, say where each piece goes),
//! copies its own into place and unpacks what it receives.
//!
//! `radix -n 2 [--mode dsm|seq|threads|mp] [--keys 4194304] [--bits 8] [--seed 1]`

use std::process::ExitCode;
use std::sync::Barrier;
use treadmarks::Shared;
use treadmarks_examples::mesh::Mesh;
use treadmarks_examples::{
    App, Args, Flag, Mode, Outcome, SharedMut, Timer, block, command_line, keys, print_result, run_parsed,
    sized, zeroed,
};

/// Histogram rows are padded to 4 KiB (1024 `u32`s), so no two nodes write the same page.
const ROW_PAD: usize = 1024;

#[derive(Clone, Copy)]
struct Size {
    keys: usize,
    bits: u32,
    seed: u64,
}

impl Size {
    fn radix(&self) -> usize {
        1 << self.bits
    }
    fn stride(&self) -> usize {
        self.radix().max(ROW_PAD)
    }
    fn passes(&self) -> u32 {
        32u32.div_ceil(self.bits)
    }
    fn mask(&self) -> u32 {
        (self.radix() - 1) as u32
    }
}

/// Counts the digit `(k >> shift) & mask` of `keys` into `hist` (cleared first).
fn histogram(keys: &[u32], shift: u32, mask: u32, hist: &mut [u32]) {
    hist.fill(0);
    for &k in keys {
        hist[((k >> shift) & mask) as usize] += 1;
    }
}

/// Where worker `me`'s keys of each digit value start in the destination: all keys of smaller
/// digit values, plus the keys of this digit value of the workers before `me`. `hists` holds
/// `nprocs` rows of `stride` counts.
fn offsets(hists: &[u32], nprocs: usize, stride: usize, radix: usize, me: usize) -> Vec<usize> {
    let mut out = vec![0; radix];
    let mut base = 0;
    for (d, o) in out.iter_mut().enumerate() {
        let column = (0..nprocs).map(|p| hists[p * stride + d] as usize);
        let (before, total) =
            column.enumerate().fold((0, 0), |(b, t), (p, c)| (b + if p < me { c } else { 0 }, t + c));
        *o = base + before;
        base += total;
    }
    out
}

/// Cuts from `dst` (the whole destination array) the runs `starts[d]..starts[d] + lens[d]`, in
/// increasing order of start (as [`offsets`] gives them for one worker).
fn runs<'a>(dst: &'a mut [u32], starts: &[usize], lens: &[u32]) -> Vec<&'a mut [u32]> {
    let mut rest = dst;
    let mut pos = 0;
    let mut out = Vec::with_capacity(starts.len());
    for (&s, &len) in starts.iter().zip(lens) {
        let (_, tail) = std::mem::take(&mut rest).split_at_mut(s - pos);
        let (run, tail) = tail.split_at_mut(len as usize);
        out.push(run);
        rest = tail;
        pos = s + len as usize;
    }
    out
}

/// Moves `keys` into their digit's run, in order (the sort is stable).
fn permute(keys: &[u32], shift: u32, mask: u32, runs: &mut [&mut [u32]]) {
    let mut next = vec![0usize; runs.len()];
    for &k in keys {
        let d = ((k >> shift) & mask) as usize;
        runs[d][next[d]] = k;
        next[d] += 1;
    }
}

/// Sorts `a`, with `b` (as long) to move the keys into; returns the sorted keys, then the other
/// array, so that a timer can stop before it is freed (unmapping 16 MiB, which no other mode
/// times).
fn sequential(s: &Size, mut a: Vec<u32>, mut b: Vec<u32>) -> (Vec<u32>, Vec<u32>) {
    let mut hist = vec![0; s.radix()];
    for pass in 0..s.passes() {
        let shift = pass * s.bits;
        histogram(&a, shift, s.mask(), &mut hist);
        let starts = offsets(&hist, 1, s.radix(), s.radix(), 0);
        permute(&a, shift, s.mask(), &mut runs(&mut b, &starts, &hist));
        std::mem::swap(&mut a, &mut b);
    }
    (a, b)
}

fn expected(s: &Size) -> Vec<u32> {
    let mut v = keys::uniform(s.keys, s.seed);
    v.sort_unstable();
    v
}

fn threads(s: &Size, n: usize) -> (f64, Vec<u32>) {
    let mut a = keys::uniform(s.keys, s.seed);
    let mut b = zeroed(s.keys);
    let mut hist = vec![0; n * s.stride()];
    let barrier = Barrier::new(n);
    let t = Timer::start();
    {
        let (a, b, hist) = (SharedMut::new(&mut a), SharedMut::new(&mut b), SharedMut::new(&mut hist));
        std::thread::scope(|scope| {
            for me in 0..n {
                let (a, b, hist, barrier) = (&a, &b, &hist, &barrier);
                scope.spawn(move || {
                    let (begin, end) = block(s.keys, me, n);
                    let row = me * s.stride()..me * s.stride() + s.radix();
                    let (mut src, mut dst) = (a, b);
                    for pass in 0..s.passes() {
                        let shift = pass * s.bits;
                        // SAFETY: in this phase each thread writes only its own histogram row and
                        // reads its own block of `src`, which nobody writes.
                        unsafe {
                            histogram(src.slice(begin..end), shift, s.mask(), hist.slice_mut(row.clone()))
                        };
                        barrier.wait();
                        // SAFETY: in this phase nobody writes the histograms or `src`; each thread
                        // writes its runs of `dst`, which `offsets` makes disjoint from every
                        // other thread's runs.
                        unsafe {
                            let h = hist.slice(0..n * s.stride());
                            let starts = offsets(h, n, s.stride(), s.radix(), me);
                            let mut mine: Vec<&mut [u32]> = (0..s.radix())
                                .map(|d| dst.slice_mut(starts[d]..starts[d] + h[row.start + d] as usize))
                                .collect();
                            permute(src.slice(begin..end), shift, s.mask(), &mut mine);
                        }
                        barrier.wait();
                        std::mem::swap(&mut src, &mut dst);
                    }
                });
            }
        });
    }
    let secs = t.secs();
    (secs, if s.passes().is_multiple_of(2) { a } else { b })
}

fn dsm(app: &mut App, s: &Size) -> treadmarks::Result<(f64, bool)> {
    let tmk = app.tmk();
    let (me, n) = (tmk.proc_id(), tmk.nprocs());
    let mut arrays: [Shared<[u32]>; 3] = [Shared::from_raw_parts(0, 0); 3];
    if me == 0 {
        arrays = [
            tmk.alloc_pages::<u32>(s.keys)?,
            tmk.alloc_pages::<u32>(s.keys)?,
            tmk.alloc_pages::<u32>(n * s.stride())?,
        ];
    }
    tmk.distribute(&mut arrays)?;
    let [a, b, hist] = arrays;
    let (begin, end) = block(s.keys, me, n);
    keys::fill_uniform(&mut tmk.view_mut(&a.slice(begin, end))?, begin, s.seed);
    tmk.barrier(0)?;
    let t = Timer::start();
    let row = hist.slice(me * s.stride(), me * s.stride() + s.radix());
    let (mut src, mut dst) = (a, b);
    for pass in 0..s.passes() {
        let shift = pass * s.bits;
        histogram(&tmk.view(&src.slice(begin, end))?, shift, s.mask(), &mut tmk.view_mut(&row)?);
        tmk.barrier(0)?;
        {
            let h = tmk.view(&hist)?;
            let starts = offsets(&h, n, s.stride(), s.radix(), me);
            let lens = &h[me * s.stride()..][..s.radix()];
            let parts = starts.iter().zip(lens).map(|(&start, &len)| start..start + len as usize);
            let mut out = tmk.view_overwrite_parts(&dst, parts)?;
            let mut mine = runs(&mut out, &starts, lens);
            permute(&tmk.view(&src.slice(begin, end))?, shift, s.mask(), &mut mine);
        }
        tmk.barrier(0)?;
        std::mem::swap(&mut src, &mut dst);
    }
    let secs = t.stop(tmk)?;
    let ok = me != 0 || *tmk.view(&src)? == expected(s)[..];
    Ok((secs, ok))
}

/// The pieces `(rank, start, end)` that the run `start .. start + len` of the destination cuts
/// into at the blocks of `blocks` (contiguous, in order), in order.
fn pieces(
    start: usize,
    len: usize,
    blocks: &[(usize, usize)],
) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let end = start + len;
    (blocks.iter().enumerate())
        .map(move |(q, &(b, e))| (q, start.max(b), end.min(e)))
        .filter(|&(_, lo, hi)| lo < hi)
}

/// An empty buffer for up to `len` keys, its memory mapped ahead ([`zeroed`]).
fn reserved(len: usize) -> Vec<u32> {
    let mut v = zeroed(len);
    v.clear();
    v
}

/// The message-passing version on rank `mesh.rank()`: returns the seconds and, on rank 0, whether
/// the gathered result is sorted right.
fn message_passing(s: &Size, mesh: &mut Mesh, n: usize) -> std::io::Result<(f64, bool)> {
    let me = mesh.rank();
    let blocks: Vec<(usize, usize)> = (0..n).map(|q| block(s.keys, q, n)).collect();
    let (begin, end) = blocks[me];
    let mut src = vec![0; end - begin];
    keys::fill_uniform(&mut src, begin, s.seed);
    let (mut dst, mut stage) = (zeroed(end - begin), zeroed(end - begin));
    // No rank sends or receives more keys than a block holds.
    let (mut outs, mut ins): (Vec<_>, Vec<_>) =
        (0..n).map(|_| (reserved(end - begin), reserved(end - begin))).unzip();
    let mut hists = vec![vec![0; s.radix()]; n];
    mesh.barrier()?;
    let t = Timer::start();
    for pass in 0..s.passes() {
        let shift = pass * s.bits;
        histogram(&src, shift, s.mask(), &mut hists[me]);
        mesh.all_gather(&mut hists)?;
        let flat: Vec<u32> = hists.concat();
        let starts: Vec<Vec<usize>> = (0..n).map(|q| offsets(&flat, n, s.radix(), s.radix(), q)).collect();
        // Sorted by digit here first, then each digit's run cut at the blocks it lands in.
        let mine = &hists[me];
        let local = offsets(mine, 1, s.radix(), s.radix(), 0);
        permute(&src, shift, s.mask(), &mut runs(&mut stage, &local, mine));
        outs.iter_mut().for_each(Vec::clear);
        for d in 0..s.radix() {
            let (run, g) = (&stage[local[d]..][..mine[d] as usize], starts[me][d]);
            for (q, lo, hi) in pieces(g, run.len(), &blocks) {
                let piece = &run[lo - g..hi - g];
                if q == me {
                    dst[lo - begin..hi - begin].copy_from_slice(piece);
                } else {
                    outs[q].extend_from_slice(piece);
                }
            }
        }
        // What rank `q` sends here: the pieces of its runs that land in this block, in order.
        let incoming = |q: usize| {
            let (starts, hist, here) = (&starts[q], &hists[q], &blocks[me..=me]);
            (0..s.radix()).flat_map(move |d| pieces(starts[d], hist[d] as usize, here))
        };
        let counts: Vec<usize> = (0..n).map(|q| incoming(q).map(|(_, lo, hi)| hi - lo).sum()).collect();
        mesh.exchange(&outs, &mut ins, &counts)?;
        for (q, got) in ins.iter().enumerate().filter(|&(q, _)| q != me) {
            let mut at = 0;
            for (_, lo, hi) in incoming(q) {
                dst[lo - begin..hi - begin].copy_from_slice(&got[at..at + hi - lo]);
                at += hi - lo;
            }
        }
        std::mem::swap(&mut src, &mut dst);
    }
    mesh.barrier()?;
    let secs = t.secs();
    // The check, untimed: every block to rank 0.
    let sizes: Vec<usize> = blocks.iter().map(|&(b, e)| if me == 0 { e - b } else { 0 }).collect();
    let mut whole = vec![Vec::new(); n];
    let to_root: Vec<Vec<u32>> =
        (0..n).map(|q| if q == 0 && me != 0 { src.clone() } else { Vec::new() }).collect();
    mesh.exchange(&to_root, &mut whole, &sizes)?;
    whole[0] = src;
    Ok((secs, me != 0 || whole.concat() == expected(s)))
}

/// The CPUs rank 0 claimed for the ranks (rank `r` runs on the `r`-th), as a DSM launcher's
/// nodes hear theirs.
const MP_CPUS_ENV: &str = "RADIX_MP_CPUS";

/// `--mode mp`: the mesh, the sort, the result line (rank 0) and the verdict.
fn main_mp(s: &Size, config: &treadmarks::Config) -> ExitCode {
    let run = || -> Result<bool, String> {
        use treadmarks::mem::sched::{CpuClaim, CpuClaims, allowed_cpus, pin_to, pin_to_cpu};
        let n = config.nprocs as usize;
        // Pinned as a DSM job is, only where no other job holds the CPUs: the first rank
        // claims them (for the life of the run) and tells the others which they are.
        let claim =
            (config.pin.is_none() && Mesh::starts_here()).then(|| CpuClaims::take(allowed_cpus().min(n)));
        let pin = config.pin.or(claim.as_ref().and_then(CpuClaim::pin));
        let claims = claim.and_then(CpuClaim::into_claims);
        let claimed =
            claims.as_ref().map(|c| c.cpus().iter().map(usize::to_string).collect::<Vec<_>>().join(","));
        let mut env: Vec<(&str, &str)> =
            pin.map(|p| ("TMK_PIN", if p { "1" } else { "0" })).into_iter().collect();
        env.extend(claimed.as_deref().map(|cpus| (MP_CPUS_ENV, cpus)));
        let cpus: Option<Vec<usize>> =
            if Mesh::starts_here() { claimed.clone() } else { std::env::var(MP_CPUS_ENV).ok() }
                .and_then(|list| list.split(',').map(|c| c.parse().ok()).collect());
        let mut mesh = Mesh::start_with(n, &env).map_err(|e| format!("cannot start the mesh: {e}"))?;
        if pin.unwrap_or(true) {
            match cpus.as_deref() {
                Some(cpus) if !cpus.is_empty() => pin_to(cpus[mesh.rank() % cpus.len()]),
                _ => pin_to_cpu(mesh.rank()),
            };
        }
        let (secs, ok) =
            message_passing(s, &mut mesh, n).map_err(|e| format!("rank {}: {e}", mesh.rank()))?;
        let me = mesh.rank();
        mesh.finish().map_err(|e| e.to_string())?;
        if me == 0 {
            let detail = format!("{} keys, radix 2^{}, {} passes", s.keys, s.bits, s.passes());
            print_result("radix", "mp", n, secs, &detail, ok);
        }
        Ok(ok)
    };
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            treadmarks::report(&format!("radix: {e}"));
            ExitCode::FAILURE
        }
    }
}

fn size(args: &Args) -> Result<Size, String> {
    let s = Size { keys: args.get("keys"), bits: args.get("bits"), seed: args.get("seed") };
    if !(1..=16).contains(&s.bits) {
        return Err(format!("--bits {} is not from 1 to 16", s.bits));
    }
    if s.keys > u32::MAX as usize {
        return Err(format!("--keys {} does not fit in a u32", s.keys));
    }
    // The keys, the array they move into and the check's sorted copy, and a histogram row per
    // worker. In mp mode a process holds its block, the block it builds, a staging copy and one
    // buffer per rank each way (at most five blocks: one rank's whole input), and rank 0 the
    // gathered result and the sorted copy too.
    let arrays: u128 = if args.mode() == "mp" { 7 } else { 3 };
    let rows = args.nprocs() as u128 * s.stride() as u128;
    treadmarks_examples::fits_memory(&format!("--keys {}", s.keys), 4 * (arrays * s.keys as u128 + rows))?;
    Ok(s)
}

/// The size flags and their defaults (`--help` lists them).
const FLAGS: &[Flag] = &[
    Flag { name: "keys", default: "4194304", help: "keys to sort", aliases: &[] },
    Flag { name: "bits", default: "8", help: "bits per digit, 1 to 16", aliases: &[] },
    Flag { name: "seed", default: "1", help: "key generator seed", aliases: &[] },
];

fn main() -> ExitCode {
    let (config, args) = command_line("radix", FLAGS, &["dsm", "seq", "threads", "mp"]);
    let s = sized("radix", &args, size);
    if args.mode() == "mp" {
        return main_mp(&s, &config);
    }
    run_parsed("radix", &config, &args, s, |app, s| {
        let detail = format!("{} keys, radix 2^{}, {} passes", s.keys, s.bits, s.passes());
        let (secs, ok) = match app.mode {
            Mode::Seq => {
                let input = keys::uniform(s.keys, s.seed);
                let b = zeroed(s.keys);
                let t = Timer::start();
                let (out, _scratch) = sequential(&s, input, b);
                let secs = t.secs();
                (secs, out == expected(&s))
            }
            Mode::Threads => {
                let (secs, out) = threads(&s, app.nprocs);
                (secs, out == expected(&s))
            }
            Mode::Dsm => dsm(app, &s)?,
        };
        Ok(Outcome { secs, ok, detail })
    })
}
