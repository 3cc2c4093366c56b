//! Water-nsquared (SPLASH-2), with simplified physics: molecules of three sites (O, H, H) held
//! by harmonic bonds, Lennard-Jones between oxygens and a Coulomb term between all sites of two
//! molecules whose oxygens are closer than the cutoff (half the periodic box), integrated by a
//! fourth-order Gear predictor-corrector.
//!
//! The structure is SPLASH's: molecules split into contiguous blocks per node; each step
//! predicts, computes the intramolecular forces of its own molecules, then (barrier) the
//! O(n^2/2) intermolecular pairs: molecule i against the n/2 molecules after it (cyclically),
//! accumulated privately and then added into the shared force of each molecule under that
//! molecule's lock; (barrier) corrects its own molecules, applies the periodic boundary and adds
//! its energies into shared sums under a lock (barrier).
//!
//! Forces arrive under the locks in a run-dependent order, so results are compared with the
//! sequential run within a relative tolerance of 1e-9: every order of the molecules' state (each
//! relative to its largest magnitude) and the energies.
//!
//! The sequential run is itself checked, after the timer, wherever it is computed (seq mode, and
//! as the reference of the others), and so is the DSM or threads result:
//! - Total momentum is conserved: every pair and bond force is applied with opposite signs and the
//!   corrector is linear in the force, so `P = sum m v` moves only by rounding (about 1e-16 of
//!   `sum |m v|`); the check allows [`MOMENTUM_TOLERANCE`]. A force applied to one side
//!   of a pair only, or a molecule whose force is never added, moves it by `5/12 dt^2 |df|`.
//! - The forces a step computes (bonds, pairs, and their gathering through `touched`) are minus
//!   the gradient of the potential energy the same functions return: central differences on a
//!   few molecules of a jittered lattice, within [`FD_TOLERANCE`] (see [`force_check`]).
//!
//! Energy is not checked: molecule pairs crossing the cutoff make it jump (the Lennard-Jones term
//! is not shifted to zero there), by more than a force error would; its drift is printed.
//!
//! `water -n 2 [--mode dsm|seq|threads] [--molecules 512] [--steps 20]` (`--iterations` is
//! another name for `--steps`)

use bytemuck::{Pod, Zeroable};
use std::process::ExitCode;
use std::sync::{Barrier, Mutex};
use treadmarks::Shared;
use treadmarks_examples::rng::Rng;
use treadmarks_examples::{
    App, Args, Flag, Mode, Outcome, SharedMut, Timer, block, fits_memory, run_app, worst,
};

const DT: f64 = 0.002;
/// Site masses (O, H, H) and charges.
const MASS: [f64; 3] = [16.0, 1.0, 1.0];
const CHARGE: [f64; 3] = [-0.8, 0.4, 0.4];
/// Harmonic bonds: O-H and H-H stiffness and rest lengths.
const K_OH: f64 = 200.0;
const R_OH: f64 = 0.33;
const K_HH: f64 = 100.0;
/// Lennard-Jones between oxygens.
const LJ_EPS: f64 = 0.5;
const LJ_SIGMA: f64 = 0.8;
/// Gear corrector coefficients for a second-order equation, four values.
const GEAR: [f64; 4] = [1.0 / 6.0, 5.0 / 6.0, 1.0, 1.0 / 3.0];
/// Largest relative difference accepted from the sequential run: the sums of forces and
/// energies are taken in another order (the nodes' lock order), nothing else differs.
const TOLERANCE: f64 = 1e-9;
/// Largest change of the total momentum accepted, relative to `sum |m v|`: rounding moves it by
/// about 1e-16 of that (measured: 8e-17 after 20 steps at 64 and at 512 molecules, in every mode
/// and on 1 to 4 nodes; 4e-16 after 2,000 steps), so a factor of 1e5 above; a force contribution
/// `df` applied to one side only moves it by `5/12 dt^2 |df|`, which this catches from `|df|` of
/// about 1e-4.
const MOMENTUM_TOLERANCE: f64 = 1e-11;
/// The force check's step (in position units) and largest error accepted, relative to the largest
/// force component of the probed molecule. Central differences agree to about 1e-8 (truncation,
/// `h^2 / 6` times the potential's third derivative, and the energy's rounding over `2h`).
const FD_STEP: f64 = 1e-5;
const FD_TOLERANCE: f64 = 1e-5;
/// Molecules whose 9 coordinates the force check probes (spread over the index range), besides
/// the last one.
const FD_MOLECULES: usize = 4;
/// Test hook: names a molecule whose force update node 1 leaves out in the last step of a DSM
/// run, a lost update the check must catch.
const TEST_DROP_ENV: &str = "WATER_TEST_DROP_FORCE";
/// Lock of the energy sums; molecule `m` has lock `1 + m % MOL_LOCKS` (SPLASH's `MolLock`).
const ENERGY_LOCK: u32 = 0;
const MOL_LOCKS: usize = 1000;

