//! SPLASH-2 FFT: a 1-D complex FFT of n = 2^m points by the six-step method. The data is a
//! sqrt(n) x sqrt(n) matrix whose rows are split into contiguous blocks; each worker transposes
//! its rows in from the other array, runs radix-2 FFTs on them (multiplying by the twiddle
//! factors after the first round), with barriers between the steps:
//!
//! transpose x -> s, row FFTs + twiddle; barrier; transpose s -> x, row FFTs; barrier;
//! transpose x -> s; barrier.
//!
//! The forward transform (timed) leaves the result in s, in natural order. Checks: equal bit for
//! bit to the sequential six-step run, within 1e-9 (relative to the largest value) of a plain
//! radix-2 FFT of the whole input, and the inverse transform (the same steps from s back into x,
//! untimed) returns the input within 1e-9.
//!
//! `fft -n 2 [--mode dsm|seq|threads] [--log2n 20]` (`log2n` even)

use std::ops::Range;
use std::process::ExitCode;
use std::sync::Barrier;
use treadmarks::Shared;
use treadmarks_examples::{App, Args, Flag, Mode, Outcome, SharedMut, Timer, block, run_app, worst, zeroed};

/// Largest error accepted, relative to the largest value.
const TOLERANCE: f64 = 1e-9;

/// A complex number (re, im).
type C = [f64; 2];

fn mul(a: C, b: C) -> C {
    [a[0] * b[0] - a[1] * b[1], a[0] * b[1] + a[1] * b[0]]
}

fn conj(a: C) -> C {
    [a[0], -a[1]]
}

/// e^(-2 pi i k / n).
fn root(k: usize, n: usize) -> C {
    let (s, c) = (-2.0 * std::f64::consts::PI * k as f64 / n as f64).sin_cos();
    [c, s]
}

/// The roots e^(-2 pi i k / n) for k < n / 2, as [`fft_in_place`] wants them.
fn roots(n: usize) -> Vec<C> {
    (0..n / 2).map(|k| root(k, n)).collect()
}

/// In-place iterative radix-2 FFT of `a` (length a power of two, at least 2), forward with the
/// `roots` of its length, or inverse (unscaled) with their conjugates.
fn fft_in_place(a: &mut [C], roots: &[C], inverse: bool) {
    let n = a.len();
    let bits = n.trailing_zeros();
    for i in 0..n {
        let j = i.reverse_bits() >> (usize::BITS - bits);
        if i < j {
            a.swap(i, j);
        }
    }
    let mut half = 1;
    while half < n {
        let step = n / (2 * half);
        for chunk in a.chunks_exact_mut(2 * half) {
            let (lo, hi) = chunk.split_at_mut(half);
            for (k, (u, v)) in lo.iter_mut().zip(hi).enumerate() {
                let w = if inverse { conj(roots[k * step]) } else { roots[k * step] };
                let t = mul(*v, w);
                *v = [u[0] - t[0], u[1] - t[1]];
                *u = [u[0] + t[0], u[1] + t[1]];
            }
        }
        half *= 2;
    }
}

/// One worker's share of the six-step method and what it needs: rows `rows` of the
/// `n1` x `n1` matrix, the roots for the row FFTs and the twiddle factors of its rows.
struct Worker {
    n1: usize,
    rows: Range<usize>,
    roots: Vec<C>,
    /// e^(-2 pi i r c / n) for rows r in `rows`, columns c in `0..n1`.
    twiddles: Vec<C>,
}

impl Worker {
    fn new(n1: usize, rows: Range<usize>) -> Self {
        let n = n1 * n1;
        let twiddles = rows.clone().flat_map(|r| (0..n1).map(move |c| root(r * c % n, n))).collect();
        Worker { n1, rows, roots: roots(n1), twiddles }
    }

    /// Elements of this worker's rows.
    fn span(&self) -> Range<usize> {
        self.rows.start * self.n1..self.rows.end * self.n1
    }

    /// The elements of the source array that [`Worker::transpose`] reads: this worker's columns
    /// of every row.
    fn transpose_reads(&self) -> impl Iterator<Item = Range<usize>> + use<> {
        let (n1, rows) = (self.n1, self.rows.clone());
        (0..n1).map(move |r| r * n1 + rows.start..r * n1 + rows.end)
    }

    /// Writes this worker's rows of `dst` (`dst` holds just them) as the transpose of `src`.
    fn transpose(&self, dst: &mut [C], src: &[C]) {
        const TILE: usize = 16;
        let (n1, r0) = (self.n1, self.rows.start);
        for rb in (0..self.rows.len()).step_by(TILE) {
            for cb in (0..n1).step_by(TILE) {
                for r in rb..(rb + TILE).min(self.rows.len()) {
                    let out = &mut dst[r * n1..][cb..(cb + TILE).min(n1)];
                    for (k, o) in out.iter_mut().enumerate() {
                        *o = src[(cb + k) * n1 + r0 + r];
                    }
                }
            }
        }
    }

