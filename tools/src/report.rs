//! The runner's output: a terminal table, `bench.json` and the charts.

use crate::run::{AppResult, Cell};
use crate::svg;
use std::fmt::Write;
use std::path::Path;

fn secs(c: &Cell) -> String {
    c.secs.map_or("-".into(), |s| format!("{s:.3}"))
}

fn stat(c: &Cell, k: &str) -> f64 {
    c.stats.get(k).copied().unwrap_or(0.0)
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b?)
}

fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2}"))
}

/// Iterations of the run, for per-iteration message counts.
fn iterations(r: &AppResult) -> Option<u64> {
    r.app.iterations.map(|(default, small)| if r.small { small } else { default })
}

/// The readable table.
pub fn table(results: &[AppResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<9} {:>2} {:>8} {:>8} {:>8} {:>7} {:>9} {:>9} {:>11} {:>9} {:>7} {:>8} {:>9} {:>9}",
        "app",
        "n",
        "seq s",
        "thr s",
        "dsm s",
        "speedup",
        "dsm/thr",
        "msgs",
        "bytes",
        "msgs/iter",
        "diffs",
        "faults",
        "lock ms",
        "barr ms"
    );
    for r in results {
        for (&n, dsm) in &r.dsm {
            let thr = &r.threads[&n];
            let msgs = stat(dsm, "msgs_sent");
            let per_iter = iterations(r).map_or("-".into(), |i| format!("{:.0}", msgs / i as f64));
            let _ = writeln!(
                s,
                "{:<9} {:>2} {:>8} {:>8} {:>8} {:>7} {:>9} {:>9.0} {:>11.0} {:>9} {:>7.0} {:>8.0} {:>9.1} {:>9.1}",
                r.app.name,
                n,
                secs(&r.seq),
                secs(thr),
                secs(dsm),
                fmt_ratio(ratio(r.seq.secs, dsm.secs)),
                fmt_ratio(ratio(dsm.secs, thr.secs)),
                msgs,
                stat(dsm, "bytes_sent"),
                per_iter,
                stat(dsm, "diffs_created"),
                stat(dsm, "write_faults") + stat(dsm, "read_misses"),
                stat(dsm, "lock_wait_ms"),
                stat(dsm, "barrier_wait_ms"),
            );
        }
        if r.failures > 0 {
            let _ = writeln!(s, "{:<9}    {} FAILED RUNS", r.app.name, r.failures);
        }
    }
    s
}

fn json(results: &[AppResult]) -> serde_json::Value {
    let cell = |c: &Cell| serde_json::json!({ "secs": c.secs, "stats": c.stats });
    let apps: Vec<serde_json::Value> = results
        .iter()
        .map(|r| {
            let per_n: Vec<serde_json::Value> = r
                .dsm
                .iter()
                .map(|(n, dsm)| {
                    let thr = &r.threads[n];
                    serde_json::json!({
                        "nodes": n,
                        "threads": cell(thr),
                        "dsm": cell(dsm),
                        "speedup": ratio(r.seq.secs, dsm.secs),
                        "dsm_over_threads": ratio(dsm.secs, thr.secs),
                        "msgs_per_iteration": iterations(r).map(|i| stat(dsm, "msgs_sent") / i as f64),
                    })
                })
                .collect();
            serde_json::json!({
                "app": r.app.name,
                "detail": r.detail,
                "small": r.small,
                "seq": cell(&r.seq),
                "runs": per_n,
                "failures": r.failures,
            })
        })
        .collect();
    serde_json::json!({ "apps": apps })
}

/// Writes `bench.json`, `speedup.svg` and `efficiency.svg` into `out`.
pub fn write_files(out: &Path, results: &[AppResult]) -> std::io::Result<()> {
    std::fs::create_dir_all(out)?;
    std::fs::write(out.join("bench.json"), serde_json::to_string_pretty(&json(results))?)?;
    let speedups: Vec<svg::Series> = results
        .iter()
        .map(|r| svg::Series {
            name: r.app.name.to_string(),
            points: r.dsm.iter().filter_map(|(&n, c)| Some((n as f64, ratio(r.seq.secs, c.secs)?))).collect(),
        })
        .collect();
    std::fs::write(
        out.join("speedup.svg"),
        svg::lines("DSM speedup over sequential", "nodes", "speedup", &speedups),
    )?;
    let mut groups: Vec<String> = Vec::new();
    let mut bars: Vec<svg::Series> = Vec::new();
    for r in results {
        groups.push(r.app.name.to_string());
        for (&n, dsm) in &r.dsm {
            let name = format!("n={n}");
            let value = ratio(dsm.secs, r.threads[&n].secs).unwrap_or(0.0);
            match bars.iter_mut().find(|b| b.name == name) {
                Some(b) => b.points.push(((groups.len() - 1) as f64, value)),
                None => bars.push(svg::Series { name, points: vec![((groups.len() - 1) as f64, value)] }),
            }
        }
    }
    std::fs::write(
        out.join("efficiency.svg"),
        svg::bars("DSM time / threads time (lower is better)", &groups, &bars),
    )?;
    Ok(())
}
