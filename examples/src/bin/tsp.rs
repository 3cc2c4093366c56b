//! Travelling salesman by branch and bound (TreadMarks' TSP): a priority queue of partial tours
//! in the shared heap under one lock, the best tour so far under another. A node pops the most
//! promising partial tour (lowest bound); while it has more than `--solve-below` cities left to
//! visit it expands it (pushing the children that survive the bound back on the queue, in the
//! same critical section) and pops again; a smaller one it solves by itself, depth first, below
//! the best length known. The queue's header keeps a copy of that length, so taking work is one
//! lock acquire; a node that finds a better tour stores it under the best tour's lock, then lowers
//! the queue's copy. The queue only grows inside its critical section, so an empty queue means
//! the search is done.
//!
//! The lower bound of a partial tour is its length plus an edge out of its last city, a minimum
//! spanning tree of the cities left and an edge back to city 0. It prunes hard: a subtree of 12
//! cities left is only some microseconds of work, so to keep the queue operations coarse (as
//! TreadMarks' TSP does) the default solves subtrees of 15 cities left (a few hundred work items
//! of about a millisecond for 18 cities).
//!
//! The queue holds [`QUEUE_CAP`] partial tours. A tour whose children might not all fit is not
//! expanded but solved whole by the worker that popped it, depth first (as qsort sorts a range
//! itself when its stack is full): slower, but the same answer.
//!
//! The optimal length is an integer: every mode must find exactly the sequential one. The
//! sequential search is itself checked, wherever it runs (seq mode, and as the others'
//! reference): up to [`HELD_KARP_MAX`] cities, its length must be Held and Karp's (an exact
//! dynamic programme that shares nothing with the branch and bound, so a bound that is not a
//! lower bound cannot prune the optimum unseen); above, the output says it was not proved.
//!
//! `tsp -n 2 [--mode dsm|seq|threads] [--cities 18] [--solve-below 15] [--seed 1]`

use bytemuck::{Pod, Zeroable};
use std::process::ExitCode;
use std::sync::Mutex;
use treadmarks::Shared;
use treadmarks_examples::rng::Rng;
use treadmarks_examples::{App, Args, Flag, Mode, Outcome, Timer, run_app};

const MAX_CITIES: usize = 32;
/// Lock of the work queue, and of the best tour.
const QUEUE_LOCK: u32 = 1;
const BEST_LOCK: u32 = 2;
/// Queue capacity in partial tours; a tour whose children might not fit is solved whole instead.
const QUEUE_CAP: usize = 1 << 18;
/// The most cities [`held_karp`] checks: 2^19 x 19 lengths (38 MiB) and 2^19 x 19^2 steps.
const HELD_KARP_MAX: usize = 20;

/// A partial tour from city 0 (or a complete one, for the best tour).
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
#[repr(C)]
struct Tour {
    /// Length of the path so far (for a complete tour: including the way back to city 0).
    len: u32,
    /// Twice the lower bound of any completion.
    bound2: u32,
    /// Cities on the path, as a bit set.
    visited: u32,
    /// Number of cities on the path.
    depth: u32,
    path: [u8; MAX_CITIES],
}

/// The queue's header: number of partial tours in it, how many were pushed in all, the best
/// length known (a copy of the best tour's, kept here so that taking work needs one lock), and
/// how many tours were handed out whole because the queue had no room for their children.
#[derive(Clone, Copy, Pod, Zeroable, Debug)]
#[repr(C)]
struct QueueHead {
    count: u64,
    pushed: u64,
    best: u32,
    full: u32,
}

impl QueueHead {
    fn new() -> Self {
        QueueHead { count: 0, pushed: 0, best: u32::MAX, full: 0 }
    }

    /// What the detail line says of the queue.
    fn describe(&self) -> String {
        let mut out = format!("{} partial tours pushed", self.pushed);
        if self.full > 0 {
            out += &format!(", {} tours solved whole for lack of queue room", self.full);
        }
        out
    }
}

struct Problem {
    n: usize,
    dist: Vec<u32>,
    /// Per city: the shortest edge, and the two shortest summed.
    min1: Vec<u32>,
    min12: Vec<u32>,
    /// Per city: the other cities, nearest first.
    nearest: Vec<Vec<u8>>,
}

