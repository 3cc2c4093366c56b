//! Running the apps and reading what they print.

use crate::Plan;
use crate::apps::AppSpec;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Mutex, PoisonError, mpsc};
use std::time::Duration;

/// Settings every run is started with, whatever this process's environment holds: statistics as
/// JSON lines, which the runner reads. The report leaves them out of the settings the runs
/// inherit (`report::environment`).
pub const RUN_SETTINGS: [(&str, &str); 1] = [("TMK_STATS", "json")];

/// The process group of the run in progress. A run is started and noted here under this lock,
/// so an interrupt ([`stop_on_signals`]) either finds it to kill or keeps it from starting.
static RUNNING: Mutex<Option<i32>> = Mutex::new(None);

/// Makes SIGINT, SIGTERM and SIGHUP stop the runner with the run in progress: its app leads a
/// process group of its own, which the terminal's Ctrl-C does not reach. The signals are blocked
/// here, before any thread starts (the threads inherit that), and taken by a thread of their
/// own; the apps start with them unblocked (`std::process::Command` clears the signal mask).
pub fn stop_on_signals() {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(sig);
    }
    if set.thread_block().is_err() {
        return;
    }
    std::thread::spawn(move || {
        let Ok(sig) = set.wait() else { return };
        // Held to the exit: no run starts after this one is killed.
        let running = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pgid) = *running {
            kill_group(pgid);
        }
        eprintln!("\ntmk-bench: stopped by {sig}; the run in progress was killed");
        std::process::exit(128 + sig as i32);
    });
}

/// Median time and summed DSM statistics of one (app, mode, nodes) cell, and every repetition.
#[derive(Debug, Clone, Default)]
pub struct Cell {
    pub secs: Option<f64>,
    /// Per statistic, summed over the job's nodes (median run): up to the end of the timed region
    /// (`TMK_TIMED_STATS`, each node's statistics at its timer's end: the setup before it in,
    /// the check after it out), or of the whole job where an app prints none.
    pub stats: BTreeMap<String, f64>,
    /// The same, of the whole job (`TMK_STATS`, at exit): setup and checks included.
    pub job_stats: BTreeMap<String, f64>,
    /// Every repetition that passed, in the order they ran.
    pub reps: Vec<f64>,
    /// Why each repetition that failed did, in the order they ran.
    pub errors: Vec<String>,
    /// The fewest nodes pinned to a CPU of its own in any repetition that passed (`pinned`),
    /// where the runs say: an unpinned repetition moves the pairs and the range, not only the
    /// median run.
    pub least_pinned: Option<f64>,
}

/// The size an app ran at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Size {
    /// Its defaults: the size the targets are for.
    Default,
    /// Its quick size (`--small`).
    Small,
    /// Flags the user gave it (`--args APP=FLAGS`).
    Custom(Vec<String>),
}

impl Size {
    /// The size `plan` asks for `app`: the user's flags for it, else small or default.
    fn of(plan: &Plan, app: &AppSpec) -> Size {
        match plan.args.get(app.name) {
            Some(flags) => Size::Custom(flags.clone()),
            None if plan.small => Size::Small,
            None => Size::Default,
        }
    }

    /// Its name in `bench.json`.
    pub fn name(&self) -> &'static str {
        match self {
            Size::Default => "default",
            Size::Small => "small",
            Size::Custom(_) => "custom",
        }
    }

    /// The flags that select it.
    fn flags<'a>(&'a self, app: &'a AppSpec) -> Vec<&'a str> {
        match self {
            Size::Default => Vec::new(),
            Size::Small => app.small.to_vec(),
            Size::Custom(flags) => flags.iter().map(String::as_str).collect(),
        }
    }
}

/// Everything measured for one app.
#[derive(Debug, Clone)]
pub struct AppResult {
    pub app: &'static AppSpec,
    pub size: Size,
    pub seq: Cell,
    /// By node count.
    pub threads: BTreeMap<usize, Cell>,
    pub dsm: BTreeMap<usize, Cell>,
    /// The hand-written message-passing version, by process count (apps that have one).
    pub mp: BTreeMap<usize, Cell>,
    pub detail: String,
}

