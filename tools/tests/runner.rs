//! `tmk-bench` end to end: small runs of two apps at 1 and 2 nodes (one with a message-passing
//! version, at a size given with `--args`), their table, JSON and charts;
//! and its refusals. The apps are the workspace's release binaries next to `tmk-bench` (built by
//! `cargo test --workspace --release`, or `cargo build --release`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use treadmarks_tests::{Proc, die_with_this_thread, hermetic};

/// `tmk-bench`, with its output piped, the `TMK_*` settings of the caller's shell left out (it
/// names every one it inherits, and passes them on to the apps), dying with the test's thread
/// (and its run in progress with it: `run.rs`, `die_with_the_runner`).
fn bench() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tmk-bench"));
    hermetic(&mut cmd);
    die_with_this_thread(&mut cmd);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

/// How long a `tmk-bench` of these tests may take before the test stops it and fails.
const BOUND: Duration = Duration::from_secs(240);

/// A running `tmk-bench`, stopped if the test ends before it does.
struct Bench(Option<Child>);

impl Bench {
    fn start(cmd: &mut Command) -> Bench {
        Bench(Some(cmd.spawn().expect("tmk-bench starts")))
    }

    /// Its output, once it ends within [`BOUND`]; otherwise it is stopped and the test fails.
    fn finish(mut self) -> Output {
        let child = self.0.take().expect("not finished yet");
        let pid = Pid::from_raw(child.id() as i32);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        if let Ok(out) = rx.recv_timeout(BOUND) {
            return out.expect("wait for tmk-bench");
        }
        // SIGTERM first: it kills its run in progress, which leads a process group of its own.
        let _ = kill(pid, Signal::SIGTERM);
        let out = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| {
            let _ = kill(pid, Signal::SIGKILL);
            rx.recv().expect("the waiter answers")
        });
        let out = out.expect("wait for tmk-bench");
        panic!("tmk-bench did not finish within {BOUND:?} and was stopped:\n{}", text(&out));
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let pid = Pid::from_raw(child.id() as i32);
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs `cmd` (a [`bench`]) to its end, within [`BOUND`].
fn finished(cmd: &mut Command) -> Output {
    Bench::start(cmd).finish()
}

/// Whether process `pid` runs (a zombie nobody reaped is dead).
fn running(pid: i32) -> bool {
    u32::try_from(pid).ok().and_then(Proc::running).is_some()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A fresh directory for one test's output, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("tmk-bench-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn small_runs_give_a_table_json_and_charts() {
    let bin = Path::new(env!("CARGO_BIN_EXE_tmk-bench")).parent().expect("a directory").to_path_buf();
    for app in ["sor", "radix"] {
        assert!(
            bin.join(app).exists(),
            "{app} is not built next to tmk-bench: run `cargo build --release` first"
        );
    }
    let out_dir = Scratch::new("small");
    let out = finished(
        bench()
            .args(["--small", "--apps", "sor,radix", "--args", "radix=--keys 50000", "--nodes", "1,2"])
            // Small sizes run in well under a second: a hung run is killed in 30 s, and a runner
            // that takes longer than BOUND in all is stopped.
            .args(["--reps", "1", "--timeout", "30", "--out"])
            .arg(&out_dir.0),
    );
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The columns are right-aligned: the target column ends where its header does.
    let header =
        stdout.lines().find(|l| l.starts_with("app ")).unwrap_or_else(|| panic!("no header in\n{all}"));
    let target_end = header.find(" target").map(|i| i + " target".len()).expect("a target column");
    for (app, n) in [("sor", "1"), ("sor", "2"), ("radix", "1"), ("radix", "2")] {
        let row = stdout.lines().find(|l| l.split_whitespace().take(2).eq([app, n]));
        let row = row.unwrap_or_else(|| panic!("no row for {app} at {n} nodes in\n{all}"));
        // Small sizes are not what the targets are for: no verdict, and no summary.
        let target = row.get(..target_end).and_then(|r| r.split_whitespace().last());
        let aligned = row.get(target_end..).is_some_and(|rest| rest.starts_with(' '));
        assert!(aligned && target == Some("-"), "target column of\n{header}\n{row}");
    }
    assert!(!stdout.contains("targets at"), "{all}");
    // radix ran at the size given, which the table names.
    let sized = "radix ran with `--keys 50000` (50000 keys, radix 2^8, 4 passes): no target verdicts";
    assert!(stdout.contains(sized), "{all}");
    assert!(!stdout.contains("FAILED"), "{all}");
    // radix's message-passing version ran beside it, and only radix's.
    for n in [1, 2] {
        let line = format!("message passing (radix --mode mp), n={n}: ");
        assert!(stdout.lines().any(|l| l.starts_with(&line) && l.contains("dsm/mp")), "{all}");
    }
    assert!(!stdout.contains("(sor --mode mp)"), "{all}");

    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.0.join("bench.json")).expect("bench.json written"))
            .expect("bench.json is JSON");
    let apps = json["apps"].as_array().expect("an array of apps");
    assert_eq!(apps.iter().map(|a| a["app"].as_str().unwrap_or("")).collect::<Vec<_>>(), ["sor", "radix"]);
    assert_eq!((&apps[0]["size"], &apps[1]["size"]), (&"small".into(), &"custom".into()));
    assert_eq!(apps[1]["args"], serde_json::json!(["--keys", "50000"]));
    for a in apps {
        assert_eq!(a["failures"], 0, "{a}");
        assert!(a["seq"]["secs"].as_f64().is_some_and(|s| s > 0.0), "{a}");
        // Every repetition is kept beside the median.
        assert_eq!(a["seq"]["reps"].as_array().map(Vec::len), Some(1), "{a}");
        assert_eq!(a["seq"]["errors"], serde_json::json!([]), "{a}");
        let runs = a["runs"].as_array().expect("runs");
        assert_eq!(runs.iter().map(|r| r["nodes"].as_u64().unwrap_or(0)).collect::<Vec<_>>(), [1, 2]);
        for r in runs {
            assert!(r["dsm_over_threads"].as_f64().is_some_and(|x| x > 0.0), "{r}");
            assert!(r["target"].is_null(), "{r}");
        }
        // Two nodes talk; the statistics of both are summed: of the timed region, and of the
        // whole job, which holds it and the setup and check around it.
        let sent = |which: &str| runs[1]["dsm"][which]["msgs_sent"].as_f64().unwrap_or(0.0);
        assert!(sent("stats") > 0.0 && sent("job_stats") > sent("stats"), "{a}");
        let mp = a["app"] == "radix";
        for r in runs {
            assert_eq!(r["mp"]["secs"].as_f64().is_some_and(|s| s > 0.0), mp, "{r}");
            assert_eq!(r["dsm_over_mp"].as_f64().is_some(), mp, "{r}");
        }
    }
    for chart in ["speedup.svg", "efficiency.svg"] {
        let svg = std::fs::read_to_string(out_dir.0.join(chart)).expect("chart written");
        assert!(svg.contains("<svg") && svg.trim_end().ends_with("</svg>"), "{chart}");
        assert!(svg.contains("sor") && svg.contains("radix"), "{chart} names the apps");
    }
}