fn mol_lock(m: usize) -> u32 {
    1 + (m % MOL_LOCKS) as u32
}

/// One molecule: for each derivative order (position, dt * velocity, dt^2/2 * acceleration,
/// dt^3/6 * its derivative), the 9 coordinates of O, H1, H2.
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
#[repr(C)]
struct Mol {
    x: [[f64; 9]; 4],
}

type Force = [f64; 9];

struct Params {
    molecules: usize,
    steps: usize,
    /// Side of the periodic box, and the interaction cutoff (half of it).
    side: f64,
    cutoff: f64,
}

impl Params {
    fn new(molecules: usize, steps: usize) -> Params {
        let side = lattice_side(molecules) as f64;
        Params { molecules, steps, side, cutoff: side / 2.0 }
    }
}

/// The side of the smallest cubic lattice holding `n` molecules: the least `k` with `k^3 >= n`.
/// In integers: `(n as f64).cbrt().ceil()` gave one more for some perfect cubes (glibc's `cbrt`
/// returns a little more than 3 for 27, and so for 216, 729, 1728, ...), a box with a slab of
/// vacuum.
fn lattice_side(n: usize) -> usize {
    let cube = |k: usize| (k as u128).pow(3);
    // The float root is within one of the integer one, for any usize.
    let mut k = (n as f64).cbrt() as usize;
    while k > 0 && cube(k - 1) >= n as u128 {
        k -= 1;
    }
    while cube(k) < n as u128 {
        k += 1;
    }
    k
}

/// Molecules on a cubic lattice of spacing 1, jittered, randomly oriented, random velocities.
fn initial(p: &Params) -> Vec<Mol> {
    let mut rng = Rng::new(2024);
    let per_side = p.side as usize;
    let half_angle = 52.0f64.to_radians();
    (0..p.molecules)
        .map(|m| {
            let cell = [m % per_side, m / per_side % per_side, m / (per_side * per_side)];
            let o: [f64; 3] = std::array::from_fn(|k| cell[k] as f64 + 0.5 + rng.range(-0.05, 0.05));
            // Two random orthonormal directions.
            let u = unit(std::array::from_fn(|_| rng.range(-1.0, 1.0)));
            let w = unit(cross(u, std::array::from_fn(|_| rng.range(-1.0, 1.0))));
            let v: [f64; 3] = std::array::from_fn(|_| rng.range(-0.5, 0.5));
            let mut mol = Mol::zeroed();
            for k in 0..3 {
                let (c, s) = (R_OH * half_angle.cos() * u[k], R_OH * half_angle.sin() * w[k]);
                mol.x[0][k] = o[k];
                mol.x[0][3 + k] = o[k] + c + s;
                mol.x[0][6 + k] = o[k] + c - s;
                for a in 0..3 {
                    mol.x[1][3 * a + k] = v[k] * DT;
                }
            }
            mol
        })
        .collect()
}

fn unit(v: [f64; 3]) -> [f64; 3] {
    let n = (v[0] * v[0] + v[1] * v[1] + v[2] * v[2]).sqrt().max(1e-12);
    [v[0] / n, v[1] / n, v[2] / n]
}

fn cross(a: [f64; 3], b: [f64; 3]) -> [f64; 3] {
    [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]
}

/// PREDIC: Taylor-expands every derivative one step ahead.
fn predict(mols: &mut [Mol]) {
    for m in mols {
        for c in 0..9 {
            let [x0, x1, x2, x3] = [m.x[0][c], m.x[1][c], m.x[2][c], m.x[3][c]];
            m.x[0][c] = x0 + x1 + x2 + x3;
            m.x[1][c] = x1 + 2.0 * x2 + 3.0 * x3;
            m.x[2][c] = x2 + 3.0 * x3;
        }
    }
}

