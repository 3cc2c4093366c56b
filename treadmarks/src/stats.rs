//! Per-node statistics: the protocol's counters, the fault handler's, messages and bytes by type
//! and by peer, and time spent waiting. `TMK_STATS=1` prints them at exit; [`crate::Tmk::stats`]
//! returns them.

#![forbid(unsafe_code)]

use crate::protocol::{MsgKind, NodeId, ProtocolStats};
use std::fmt;
use std::time::Duration;

/// Messages and bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Messages.
    pub msgs: u64,
    /// Their bytes on the wire, frame headers included.
    pub bytes: u64,
}

impl Traffic {
    pub(crate) fn add(&mut self, bytes: usize) {
        self.msgs += 1;
        self.bytes += bytes as u64;
    }
}

/// Statistics of one node.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    /// The node these are of.
    pub node: NodeId,
    /// Nodes in its job.
    pub nprocs: u16,
    /// Whether the node ran pinned to one CPU (`TMK_PIN`; a job whose CPUs another job holds
    /// runs unpinned).
    pub pinned: bool,
    /// The protocol core's counters.
    pub protocol: ProtocolStats,
    /// Write faults the signal handler resolved by itself (twin + unprotect).
    pub fast_write_faults: u64,
    /// Faults handed to the runtime (misses and slow-path write faults).
    pub fault_handoffs: u64,
    /// Faults on valid pages that were only missing from the application view's page tables
    /// (userfaultfd backend), mapped in the signal handler.
    pub minor_maps: u64,
    /// Pages ever twinned (each holds a twin slot).
    pub twin_slots_used: u64,
    /// Twin slots backed at startup (`mem/heap.rs`: `Heap::reserve_twins`).
    pub twin_slots_reserved: u64,
    /// First twins of pages never written, made without a copy (the page and its fresh slot both
    /// hold zeros).
    pub zero_twins: u64,
    /// 2 MiB chunks of diff storage this process mapped fresh, those reserved at startup
    /// included (`mem/chunk.rs`).
    pub diff_chunks_mapped: u64,
    /// Chunks reserved (mapped and backed) at startup.
    pub diff_chunks_reserved: u64,
    /// Chunks taken from this process's pool of emptied ones instead of mapped fresh.
    pub diff_chunks_reused: u64,
    /// Lock operations (releases, acquires whose token was here) the application thread ran on
    /// the node itself.
    pub lock_ops_here: u64,
    /// View validations (diffs all pushed, or twins ahead only) the application thread ran on
    /// the node itself.
    pub validations_here: u64,
    /// Commands the application thread handed to the service thread.
    pub commands: u64,
    /// Sent, by message kind (indexed like [`MsgKind::ALL`]).
    pub sent_by_kind: Vec<Traffic>,
    /// Received, by message kind (indexed like [`MsgKind::ALL`]).
    pub received_by_kind: Vec<Traffic>,
    /// Sent, by peer (indexed by node).
    pub sent_to: Vec<Traffic>,
    /// Received, by peer (indexed by node).
    pub received_from: Vec<Traffic>,
    /// Time the application spent in lock acquires.
    pub lock_wait: Duration,
    /// Time the application spent in barriers.
    pub barrier_wait: Duration,
    /// Time the application spent in faults handed to the service thread (access misses on
    /// invalid pages, and the rare write to a page frozen meanwhile), from when the service
    /// thread takes each: waking it is not counted.
    pub miss_wait: Duration,
    /// Time the application spent in view validations (batched fetches of a view's pages).
    pub view_wait: Duration,
    /// Time spent in collections (from a collecting barrier's release to the end of collection).
    pub gc_time: Duration,
    /// Consistency data held when the statistics were taken, in bytes.
    pub consistency_bytes: u64,
}

impl Stats {
    pub(crate) fn new(node: NodeId, nprocs: u16) -> Self {
        let n = nprocs as usize;
        Stats {
            node,
            nprocs,
            sent_by_kind: vec![Traffic::default(); MsgKind::ALL.len()],
            received_by_kind: vec![Traffic::default(); MsgKind::ALL.len()],
            sent_to: vec![Traffic::default(); n],
            received_from: vec![Traffic::default(); n],
            ..Stats::default()
        }
    }

    /// Everything sent.
    pub fn sent(&self) -> Traffic {
        self.sent_by_kind
            .iter()
            .fold(Traffic::default(), |a, t| Traffic { msgs: a.msgs + t.msgs, bytes: a.bytes + t.bytes })
    }

    /// Everything received.
    pub fn received(&self) -> Traffic {
        self.received_by_kind
            .iter()
            .fold(Traffic::default(), |a, t| Traffic { msgs: a.msgs + t.msgs, bytes: a.bytes + t.bytes })
    }

