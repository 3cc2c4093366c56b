//! Counters the protocol core keeps. The runtime adds message, byte and wait-time counters.

/// Protocol counters of one node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProtocolStats {
    /// Faults on invalid pages (access misses), write faults on them included; a fault on a
    /// page already on its way to a streaming view is a `stream_waits` instead.
    pub read_misses: u64,
    /// Write faults handled by the protocol core (the slow path).
    pub write_faults: u64,
    /// Twins made by the protocol core.
    pub twins: u64,
    /// Twins renewed when a diff was served (the page stayed writable; no fault on its next write).
    pub twins_renewed: u64,
    /// Twins of recently written pages dropped, not renewed, when a diff was served: the pages
    /// were declared overwritten (outputs; see `Node::cut_twin`).
    pub renewals_skipped: u64,
    /// Twins renewed while the application ran, from a snapshot of the still writable page
    /// instead of freezing it (`Node::serve_diff_request`; part of `twins_renewed`).
    pub renewals_unfrozen: u64,
    /// Twins made ahead of writes for a mutable view (no fault on its first write).
    pub twins_ahead: u64,
    /// Of those, twins of pages declared overwritten, which are never read and so not copied.
    pub twins_skipped: u64,
    /// Twins made by the fault handler's fast path (reported through `handle_twin_made`).
    pub fast_twins: u64,
    /// Diffs created (lazily).
    pub diffs_created: u64,
    /// Encoded bytes of the diffs created.
    pub diff_bytes_created: u64,
    /// Diffs applied to this node's pages.
    pub diffs_applied: u64,
    /// Encoded bytes of the diffs applied.
    pub diff_bytes_applied: u64,
    /// View validations that fetched something (each batches many pages).
    pub validations: u64,
    /// Invalid pages those validations brought up to date (misses without a fault).
    pub view_misses: u64,
    /// Validations that streamed (`stream.rs`).
    pub streams: u64,
    /// Pages the streaming validations fetched.
    pub streamed_pages: u64,
    /// Faults that waited for a page on its way to a streaming view.
    pub stream_waits: u64,
    /// Synchronizations that waited for streamed pages to arrive first.
    pub settles: u64,
    /// Diffs sent along with lock grants.
    pub diffs_piggybacked: u64,
    /// Diffs pushed at barriers to earlier readers (`push.rs`).
    pub diffs_pushed: u64,
    /// Pushed pages a miss used instead of a request.
    pub pushes_used: u64,
    /// Pushed pages dropped unused (or unusable).
    pub pushes_wasted: u64,
    /// Pushed pages chained to an unused push of the page (counted again as used or unused
    /// later).
    pub pushes_chained: u64,
    /// Pushed pages applied where they stand at the barrier they came with (`push.rs`).
    pub pushes_in_place: u64,
    /// Pages (per subscriber) not pushed at a barrier because the next epoch rewrites them
    /// (`push.rs`, "Skipping").
    pub pushes_skipped: u64,
    /// Diff requests sent (one per writer per miss or validation, split into messages).
    pub diff_requests_sent: u64,
    /// Pages whose diffs this node served to requests.
    pub diff_requests_served: u64,
    /// Intervals this node closed.
    pub intervals: u64,
    /// Write notices this node's intervals carried.
    pub write_notices_made: u64,
    /// Other nodes' interval records incorporated.
    pub intervals_incorporated: u64,
    /// Interval records sent ahead of the grant, arrival or release carrying the rest, since
    /// they were too many for one message (`ahead.rs`).
    pub records_sent_ahead: u64,
    /// Other nodes' write notices incorporated.
    pub write_notices_received: u64,
    /// Pages invalidated by write notices.
    pub invalidations: u64,
    /// Lock acquires satisfied locally (the token was here).
    pub lock_acquires_local: u64,
    /// Lock acquires that asked the lock's manager.
    pub lock_acquires_remote: u64,
    /// Lock tokens passed along with grants unasked (bundled).
    pub lock_tokens_bundled: u64,
    /// Lock tokens received so.
    pub lock_tokens_received: u64,
    /// Forwards sent back to the manager after this node bundled it the token.
    pub lock_forwards_returned: u64,
    /// Barriers passed.
    pub barriers: u64,
    /// Whole pages asked for (after a collection dropped our copy).
    pub page_requests_sent: u64,
    /// Whole pages served to such requests.
    pub pages_served: u64,
    /// Collections (`gc.rs`).
    pub collections: u64,
    /// Stale copies the collections dropped.
    pub pages_dropped: u64,
    /// Consistency data the collections reclaimed, in bytes.
    pub gc_bytes_reclaimed: u64,
    /// Heap pages backed with memory at barriers ahead of their first touch
    /// (`Node::back_heap`).
    pub pages_backed: u64,
    /// Of those, pages mapped so that the first touch takes no fault.
    pub pages_backed_mapped: u64,
    /// Stale pages declared overwritten, so not fetched (`Node::request_overwrite`).
    pub pages_overwritten: u64,
    /// Diffs received later that such an overwrite had superseded (not applied).
    pub diffs_superseded: u64,
    /// Most consistency data (records, notices, twins, diffs) held at once, in bytes.
    pub peak_consistency_bytes: u64,
}