impl Problem {
    /// `n` cities at random points of a 1000x1000 square, rounded Euclidean distances.
    fn new(n: usize, seed: u64) -> Problem {
        assert!((3..=MAX_CITIES).contains(&n), "--cities must be in 3..={MAX_CITIES}");
        let mut rng = Rng::new(seed);
        let pts: Vec<(f64, f64)> = (0..n).map(|_| (rng.range(0.0, 1000.0), rng.range(0.0, 1000.0))).collect();
        let mut dist = vec![0u32; n * n];
        for i in 0..n {
            for j in 0..n {
                let (dx, dy) = (pts[i].0 - pts[j].0, pts[i].1 - pts[j].1);
                dist[i * n + j] = (dx * dx + dy * dy).sqrt().round() as u32;
            }
        }
        let mut min1 = vec![0; n];
        let mut min12 = vec![0; n];
        let mut nearest = Vec::with_capacity(n);
        for i in 0..n {
            let mut others: Vec<u8> = (0..n as u8).filter(|&j| j as usize != i).collect();
            others.sort_by_key(|&j| (dist[i * n + j as usize], j));
            min1[i] = dist[i * n + others[0] as usize];
            min12[i] = min1[i] + dist[i * n + others[1] as usize];
            nearest.push(others);
        }
        Problem { n, dist, min1, min12, nearest }
    }

    fn d(&self, a: usize, b: usize) -> u32 {
        self.dist[a * self.n + b]
    }

    /// The tour of city 0 alone.
    fn root(&self) -> Tour {
        let mut t = Tour { len: 0, bound2: 0, visited: 1, depth: 1, path: [0; MAX_CITIES] };
        t.bound2 = self.bound2(&t);
        t
    }

    /// Twice a lower bound on any completion of `t`: each city still to visit has two tour edges,
    /// the last city and city 0 one each, none shorter than that city's shortest edges.
    fn bound2(&self, t: &Tour) -> u32 {
        let last = t.path[t.depth as usize - 1] as usize;
        2 * (t.len + self.mst(last, t.visited))
    }

    /// A lower bound on the rest of any tour from `last` through the cities not in `visited`
    /// back to city 0: an edge from `last` into them, a spanning tree of them (a minimum one,
    /// by Prim), and an edge from them to city 0.
    fn mst(&self, last: usize, visited: u32) -> u32 {
        let mut members = [0u8; MAX_CITIES];
        let mut k = 0;
        for c in 0..self.n {
            if visited & (1 << c) == 0 {
                members[k] = c as u8;
                k += 1;
            }
        }
        if k == 0 {
            return self.d(last, 0);
        }
        let members = &mut members[..k];
        let (mut from_last, mut to_0) = (u32::MAX, u32::MAX);
        for &c in members.iter() {
            from_last = from_last.min(self.d(last, c as usize));
            to_0 = to_0.min(self.d(c as usize, 0));
        }
        let mut key = [u32::MAX; MAX_CITIES];
        let key = &mut key[..k];
        let mut total = from_last + to_0;
        let mut left = k - 1;
        let mut cur = members[left] as usize;
        while left > 0 {
            let mut bi = 0;
            for i in 0..left {
                let d = self.d(cur, members[i] as usize);
                if d < key[i] {
                    key[i] = d;
                }
                if key[i] < key[bi] {
                    bi = i;
                }
            }
            total += key[bi];
            cur = members[bi] as usize;
            members.swap(bi, left - 1);
            key.swap(bi, left - 1);
            left -= 1;
        }
        total
    }

    /// Cities still to visit.
    fn left(&self, t: &Tour) -> usize {
        self.n - t.depth as usize
    }

    /// The children of `t` whose bound can still beat `best`.
    fn expand(&self, t: &Tour, best: u32, out: &mut Vec<Tour>) {
        let last = t.path[t.depth as usize - 1] as usize;
        for &c in &self.nearest[last] {
            if t.visited & (1 << c) != 0 {
                continue;
            }
            let mut child = *t;
            child.path[t.depth as usize] = c;
            child.depth += 1;
            child.visited |= 1 << c;
            child.len += self.d(last, c as usize);
            child.bound2 = self.bound2(&child);
            if !prunable(child.bound2, best) {
                out.push(child);
            }
        }
    }

    /// The best completion of `t` shorter than `bound`, if any.
    fn solve_below_bound(&self, t: &Tour, bound: u32) -> Option<Tour> {
        let mut best = no_tour();
        best.len = bound;
        self.solve(t, &mut best);
        (best.len < bound).then_some(best)
    }

    /// Solves the subtree under `t` depth first; improves `best` (length and tour) in place.
    /// Returns the number of nodes visited.
    fn solve(&self, t: &Tour, best: &mut Tour) -> u64 {
        let last = t.path[t.depth as usize - 1] as usize;
        let rest: u32 = (0..self.n).filter(|&c| t.visited & (1 << c) == 0).map(|c| self.min12[c]).sum();
        let mut path = t.path;
        self.dfs(&mut path, t.depth as usize, last, t.len, t.visited, rest, best)
    }

