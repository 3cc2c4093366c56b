//! What the example applications share: argument parsing, the three run modes, timing, the
//! result line and the PASS/FAIL verdict.
//!
//! Every app is one binary taking `-n N`, `--mode dsm|seq|threads` and its own size flags. It
//! times its parallel section only, checks its result against a sequential computation, and
//! prints (node 0 only, in DSM mode):
//!
//! ```text
//! RESULT app=sor mode=dsm nprocs=2 secs=0.1234 detail="2000x1000, 1000 iterations"
//! PASS
//! ```
//!
//! `tools/` parses the `RESULT` line; with `TMK_STATS=json` every node also prints its
//! statistics as one `TMK_STATS {...}` line on standard error.

pub mod keys;
pub mod mesh;
pub mod rng;
pub mod shared_mut;

use std::process::ExitCode;
use std::time::Instant;
use treadmarks::Tmk;

pub use shared_mut::SharedMut;

/// How an app runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// On `-n` treadmarks nodes (processes).
    Dsm,
    /// One thread, no DSM: the baseline for speedups.
    Seq,
    /// `-n` threads sharing real memory: the baseline for DSM efficiency.
    Threads,
}

/// Arguments left after the runtime took its own (`-n`, `--rank`, `--root`).
#[derive(Debug, Clone)]
pub struct Args {
    args: Vec<String>,
}

impl Args {
    /// Wraps the arguments.
    pub fn new(args: &[String]) -> Self {
        Args { args: args.to_vec() }
    }

    /// The value of `--name V` or `--name=V`, parsed, or `default`. Exits with a message if it
    /// does not parse.
    pub fn get<T: std::str::FromStr>(&self, name: &str, default: T) -> T {
        let flag = format!("--{name}");
        let mut it = self.args.iter();
        while let Some(a) = it.next() {
            let raw = if *a == flag {
                match it.next() {
                    Some(v) => v.clone(),
                    None => fail_usage(&format!("{flag} needs a value")),
                }
            } else if let Some(v) = a.strip_prefix(&flag).and_then(|r| r.strip_prefix('=')) {
                v.to_string()
            } else {
                continue;
            };
            return raw.parse().unwrap_or_else(|_| fail_usage(&format!("bad value {raw:?} for {flag}")));
        }
        default
    }
}

fn fail_usage(msg: &str) -> ! {
    treadmarks::report(&format!("error: {msg}"));
    std::process::exit(2);
}

/// A wall-clock timer.
#[derive(Debug)]
pub struct Timer(Instant);

impl Timer {
    /// Starts timing.
    pub fn start() -> Self {
        Timer(Instant::now())
    }

    /// Seconds since start.
    pub fn secs(&self) -> f64 {
        self.0.elapsed().as_secs_f64()
    }
}

/// What one run produced.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Seconds spent in the timed (parallel) section.
    pub secs: f64,
    /// The result matched the sequential computation (always true for `seq` itself).
    pub ok: bool,
    /// Problem size and anything worth printing.
    pub detail: String,
}

/// One run of an app: its mode, node or thread count, arguments and, in DSM mode, the node.
#[derive(Debug)]
pub struct App {
    pub mode: Mode,
    pub nprocs: usize,
    pub args: Args,
    tmk: Option<Tmk>,
}

impl App {
    /// The treadmarks node (DSM mode only).
    pub fn tmk(&mut self) -> &mut Tmk {
        self.tmk.as_mut().expect("the DSM node exists only in --mode dsm")
    }
}

/// Runs an app: sets up the mode, runs `body`, prints the result line and the verdict, and
/// returns the exit status (non-zero on FAIL or error).
pub fn run_app(name: &str, body: impl FnOnce(&mut App) -> treadmarks::Result<Outcome>) -> ExitCode {
    match run_inner(name, body) {
        Ok(code) => code,
        Err(e) => {
            treadmarks::report(&format!("{name}: {e}"));
            ExitCode::FAILURE
        }
    }
}

fn run_inner(
    name: &str,
    body: impl FnOnce(&mut App) -> treadmarks::Result<Outcome>,
) -> treadmarks::Result<ExitCode> {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let mode = match Args::new(&raw).get::<String>("mode", "dsm".into()).as_str() {
        "dsm" => Mode::Dsm,
        "seq" => Mode::Seq,
        "threads" => Mode::Threads,
        other => fail_usage(&format!("--mode must be dsm, seq or threads, not {other:?}")),
    };
    let mut app = if mode == Mode::Dsm {
        let tmk = Tmk::startup()?;
        App { mode, nprocs: tmk.nprocs(), args: Args::new(tmk.args()), tmk: Some(tmk) }
    } else {
        let (config, rest) = treadmarks::Config::from_env_and_args(raw)?;
        let nprocs = if mode == Mode::Seq { 1 } else { config.nprocs as usize };
        App { mode, nprocs, args: Args::new(&rest), tmk: None }
    };
    let outcome = body(&mut app)?;
    let me = app.tmk.as_ref().map_or(0, Tmk::proc_id);
    if let Some(tmk) = app.tmk.take() {
        tmk.exit()?;
    }
    if me != 0 {
        return Ok(if outcome.ok { ExitCode::SUCCESS } else { ExitCode::FAILURE });
    }
    let mode_name = match mode {
        Mode::Dsm => "dsm",
        Mode::Seq => "seq",
        Mode::Threads => "threads",
    };
    print_result(name, mode_name, app.nprocs, outcome.secs, &outcome.detail, outcome.ok);
    Ok(if outcome.ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Prints the `RESULT` line and `PASS` or `FAIL`. A reader that stopped reading (`| head -1`)
/// is not the run's failure, and the exit status still gives the verdict, so write errors are
/// ignored (`println!` would panic on the closed pipe).
pub fn print_result(app: &str, mode: &str, nprocs: usize, secs: f64, detail: &str, ok: bool) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "RESULT app={app} mode={mode} nprocs={nprocs} secs={secs:.6} detail={detail:?}")
        .and_then(|()| writeln!(out, "{}", if ok { "PASS" } else { "FAIL" }));
}

/// The rows `[begin, end)` of `0..n` that worker `me` of `nprocs` works on (contiguous blocks,
/// the first `n % nprocs` workers one row larger).
pub fn block(n: usize, me: usize, nprocs: usize) -> (usize, usize) {
    let (q, r) = (n / nprocs, n % nprocs);
    let begin = me * q + me.min(r);
    (begin, begin + q + usize::from(me < r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_everything_once() {
        for n in 0..50 {
            for p in 1..6 {
                let mut next = 0;
                for me in 0..p {
                    let (b, e) = block(n, me, p);
                    assert_eq!(b, next);
                    next = e;
                }
                assert_eq!(next, n);
            }
        }
    }

    #[test]
    fn flags_parse_both_ways() {
        let a = Args::new(&["--rows".into(), "12".into(), "--cols=7".into()]);
        assert_eq!(a.get("rows", 0usize), 12);
        assert_eq!(a.get("cols", 0usize), 7);
        assert_eq!(a.get("iterations", 5usize), 5);
    }
}
