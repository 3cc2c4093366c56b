//! Task-queue quicksort (TreadMarks' QS): the keys live in one shared array, and a shared stack
//! of `(lo, hi)` ranges, protected by a lock, holds the work. A worker pops a range; while it is
//! longer than the threshold, the worker partitions it in place (median-of-three pivot, Hoare),
//! pushes the larger part and goes on with the smaller; a range at or below the threshold it
//! sorts locally with the sequential sort. The stack also counts the ranges not yet sorted
//! (queued or being worked on); a worker finding the stack empty waits (backing off) while that
//! count is not zero, and stops when it is.
//!
//! `qsort -n 2 [--mode dsm|seq|threads] [--keys 2097152] [--threshold 65536] [--seed 1]`

use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;
use treadmarks::{Shared, Tmk};
use treadmarks_examples::{App, Args, Flag, Mode, Outcome, SharedMut, Timer, block, keys, run_app};

/// Ranges the stack holds; a worker finding it full sorts the range itself instead.
const CAPACITY: usize = 1024;
/// Length of the stack's `u32` array: the number of ranges queued, the number not yet sorted,
/// then `CAPACITY` pairs `lo, hi`.
const STACK_WORDS: usize = 2 + 2 * CAPACITY;

/// The task stack, over its `STACK_WORDS` words (shared memory, or a mutex's vector).
struct Stack<'a>(&'a mut [u32]);

impl Stack<'_> {
    /// A stack holding the one range `0..n` (nothing if it is empty).
    fn init(words: &mut [u32], n: usize) {
        words.fill(0);
        if n > 0 {
            Stack(words).push(0, n);
        }
    }

    /// Queues `lo..hi` as a new unsorted range; false (and nothing queued) if the stack is full.
    fn push(&mut self, lo: usize, hi: usize) -> bool {
        let len = self.0[0] as usize;
        if len == CAPACITY {
            return false;
        }
        self.0[2 + 2 * len] = lo as u32;
        self.0[3 + 2 * len] = hi as u32;
        self.0[0] += 1;
        self.0[1] += 1;
        true
    }

    /// Takes the latest range, or says whether to wait for more (some range is not yet sorted) or
    /// to stop.
    fn pop(&mut self) -> Take {
        let len = self.0[0] as usize;
        if len > 0 {
            self.0[0] -= 1;
            Take::Range(self.0[2 * len] as usize, self.0[1 + 2 * len] as usize)
        } else if self.0[1] > 0 {
            Take::Wait
        } else {
            Take::Stop
        }
    }

    /// One range popped earlier is sorted.
    fn finish(&mut self) {
        self.0[1] -= 1;
    }
}

enum Take {
    Range(usize, usize),
    Wait,
    Stop,
}

/// Splits `a` (at least 2 long) into `a[..m]` and `a[m..]`, both non-empty, no key of the first
/// greater than a key of the second; returns `m`. Median-of-three pivot moved to `a[0]`, then
/// Hoare's scheme (which keeps both parts non-empty with the pivot at the front).
fn partition(a: &mut [u32]) -> usize {
    let (n, mid) = (a.len(), a.len() / 2);
    let (x, y, z) = (a[0], a[mid], a[n - 1]);
    let median = if (x <= y) == (y <= z) {
        mid
    } else if (y <= x) == (x <= z) {
        0
    } else {
        n - 1
    };
    a.swap(0, median);
    let pivot = a[0];
    let (mut i, mut j) = (0, n - 1);
    loop {
        while a[i] < pivot {
            i += 1;
        }
        while a[j] > pivot {
            j -= 1;
        }
        if i >= j {
            return j + 1;
        }
        a.swap(i, j);
        i += 1;
        j -= 1;
    }
}

