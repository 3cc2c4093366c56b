//! SPLASH-2 LU (contiguous blocks): blocked LU factorization without pivoting of a diagonally
//! dominant matrix. The matrix is stored block by block (each `block` x `block` block contiguous,
//! row-major inside), blocks are owned 2-D scattered over a grid of workers as SPLASH does, and
//! each outer iteration k is three steps: the owner factors the diagonal block; barrier; owners
//! update the blocks of block column k and block row k; barrier; owners update the trailing
//! blocks. Every block is computed by the same operations in every mode, so the results must
//! equal the sequential factorization bit for bit; they are checked element by element, exactly,
//! and the sequential factors (in every mode, seq's own included) are checked against the matrix
//! (L x U = A on sampled rows, componentwise backward error within 1e-9).
//!
//! `lu -n 2 [--mode dsm|seq|threads] [--size 1024] [--block 32]`

use std::process::ExitCode;
use std::sync::Barrier;
use treadmarks::Shared;
use treadmarks_examples::{App, Args, Flag, Mode, Outcome, SharedMut, Timer, run_app, worst};

/// Largest componentwise backward error accepted of the sequential factors.
const TOLERANCE: f64 = 1e-9;

#[derive(Clone, Copy)]
struct Size {
    /// Matrix order.
    n: usize,
    /// Block order.
    bs: usize,
    /// Blocks per row.
    nb: usize,
}

impl Size {
    /// Elements per block.
    fn area(&self) -> usize {
        self.bs * self.bs
    }

    /// Where element (i, j) sits in the block layout.
    fn at(&self, i: usize, j: usize) -> usize {
        ((i / self.bs) * self.nb + j / self.bs) * self.area() + (i % self.bs) * self.bs + j % self.bs
    }
}

/// Which worker owns each block: SPLASH's 2-D scatter over a `rows` x `cols` grid of workers,
/// as square as `nprocs` allows.
#[derive(Clone, Copy)]
struct Owners {
    rows: usize,
    cols: usize,
}

impl Owners {
    fn new(nprocs: usize) -> Self {
        let mut rows = nprocs.isqrt();
        while !nprocs.is_multiple_of(rows) {
            rows -= 1;
        }
        Owners { rows, cols: nprocs / rows }
    }

    /// The owner of block (bi, bj) (SPLASH's `BlockOwner`).
    fn of(&self, bi: usize, bj: usize) -> usize {
        bi % self.cols + (bj % self.rows) * self.cols
    }
}

/// One block operation: a target block (index in the block layout) and the blocks it reads.
#[derive(Clone, Copy, Debug)]
enum Task {
    /// Factor the diagonal block `t` in place.
    Factor { t: usize },
    /// Block-column update: `t` = `t` x U(diag)^-1.
    Column { t: usize, diag: usize },
    /// Block-row update: `t` = L(diag)^-1 x `t`.
    Row { t: usize, diag: usize },
    /// Trailing update: `t` -= `col` x `row`.
    Trailing { t: usize, col: usize, row: usize },
}

impl Task {
    fn target(&self) -> usize {
        match *self {
            Task::Factor { t } | Task::Column { t, .. } | Task::Row { t, .. } | Task::Trailing { t, .. } => t,
        }
    }

    /// The blocks read (besides the target), at most two.
    fn sources(&self) -> [Option<usize>; 2] {
        match *self {
            Task::Factor { .. } => [None, None],
            Task::Column { diag, .. } | Task::Row { diag, .. } => [Some(diag), None],
            Task::Trailing { col, row, .. } => [Some(col), Some(row)],
        }
    }

    /// Runs the task on the target block `a`, given its sources (as [`Task::sources`] lists
    /// them; empty slices for the missing ones).
    fn run(&self, a: &mut [f64], s0: &[f64], s1: &[f64], bs: usize) {
        match self {
            Task::Factor { .. } => {
                for k in 0..bs {
                    let (top, below) = a.split_at_mut((k + 1) * bs);
                    let pivot_row = &top[k * bs..];
                    for row in below.chunks_exact_mut(bs) {
                        row[k] /= pivot_row[k];
                        let l = row[k];
                        for j in k + 1..bs {
                            row[j] -= l * pivot_row[j];
                        }
                    }
                }
            }
            Task::Column { .. } => {
                let d = s0;
                for row in a.chunks_exact_mut(bs) {
                    for k in 0..bs {
                        row[k] /= d[k * bs + k];
                        let l = row[k];
                        for j in k + 1..bs {
                            row[j] -= l * d[k * bs + j];
                        }
                    }
                }
            }
            Task::Row { .. } => {
                let d = s0;
                for k in 0..bs {
                    let (top, below) = a.split_at_mut((k + 1) * bs);
                    let src = &top[k * bs..];
                    for (i, row) in below.chunks_exact_mut(bs).enumerate() {
                        let l = d[(k + 1 + i) * bs + k];
                        for (x, &y) in row.iter_mut().zip(src) {
                            *x -= l * y;
                        }
                    }
                }
            }
            Task::Trailing { .. } => {
                let (col, row) = (s0, s1);
                for (i, out) in a.chunks_exact_mut(bs).enumerate() {
                    for k in 0..bs {
                        let l = col[i * bs + k];
                        for (x, &y) in out.iter_mut().zip(&row[k * bs..][..bs]) {
                            *x -= l * y;
                        }
                    }
                }
            }
        }
    }
}