    #[allow(clippy::too_many_arguments)]
    fn dfs(
        &self,
        path: &mut [u8; MAX_CITIES],
        depth: usize,
        last: usize,
        len: u32,
        visited: u32,
        rest: u32,
        best: &mut Tour,
    ) -> u64 {
        if depth == self.n {
            let total = len + self.d(last, 0);
            if total < best.len {
                *best = Tour { len: total, bound2: 2 * total, visited, depth: depth as u32, path: *path };
            }
            return 1;
        }
        let mut nodes = 1;
        for &c in &self.nearest[last] {
            let c = c as usize;
            if visited & (1 << c) != 0 {
                continue;
            }
            let len = len + self.d(last, c);
            let rest = rest - self.min12[c];
            if prunable(2 * len + self.min1[c] + self.min1[0] + rest, best.len)
                || prunable(2 * (len + self.mst(c, visited | (1 << c))), best.len)
            {
                continue;
            }
            path[depth] = c as u8;
            nodes += self.dfs(path, depth + 1, c, len, visited | (1 << c), rest, best);
        }
        nodes
    }

    /// `t` is a tour of all cities from 0 of the length it claims.
    fn valid(&self, t: &Tour) -> bool {
        let n = self.n;
        let cities = &t.path[..n];
        let mut seen = 0u32;
        for &c in cities {
            seen |= 1 << c;
        }
        let len: u32 = (0..n).map(|i| self.d(cities[i] as usize, cities[(i + 1) % n] as usize)).sum();
        t.depth as usize == n && cities[0] == 0 && seen.count_ones() as usize == n && len == t.len
    }
}

/// A tour with twice-bound `bound2` cannot beat one of length `best` (lengths are integers).
fn prunable(bound2: u32, best: u32) -> bool {
    bound2.div_ceil(2) >= best
}

/// `a` comes out of the queue before `b`: lower bound first, deeper first among equals.
fn before(a: &Tour, b: &Tour) -> bool {
    (a.bound2, std::cmp::Reverse(a.depth)) < (b.bound2, std::cmp::Reverse(b.depth))
}

/// A binary heap of tours in `heap[..*count]`, the same code for the shared and private queues.
/// There is room: [`get_work`] expands a tour only if all its children fit.
fn heap_push(heap: &mut [Tour], count: &mut u64, t: Tour) {
    let mut i = *count as usize;
    assert!(i < heap.len(), "bug: a push on the full work queue ({} partial tours)", heap.len());
    *count += 1;
    heap[i] = t;
    while i > 0 {
        let parent = (i - 1) / 2;
        if !before(&heap[i], &heap[parent]) {
            break;
        }
        heap.swap(i, parent);
        i = parent;
    }
}

fn heap_pop(heap: &mut [Tour], count: &mut u64) -> Option<Tour> {
    if *count == 0 {
        return None;
    }
    *count -= 1;
    let n = *count as usize;
    let top = heap[0];
    heap[0] = heap[n];
    let mut i = 0;
    loop {
        let (l, r) = (2 * i + 1, 2 * i + 2);
        let mut m = i;
        if l < n && before(&heap[l], &heap[m]) {
            m = l;
        }
        if r < n && before(&heap[r], &heap[m]) {
            m = r;
        }
        if m == i {
            break;
        }
        heap.swap(i, m);
        i = m;
    }
    Some(top)
}

/// One critical section on the queue: pops tours, expanding (and pushing back the children of)
/// those with more than `solve_below` cities left, until one small enough to solve turns up, or
/// one whose children (one per city left, at most) might not fit in the queue: that one is
/// solved whole. `None`: the queue is empty, the search is over. Lowers `best` to the queue's
/// copy.
fn get_work(
    p: &Problem,
    heap: &mut [Tour],
    head: &mut QueueHead,
    best: &mut u32,
    solve_below: usize,
) -> Option<Tour> {
    *best = head.best.min(*best);
    let best = *best;
    let mut children = Vec::new();
    while let Some(t) = heap_pop(heap, &mut head.count) {
        if prunable(t.bound2, best) {
            continue;
        }
        if p.left(&t) <= solve_below {
            return Some(t);
        }
        if head.count as usize + p.left(&t) > heap.len() {
            head.full += 1;
            return Some(t);
        }
        children.clear();
        p.expand(&t, best, &mut children);
        for c in &children {
            heap_push(heap, &mut head.count, *c);
            head.pushed += 1;
        }
    }
    None
}

