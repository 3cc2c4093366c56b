//! Barnes-Hut N-body (SPLASH's Barnes, simplified): a Plummer-model galaxy, an octree of the
//! bodies rebuilt every step, forces by walking the tree with opening criterion theta
//! (monopoles only), then a symplectic Euler update.
//!
//! The octree lives in shared memory: an array of `Cell`s whose children are indices (into the
//! cells, or encoded bodies), not pointers. Node 0 builds it every step, inserting the bodies in
//! index order, so the tree is the same in every mode; then every node computes the forces on its
//! own contiguous block of bodies by walking the shared tree, and updates them after a barrier.
//! Each body's force is computed by the same operations in every mode, so the DSM and threads
//! results must equal the sequential one bit for bit.
//!
//! The tree code of the sequential run is itself checked, wherever it runs (seq mode, and as the
//! others' reference): on its final bodies, the tree walk's acceleration of [`DIRECT_SAMPLES`]
//! bodies is compared with direct summation over all bodies, at opening criterion 0 (within
//! rounding: [`EXACT_TOLERANCE`]) and at the run's ([`approximation_tolerance`]); see
//! [`check_against_direct`].
//!
//! `barnes -n 2 [--mode dsm|seq|threads] [--bodies 16384] [--steps 4] [--theta 0.5]`
//! (`--iterations` is another name for `--steps`)

use bytemuck::{Pod, Zeroable};
use std::process::ExitCode;
use std::sync::Barrier;
use treadmarks::Shared;
use treadmarks_examples::rng::Rng;
use treadmarks_examples::{
    App, Args, Flag, Mode, Outcome, SharedMut, Timer, block, fits_memory, run_app, worst,
};

const DT: f64 = 0.025;
const EPS2: f64 = 0.05 * 0.05;
/// Bodies whose tree acceleration the check compares with direct summation.
const DIRECT_SAMPLES: usize = 64;

#[derive(Clone, Copy, Pod, Zeroable, Debug, PartialEq)]
#[repr(C)]
struct Body {
    pos: [f64; 3],
    mass: f64,
    vel: [f64; 3],
    _pad: f64,
}

/// A child slot: empty, a body (`-(b + 2)`) or a cell index (`>= 1`; cell 0 is the root).
const EMPTY: i32 = -1;

fn body_slot(b: usize) -> i32 {
    -(b as i32) - 2
}

#[derive(Clone, Copy, Pod, Zeroable, Debug)]
#[repr(C)]
struct Cell {
    center: [f64; 3],
    half: f64,
    com: [f64; 3],
    mass: f64,
    child: [i32; 8],
}

struct Params {
    bodies: usize,
    steps: usize,
    theta: f64,
}

impl Params {
    /// Room for the tree: a Plummer sphere of n bodies needs well under 2n cells.
    fn max_cells(&self) -> usize {
        2 * self.bodies + 64
    }
}

/// A random point on the sphere of radius `r` (SPLASH's `pickshell`).
fn pickshell(rng: &mut Rng, r: f64) -> [f64; 3] {
    loop {
        let v = [rng.range(-1.0, 1.0), rng.range(-1.0, 1.0), rng.range(-1.0, 1.0)];
        let n2 = v[0] * v[0] + v[1] * v[1] + v[2] * v[2];
        if n2 > 1e-6 && n2 <= 1.0 {
            let s = r / n2.sqrt();
            return [v[0] * s, v[1] * s, v[2] * s];
        }
    }
}