impl AppResult {
    /// Runs that failed, over every cell.
    pub fn failures(&self) -> usize {
        let cells = [&self.threads, &self.dsm, &self.mp].into_iter().flat_map(|m| m.values());
        std::iter::once(&self.seq).chain(cells).map(|c| c.errors.len()).sum()
    }
}

struct One {
    secs: f64,
    stats: BTreeMap<String, f64>,
    job_stats: BTreeMap<String, f64>,
    detail: String,
}

fn run_one(plan: &Plan, app: &AppSpec, size: &Size, mode: &str, n: usize) -> Result<One, String> {
    let exe = plan.bin.join(app.name);
    let mut cmd = Command::new(&exe);
    cmd.args(["--mode", mode, "-n", &n.to_string()]).args(size.flags(app));
    cmd.envs(RUN_SETTINGS).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    die_with_the_runner(&mut cmd);
    let mut running = RUNNING.lock().unwrap_or_else(PoisonError::into_inner);
    let mut child = cmd.spawn().map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    // The app leads a process group of its own, with the nodes or helpers it starts.
    let pgid = child.id() as i32;
    *running = Some(pgid);
    drop(running);
    let out_reader = drain(child.stdout.take());
    let err_reader = drain(child.stderr.take());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let waited = rx.recv_timeout(plan.timeout);
    // Nothing of a run outlives it: a straggler would hold the pipes open (and the readers with
    // them) and take CPU from the next run.
    kill_group(pgid);
    *RUNNING.lock().unwrap_or_else(PoisonError::into_inner) = None;
    let stdout = joined_within(out_reader, READERS_WAIT);
    let stderr = joined_within(err_reader, READERS_WAIT);
    let (stdout, stderr) = (String::from_utf8_lossy(&stdout), String::from_utf8_lossy(&stderr));
    let status = match waited {
        Ok(status) => status.map_err(|e| e.to_string())?,
        Err(_) => {
            let _ = rx.recv();
            let said = last_words(&stderr, &stdout);
            let said = if said.is_empty() { String::new() } else { format!(" ({said})") };
            return Err(format!("no result within {:?}; killed{said}", plan.timeout));
        }
    };
    let result = stdout.lines().find_map(|l| l.strip_prefix("RESULT "));
    let passed = stdout.lines().any(|l| l.trim() == "PASS");
    let (Some(result), true, true) = (result, passed, status.success()) else {
        let missing = match (result.is_some(), passed) {
            (false, _) => "no RESULT line; ",
            (true, false) => "no PASS; ",
            _ => "",
        };
        return Err(format!("{missing}{status} ({})", last_words(&stderr, &stdout)));
    };
    let field = |k: &str| result.split(' ').find_map(|f| f.strip_prefix(&format!("{k}=")));
    // `--args` can override the mode or node count the runner asked for: the cell would hold
    // another run's time.
    let n_asked = n.to_string();
    if field("mode") != Some(mode) || field("nprocs") != Some(n_asked.as_str()) {
        return Err(format!("RESULT line of another run than --mode {mode} -n {n}: {result}"));
    }
    let raw = field("secs").ok_or("RESULT line without secs")?;
    // A time the charts and ratios can take: not NaN, infinite, zero or negative.
    let secs = (raw.parse().ok().filter(|s: &f64| s.is_finite() && *s > 0.0))
        .ok_or_else(|| format!("RESULT line with secs={raw}, not a positive time"))?;
    let detail = result.split_once("detail=").map_or(String::new(), |(_, d)| d.trim_matches('"').to_string());
    let job_stats = summed(&stderr, "TMK_STATS ");
    let timed = summed(&stderr, "TMK_TIMED_STATS ");
    let stats = if timed.is_empty() { job_stats.clone() } else { timed };
    Ok(One { secs, stats, job_stats, detail })
}