fn no_tour() -> Tour {
    Tour { len: u32::MAX, bound2: u32::MAX, visited: 0, depth: 0, path: [0; MAX_CITIES] }
}

struct Size {
    cities: usize,
    solve_below: usize,
    seed: u64,
}

/// The whole search with one worker and a private queue: the sequential baseline and reference.
/// Returns the best tour and the queue's final header.
fn sequential(p: &Problem, s: &Size) -> (Tour, QueueHead) {
    search(p, s, vec![Tour::zeroed(); QUEUE_CAP])
}

/// [`sequential`] with the queue's storage `heap` ([`QUEUE_CAP`] tours) made by the caller.
fn search(p: &Problem, s: &Size, mut heap: Vec<Tour>) -> (Tour, QueueHead) {
    let mut head = QueueHead::new();
    heap_push(&mut heap, &mut head.count, p.root());
    let mut best = no_tour();
    let mut bound = best.len;
    while let Some(t) = get_work(p, &mut heap, &mut head, &mut bound, s.solve_below) {
        if let Some(better) = p.solve_below_bound(&t, bound) {
            head.best = better.len;
            best = better;
        }
    }
    (best, head)
}

/// The length of a shortest tour by Held and Karp's dynamic programme, or `None` above
/// [`HELD_KARP_MAX`] cities. `len[set][j]` is the shortest path from city 0 through exactly the
/// cities of `set` (bit `j` for city `j + 1`), ending at city `j + 1`; sets in increasing order,
/// each extended by one city.
fn held_karp(p: &Problem) -> Option<u32> {
    if p.n > HELD_KARP_MAX {
        return None;
    }
    let m = p.n - 1;
    let sets = 1usize << m;
    let mut len = vec![u32::MAX; sets * m];
    for j in 0..m {
        len[(1 << j) * m + j] = p.d(0, j + 1);
    }
    for set in 1..sets {
        for j in (0..m).filter(|&j| set & (1 << j) != 0) {
            let here = len[set * m + j];
            if here == u32::MAX {
                continue;
            }
            for k in (0..m).filter(|&k| set & (1 << k) == 0) {
                let there = &mut len[(set | 1 << k) * m + k];
                *there = (*there).min(here + p.d(j + 1, k + 1));
            }
        }
    }
    (0..m).map(|j| len[(sets - 1) * m + j] + p.d(j + 1, 0)).min()
}

/// Checks the sequential tour `want`: a tour of all cities of the length it claims, and up to
/// [`HELD_KARP_MAX`] cities as short as [`held_karp`]'s. Returns (passed, what was checked).
fn check_reference(p: &Problem, want: &Tour) -> (bool, String) {
    let valid = p.valid(want);
    match held_karp(p) {
        Some(optimum) => {
            let detail = if optimum == want.len {
                "proved optimal by Held-Karp".to_string()
            } else {
                format!("NOT optimal: Held-Karp finds {optimum}")
            };
            (valid && optimum == want.len, detail)
        }
        None => (valid, format!("not proved optimal (Held-Karp checks up to {HELD_KARP_MAX} cities)")),
    }
}

fn threads(p: &Problem, s: &Size, n: usize) -> (f64, Tour, QueueHead) {
    let mut heap = vec![Tour::zeroed(); QUEUE_CAP];
    let mut head = QueueHead::new();
    heap_push(&mut heap, &mut head.count, p.root());
    let queue = Mutex::new((heap, head));
    let best = Mutex::new(no_tour());
    let t = Timer::start();
    std::thread::scope(|scope| {
        for _ in 0..n {
            let (queue, best) = (&queue, &best);
            scope.spawn(move || {
                let mut bound = u32::MAX;
                loop {
                    let work = {
                        let mut q = queue.lock().unwrap();
                        let (heap, head) = &mut *q;
                        get_work(p, heap, head, &mut bound, s.solve_below)
                    };
                    let Some(work) = work else { break };
                    if let Some(better) = p.solve_below_bound(&work, bound) {
                        bound = better.len;
                        {
                            let mut b = best.lock().unwrap();
                            if better.len < b.len {
                                *b = better;
                            }
                        }
                        let mut q = queue.lock().unwrap();
                        q.1.best = q.1.best.min(better.len);
                    }
                }
            });
        }
    });
    let secs = t.secs();
    (secs, best.into_inner().unwrap(), queue.into_inner().unwrap().1)
}

