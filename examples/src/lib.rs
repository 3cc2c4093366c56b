//! What the example applications share: argument parsing, the three run modes, timing, the
//! result line and the PASS/FAIL verdict.
//!
//! Every app is one binary taking `-n N`, `--mode dsm|seq|threads` and its own size flags, which
//! it declares ([`Flag`]): `--help` lists them with their defaults, and any other argument is
//! refused by name (exit status 2) before anything runs. It times its parallel section only,
//! checks its result against a sequential computation, and prints (node 0 only, in DSM mode):
//!
//! ```text
//! RESULT app=sor mode=dsm nprocs=2 secs=0.1234 detail="2000x1000, 1000 iterations"
//! PASS
//! ```
//!
//! `tools/` parses the `RESULT` line; with `TMK_STATS=json` every node also prints its
//! statistics as one `TMK_TIMED_STATS {...}` line on standard error at the end of its timed
//! region ([`Timer::stop`]), and as one `TMK_STATS {...}` line at its exit (the whole job's).

pub mod keys;
pub mod mesh;
pub mod page_aligned;
pub mod rng;
pub mod shared_mut;

use std::process::ExitCode;
use std::time::Instant;
use treadmarks::Tmk;

pub use shared_mut::SharedMut;

/// Large allocations start on a page, in every mode, like the DSM heap's arrays
/// ([`page_aligned`]).
#[global_allocator]
static ALLOCATOR: page_aligned::PageAligned = page_aligned::PageAligned;

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

/// One flag of an app beyond `-n` and `--mode`: `--name V` (or `--name=V`), its default, and
/// what it sets. An app declares all of them; [`Args`] refuses any other and lists them for
/// `--help`.
#[derive(Debug, Clone, Copy)]
pub struct Flag {
    pub name: &'static str,
    pub default: &'static str,
    pub help: &'static str,
    /// Other names of the same flag (`--iterations` for `--steps`, say): each sets it as
    /// `--name` does, and `--help` lists them with it. Usually none (`&[]`).
    pub aliases: &'static [&'static str],
}

impl Flag {
    /// Whether `--key` names this flag, by its name or an alias.
    fn is_named(&self, key: &str) -> bool {
        self.name == key || self.aliases.contains(&key)
    }
}

/// An app's command line, less the runtime's own flags (`-n`, `--nprocs`, `--rank`, `--root`),
/// checked against the app's [`Flag`]s and the modes it has.
#[derive(Debug, Clone)]
pub struct Args {
    args: Vec<String>,
    flags: &'static [Flag],
    /// The nodes, threads or processes the run will have (`-n`; 1 in seq mode).
    nprocs: usize,
}

impl Args {
    /// Checks `args` for app `app`: exits 2 naming the argument on anything that is not
    /// `--mode` (one of `modes`) or a flag of `flags` with a value. (`--help` is taken first, by
    /// [`command_line`].)
    pub fn new(app: &str, args: &[String], flags: &'static [Flag], modes: &[&str]) -> Self {
        for (i, f) in flags.iter().enumerate() {
            let names = std::iter::once(&f.name).chain(f.aliases);
            for n in names {
                let clash = *n == "mode" || flags[i + 1..].iter().any(|g| g.is_named(n));
                assert!(!clash, "{app}: --{n} is declared twice (a flag's name or alias)");
            }
        }
        let parsed = Args { args: args.to_vec(), flags, nprocs: 1 };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let Some(flag) = a.strip_prefix("--") else {
                fail_usage(&format!("{app}: unexpected argument {a:?}\n{}", usage(app, flags, modes)))
            };
            let (name, inline) = match flag.split_once('=') {
                Some((name, _)) => (name, true),
                None => (flag, false),
            };
            if name != "mode" && !flags.iter().any(|f| f.is_named(name)) {
                fail_usage(&format!("{app}: unknown flag --{name}\n{}", usage(app, flags, modes)))
            }
            if !inline && it.next().is_none() {
                fail_usage(&format!("{app}: --{name} needs a value"))
            }
        }
        let mode = parsed.mode();
        if !modes.contains(&mode.as_str()) {
            fail_usage(&format!("{app}: --mode must be one of {}, not {mode:?}", modes.join(", ")))
        }
        parsed
    }

    /// The value of `--mode`, or `dsm`.
    pub fn mode(&self) -> String {
        self.value(|key| key == "mode").map_or_else(|| "dsm".into(), |(_, v)| v)
    }

    /// The value of flag `name` (one of the app's), parsed, or its declared default: the last
    /// value given under its name or any of its aliases. Exits with a message naming the value
    /// (and the spelling it was given under) if it does not parse.
    pub fn get<T: std::str::FromStr>(&self, name: &str) -> T {
        let Some(flag) = self.flags.iter().find(|f| f.name == name) else {
            panic!("--{name} is not one of this app's declared flags")
        };
        let (key, raw) = self
            .value(|key| flag.is_named(key))
            .unwrap_or_else(|| (name.to_string(), flag.default.to_string()));
        raw.parse().unwrap_or_else(|_| fail_usage(&format!("bad value {raw:?} for --{key}")))
    }

    /// The nodes, threads or processes the run will have: `-n` ([`command_line`] sets it), 1 in
    /// seq mode. For a size check whose arrays grow with it.
    pub fn nprocs(&self) -> usize {
        self.nprocs
    }

    /// The last `(key, value)` given for a key that `wanted` accepts, if any. (Every flag has its
    /// value, inline or next: [`Args::new`] checked; a value is never taken for a flag.)
    fn value(&self, wanted: impl Fn(&str) -> bool) -> Option<(String, String)> {
        let mut found = None;
        let mut it = self.args.iter();
        while let Some(a) = it.next() {
            let flag = a.strip_prefix("--").unwrap_or(a);
            let (key, v) = match flag.split_once('=') {
                Some((key, v)) => (key, Some(v.to_string())),
                None => (flag, it.next().cloned()),
            };
            if wanted(key) {
                found = v.map(|v| (key.to_string(), v));
            }
        }
        found
    }
}