    pub(crate) fn count_sent(&mut self, to: NodeId, kind: MsgKind, bytes: usize) {
        self.sent_by_kind[kind as usize].add(bytes);
        self.sent_to[to.idx()].add(bytes);
    }

    pub(crate) fn count_received(&mut self, from: NodeId, kind: MsgKind, bytes: usize) {
        self.received_by_kind[kind as usize].add(bytes);
        self.received_from[from.idx()].add(bytes);
    }
}

impl Stats {
    /// The main figures as one flat JSON object (what `TMK_STATS=json` prints, one line per
    /// node, prefixed `TMK_STATS `), for tools that add up a job's nodes.
    pub fn to_json(&self) -> String {
        let p = &self.protocol;
        let (sent, received) = (self.sent(), self.received());
        let fields: [(&str, f64); 56] = [
            ("node", f64::from(self.node.0)),
            ("nprocs", f64::from(self.nprocs)),
            ("pinned", f64::from(u8::from(self.pinned))),
            ("msgs_sent", sent.msgs as f64),
            ("bytes_sent", sent.bytes as f64),
            ("msgs_received", received.msgs as f64),
            ("bytes_received", received.bytes as f64),
            ("read_misses", p.read_misses as f64),
            ("view_misses", p.view_misses as f64),
            ("write_faults", (p.write_faults + self.fast_write_faults) as f64),
            ("twins", (p.twins + p.fast_twins + p.twins_ahead) as f64),
            ("twins_ahead", p.twins_ahead as f64),
            ("twins_skipped", p.twins_skipped as f64),
            ("twins_renewed", p.twins_renewed as f64),
            ("renewals_skipped", p.renewals_skipped as f64),
            ("renewals_unfrozen", p.renewals_unfrozen as f64),
            ("twin_slots_used", self.twin_slots_used as f64),
            ("twin_slots_reserved", self.twin_slots_reserved as f64),
            ("zero_twins", self.zero_twins as f64),
            ("diffs_created", p.diffs_created as f64),
            ("diff_bytes_created", p.diff_bytes_created as f64),
            ("diffs_applied", p.diffs_applied as f64),
            ("diffs_pushed", p.diffs_pushed as f64),
            ("pushes_used", p.pushes_used as f64),
            ("pushes_in_place", p.pushes_in_place as f64),
            ("pushes_skipped", p.pushes_skipped as f64),
            ("intervals", p.intervals as f64),
            ("records_sent_ahead", p.records_sent_ahead as f64),
            ("write_notices_made", p.write_notices_made as f64),
            ("lock_acquires_local", p.lock_acquires_local as f64),
            ("lock_acquires_remote", p.lock_acquires_remote as f64),
            ("lock_tokens_bundled", p.lock_tokens_bundled as f64),
            ("lock_tokens_received", p.lock_tokens_received as f64),
            ("lock_ops_here", self.lock_ops_here as f64),
            ("validations_here", self.validations_here as f64),
            ("commands", self.commands as f64),
            ("diff_chunks_mapped", self.diff_chunks_mapped as f64),
            ("diff_chunks_reserved", self.diff_chunks_reserved as f64),
            ("diff_chunks_reused", self.diff_chunks_reused as f64),
            ("barriers", p.barriers as f64),
            ("collections", p.collections as f64),
            ("lock_wait_ms", ms(self.lock_wait)),
            ("barrier_wait_ms", ms(self.barrier_wait)),
            ("miss_wait_ms", ms(self.miss_wait)),
            ("view_wait_ms", ms(self.view_wait)),
            ("gc_time_ms", ms(self.gc_time)),
            ("peak_consistency_bytes", p.peak_consistency_bytes as f64),
            ("pages_fetched_whole", p.page_requests_sent as f64),
            ("pages_backed", p.pages_backed as f64),
            ("pages_backed_mapped", p.pages_backed_mapped as f64),
            ("pages_overwritten", p.pages_overwritten as f64),
            ("diffs_superseded", p.diffs_superseded as f64),
            ("streams", p.streams as f64),
            ("streamed_pages", p.streamed_pages as f64),
            ("stream_waits", p.stream_waits as f64),
            ("settles", p.settles as f64),
        ];
        let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
        format!("{{{}}}", body.join(","))
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.protocol;
        writeln!(f, "treadmarks statistics, {} of {}", self.node, self.nprocs)?;
        writeln!(
            f,
            "  faults: {} write (fast path) + {} handed to the runtime ({} read misses, {} slow write faults) + {} mapped (valid, unmapped)",
            self.fast_write_faults, self.fault_handoffs, p.read_misses, p.write_faults, self.minor_maps
        )?;
        writeln!(
            f,
            "  twins: {} ({} made ahead of writes, {} of them of pages declared overwritten, not copied; {} renewed ({} from a snapshot, unfrozen), {} not renewed (declared overwritten), {} of never-written pages without a copy; {} pages twinned, {} twin slots backed at startup)   diffs created: {} ({} B; 2 MiB chunks {} mapped, {} of them reserved at startup, {} reused)   diffs applied: {} ({} B)",
            p.twins + p.fast_twins + p.twins_ahead,
            p.twins_ahead,
            p.twins_skipped,
            p.twins_renewed,
            p.renewals_unfrozen,
            p.renewals_skipped,
            self.zero_twins,
            self.twin_slots_used,
            self.twin_slots_reserved,
            p.diffs_created,
            p.diff_bytes_created,
            self.diff_chunks_mapped,
            self.diff_chunks_reserved,
            self.diff_chunks_reused,
            p.diffs_applied,
            p.diff_bytes_applied
        )?;
        writeln!(
            f,
            "  diffs pushed at barriers: {}   pushed pages used: {} ({} in place), unused: {}, chained: {}, skipped (rewritten next): {}   diffs piggybacked on grants: {}   stale pages overwritten unfetched: {} (diffs they superseded, received later: {})",
            p.diffs_pushed,
            p.pushes_used,
            p.pushes_in_place,
            p.pushes_wasted,
            p.pushes_chained,
            p.pushes_skipped,
            p.diffs_piggybacked,
            p.pages_overwritten,
            p.diffs_superseded
        )?;
        writeln!(
            f,
            "  intervals: {} closed, {} incorporated, {} records sent ahead of their message   write notices: {} made, {} received   invalidations: {}",
            p.intervals,
            p.intervals_incorporated,
            p.records_sent_ahead,
            p.write_notices_made,
            p.write_notices_received,
            p.invalidations
        )?;
        writeln!(
            f,
            "  locks: {} local, {} remote, wait {:.3} ms, tokens bundled {} out / {} in, {} forwards returned   barriers: {}, wait {:.3} ms   miss wait {:.3} ms   view wait {:.3} ms",
            p.lock_acquires_local,
            p.lock_acquires_remote,
            ms(self.lock_wait),
            p.lock_tokens_bundled,
            p.lock_tokens_received,
            p.lock_forwards_returned,
            p.barriers,
            ms(self.barrier_wait),
            ms(self.miss_wait),
            ms(self.view_wait)
        )?;
        writeln!(
            f,
            "  views that fetched: {} ({} invalid pages; {} streamed, {} pages; {} faults waited for a page on its way, {} synchronizations for the rest)",
            p.validations, p.view_misses, p.streams, p.streamed_pages, p.stream_waits, p.settles
        )?;
        writeln!(
            f,
            "  application thread: {} lock operations and {} validations run on the node itself, {} commands handed to the service thread; {}",
            self.lock_ops_here,
            self.validations_here,
            self.commands,
            if self.pinned { "pinned to one CPU" } else { "not pinned" }
        )?;
        writeln!(
            f,
            "  heap pages backed ahead of their first touch: {} ({} of them mapped)   collections: {}   time {:.3} ms   reclaimed {} B   stale copies dropped {}   pages fetched whole {}   consistency data {} B (peak {} B)",
            p.pages_backed,
            p.pages_backed_mapped,
            p.collections,
            ms(self.gc_time),
            p.gc_bytes_reclaimed,
            p.pages_dropped,
            p.page_requests_sent,
            self.consistency_bytes,
            p.peak_consistency_bytes
        )?;
        writeln!(f, "  {:<16} {:>10} {:>12} {:>10} {:>12}", "message", "sent", "bytes", "received", "bytes")?;
        for (i, k) in MsgKind::ALL.iter().enumerate() {
            // A `Stats::default()` (a sum's start, say) has no rows yet: zeros.
            let row = |v: &[Traffic]| v.get(i).copied().unwrap_or_default();
            let (s, r) = (row(&self.sent_by_kind), row(&self.received_by_kind));
            if s.msgs + r.msgs > 0 {
                writeln!(
                    f,
                    "  {:<16} {:>10} {:>12} {:>10} {:>12}",
                    k.name(),
                    s.msgs,
                    s.bytes,
                    r.msgs,
                    r.bytes
                )?;
            }
        }
        for (n, (s, r)) in self.sent_to.iter().zip(&self.received_from).enumerate() {
            if s.msgs + r.msgs > 0 {
                writeln!(
                    f,
                    "  {:<16} {:>10} {:>12} {:>10} {:>12}",
                    format!("peer node {n}"),
                    s.msgs,
                    s.bytes,
                    r.msgs,
                    r.bytes
                )?;
            }
        }
        Ok(())
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Stats::default()`, the start of a sum of nodes' statistics, prints (it indexed rows it
    /// does not have, and panicked).
    #[test]
    fn default_statistics_print() {
        let text = Stats::default().to_string();
        assert!(text.contains("message"), "{text}");
    }
}