#[test]
fn bad_arguments_and_missing_apps_are_refused_by_name() {
    let out = finished(bench().args(["--apps", "sor,nosuch"]));
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(text(&out).contains("unknown app \"nosuch\""), "{}", text(&out));

    for (args, says) in [
        ("nosuch=--keys 5", "unknown app \"nosuch\""),
        ("radix", "--args needs APP=FLAGS, got \"radix\""),
        ("radix= ", "--args needs APP=FLAGS, got \"radix= \""),
    ] {
        let out = finished(bench().args(["--args", args]));
        assert_eq!(out.status.code(), Some(2), "{}", text(&out));
        assert!(text(&out).contains(says), "{}", text(&out));
    }

    for (args, says) in [
        (&["--nodes", "0"][..], "bad node count \"0\""),
        (&["--nodes", "1,2,1"][..], "node count 1 named twice"),
        (&["--apps", "is,lu,is"][..], "app \"is\" named twice"),
        (&["--reps", "0"][..], "bad --reps \"0\""),
        (&["--timeout", "soon"][..], "bad --timeout \"soon\""),
        (&["--out", "/proc/version/results"][..], "cannot write results to /proc/version/results"),
        (
            &["--apps", "sor", "--args", "radix=--keys 5"][..],
            "--args for radix, which is not among the apps to run",
        ),
        (&["--args", "sor=--iterations 2", "--args", "sor=--iterations 3"][..], "--args for sor given twice"),
    ] {
        let out = finished(bench().args(args));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(text(&out).contains(says), "{args:?} should say {says:?}: {}", text(&out));
    }

    let empty = Scratch::new("nobin");
    std::fs::create_dir_all(&empty.0).expect("scratch directory");
    let out = finished(
        bench()
            .args(["--apps", "sor", "--timeout", "60", "--bin"])
            .arg(&empty.0)
            .arg("--out")
            .arg(empty.0.join("out")),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("sor not found"), "{}", text(&out));

    let out = finished(bench().arg("--help"));
    assert!(out.status.success() && text(&out).contains("usage: tmk-bench"), "{}", text(&out));
}