    /// Row FFTs on this worker's rows (`rows` holds just them), then the twiddle factors if
    /// `twiddle`, or the 1/n scaling if `scale`.
    fn row_ffts(&self, rows: &mut [C], inverse: bool, twiddle: bool, scale: bool) {
        let n1 = self.n1;
        let factor = 1.0 / (n1 * n1) as f64;
        for (i, row) in rows.chunks_exact_mut(n1).enumerate() {
            fft_in_place(row, &self.roots, inverse);
            if twiddle {
                for (x, &w) in row.iter_mut().zip(&self.twiddles[i * n1..][..n1]) {
                    *x = mul(*x, if inverse { conj(w) } else { w });
                }
            }
            if scale {
                for x in row.iter_mut() {
                    *x = [x[0] * factor, x[1] * factor];
                }
            }
        }
    }
}

/// One step of the six-step method; arrays are 0 (x) and 1 (s).
#[derive(Clone, Copy)]
enum Step {
    /// Transpose into this worker's rows of `to`.
    Transpose {
        from: usize,
        to: usize,
    },
    /// Row FFTs on this worker's rows of `on`.
    Rows {
        on: usize,
        twiddle: bool,
        scale: bool,
    },
    Barrier,
}

/// The steps of one transform, handed one by one to `exec`: forward from x into s, or inverse
/// from s into x (the other array is scratch).
fn six_step<E>(inverse: bool, mut exec: impl FnMut(Step) -> Result<(), E>) -> Result<(), E> {
    let (a, b) = if inverse { (1, 0) } else { (0, 1) };
    exec(Step::Transpose { from: a, to: b })?;
    exec(Step::Rows { on: b, twiddle: true, scale: false })?;
    exec(Step::Barrier)?;
    exec(Step::Transpose { from: b, to: a })?;
    exec(Step::Rows { on: a, twiddle: false, scale: inverse })?;
    exec(Step::Barrier)?;
    exec(Step::Transpose { from: a, to: b })?;
    exec(Step::Barrier)
}

/// Input elements `range`: pseudo-random values in [-0.5, 0.5).
fn input(range: Range<usize>) -> Vec<C> {
    let v = |x: usize| ((x.wrapping_mul(2_654_435_761) >> 7) % 4096) as f64 / 4096.0 - 0.5;
    range.map(|j| [v(2 * j), v(2 * j + 1)]).collect()
}

/// Runs one transform on one thread on `arrays` (x, s).
fn transform_seq(w: &Worker, arrays: &mut [Vec<C>; 2], inverse: bool) {
    let _ = six_step::<()>(inverse, |step| {
        match step {
            Step::Transpose { from, .. } => {
                let [x, s] = arrays;
                let (src, dst) = if from == 0 { (&*x, s) } else { (&*s, x) };
                w.transpose(dst, src);
            }
            Step::Rows { on, twiddle, scale } => w.row_ffts(&mut arrays[on], inverse, twiddle, scale),
            Step::Barrier => {}
        }
        Ok(())
    });
}

/// The largest difference between `got` and `want`, relative to the largest value of `want`.
fn max_error(got: &[C], want: &[C]) -> f64 {
    let scale = want.iter().fold(0f64, |m, x| m.max(x[0].abs()).max(x[1].abs()));
    worst(got.iter().zip(want).flat_map(|(x, y)| [(x[0] - y[0]).abs(), (x[1] - y[1]).abs()])) / scale
}

/// The input of `n` points and an array as long to transform it into, its pages mapped ahead.
fn arrays(n: usize) -> [Vec<C>; 2] {
    [input(0..n), zeroed(n)]
}

/// Checks a forward result against the sequential six-step run (exactly) and a plain radix-2
/// FFT (within the tolerance): (passed, error against radix-2).
fn check_forward(n1: usize, got: &[C]) -> (bool, f64) {
    let n = n1 * n1;
    let w = Worker::new(n1, 0..n1);
    let mut arrays = arrays(n);
    transform_seq(&w, &mut arrays, false);
    let exact = got == arrays[1];
    if !exact {
        treadmarks::report("fft: the result differs from the sequential six-step run");
    }
    let mut plain = input(0..n);
    fft_in_place(&mut plain, &roots(n), false);
    let err = max_error(got, &plain);
    (exact && err <= TOLERANCE, err)
}

/// Checks an inverse result against the input: (passed, error).
fn check_inverse(got: &[C]) -> (bool, f64) {
    let err = max_error(got, &input(0..got.len()));
    (err <= TOLERANCE, err)
}

/// Verdict and detail from the two checks.
fn verdict(n: usize, forward: (bool, f64), inverse: (bool, f64)) -> (bool, String) {
    let detail = format!(
        "{n} points, error {:.1e} against radix-2, inverse error {:.1e} (tolerance {TOLERANCE:.0e})",
        forward.1, inverse.1
    );
    (forward.0 && inverse.0, detail)
}