/// What a worker needs of its mode: the stack under its lock, and a range of the keys.
trait Env {
    fn with_stack<R>(&mut self, f: impl FnOnce(&mut Stack<'_>) -> R) -> treadmarks::Result<R>;
    fn with_keys<R>(
        &mut self,
        lo: usize,
        hi: usize,
        f: impl FnOnce(&mut [u32]) -> R,
    ) -> treadmarks::Result<R>;
}

/// One worker's loop; returns how many ranges it popped.
fn worker(env: &mut impl Env, threshold: usize) -> treadmarks::Result<usize> {
    let threshold = threshold.max(1);
    let mut popped = 0;
    let mut backoff = Duration::from_micros(10);
    loop {
        let (mut lo, mut hi) = match env.with_stack(|s| s.pop())? {
            Take::Range(lo, hi) => (lo, hi),
            Take::Wait => {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(1));
                continue;
            }
            Take::Stop => return Ok(popped),
        };
        popped += 1;
        backoff = Duration::from_micros(10);
        while hi - lo > threshold {
            let m = lo + env.with_keys(lo, hi, partition)?;
            let (larger, smaller) = if m - lo >= hi - m { ((lo, m), (m, hi)) } else { ((m, hi), (lo, m)) };
            if !env.with_stack(|s| s.push(larger.0, larger.1))? {
                env.with_keys(larger.0, larger.1, |k| k.sort_unstable())?;
            }
            (lo, hi) = smaller;
        }
        env.with_keys(lo, hi, |k| k.sort_unstable())?;
        env.with_stack(|s| s.finish())?;
    }
}

/// One thread over private memory.
struct SeqEnv<'a> {
    keys: &'a mut [u32],
    stack: Vec<u32>,
}

impl Env for SeqEnv<'_> {
    fn with_stack<R>(&mut self, f: impl FnOnce(&mut Stack<'_>) -> R) -> treadmarks::Result<R> {
        Ok(f(&mut Stack(&mut self.stack)))
    }
    fn with_keys<R>(
        &mut self,
        lo: usize,
        hi: usize,
        f: impl FnOnce(&mut [u32]) -> R,
    ) -> treadmarks::Result<R> {
        Ok(f(&mut self.keys[lo..hi]))
    }
}

/// Threads over real shared memory, the stack behind a mutex.
struct ThreadEnv<'a, 'k> {
    keys: &'a SharedMut<'k, u32>,
    stack: &'a Mutex<Vec<u32>>,
}

impl Env for ThreadEnv<'_, '_> {
    fn with_stack<R>(&mut self, f: impl FnOnce(&mut Stack<'_>) -> R) -> treadmarks::Result<R> {
        Ok(f(&mut Stack(&mut self.stack.lock().expect("stack lock"))))
    }
    fn with_keys<R>(
        &mut self,
        lo: usize,
        hi: usize,
        f: impl FnOnce(&mut [u32]) -> R,
    ) -> treadmarks::Result<R> {
        // SAFETY: a range belongs to one worker from the time it pops it (or splits it off a
        // range it owns) until it sorts it or pushes it back, and ranges being worked on or on the
        // stack are disjoint; the mutex orders the hand-over of a range between threads.
        Ok(f(unsafe { self.keys.slice_mut(lo..hi) }))
    }
}

/// A DSM node: the stack under lock 0.
struct DsmEnv<'a> {
    tmk: &'a mut Tmk,
    keys: Shared<[u32]>,
    stack: Shared<[u32]>,
}

impl Env for DsmEnv<'_> {
    fn with_stack<R>(&mut self, f: impl FnOnce(&mut Stack<'_>) -> R) -> treadmarks::Result<R> {
        let g = self.tmk.lock(0)?;
        let r = f(&mut Stack(&mut g.view_mut(&self.stack)?));
        g.unlock()?;
        Ok(r)
    }
    fn with_keys<R>(
        &mut self,
        lo: usize,
        hi: usize,
        f: impl FnOnce(&mut [u32]) -> R,
    ) -> treadmarks::Result<R> {
        Ok(f(&mut self.tmk.view_mut(&self.keys.slice(lo, hi))?))
    }
}

#[derive(Clone, Copy)]
struct Size {
    keys: usize,
    threshold: usize,
    seed: u64,
}