/// The Plummer model of SPLASH's `testdata` (Aarseth, Henon and Wielen), seed fixed, moved to
/// the centre-of-mass frame.
fn plummer(n: usize) -> Vec<Body> {
    let mut rng = Rng::new(123);
    let rsc = 3.0 * std::f64::consts::PI / 16.0;
    let vsc = (1.0 / rsc).sqrt();
    let mut bodies: Vec<Body> = (0..n)
        .map(|_| {
            let r = 1.0 / (rng.range(0.0, 0.999).powf(-2.0 / 3.0) - 1.0).sqrt();
            let pos = pickshell(&mut rng, rsc * r);
            let x = loop {
                let (x, y) = (rng.range(0.0, 1.0), rng.range(0.0, 0.1));
                if y <= x * x * (1.0 - x * x).powf(3.5) {
                    break x;
                }
            };
            let v = std::f64::consts::SQRT_2 * x / (1.0 + r * r).powf(0.25);
            let vel = pickshell(&mut rng, vsc * v);
            Body { pos, mass: 1.0 / n as f64, vel, _pad: 0.0 }
        })
        .collect();
    for k in 0..3 {
        let cp = bodies.iter().map(|b| b.pos[k] * b.mass).sum::<f64>();
        let cv = bodies.iter().map(|b| b.vel[k] * b.mass).sum::<f64>();
        for b in &mut bodies {
            b.pos[k] -= cp;
            b.vel[k] -= cv;
        }
    }
    bodies
}

fn octant(center: &[f64; 3], p: &[f64; 3]) -> usize {
    (0..3).map(|k| usize::from(p[k] >= center[k]) << k).sum()
}

/// Builds the octree of `bodies` into `cells` (root at 0), inserting bodies in index order, then
/// computes every cell's mass and centre of mass. Returns the number of cells used.
fn build_tree(bodies: &[Body], cells: &mut [Cell]) -> usize {
    let (mut lo, mut hi) = ([f64::MAX; 3], [f64::MIN; 3]);
    for b in bodies {
        for k in 0..3 {
            lo[k] = lo[k].min(b.pos[k]);
            hi[k] = hi[k].max(b.pos[k]);
        }
    }
    let half = (0..3).map(|k| hi[k] - lo[k]).fold(0.0, f64::max) * 0.5 * 1.0001 + 1e-9;
    let center = [(lo[0] + hi[0]) * 0.5, (lo[1] + hi[1]) * 0.5, (lo[2] + hi[2]) * 0.5];
    let fresh =
        |center: [f64; 3], half: f64| Cell { center, half, com: [0.0; 3], mass: 0.0, child: [EMPTY; 8] };
    cells[0] = fresh(center, half);
    let mut used = 1;
    for (b, body) in bodies.iter().enumerate() {
        let mut c = 0;
        loop {
            let o = octant(&cells[c].center, &body.pos);
            let slot = cells[c].child[o];
            if slot == EMPTY {
                cells[c].child[o] = body_slot(b);
                break;
            }
            if slot > 0 {
                c = slot as usize;
                continue;
            }
            // A body is there: split the slot into a cell holding it, and go on down.
            let other = (-slot - 2) as usize;
            assert!(used < cells.len(), "octree needs more than {} cells", cells.len());
            assert!(cells[c].half > 1e-12, "bodies {b} and {other} coincide");
            let h = cells[c].half * 0.5;
            let mut sub = cells[c].center;
            for (k, s) in sub.iter_mut().enumerate() {
                *s += if o >> k & 1 == 1 { h } else { -h };
            }
            cells[used] = fresh(sub, h);
            let oo = octant(&sub, &bodies[other].pos);
            cells[used].child[oo] = slot;
            cells[c].child[o] = used as i32;
            c = used;
            used += 1;
        }
    }
    // Children have larger indices than their parents: sum up from the last cell.
    for c in (0..used).rev() {
        let (mut m, mut w) = (0.0, [0.0; 3]);
        for &slot in &cells[c].child {
            let (cm, cp) = match slot {
                EMPTY => continue,
                s if s > 0 => (cells[s as usize].mass, cells[s as usize].com),
                s => {
                    let b = &bodies[(-s - 2) as usize];
                    (b.mass, b.pos)
                }
            };
            m += cm;
            for k in 0..3 {
                w[k] += cm * cp[k];
            }
        }
        cells[c].mass = m;
        cells[c].com = [w[0] / m, w[1] / m, w[2] / m];
    }
    used
}

fn pull(acc: &mut [f64; 3], p: &[f64; 3], q: &[f64; 3], m: f64) {
    let d = [q[0] - p[0], q[1] - p[1], q[2] - p[2]];
    let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + EPS2;
    let s = m / (r2 * r2.sqrt());
    for k in 0..3 {
        acc[k] += d[k] * s;
    }
}