/// What a worker does next.
enum Op {
    Task(Task),
    Barrier,
}

/// The factorization as seen by worker `me`: its tasks in order, with the barriers between the
/// steps of each outer iteration, handed one by one to `exec`.
fn factor<E>(
    s: &Size,
    me: usize,
    owners: Owners,
    mut exec: impl FnMut(Op) -> Result<(), E>,
) -> Result<(), E> {
    let nb = s.nb;
    let block = |bi: usize, bj: usize| bi * nb + bj;
    for k in 0..nb {
        let diag = block(k, k);
        if owners.of(k, k) == me {
            exec(Op::Task(Task::Factor { t: diag }))?;
        }
        exec(Op::Barrier)?;
        for bi in k + 1..nb {
            if owners.of(bi, k) == me {
                exec(Op::Task(Task::Column { t: block(bi, k), diag }))?;
            }
        }
        for bj in k + 1..nb {
            if owners.of(k, bj) == me {
                exec(Op::Task(Task::Row { t: block(k, bj), diag }))?;
            }
        }
        exec(Op::Barrier)?;
        for bi in k + 1..nb {
            for bj in k + 1..nb {
                if owners.of(bi, bj) == me {
                    let (t, col, row) = (block(bi, bj), block(bi, k), block(k, bj));
                    exec(Op::Task(Task::Trailing { t, col, row }))?;
                }
            }
        }
    }
    Ok(())
}

/// A pseudo-random number in [0, 1) from `x` (SplitMix64).
fn hash01(x: u64) -> f64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as f64 / 2f64.powi(64)
}

/// The contents of block (bi, bj) of the matrix: random entries in [0, 1), plus n on the
/// diagonal (diagonally dominant, so no pivoting is needed).
fn initial_block(s: &Size, bi: usize, bj: usize) -> Vec<f64> {
    let mut v = Vec::with_capacity(s.area());
    for i in bi * s.bs..(bi + 1) * s.bs {
        for j in bj * s.bs..(bj + 1) * s.bs {
            let x = hash01((i * s.n + j) as u64);
            v.push(if i == j { x + s.n as f64 } else { x });
        }
    }
    v
}

/// The whole matrix in block layout.
fn initial(s: &Size) -> Vec<f64> {
    (0..s.nb * s.nb).flat_map(|b| initial_block(s, b / s.nb, b % s.nb)).collect()
}

/// Runs one task on the matrix `m` (block layout) in private memory.
fn run_local(m: &mut [f64], s: &Size, task: Task) {
    let area = s.area();
    // Every source precedes the target in the block layout (it lies in block row or column k,
    // the target below or right of it).
    let (before, rest) = m.split_at_mut(task.target() * area);
    let src = |b: Option<usize>| b.map_or(&[][..], |b| &before[b * area..][..area]);
    let [s0, s1] = task.sources();
    task.run(&mut rest[..area], src(s0), src(s1), s.bs);
}

/// Factors `m` (block layout) on one thread.
fn factor_seq(s: &Size, m: &mut [f64]) {
    let _ = factor::<()>(s, 0, Owners::new(1), |op| {
        if let Op::Task(task) = op {
            run_local(m, s, task);
        }
        Ok(())
    });
}

/// The largest difference between `got` and `want`, element by element, relative to `want`.
fn max_error(got: &[f64], want: &[f64]) -> f64 {
    worst(got.iter().zip(want).map(|(x, y)| if x == y { 0.0 } else { (x - y).abs() / y.abs() }))
}

