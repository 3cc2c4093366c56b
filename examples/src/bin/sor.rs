//! Red-black successive over-relaxation (TreadMarks' SOR): red and black points in separate
//! arrays, rows split into contiguous blocks, barriers only. Every point is computed by the same
//! operations in every mode, so the DSM and threads results must equal the sequential one bit
//! for bit.
//!
//! `sor -n 2 [--mode dsm|seq|threads] [--rows 2000] [--cols 1000] [--iterations 1000]`

use std::process::ExitCode;
use std::sync::Barrier;
use treadmarks::Shared;
use treadmarks_examples::{App, Args, Flag, Mode, Outcome, SharedMut, Timer, block, run_app};

struct Size {
    rows: usize,
    half: usize,
    iterations: usize,
}

/// One half-step over rows `rows`: update `dst` (red if `red`) from `src`, both `half` columns
/// wide. `dst` starts at row `dst_row0` and `src` at row `src_row0` of the grid.
#[allow(clippy::too_many_arguments)]
fn half_step(
    dst: &mut [f64],
    dst_row0: usize,
    src: &[f64],
    src_row0: usize,
    rows: std::ops::Range<usize>,
    half: usize,
    red: bool,
    nrows: usize,
) {
    for i in rows {
        if i == 0 || i == nrows - 1 {
            continue;
        }
        // Red point (i, j) sits at column 2j + (i odd); its left/right black neighbours are j-1/j
        // (even rows) or j/j+1 (odd rows). Black is the mirror image.
        let shift = if red == (i % 2 == 1) { 0 } else { 1 };
        let up = &src[(i - 1 - src_row0) * half..][..half];
        let mid = &src[(i - src_row0) * half..][..half];
        let down = &src[(i + 1 - src_row0) * half..][..half];
        let out = &mut dst[(i - dst_row0) * half..][..half];
        // Boundary columns (a neighbour index outside 0..half) stay fixed.
        for j in shift..half + shift - 1 {
            let (l, r) = (j - shift, j + 1 - shift);
            out[j] = (up[j] + down[j] + mid[l] + mid[r]) * 0.25;
        }
    }
}

fn initial(s: &Size) -> Vec<f64> {
    let (rows, half) = (s.rows, s.half);
    (0..rows * half)
        .map(|k| if k < half || k >= (rows - 1) * half || k % half == 0 { 1.0 } else { 0.0 })
        .collect()
}

fn sequential(s: &Size) -> (Vec<f64>, Vec<f64>) {
    relax(s, initial(s), initial(s))
}

/// Runs all iterations on one thread, from grids `red` and `black` (both initialized).
fn relax(s: &Size, mut red: Vec<f64>, mut black: Vec<f64>) -> (Vec<f64>, Vec<f64>) {
    for _ in 0..s.iterations {
        half_step(&mut red, 0, &black, 0, 0..s.rows, s.half, true, s.rows);
        half_step(&mut black, 0, &red, 0, 0..s.rows, s.half, false, s.rows);
    }
    (red, black)
}

fn threads(s: &Size, n: usize) -> (f64, Vec<f64>, Vec<f64>) {
    let (mut red, mut black) = (initial(s), initial(s));
    let barrier = Barrier::new(n);
    let t = Timer::start();
    {
        let (r, b) = (SharedMut::new(&mut red), SharedMut::new(&mut black));
        std::thread::scope(|scope| {
            for me in 0..n {
                let (r, b, barrier) = (&r, &b, &barrier);
                scope.spawn(move || {
                    let (begin, end) = block(s.rows, me, n);
                    let (lo, hi) = (begin.saturating_sub(1), (end + 1).min(s.rows));
                    for _ in 0..s.iterations {
                        for (dst, src, red) in [(r, b, true), (b, r, false)] {
                            // SAFETY: between two barrier waits each thread writes only its own
                            // rows of `dst` and reads `src`, which nobody writes in this phase.
                            let (out, inp) = unsafe {
                                (
                                    dst.slice_mut(begin * s.half..end * s.half),
                                    src.slice(lo * s.half..hi * s.half),
                                )
                            };
                            half_step(out, begin, inp, lo, begin..end, s.half, red, s.rows);
                            barrier.wait();
                        }
                    }
                });
            }
        });
    }
    (t.secs(), red, black)
}

fn dsm(app: &mut App, s: &Size) -> treadmarks::Result<(f64, bool)> {
    let tmk = app.tmk();
    let (me, n) = (tmk.proc_id(), tmk.nprocs());
    let mut grids: [Shared<[f64]>; 2] = [Shared::from_raw_parts(0, 0); 2];
    if me == 0 {
        for g in &mut grids {
            *g = tmk.alloc_pages::<f64>(s.rows * s.half)?;
        }
    }
    tmk.distribute(&mut grids)?;
    let [red, black] = grids;
    let (begin, end) = block(s.rows, me, n);
    let init = initial(s);
    for g in [red, black] {
        tmk.view_mut(&g.slice(begin * s.half, end * s.half))?
            .copy_from_slice(&init[begin * s.half..end * s.half]);
    }
    tmk.barrier(0)?;
    let t = Timer::start();
    let (lo, hi) = (begin.saturating_sub(1), (end + 1).min(s.rows));
    for _ in 0..s.iterations {
        for (dst, src, is_red) in [(red, black, true), (black, red, false)] {
            if begin < end {
                let inp = tmk.view(&src.slice(lo * s.half, hi * s.half))?;
                let mut out = tmk.view_mut(&dst.slice(begin * s.half, end * s.half))?;
                half_step(&mut out, begin, &inp, lo, begin..end, s.half, is_red, s.rows);
            }
            tmk.barrier(0)?;
        }
    }
    let secs = t.stop(tmk)?;
    let ok = me != 0 || {
        let (sr, sb) = sequential(s);
        *tmk.view(&red)? == sr[..] && *tmk.view(&black)? == sb[..]
    };
    Ok((secs, ok))
}

/// The size flags and their defaults (`--help` lists them).
const FLAGS: &[Flag] = &[
    Flag { name: "rows", default: "2000", help: "grid rows" },
    Flag { name: "cols", default: "1000", help: "grid columns (red and black together)" },
    Flag { name: "iterations", default: "1000", help: "iterations" },
];

fn size(args: &Args) -> Result<Size, String> {
    let cols: usize = args.get("cols");
    if cols < 2 || !cols.is_multiple_of(2) {
        // Red and black points alternate along a row: each array holds half of it.
        return Err(format!("--cols {cols} is not an even number of 2 or more"));
    }
    let rows: usize = args.get("rows");
    // The red and the black array, half a row of doubles each.
    treadmarks_examples::fits_memory(
        &format!("--rows {rows} --cols {cols}"),
        8 * rows as u128 * cols as u128,
    )?;
    Ok(Size { rows, half: cols / 2, iterations: args.get("iterations") })
}

fn main() -> ExitCode {
    run_app("sor", FLAGS, size, |app, s| {
        let detail = format!("{}x{}, {} iterations", s.rows, s.half * 2, s.iterations);
        let (secs, ok) = match app.mode {
            Mode::Seq => {
                let (red, black) = (initial(&s), initial(&s));
                let t = Timer::start();
                let _ = relax(&s, red, black);
                (t.secs(), true)
            }
            Mode::Threads => {
                let (secs, red, black) = threads(&s, app.nprocs);
                let (sr, sb) = sequential(&s);
                (secs, red == sr && black == sb)
            }
            Mode::Dsm => dsm(app, &s)?,
        };
        Ok(Outcome { secs, ok, detail })
    })
}