/// The accelerations of bodies `range`, walking the tree.
fn forces(cells: &[Cell], bodies: &[Body], range: std::ops::Range<usize>, theta: f64) -> Vec<[f64; 3]> {
    let theta2 = theta * theta;
    let mut stack = Vec::with_capacity(256);
    range
        .map(|i| {
            let p = bodies[i].pos;
            let mut acc = [0.0; 3];
            stack.clear();
            stack.push(0usize);
            while let Some(c) = stack.pop() {
                let cell = &cells[c];
                let d = [cell.com[0] - p[0], cell.com[1] - p[1], cell.com[2] - p[2]];
                let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                let size = 2.0 * cell.half;
                if size * size < theta2 * r2 {
                    pull(&mut acc, &p, &cell.com, cell.mass);
                    continue;
                }
                for &slot in &cell.child {
                    match slot {
                        EMPTY => {}
                        s if s > 0 => stack.push(s as usize),
                        s => {
                            let b = (-s - 2) as usize;
                            if b != i {
                                pull(&mut acc, &p, &bodies[b].pos, bodies[b].mass);
                            }
                        }
                    }
                }
            }
            acc
        })
        .collect()
}

fn advance(bodies: &mut [Body], acc: &[[f64; 3]]) {
    for (b, a) in bodies.iter_mut().zip(acc) {
        for ((v, x), a) in b.vel.iter_mut().zip(&mut b.pos).zip(a) {
            *v += a * DT;
            *x += *v * DT;
        }
    }
}

fn sequential(p: &Params) -> Vec<Body> {
    simulate(p, plummer(p.bodies), vec![Cell::zeroed(); p.max_cells()])
}

/// Largest error of the tree walk at opening criterion 0 (every cell opened: the direct sum
/// over the tree's bodies), relative to the sum of the pulls' magnitudes: rounding gives about
/// 1e-14; one body missing or counted twice gives at least its pull, `1/n` of that sum for a
/// typical body.
const EXACT_TOLERANCE: f64 = 1e-9;

/// Largest error of the tree walk at the run's opening criterion `theta`, relative to the sum of
/// the pulls' magnitudes: `theta^2`. Measured over 2 to 65,536 bodies, `theta` 0.1 to 1 and 0
/// to 50 steps, the largest was `0.2 theta^2` (at 16,384 bodies and `theta` 0.5, `0.011
/// theta^2`). Above `theta` 1 the bound passes almost anything: the opening criterion accepts
/// cells larger than their distance. Never below [`EXACT_TOLERANCE`]: at `theta` 0 the walk is
/// the direct sum taken in another order, equal only to rounding.
fn approximation_tolerance(theta: f64) -> f64 {
    (theta * theta).max(EXACT_TOLERANCE)
}

/// What [`check_against_direct`] found: the largest errors of the tree walk at opening
/// criterion 0 and at the run's, each relative to the sum of the pulls' magnitudes.
struct DirectCheck {
    samples: usize,
    exact: f64,
    approximate: f64,
}

impl DirectCheck {
    fn ok(&self, theta: f64) -> bool {
        self.exact <= EXACT_TOLERANCE && self.approximate <= approximation_tolerance(theta)
    }

    fn describe(&self, theta: f64) -> String {
        format!(
            "tree against direct summation on {} bodies: error {:.1e} at theta 0 (tolerance \
             {EXACT_TOLERANCE:.0e}), {:.1e} at theta {theta} (tolerance {:.1e})",
            self.samples,
            self.exact,
            self.approximate,
            approximation_tolerance(theta)
        )
    }
}