/// Adds the harmonic bond between sites `a` and `b` of `x` to `f`; returns its energy.
fn bond(x: &[f64; 9], f: &mut Force, a: usize, b: usize, k: f64, r0: f64) -> f64 {
    let d: [f64; 3] = std::array::from_fn(|i| x[3 * a + i] - x[3 * b + i]);
    let r = (d[0] * d[0] + d[1] * d[1] + d[2] * d[2]).sqrt();
    let s = -k * (r - r0) / r;
    for i in 0..3 {
        f[3 * a + i] += s * d[i];
        f[3 * b + i] -= s * d[i];
    }
    0.5 * k * (r - r0) * (r - r0)
}

/// INTRAF: sets each molecule's force to its intramolecular one; returns their energy.
fn intraf(mols: &[Mol], forces: &mut [Force]) -> f64 {
    let r_hh = 2.0 * R_OH * 52.0f64.to_radians().sin();
    let mut energy = 0.0;
    for (m, f) in mols.iter().zip(forces) {
        *f = [0.0; 9];
        energy += bond(&m.x[0], f, 0, 1, K_OH, R_OH);
        energy += bond(&m.x[0], f, 0, 2, K_OH, R_OH);
        energy += bond(&m.x[0], f, 1, 2, K_HH, r_hh);
    }
    energy
}

/// The forces between molecules `a` and `b` (on `a`; `b` gets the opposite) and their energy,
/// or nothing beyond the cutoff. Uses the periodic image of `b` nearest to `a`'s oxygen.
fn pair(p: &Params, a: &[f64; 9], b: &[f64; 9], fa: &mut Force, fb: &mut Force) -> f64 {
    let mut shift = [0.0; 3];
    let mut r2 = 0.0;
    for k in 0..3 {
        let d = a[k] - b[k];
        shift[k] = -p.side * (d / p.side).round();
        let d = d + shift[k];
        r2 += d * d;
    }
    if r2 >= p.cutoff * p.cutoff {
        return 0.0;
    }
    let mut energy = 0.0;
    for sa in 0..3 {
        for sb in 0..3 {
            let d: [f64; 3] = std::array::from_fn(|k| a[3 * sa + k] - b[3 * sb + k] + shift[k]);
            let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
            let inv = 1.0 / r2.sqrt();
            let qq = CHARGE[sa] * CHARGE[sb];
            // Coulomb, shifted to zero at the cutoff; f = -dU/dr / r.
            energy += qq * (inv - 1.0 / p.cutoff);
            let mut s = qq * inv * inv * inv;
            if sa == 0 && sb == 0 {
                let sr6 = (LJ_SIGMA * LJ_SIGMA / r2).powi(3);
                energy += 4.0 * LJ_EPS * (sr6 * sr6 - sr6);
                s += 24.0 * LJ_EPS * (2.0 * sr6 * sr6 - sr6) / r2;
            }
            for k in 0..3 {
                fa[3 * sa + k] += s * d[k];
                fb[3 * sb + k] -= s * d[k];
            }
        }
    }
    energy
}

/// INTERF for molecules `range`: each against the n/2 molecules after it, cyclically (the pair
/// at distance exactly n/2 counted once), accumulated into private forces for all molecules.
/// Returns them and the energy.
fn interf(p: &Params, mols: &[Mol], range: std::ops::Range<usize>) -> (Vec<Force>, f64) {
    let n = mols.len();
    let mut acc = vec![[0.0; 9]; n];
    let mut energy = 0.0;
    for i in range {
        for k in 1..=n / 2 {
            if 2 * k == n && i >= n / 2 {
                continue;
            }
            let j = (i + k) % n;
            let (mut fi, mut fj) = ([0.0; 9], [0.0; 9]);
            energy += pair(p, &mols[i].x[0], &mols[j].x[0], &mut fi, &mut fj);
            for c in 0..9 {
                acc[i][c] += fi[c];
                acc[j][c] += fj[c];
            }
        }
    }
    (acc, energy)
}

/// The molecules whose private forces `range` touched, in the order a node adds them: its own
/// block first, then the n/2 after it (cyclically), as SPLASH does to spread the lock traffic.
fn touched(n: usize, range: std::ops::Range<usize>) -> impl Iterator<Item = usize> {
    let count = if range.is_empty() { 0 } else { (range.len() + n / 2).min(n) };
    (0..count).map(move |k| (range.start + k) % n)
}

