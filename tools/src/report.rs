//! The runner's output: a terminal table with the targets checked and summed up,
//! `bench.json` and the charts.

use crate::run::{AppResult, Cell, RUN_SETTINGS, Size};
use crate::svg;
use std::fmt::Write;
use std::path::Path;

/// Seconds to the millisecond, or to 10 µs under 0.1 s (small sizes run in microseconds).
fn secs(c: &Cell) -> String {
    c.secs.map_or("-".into(), |s| if s >= 0.1 { format!("{s:.3}") } else { format!("{s:.5}") })
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

/// The median of `xs`: the middle value, or the mean of the two middle ones.
pub fn median(xs: &[f64]) -> Option<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    match v.len() {
        0 => None,
        n if n % 2 == 1 => Some(v[mid]),
        _ => Some((v[mid - 1] + v[mid]) / 2.0),
    }
}

/// The ratios `a / b` of each repetition, in order: the modes of a repetition run one after
/// another, so a slow minute of the machine hits both times of a pair. None unless both cells
/// passed every one of two or more repetitions (a failed one would shift the pairs).
fn paired_ratios(a: &Cell, b: &Cell) -> Option<Vec<f64>> {
    if a.reps.len() < 2 || a.reps.len() != b.reps.len() || !a.errors.is_empty() || !b.errors.is_empty() {
        return None;
    }
    Some(a.reps.iter().zip(&b.reps).map(|(x, y)| x / y).collect())
}

/// The lowest and highest of [`paired_ratios`].
fn ratio_range(a: &Cell, b: &Cell) -> Option<(f64, f64)> {
    paired_ratios(a, b).as_deref().map(lowest_highest)
}

fn lowest_highest(xs: &[f64]) -> (f64, f64) {
    xs.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &r| (lo.min(r), hi.max(r)))
}

fn fmt_range(r: Option<(f64, f64)>) -> String {
    r.map_or("-".into(), |(lo, hi)| format!("{lo:.2}-{hi:.2}"))
}

/// Most DSM time over sequential time at one node: nobody to share with should cost nothing.
pub const ONE_NODE_LIMIT: f64 = 1.05;

/// One of the targets for a cell, with the ratio measured against it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    /// What the DSM time is divided by: `"seq"` (one node) or `"threads"` (two nodes).
    pub over: &'static str,
    pub limit: f64,
    /// The ratio of the median times.
    pub ratio: f64,
    /// The median of the repetitions' ratios ([`paired_ratios`]), which the verdict is on when
    /// there are two repetitions or more: a pair shares the machine's minute, and a slow minute
    /// of one mode's run moves the ratio of medians (threads 0.036, 0.037, 0.060 s against DSM
    /// 0.080, 0.070, 0.115 s: ratios 2.22, 1.89, 1.92, median 1.92, but medians' 2.16).
    pub paired: Option<f64>,
    /// The lowest and highest ratio of one repetition's times ([`ratio_range`]).
    pub range: Option<(f64, f64)>,
}

impl Target {
    /// The ratio the verdict is on: the paired median, else (one repetition) the medians'.
    pub fn judged(&self) -> f64 {
        self.paired.unwrap_or(self.ratio)
    }

    /// The judged ratio is within the limit.
    pub fn met(&self) -> bool {
        self.judged() <= self.limit
    }

    /// Met, though some repetition's ratio was over the limit, or missed, though some was within.
    pub fn split(&self) -> bool {
        self.range.is_some_and(|(lo, hi)| if self.met() { hi > self.limit } else { lo <= self.limit })
    }
}

/// What the DSM time at `n` nodes is set against, and its name: the sequential time at one node
/// (nobody to share with should cost nothing), the threads time at the same N otherwise.
fn base(r: &AppResult, n: usize) -> Option<(&'static str, &Cell)> {
    if n == 1 { Some(("seq", &r.seq)) } else { Some(("threads", r.threads.get(&n)?)) }
}

