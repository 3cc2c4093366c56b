//! `cargo bench -p treadmarks-benches`: the treadmarks core figures in one run.
//!
//! One binary, four roles, told apart by the environment:
//! - `TMK_RANK` set: a node spawned by a launcher; runs the job figures and exits;
//! - `TMK_BENCH_NODES=N`: a re-executed launcher of an N-node job; prints its figures as one
//!   `TMK_BENCH_JSON {...}` line;
//! - otherwise the main launcher: fault costs first (before any `Tmk`: one fault handler per
//!   process), then a 2-node job as node 0, then a 4-node job through a re-executed launcher;
//!   prints the table, the ratios against their targets and one JSON line.
//!
//! Without `--bench` (e.g. under `cargo test --benches`) the iteration counts are a tenth, for a
//! quick smoke run. Timings are reported, never asserted.

#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::{Duration, Instant};
use treadmarks::{Config, Tmk};
use treadmarks_benches::job::{self, JobReport, Params};
use treadmarks_benches::{Result, faults, json, reexec, report};

/// Pages per fault pass, and timed warm passes.
const FAULT_PAGES: usize = 4096;
const FAULT_ROUNDS: usize = 4;
/// Nodes of the informational larger job, and its bound.
const BIG_JOB: u16 = 4;
const BIG_JOB_TIMEOUT: Duration = Duration::from_secs(40);

fn params(nprocs: u16, full: bool) -> Result<Params> {
    let scale = if full { 1 } else { 10 };
    // The larger job shares two cores among more processes: fewer iterations.
    let big = if nprocs > 2 { 2 } else { 1 };
    Ok(Params {
        rounds: 10,
        warmup: 300 / scale,
        raw_rtt: 10_000 / scale / big,
        ping: 10_000 / scale / big,
        lock: 4000 / scale / big,
        barrier: 10_000 / scale / big,
        diff_miss: 4000 / scale / big,
        settled: 1000 / scale / big,
        local_lock: 2000 / scale,
        page_size: faults::page_size()? as u64,
    })
}

/// Starts this node with `config` and returns it with its service thread's polling budget
/// ([`Tmk::service_spin`]).
fn start(config: Config) -> Result<(Tmk, Duration)> {
    let tmk = Tmk::startup_with(config, vec![])?;
    let spin = tmk.service_spin();
    Ok((tmk, spin))
}

/// Runs an `nprocs`-node job with this process as node 0 (the launcher).
fn launch(nprocs: u16, full: bool) -> Result<JobReport> {
    let p = params(nprocs, full)?;
    // The environment's settings, which the launcher passes its nodes.
    let (config, _) = Config::from_env_and_args(vec![])?;
    let (mut tmk, spin) = start(Config { nprocs, ..config })?;
    let report = job::run(&mut tmk, p, spin)?.ok_or("node 0 got no report")?;
    tmk.exit()?;
    Ok(report)
}

/// A node spawned by a launcher: configuration from the environment it was given.
fn node() -> Result<()> {
    let (config, _) = Config::from_env_and_args(vec![])?;
    let (mut tmk, spin) = start(config)?;
    job::run(&mut tmk, Params::default(), spin)?;
    tmk.exit()?;
    Ok(())
}

fn run() -> Result<()> {
    let full = std::env::args().any(|a| a == "--bench");
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if env("TMK_RANK").is_some() {
        return node();
    }
    if let Some(n) = env("TMK_BENCH_NODES") {
        let report = launch(n.parse()?, full)?;
        println!("{} {}", reexec::JSON_TAG, json::object(&report.fields()));
        return Ok(());
    }

    let started = Instant::now();
    let rounds = if full { FAULT_ROUNDS } else { 1 };
    let f = faults::measure(FAULT_PAGES, rounds)?;
    let two = launch(2, full)?;
    let big_env = BIG_JOB.to_string();
    let big = reexec::run_self(&[("TMK_BENCH_NODES", &big_env)], BIG_JOB_TIMEOUT).and_then(|out| {
        let line = reexec::tagged_json(&out).ok_or("the re-executed launcher printed no figures")?;
        json::parse(line).ok_or_else(|| format!("unreadable figures: {line}").into())
    });

    let mode = if full { "" } else { " (quick: run with --bench for the full counts)" };
    println!("\ntreadmarks core benchmarks: {} nodes on 127.0.0.1, means after warm-up{mode}", two.nprocs);
    print!("{}", report::figures_table(&f, &two, (FAULT_PAGES, rounds)));
    let ratios = report::ratios(&f, &two);
    println!();
    print!("{}", report::ratios_table(&ratios));
    // For information: against a raw socket polled as the runtime polls its own.
    let polled = two.ping.time.mean_us / two.raw_rtt_polled.mean_us;
    println!("  {:<24} {polled:>7.2}   (info: no target)", "ping / raw_rtt_polled");
    println!("\nnode 0 messages per operation, sent/received by kind:");
    print!("{}", report::traffic_table(&two));
    println!("\nper-node totals of the {}-node job:", two.nprocs);
    print!("{}", report::nodes_table(&two));

    let mut extra = vec![("ping_over_raw_rtt_polled".to_string(), polled)];
    println!("\n{BIG_JOB} nodes, for information (a separate launcher):");
    match &big {
        Ok(fields) => {
            let get = |k: &str| fields.iter().find(|(n, _)| n == k).map_or(f64::NAN, |(_, v)| *v);
            let ping = get("ping_us");
            println!("  {:<17} {:>10} {:>10}   / ping", "figure", "mean µs", "p50 µs");
            for name in ["ping", "lock", "barrier", "diff_miss", "lock_settled", "diff_miss_settled"] {
                let (mean, p50) = (get(&format!("{name}_us")), get(&format!("{name}_p50_us")));
                println!("  {name:<17} {mean:>10.2} {p50:>10.2}   {:>6.2}", mean / ping);
            }
            extra.extend(fields.iter().filter(|(k, _)| k != "nprocs").map(|(k, v)| (format!("n4_{k}"), *v)));
        }
        Err(e) => println!("  failed: {e}"),
    }
    println!("\n(whole run {:.1} s)", started.elapsed().as_secs_f64());
    println!("{}", json::object(&report::json_fields(&f, &two, &ratios, &extra)));
    big.map(drop)
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("treadmarks-benches: {e}");
            ExitCode::FAILURE
        }
    }
}