/// Checks the tree code (`build_tree` and `forces`) against direct summation, which shares no
/// code with it: a new tree of `bodies`, then for [`DIRECT_SAMPLES`] bodies spread over the index
/// range, the sum over every other body of the softened pull `m d / (|d|^2 + eps^2)^(3/2)`
/// against the tree walk's acceleration, with opening criterion 0 (every body must be in the tree
/// once: [`EXACT_TOLERANCE`]) and with the run's ([`approximation_tolerance`]; this one sees the
/// cells' masses and centres of mass, and the opening test). Errors are relative to the sum of
/// the magnitudes of the pulls on the body: near the centre of the galaxy they cancel, and an
/// error relative to the acceleration itself has no useful bound.
fn check_against_direct(p: &Params, bodies: &[Body]) -> DirectCheck {
    let n = bodies.len();
    let mut check = DirectCheck { samples: 0, exact: 0.0, approximate: 0.0 };
    if n == 0 {
        return check;
    }
    let mut cells = vec![Cell::zeroed(); p.max_cells()];
    build_tree(bodies, &mut cells);
    let mut samples: Vec<usize> = (0..DIRECT_SAMPLES).map(|k| k * n / DIRECT_SAMPLES).collect();
    samples.dedup();
    check.samples = samples.len();
    for i in samples {
        let at = bodies[i].pos;
        let (mut direct, mut magnitudes) = ([0.0; 3], 0.0);
        for (j, b) in bodies.iter().enumerate() {
            if j != i {
                let d: [f64; 3] = std::array::from_fn(|k| b.pos[k] - at[k]);
                let r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2];
                let soft = r2 + EPS2;
                let s = b.mass / (soft * soft.sqrt());
                for k in 0..3 {
                    direct[k] += s * d[k];
                }
                magnitudes += s * r2.sqrt();
            }
        }
        let error = |theta: f64| {
            let tree = forces(&cells, bodies, i..i + 1, theta)[0];
            let e = (0..3).map(|k| (tree[k] - direct[k]).powi(2)).sum::<f64>().sqrt();
            // Exactly 0 for a body alone, with no pull at all.
            if e == 0.0 { 0.0 } else { e / magnitudes }
        };
        check.exact = worst([check.exact, error(0.0)]);
        check.approximate = worst([check.approximate, error(p.theta)]);
    }
    check
}

/// All steps on one thread, from `bodies`, building the tree in `cells` ([`Params::max_cells`]).
fn simulate(p: &Params, mut bodies: Vec<Body>, mut cells: Vec<Cell>) -> Vec<Body> {
    for _ in 0..p.steps {
        build_tree(&bodies, &mut cells);
        let acc = forces(&cells, &bodies, 0..p.bodies, p.theta);
        advance(&mut bodies, &acc);
    }
    bodies
}

fn threads(p: &Params, n: usize) -> (f64, Vec<Body>) {
    let mut bodies = plummer(p.bodies);
    let mut cells = vec![Cell::zeroed(); p.max_cells()];
    let barrier = Barrier::new(n);
    let t = Timer::start();
    {
        let (bs, cs) = (SharedMut::new(&mut bodies), SharedMut::new(&mut cells));
        std::thread::scope(|scope| {
            for me in 0..n {
                let (bs, cs, barrier) = (&bs, &cs, &barrier);
                scope.spawn(move || {
                    let (begin, end) = block(p.bodies, me, n);
                    for _ in 0..p.steps {
                        if me == 0 {
                            // SAFETY: between these barriers thread 0 alone touches the cells,
                            // and nobody writes the bodies.
                            unsafe { build_tree(bs.slice(0..p.bodies), cs.slice_mut(0..p.max_cells())) };
                        }
                        barrier.wait();
                        // SAFETY: in this phase everybody only reads bodies and cells.
                        let acc = unsafe {
                            forces(cs.slice(0..p.max_cells()), bs.slice(0..p.bodies), begin..end, p.theta)
                        };
                        barrier.wait();
                        // SAFETY: in this phase each thread touches only its own bodies.
                        advance(unsafe { bs.slice_mut(begin..end) }, &acc);
                        barrier.wait();
                    }
                });
            }
        });
    }
    (t.secs(), bodies)
}

/// The shared data, as node 0 allocates and distributes it.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
struct Handles {
    bodies: Shared<[Body]>,
    cells: Shared<[Cell]>,
}