/// The target for `r` at `n` nodes and how it fared: DSM time over sequential time at one
/// node, over threads time at two. None at other node counts, for runs at other sizes than the
/// default (small or the user's: the targets are for the default sizes), or without both times
/// (failed runs).
pub fn target(r: &AppResult, n: usize) -> Option<Target> {
    if r.size != Size::Default {
        return None;
    }
    let dsm = r.dsm.get(&n)?;
    let limit = match n {
        1 => ONE_NODE_LIMIT,
        2 => r.app.target,
        _ => return None,
    };
    let (over, base) = base(r, n)?;
    // A cell with failed runs has a median of the others only: no verdict on it.
    if !dsm.errors.is_empty() || !base.errors.is_empty() {
        return None;
    }
    let pairs = paired_ratios(dsm, base);
    Some(Target {
        over,
        limit,
        ratio: ratio(dsm.secs, base.secs)?,
        paired: pairs.as_deref().and_then(median),
        range: pairs.as_deref().map(lowest_highest),
    })
}

fn fmt_target(t: Option<Target>) -> String {
    t.map_or("-".into(), |t| format!("<={:.2} {}", t.limit, if t.met() { "met" } else { "MISS" }))
}

/// The ratio a target judges, to three places near its limit (1.3004 is not "1.30 MISS").
fn fmt_judged(t: Option<Target>) -> String {
    t.map_or("-".into(), |t| {
        let j = t.judged();
        if (j - t.limit).abs() < 0.01 { format!("{j:.3}") } else { format!("{j:.2}") }
    })
}

/// Iterations of the run, for per-iteration message counts (unknown at the user's sizes).
fn iterations(r: &AppResult) -> Option<u64> {
    let (default, small) = r.app.iterations?;
    match r.size {
        Size::Default => Some(default),
        Size::Small => Some(small),
        Size::Custom(_) => None,
    }
}

/// The readable table.
pub fn table(results: &[AppResult]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<9} {:>2} {:>8} {:>8} {:>8} {:>7} {:>9} {:>11} {:>7} {:>11} {:>9} {:>11} {:>9} {:>7} {:>8} {:>9} {:>9}",
        "app",
        "n",
        "seq s",
        "thr s",
        "dsm s",
        "speedup",
        "dsm/thr",
        "each rep",
        "judged",
        "target",
        "msgs",
        "bytes",
        "msgs/iter",
        "diffs",
        "faults",
        "lock ms",
        "barr ms"
    );
    let mut ranges = false;
    for r in results {
        for (&n, dsm) in &r.dsm {
            let thr = &r.threads[&n];
            // The spread of the ratio the target is about (DSM/seq at one node).
            let range = base(r, n).and_then(|(_, base)| ratio_range(dsm, base));
            let verdict = target(r, n);
            ranges |= range.is_some();
            let msgs = stat(dsm, "msgs_sent");
            // A cell with no good run has no statistics: "-", not zeros.
            let num = |v: f64, digits: usize| dsm.secs.map_or("-".into(), |_| format!("{v:.digits$}"));
            let per_iter = match (dsm.secs, iterations(r)) {
                (Some(_), Some(i)) => format!("{:.0}", msgs / i as f64),
                _ => "-".into(),
            };
            let _ = writeln!(
                s,
                "{:<9} {:>2} {:>8} {:>8} {:>8} {:>7} {:>9} {:>11} {:>7} {:>11} {:>9} {:>11} {:>9} {:>7} {:>8} {:>9} {:>9}",
                r.app.name,
                n,
                secs(&r.seq),
                secs(thr),
                secs(dsm),
                fmt_ratio(ratio(r.seq.secs, dsm.secs)),
                fmt_ratio(ratio(dsm.secs, thr.secs)),
                fmt_range(range),
                fmt_judged(verdict),
                fmt_target(verdict),
                num(msgs, 0),
                num(stat(dsm, "bytes_sent"), 0),
                per_iter,
                num(stat(dsm, "diffs_created"), 0),
                num(stat(dsm, "write_faults") + stat(dsm, "read_misses"), 0),
                num(stat(dsm, "lock_wait_ms"), 1),
                num(stat(dsm, "barrier_wait_ms"), 1),
            );
        }
        if r.failures() > 0 {
            let _ = writeln!(s, "{:<9}    {} FAILED RUNS", r.app.name, r.failures());
        }
    }
    if ranges {
        let _ = writeln!(
            s,
            "each rep: the lowest-highest of DSM/seq at 1 node and DSM/threads at more, repetition by \
             repetition (the ratio the target is about); judged: their median, the target's verdict"
        );
    }
    for r in results {
        if let Size::Custom(flags) = &r.size {
            let _ = writeln!(
                s,
                "{} ran with `{}` ({}): no target verdicts away from the default size",
                r.app.name,
                flags.join(" "),
                r.detail
            );
        }
    }
    s
}