fn add_force(f: &mut Force, add: &Force) {
    for c in 0..9 {
        f[c] += add[c];
    }
}

/// CORREC and BNDRY: corrects every derivative from the new forces, wraps molecules whose
/// oxygen left the box; returns the kinetic energy.
fn correct(p: &Params, mols: &mut [Mol], forces: &[Force]) -> f64 {
    let mut kinetic = 0.0;
    for (m, f) in mols.iter_mut().zip(forces) {
        for c in 0..9 {
            let mass = MASS[c / 3];
            let err = 0.5 * DT * DT * f[c] / mass - m.x[2][c];
            for (o, g) in GEAR.iter().enumerate() {
                m.x[o][c] += g * err;
            }
            let v = m.x[1][c] / DT;
            kinetic += 0.5 * mass * v * v;
        }
        for k in 0..3 {
            let o = m.x[0][k];
            let shift = if o < 0.0 {
                p.side
            } else if o >= p.side {
                -p.side
            } else {
                continue;
            };
            for a in 0..3 {
                m.x[0][3 * a + k] += shift;
            }
        }
    }
    kinetic
}

/// Final molecules, and per step the potential and kinetic energy.
type Final = (Vec<Mol>, Vec<f64>);

/// The sequential run, and its time: the simulation alone, its input built and its arrays
/// allocated before the timer starts, as the threads and DSM versions do theirs.
fn sequential(p: &Params) -> (f64, Final) {
    let n = p.molecules;
    let mut mols = initial(p);
    let mut forces = vec![[0.0; 9]; n];
    let mut energies = vec![0.0; 2 * p.steps];
    let t = Timer::start();
    for step in 0..p.steps {
        predict(&mut mols);
        let intra = intraf(&mols, &mut forces);
        let (acc, inter) = interf(p, &mols, 0..n);
        for m in touched(n, 0..n) {
            add_force(&mut forces[m], &acc[m]);
        }
        let kinetic = correct(p, &mut mols, &forces);
        energies[2 * step] += intra + inter;
        energies[2 * step + 1] += kinetic;
    }
    (t.secs(), (mols, energies))
}

fn threads(p: &Params, nthreads: usize) -> (f64, Final) {
    let n = p.molecules;
    let mut mols = initial(p);
    let mut forces = vec![[0.0; 9]; n];
    let energies = Mutex::new(vec![0.0; 2 * p.steps]);
    let locks: Vec<Mutex<()>> = (0..MOL_LOCKS.min(n)).map(|_| Mutex::new(())).collect();
    let barrier = Barrier::new(nthreads);
    let t = Timer::start();
    {
        let (ms, fs) = (SharedMut::new(&mut mols), SharedMut::new(&mut forces));
        std::thread::scope(|scope| {
            for me in 0..nthreads {
                let (ms, fs, barrier, locks, energies) = (&ms, &fs, &barrier, &locks, &energies);
                scope.spawn(move || {
                    let (begin, end) = block(n, me, nthreads);
                    for step in 0..p.steps {
                        // SAFETY: each thread writes only its own molecules and forces in this
                        // phase, and reads nothing else.
                        let intra = unsafe {
                            let own = ms.slice_mut(begin..end);
                            predict(own);
                            intraf(own, fs.slice_mut(begin..end))
                        };
                        barrier.wait();
                        // SAFETY: in this phase nobody writes the molecules.
                        let (acc, inter) = interf(p, unsafe { ms.slice(0..n) }, begin..end);
                        for m in touched(n, begin..end) {
                            let _held = locks[m % MOL_LOCKS].lock().unwrap();
                            // SAFETY: molecule m's force is written only under its lock in
                            // this phase.
                            add_force(unsafe { &mut fs.slice_mut(m..m + 1)[0] }, &acc[m]);
                        }
                        barrier.wait();
                        // SAFETY: each thread touches only its own molecules and forces here.
                        let kinetic = unsafe { correct(p, ms.slice_mut(begin..end), fs.slice(begin..end)) };
                        {
                            let mut e = energies.lock().unwrap();
                            e[2 * step] += intra + inter;
                            e[2 * step + 1] += kinetic;
                        }
                        barrier.wait();
                    }
                });
            }
        });
    }
    (t.secs(), (mols, energies.into_inner().unwrap()))
}