fn dsm(app: &mut App, p: &Params) -> treadmarks::Result<(f64, bool, usize, String)> {
    let tmk = app.tmk();
    let (me, n) = (tmk.proc_id(), tmk.nprocs());
    let mut h = Handles::zeroed();
    if me == 0 {
        h = Handles { bodies: tmk.alloc_pages(p.bodies)?, cells: tmk.alloc_pages(p.max_cells())? };
    }
    tmk.distribute(&mut h)?;
    let (begin, end) = block(p.bodies, me, n);
    let mine = h.bodies.slice(begin, end);
    tmk.view_mut(&mine)?.copy_from_slice(&plummer(p.bodies)[begin..end]);
    tmk.barrier(0)?;
    let t = Timer::start();
    let mut ncells = 0;
    for _ in 0..p.steps {
        if me == 0 {
            ncells = build_tree(&tmk.view(&h.bodies)?, &mut tmk.view_mut(&h.cells)?);
        }
        tmk.barrier(0)?;
        let acc = forces(&tmk.view(&h.cells)?, &tmk.view(&h.bodies)?, begin..end, p.theta);
        tmk.barrier(0)?;
        advance(&mut tmk.view_mut(&mine)?, &acc);
        tmk.barrier(0)?;
    }
    let secs = t.stop(tmk)?;
    let mut detail = String::new();
    let ok = me != 0 || {
        let want = sequential(p);
        let direct = check_against_direct(p, &want);
        detail = direct.describe(p.theta);
        *tmk.view(&h.bodies)? == want[..] && direct.ok(p.theta)
    };
    Ok((secs, ok, ncells, detail))
}

/// The size flags and their defaults (`--help` lists them).
const FLAGS: &[Flag] = &[
    Flag { name: "bodies", default: "16384", help: "bodies (Plummer model, fixed seed)", aliases: &[] },
    Flag { name: "steps", default: "4", help: "time steps", aliases: &["iterations"] },
    Flag { name: "theta", default: "0.5", help: "opening criterion", aliases: &[] },
];

fn size(args: &Args) -> Result<Params, String> {
    let p = Params { bodies: args.get("bodies"), steps: args.get("steps"), theta: args.get("theta") };
    // A child slot holds a cell index or an encoded body in an i32.
    if p.max_cells() > i32::MAX as usize {
        return Err(format!("--bodies {} is more than a tree's i32 slots can index", p.bodies));
    }
    // Bodies and cells: the run's (and in DSM mode the input a node keeps), the sequential
    // reference's, and the check's tree.
    let (body, cell) = (size_of::<Body>() as u128, size_of::<Cell>() as u128);
    let bytes = 3 * body * p.bodies as u128 + 3 * cell * p.max_cells() as u128;
    fits_memory(&format!("--bodies {}", p.bodies), bytes)?;
    Ok(p)
}

fn main() -> ExitCode {
    run_app("barnes", FLAGS, size, |app, p| {
        let size = format!("{} bodies, {} steps, theta {}", p.bodies, p.steps, p.theta);
        let (secs, ok, note) = match app.mode {
            Mode::Seq => {
                let (bodies, cells) = (plummer(p.bodies), vec![Cell::zeroed(); p.max_cells()]);
                let t = Timer::start();
                let bodies = simulate(&p, bodies, cells);
                let secs = t.secs();
                let direct = check_against_direct(&p, &bodies);
                (secs, direct.ok(p.theta), format!("; {}", direct.describe(p.theta)))
            }
            Mode::Threads => {
                let (secs, bodies) = threads(&p, app.nprocs);
                let want = sequential(&p);
                let direct = check_against_direct(&p, &want);
                let note = format!("; equal to sequential bit for bit; {}", direct.describe(p.theta));
                (secs, bodies == want && direct.ok(p.theta), note)
            }
            Mode::Dsm => {
                let (secs, ok, ncells, checks) = dsm(app, &p)?;
                (secs, ok, format!("; {ncells} cells; equal to sequential bit for bit; {checks}"))
            }
        };
        Ok(Outcome { secs, ok, detail: format!("{size}{note}") })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// At every opening criterion an honest tree passes its check against direct summation,
    /// `theta` 0 included (its walk is the direct sum in another order: equal to rounding).
    #[test]
    fn an_honest_tree_passes_its_check_at_any_theta() {
        for theta in [0.0, 0.3, 0.5, 1.0] {
            let p = Params { bodies: 200, steps: 0, theta };
            let check = check_against_direct(&p, &plummer(p.bodies));
            assert!(check.ok(theta), "{}", check.describe(theta));
        }
    }
}
