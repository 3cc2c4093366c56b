//! 7-point Jacobi relaxation on a 3-D grid: two grids swapped every iteration, the grid split
//! into slabs of planes along the outermost dimension, barriers only. Every interior point
//! becomes the mean of itself and its six neighbours, summed in the same order in every mode, so
//! the DSM and threads results must equal the sequential one bit for bit. Boundary points never
//! change.
//!
//! The sequential result is itself checked, wherever it is computed (seq mode, and as the others'
//! reference), by code that does not share [`sweep`]'s slicing: the last sweep recomputed from
//! the grid before it on the plain 3-D grid ([`check_last_sweep`]).
//!
//! `jacobi3d -n 2 [--mode dsm|seq|threads] [--nx 128] [--ny 128] [--nz 64] [--iterations 1000]`
//! (`nx` is the outermost dimension, split across nodes; `nz` the contiguous one).

use std::ops::Range;
use std::process::ExitCode;
use std::sync::Barrier;
use treadmarks::Shared;
use treadmarks_examples::keys::mix;
use treadmarks_examples::{App, Args, Flag, Mode, Outcome, SharedMut, Timer, block, run_app};

#[derive(Clone, Copy)]
struct Size {
    nx: usize,
    ny: usize,
    nz: usize,
    iterations: usize,
}

impl Size {
    /// Points in one plane (one value of the outermost index).
    fn plane(&self) -> usize {
        self.ny * self.nz
    }
}

/// One sweep over the planes `planes`: writes their interior points of `dst` from `src`. `dst`
/// starts at plane `dst_p0` and `src` at plane `src_p0` of the grid; `src` must hold the planes
/// next to `planes` too.
fn sweep(dst: &mut [f64], dst_p0: usize, src: &[f64], src_p0: usize, planes: Range<usize>, s: &Size) {
    let (ny, nz, plane) = (s.ny, s.nz, s.plane());
    for i in planes {
        if i == 0 || i == s.nx - 1 {
            continue;
        }
        let below = &src[(i - 1 - src_p0) * plane..][..plane];
        let here = &src[(i - src_p0) * plane..][..plane];
        let above = &src[(i + 1 - src_p0) * plane..][..plane];
        let out = &mut dst[(i - dst_p0) * plane..][..plane];
        for j in 1..ny.saturating_sub(1) {
            let row = j * nz;
            let (c, n, so) = (&here[row..][..nz], &here[row + nz..][..nz], &here[row - nz..][..nz]);
            let (b, a) = (&below[row..][..nz], &above[row..][..nz]);
            let o = &mut out[row..][..nz];
            for k in 1..nz.saturating_sub(1) {
                o[k] = (c[k] + c[k - 1] + c[k + 1] + so[k] + n[k] + b[k] + a[k]) * (1.0 / 7.0);
            }
        }
    }
}

/// The initial value of every point of planes `planes` (boundary included), plane by plane:
/// pseudo-random multiples of 1/1024 in 0..1, so that no plane or page repeats another (one
/// delivered to the wrong place cannot pass the check).
fn initial(s: &Size, planes: Range<usize>) -> Vec<f64> {
    let start = planes.start * s.plane();
    (start..start + planes.len() * s.plane()).map(initial_value).collect()
}

/// The initial value of point `p` (its index in the whole grid).
fn initial_value(p: usize) -> f64 {
    (mix(3, p as u64) % 1024) as f64 / 1024.0
}

/// The largest initial value: no mean of values in `0..=MAX_VALUE` leaves that range (every
/// partial sum `k MAX_VALUE`, `k <= 7`, is exact, and the rounded 1/7 is below 1/7).
const MAX_VALUE: f64 = 1023.0 / 1024.0;

/// The grid after all iterations, and the one before it (the last sweep's source; the initial
/// grid if there were none).
fn sequential(s: &Size) -> [Vec<f64>; 2] {
    relax(s, [initial(s, 0..s.nx), initial(s, 0..s.nx)])
}

/// Runs all iterations on one thread, starting from `grids` (both initialized). Returns the last
/// grid, then the one before it.
fn relax(s: &Size, mut grids: [Vec<f64>; 2]) -> [Vec<f64>; 2] {
    for it in 0..s.iterations {
        let [g0, g1] = &mut grids;
        let (src, dst) = if it.is_multiple_of(2) { (&*g0, g1) } else { (&*g1, g0) };
        sweep(dst, 0, src, 0, 0..s.nx, s);
    }
    let [g0, g1] = grids;
    if s.iterations.is_multiple_of(2) { [g0, g1] } else { [g1, g0] }
}

/// Checks the grid `last` against the last sweep, recomputed from `before` (the grid it swept)
/// on the plain grid, point `(i, j, k)` at `(i ny + j) nz + k`: every point off the border must
/// be, bit for bit, the mean of itself and its six neighbours summed as a sweep sums them (itself,
/// `k - 1`, `k + 1`, `j - 1`, `j + 1`, `i - 1`, `i + 1`), every border point its initial value,
/// and every point within the initial values' range (`0..=MAX_VALUE`).
fn check_last_sweep(s: &Size, last: &[f64], before: &[f64]) -> bool {
    let (nx, ny, nz) = (s.nx, s.ny, s.nz);
    let at = |i: usize, j: usize, k: usize| (i * ny + j) * nz + k;
    let ok = (0..nx).all(|i| {
        (0..ny).all(|j| {
            (0..nz).all(|k| {
                let p = at(i, j, k);
                let border = i == 0 || i == nx - 1 || j == 0 || j == ny - 1 || k == 0 || k == nz - 1;
                let want = if border || s.iterations == 0 {
                    initial_value(p)
                } else {
                    let b = before;
                    (b[p]
                        + b[at(i, j, k - 1)]
                        + b[at(i, j, k + 1)]
                        + b[at(i, j - 1, k)]
                        + b[at(i, j + 1, k)]
                        + b[at(i - 1, j, k)]
                        + b[at(i + 1, j, k)])
                        * (1.0 / 7.0)
                };
                last[p].to_bits() == want.to_bits() && (0.0..=MAX_VALUE).contains(&last[p])
            })
        })
    });
    if !ok {
        treadmarks::report("jacobi3d: the sequential result is not its last sweep");
    }
    ok
}