/// The shared data, as node 0 allocates and distributes it.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
struct Handles {
    mols: Shared<[Mol]>,
    forces: Shared<[Force]>,
    energies: Shared<[f64]>,
}

fn dsm(app: &mut App, p: &Params) -> treadmarks::Result<(f64, Option<Final>)> {
    let tmk = app.tmk();
    let (me, nprocs, n) = (tmk.proc_id(), tmk.nprocs(), p.molecules);
    let mut h = Handles::zeroed();
    if me == 0 {
        h = Handles {
            mols: tmk.alloc_pages(n)?,
            forces: tmk.alloc_pages(n)?,
            energies: tmk.alloc_pages(2 * p.steps)?,
        };
        tmk.view_mut(&h.energies)?.fill(0.0);
    }
    tmk.distribute(&mut h)?;
    let (begin, end) = block(n, me, nprocs);
    let (own, own_forces) = (h.mols.slice(begin, end), h.forces.slice(begin, end));
    tmk.view_mut(&own)?.copy_from_slice(&initial(p)[begin..end]);
    tmk.barrier(0)?;
    let drop: Option<usize> = std::env::var(TEST_DROP_ENV).ok().and_then(|m| m.parse().ok());
    let t = Timer::start();
    for step in 0..p.steps {
        let intra = {
            let mut mols = tmk.view_mut(&own)?;
            predict(&mut mols);
            intraf(&mols, &mut tmk.view_mut(&own_forces)?)
        };
        tmk.barrier(0)?;
        let (acc, inter) = interf(p, &tmk.view(&h.mols)?, begin..end);
        for m in touched(n, begin..end) {
            if me == 1 && step + 1 == p.steps && drop == Some(m) {
                continue;
            }
            let g = tmk.lock(mol_lock(m))?;
            add_force(&mut g.view_mut(&h.forces.slice(m, m + 1))?[0], &acc[m]);
        }
        tmk.barrier(0)?;
        let kinetic = correct(p, &mut tmk.view_mut(&own)?, &tmk.view(&own_forces)?);
        {
            let g = tmk.lock(ENERGY_LOCK)?;
            let mut e = g.view_mut(&h.energies)?;
            e[2 * step] += intra + inter;
            e[2 * step + 1] += kinetic;
        }
        tmk.barrier(0)?;
    }
    let secs = t.stop(tmk)?;
    let result = (me == 0).then(|| -> treadmarks::Result<Final> {
        Ok((tmk.view(&h.mols)?.to_vec(), tmk.view(&h.energies)?.to_vec()))
    });
    Ok((secs, result.transpose()?))
}

/// The largest relative differences from the sequential result: of the molecules' state (each of
/// its four orders, positions to third derivatives, relative to that order's largest magnitude;
/// after the corrector the second order is the summed force, so a lost update shows there) and
/// of the energies.
fn errors(got: &Final, want: &Final) -> (f64, f64) {
    let state = worst((0..4).map(|k| {
        let scale = worst(want.0.iter().flat_map(|m| m.x[k].iter().map(|v| v.abs()))).max(f64::MIN_POSITIVE);
        worst(
            got.0
                .iter()
                .zip(&want.0)
                .flat_map(|(a, b)| a.x[k].iter().zip(&b.x[k]).map(move |(x, y)| (x - y).abs() / scale)),
        )
    }));
    let energy = worst(got.1.iter().zip(&want.1).map(|(x, y)| (x - y).abs() / y.abs().max(1e-300)));
    (state, energy)
}

/// The total momentum per axis (in the state's units: mass times `dt` times velocity, from the
/// second order `x[1]`), and the sum of the magnitudes of its terms (the scale of its rounding).
fn momentum(mols: &[Mol]) -> ([f64; 3], f64) {
    let (mut total, mut scale) = ([0.0; 3], 0.0);
    for m in mols {
        for c in 0..9 {
            let mv = MASS[c / 3] * m.x[1][c];
            total[c % 3] += mv;
            scale += mv.abs();
        }
    }
    (total, scale)
}