/// How far L x U (L unit lower triangular and U upper, packed in `lu`) is from the matrix: the
/// componentwise backward error on every 16th row, the largest |(L x U - A)_ij| / (|L| x
/// |U|)_ij, and on every row, through a vector x of positive entries, the largest
/// |(L (U x) - A x)_i| / (|L| (|U| x))_i: an entry wrong anywhere in L or U shows in the second.
fn residual(s: &Size, lu: &[f64], a: &[f64]) -> f64 {
    let n = s.n;
    let x: Vec<f64> = (0..n).map(|i| 0.5 + ((i * 7919) % 1000) as f64 / 1000.0).collect();
    let (mut ux, mut ux_mag) = (vec![0.0; n], vec![0.0; n]);
    for k in 0..n {
        for j in k..n {
            let p = lu[s.at(k, j)] * x[j];
            ux[k] += p;
            ux_mag[k] += p.abs();
        }
    }
    let mut errs = Vec::new();
    for i in 0..n {
        let (mut lux, mut mag) = (ux[i], ux_mag[i]);
        for k in 0..i {
            lux += lu[s.at(i, k)] * ux[k];
            mag += (lu[s.at(i, k)] * ux_mag[k]).abs();
        }
        let ax: f64 = (0..n).map(|j| a[s.at(i, j)] * x[j]).sum();
        let diff = (lux - ax).abs();
        errs.push(if mag > 0.0 { diff / mag } else { diff });
    }
    for i in (0..s.n).step_by(16) {
        for j in 0..s.n {
            let u_ij = if i <= j { lu[s.at(i, j)] } else { 0.0 };
            let (mut sum, mut mag) = (u_ij, u_ij.abs());
            for k in 0..i.min(j + 1) {
                let p = lu[s.at(i, k)] * lu[s.at(k, j)];
                sum += p;
                mag += p.abs();
            }
            let diff = (sum - a[s.at(i, j)]).abs();
            errs.push(if mag > 0.0 { diff / mag } else { diff });
        }
    }
    worst(errs)
}

/// The sequential factors, checked against the matrix (`None` if they do not reproduce it).
fn sequential(s: &Size) -> Option<Vec<f64>> {
    let a = initial(s);
    let mut lu = a.clone();
    factor_seq(s, &mut lu);
    let r = residual(s, &lu, &a);
    if r > TOLERANCE {
        treadmarks::report(&format!("lu: sequential factors do not reproduce the matrix: {r:e}"));
        return None;
    }
    Some(lu)
}

/// Compares a result with the sequential factors, which it must equal exactly: (passed, max
/// relative error).
fn check(s: &Size, got: &[f64]) -> (bool, f64) {
    match sequential(s) {
        Some(want) => {
            let err = max_error(got, &want);
            (err == 0.0, err)
        }
        None => (false, f64::NAN),
    }
}

fn threads(s: &Size, n: usize) -> (f64, Vec<f64>) {
    let mut m = initial(s);
    let barrier = Barrier::new(n);
    let owners = Owners::new(n);
    let area = s.area();
    let t = Timer::start();
    {
        let m = SharedMut::new(&mut m);
        std::thread::scope(|scope| {
            for me in 0..n {
                let (m, barrier) = (&m, &barrier);
                scope.spawn(move || {
                    let _ = factor::<()>(s, me, owners, |op| {
                        match op {
                            Op::Task(task) => {
                                let blk = |b: Option<usize>| b.map(|b| b * area..(b + 1) * area);
                                let [s0, s1] = task.sources().map(blk);
                                let t = task.target();
                                // Between two barrier waits each block is written only by its
                                // owner, through one task at a time; blocks read in a step are
                                // written by nobody in that step.
                                // SAFETY: disjoint writers, and the target is never a source.
                                let (a, s0, s1) = unsafe {
                                    (
                                        m.slice_mut(t * area..(t + 1) * area),
                                        s0.map_or(&[][..], |r| m.slice(r)),
                                        s1.map_or(&[][..], |r| m.slice(r)),
                                    )
                                };
                                task.run(a, s0, s1, s.bs);
                            }
                            Op::Barrier => {
                                barrier.wait();
                            }
                        }
                        Ok(())
                    });
                });
            }
        });
    }
    (t.secs(), m)
}

