//! Dense matrix product C = A x B (a DSM-overhead probe): rows of C split into contiguous blocks,
//! every worker initializes its rows of A and B, one barrier, then computes its rows of C with an
//! i-k-j loop reading all of B. The entries are small integers, so every sum is exact and the
//! DSM and threads results must equal the sequential one bit for bit.
//!
//! The sequential product is itself checked, wherever it is computed (seq mode, and as the
//! others' reference), by Freivalds' test, which shares no code with [`multiply`]: `C x` must
//! equal `A (B x)` exactly for two vectors `x` of small nonzero integers ([`freivalds`]).
//!
//! `matmul -n 2 [--mode dsm|seq|threads] [--size 1024]`

use std::ops::Range;
use std::process::ExitCode;
use std::sync::Barrier;
use treadmarks::Shared;
use treadmarks_examples::keys::mix;
use treadmarks_examples::{App, Flag, Mode, Outcome, SharedMut, Timer, block, run_app, zeroed};

/// Rows `rows` of C (into `c`, which holds just those rows) from the same rows of A (`a`) and
/// all of B, every matrix `n` x `n`, row-major.
fn multiply(c: &mut [f64], a: &[f64], b: &[f64], rows: Range<usize>, n: usize) {
    for i in 0..rows.len() {
        let crow = &mut c[i * n..][..n];
        crow.fill(0.0);
        for (k, &aik) in a[i * n..][..n].iter().enumerate() {
            let brow = &b[k * n..][..n];
            for (cij, &bkj) in crow.iter_mut().zip(brow) {
                *cij += aik * bkj;
            }
        }
    }
}

/// Rows `rows` of A and of B: pseudo-random integers in -3..=3 and -2..=2 (every sum exact; no
/// row or page repeats another, so one delivered to the wrong place cannot pass the check).
fn initial(rows: Range<usize>, n: usize) -> (Vec<f64>, Vec<f64>) {
    let at = move |seed, i: usize, j: usize, m: u64| (mix(seed, (i * n + j) as u64) % m) as f64;
    let a = rows.clone().flat_map(|i| (0..n).map(move |k| at(1, i, k, 7) - 3.0)).collect();
    let b = rows.flat_map(|k| (0..n).map(move |j| at(2, k, j, 5) - 2.0)).collect();
    (a, b)
}

/// The sequential product, checked ([`freivalds`]): `None` if it fails.
fn sequential(n: usize) -> Option<Vec<f64>> {
    let (a, b) = initial(0..n, n);
    let mut c = zeroed(n * n);
    multiply(&mut c, &a, &b, 0..n, n);
    freivalds(&a, &b, &c, n).then_some(c)
}

/// `m x` for an `n` x `n` row-major `m`.
fn times(m: &[f64], x: &[f64], n: usize) -> Vec<f64> {
    m.chunks_exact(n.max(1)).map(|row| row.iter().zip(x).map(|(r, v)| r * v).sum()).collect()
}

/// Freivalds' test of `c == a b`: `c x == a (b x)` for two fixed vectors `x` of integers in
/// 1..=7, in O(n^2). Every sum is of integers below 2^53 (`|a (b x)|` and `|c x|` are at most
/// 3 x 2 x 7 n^2; memory keeps `n` far below the 1.4e7 where that reaches 2^53), so it is exact:
/// a wrong entry `c[i][j]` alone moves `(c x)[i]` by `x[j]` times its error, never 0; errors in
/// one row cancel for one `x` in at most one case in 7. Says so if it fails.
fn freivalds(a: &[f64], b: &[f64], c: &[f64], n: usize) -> bool {
    let ok = [11, 12].iter().all(|&seed| {
        let x: Vec<f64> = (0..n).map(|j| (mix(seed, j as u64) % 7 + 1) as f64).collect();
        times(c, &x, n) == times(a, &times(b, &x, n), n)
    });
    if !ok {
        treadmarks::report("matmul: the sequential product fails Freivalds' test");
    }
    ok
}

fn threads(n: usize, nthreads: usize) -> (f64, Vec<f64>) {
    let (a, b) = initial(0..n, n);
    let mut c = zeroed(n * n);
    let barrier = Barrier::new(nthreads);
    let t = Timer::start();
    {
        let c = SharedMut::new(&mut c);
        std::thread::scope(|scope| {
            for me in 0..nthreads {
                let (a, b, c, barrier) = (&a, &b, &c, &barrier);
                scope.spawn(move || {
                    let (begin, end) = block(n, me, nthreads);
                    // SAFETY: each thread writes only its own rows of C, and nobody else touches
                    // them until the threads are joined.
                    let out = unsafe { c.slice_mut(begin * n..end * n) };
                    multiply(out, &a[begin * n..end * n], b, begin..end, n);
                    barrier.wait();
                });
            }
        });
    }
    (t.secs(), c)
}

fn dsm(app: &mut App, n: usize) -> treadmarks::Result<(f64, bool)> {
    let tmk = app.tmk();
    let (me, nprocs) = (tmk.proc_id(), tmk.nprocs());
    let mut mats: [Shared<[f64]>; 3] = [Shared::from_raw_parts(0, 0); 3];
    if me == 0 {
        for m in &mut mats {
            *m = tmk.alloc_pages::<f64>(n * n)?;
        }
    }
    tmk.distribute(&mut mats)?;
    let [a, b, c] = mats;
    let (begin, end) = block(n, me, nprocs);
    let (my_a, my_b) = initial(begin..end, n);
    tmk.view_mut(&a.slice(begin * n, end * n))?.copy_from_slice(&my_a);
    tmk.view_mut(&b.slice(begin * n, end * n))?.copy_from_slice(&my_b);
    tmk.barrier(0)?;
    let t = Timer::start();
    if begin < end {
        let (av, bv) = (tmk.view(&a.slice(begin * n, end * n))?, tmk.view(&b)?);
        multiply(&mut tmk.view_mut(&c.slice(begin * n, end * n))?, &av, &bv, begin..end, n);
    }
    tmk.barrier(0)?;
    let secs = t.stop(tmk)?;
    let ok = me != 0
        || match sequential(n) {
            Some(want) => *tmk.view(&c)? == want[..],
            None => false,
        };
    Ok((secs, ok))
}

/// The size flags and their defaults (`--help` lists them).
const FLAGS: &[Flag] = &[Flag { name: "size", default: "1024", help: "matrix order", aliases: &[] }];

fn main() -> ExitCode {
    run_app(
        "matmul",
        FLAGS,
        |args| {
            let n: usize = args.get("size");
            // A, B and C, n x n doubles each: the run's (and in DSM mode the rows of A and B a
            // node keeps, at most two more), and the sequential reference's.
            treadmarks_examples::fits_memory(&format!("--size {n}"), 8 * 8 * (n as u128).pow(2))?;
            Ok(n)
        },
        |app, n: usize| {
            let detail = format!("{n}x{n}; sequential product checked by Freivalds' test");
            let (secs, ok) = match app.mode {
                Mode::Seq => {
                    let (a, b) = initial(0..n, n);
                    let mut c = zeroed(n * n);
                    let t = Timer::start();
                    multiply(&mut c, &a, &b, 0..n, n);
                    let secs = t.secs();
                    (secs, freivalds(&a, &b, &c, n))
                }
                Mode::Threads => {
                    let (secs, c) = threads(n, app.nprocs);
                    (secs, sequential(n).is_some_and(|want| c == want))
                }
                Mode::Dsm => dsm(app, n)?,
            };
            Ok(Outcome { secs, ok, detail })
        },
    )
}