/// The usage text of app `app`.
fn usage(app: &str, flags: &[Flag], modes: &[&str]) -> String {
    let mut mode_help =
        "dsm (default): on treadmarks nodes; seq: one thread; threads: threads sharing memory".to_string();
    if modes.contains(&"mp") {
        mode_help += "; mp: processes passing messages";
    }
    let n_help = if modes.contains(&"mp") {
        "nodes, threads or processes (default 1)"
    } else {
        "nodes or threads (default 1)"
    };
    let mut lines = vec![("-n N".to_string(), n_help.to_string())];
    lines.push((format!("--mode {}", modes.join("|")), mode_help));
    lines.extend(flags.iter().map(|f| {
        let also: String = f.aliases.iter().map(|a| format!("; also --{a} V")).collect();
        (format!("--{} V", f.name), format!("{} (default {}{also})", f.help, f.default))
    }));
    let width = lines.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    let mut out = format!("usage: {app} [-n N] [--mode M]");
    for f in flags {
        out += &format!(" [--{} V]", f.name);
    }
    out += "\n";
    for (left, right) in lines {
        out += &format!("  {left:width$}  {right}\n");
    }
    out += "Prints a RESULT line, then PASS, or FAIL and exits with status 1.\n";
    out += "Runtime settings (TMK_*): see the README.\n";
    out
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

    /// Seconds since start, at the end of a DSM node's timed region. With `TMK_STATS=json` it is
    /// a collective, which every node calls: the node also prints its statistics so far as one
    /// `TMK_TIMED_STATS {...}` line on standard error: its traffic up to the timer's end, the
    /// check after the timed region left out (the setup before it stays in: a barrier, a
    /// distribute and the input's first writes); what `tmk-bench` reports. Then it waits at a
    /// barrier, so that no node's check asks another for pages before that one's statistics are
    /// taken: a node whose timer stopped later had counted the first node's check (fft at 2
    /// nodes: 1,024 or 2,048 diffs more in one run in three, and 94 to 107 messages).
    pub fn stop(&self, tmk: &mut Tmk) -> treadmarks::Result<f64> {
        let secs = self.secs();
        if std::env::var("TMK_STATS").is_ok_and(|v| v.eq_ignore_ascii_case("json")) {
            treadmarks::report(&format!("TMK_TIMED_STATS {}", tmk.stats()?.to_json()));
            tmk.barrier(0)?;
        }
        Ok(secs)
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

/// One run of an app: its mode, node or thread count and, in DSM mode, the node.
#[derive(Debug)]
pub struct App {
    pub mode: Mode,
    pub nprocs: usize,
    tmk: Option<Tmk>,
}

impl App {
    /// The treadmarks node (DSM mode only).
    pub fn tmk(&mut self) -> &mut Tmk {
        self.tmk.as_mut().expect("the DSM node exists only in --mode dsm")
    }
}

/// The modes every app has.
pub const MODES: &[&str] = &["dsm", "seq", "threads"];

/// The command line of app `name`: the runtime's settings (`-n` and `TMK_*`) and the app's
/// flags, checked. Exits 2 with a message naming a bad one, and 0 after printing the usage on
/// `--help`.
pub fn command_line(name: &str, flags: &'static [Flag], modes: &[&str]) -> (treadmarks::Config, Args) {
    let raw = treadmarks::Config::command_line().unwrap_or_else(|e| fail_usage(&format!("{name}: {e}")));
    if raw.iter().any(|a| a == "--help" || a == "-h") {
        print!("{}", usage(name, flags, modes));
        std::process::exit(0);
    }
    let (config, rest) =
        treadmarks::Config::from_env_and_args(raw).unwrap_or_else(|e| fail_usage(&format!("{name}: {e}")));
    let mut args = Args::new(name, &rest, flags, modes);
    args.nprocs = if args.mode() == "seq" { 1 } else { config.nprocs as usize };
    (config, args)
}

/// Runs an app: reads its command line ([`command_line`]) and its size (`size`, which says
/// what is wrong with the flags, if anything: the app then exits 2 before any node starts),
/// sets up the mode, runs `body`, prints the result line and the verdict, and returns the exit
/// status (non-zero on FAIL or error).
pub fn run_app<S>(
    name: &str,
    flags: &'static [Flag],
    size: impl FnOnce(&Args) -> Result<S, String>,
    body: impl FnOnce(&mut App, S) -> treadmarks::Result<Outcome>,
) -> ExitCode {
    let (config, args) = command_line(name, flags, MODES);
    let s = sized(name, &args, size);
    run_parsed(name, &config, &args, s, body)
}

/// The size `size` reads from `args`; exits 2 with its message if it refuses them.
pub fn sized<S>(name: &str, args: &Args, size: impl FnOnce(&Args) -> Result<S, String>) -> S {
    size(args).unwrap_or_else(|why| fail_usage(&format!("{name}: {why}")))
}

/// [`run_app`] on a command line and a size already read (radix reads its own, for its fourth
/// mode).
pub fn run_parsed<S>(
    name: &str,
    config: &treadmarks::Config,
    args: &Args,
    s: S,
    body: impl FnOnce(&mut App, S) -> treadmarks::Result<Outcome>,
) -> ExitCode {
    match run_inner(config, args, s, name, body) {
        Ok(code) => code,
        Err(e) => {
            treadmarks::report(&format!("{name}: {e}"));
            ExitCode::FAILURE
        }
    }
}

fn run_inner<S>(
    config: &treadmarks::Config,
    args: &Args,
    s: S,
    name: &str,
    body: impl FnOnce(&mut App, S) -> treadmarks::Result<Outcome>,
) -> treadmarks::Result<ExitCode> {
    let mode = match args.mode().as_str() {
        "dsm" => Mode::Dsm,
        "seq" => Mode::Seq,
        "threads" => Mode::Threads,
        other => fail_usage(&format!("{name}: --mode {other} is not run here")),
    };
    let mut app = if mode == Mode::Dsm {
        let tmk = Tmk::startup()?;
        App { mode, nprocs: tmk.nprocs(), tmk: Some(tmk) }
    } else {
        let nprocs = if mode == Mode::Seq { 1 } else { config.nprocs as usize };
        App { mode, nprocs, tmk: None }
    };
    let outcome = body(&mut app, s)?;
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

/// The largest of `errors`, and NaN if any is NaN: `f64::max` drops a NaN, so a result holding
/// one would pass a check against a tolerance.
pub fn worst(errors: impl IntoIterator<Item = f64>) -> f64 {
    errors.into_iter().fold(0.0, |m: f64, e| if m.is_nan() || e <= m { m } else { e })
}

/// Refuses a size whose arrays (`bytes`, one copy) would not fit this machine's memory, naming
/// `flags` (what set the size): seq and threads would abort on the allocation, the DSM would
/// fail on a full heap, after its nodes started. `Ok` where the memory cannot be read.
pub fn fits_memory(flags: &str, bytes: u128) -> Result<(), String> {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemTotal:"))?.to_owned();
        line.split_whitespace().nth(1)?.parse::<u128>().ok().map(|kib| kib << 10)
    });
    match total {
        Some(total) if bytes > total => {
            let gib = |b: u128| b as f64 / f64::from(1u32 << 30);
            Err(format!(
                "{flags}: its arrays take {:.1} GiB, more than this machine's {:.1} GiB of memory",
                gib(bytes),
                gib(total)
            ))
        }
        _ => Ok(()),
    }
}

/// Maps every page of `v` before a timed region, by writing one element of each back as it is.
///
/// The DSM backs its heap at startup, before its timer starts (its statistics' "heap pages backed
/// ahead of their first touch"), while a zeroed `Vec` gets each page from the kernel at its first
/// touch, a fault and a zeroing (16 MB: 4,096 of them, several ms). A baseline that took them in
/// its timed region was charged what the DSM was not: fft at one node ran in 0.77 of its
/// sequential time, and radix in 0.78.
pub fn prefault<T: Copy>(v: &mut [T]) {
    let step = (4096 / size_of::<T>().max(1)).max(1);
    for i in (0..v.len()).step_by(step) {
        v[i] = std::hint::black_box(v[i]);
    }
}

/// `len` zeros (`T::default()`), their pages mapped ahead ([`prefault`]).
pub fn zeroed<T: Copy + Default>(len: usize) -> Vec<T> {
    let mut v = vec![T::default(); len];
    prefault(&mut v);
    v
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

    /// The process's minor page faults so far (`/proc/self/stat`, field 10).
    fn minor_faults() -> u64 {
        let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
        // Fields after the command name, which ends at the last ')': state is field 3.
        let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
        rest.split(' ').nth(7).and_then(|f| f.parse().ok()).expect("field 10, minflt")
    }

    #[test]
    fn prefault_maps_every_page_and_keeps_the_values() {
        const PAGES: usize = 4096;
        let mut v = vec![0u64; PAGES * 512];
        v[12345] = 7;
        prefault(&mut v);
        let before = minor_faults();
        for i in (0..v.len()).step_by(512) {
            v[i] += 1;
        }
        let faults = minor_faults() - before;
        // Without the prefault, every page faults here (4,096).
        assert!(faults < PAGES as u64 / 16, "{faults} faults writing {PAGES} prefaulted pages");
        assert_eq!(v[12345], 7);
        assert_eq!(v.iter().sum::<u64>(), 7 + PAGES as u64);
    }

    #[test]
    fn the_worst_error_keeps_a_nan() {
        assert_eq!(worst([0.5, 2.0, 1.0]), 2.0);
        assert_eq!(worst([]), 0.0);
        assert!(worst([1.0, f64::NAN, 3.0]).is_nan());
        assert!(worst([f64::NAN, 1.0]).is_nan());
    }

    #[test]
    fn flags_parse_both_ways_and_fall_back_to_their_defaults() {
        const FLAGS: &[Flag] = &[
            Flag { name: "rows", default: "1", help: "rows", aliases: &[] },
            Flag { name: "cols", default: "2", help: "columns", aliases: &[] },
            Flag { name: "iterations", default: "5", help: "iterations", aliases: &[] },
        ];
        let raw = ["--rows", "12", "--cols=7", "--mode", "seq", "--rows", "13"].map(String::from);
        let a = Args::new("t", &raw, FLAGS, MODES);
        assert_eq!(a.get::<usize>("rows"), 13, "the last value given wins");
        assert_eq!(a.get::<usize>("cols"), 7);
        assert_eq!(a.get::<usize>("iterations"), 5);
        assert_eq!(a.mode(), "seq");
        let text = usage("t", FLAGS, MODES);
        assert!(text.contains("--cols V") && text.contains("columns (default 2)"), "{text}");
        assert!(!text.contains("mp:"), "{text}");
    }

    #[test]
    fn an_alias_sets_its_flag_and_help_lists_it() {
        const FLAGS: &[Flag] = &[
            Flag { name: "steps", default: "20", help: "time steps", aliases: &["iterations"] },
            Flag { name: "size", default: "8", help: "size", aliases: &[] },
        ];
        let a = Args::new("t", &["--iterations", "7"].map(String::from), FLAGS, MODES);
        assert_eq!(a.get::<usize>("steps"), 7);
        assert_eq!(a.get::<usize>("size"), 8);
        let a = Args::new("t", &["--iterations=7", "--steps", "9"].map(String::from), FLAGS, MODES);
        assert_eq!(a.get::<usize>("steps"), 9, "the last value given wins, under either name");
        let a = Args::new("t", &["--steps", "9", "--iterations", "3"].map(String::from), FLAGS, MODES);
        assert_eq!(a.get::<usize>("steps"), 3);
        assert_eq!(Args::new("t", &[], FLAGS, MODES).get::<usize>("steps"), 20);
        let text = usage("t", FLAGS, MODES);
        assert!(text.contains("time steps (default 20; also --iterations V)"), "{text}");
    }

    #[test]
    #[should_panic(expected = "--steps is declared twice")]
    fn an_alias_may_not_shadow_another_flag() {
        const FLAGS: &[Flag] = &[
            Flag { name: "iterations", default: "1", help: "i", aliases: &["steps"] },
            Flag { name: "steps", default: "1", help: "s", aliases: &[] },
        ];
        Args::new("t", &[], FLAGS, MODES);
    }
}