/// For the apps with a hand-written message-passing version, one line per node count: its time,
/// and its time and the DSM's over the threads version's. Empty if none ran.
pub fn message_passing(results: &[AppResult]) -> String {
    let mut s = String::new();
    for r in results {
        for (&n, mp) in &r.mp {
            let (thr, dsm) = (r.threads.get(&n).and_then(|c| c.secs), r.dsm.get(&n).and_then(|c| c.secs));
            let _ = writeln!(
                s,
                "message passing ({} --mode mp), n={n}: {} s; mp/thr {}, dsm/thr {}, dsm/mp {}",
                r.app.name,
                secs(mp),
                fmt_ratio(ratio(mp.secs, thr)),
                fmt_ratio(ratio(dsm, thr)),
                fmt_ratio(ratio(dsm, mp.secs)),
            );
        }
    }
    s
}

/// One line per node count with targets: how many were met, and the ratios of those missed.
/// Empty when no cell has a target (small runs, other node counts).
pub fn summary(results: &[AppResult]) -> String {
    let mut s = String::new();
    for (n, what) in [(1, "DSM/seq"), (2, "DSM/threads")] {
        let targets: Vec<(&str, Target)> =
            results.iter().filter_map(|r| Some((r.app.name, target(r, n)?))).collect();
        // Apps at their default size that ran at n nodes with no verdict: some run failed.
        let unjudged: Vec<&str> = (results.iter())
            .filter(|r| r.size == Size::Default && r.dsm.contains_key(&n) && target(r, n).is_none())
            .map(|r| r.app.name)
            .collect();
        if targets.is_empty() && unjudged.is_empty() {
            continue;
        }
        let missed: Vec<String> = targets
            .iter()
            .filter(|(_, t)| !t.met())
            .map(|(app, t)| format!("{app} {} (<= {:.2})", fmt_judged(Some(*t)), t.limit))
            .collect();
        // Verdicts the repetitions disagree with: the machine's spread is as wide as the margin.
        let split: Vec<String> = (targets.iter())
            .filter(|(_, t)| t.split())
            .map(|(app, t)| format!("{app} {}", fmt_range(t.range)))
            .collect();
        let met = targets.len() - missed.len();
        let _ = write!(
            s,
            "targets at {n} node{}, {what}: {met} of {} met",
            if n == 1 { "" } else { "s" },
            targets.len()
        );
        if !unjudged.is_empty() {
            let _ =
                write!(s, "; {} without a verdict (failed runs): {}", unjudged.len(), unjudged.join(", "));
        }
        if !missed.is_empty() {
            let _ = write!(s, "; missed: {}", missed.join(", "));
        }
        if !split.is_empty() {
            let _ = write!(s, "; repetitions on both sides of the limit: {}", split.join(", "));
        }
        s.push('\n');
    }
    // A job whose CPUs another job held runs unpinned: its times are not comparable.
    let unpinned: Vec<String> = (results.iter())
        .flat_map(|r| r.dsm.iter().map(move |(&n, c)| (r.app.name, n, c)))
        .filter(|&(_, n, c)| {
            let pinned = c.least_pinned.or_else(|| c.stats.get("pinned").copied());
            c.secs.is_some() && n > 1 && pinned.is_some_and(|p| p < n as f64)
        })
        .map(|(app, n, _)| format!("{app} n={n}"))
        .collect();
    if !unpinned.is_empty() {
        let _ =
            writeln!(s, "ran unpinned (another job held the CPUs; not comparable): {}", unpinned.join(", "));
    }
    s
}

/// The `TMK_*` settings the runs inherited from this process's environment (they reach every
/// app), sorted: the targets are for the defaults.
pub fn environment() -> Vec<(String, String)> {
    inherited(std::env::vars())
}

