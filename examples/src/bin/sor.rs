//! Red-black successive over-relaxation (TreadMarks' SOR): red and black points in separate
//! arrays, rows split into contiguous blocks, barriers only. The DSM result must equal the
//! sequential one bit for bit (every point is computed by the same operations in both).
//!
//! `sor -n 4 --rows 1000 --cols 1000 --iterations 50 [--mode dsm|seq]`

use std::process::ExitCode;
use treadmarks::{Shared, Tmk};
use treadmarks_examples::{Args, Timer, block, verdict};

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

fn initial(nrows: usize, half: usize) -> Vec<f64> {
    (0..nrows * half)
        .map(|k| if k < half || k >= (nrows - 1) * half || k % half == 0 { 1.0 } else { 0.0 })
        .collect()
}

fn sequential(nrows: usize, half: usize, iterations: usize) -> (Vec<f64>, Vec<f64>) {
    let (mut red, mut black) = (initial(nrows, half), initial(nrows, half));
    for _ in 0..iterations {
        half_step(&mut red, 0, &black, 0, 0..nrows, half, true, nrows);
        half_step(&mut black, 0, &red, 0, 0..nrows, half, false, nrows);
    }
    (red, black)
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            treadmarks::report(&format!("sor: {e}"));
            ExitCode::FAILURE
        }
    }
}

fn run() -> treadmarks::Result<ExitCode> {
    let mut tmk = Tmk::startup()?;
    let args = Args::new(tmk.args());
    let nrows: usize = args.get("rows", 1000);
    let half: usize = args.get::<usize>("cols", 1000) / 2;
    let iterations: usize = args.get("iterations", 50);
    let mode: String = args.get("mode", "dsm".to_string());
    if mode == "seq" {
        let t = Timer::start();
        let (red, _) = sequential(nrows, half, iterations);
        let detail = format!(
            "seq {nrows}x{} {iterations} iterations: {:.3} s, red[1][1]={}",
            half * 2,
            t.secs(),
            red[half + 1]
        );
        tmk.exit()?;
        return Ok(verdict("sor", true, &detail));
    }

    let (me, nprocs) = (tmk.proc_id(), tmk.nprocs());
    let mut grids: [Shared<[f64]>; 2] = [Shared::from_raw_parts(0, 0); 2];
    if me == 0 {
        for g in &mut grids {
            *g = tmk.alloc_pages::<f64>(nrows * half)?;
            tmk.view_mut(g)?.copy_from_slice(&initial(nrows, half));
        }
    }
    tmk.distribute(&mut grids)?;
    let [red, black] = grids;
    let (begin, end) = block(nrows, me, nprocs);
    tmk.barrier(0)?;
    let t = Timer::start();
    for _ in 0..iterations {
        for (dst, src, is_red) in [(red, black, true), (black, red, false)] {
            if begin < end {
                let (lo, hi) = (begin.saturating_sub(1), (end + 1).min(nrows));
                let src_rows = tmk.view(&src.slice(lo * half, hi * half))?;
                let mut dst_rows = tmk.view_mut(&dst.slice(begin * half, end * half))?;
                half_step(&mut dst_rows, begin, &src_rows, lo, begin..end, half, is_red, nrows);
            }
            tmk.barrier(0)?;
        }
    }
    let secs = t.secs();
    let mut ok = true;
    let mut detail =
        format!("dsm {nrows}x{} {iterations} iterations on {nprocs} nodes: {secs:.3} s", half * 2);
    if me == 0 {
        let (sr, sb) = sequential(nrows, half, iterations);
        ok = *tmk.view(&red)? == sr[..] && *tmk.view(&black)? == sb[..];
        detail += if ok { ", equal to the sequential run" } else { ", DIFFERS from the sequential run" };
    }
    tmk.exit()?;
    Ok(if me == 0 { verdict("sor", ok, &detail) } else { ExitCode::SUCCESS })
}