fn threads(n1: usize, nthreads: usize) -> (f64, bool, String) {
    let n = n1 * n1;
    let mut arrays = arrays(n);
    let workers: Vec<Worker> = (0..nthreads)
        .map(|me| {
            let (begin, end) = block(n1, me, nthreads);
            Worker::new(n1, begin..end)
        })
        .collect();
    let barrier = Barrier::new(nthreads);
    let run = |arrays: &mut [Vec<C>; 2], inverse: bool| {
        let [x, s] = arrays;
        let shared = [SharedMut::new(x), SharedMut::new(s)];
        std::thread::scope(|scope| {
            for w in &workers {
                let (shared, barrier) = (&shared, &barrier);
                scope.spawn(move || {
                    let _ = six_step::<()>(inverse, |step| {
                        match step {
                            Step::Transpose { from, to } => {
                                // Between two barrier waits every thread reads all of `from`,
                                // which nobody writes in this phase.
                                // SAFETY: each thread writes only its own rows of `to`.
                                let (dst, src) =
                                    unsafe { (shared[to].slice_mut(w.span()), shared[from].slice(0..n)) };
                                w.transpose(dst, src);
                            }
                            Step::Rows { on, twiddle, scale } => {
                                // SAFETY: only this thread touches its own rows of `on` in this
                                // phase (the others read `from`, the other array).
                                let rows = unsafe { shared[on].slice_mut(w.span()) };
                                w.row_ffts(rows, inverse, twiddle, scale);
                            }
                            Step::Barrier => {
                                barrier.wait();
                            }
                        }
                        Ok(())
                    });
                });
            }
        });
    };
    let t = Timer::start();
    run(&mut arrays, false);
    let secs = t.secs();
    let forward = check_forward(n1, &arrays[1]);
    run(&mut arrays, true);
    let (ok, detail) = verdict(n, forward, check_inverse(&arrays[0]));
    (secs, ok, detail)
}

fn dsm(app: &mut App, n1: usize) -> treadmarks::Result<(f64, bool, String)> {
    let tmk = app.tmk();
    let (me, nprocs) = (tmk.proc_id(), tmk.nprocs());
    let n = n1 * n1;
    let mut arrays: [Shared<[C]>; 2] = [Shared::from_raw_parts(0, 0); 2];
    if me == 0 {
        for a in &mut arrays {
            *a = tmk.alloc_pages::<C>(n)?;
        }
    }
    tmk.distribute(&mut arrays)?;
    let (begin, end) = block(n1, me, nprocs);
    let w = Worker::new(n1, begin..end);
    let mine = |a: usize| arrays[a].slice(w.span().start, w.span().end);
    tmk.view_mut(&mine(0))?.copy_from_slice(&input(w.span()));
    tmk.barrier(0)?;
    let transform = |tmk: &mut treadmarks::Tmk, inverse: bool| {
        six_step(inverse, |step| match step {
            Step::Transpose { from, to } => {
                let src = tmk.view_parts(&arrays[from], w.transpose_reads())?;
                w.transpose(&mut tmk.view_mut(&mine(to))?, &src);
                Ok(())
            }
            Step::Rows { on, twiddle, scale } => {
                w.row_ffts(&mut tmk.view_mut(&mine(on))?, inverse, twiddle, scale);
                Ok(())
            }
            Step::Barrier => tmk.barrier(0),
        })
    };
    let t = Timer::start();
    transform(tmk, false)?;
    let secs = t.stop(tmk)?;
    let forward = if me == 0 { check_forward(n1, &tmk.view(&arrays[1])?) } else { (true, 0.0) };
    transform(tmk, true)?;
    if me != 0 {
        return Ok((secs, true, String::new()));
    }
    let (ok, detail) = verdict(n, forward, check_inverse(&tmk.view(&arrays[0])?));
    Ok((secs, ok, detail))
}

/// The size flags and their defaults (`--help` lists them).
const FLAGS: &[Flag] =
    &[Flag { name: "log2n", default: "20", help: "log2 of the points (even)", aliases: &[] }];

/// The side `n1` of the `n1 x n1` view of the points.
fn size(args: &Args) -> Result<usize, String> {
    let m: u32 = args.get("log2n");
    if !(2..=40).contains(&m) || !m.is_multiple_of(2) {
        return Err(format!("--log2n {m} must be even, from 2 to 40"));
    }
    // Arrays of 2^m complex numbers (16 bytes): the run's two, and while node 0 checks the forward
    // transform, the sequential six-step run's two and the plain radix-2 FFT's one.
    treadmarks_examples::fits_memory(&format!("--log2n {m}"), (5 * 16) << m)?;
    Ok(1 << (m / 2))
}

fn main() -> ExitCode {
    run_app("fft", FLAGS, size, |app, n1| {
        let (secs, ok, detail) = match app.mode {
            Mode::Seq => {
                let n = n1 * n1;
                let w = Worker::new(n1, 0..n1);
                let mut arrays = arrays(n);
                let t = Timer::start();
                transform_seq(&w, &mut arrays, false);
                let secs = t.secs();
                let forward = check_forward(n1, &arrays[1]);
                transform_seq(&w, &mut arrays, true);
                let (ok, detail) = verdict(n, forward, check_inverse(&arrays[0]));
                (secs, ok, detail)
            }
            Mode::Threads => threads(n1, app.nprocs),
            Mode::Dsm => dsm(app, n1)?,
        };
        Ok(Outcome { secs, ok, detail })
    })
}