/// The sequential result, checked ([`check_last_sweep`]): `None` if it fails.
fn checked_sequential(s: &Size) -> Option<Vec<f64>> {
    let [last, before] = sequential(s);
    check_last_sweep(s, &last, &before).then_some(last)
}

fn threads(s: &Size, n: usize) -> (f64, Vec<f64>) {
    let mut grids = [initial(s, 0..s.nx), initial(s, 0..s.nx)];
    let barrier = Barrier::new(n);
    let plane = s.plane();
    let t = Timer::start();
    {
        let [g0, g1] = &mut grids;
        let g = [SharedMut::new(g0), SharedMut::new(g1)];
        std::thread::scope(|scope| {
            for me in 0..n {
                let (g, barrier) = (&g, &barrier);
                scope.spawn(move || {
                    let (begin, end) = block(s.nx, me, n);
                    let (lo, hi) = (begin.saturating_sub(1), (end + 1).min(s.nx));
                    for it in 0..s.iterations {
                        let (src, dst) = (&g[it % 2], &g[(it + 1) % 2]);
                        // SAFETY: between two barrier waits each thread writes only its own
                        // planes of `dst` and reads `src`, which nobody writes in this phase.
                        let (out, inp) = unsafe {
                            (dst.slice_mut(begin * plane..end * plane), src.slice(lo * plane..hi * plane))
                        };
                        sweep(out, begin, inp, lo, begin..end, s);
                        barrier.wait();
                    }
                });
            }
        });
    }
    let secs = t.secs();
    let [g0, g1] = grids;
    (secs, if s.iterations.is_multiple_of(2) { g0 } else { g1 })
}

fn dsm(app: &mut App, s: &Size) -> treadmarks::Result<(f64, bool)> {
    let tmk = app.tmk();
    let (me, n) = (tmk.proc_id(), tmk.nprocs());
    let plane = s.plane();
    let mut grids: [Shared<[f64]>; 2] = [Shared::from_raw_parts(0, 0); 2];
    if me == 0 {
        for g in &mut grids {
            *g = tmk.alloc_pages::<f64>(s.nx * plane)?;
        }
    }
    tmk.distribute(&mut grids)?;
    let (begin, end) = block(s.nx, me, n);
    let init = initial(s, begin..end);
    for g in grids {
        tmk.view_mut(&g.slice(begin * plane, end * plane))?.copy_from_slice(&init);
    }
    tmk.barrier(0)?;
    let t = Timer::start();
    let (lo, hi) = (begin.saturating_sub(1), (end + 1).min(s.nx));
    for it in 0..s.iterations {
        let (src, dst) = (grids[it % 2], grids[(it + 1) % 2]);
        if begin < end {
            let inp = tmk.view(&src.slice(lo * plane, hi * plane))?;
            let mut out = tmk.view_mut(&dst.slice(begin * plane, end * plane))?;
            sweep(&mut out, begin, &inp, lo, begin..end, s);
        }
        tmk.barrier(0)?;
    }
    let secs = t.stop(tmk)?;
    let ok = me != 0
        || match checked_sequential(s) {
            Some(want) => *tmk.view(&grids[s.iterations % 2])? == want[..],
            None => false,
        };
    Ok((secs, ok))
}

/// The size flags and their defaults (`--help` lists them).
const FLAGS: &[Flag] = &[
    Flag { name: "nx", default: "128", help: "grid planes (the partitioned dimension)", aliases: &[] },
    Flag { name: "ny", default: "128", help: "grid rows", aliases: &[] },
    Flag { name: "nz", default: "64", help: "grid columns", aliases: &[] },
    Flag { name: "iterations", default: "1000", help: "sweeps", aliases: &[] },
];

fn size(args: &Args) -> Result<Size, String> {
    let s = Size {
        nx: args.get("nx"),
        ny: args.get("ny"),
        nz: args.get("nz"),
        iterations: args.get("iterations"),
    };
    // Grids of doubles: the run's two (and in DSM mode the input a node keeps, at most one), and
    // the sequential reference's two.
    let points = s.nx as u128 * s.ny as u128 * s.nz as u128;
    treadmarks_examples::fits_memory(&format!("--nx {} --ny {} --nz {}", s.nx, s.ny, s.nz), 5 * 8 * points)?;
    Ok(s)
}

fn main() -> ExitCode {
    run_app("jacobi3d", FLAGS, size, |app, s| {
        let detail = format!(
            "{}x{}x{}, {} iterations; sequential result checked against its last sweep",
            s.nx, s.ny, s.nz, s.iterations
        );
        let (secs, ok) = match app.mode {
            Mode::Seq => {
                let grids = [initial(&s, 0..s.nx), initial(&s, 0..s.nx)];
                let t = Timer::start();
                let [last, before] = relax(&s, grids);
                let secs = t.secs();
                (secs, check_last_sweep(&s, &last, &before))
            }
            Mode::Threads => {
                let (secs, grid) = threads(&s, app.nprocs);
                (secs, checked_sequential(&s).is_some_and(|want| grid == want))
            }
            Mode::Dsm => dsm(app, &s)?,
        };
        Ok(Outcome { secs, ok, detail })
    })
}
