//! The human-readable table, the ratios against their targets, and the JSON fields.

use crate::faults::FaultCosts;
use crate::job::{Figure, JobReport};
use crate::summary::Summary;

/// A ratio of two figures with its target (met when `value <= target`).
#[derive(Clone, Copy, Debug)]
pub struct Ratio {
    pub name: &'static str,
    pub key: &'static str,
    pub value: f64,
    pub target: f64,
}

impl Ratio {
    fn new(name: &'static str, key: &'static str, num: f64, den: f64, target: f64) -> Ratio {
        Ratio { name, key, value: num / den, target }
    }

    /// `Some(true)` when met, `None` when a figure is missing.
    pub fn met(&self) -> Option<bool> {
        self.value.is_finite().then_some(self.value <= self.target)
    }
}

/// The target ratios.
pub fn ratios(f: &FaultCosts, r: &JobReport) -> Vec<Ratio> {
    let ping = r.ping.time.mean_us;
    vec![
        Ratio::new("ping / raw_rtt", "ping_over_raw_rtt", ping, r.raw_rtt.mean_us, 2.0),
        Ratio::new("lock / ping", "lock_over_ping", r.lock.time.mean_us, ping, 1.5),
        Ratio::new("barrier / ping", "barrier_over_ping", r.barrier.time.mean_us, ping, 1.5),
        Ratio::new("diff_miss / ping", "diff_miss_over_ping", r.diff_miss.time.mean_us, ping, 2.0),
        Ratio::new("twin_fault / bare_fault", "twin_over_bare_fault", f.twin.mean_us, f.bare.mean_us, 1.5),
    ]
}

fn num(v: f64, width: usize) -> String {
    if v.is_finite() { format!("{v:>width$.2}") } else { format!("{:>width$}", "-") }
}

/// One figure; `iters` defaults to the number of samples.
fn row(name: &str, iters: &str, s: &Summary, note: &str) -> String {
    let n = s.n.to_string();
    let iters = if iters.is_empty() { &n } else { iters };
    format!("  {name:<17} {iters:>10} {} {}   {note}", num(s.mean_us, 10), num(s.p50_us, 10))
}

/// The figures table.
pub fn figures_table(f: &FaultCosts, r: &JobReport, fault_iters: (usize, usize)) -> String {
    let (pages, rounds) = fault_iters;
    let mut out = String::new();
    let mut line = |s: String| {
        out.push_str(&s);
        out.push('\n');
    };
    line(format!("  {:<17} {:>10} {:>10} {:>10}", "figure", "iterations", "mean µs", "p50 µs"));
    let faults = format!("{rounds}x{pages}");
    line(row("bare_fault", &faults, &f.bare, "write fault, handler only mprotects (library probe)"));
    line(row("twin_fault", &faults, &f.twin, "fast path: twin copy + mprotect in the handler"));
    line(row(
        "twin_fault_cold",
        &pages.to_string(),
        &f.twin_cold,
        "first pass: never-written pages, zero twins (no copy)",
    ));
    let n = r.nprocs;
    line(row("raw_rtt", "", &r.raw_rtt, "64 B write + read, blocking TCP, node 0 <-> 1"));
    let budget = r.poll_budget.as_micros();
    line(row(
        "raw_rtt_polled",
        "",
        &r.raw_rtt_polled,
        &format!("info: the same, both ends polling (node 1 {budget} µs, then blocking)"),
    ));
    line(row("ping", "", &r.ping.time, "tmk.ping(1)"));
    line(row("lock", "", &r.lock.time, "lock_acquire(1), token at node 1 (manager)"));
    line(row("barrier", "", &r.barrier.time, &format!("barrier(0), {n} nodes")));
    line(row("diff_miss", "", &r.diff_miss.time, "first read of a page: fault, 1 diff"));
    let settle = format!("{} µs", crate::job::SETTLE.as_micros());
    line(row("lock_settled", "", &r.lock_settled.time, &format!("info: lock, node 0 idles {settle} first")));
    line(row(
        "diff_miss_settled",
        "",
        &r.diff_miss_settled.time,
        &format!("info: diff_miss, node 0 idles {settle} first"),
    ));
    let batch = crate::job::LOCAL_BATCH;
    line(row(
        "local_lock",
        "",
        &r.local_lock,
        &format!("info: lock_acquire(0) + release, token here, per pair (batches of {batch})"),
    ));
    out
}