/// The `TMK_*` settings of `vars` that reach the runs, sorted: not those every run is started
/// with ([`RUN_SETTINGS`]), which the runs never had.
fn inherited(vars: impl IntoIterator<Item = (String, String)>) -> Vec<(String, String)> {
    let overridden = |k: &str| RUN_SETTINGS.iter().any(|&(name, _)| name == k);
    let mut vars: Vec<(String, String)> =
        vars.into_iter().filter(|(k, _)| k.starts_with("TMK_") && !overridden(k)).collect();
    vars.sort();
    vars
}

/// A line naming [`environment`]'s settings, or nothing when there are none.
pub fn environment_line() -> String {
    let vars = environment();
    if vars.is_empty() {
        return String::new();
    }
    let list: Vec<String> = vars.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("settings from the environment: {} (the targets are for the defaults)\n", list.join(" "))
}

fn json(results: &[AppResult]) -> serde_json::Value {
    let cell = |c: &Cell| serde_json::json!({ "secs": c.secs, "reps": c.reps, "errors": c.errors, "stats": c.stats, "job_stats": c.job_stats });
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
                        "dsm_over_threads_range": ratio_range(dsm, thr).map(|(lo, hi)| [lo, hi]),
                        "target": target(r, *n).map(|t| serde_json::json!({
                            "dsm_over": t.over,
                            "limit": t.limit,
                            "ratio": t.ratio,
                            "paired_median": t.paired,
                            "range": t.range.map(|(lo, hi)| [lo, hi]),
                            "met": t.met(),
                        })),
                        "msgs_per_iteration": iterations(r)
                            .filter(|_| dsm.secs.is_some())
                            .map(|i| stat(dsm, "msgs_sent") / i as f64),
                        "mp": r.mp.get(n).map(cell),
                        "dsm_over_mp": r.mp.get(n).and_then(|mp| ratio(dsm.secs, mp.secs)),
                    })
                })
                .collect();
            serde_json::json!({
                "app": r.app.name,
                "detail": r.detail,
                "size": r.size.name(),
                "args": match &r.size {
                    Size::Custom(flags) => flags.as_slice(),
                    _ => &[],
                },
                "seq": cell(&r.seq),
                "runs": per_n,
                "failures": r.failures(),
            })
        })
        .collect();
    let environment: serde_json::Map<String, serde_json::Value> =
        environment().into_iter().map(|(k, v)| (k, serde_json::Value::String(v))).collect();
    serde_json::json!({ "apps": apps, "environment": environment })
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
            // A cell that failed has no bar (a zero would read as no overhead at all).
            let Some(value) = ratio(dsm.secs, r.threads[&n].secs) else { continue };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps;
    use std::collections::BTreeMap;

    fn cell(secs: f64) -> Cell {
        Cell { secs: Some(secs), reps: vec![secs], ..Cell::default() }
    }

    /// `app` at size `size`: sequential time `seq`, and `(nodes, threads time, DSM time)` per
    /// node count.
    fn result(app: &str, size: Size, seq: f64, runs: &[(usize, f64, f64)]) -> AppResult {
        AppResult {
            app: apps::find(app).expect("a known app"),
            size,
            seq: cell(seq),
            threads: runs.iter().map(|&(n, t, _)| (n, cell(t))).collect(),
            dsm: runs.iter().map(|&(n, _, d)| (n, cell(d))).collect(),
            mp: BTreeMap::new(),
            detail: String::new(),
        }
    }

    #[test]
    fn targets_are_dsm_over_seq_at_one_node_and_over_threads_at_two() {
        let r = result("water", Size::Default, 1.0, &[(1, 1.0, 1.04), (2, 0.5, 0.7), (4, 0.3, 0.9)]);
        let one = target(&r, 1).expect("a target at 1 node");
        assert_eq!((one.over, one.limit), ("seq", ONE_NODE_LIMIT));
        assert!((one.ratio - 1.04).abs() < 1e-9 && one.met());
        let two = target(&r, 2).expect("a target at 2 nodes");
        assert_eq!((two.over, two.limit), ("threads", 1.3));
        assert!((two.ratio - 1.4).abs() < 1e-9 && !two.met());
        assert_eq!(target(&r, 4), None, "no target at 4 nodes");
        let radix = result("radix", Size::Default, 1.0, &[(2, 0.5, 0.99)]);
        assert!(target(&radix, 2).expect("a target").met(), "radix's target is 2.0");
    }

    #[test]
    fn small_runs_and_failed_cells_have_no_target() {
        let small = result("sor", Size::Small, 1.0, &[(1, 1.0, 1.0), (2, 0.5, 0.6)]);
        assert_eq!((target(&small, 1), target(&small, 2)), (None, None));
        let mut failed = result("sor", Size::Default, 1.0, &[(1, 1.0, 1.0), (2, 0.5, 0.6)]);
        failed.dsm.insert(2, Cell::default());
        assert_eq!(target(&failed, 2), None);
        assert!(summary(&[small]).is_empty());
    }

    #[test]
    fn runs_at_the_users_sizes_are_named_and_get_no_verdict() {
        let flags = vec!["--keys".to_string(), "4194304".to_string()];
        let mut radix = result("radix", Size::Custom(flags), 1.0, &[(1, 1.0, 1.0), (2, 0.5, 1.2)]);
        radix.detail = "4194304 keys, radix 2^8, 4 passes".into();
        let sor = result("sor", Size::Custom(vec!["--iterations".into(), "5".into()]), 1.0, &[(2, 0.5, 0.6)]);
        assert_eq!((target(&radix, 1), target(&radix, 2), target(&sor, 2)), (None, None, None));
        assert_eq!(iterations(&sor), None, "the user's flags may change the iterations");
        let results = [radix, sor];
        let t = table(&results);
        assert!(
            t.contains(
                "radix ran with `--keys 4194304` (4194304 keys, radix 2^8, 4 passes): no target \
                 verdicts away from the default size\n"
            ),
            "{t}"
        );
        assert!(summary(&results).is_empty());
        let j = json(&results);
        assert_eq!((&j["apps"][0]["size"], &j["apps"][0]["args"][1]), (&"custom".into(), &"4194304".into()));
        assert_eq!(j["apps"][1]["runs"][0]["msgs_per_iteration"], serde_json::Value::Null);
    }

    #[test]
    fn the_table_marks_each_target_and_the_summary_names_the_misses() {
        let results = [
            result("sor", Size::Default, 1.0, &[(1, 1.0, 1.01), (2, 0.5, 0.6)]),
            result("water", Size::Default, 1.0, &[(1, 1.0, 1.2), (2, 0.5, 0.75)]),
        ];
        let t = table(&results);
        let row = |app: &str, n: &str| {
            t.lines()
                .find(|l| l.split_whitespace().take(2).eq([app, n]))
                .unwrap_or_else(|| panic!("no row for {app} at {n} in\n{t}"))
                .to_string()
        };
        assert!(row("sor", "1").contains("<=1.05 met"), "{t}");
        assert!(row("sor", "2").contains("<=1.30 met"), "{t}");
        assert!(row("water", "1").contains("<=1.05 MISS"), "{t}");
        assert!(row("water", "2").contains("<=1.30 MISS"), "{t}");
        let s = summary(&results);
        assert_eq!(
            s,
            "targets at 1 node, DSM/seq: 1 of 2 met; missed: water 1.20 (<= 1.05)\n\
             targets at 2 nodes, DSM/threads: 1 of 2 met; missed: water 1.50 (<= 1.30)\n"
        );
        let j = json(&results);
        let water_two = &j["apps"][1]["runs"][1]["target"];
        assert_eq!(water_two["dsm_over"], "threads");
        assert_eq!(water_two["met"], false);
        assert!(message_passing(&results).is_empty(), "no app ran a message-passing version");

        // A run whose nodes were not all pinned is named below the verdicts.
        let mut results = results;
        results[0].dsm.get_mut(&2).expect("sor at 2").stats.insert("pinned".into(), 1.0);
        results[1].dsm.get_mut(&2).expect("water at 2").stats.insert("pinned".into(), 2.0);
        assert!(
            summary(&results)
                .ends_with("ran unpinned (another job held the CPUs; not comparable): sor n=2\n")
        );
        // So is one whose median run was pinned but another repetition was not.
        results[1].dsm.get_mut(&2).expect("water at 2").least_pinned = Some(1.0);
        assert!(
            summary(&results).ends_with("not comparable): sor n=2, water n=2\n"),
            "{}",
            summary(&results)
        );
    }

    /// A cell of repetitions `reps`, its time their median.
    fn cell_of(reps: &[f64]) -> Cell {
        Cell { secs: median(reps), reps: reps.to_vec(), ..Cell::default() }
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[0.6, 0.4]), Some(0.5));
    }

    /// A cell with a failed repetition has the median of the others only: no verdict.
    #[test]
    fn no_verdict_on_a_cell_with_failed_runs() {
        let mut r = result("sor", Size::Default, 1.0, &[(2, 0.5, 0.6)]);
        assert!(target(&r, 2).is_some());
        r.dsm.get_mut(&2).expect("sor at 2").errors.push("node 1 exited".into());
        assert_eq!(target(&r, 2), None);
    }

    #[test]
    fn each_repetitions_ratio_is_paired_and_their_spread_shown() {
        let mut r = result("sor", Size::Default, 1.0, &[(2, 0.5, 0.6)]);
        r.threads.insert(2, cell_of(&[0.50, 0.40, 0.52]));
        r.dsm.insert(2, cell_of(&[0.60, 0.58, 0.62]));
        // Repetition by repetition 1.20, 1.45 and 1.19; the medians' 0.60 / 0.50 = 1.20 meets
        // the target, one repetition does not.
        let t = target(&r, 2).expect("a target");
        let (lo, hi) = t.range.expect("a range");
        assert!((lo - 0.62 / 0.52).abs() < 1e-9 && (hi - 0.58 / 0.40).abs() < 1e-9, "{lo} {hi}");
        assert!(t.met() && t.split());
        let results = [r];
        assert!(table(&results).lines().any(|l| l.starts_with("sor") && l.contains(" 1.19-1.45 ")));
        assert_eq!(
            summary(&results),
            "targets at 2 nodes, DSM/threads: 1 of 1 met; repetitions on both sides of the limit: sor \
             1.19-1.45\n"
        );
        let j = json(&results);
        assert_eq!(j["apps"][0]["runs"][0]["target"]["range"][1], 0.58 / 0.40);
        // A failed repetition would pair the others wrongly, and leaves a median of the rest:
        // no verdict at all (`no_verdict_on_a_cell_with_failed_runs`).
    }

    /// The verdict is on the median of the repetitions' paired ratios, not on the ratio of the
    /// medians, where the two disagree (a slow minute of one mode's run).
    #[test]
    fn the_verdict_is_on_the_paired_median() {
        let mut r = result("radix", Size::Default, 1.0, &[(2, 0.5, 0.6)]);
        r.threads.insert(2, cell_of(&[0.036, 0.037, 0.060]));
        r.dsm.insert(2, cell_of(&[0.080, 0.070, 0.115]));
        let t = target(&r, 2).expect("a target");
        assert!((t.ratio - 0.080 / 0.037).abs() < 1e-9, "{t:?}");
        assert!((t.judged() - 0.115 / 0.060).abs() < 1e-9, "{t:?}");
        assert!(t.met() && t.split(), "{t:?}");
        // And the other way: medians' 1.90 meets 2.0, the pairs' 2.07 does not.
        r.threads.insert(2, cell_of(&[0.040, 0.050, 0.060]));
        r.dsm.insert(2, cell_of(&[0.095, 0.095, 0.124]));
        let t = target(&r, 2).expect("a target");
        assert!(t.ratio < 2.0 && !t.met(), "{t:?}");
        let results = [r];
        let row = table(&results).lines().find(|l| l.starts_with("radix ")).expect("a row").to_string();
        assert!(row.contains(" 2.07 ") && row.contains("<=2.00 MISS"), "{row}");
        assert!(
            summary(&results).starts_with("targets at 2 nodes, DSM/threads: 0 of 1 met; missed: radix 2.07")
        );
        assert_eq!(json(&results)["apps"][0]["runs"][0]["target"]["paired_median"], 0.124 / 0.060);
    }

    /// Near the limit the judged ratio has three places: 1.3004 is not shown as 1.30 and missed.
    #[test]
    fn a_ratio_near_its_limit_shows_three_places() {
        let mut r = result("sor", Size::Default, 1.0, &[(2, 0.5, 0.6)]);
        r.threads.insert(2, cell_of(&[1.0]));
        r.dsm.insert(2, cell_of(&[1.3004]));
        let results = [r];
        let row = table(&results).lines().find(|l| l.starts_with("sor ")).expect("a row").to_string();
        assert!(row.contains(" 1.300 ") && row.contains("MISS"), "{row}");
    }

    /// At one node the verdict is on DSM over sequential time: the row's `each rep` is that
    /// ratio's spread, so that the verdict can be checked from the row.
    #[test]
    fn at_one_node_each_rep_is_the_spread_of_dsm_over_seq() {
        let mut r = result("sor", Size::Default, 1.0, &[(1, 1.0, 1.0)]);
        r.seq = cell_of(&[1.00, 0.90, 1.00]);
        r.threads.insert(1, cell_of(&[1.00, 1.00, 1.00]));
        r.dsm.insert(1, cell_of(&[1.01, 1.00, 1.02]));
        // DSM/seq repetition by repetition 1.01, 1.11 and 1.02; DSM/threads 1.00-1.02.
        let t = target(&r, 1).expect("a target");
        assert!(t.met() && t.split(), "{t:?}");
        let results = [r];
        let table = table(&results);
        let row = table.lines().find(|l| l.starts_with("sor ")).expect("a row");
        assert!(row.contains(" 1.01-1.11 ") && !row.contains("1.00-1.02"), "{table}");
        assert!(table.contains("each rep: the lowest-highest"), "{table}");
        assert!(summary(&results).ends_with("repetitions on both sides of the limit: sor 1.01-1.11\n"));
    }

    /// A default-size app whose runs failed has no verdict, and the summary names it.
    #[test]
    fn the_summary_names_the_apps_without_a_verdict() {
        let mut failed = result("sor", Size::Default, 1.0, &[(1, 1.0, 1.0), (2, 0.5, 0.6)]);
        let killed = vec!["no result within 600s; killed".to_string()];
        failed.dsm.insert(2, Cell { errors: killed, ..Cell::default() });
        let results = [
            failed,
            result("water", Size::Default, 1.0, &[(1, 1.0, 1.0), (2, 0.5, 0.6)]),
            result("is", Size::Small, 1.0, &[(1, 1.0, 1.0), (2, 0.5, 0.6)]),
        ];
        assert_eq!(
            summary(&results),
            "targets at 1 node, DSM/seq: 2 of 2 met\n\
             targets at 2 nodes, DSM/threads: 1 of 1 met; 1 without a verdict (failed runs): sor\n"
        );
        // A cell with no good run has no messages per iteration, as in the table: not zero.
        let j = json(&results);
        assert_eq!(j["apps"][0]["runs"][1]["msgs_per_iteration"], serde_json::Value::Null);
        assert_eq!(j["apps"][1]["runs"][1]["msgs_per_iteration"], 0.0);
    }

    #[test]
    fn message_passing_runs_are_set_beside_threads_and_dsm() {
        let mut radix = result("radix", Size::Default, 1.0, &[(2, 0.5, 1.2)]);
        radix.mp.insert(2, cell(0.8));
        assert_eq!(
            message_passing(std::slice::from_ref(&radix)),
            "message passing (radix --mode mp), n=2: 0.800 s; mp/thr 1.60, dsm/thr 2.40, dsm/mp 1.50\n"
        );
        let j = json(&[radix]);
        assert_eq!(j["apps"][0]["runs"][0]["mp"]["secs"], 0.8);
        let dsm_over_mp = j["apps"][0]["runs"][0]["dsm_over_mp"].as_f64().expect("a ratio");
        assert!((dsm_over_mp - 1.5).abs() < 1e-9, "{dsm_over_mp}");
    }

    /// A setting every run is started with is not one the runs inherited: `TMK_STATS=1` in the
    /// runner's environment was named under the table although every app ran with `json`.
    #[test]
    fn settings_the_runner_overrides_are_not_named_as_inherited() {
        let vars = [("TMK_STATS", "1"), ("PATH", "/bin"), ("TMK_PUSH", "0"), ("TMK_LOCK_BUNDLE", "3")];
        let got = inherited(vars.map(|(k, v)| (k.to_string(), v.to_string())));
        let want = [("TMK_LOCK_BUNDLE", "3"), ("TMK_PUSH", "0")].map(|(k, v)| (k.to_string(), v.to_string()));
        assert_eq!(got, want);
    }
}