/// Runs sharing an output directory start together: each checks that it can write there with a
/// file of its own, which another's check does not remove under it.
#[test]
fn runs_sharing_an_output_directory_do_not_trip_each_other() {
    let scratch = Scratch::new("shared");
    let (bin, out_dir) = (scratch.0.join("bin"), scratch.0.join("out"));
    std::fs::create_dir_all(&bin).expect("a bin directory");
    for _ in 0..50 {
        let runs: Vec<Bench> = (0..8)
            .map(|_| {
                // No app in `bin`: each run stops once its output directory is checked.
                Bench::start(
                    bench()
                        .args(["--apps", "sor", "--timeout", "60", "--bin"])
                        .arg(&bin)
                        .arg("--out")
                        .arg(&out_dir),
                )
            })
            .collect();
        for run in runs {
            let out = run.finish();
            assert!(out.status.code() == Some(1) && text(&out).contains("sor not found"), "{}", text(&out));
        }
    }
    let left: Vec<_> = std::fs::read_dir(&out_dir).expect("the output directory").collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A fake app: a shell script named `name` in `dir`.
fn fake_app(dir: &Path, name: &str, script: &str) {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).expect("write a fake app");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("make it executable");
}

#[test]
fn runs_that_hang_or_leave_processes_behind_are_killed_whole() {
    let scratch = Scratch::new("fakes");
    let (bin, out_dir, pids) = (scratch.0.join("bin"), scratch.0.join("out"), scratch.0.join("pids"));
    std::fs::create_dir_all(&bin).expect("a bin directory");
    // `is` passes, leaving a process behind that holds nothing; `lu` hangs.
    fake_app(
        &bin,
        "is",
        "sleep 300 >/dev/null 2>&1 &\necho $! >> \"$PIDS\"\n\
         echo \"RESULT app=is mode=$2 nprocs=$4 secs=0.001 detail=\\\"fake\\\"\"\necho PASS",
    );
    fake_app(&bin, "lu", "echo $$ >> \"$PIDS\"\nexec sleep 300");
    let out = finished(
        bench()
            .args(["--apps", "is,lu", "--nodes", "1", "--reps", "1", "--timeout", "4", "--bin"])
            .arg(&bin)
            .arg("--out")
            .arg(&out_dir)
            .env("PIDS", &pids)
            .env("TMK_LOCK_BUNDLE", "3")
            .env("TMK_STATS", "1"),
    );
    let (stdout, all) = (String::from_utf8_lossy(&out.stdout).to_string(), text(&out));
    assert_eq!(out.status.code(), Some(1), "lu failed: {all}");
    // A setting the runs inherit is named: the targets are for the defaults.
    let settings = stdout.lines().find_map(|l| l.strip_prefix("settings from the environment: "));
    assert!(settings.is_some_and(|l| l.split_whitespace().any(|w| w == "TMK_LOCK_BUNDLE=3")), "{all}");
    // Not one the runner overrides: every run had `TMK_STATS=json`.
    assert!(settings.is_some_and(|l| !l.contains("TMK_STATS")), "{all}");
    assert!(all.contains("lu seq n=1: FAILED: no result within 4s; killed"), "{all}");
    assert!(stdout.contains("lu           3 FAILED RUNS"), "{all}");
    // A failed DSM cell shows no statistics, not zeros; the progress stays off the table.
    let row = stdout.lines().find(|l| l.starts_with("lu ")).unwrap_or_else(|| panic!("no lu row: {all}"));
    assert!(row.split_whitespace().skip(2).all(|f| f == "-"), "{row}");
    assert!(!stdout.contains("[1/6]"), "{all}");
    // bench.json keeps each failure's reason.
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("bench.json")).expect("bench.json written"))
            .expect("bench.json is JSON");
    assert_eq!(json["environment"]["TMK_LOCK_BUNDLE"], "3");
    assert_eq!(json["environment"].get("TMK_STATS"), None, "{}", json["environment"]);
    let lu = &json["apps"][1];
    assert_eq!(lu["seq"]["errors"], serde_json::json!(["no result within 4s; killed"]), "{lu}");
    assert_eq!(lu["seq"]["reps"], serde_json::json!([]), "{lu}");
    // Nothing any run started outlives it: 3 stragglers of `is`, 3 hung `lu`s.
    let pids: Vec<i32> = std::fs::read_to_string(&pids)
        .expect("the fakes wrote their pids")
        .lines()
        .map(|l| l.trim().parse().expect("a pid"))
        .collect();
    assert_eq!(pids.len(), 6, "{pids:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&p| running(p)) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<i32> = pids.iter().copied().filter(|&p| running(p)).collect();
    assert!(left.is_empty(), "still running: {left:?}\n{all}");
}