/// The shared data, as node 0 allocates and distributes it.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
struct Handles {
    heap: Shared<[Tour]>,
    head: Shared<[QueueHead]>,
    best: Shared<[Tour]>,
}

fn dsm(app: &mut App, p: &Problem, s: &Size) -> treadmarks::Result<(f64, bool, String)> {
    let tmk = app.tmk();
    let me = tmk.proc_id();
    let mut handles = Handles::zeroed();
    if me == 0 {
        handles = Handles {
            heap: tmk.alloc_pages(QUEUE_CAP)?,
            head: tmk.alloc_pages(1)?,
            best: tmk.alloc_pages(1)?,
        };
        let mut h = tmk.view_mut(&handles.head)?;
        h[0] = QueueHead::new();
        let mut heap = tmk.view_mut(&handles.heap)?;
        heap_push(&mut heap, &mut h[0].count, p.root());
        tmk.view_mut(&handles.best)?[0] = no_tour();
    }
    tmk.distribute(&mut handles)?;
    let Handles { heap, head, best } = handles;
    tmk.barrier(0)?;
    let t = Timer::start();
    let mut solved = 0u64;
    let mut bound = u32::MAX;
    loop {
        let work = {
            let g = tmk.lock(QUEUE_LOCK)?;
            let mut h = g.view_mut(&head)?;
            let mut q = g.view_mut(&heap)?;
            get_work(p, &mut q, &mut h[0], &mut bound, s.solve_below)
        };
        let Some(work) = work else { break };
        solved += 1;
        if let Some(better) = p.solve_below_bound(&work, bound) {
            bound = better.len;
            {
                let g = tmk.lock(BEST_LOCK)?;
                let mut b = g.view_mut(&best)?;
                if better.len < b[0].len {
                    b[0] = better;
                }
            }
            let g = tmk.lock(QUEUE_LOCK)?;
            let mut h = g.view_mut(&head)?;
            h[0].best = h[0].best.min(better.len);
        }
    }
    tmk.barrier(0)?;
    let secs = t.stop(tmk)?;
    let found = tmk.view(&best)?[0];
    let queue = tmk.view(&head)?[0].describe();
    let mut detail = format!("node {me} solved {solved} subtrees; {queue}");
    let ok = me != 0 || {
        let (want, _) = sequential(p, s);
        let (checked, checks) = check_reference(p, &want);
        detail = format!("{}; optimal length {} (sequential {}, {checks})", detail, found.len, want.len);
        found.len == want.len && p.valid(&found) && checked
    };
    Ok((secs, ok, detail))
}

/// The size flags and their defaults (`--help` lists them).
const FLAGS: &[Flag] = &[
    Flag { name: "cities", default: "18", help: "cities", aliases: &[] },
    Flag {
        name: "solve-below",
        default: "15",
        help: "tours with this many cities left or fewer are solved by one worker",
        aliases: &[],
    },
    Flag { name: "seed", default: "1", help: "city generator seed", aliases: &[] },
];

fn size(args: &Args) -> Result<Size, String> {
    let cities: usize = args.get("cities");
    if !(3..=MAX_CITIES).contains(&cities) {
        return Err(format!("--cities {cities} is not from 3 to {MAX_CITIES}"));
    }
    Ok(Size { cities, solve_below: args.get("solve-below"), seed: args.get("seed") })
}

fn main() -> ExitCode {
    run_app("tsp", FLAGS, size, |app, s| {
        let p = Problem::new(s.cities, s.seed);
        let size = format!("{} cities, solve below {} left", s.cities, s.solve_below);
        let (secs, ok, detail) = match app.mode {
            Mode::Seq => {
                let heap = vec![Tour::zeroed(); QUEUE_CAP];
                let t = Timer::start();
                let (best, head) = search(&p, &s, heap);
                let secs = t.secs();
                let (checked, checks) = check_reference(&p, &best);
                (secs, checked, format!("optimal length {} ({checks}); {}", best.len, head.describe()))
            }
            Mode::Threads => {
                let (secs, best, head) = threads(&p, &s, app.nprocs);
                let (want, _) = sequential(&p, &s);
                let (checked, checks) = check_reference(&p, &want);
                let detail = format!(
                    "optimal length {} (sequential {}, {checks}); {}",
                    best.len,
                    want.len,
                    head.describe()
                );
                (secs, best.len == want.len && p.valid(&best) && checked, detail)
            }
            Mode::Dsm => dsm(app, &p, &s)?,
        };
        Ok(Outcome { secs, ok, detail: format!("{size}; {detail}") })
    })
}