/// How far the total momentum of `mols` moved from the initial state's: the largest change of a
/// component, relative to `sum |m v|` (the larger of the two states'). NaN if `mols` holds one.
fn momentum_drift(p: &Params, mols: &[Mol]) -> f64 {
    let (p0, s0) = momentum(&initial(p));
    let (p1, s1) = momentum(mols);
    worst((0..3).map(|k| (p1[k] - p0[k]).abs())) / s0.max(s1).max(f64::MIN_POSITIVE)
}

/// What the force check found: its worst error (relative to the probed molecule's largest force
/// component), the probes made, and those skipped near the cutoff.
struct ForceCheck {
    error: f64,
    probes: usize,
    skipped: usize,
}

/// Checks the forces of one step against the potential energy, by central differences.
///
/// On the initial lattice with every site jittered by up to 0.02 (so that the bonds are
/// stretched: at rest their forces are 0), the forces are computed as a step computes them
/// (`intraf`, then `interf` over all molecules, gathered through `touched`). For every coordinate
/// of [`FD_MOLECULES`] molecules and the last one, `-(U(x + h) - U(x - h)) / 2h` must match the
/// force there, where `U` is the energy of the terms that coordinate moves (its molecule's bonds
/// and its pairs with every other molecule, as `intraf` and `pair` return it). The potential jumps
/// where an oxygen-oxygen distance crosses the cutoff (the Lennard-Jones term is not shifted to
/// zero), so an oxygen probe is skipped if one of its molecule's oxygen distances is within `2h`
/// of it (a hydrogen probe moves no such distance).
fn force_check(p: &Params) -> ForceCheck {
    let n = p.molecules;
    let mut rng = Rng::new(4242);
    let mut mols = initial(p);
    for m in &mut mols {
        for c in &mut m.x[0] {
            *c += rng.range(-0.02, 0.02);
        }
    }
    let mut forces = vec![[0.0; 9]; n];
    intraf(&mols, &mut forces);
    let (acc, _) = interf(p, &mols, 0..n);
    for m in touched(n, 0..n) {
        add_force(&mut forces[m], &acc[m]);
    }
    // The energy of the terms that involve molecule `i`, its sites at `x`.
    let local = |i: usize, x: &[f64; 9]| {
        let alone = Mol { x: [*x, [0.0; 9], [0.0; 9], [0.0; 9]] };
        let mut energy = intraf(std::slice::from_ref(&alone), &mut [[0.0; 9]]);
        let (mut fa, mut fb) = ([0.0; 9], [0.0; 9]);
        for (j, other) in mols.iter().enumerate() {
            if j != i {
                energy += pair(p, x, &other.x[0], &mut fa, &mut fb);
            }
        }
        energy
    };
    let mut probed: Vec<usize> =
        (0..FD_MOLECULES).map(|k| k * n / FD_MOLECULES).filter(|&i| i < n).chain(n.checked_sub(1)).collect();
    probed.sort_unstable();
    probed.dedup();
    let mut check = ForceCheck { error: 0.0, probes: 0, skipped: 0 };
    for i in probed {
        let near_cutoff = mols.iter().enumerate().any(|(j, other)| {
            let r2: f64 = (0..3)
                .map(|k| {
                    let d = mols[i].x[0][k] - other.x[0][k];
                    let d = d - p.side * (d / p.side).round();
                    d * d
                })
                .sum();
            j != i && (r2.sqrt() - p.cutoff).abs() <= 2.0 * FD_STEP
        });
        let scale = worst(forces[i].iter().map(|f| f.abs())).max(f64::MIN_POSITIVE);
        for c in 0..9 {
            if c < 3 && near_cutoff {
                check.skipped += 1;
                continue;
            }
            let (mut plus, mut minus) = (mols[i].x[0], mols[i].x[0]);
            plus[c] += FD_STEP;
            minus[c] -= FD_STEP;
            let numeric = -(local(i, &plus) - local(i, &minus)) / (2.0 * FD_STEP);
            check.error = worst([check.error, (numeric - forces[i][c]).abs() / scale]);
            check.probes += 1;
        }
    }
    check
}

/// The largest change of the total energy (potential plus kinetic) from the first step's, relative
/// to that step's kinetic energy plus the magnitude of its potential. Printed, not checked.
fn energy_drift(energies: &[f64]) -> f64 {
    let total: Vec<f64> = energies.chunks(2).map(|e| e[0] + e[1]).collect();
    let Some(&first) = total.first() else { return 0.0 };
    let scale = (energies[0].abs() + energies[1].abs()).max(f64::MIN_POSITIVE);
    worst(total.iter().map(|e| (e - first).abs())) / scale
}