/// Makes the app `cmd` starts die (SIGKILL) when the runner does, however it ends: a runner killed
/// outright (SIGKILL, an out-of-memory kill) runs no handler to kill its run in progress, whose
/// process group of its own no signal to the runner's group reaches. A DSM app's nodes follow their
/// launcher, the app; radix's message-passing ranks exit at their next read from its rank 0
/// (`examples/src/mesh.rs`). Runs start on the runner's main thread, which lives as long as the
/// runner (`PR_SET_PDEATHSIG` fires when the thread that forked the child ends).
fn die_with_the_runner(cmd: &mut Command) {
    treadmarks::mem::orphan::die_with_this_thread(cmd);
}

/// What a failed run said last: the last five lines of its standard error and then its standard
/// output, the statistics lines left out (`TMK_STATS` and `TMK_TIMED_STATS`, about 1.4 KB of JSON
/// a node each, printed at exit after the app's own diagnostic, would crowd it out).
fn last_words(stderr: &str, stdout: &str) -> String {
    let stats = |l: &&str| l.starts_with("TMK_STATS ") || l.starts_with("TMK_TIMED_STATS ");
    let mut tail: Vec<&str> =
        stderr.lines().chain(stdout.lines()).filter(|l| !stats(l)).rev().take(5).collect();
    tail.reverse();
    tail.join(" | ")
}

/// The statistics of the lines of `stderr` that start with `prefix` (one JSON object a node),
/// summed over the nodes.
fn summed(stderr: &str, prefix: &str) -> BTreeMap<String, f64> {
    let mut stats = BTreeMap::new();
    for line in stderr.lines().filter_map(|l| l.strip_prefix(prefix)) {
        if let Ok(serde_json::Value::Object(map)) = serde_json::from_str::<serde_json::Value>(line) {
            for (k, v) in map {
                if let Some(x) = v.as_f64().filter(|_| k != "node" && k != "nprocs") {
                    *stats.entry(k).or_insert(0.0) += x;
                }
            }
        }
    }
    stats
}

/// Reads `pipe` to its end on a thread of its own.
/// How long a run's output is waited for once its process group is killed: a process outside
/// it (started in a group of its own) could hold the pipes open for good.
const READERS_WAIT: Duration = Duration::from_secs(2);

/// What `reader` read, if it finishes within `bound` (else nothing: it is left to end alone).
fn joined_within(reader: std::thread::JoinHandle<Vec<u8>>, bound: Duration) -> Vec<u8> {
    let deadline = std::time::Instant::now() + bound;
    while !reader.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    if reader.is_finished() { reader.join().unwrap_or_default() } else { Vec::new() }
}

fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        bytes
    })
}

/// Kills process group `pgid` (a run's app and whatever it started), if any of it is left.
fn kill_group(pgid: i32) {
    // Never 0 or 1 (this process's group, every process): a child's pid is neither.
    if pgid > 1 {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL);
    }
}

/// Progress on standard error, rewritten in place on a terminal and a line each elsewhere, so
/// that the table on standard output stays clean.
fn progress(line: &str, last: bool) {
    let mut err = std::io::stderr().lock();
    let _ = if err.is_terminal() {
        write!(err, "\r\x1b[K{line}{}", if last { "\n" } else { "" })
    } else {
        writeln!(err, "{line}")
    };
    let _ = err.flush();
}

/// The runs of one (mode, nodes) cell.
#[derive(Default)]
struct Runs {
    ok: Vec<One>,
    errors: Vec<String>,
}

impl Runs {
    /// The median time (of an even count, the mean of the two middle ones) and the statistics
    /// of the median run (of an even count, the faster middle one), with every run's time and
    /// every failure.
    fn median(mut self) -> Cell {
        let reps: Vec<f64> = self.ok.iter().map(|o| o.secs).collect();
        self.ok.sort_by(|a, b| a.secs.total_cmp(&b.secs));
        let median = self.ok.len().checked_sub(1).map(|last| &self.ok[last / 2]);
        Cell {
            secs: crate::report::median(&reps),
            stats: median.map(|m| m.stats.clone()).unwrap_or_default(),
            job_stats: median.map(|m| m.job_stats.clone()).unwrap_or_default(),
            least_pinned: self.ok.iter().filter_map(|o| o.stats.get("pinned").copied()).reduce(f64::min),
            reps,
            errors: self.errors,
        }
    }
}