fn dsm(app: &mut App, s: &Size) -> treadmarks::Result<(f64, bool, f64)> {
    let tmk = app.tmk();
    let (me, n) = (tmk.proc_id(), tmk.nprocs());
    let owners = Owners::new(n);
    let area = s.area();
    let mut m: Shared<[f64]> = Shared::from_raw_parts(0, 0);
    if me == 0 {
        m = tmk.alloc_pages::<f64>(s.n * s.n)?;
    }
    tmk.distribute(&mut m)?;
    let blk = |b: usize| m.slice(b * area, (b + 1) * area);
    for b in 0..s.nb * s.nb {
        let (bi, bj) = (b / s.nb, b % s.nb);
        if owners.of(bi, bj) == me {
            tmk.view_mut(&blk(b))?.copy_from_slice(&initial_block(s, bi, bj));
        }
    }
    tmk.barrier(0)?;
    // The tasks of one step (between two barriers) run together: first one view declares every
    // block they read, so the misses of the step are fetched at once, one request per writer,
    // and one declares every block they write, twinned in one step; then the tasks run in order.
    let run_step = |tmk: &mut treadmarks::Tmk, step: &mut Vec<Task>| -> treadmarks::Result<()> {
        let range = |b: usize| b * area..(b + 1) * area;
        drop(tmk.view_parts(&m, step.iter().flat_map(|t| t.sources().into_iter().flatten().map(range)))?);
        drop(tmk.view_mut_parts(&m, step.iter().map(|t| range(t.target())))?);
        for task in step.drain(..) {
            let [s0, s1] = task.sources().map(|b| b.map(blk));
            let (v0, v1) = (s0.map(|h| tmk.view(&h)).transpose()?, s1.map(|h| tmk.view(&h)).transpose()?);
            let mut a = tmk.view_mut(&blk(task.target()))?;
            task.run(&mut a, v0.as_deref().unwrap_or(&[]), v1.as_deref().unwrap_or(&[]), s.bs);
        }
        Ok(())
    };
    let mut step = Vec::new();
    let t = Timer::start();
    factor(s, me, owners, |op| match op {
        Op::Task(task) => {
            step.push(task);
            Ok(())
        }
        Op::Barrier => {
            run_step(tmk, &mut step)?;
            tmk.barrier(0)
        }
    })?;
    run_step(tmk, &mut step)?;
    tmk.barrier(0)?;
    let secs = t.stop(tmk)?;
    if me != 0 {
        return Ok((secs, true, 0.0));
    }
    let (ok, err) = check(s, &tmk.view(&m)?);
    Ok((secs, ok, err))
}

/// The size flags and their defaults (`--help` lists them).
const FLAGS: &[Flag] = &[
    Flag { name: "size", default: "1024", help: "matrix order", aliases: &[] },
    Flag { name: "block", default: "32", help: "block order", aliases: &[] },
];

fn size(args: &Args) -> Result<Size, String> {
    let n: usize = args.get("size");
    let bs: usize = args.get("block");
    if bs == 0 || !n.is_multiple_of(bs) {
        return Err(format!("--size {n} is not a multiple of --block {bs}"));
    }
    // The matrix and the copy its check keeps, n x n doubles each.
    treadmarks_examples::fits_memory(&format!("--size {n}"), 16 * (n as u128).pow(2))?;
    Ok(Size { n, bs, nb: n / bs })
}

fn main() -> ExitCode {
    run_app("lu", FLAGS, size, |app, s| {
        let (n, bs) = (s.n, s.bs);
        let (secs, ok, err) = match app.mode {
            Mode::Seq => {
                let a = initial(&s);
                let mut m = a.clone();
                let t = Timer::start();
                factor_seq(&s, &mut m);
                let secs = t.secs();
                let r = residual(&s, &m, &a);
                (secs, r <= TOLERANCE, r)
            }
            Mode::Threads => {
                let (secs, m) = threads(&s, app.nprocs);
                let (ok, err) = check(&s, &m);
                (secs, ok, err)
            }
            Mode::Dsm => dsm(app, &s)?,
        };
        let detail = match app.mode {
            Mode::Seq => format!("{n}x{n}, block {bs}, backward error {err:.1e} (tolerance {TOLERANCE:.0e})"),
            _ => format!("{n}x{n}, block {bs}, max relative error from seq {err:.1e} (must be 0)"),
        };
        Ok(Outcome { secs, ok, detail })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check sees an entry wrong on a row the sampled rows skip, in L or in U.
    #[test]
    fn a_wrong_entry_on_any_row_fails_the_check() {
        let s = Size { n: 64, bs: 16, nb: 4 };
        let a = initial(&s);
        let mut lu = a.clone();
        factor_seq(&s, &mut lu);
        assert!(residual(&s, &lu, &a) <= TOLERANCE);
        for (i, j) in [(17, 3), (33, 50)] {
            let mut bad = lu.clone();
            bad[s.at(i, j)] *= 1.0 + 1e-6;
            let r = residual(&s, &bad, &a);
            assert!(r > TOLERANCE, "entry ({i}, {j}) off by 1e-6 gives {r:e}");
        }
    }
}