/// The ratios against their targets.
pub fn ratios_table(ratios: &[Ratio]) -> String {
    let mut out = format!("  {:<24} {:>7} {:>9}   (of means)\n", "ratio", "value", "target");
    for r in ratios {
        let verdict = match r.met() {
            Some(true) => "met",
            Some(false) => "MISSED",
            None => "n/a",
        };
        out.push_str(&format!(
            "  {:<24} {} {:>9}   {verdict}\n",
            r.name,
            num(r.value, 7),
            format!("<= {:.1}", r.target)
        ));
    }
    out
}

fn per_op_line(name: &str, fig: &Figure, what: &str) -> String {
    let kinds: Vec<String> = fig
        .per_op
        .msgs
        .iter()
        .filter(|k| k.sent + k.received >= 0.005)
        .map(|k| format!("{} {:.2}/{:.2}", k.kind.name(), k.sent, k.received))
        .collect();
    format!("  {name:<10} {:>5.2} msgs: {}   [{what}]\n", fig.per_op.total_msgs(), kinds.join(", "))
}

/// Node 0's messages per operation by kind (sent/received), and protocol counters per operation.
pub fn traffic_table(r: &JobReport) -> String {
    let mut out = String::new();
    out += &per_op_line("ping", &r.ping, "one ping");
    let l = &r.lock.per_op;
    out += &per_op_line(
        "lock",
        &r.lock,
        &format!(
            "per iteration: node 1's acquire + node 0's timed acquire + 2 barriers; \
             node 0 remote acquires {:.2}",
            l.lock_acquires_remote
        ),
    );
    out += &per_op_line("barrier", &r.barrier, "one barrier");
    let d = &r.diff_miss.per_op;
    out += &per_op_line(
        "diff_miss",
        &r.diff_miss,
        &format!(
            "per iteration: 1 miss + 2 barriers; node 0 read misses {:.2}, diffs applied {:.2}",
            d.read_misses, d.diffs_applied
        ),
    );
    out
}

/// Each node's totals (read back through the shared heap at the end of the job).
pub fn nodes_table(r: &JobReport) -> String {
    let mut out = format!(
        "  {:<6} {:>10} {:>10} {:>10} {:>10} {:>12} {:>10} {:>11} {:>8}\n",
        "node",
        "sent",
        "sent KiB",
        "received",
        "recv KiB",
        "fast faults",
        "hand-offs",
        "read misses",
        "diffs in"
    );
    for n in &r.nodes {
        out.push_str(&format!(
            "  {:<6} {:>10} {:>10.1} {:>10} {:>10.1} {:>12} {:>10} {:>11} {:>8}\n",
            n.node,
            n.sent_msgs,
            n.sent_bytes as f64 / 1024.0,
            n.received_msgs,
            n.received_bytes as f64 / 1024.0,
            n.fast_write_faults,
            n.fault_handoffs,
            n.read_misses,
            n.diffs_applied
        ));
    }
    out
}

/// The JSON fields of the whole run: fault costs, the 2-node figures, the ratios, and the
/// `n4_`-prefixed figures of the larger job if it ran.
pub fn json_fields(
    f: &FaultCosts,
    r: &JobReport,
    ratios: &[Ratio],
    extra: &[(String, f64)],
) -> Vec<(String, f64)> {
    let mut out = vec![
        ("bare_fault_us".to_string(), f.bare.mean_us),
        ("twin_fault_us".to_string(), f.twin.mean_us),
        ("twin_fault_p50_us".to_string(), f.twin.p50_us),
        ("twin_fault_cold_us".to_string(), f.twin_cold.mean_us),
    ];
    out.extend(r.fields().into_iter().filter(|(k, _)| k != "nprocs"));
    out.extend(ratios.iter().map(|r| (r.key.to_string(), r.value)));
    out.extend(extra.iter().cloned());
    out
}
