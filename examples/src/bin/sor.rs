//! Red-black successive over-relaxation (TreadMarks' SOR): red and black points in separate
//! arrays, rows split into contiguous blocks, barriers only. Every point is computed by the same
//! operations in every mode, so the DSM and threads results must equal the sequential one bit
//! for bit.
//!
//! The sequential result is itself checked, wherever it is computed (seq mode, and as the others'
//! reference), by code that does not share [`half_step`]'s index arithmetic: the last black
//! half-step recomputed from the final red array on the plain 2-D grid ([`check_last_black`]).
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
    (0..s.rows * s.half).map(|k| initial_value(s, k)).collect()
}

/// The initial value of element `k` of the red or the black array: 1 on the first and last row
/// and at the first element of every row, 0 elsewhere.
fn initial_value(s: &Size, k: usize) -> f64 {
    let (rows, half) = (s.rows, s.half);
    if k < half || k >= (rows - 1) * half || k.is_multiple_of(half) { 1.0 } else { 0.0 }
}

/// Checks a final `red` and `black` against the last black half-step, recomputed on the plain
/// grid: point `(i, c)` (`c` in `0..2 half`) is red where `i + c` is even, black where it is odd,
/// element `c / 2` of row `i` of its array either way. Every black point off the grid's border
/// must be, bit for bit, the mean of its four red neighbours summed as the relaxation sums them
/// (up, down, left, right), every black border point its initial value, and every point in
/// `0..=1` (the initial values' range, which a mean cannot leave).
fn check_last_black(s: &Size, red: &[f64], black: &[f64]) -> bool {
    let (rows, cols, half) = (s.rows, 2 * s.half, s.half);
    let red_at = |i: usize, c: usize| red[i * half + c / 2];
    let ok = (0..rows).all(|i| {
        (0..cols).all(|c| {
            let k = i * half + c / 2;
            if (i + c) % 2 == 0 {
                return (0.0..=1.0).contains(&red[k]);
            }
            let want = if s.iterations == 0 || i == 0 || i == rows - 1 || c == 0 || c == cols - 1 {
                initial_value(s, k)
            } else {
                (red_at(i - 1, c) + red_at(i + 1, c) + red_at(i, c - 1) + red_at(i, c + 1)) * 0.25
            };
            black[k].to_bits() == want.to_bits() && (0.0..=1.0).contains(&black[k])
        })
    });
    if !ok {
        treadmarks::report("sor: the sequential result is not its last black half-step");
    }
    ok
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
        check_last_black(s, &sr, &sb) && *tmk.view(&red)? == sr[..] && *tmk.view(&black)? == sb[..]
    };
    Ok((secs, ok))
}

/// The size flags and their defaults (`--help` lists them).
const FLAGS: &[Flag] = &[
    Flag { name: "rows", default: "2000", help: "grid rows", aliases: &[] },
    Flag { name: "cols", default: "1000", help: "grid columns (red and black together)", aliases: &[] },
    Flag { name: "iterations", default: "1000", help: "iterations", aliases: &[] },
];

fn size(args: &Args) -> Result<Size, String> {
    let cols: usize = args.get("cols");
    if cols < 2 || !cols.is_multiple_of(2) {
        // Red and black points alternate along a row: each array holds half of it.
        return Err(format!("--cols {cols} is not an even number of 2 or more"));
    }
    let rows: usize = args.get("rows");
    // The red and the black array, half a row of doubles each: the run's (and in DSM mode the
    // input a node keeps, as large), and the sequential reference's.
    treadmarks_examples::fits_memory(
        &format!("--rows {rows} --cols {cols}"),
        5 * 4 * rows as u128 * cols as u128,
    )?;
    Ok(Size { rows, half: cols / 2, iterations: args.get("iterations") })
}

fn main() -> ExitCode {
    run_app("sor", FLAGS, size, |app, s| {
        let detail = format!(
            "{}x{}, {} iterations; sequential result checked against its last black half-step",
            s.rows,
            s.half * 2,
            s.iterations
        );
        let (secs, ok) = match app.mode {
            Mode::Seq => {
                let (red, black) = (initial(&s), initial(&s));
                let t = Timer::start();
                let (red, black) = relax(&s, red, black);
                let secs = t.secs();
                (secs, check_last_black(&s, &red, &black))
            }
            Mode::Threads => {
                let (secs, red, black) = threads(&s, app.nprocs);
                let (sr, sb) = sequential(&s);
                (secs, check_last_black(&s, &sr, &sb) && red == sr && black == sb)
            }
            Mode::Dsm => dsm(app, &s)?,
        };
        Ok(Outcome { secs, ok, detail })
    })
}
