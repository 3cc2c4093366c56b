//! `tmk-bench`: runs the example applications in their three modes at several node counts and
//! reports times, speedups, DSM efficiency and the DSM statistics.
//!
//! ```text
//! tmk-bench [--apps sor,water|all] [--nodes 1,2,4] [--reps 3] [--small] [--args 'APP=FLAGS']...
//!           [--bin DIR] [--out DIR] [--timeout SECS]
//! ```
//!
//! `--args 'radix=--keys 4194304'` runs an app at a size of one's choosing (its flags replace
//! the default size, or the `--small` one, for that app; repeat it for other apps). The targets
//! are for the default sizes, so an app run so gets no verdict.
//!
//! For each app: `seq` once per repetition, then `threads` and `dsm` at every node count
//! (`dsm` with `TMK_STATS=json`: the statistics each node prints at its timer's end,
//! `TMK_TIMED_STATS`, are added up for the table, and those it prints at exit, of the whole job,
//! are kept in `bench.json` beside them), and for radix its
//! hand-written message-passing version (`--mode mp`) too. The median of the repetitions is
//! reported, and the lowest and highest repetition by repetition of the ratio the target is about
//! (`each rep`: DSM over seq at 1 node, DSM over threads at more): the summary names a target
//! whose repetitions fall on both sides of its limit, and the apps that got no verdict because
//! a run failed. Output: a table on the terminal, with the issue's targets checked
//! at the default sizes (DSM within 5% of sequential at 1 node; DSM over threads at 2 nodes at
//! most 1.3 or 2.0, per app) and summed up below it, `bench.json`, and two charts as SVG
//! (`speedup.svg`: speedup over seq against nodes; `efficiency.svg`: DSM time / threads time per
//! app), which need no fonts or libraries to render.
//!
//! No `unsafe`: the hook that has the apps die with the runner is the library's
//! (`run.rs`, `die_with_the_runner`).
#![forbid(unsafe_code)]

mod apps;
mod report;
mod run;
mod svg;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// What the user asked for.
#[derive(Debug)]
pub struct Plan {
    pub apps: Vec<&'static apps::AppSpec>,
    pub nodes: Vec<usize>,
    pub reps: usize,
    pub small: bool,
    /// Flags for the apps run at a size of the user's choosing (`--args APP=FLAGS`).
    pub args: BTreeMap<&'static str, Vec<String>>,
    pub bin: PathBuf,
    pub out: PathBuf,
    /// How long one run may take before its process group is killed (`--timeout SECS`).
    pub timeout: std::time::Duration,
}

const USAGE: &str = "usage: tmk-bench [--apps a,b|all] [--nodes 1,2,4] [--reps N] [--small] \
                     [--args 'APP=FLAGS']... [--bin DIR] [--out DIR] [--timeout SECS]";

fn usage(msg: &str) -> ! {
    eprintln!("tmk-bench: {msg}\n{USAGE}");
    std::process::exit(2);
}

/// The first item of `items` that an earlier one equals.
fn repeated<T: PartialEq>(items: &[T]) -> Option<&T> {
    items.iter().enumerate().find(|(i, x)| items[..*i].contains(x)).map(|(_, x)| x)
}

