//! 7-point Jacobi relaxation on a 3-D grid: two grids swapped every iteration, the grid split
//! into slabs of planes along the outermost dimension, barriers only. Every interior point
//! becomes the mean of itself and its six neighbours, summed in the same order in every mode, so
//! the DSM and threads results must equal the sequential one bit for bit. Boundary points never
//! change.
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
    (start..start + planes.len() * s.plane()).map(|p| (mix(3, p as u64) % 1024) as f64 / 1024.0).collect()
}

/// The grid after all iterations.
fn sequential(s: &Size) -> Vec<f64> {
    relax(s, [initial(s, 0..s.nx), initial(s, 0..s.nx)])
}

/// Runs all iterations on one thread, starting from `grids` (both initialized).
fn relax(s: &Size, mut grids: [Vec<f64>; 2]) -> Vec<f64> {
    for it in 0..s.iterations {
        let [g0, g1] = &mut grids;
        let (src, dst) = if it.is_multiple_of(2) { (&*g0, g1) } else { (&*g1, g0) };
        sweep(dst, 0, src, 0, 0..s.nx, s);
    }
    let [g0, g1] = grids;
    if s.iterations.is_multiple_of(2) { g0 } else { g1 }
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
    let ok = me != 0 || *tmk.view(&grids[s.iterations % 2])? == sequential(s)[..];
    Ok((secs, ok))
}

/// The size flags and their defaults (`--help` lists them).
const FLAGS: &[Flag] = &[
    Flag { name: "nx", default: "128", help: "grid planes (the partitioned dimension)" },
    Flag { name: "ny", default: "128", help: "grid rows" },
    Flag { name: "nz", default: "64", help: "grid columns" },
    Flag { name: "iterations", default: "1000", help: "sweeps" },
];

fn size(args: &Args) -> Result<Size, String> {
    let s = Size {
        nx: args.get("nx"),
        ny: args.get("ny"),
        nz: args.get("nz"),
        iterations: args.get("iterations"),
    };
    // Two grids of doubles.
    let points = s.nx as u128 * s.ny as u128 * s.nz as u128;
    treadmarks_examples::fits_memory(&format!("--nx {} --ny {} --nz {}", s.nx, s.ny, s.nz), 16 * points)?;
    Ok(s)
}

fn main() -> ExitCode {
    run_app("jacobi3d", FLAGS, size, |app, s| {
        let detail = format!("{}x{}x{}, {} iterations", s.nx, s.ny, s.nz, s.iterations);
        let (secs, ok) = match app.mode {
            Mode::Seq => {
                let grids = [initial(&s, 0..s.nx), initial(&s, 0..s.nx)];
                let t = Timer::start();
                let _ = relax(&s, grids);
                (t.secs(), true)
            }
            Mode::Threads => {
                let (secs, grid) = threads(&s, app.nprocs);
                (secs, grid == sequential(&s))
            }
            Mode::Dsm => dsm(app, &s)?,
        };
        Ok(Outcome { secs, ok, detail })
    })
}