/// Runs the whole plan, printing progress.
pub fn run_all(plan: &Plan) -> Result<Vec<AppResult>, String> {
    for app in &plan.apps {
        let exe = plan.bin.join(app.name);
        if !exe.exists() {
            return Err(format!(
                "{} not found (build with `cargo build --release`, or pass --bin DIR)",
                exe.display()
            ));
        }
    }
    let cells_of = |app: &AppSpec| {
        let per_n: &[&str] =
            if app.message_passing { &["threads", "dsm", "mp"] } else { &["threads", "dsm"] };
        std::iter::once(("seq", 1))
            .chain(plan.nodes.iter().flat_map(|&n| per_n.iter().map(move |&mode| (mode, n))))
            .collect::<Vec<(&str, usize)>>()
    };
    let total: usize = plan.apps.iter().map(|app| plan.reps * cells_of(app).len()).sum();
    let mut step = 0;
    let mut results = Vec::new();
    for &app in &plan.apps {
        // The cells take turns within each repetition (seq, then threads, DSM and message
        // passing at each node count), so that the machine's drift during a run weighs on all
        // of them alike: the report is about their ratios.
        let cells = cells_of(app);
        let size = Size::of(plan, app);
        let mut runs: Vec<Runs> = cells.iter().map(|_| Runs::default()).collect();
        let mut detail = String::new();
        for rep in 0..plan.reps {
            for (&(mode, n), cell_runs) in cells.iter().zip(&mut runs) {
                step += 1;
                progress(&format!("[{step}/{total}] {} {mode} n={n} rep {} ...", app.name, rep + 1), false);
                match run_one(plan, app, &size, mode, n) {
                    Ok(one) => {
                        if mode == "seq" {
                            detail = one.detail.clone();
                        }
                        cell_runs.ok.push(one);
                    }
                    Err(e) => {
                        progress(&format!("[{step}/{total}] {} {mode} n={n}: FAILED: {e}", app.name), true);
                        cell_runs.errors.push(e);
                    }
                }
            }
        }
        let mut medians = cells.into_iter().zip(runs).map(|((mode, n), r)| (mode, n, r.median()));
        let seq = medians.next().map(|(_, _, cell)| cell).unwrap_or_default();
        let (mut threads, mut dsm, mut mp) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        for (mode, n, cell) in medians {
            match mode {
                "threads" => threads.insert(n, cell),
                "mp" => mp.insert(n, cell),
                _ => dsm.insert(n, cell),
            };
        }
        results.push(AppResult { app, size, seq, threads, dsm, mp, detail });
    }
    progress(&format!("[{step}/{total}] done"), true);
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::last_words;

    /// fft's DSM run at 4 nodes failing its check: each node's statistics at its timer's end,
    /// the app's diagnostic, each node's statistics at exit, then its verdict.
    #[test]
    fn a_failed_runs_reason_keeps_the_apps_diagnostic_not_the_statistics() {
        let stats = format!("{{\"node\":0,\"msgs_sent\":94,\"more\":\"{}\"}}", "x".repeat(1400));
        let mut stderr = String::new();
        for _ in 0..4 {
            stderr += &format!("TMK_TIMED_STATS {stats}\n");
        }
        stderr += "fft: the result differs from the sequential six-step run\n";
        for _ in 0..4 {
            stderr += &format!("TMK_STATS {stats}\n");
        }
        let stdout = "RESULT app=fft mode=dsm nprocs=4 secs=0.1 detail=\"x\"\nFAIL\n";
        assert_eq!(
            last_words(&stderr, stdout),
            "fft: the result differs from the sequential six-step run | RESULT app=fft mode=dsm \
             nprocs=4 secs=0.1 detail=\"x\" | FAIL"
        );
        // Other lines, up to five, are kept as they came.
        assert_eq!(last_words("a\nb\nc\nd\n", "e\nf\n"), "b | c | d | e | f");
    }
}