/// Totals over nodes or runs: every counter added, the peak the larger of the two.
impl std::ops::AddAssign<&ProtocolStats> for ProtocolStats {
    fn add_assign(&mut self, o: &ProtocolStats) {
        self.read_misses += o.read_misses;
        self.write_faults += o.write_faults;
        self.twins += o.twins;
        self.twins_renewed += o.twins_renewed;
        self.renewals_skipped += o.renewals_skipped;
        self.renewals_unfrozen += o.renewals_unfrozen;
        self.twins_ahead += o.twins_ahead;
        self.twins_skipped += o.twins_skipped;
        self.fast_twins += o.fast_twins;
        self.diffs_created += o.diffs_created;
        self.diff_bytes_created += o.diff_bytes_created;
        self.diffs_applied += o.diffs_applied;
        self.diff_bytes_applied += o.diff_bytes_applied;
        self.validations += o.validations;
        self.view_misses += o.view_misses;
        self.streams += o.streams;
        self.streamed_pages += o.streamed_pages;
        self.stream_waits += o.stream_waits;
        self.settles += o.settles;
        self.diffs_piggybacked += o.diffs_piggybacked;
        self.diffs_pushed += o.diffs_pushed;
        self.pushes_used += o.pushes_used;
        self.pushes_wasted += o.pushes_wasted;
        self.pushes_chained += o.pushes_chained;
        self.pushes_in_place += o.pushes_in_place;
        self.pushes_skipped += o.pushes_skipped;
        self.diff_requests_sent += o.diff_requests_sent;
        self.diff_requests_served += o.diff_requests_served;
        self.intervals += o.intervals;
        self.write_notices_made += o.write_notices_made;
        self.intervals_incorporated += o.intervals_incorporated;
        self.records_sent_ahead += o.records_sent_ahead;
        self.write_notices_received += o.write_notices_received;
        self.invalidations += o.invalidations;
        self.lock_acquires_local += o.lock_acquires_local;
        self.lock_acquires_remote += o.lock_acquires_remote;
        self.lock_tokens_bundled += o.lock_tokens_bundled;
        self.lock_tokens_received += o.lock_tokens_received;
        self.lock_forwards_returned += o.lock_forwards_returned;
        self.barriers += o.barriers;
        self.page_requests_sent += o.page_requests_sent;
        self.pages_served += o.pages_served;
        self.collections += o.collections;
        self.pages_dropped += o.pages_dropped;
        self.gc_bytes_reclaimed += o.gc_bytes_reclaimed;
        self.pages_backed += o.pages_backed;
        self.pages_backed_mapped += o.pages_backed_mapped;
        self.pages_overwritten += o.pages_overwritten;
        self.diffs_superseded += o.diffs_superseded;
        self.peak_consistency_bytes = self.peak_consistency_bytes.max(o.peak_consistency_bytes);
    }
}