fn parse() -> Plan {
    let mut plan = Plan {
        apps: apps::ALL.iter().collect(),
        nodes: vec![1, 2, 4],
        reps: 3,
        small: false,
        args: BTreeMap::new(),
        bin: std::env::current_exe().ok().and_then(|p| p.parent().map(PathBuf::from)).unwrap_or_default(),
        out: PathBuf::from("target/tmk-bench"),
        timeout: std::time::Duration::from_secs(600),
    };
    let args: Vec<String> = std::env::args_os()
        .skip(1)
        .map(|a| a.into_string().unwrap_or_else(|bad| usage(&format!("argument {bad:?} is not UTF-8"))))
        .collect();
    let mut args = args.into_iter();
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage(&format!("{a} needs a value")));
        match a.as_str() {
            "--apps" => {
                let v = value();
                if v != "all" {
                    plan.apps = v
                        .split(',')
                        .map(|name| {
                            apps::find(name).unwrap_or_else(|| usage(&format!("unknown app {name:?}")))
                        })
                        .collect();
                    let names: Vec<&str> = plan.apps.iter().map(|a| a.name).collect();
                    if let Some(name) = repeated(&names) {
                        usage(&format!("app {name:?} named twice"))
                    }
                }
            }
            "--nodes" => {
                plan.nodes = value()
                    .split(',')
                    .map(|n| {
                        n.parse()
                            .ok()
                            .filter(|&n| n > 0)
                            .unwrap_or_else(|| usage(&format!("bad node count {n:?}")))
                    })
                    .collect();
                if let Some(n) = repeated(&plan.nodes) {
                    usage(&format!("node count {n} named twice"))
                }
            }
            "--reps" => {
                let v = value();
                plan.reps =
                    v.parse().ok().filter(|&r| r > 0).unwrap_or_else(|| usage(&format!("bad --reps {v:?}")))
            }
            "--timeout" => {
                let v = value();
                let secs: u64 = v
                    .parse()
                    .ok()
                    .filter(|&s| s > 0)
                    .unwrap_or_else(|| usage(&format!("bad --timeout {v:?}")));
                plan.timeout = std::time::Duration::from_secs(secs);
            }
            "--small" => plan.small = true,
            "--args" => {
                let v = value();
                let Some((name, flags)) = v.split_once('=').filter(|(_, f)| !f.trim().is_empty()) else {
                    usage(&format!("--args needs APP=FLAGS, got {v:?}"))
                };
                let app = apps::find(name).unwrap_or_else(|| usage(&format!("unknown app {name:?}")));
                if plan.args.insert(app.name, flags.split_whitespace().map(String::from).collect()).is_some()
                {
                    usage(&format!("--args for {} given twice", app.name))
                }
            }
            "--help" | "-h" => {
                println!("{USAGE}\napps: {}", apps::ALL.iter().map(|a| a.name).collect::<Vec<_>>().join(" "));
                std::process::exit(0);
            }
            "--bin" => plan.bin = PathBuf::from(value()),
            "--out" => plan.out = PathBuf::from(value()),
            other => usage(&format!("unknown argument {other:?}")),
        }
    }
    // Flags for an app that does not run are a mistake (a typo in --apps, say), not a no-op.
    if let Some(name) = plan.args.keys().find(|&&k| !plan.apps.iter().any(|a| a.name == k)) {
        usage(&format!("--args for {name}, which is not among the apps to run"))
    }
    plan
}

fn main() -> ExitCode {
    run::stop_on_signals();
    let plan = parse();
    // Where the results go is checked before anything runs, not after.
    if let Err(e) = std::fs::create_dir_all(&plan.out).and_then(|()| {
        // Named for this process: runs sharing `--out` must not remove each other's.
        let probe = plan.out.join(format!(".tmk-bench-probe-{}", std::process::id()));
        std::fs::write(&probe, b"")?;
        std::fs::remove_file(probe)
    }) {
        usage(&format!("cannot write results to {}: {e}", plan.out.display()))
    }
    let results = match run::run_all(&plan) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tmk-bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    // The files first: a terminal gone (a pager quit during the run) must not lose the results,
    // and the table is written without `print!`, which panics on a closed stdout.
    let written = report::write_files(&plan.out, &results);
    let mut out = std::io::stdout().lock();
    let _ = write!(
        out,
        "{}{}{}{}",
        report::table(&results),
        report::message_passing(&results),
        report::summary(&results),
        report::environment_line()
    );
    if let Err(e) = written {
        eprintln!("tmk-bench: cannot write results to {}: {e}", plan.out.display());
        return ExitCode::FAILURE;
    }
    let _ = writeln!(out, "wrote {}/bench.json, speedup.svg, efficiency.svg", plan.out.display());
    if results.iter().any(|r| r.failures() > 0) { ExitCode::FAILURE } else { ExitCode::SUCCESS }
}
