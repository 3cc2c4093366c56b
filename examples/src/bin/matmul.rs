//! Dense matrix product C = A x B (a DSM-overhead probe): rows of C split into contiguous blocks,
//! every worker initializes its rows of A and B, one barrier, then computes its rows of C with an
//! i-k-j loop reading all of B. The entries are small integers, so every sum is exact and the
//! DSM and threads results must equal the sequential one bit for bit.
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

fn sequential(n: usize) -> Vec<f64> {
    let (a, b) = initial(0..n, n);
    let mut c = zeroed(n * n);
    multiply(&mut c, &a, &b, 0..n, n);
    c
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
    let ok = me != 0 || *tmk.view(&c)? == sequential(n)[..];
    Ok((secs, ok))
}

/// The size flags and their defaults (`--help` lists them).
const FLAGS: &[Flag] = &[Flag { name: "size", default: "1024", help: "matrix order" }];

fn main() -> ExitCode {
    run_app(
        "matmul",
        FLAGS,
        |args| {
            let n: usize = args.get("size");
            // A, B and C, n x n doubles each.
            treadmarks_examples::fits_memory(&format!("--size {n}"), 24 * (n as u128).pow(2))?;
            Ok(n)
        },
        |app, n: usize| {
            let detail = format!("{n}x{n}");
            let (secs, ok) = match app.mode {
                Mode::Seq => {
                    let (a, b) = initial(0..n, n);
                    let mut c = zeroed(n * n);
                    let t = Timer::start();
                    multiply(&mut c, &a, &b, 0..n, n);
                    (t.secs(), true)
                }
                Mode::Threads => {
                    let (secs, c) = threads(n, app.nprocs);
                    (secs, c == sequential(n))
                }
                Mode::Dsm => dsm(app, n)?,
            };
            Ok(Outcome { secs, ok, detail })
        },
    )
}