/// The checks of the sequential run (`reference`) that do not compare it with another run: its
/// momentum, and the forces against the potential. Returns (passed, what they found).
fn check_reference(p: &Params, reference: &Final) -> (bool, String) {
    let momentum = momentum_drift(p, &reference.0);
    let forces = force_check(p);
    let ok = momentum <= MOMENTUM_TOLERANCE && forces.error <= FD_TOLERANCE;
    let detail = format!(
        "sequential momentum drift {momentum:.1e} (tolerance {MOMENTUM_TOLERANCE:.0e}); forces against \
         the potential: error {:.1e} over {} probes, {} skipped near the cutoff (tolerance \
         {FD_TOLERANCE:.0e}); energy drift {:.1e} (not checked)",
        forces.error,
        forces.probes,
        forces.skipped,
        energy_drift(&reference.1)
    );
    (ok, detail)
}

/// The size the flags ask for, if its arrays fit in memory.
fn size(args: &Args) -> Result<Params, String> {
    let (molecules, steps): (usize, usize) = (args.get("molecules"), args.get("steps"));
    // Per molecule: the run's state and force, every worker's private forces of all molecules;
    // the reference's state, force and private forces; the force check's; the initial state the
    // checks build. Two copies of the energies (the run's and the reference's).
    let (mol, force) = (size_of::<Mol>() as u128, size_of::<Force>() as u128);
    let per_molecule = 4 * mol + (5 + args.nprocs() as u128) * force;
    let bytes = molecules as u128 * per_molecule + 2 * 16 * steps as u128;
    fits_memory(&format!("--molecules {molecules} --steps {steps}"), bytes)?;
    Ok(Params::new(molecules, steps))
}

/// The size flags and their defaults (`--help` lists them).
const FLAGS: &[Flag] = &[
    Flag { name: "molecules", default: "512", help: "molecules", aliases: &[] },
    Flag { name: "steps", default: "20", help: "time steps", aliases: &["iterations"] },
];

fn main() -> ExitCode {
    run_app("water", FLAGS, size, |app, p| {
        let size = format!("{} molecules, {} steps", p.molecules, p.steps);
        let (secs, got) = match app.mode {
            Mode::Seq => {
                let (secs, r) = sequential(&p);
                let (checked, checks) = check_reference(&p, &r);
                let detail = format!("{size}; {checks}; energies (potential, kinetic) {:?}", r.1);
                let ok = checked && r.1.iter().all(|e| e.is_finite());
                return Ok(Outcome { secs, ok, detail });
            }
            Mode::Threads => {
                let (secs, r) = threads(&p, app.nprocs);
                (secs, Some(r))
            }
            Mode::Dsm => dsm(app, &p)?,
        };
        let Some(got) = got else {
            return Ok(Outcome { secs, ok: true, detail: size });
        };
        let want = sequential(&p).1;
        let (state, energy) = errors(&got, &want);
        let momentum = momentum_drift(&p, &got.0);
        let (checked, checks) = check_reference(&p, &want);
        let ok = state <= TOLERANCE && energy <= TOLERANCE && momentum <= MOMENTUM_TOLERANCE && checked;
        let detail = format!(
            "{size}; max relative error: molecules {state:.2e}, energies {energy:.2e} (tolerance \
                 {TOLERANCE:.0e}); momentum drift {momentum:.1e} (tolerance {MOMENTUM_TOLERANCE:.0e}); {checks}"
        );
        Ok(Outcome { secs, ok, detail })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lattice_side_is_the_integer_cube_root_rounded_up() {
        for n in 0..2000usize {
            let k = lattice_side(n);
            assert!(k.pow(3) >= n && (k == 0 || (k - 1).pow(3) < n), "{n}: {k}");
        }
        for k in [3usize, 6, 9, 12, 17, 1000, 2_000_000] {
            assert_eq!(lattice_side(k.pow(3)), k);
            assert_eq!(lattice_side(k.pow(3) + 1), k + 1);
        }
        assert_eq!(lattice_side(usize::MAX), 2_642_246);
    }
}