fn new_stack(n: usize) -> Vec<u32> {
    let mut words = vec![0; STACK_WORDS];
    Stack::init(&mut words, n);
    words
}

fn expected(s: &Size) -> Vec<u32> {
    let mut v = keys::uniform(s.keys, s.seed);
    v.sort_unstable();
    v
}

fn sequential(s: &Size) -> (f64, Vec<u32>) {
    let mut keys = keys::uniform(s.keys, s.seed);
    let t = Timer::start();
    let mut env = SeqEnv { keys: &mut keys, stack: new_stack(s.keys) };
    worker(&mut env, s.threshold).expect("no DSM errors in seq mode");
    (t.secs(), keys)
}

fn threads(s: &Size, n: usize) -> (f64, Vec<u32>) {
    let mut keys = keys::uniform(s.keys, s.seed);
    let stack = Mutex::new(new_stack(s.keys));
    let t = Timer::start();
    {
        let keys = SharedMut::new(&mut keys);
        std::thread::scope(|scope| {
            for _ in 0..n {
                let mut env = ThreadEnv { keys: &keys, stack: &stack };
                scope.spawn(move || worker(&mut env, s.threshold).expect("no DSM errors in threads mode"));
            }
        });
    }
    (t.secs(), keys)
}

fn dsm(app: &mut App, s: &Size) -> treadmarks::Result<(f64, bool, usize)> {
    let tmk = app.tmk();
    let (me, n) = (tmk.proc_id(), tmk.nprocs());
    let mut arrays: [Shared<[u32]>; 2] = [Shared::from_raw_parts(0, 0); 2];
    if me == 0 {
        arrays = [tmk.alloc_pages::<u32>(s.keys)?, tmk.alloc_pages::<u32>(STACK_WORDS)?];
        Stack::init(&mut tmk.view_mut(&arrays[1])?, s.keys);
    }
    tmk.distribute(&mut arrays)?;
    let [keys, stack] = arrays;
    let (begin, end) = block(s.keys, me, n);
    keys::fill_uniform(&mut tmk.view_mut(&keys.slice(begin, end))?, begin, s.seed);
    tmk.barrier(0)?;
    let t = Timer::start();
    let popped = worker(&mut DsmEnv { tmk: &mut *tmk, keys, stack }, s.threshold)?;
    tmk.barrier(0)?;
    let secs = t.stop(tmk)?;
    let ok = me != 0 || *tmk.view(&keys)? == expected(s)[..];
    Ok((secs, ok, popped))
}

/// The size flags and their defaults (`--help` lists them).
const FLAGS: &[Flag] = &[
    Flag { name: "keys", default: "2097152", help: "keys to sort", aliases: &[] },
    Flag {
        name: "threshold",
        default: "65536",
        help: "ranges at most this long are sorted by one worker",
        aliases: &[],
    },
    Flag { name: "seed", default: "1", help: "key generator seed", aliases: &[] },
];

fn size(args: &Args) -> Result<Size, String> {
    let s = Size { keys: args.get("keys"), threshold: args.get("threshold"), seed: args.get("seed") };
    if s.keys > u32::MAX as usize {
        return Err(format!("--keys {} does not fit in a u32", s.keys));
    }
    // The keys and the check's sorted copy.
    treadmarks_examples::fits_memory(&format!("--keys {}", s.keys), 2 * 4 * s.keys as u128)?;
    Ok(s)
}

fn main() -> ExitCode {
    run_app("qsort", FLAGS, size, |app, s| {
        let mut detail = format!("{} keys, threshold {}", s.keys, s.threshold);
        let (secs, ok) = match app.mode {
            Mode::Seq => {
                let (secs, out) = sequential(&s);
                (secs, out == expected(&s))
            }
            Mode::Threads => {
                let (secs, out) = threads(&s, app.nprocs);
                (secs, out == expected(&s))
            }
            Mode::Dsm => {
                let (secs, ok, popped) = dsm(app, &s)?;
                detail += &format!(", node 0 popped {popped} ranges");
                (secs, ok)
            }
        };
        Ok(Outcome { secs, ok, detail })
    })
}