#[test]
fn an_interrupt_stops_the_runner_and_kills_the_run_in_progress() {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    use std::time::{Duration, Instant};
    let scratch = Scratch::new("interrupt");
    let (bin, out_dir, pids) = (scratch.0.join("bin"), scratch.0.join("out"), scratch.0.join("pids"));
    std::fs::create_dir_all(&bin).expect("a bin directory");
    // A run that would take five minutes, with a helper of its own.
    fake_app(
        &bin,
        "lu",
        "sleep 300 >/dev/null 2>&1 &\necho $! >> \"$PIDS\"\necho $$ >> \"$PIDS\"\nexec sleep 300",
    );
    /// The runner, and the fake's processes (by their pids), killed if the test fails early.
    struct Runner(std::process::Child, PathBuf);
    impl Drop for Runner {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
            for pid in std::fs::read_to_string(&self.1).unwrap_or_default().lines() {
                if let Ok(pid) = pid.trim().parse::<i32>() {
                    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                }
            }
        }
    }
    let mut runner = Runner(
        bench()
            .args(["--apps", "lu", "--nodes", "1", "--reps", "1", "--timeout", "60", "--bin"])
            .arg(&bin)
            .arg("--out")
            .arg(&out_dir)
            .env("PIDS", &pids)
            .spawn()
            .expect("tmk-bench starts"),
        pids.clone(),
    );
    let read_pids = || -> Vec<i32> {
        let text = std::fs::read_to_string(&pids).unwrap_or_default();
        text.lines().filter_map(|l| l.trim().parse().ok()).collect()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while read_pids().len() < 2 {
        assert!(Instant::now() < deadline, "the fake app did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(Pid::from_raw(runner.0.id() as i32), Signal::SIGTERM).expect("signal the runner");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = runner.0.try_wait().expect("wait for the runner") {
            break status;
        }
        assert!(Instant::now() < deadline, "the runner did not stop");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut runner.0.stderr.take().expect("stderr"), &mut stderr).expect("read");
    assert_eq!(status.code(), Some(128 + 15), "{stderr}");
    assert!(stderr.contains("tmk-bench: stopped by SIGTERM; the run in progress was killed"), "{stderr}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while read_pids().into_iter().any(running) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<i32> = read_pids().into_iter().filter(|&p| running(p)).collect();
    assert!(left.is_empty(), "still running: {left:?}\n{stderr}");
}

/// A runner killed outright (SIGKILL: no handler runs) takes its run in progress along, though
/// the run leads a process group of its own.
#[test]
fn a_runner_killed_outright_takes_its_run_along() {
    use std::time::Instant;
    let scratch = Scratch::new("killed");
    let (bin, out_dir, pids) = (scratch.0.join("bin"), scratch.0.join("out"), scratch.0.join("pids"));
    std::fs::create_dir_all(&bin).expect("a bin directory");
    fake_app(&bin, "lu", "echo $$ >> \"$PIDS\"\nexec sleep 300");
    let runner = Bench::start(
        bench()
            .args(["--apps", "lu", "--nodes", "1", "--reps", "1", "--timeout", "60", "--bin"])
            .arg(&bin)
            .arg("--out")
            .arg(&out_dir)
            .env("PIDS", &pids),
    );
    let lu = || std::fs::read_to_string(&pids).ok().and_then(|t| t.trim().parse::<i32>().ok());
    let deadline = Instant::now() + Duration::from_secs(30);
    let pid = loop {
        if let Some(pid) = lu() {
            break pid;
        }
        assert!(Instant::now() < deadline, "the fake app did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    let runner_pid = runner.0.as_ref().expect("running").id() as i32;
    kill(Pid::from_raw(runner_pid), Signal::SIGKILL).expect("kill the runner");
    let out = runner.finish();
    assert_eq!(out.status.code(), None, "{}", text(&out));
    let deadline = Instant::now() + Duration::from_secs(10);
    while running(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if running(pid) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        panic!("the run {pid} outlived its runner");
    }
}

/// A RESULT line the runner cannot take (a time that is no time, another mode's run) fails its
/// run with the reason; a run killed at the timeout keeps its last words; and the results are
/// written even when the table cannot be (standard output full).
#[test]
fn results_that_cannot_be_taken_fail_and_the_files_survive_a_lost_terminal() {
    let scratch = Scratch::new("untakeable");
    let (bin, out_dir) = (scratch.0.join("bin"), scratch.0.join("out"));
    std::fs::create_dir_all(&bin).expect("a bin directory");
    fake_app(&bin, "is", "echo \"RESULT app=is mode=$2 nprocs=$4 secs=NaN detail=\\\"fake\\\"\"\necho PASS");
    fake_app(&bin, "lu", "echo \"RESULT app=lu mode=seq nprocs=1 secs=0.01 detail=\\\"fake\\\"\"\necho PASS");
    fake_app(&bin, "fft", "echo 'fft was here' >&2\nexec sleep 300");
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    let out = finished(
        bench()
            .args(["--apps", "is,lu,fft", "--nodes", "1", "--reps", "1", "--timeout", "3", "--bin"])
            .arg(&bin)
            .arg("--out")
            .arg(&out_dir)
            .stdout(full),
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(1), "{all}");
    assert!(!all.contains("panicked"), "{all}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("bench.json")).expect("bench.json written"))
            .expect("bench.json is JSON");
    let errors =
        |app: usize, cell: &str| json["apps"][app][cell]["errors"][0].as_str().unwrap_or("").to_string();
    assert!(errors(0, "seq").contains("secs=NaN, not a positive time"), "{}", json["apps"][0]);
    assert!(errors(1, "seq").is_empty(), "{}", json["apps"][1]);
    let lu_dsm = json["apps"][1]["runs"][0]["dsm"]["errors"][0].as_str().unwrap_or("");
    assert!(lu_dsm.contains("RESULT line of another run than --mode dsm -n 1"), "{}", json["apps"][1]);
    assert!(errors(2, "seq").ends_with("killed (fft was here)"), "{}", json["apps"][2]);
}
