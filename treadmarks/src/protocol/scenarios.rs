//! Small, readable protocol scenarios: a few nodes, messages delivered in order, and assertions
//! on exactly which messages flow. (The seeded simulation in `sim.rs` covers the random cases.)

use super::lock_history::{Wish, Wished};
use super::msg::{DiffList, DiffWire};
use super::*;

const PAGE: usize = 64;

struct Net {
    nodes: Vec<Node<VecMemory>>,
    /// Every message sent, in order, as (from, to, kind).
    log: Vec<(u16, u16, MsgKind)>,
}

impl Net {
    fn new(n: u16) -> Net {
        Net::with_pages(n, 4)
    }

    /// Pushes at every barrier where a page changed, whatever its write history predicts: for
    /// tests of a writer that writes a page every epoch while its reader reads it in place,
    /// where a skip would invalidate it (`push.rs`, "Skipping").
    fn pushing_always(n: u16) -> Net {
        let mut net = Net::new(n);
        for node in &mut net.nodes {
            node.cfg.push_skip = false;
        }
        net
    }

    fn with_pages(n: u16, npages: u32) -> Net {
        Net::configured(n, npages, 8, 0)
    }

    fn configured(n: u16, npages: u32, nlocks: u32, lock_bundle: usize) -> Net {
        let nodes = (0..n)
            .map(|i| {
                let cfg = NodeConfig {
                    me: NodeId(i),
                    nprocs: n,
                    nlocks,
                    nbarriers: 2,
                    heap_size: u64::from(npages) * PAGE as u64,
                    gc_threshold: u64::MAX,
                    push: true,
                    push_skip: true,
                    lock_bundle,
                    back_heap: true,
                    stream_min_pages: 0,
                    consistency_limit: u64::MAX,
                    limits: Limits::default(),
                };
                let access = if n == 1 { Access::ReadWrite } else { Access::Read };
                Node::new(cfg, VecMemory::new(npages, PAGE, access))
            })
            .collect();
        Net { nodes, log: Vec::new() }
    }

    /// Node 0 writes page 1 and node 1 reads it after a barrier: node 1 subscribes to the page.
    fn node_1_reads_page_1(mut self) -> Net {
        self.write(0, 1, 0, 1);
        self.barrier();
        assert_eq!(self.read(1, 1, 0), 1);
        self
    }

    /// Delivers messages until the network is quiet.
    fn settle(&mut self) {
        loop {
            let mut moved = false;
            for i in 0..self.nodes.len() {
                while let Some((to, msg)) = self.nodes[i].poll_transmit() {
                    self.log.push((i as u16, to.0, msg.kind()));
                    self.nodes[to.idx()].handle_message(NodeId(i as u16), msg).expect("protocol error");
                    moved = true;
                }
            }
            if !moved {
                // Quiet: the pushes planned at barrier arrivals go out now.
                let deferred: Vec<usize> =
                    (0..self.nodes.len()).filter(|&i| self.nodes[i].has_deferred()).collect();
                if deferred.is_empty() {
                    return;
                }
                for i in deferred {
                    self.nodes[i].run_deferred().expect("protocol error");
                }
            }
        }
    }

    fn done(&mut self, i: usize) -> Option<AppDone> {
        self.nodes[i].poll_done()
    }

    fn kinds(&self) -> Vec<(u16, u16, MsgKind)> {
        self.log.clone()
    }

    fn write(&mut self, i: usize, page: u32, byte: usize, value: u8) {
        let p = PageIdx(page);
        let node = &mut self.nodes[i];
        if node.mem().access(p) != Access::ReadWrite {
            node.handle_fault(p, true).unwrap();
            assert_eq!(node.poll_done(), Some(AppDone::FaultResolved(p)));
        }
        node.mem_mut().app_write(p)[byte] = value;
    }

    /// Reads a byte as the application would: a miss first if the page is invalid.
    fn read(&mut self, i: usize, page: u32, byte: usize) -> u8 {
        let p = PageIdx(page);
        if self.nodes[i].mem().access(p) == Access::None {
            self.nodes[i].handle_fault(p, false).unwrap();
            self.settle();
            assert_eq!(self.done(i), Some(AppDone::FaultResolved(p)));
        }
        self.nodes[i].mem().app_read(p)[byte]
    }

    /// Node 0 writes `page` and every node passes a barrier that collects: the others drop their
    /// copies of the page, to fetch it whole from node 0 when they next touch it.
    fn collect_after_node_0_writes(&mut self, page: u32) {
        self.nodes.iter_mut().for_each(|n| n.cfg.gc_threshold = 0);
        self.write(0, page, 0, 1);
        self.barrier();
        self.nodes.iter_mut().for_each(|n| n.cfg.gc_threshold = u64::MAX);
        for i in 1..self.nodes.len() {
            assert_eq!(self.nodes[i].page_meta(PageIdx(page)).base_from, Some(NodeId(0)), "node {i} kept it");
        }
    }

    /// Every node passes barrier 0, arriving from the last node to node 0 (the manager).
    fn barrier(&mut self) {
        for i in (0..self.nodes.len()).rev() {
            self.nodes[i].request_barrier(BarrierId(0)).unwrap();
            self.settle();
        }
        for i in 0..self.nodes.len() {
            assert_eq!(self.done(i), Some(AppDone::BarrierPassed(BarrierId(0))));
        }
    }

    /// How many messages of `kind` went from `from` to `to` since message `since`.
    fn count(&self, since: usize, from: u16, to: u16, kind: MsgKind) -> usize {
        self.log[since..].iter().filter(|&&m| m == (from, to, kind)).count()
    }
}

#[test]
fn the_collection_warning_comes_only_where_no_barrier_collects() {
    // Two nodes pass lock 0 back and forth, each writing its page under it: the consistency data
    // grows by some bytes every round. With a threshold of two and a half rounds' growth, a
    // barrier every four rounds collects what passed it (the data is over the threshold at the
    // fourth round's acquires); without barriers the data grows on.
    let grant_round = |net: &mut Net, round: usize| {
        for i in 0..2 {
            net.nodes[i].request_acquire(LockId(0)).unwrap();
            net.settle();
            assert_eq!(net.done(i), Some(AppDone::Acquired(LockId(0))));
            net.write(i, 1 + i as u32, round % 64, round as u8 | 1);
            net.nodes[i].request_release(LockId(0)).unwrap();
            net.settle();
        }
    };
    let mut probe = Net::new(2);
    grant_round(&mut probe, 0);
    let before = probe.nodes[0].reclaimable_bytes();
    grant_round(&mut probe, 1);
    let growth = probe.nodes[0].reclaimable_bytes() - before;
    assert!(growth > 0);
    for barriers in [false, true] {
        let mut net = Net::new(2);
        let threshold = 2 * growth + growth / 2;
        for node in &mut net.nodes {
            node.cfg.gc_threshold = threshold;
        }
        let mut over = false;
        let mut warned: Vec<Vec<u64>> = vec![Vec::new(); 2];
        for round in 0..40 {
            grant_round(&mut net, round);
            over |= net.nodes.iter().any(|n| n.reclaimable_bytes() > threshold);
            for (node, sizes) in net.nodes.iter_mut().zip(&mut warned) {
                // "consistency data is <bytes> bytes, ..."
                sizes.extend(std::iter::from_fn(|| node.poll_warning()).map(|w| {
                    w.split(' ')
                        .nth(3)
                        .and_then(|b| b.parse::<u64>().ok())
                        .expect("the size leads the warning")
                }));
            }
            if barriers && round % 4 == 3 {
                net.barrier();
            }
        }
        assert!(over, "the data passed the threshold between barriers");
        for sizes in &warned {
            if barriers {
                assert!(sizes.is_empty(), "{sizes:?}");
            } else {
                // Said once past twice the threshold, then again at every doubling.
                assert!(sizes.len() >= 2 && sizes[0] > 2 * threshold, "{sizes:?}");
                assert!(sizes.windows(2).all(|w| w[1] > 2 * w[0]), "{sizes:?}");
            }
        }
        assert_eq!(net.nodes[0].stats().collections > 0, barriers);
    }
    // Past its limit, a node that never collects fails its next acquire, naming the bytes.
    let mut net = Net::new(2);
    for node in &mut net.nodes {
        node.cfg.consistency_limit = 10 * growth;
    }
    let mut round = 0;
    let e = loop {
        round += 1;
        assert!(round < 100, "the limit was never reached");
        let i = round % 2;
        if let Err(e) = net.nodes[i].request_acquire(LockId(0)) {
            break e;
        }
        net.settle();
        assert_eq!(net.done(i), Some(AppDone::Acquired(LockId(0))));
        net.write(i, 1 + i as u32, round % 64, round as u8 | 1);
        net.nodes[i].request_release(LockId(0)).unwrap();
        net.settle();
    };
    assert!(
        matches!(e, ProtocolError::ConsistencyLimit { bytes, limit } if bytes > limit && limit == 10 * growth)
    );
    assert!(
        e.to_string().contains("TMK_CONSISTENCY_LIMIT") && e.to_string().contains("Tmk::collect()"),
        "{e}"
    );
}

/// A node whose interval index would wrap stops, saying why, instead of numbering its next
/// interval 0, which every peer would take for one it has and drop with its write notices.
#[test]
#[should_panic(expected = "node 0 has recorded 4294967295 intervals, the most an interval index counts")]
fn the_interval_after_the_last_index_stops_the_node() {
    let mut net = Net::new(2);
    net.nodes[0].vt.set(NodeId(0), IntervalIdx::MAX);
    net.write(0, 1, 0, 7);
}

#[test]
fn reacquiring_a_lock_nobody_asked_for_costs_no_message() {
    let mut net = Net::new(2);
    // Lock 1 is managed by node 1; node 0 asks for it: request to the manager, manager (the last
    // holder, with the token) grants straight away.
    net.nodes[0].request_acquire(LockId(1)).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Acquired(LockId(1))));
    use MsgKind::*;
    assert_eq!(net.kinds(), vec![(0, 1, LockRequest), (1, 0, LockGrant)]);
    net.nodes[0].request_release(LockId(1)).unwrap();
    net.settle();
    // Node 0 keeps the token: acquiring again is local.
    net.nodes[0].request_acquire(LockId(1)).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Acquired(LockId(1))));
    assert_eq!(net.kinds().len(), 2, "no message for the re-acquire: {:?}", net.kinds());
    assert_eq!(net.nodes[0].stats().lock_acquires_local, 1);
}

#[test]
fn a_request_is_forwarded_to_the_last_requester_who_grants_at_release() {
    use MsgKind::*;
    let mut net = Net::new(3);
    net.nodes[1].request_acquire(LockId(0)).unwrap(); // manager: node 0
    net.settle();
    assert_eq!(net.done(1), Some(AppDone::Acquired(LockId(0))));
    net.write(1, 2, 5, 42);
    net.nodes[2].request_acquire(LockId(0)).unwrap();
    net.settle();
    assert_eq!(net.done(2), None, "node 1 still holds the lock");
    net.nodes[1].request_release(LockId(0)).unwrap();
    net.settle();
    assert_eq!(net.done(2), Some(AppDone::Acquired(LockId(0))));
    assert_eq!(
        net.kinds(),
        vec![
            (1, 0, LockRequest),
            (0, 1, LockGrant),
            (2, 0, LockRequest),
            (0, 1, LockForward),
            (1, 2, LockGrant)
        ]
    );
    // The grant carried node 1's interval and, because node 1 wrote page 2 while holding the
    // lock, its diff: node 2 reads the new value with no further message.
    assert_eq!(net.nodes[2].mem().app_read(PageIdx(2))[5], 42);
    assert_eq!(net.kinds().len(), 5);
    assert_eq!(net.nodes[1].stats().diffs_piggybacked, 1);
}

#[test]
fn a_grant_carries_no_diff_for_data_written_outside_the_lock() {
    use MsgKind::*;
    let mut net = Net::new(2);
    net.write(1, 3, 0, 7); // outside any lock; the page stays twinned across the barrier
    for i in [1, 0] {
        net.nodes[i].request_barrier(BarrierId(0)).unwrap();
        net.settle();
    }
    for i in 0..2 {
        assert_eq!(net.done(i), Some(AppDone::BarrierPassed(BarrierId(0))));
    }
    net.write(1, 3, 1, 8); // still outside the lock, still the same twin
    net.nodes[1].request_acquire(LockId(1)).unwrap();
    net.settle();
    assert_eq!(net.done(1), Some(AppDone::Acquired(LockId(1))));
    net.nodes[1].request_release(LockId(1)).unwrap();
    net.nodes[0].request_acquire(LockId(1)).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Acquired(LockId(1))));
    assert_eq!(net.nodes[1].stats().diffs_piggybacked, 0);
    assert_eq!(net.nodes[0].mem().access(PageIdx(3)), Access::None, "invalid until asked");
    net.nodes[0].handle_fault(PageIdx(3), false).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::FaultResolved(PageIdx(3))));
    assert_eq!(&net.nodes[0].mem().app_read(PageIdx(3))[..2], &[7, 8]);
    assert_eq!(net.kinds().iter().filter(|k| k.2 == DiffRequest).count(), 1);
}

/// Node 0 reads page 2 of node 1's once, at a barrier: it subscribes to the page. Node 1 wrote
/// it under a lock (lock 3), so its grants may carry the page.
fn subscribe_node_0_to_page_2(net: &mut Net) {
    write_under(net, 1, 3, 2, 0, 1);
    net.barrier();
    assert_eq!(net.read(0, 2, 0), 1);
    assert_eq!(net.kinds().iter().filter(|k| k.2 == MsgKind::DiffRequest).count(), 1);
}

/// `i` takes `lock`, writes `value` at byte `byte` of `page`, and lets the lock go.
fn write_under(net: &mut Net, i: usize, lock: u32, page: u32, byte: usize, value: u8) {
    net.nodes[i].request_acquire(LockId(lock)).unwrap();
    net.settle();
    assert_eq!(net.done(i), Some(AppDone::Acquired(LockId(lock))));
    net.write(i, page, byte, value);
    net.nodes[i].request_release(LockId(lock)).unwrap();
    net.settle();
}

/// Node 1 writes page 2 under lock 2 and page 3 under lock 1 (two data on one page, like water's
/// forces), node 0 reading page 2 before; node 0 takes lock 1 only, from node 1, whose grants
/// carry the diffs of at most `piggyback_pages` pages. The grant's notices invalidate both pages.
/// Returns the network and where the acquire's messages begin in its log.
fn grant_after_writes_under_two_locks(piggyback_pages: usize) -> (Net, usize) {
    let mut net = Net::new(2);
    subscribe_node_0_to_page_2(&mut net);
    net.nodes[1].cfg.limits.piggyback_pages = piggyback_pages;
    write_under(&mut net, 1, 2, 2, 1, 5);
    write_under(&mut net, 1, 1, 3, 0, 6);
    let since = net.log.len();
    net.nodes[0].request_acquire(LockId(1)).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Acquired(LockId(1))));
    (net, since)
}

#[test]
fn a_grant_carries_the_diffs_of_pages_the_acquirer_reads_whatever_lock_they_were_written_under() {
    let (mut net, since) = grant_after_writes_under_two_locks(Limits::default().piggyback_pages);
    assert_eq!(net.nodes[1].stats().diffs_piggybacked, 2, "page 3 (under the lock) and page 2 (read)");
    assert_eq!(net.read(0, 3, 0), 6);
    assert_eq!((net.read(0, 2, 0), net.read(0, 2, 1)), (1, 5));
    assert_eq!(net.count(since, 0, 1, MsgKind::DiffRequest), 0, "{:?}", &net.log[since..]);
}

/// A grant carries the diffs of at most `piggyback_pages` pages (the bound a receiver holds it
/// to, `cautious.rs`), the lock's data first; the acquirer fetches the page left out.
#[test]
fn a_grant_carries_the_diffs_of_no_more_pages_than_its_limit() {
    let (mut net, since) = grant_after_writes_under_two_locks(1);
    assert_eq!(net.nodes[1].stats().diffs_piggybacked, 1, "page 3, under the lock, only");
    assert_eq!(net.read(0, 3, 0), 6);
    assert_eq!(net.count(since, 0, 1, MsgKind::DiffRequest), 0, "{:?}", &net.log[since..]);
    assert_eq!((net.read(0, 2, 0), net.read(0, 2, 1)), (1, 5));
    assert_eq!(net.count(since, 0, 1, MsgKind::DiffRequest), 1, "page 2 fetched: {:?}", &net.log[since..]);
}

/// Node 0 rewrites page 1 under lock 1 five times, node 2 taking the lock (and the page's diff)
/// after each; node 1, five hand-offs behind, reads the page: it lacks five diffs, which come in
/// as many replies when a reply may carry one, the page complete only after the last.
#[test]
fn a_reply_larger_than_its_limit_comes_in_parts_and_completes_the_page_at_the_last() {
    for (reply_bytes, replies) in [(1, 5), (Limits::default().reply_bytes, 1)] {
        let mut net = Net::new(3);
        net.nodes.iter_mut().for_each(|n| n.cfg.limits.reply_bytes = reply_bytes);
        for k in 1..=5 {
            write_under(&mut net, 0, 1, 1, k, k as u8);
            net.nodes[2].request_acquire(LockId(1)).unwrap();
            net.settle();
            assert_eq!(net.done(2), Some(AppDone::Acquired(LockId(1))));
            net.nodes[2].request_release(LockId(1)).unwrap();
            net.settle();
        }
        net.nodes[1].request_acquire(LockId(1)).unwrap();
        net.settle();
        assert_eq!(net.done(1), Some(AppDone::Acquired(LockId(1))));
        let since = net.log.len();
        net.nodes[1].handle_fault(PageIdx(1), false).unwrap();
        // Delivered one message at a time: the page stays invalid until the last part.
        let mut parts = 0;
        while let Some((to, msg)) = net.nodes[0].poll_transmit().or_else(|| net.nodes[1].poll_transmit()) {
            let from = if to == NodeId(1) { 0 } else { 1 };
            if let Message::DiffReply { continued, .. } = &msg {
                parts += 1;
                assert_eq!(*continued, parts < replies, "reply {parts} of {replies}");
            }
            net.log.push((from, to.0, msg.kind()));
            net.nodes[to.idx()].handle_message(NodeId(from), msg).unwrap();
            let resolved = net.nodes[1].poll_done();
            assert_eq!(resolved.is_some(), parts == replies, "after reply {parts} of {replies}");
            // Counted against the writer while its replies go on, and no longer once in.
            let held = net.nodes[1].held_continued[0];
            assert_eq!(held > 0, parts > 0 && parts < replies, "after reply {parts} of {replies}: {held}");
        }
        assert_eq!(net.count(since, 0, 1, MsgKind::DiffReply), replies);
        for k in 1..=5 {
            assert_eq!(net.read(1, 1, k), k as u8, "byte {k}, replies of {reply_bytes} bytes");
        }
    }
}

/// Node 0 writes pages 1-5 in five intervals; node 2 takes the lock and writes pages 6-8 in three
/// more; all meet at a barrier. When a message may carry one record, the grant to node 2 sends
/// four of its five ahead, node 2's arrival two of its three, and the release to node 1, which
/// lacks all eight, seven; every node ends with every write. With the default limit nothing goes
/// ahead.
#[test]
fn records_too_many_for_one_message_go_ahead_of_it_and_are_taken_in_with_it() {
    for (record_bytes, grant, arrival, to_node_1) in [(1, 4, 2, 7), (Limits::default().record_bytes, 0, 0, 0)]
    {
        let mut net = Net::with_pages(3, 10);
        net.nodes.iter_mut().for_each(|n| n.cfg.limits.record_bytes = record_bytes);
        for k in 1..=5 {
            write_under(&mut net, 0, 2, k, 0, 10 + k as u8);
        }
        let since = net.log.len();
        acquire(&mut net, 2, 2);
        assert_eq!(net.count(since, 0, 2, MsgKind::Intervals), grant, "{:?}", &net.log[since..]);
        for k in 6..=8 {
            net.write(2, k, 0, 10 + k as u8);
            release(&mut net, 2, 2);
            if k < 8 {
                acquire(&mut net, 2, 2);
            }
        }
        let since = net.log.len();
        net.barrier();
        assert_eq!(net.count(since, 2, 0, MsgKind::Intervals), arrival, "{:?}", &net.log[since..]);
        assert_eq!(net.count(since, 0, 1, MsgKind::Intervals), to_node_1, "{:?}", &net.log[since..]);
        assert_eq!(net.count(since, 0, 2, MsgKind::Intervals), 0, "node 2 lacks nothing");
        let ahead: u64 = net.nodes.iter().map(|n| n.stats().records_sent_ahead).sum();
        assert_eq!(ahead, (grant + arrival + to_node_1) as u64);
        for i in 0..3 {
            assert_eq!(net.nodes[i].vt().entries(), [5, 0, 3], "node {i}");
            for k in 1..=8 {
                assert_eq!(net.read(i, k, 0), 10 + k as u8, "node {i}, page {k}");
            }
            assert_eq!(net.nodes[i].ahead.len(), 0, "node {i}");
        }
    }
}

/// Records sent ahead are held until their message comes, whatever comes between from other
/// peers, and a peer that sends more of them than the node holds is refused.
#[test]
fn records_sent_ahead_wait_for_their_message_and_are_bounded_by_the_consistency_limit() {
    let mut net = Net::new(3);
    net.nodes[1].cfg.limits.record_bytes = 1;
    write_under(&mut net, 1, 1, 1, 0, 7);
    write_under(&mut net, 1, 1, 2, 0, 8);
    net.nodes[0].request_acquire(LockId(1)).unwrap();
    // Deliver everything but node 1's grant to node 0, whose part ahead is handled first.
    let mut grant = None;
    for _ in 0..10 {
        for i in 0..3 {
            while let Some((to, msg)) = net.nodes[i].poll_transmit() {
                if matches!(msg, Message::LockGrant { .. }) {
                    grant = Some(msg);
                    continue;
                }
                net.log.push((i as u16, to.0, msg.kind()));
                net.nodes[to.idx()].handle_message(NodeId(i as u16), msg).unwrap();
            }
        }
    }
    assert_eq!(net.count(0, 1, 0, MsgKind::Intervals), 1);
    assert_eq!(net.nodes[0].ahead.len(), 1);
    assert_eq!(net.done(0), None, "not acquired before the grant");
    net.nodes[2].request_ping(NodeId(0)).unwrap();
    net.settle();
    assert_eq!(net.nodes[0].ahead.len(), 1, "another peer's messages leave the part held");
    net.nodes[0].handle_message(NodeId(1), grant.expect("grant sent")).unwrap();
    assert_eq!(net.done(0), Some(AppDone::Acquired(LockId(1))));
    assert_eq!((net.read(0, 1, 0), net.read(0, 2, 0)), (7, 8));
    // A peer sending records ahead past the limit.
    let rec = net.nodes[0].log().iter().next().unwrap().clone();
    // Past 64 MiB a node of the job (three here: a release may bring every other node's
    // records), though the node's limit is lower: a part of a record of 4 Mi pages (16 MiB and a
    // bit, held) at a time, refused at the twelfth.
    let mut big = rec.clone();
    big.pages = (0..4 << 20).map(PageIdx).collect();
    let fit = (3 * (64 << 20)) / super::gc::Accounting::record_size(&big);
    assert_eq!(fit, 11);
    net.nodes[2].cfg.consistency_limit = 1 << 20;
    for _ in 0..fit {
        net.nodes[2].handle_message(NodeId(0), Message::Intervals { intervals: vec![big.clone()] }).unwrap();
    }
    let err =
        net.nodes[2].handle_message(NodeId(0), Message::Intervals { intervals: vec![big] }).unwrap_err();
    assert!(err.to_string().contains("TMK_CONSISTENCY_LIMIT") && err.to_string().contains("node 0"), "{err}");
}

#[test]
fn a_grant_cuts_the_twins_it_carries_together_and_renewed_ones_unfrozen() {
    let mut net = Net::with_pages(2, 8);
    // Node 1 writes pages 2-4 under lock 1, the data the lock protects, and lets it go.
    let under_lock_1 = |net: &mut Net, value: u8| {
        net.nodes[1].request_acquire(LockId(1)).unwrap();
        net.settle();
        assert_eq!(net.done(1), Some(AppDone::Acquired(LockId(1))));
        for p in 2..5 {
            net.write(1, p, 0, value + p as u8);
        }
        net.nodes[1].request_release(LockId(1)).unwrap();
        net.settle();
    };
    // Node 0 takes lock 1 while node 1's application runs; returns the calls at node 1 that
    // took access from pages.
    let acquire_at_0 = |net: &mut Net| {
        let calls = net.nodes[1].mem().invalidating_calls();
        let since = net.log.len();
        net.nodes[0].request_acquire(LockId(1)).unwrap();
        net.settle();
        assert_eq!(net.done(0), Some(AppDone::Acquired(LockId(1))));
        net.nodes[0].request_release(LockId(1)).unwrap();
        net.settle();
        assert_eq!(net.count(since, 0, 1, MsgKind::DiffRequest), 0, "{:?}", &net.log[since..]);
        net.nodes[1].mem().invalidating_calls() - calls
    };
    under_lock_1(&mut net, 10);
    // Twinned in the interval the release closed: renewed, cut from snapshots, never frozen.
    assert_eq!(acquire_at_0(&mut net), 0);
    assert_eq!(net.nodes[1].stats().renewals_unfrozen, 3);
    assert_eq!(net.nodes[1].stats().diffs_piggybacked, 3);
    for p in 2..5 {
        assert_eq!(net.nodes[0].mem().access(PageIdx(p)), Access::Read, "page {p} came with the grant");
        assert_eq!(net.read(0, p, 0), 10 + p as u8);
    }
    // Written again under lock 1, then an interval of node 1's own follows (lock 2, page 6):
    // the twins are older than the latest interval, so they are dropped, and the three pages
    // frozen for their cut in one call, not one each.
    under_lock_1(&mut net, 20);
    write_under(&mut net, 1, 2, 6, 0, 1);
    assert_eq!(acquire_at_0(&mut net), 1);
    assert_eq!(net.nodes[1].stats().diffs_piggybacked, 6);
    for p in 2..5 {
        assert_eq!(net.read(0, p, 0), 20 + p as u8);
    }
}

#[test]
fn a_grant_continues_a_push_held_unused() {
    let mut net = Net::new(2);
    subscribe_node_0_to_page_2(&mut net);
    // Pushed at the barrier and kept aside: node 0 does not touch page 2 in that epoch.
    net.write(1, 2, 0, 3);
    net.barrier();
    assert_eq!(net.nodes[1].stats().diffs_pushed, 1);
    assert_eq!(net.nodes[0].mem().access(PageIdx(2)), Access::None);
    // Node 1 writes it again under lock 1, and node 0 takes the lock: the grant's diff follows
    // the pushed one, so together they complete the page.
    write_under(&mut net, 1, 1, 2, 1, 4);
    let since = net.log.len();
    net.nodes[0].request_acquire(LockId(1)).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Acquired(LockId(1))));
    assert_eq!(net.nodes[0].mem().access(PageIdx(2)), Access::Read, "valid without a miss");
    assert_eq!((net.read(0, 2, 0), net.read(0, 2, 1)), (3, 4));
    assert_eq!(net.count(since, 0, 1, MsgKind::DiffRequest), 0, "{:?}", &net.log[since..]);
    assert_eq!(net.nodes[0].stats().pushes_used, 1);
}

#[test]
fn a_grant_carries_no_page_twinned_before_its_lock_was_taken() {
    let mut net = Net::new(2);
    // Like water's energy lock: node 1 rewrites page 3 outside any lock, then takes lock 1 (its
    // own token) and writes page 2; both fall in the interval its release ends.
    net.write(1, 3, 0, 5);
    write_under(&mut net, 1, 1, 2, 0, 6);
    net.nodes[0].request_acquire(LockId(1)).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Acquired(LockId(1))));
    assert_eq!(net.nodes[1].stats().diffs_piggybacked, 1, "page 2 only");
    assert_eq!(net.nodes[0].mem().access(PageIdx(2)), Access::Read);
    assert_eq!(net.nodes[0].mem().access(PageIdx(3)), Access::None, "fetched when read");
    assert_eq!((net.read(0, 2, 0), net.read(0, 3, 0)), (6, 5));
}

#[test]
fn a_barrier_tells_each_node_exactly_what_it_lacks() {
    use MsgKind::*;
    let mut net = Net::new(3);
    net.write(1, 0, 0, 1);
    net.write(2, 0, 1, 2); // false sharing: two writers of page 0
    for i in [1, 2, 0] {
        net.nodes[i].request_barrier(BarrierId(1)).unwrap();
        net.settle();
    }
    for i in 0..3 {
        assert_eq!(net.done(i), Some(AppDone::BarrierPassed(BarrierId(1))));
    }
    assert_eq!(
        net.kinds(),
        vec![(1, 0, BarrierArrive), (2, 0, BarrierArrive), (0, 1, BarrierRelease), (0, 2, BarrierRelease)]
    );
    // Node 0 reads page 0: one request to each writer, in parallel, and both writes merge.
    net.nodes[0].handle_fault(PageIdx(0), false).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::FaultResolved(PageIdx(0))));
    assert_eq!(&net.nodes[0].mem().app_read(PageIdx(0))[..2], &[1, 2]);
    let requests = net.kinds().iter().filter(|k| k.2 == DiffRequest).count();
    assert_eq!(requests, 2);
}

#[test]
fn validating_a_view_asks_each_writer_once_for_all_its_pages() {
    use MsgKind::*;
    let mut net = Net::new(3);
    for p in 0..3 {
        net.write(1, p, 0, 10 + p as u8);
    }
    net.write(2, 3, 0, 13);
    for i in [1, 2, 0] {
        net.nodes[i].request_barrier(BarrierId(0)).unwrap();
        net.settle();
    }
    for i in 0..3 {
        assert_eq!(net.done(i), Some(AppDone::BarrierPassed(BarrierId(0))));
    }
    let before = net.kinds().len();
    let pages: Vec<PageIdx> = (0..4).map(PageIdx).collect();
    net.nodes[0].request_validate(&pages, false).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Validated));
    let sent = net.kinds()[before..].to_vec();
    assert_eq!(sent.iter().filter(|k| k.2 == DiffRequest).count(), 2, "one request per writer: {sent:?}");
    for p in 0..4u32 {
        assert_eq!(net.nodes[0].mem().app_read(PageIdx(p))[0], 10 + p as u8);
    }
}

#[test]
fn one_node_jobs_send_nothing_and_make_no_intervals() {
    let mut net = Net::new(1);
    net.nodes[0].request_acquire(LockId(3)).unwrap();
    net.nodes[0].mem_mut().app_write(PageIdx(1))[0] = 9;
    net.nodes[0].request_release(LockId(3)).unwrap();
    net.nodes[0].request_barrier(BarrierId(0)).unwrap();
    net.settle();
    assert!(net.kinds().is_empty());
    assert_eq!(net.nodes[0].stats().intervals, 0);
    assert_eq!(net.nodes[0].stats().twins, 0);
}

/// Water's force phase on two nodes: node 0 takes locks 0..64, node 1 takes 32..64 then 0..32,
/// each lock once a step, writing the page the lock guards (8 locks a page).
fn lock_walk_step(net: &mut Net) -> usize {
    walk_locks(net, &[(0..64).collect(), (32..64).chain(0..32).collect()])
}

/// Nodes 0 and 1 take the locks of `orders` in turn, one each in lockstep, each incrementing
/// byte `l % 8` of page `l / 8` under lock `l`, then pass a barrier. Returns the messages sent.
fn walk_locks(net: &mut Net, orders: &[Vec<u32>; 2]) -> usize {
    let since = net.log.len();
    for k in 0..orders[0].len() {
        for (i, order) in orders.iter().enumerate() {
            let l = order[k];
            net.nodes[i].request_acquire(LockId(l)).unwrap();
            net.settle();
            assert_eq!(net.done(i), Some(AppDone::Acquired(LockId(l))));
            let v = net.read(i, l / 8, (l % 8) as usize);
            net.write(i, l / 8, (l % 8) as usize, v + 1);
            net.nodes[i].request_release(LockId(l)).unwrap();
            net.settle();
        }
    }
    net.barrier();
    net.log.len() - since
}

#[test]
fn bundled_grants_carry_the_tokens_a_lock_walk_takes_next() {
    use MsgKind::*;
    let lock_messages = |net: &Net, since: usize| {
        net.log[since..].iter().filter(|m| matches!(m.2, LockRequest | LockForward | LockGrant)).count()
    };
    let mut plain = Net::configured(2, 8, 64, 0);
    let mut bundled = Net::configured(2, 8, 64, 8);
    for step in 0..3 {
        let (a, b) = (plain.log.len(), bundled.log.len());
        lock_walk_step(&mut plain);
        lock_walk_step(&mut bundled);
        let (p, q) = (lock_messages(&plain, a), lock_messages(&bundled, b));
        if step == 0 {
            // Nothing learnt yet: wishes are the ids after each lock, which this walk takes too.
            assert!(q < p, "first step: {q} lock messages bundled against {p}");
        } else {
            // Every acquire finds the token at the other node: 64 per node, a request and a
            // grant each (a forward too when the manager is not the holder). Bundled, one grant
            // in nine carries the next eight tokens.
            assert!(p >= 4 * 64, "plain step {step}: {p} lock messages");
            assert!(q * 5 < p, "bundled step {step}: {q} lock messages against {p}");
        }
    }
    // Both saw every increment: each byte was written once by each node per step.
    for net in [&mut plain, &mut bundled] {
        for l in 0..64 {
            assert_eq!(net.read(0, l / 8, (l % 8) as usize), 6, "lock {l}");
        }
    }
    let s = bundled.nodes[0].stats().clone();
    assert!(s.lock_tokens_bundled > 0 && s.lock_tokens_received > 0, "{s:?}");
}

#[test]
fn a_token_goes_to_the_node_that_takes_it_sooner() {
    use MsgKind::*;
    // Water's walk: each of two nodes takes 256 locks a step, starting where the other starts
    // its second half, with bundles as long as the walk. A granter holds tokens it takes later
    // than the acquirer (it passes them) and tokens it takes sooner (it keeps them). Passing
    // every token but the granter's next 32 sent it tokens it needed soon after, which then came
    // back a grant at a time: 8-9 grants a step here instead of 4-5.
    const LOCKS: u32 = 256;
    let mut net = Net::configured(2, LOCKS / 8, LOCKS, LOCKS as usize);
    let orders: [Vec<u32>; 2] = [(0..LOCKS).collect(), (LOCKS / 2..LOCKS).chain(0..LOCKS / 2).collect()];
    for step in 0..4 {
        let since = net.log.len();
        walk_locks(&mut net, &orders);
        let grants = net.log[since..].iter().filter(|m| m.2 == LockGrant).count();
        if step > 0 {
            assert!(grants <= 6, "step {step}: {grants} grants for two walks of {LOCKS} locks");
        }
    }
    for l in 0..LOCKS {
        assert_eq!(net.read(0, l / 8, (l % 8) as usize), 8, "lock {l}");
    }
}

/// A writer that keeps a miss waiting with reply after `continued` reply is refused once the
/// diffs held from it pass 64 MiB (the node's consistency limit, lower, does not count; the
/// diffs a page each, as no larger one is taken): it had grown the node's memory without end.
/// A diff sent twice is refused at once.
#[test]
fn endless_continued_replies_are_refused_past_the_bound() {
    let mut net = Net::new(2);
    net.write(0, 1, 0, 7);
    net.barrier();
    net.nodes[1].cfg.consistency_limit = 1 << 20;
    net.nodes[1].handle_fault(PageIdx(1), false).unwrap();
    while net.nodes[1].poll_transmit().is_some() {}
    // Replies of 8,192 whole-page diffs each (never applied: the miss never completes).
    const PER_REPLY: u64 = 8192;
    let whole = Diff::whole(&[0; PAGE]);
    let part = |k: u64| {
        let diffs = (k * PER_REPLY + 1..=(k + 1) * PER_REPLY)
            .map(|seq| DiffWire { seq, first_vt: VectorTime::from_entries(vec![1, 0]), diff: whole.clone() })
            .collect();
        Message::DiffReply { pages: vec![PageDiffs { page: PageIdx(1), diffs }], continued: true }
    };
    net.nodes[1].handle_message(NodeId(0), part(0)).unwrap();
    let per_reply = net.nodes[1].held_continued[0];
    let fit = (64 << 20) / per_reply;
    for k in 1..fit {
        net.nodes[1].handle_message(NodeId(0), part(k)).unwrap_or_else(|e| panic!("reply {k}: {e}"));
    }
    assert!(net.nodes[1].held_continued[0] > (64 << 20) - per_reply);
    let err = net.nodes[1].handle_message(NodeId(0), part(fit - 1)).unwrap_err();
    let newest = fit * PER_REPLY;
    let twice = format!("diff {} of page 1 after its diff {newest}", newest - PER_REPLY + 1);
    assert!(err.to_string().contains(&twice), "{err}");
    let err = net.nodes[1].handle_message(NodeId(0), part(fit)).unwrap_err();
    assert!(err.to_string().contains("TMK_CONSISTENCY_LIMIT") && err.to_string().contains("node 0"), "{err}");
}

#[test]
fn bad_input_from_a_peer_is_an_error_not_a_panic() {
    let mut net = Net::new(2);
    let n = &mut net.nodes[0];
    let grant = Message::LockGrant { lock: LockId(1), intervals: vec![], diffs: vec![], bundled: vec![] };
    assert!(matches!(n.handle_message(NodeId(1), grant), Err(ProtocolError::Unexpected { .. })));
    let req = Message::DiffRequest { asks: vec![DiffAsk { page: PageIdx(999), want: 1, after_seq: 0 }] };
    assert!(matches!(n.handle_message(NodeId(1), req), Err(ProtocolError::PageOutOfRange { .. })));
    let fwd =
        Message::LockRequest { lock: LockId(77), seq: 1, vt: VectorTime::zero(2), wish: Wish::default() };
    assert!(matches!(n.handle_message(NodeId(1), fwd), Err(ProtocolError::UnknownLock { .. })));
    // A wish naming a lock the job does not have: an error naming it.
    let wish = Message::LockRequest {
        lock: LockId(0),
        seq: 1,
        vt: VectorTime::zero(2),
        wish: Wish::new(&[Wished { lock: LockId(99), place: 0 }]),
    };
    let e = n.handle_message(NodeId(1), wish).unwrap_err();
    assert_eq!(e, ProtocolError::UnknownLock { lock: LockId(99), nlocks: 8 });
    // Requests naming more pages than any node sends in one: serving them would cost a page of
    // memory per entry, repeats included.
    let most = Limits::default().pages_per_request;
    let pages = Message::PageRequest { pages: vec![PageIdx(0); most + 1] };
    let e = n.handle_message(NodeId(1), pages).unwrap_err().to_string();
    assert!(e.contains(&format!("page request of {} pages (at most {most})", most + 1)), "{e}");
    let ask = DiffAsk { page: PageIdx(0), want: 1, after_seq: 0 };
    let e = n.handle_message(NodeId(1), Message::DiffRequest { asks: vec![ask; most + 1] }).unwrap_err();
    assert!(e.to_string().contains("diff request of 257 pages"), "{e}");
    let empty = Message::DiffReply { pages: vec![], continued: true };
    assert!(matches!(n.handle_message(NodeId(1), empty), Err(ProtocolError::Unexpected { .. })));
    // A grant bundling a token we already have (node 0 manages lock 2 and holds its token).
    n.request_acquire(LockId(1)).unwrap();
    let grant =
        Message::LockGrant { lock: LockId(1), intervals: vec![], diffs: vec![], bundled: vec![LockId(2)] };
    let e = n.handle_message(NodeId(1), grant).unwrap_err().to_string();
    assert!(e.contains("lock 2 bundled with lock 1"), "{e}");
    let n = &mut Net::new(2).nodes.swap_remove(0);
    assert!(matches!(
        n.handle_message(NodeId(5), Message::ExitArrive),
        Err(ProtocolError::Unexpected { .. })
    ));
    let gap = Message::BarrierRelease {
        barrier: BarrierId(0),
        heap_end: 0,
        pushed_by: vec![],
        intervals: vec![IntervalRecord {
            node: NodeId(1),
            index: 3,
            vt: VectorTime::zero(2),
            pages: vec![],
            locks: vec![],
        }],
        gc: false,
    };
    n.request_barrier(BarrierId(0)).unwrap();
    // Node 0 is the manager, so a release *to* it is unexpected; either way: an error, no panic.
    assert!(n.handle_message(NodeId(1), gap).is_err());
}

/// A diff whose timestamp is not one entry per node: an error naming the page, wherever the
/// diff comes (a reply, a grant, a push), before anything uses it.
#[test]
fn a_diff_with_a_short_timestamp_is_an_error_on_every_path() {
    let short = || {
        let mut diffs = msg::DiffList::new();
        diffs.push(msg::DiffWire { seq: 1, first_vt: VectorTime::zero(1), diff: Diff::default() });
        diffs
    };
    let named = |e: ProtocolError| {
        let e = e.to_string();
        assert!(e.contains("diff of page 1 with a timestamp of 1 entries (the job has 2 nodes)"), "{e}");
    };
    // A reply to node 1's miss on page 1.
    let mut net = Net::new(2);
    net.write(0, 1, 0, 7);
    net.barrier();
    net.nodes[1].handle_fault(PageIdx(1), false).unwrap();
    assert!(matches!(net.nodes[1].poll_transmit(), Some((NodeId(0), Message::DiffRequest { .. }))));
    let reply =
        Message::DiffReply { pages: vec![PageDiffs { page: PageIdx(1), diffs: short() }], continued: false };
    named(net.nodes[1].handle_message(NodeId(0), reply).unwrap_err());
    // A grant node 1 waits for.
    let mut net = Net::new(2);
    net.nodes[1].request_acquire(LockId(0)).unwrap();
    assert!(matches!(net.nodes[1].poll_transmit(), Some((_, Message::LockRequest { .. }))));
    let diffs = vec![UnaskedDiffs { page: PageIdx(1), after_seq: 0, diffs: short() }];
    let grant = Message::LockGrant { lock: LockId(0), intervals: vec![], diffs, bundled: vec![] };
    named(net.nodes[1].handle_message(NodeId(0), grant).unwrap_err());
    // A push, refused on arrival rather than kept to be applied later.
    let mut net = Net::new(2);
    let diffs = vec![UnaskedDiffs { page: PageIdx(1), after_seq: 0, diffs: short() }];
    let push = Message::DiffPush { episode: 1, upto: 1, pages: diffs };
    named(net.nodes[1].handle_message(NodeId(0), push).unwrap_err());
}

/// Node 0 sends the distributed values in order, one per call: a repeated or skipped one is an
/// error naming it, and never stands in front of the value due.
#[test]
fn a_distributed_value_out_of_turn_is_an_error() {
    let mut net = Net::new(2);
    let value = |seq: u64, b: u8| Message::Distribute {
        seq,
        bytes: serde_bytes::ByteBuf::from(vec![b]),
        heap_end: 0,
    };
    net.nodes[1].handle_message(NodeId(0), value(0, 10)).unwrap();
    net.nodes[1].request_distribute(None).unwrap();
    assert_eq!(net.done(1), Some(AppDone::Distributed(vec![10])));
    let e = net.nodes[1].handle_message(NodeId(0), value(0, 10)).unwrap_err().to_string();
    assert!(e.contains("distribute of value 0 (value 1 is due)"), "{e}");
    let e = net.nodes[1].handle_message(NodeId(0), value(2, 12)).unwrap_err().to_string();
    assert!(e.contains("distribute of value 2 (value 1 is due)"), "{e}");
    net.nodes[1].request_distribute(None).unwrap();
    assert_eq!(net.done(1), None, "waits for value 1");
    net.nodes[1].handle_message(NodeId(0), value(1, 11)).unwrap();
    assert_eq!(net.done(1), Some(AppDone::Distributed(vec![11])));
}

/// Node 0 does not wait for the others to take its distributed values; those not taken yet
/// are held up to the bound of a peer's parts (the consistency limit, but at least 64 MiB), past
/// which the job fails, saying that the program's node 0 ran that far ahead: a node 0
/// distributing in a loop grew the others' memory without end.
#[test]
fn distributed_values_not_taken_are_held_up_to_the_bound() {
    let mut net = Net::new(2);
    net.nodes[1].cfg.consistency_limit = 1 << 20;
    let value = |seq: u64| Message::Distribute {
        seq,
        bytes: serde_bytes::ByteBuf::from(vec![seq as u8; 1 << 20]),
        heap_end: 0,
    };
    for seq in 0..63 {
        net.nodes[1].handle_message(NodeId(0), value(seq)).unwrap_or_else(|e| panic!("value {seq}: {e}"));
    }
    let e = net.nodes[1].handle_message(NodeId(0), value(63)).unwrap_err().to_string();
    assert!(e.contains("node 0 distributed value 63 while") && e.contains("TMK_CONSISTENCY_LIMIT"), "{e}");
    // Taken, they no longer count.
    for seq in 0..63 {
        net.nodes[1].request_distribute(None).unwrap();
        assert_eq!(net.done(1), Some(AppDone::Distributed(vec![seq as u8; 1 << 20])));
    }
    assert_eq!(net.nodes[1].distributed_bytes, 0);
    net.nodes[1].handle_message(NodeId(0), value(63)).expect("room again");
}

/// An arrival at a barrier the job does not have is the arriving node's error, not a mismatch
/// blamed on the manager at its own arrival; a collection's "done" with no collection running
/// is an error too.
#[test]
fn an_arrival_at_an_unknown_barrier_or_a_stray_gc_done_is_an_error() {
    let mut net = Net::new(2);
    let arrive = Message::BarrierArrive {
        barrier: BarrierId(99),
        vt: VectorTime::zero(2),
        intervals: vec![],
        gc: false,
        pushes: vec![],
    };
    let e = net.nodes[0].handle_message(NodeId(1), arrive).unwrap_err().to_string();
    assert!(e.contains("unexpected arrival at barrier 99 (this job has 2 barriers) from node 1"), "{e}");
    net.barrier();
    let e = net.nodes[0].handle_message(NodeId(1), Message::GcDone).unwrap_err().to_string();
    assert!(e.contains("unexpected gc done from node 1"), "{e}");
}

/// Exit while holding a lock is refused, naming the lock: the next node to ask for it would wait
/// forever.
#[test]
fn exit_while_holding_a_lock_is_an_error() {
    let mut net = Net::new(2);
    net.nodes[1].request_acquire(LockId(0)).unwrap();
    net.settle();
    assert_eq!(net.done(1), Some(AppDone::Acquired(LockId(0))));
    let e = net.nodes[1].request_exit().unwrap_err();
    assert_eq!(e, ProtocolError::ExitHolding { lock: LockId(0) });
    assert!(e.to_string().contains("exit while holding lock 0"), "{e}");
    net.nodes[1].request_release(LockId(0)).unwrap();
    net.nodes[1].request_exit().unwrap();
}

/// A view naming a page twice asks for it once and completes.
#[test]
fn a_view_naming_a_page_twice_fetches_it_once() {
    let mut net = Net::new(2);
    net.write(0, 1, 0, 7);
    net.barrier();
    let t = net.log.len();
    net.nodes[1].request_validate(&[PageIdx(1), PageIdx(1)], false).unwrap();
    net.settle();
    assert_eq!(net.count(t, 1, 0, MsgKind::DiffRequest), 1);
    assert_eq!(net.done(1), Some(AppDone::Validated));
    assert_eq!(net.nodes[1].mem().app_read(PageIdx(1))[0], 7);
}

#[test]
fn a_page_read_last_epoch_has_its_next_diffs_pushed_until_it_goes_unread() {
    use super::push::IN_PLACE_CREDITS;
    use MsgKind::*;
    let mut net = Net::pushing_always(2);
    net.write(0, 1, 0, 1);
    net.barrier();
    // Node 1 misses on page 1 and asks node 0, which makes node 1 a subscriber of the page.
    assert!(!net.nodes[1].validates_locally(&[PageIdx(1)]), "a view of page 1 needs a request");
    let t = net.log.len();
    assert_eq!(net.read(1, 1, 0), 1);
    assert_eq!(net.count(t, 1, 0, DiffRequest), 1);

    // Node 0 writes it again: at the barrier its diff goes to node 1 before it is asked for...
    net.write(0, 1, 0, 2);
    let t = net.log.len();
    net.barrier();
    assert_eq!(net.count(t, 0, 1, DiffPush), 1);
    assert_eq!(net.nodes[1].mem().access(PageIdx(1)), Access::None, "pushed diffs wait for a miss");
    // A view of it (and of a valid page) completes from the push: the runtime runs it on the
    // application thread.
    assert!(net.nodes[1].validates_locally(&[PageIdx(0), PageIdx(1)]));
    // ...and the miss it would have cost is answered at home.
    let t = net.log.len();
    assert_eq!(net.read(1, 1, 0), 2);
    assert_eq!(net.log.len(), t, "no message for a pushed page");
    assert_eq!(net.nodes[1].stats().pushes_used, 1);

    // A miss used the push: the next IN_PLACE_CREDITS pushes are applied at their barrier, where
    // the page stands: it stays readable, with no protection change at all.
    let mut value = 2;
    for _ in 0..IN_PLACE_CREDITS {
        value += 1;
        net.write(0, 1, 0, value);
        let changes = net.nodes[1].mem().protection_changes(PageIdx(1));
        net.barrier();
        assert_eq!(net.nodes[1].mem().access(PageIdx(1)), Access::Read);
        assert_eq!(net.nodes[1].mem().protection_changes(PageIdx(1)), changes);
        assert_eq!(net.nodes[1].mem().app_read(PageIdx(1))[0], value);
    }
    assert_eq!(net.nodes[1].stats().pushes_in_place, u64::from(IN_PLACE_CREDITS));

    // Node 1 stops reading the page. With the credits spent, the next push waits for a miss
    // again and goes unused, and the one after it chains to it (it might be read every other
    // epoch); at the barrier after that, a third push cannot chain, so node 1 drops all three
    // and unsubscribes.
    net.write(0, 1, 0, value + 1);
    net.barrier();
    assert_eq!(net.nodes[1].mem().access(PageIdx(1)), Access::None, "credits spent");
    net.write(0, 1, 0, value + 2);
    let t = net.log.len();
    net.barrier();
    assert_eq!(net.count(t, 1, 0, Unsubscribe), 0, "chained");
    net.write(0, 1, 0, value + 3);
    let t = net.log.len();
    net.barrier();
    assert_eq!(net.count(t, 1, 0, Unsubscribe), 1);
    net.write(0, 1, 0, value + 4);
    let t = net.log.len();
    net.barrier();
    assert_eq!(net.count(t, 0, 1, DiffPush), 0, "unsubscribed");
    assert_eq!(net.nodes[1].stats().pushes_wasted, 3);
    assert!(!net.nodes[1].validates_locally(&[PageIdx(1)]));
    // Reading again fetches as usual (and subscribes again).
    let t = net.log.len();
    assert_eq!(net.read(1, 1, 0), value + 4);
    assert_eq!(net.count(t, 1, 0, DiffRequest), 1);
}

#[test]
fn a_push_is_kept_unused_for_three_epochs() {
    use super::push::PUSH_EPOCHS;
    use MsgKind::*;
    assert_eq!(PUSH_EPOCHS, 3);
    // Like water's energy sums: node 0 writes the page just before a step's last barrier, and
    // node 1 reads it two barriers later. Returns the network and where the push began.
    let pushed_then_two_barriers = || {
        let mut net = Net::new(2).node_1_reads_page_1();
        net.write(0, 1, 0, 2);
        let t = net.log.len();
        net.barrier(); // pushed
        net.barrier();
        net.barrier();
        (net, t)
    };
    // The push serves the read.
    let (mut net, t) = pushed_then_two_barriers();
    assert_eq!(net.read(1, 1, 0), 2);
    assert_eq!(net.count(t, 1, 0, DiffRequest), 0, "the push served the read");
    assert_eq!(net.count(t, 1, 0, Unsubscribe), 0);
    assert_eq!(net.nodes[1].stats().pushes_used, 1);

    // Unread, it goes at the end of its third epoch, and node 1 unsubscribes.
    let (mut net, t) = pushed_then_two_barriers();
    assert_eq!(net.count(t, 1, 0, Unsubscribe), 0, "kept for three epochs");
    net.barrier();
    assert_eq!(net.count(t, 1, 0, Unsubscribe), 1, "dropped after them");
    assert_eq!(net.nodes[1].stats().pushes_wasted, 1);
    let t = net.log.len();
    assert_eq!(net.read(1, 1, 0), 2);
    assert_eq!(net.count(t, 1, 0, DiffRequest), 1, "fetched as usual");
}

#[test]
fn a_push_the_next_epoch_would_supersede_is_skipped_until_the_reader_fetches_between() {
    use MsgKind::*;
    let mut net = Net::new(2).node_1_reads_page_1();
    // Like water's molecules: node 0 writes the page before barriers A and B of every step of
    // three (A, B, C), and node 1 reads it after B only. Once node 0's history shows three
    // steps, the push at A goes: the write before B supersedes it, and B's push carries both.
    let mut value = 10;
    let step = |net: &mut Net, value: &mut u8, read_after_a: bool| {
        net.write(0, 1, 0, *value);
        net.barrier(); // A
        if read_after_a {
            assert_eq!(net.read(1, 1, 0), *value);
        }
        net.write(0, 1, 1, *value + 1);
        net.barrier(); // B
        assert_eq!([net.read(1, 1, 0), net.read(1, 1, 1)], [*value, *value + 1]);
        net.barrier(); // C
        *value += 2;
    };
    for _ in 0..4 {
        step(&mut net, &mut value, false);
    }
    let t = net.log.len();
    let skipped = net.nodes[0].stats().pushes_skipped;
    for _ in 0..3 {
        step(&mut net, &mut value, false);
    }
    assert_eq!(net.nodes[0].stats().pushes_skipped - skipped, 3, "one push a step skipped");
    assert_eq!(net.count(t, 0, 1, DiffPush), 3, "one push a step, at B");
    assert_eq!(net.count(t, 1, 0, DiffRequest), 0, "B's push served every read");

    // Node 1 reads the page between A and B: the skipped push makes it fetch, and from then on
    // the page is pushed to it at every barrier where it changed.
    let t = net.log.len();
    step(&mut net, &mut value, true);
    assert_eq!(net.count(t, 1, 0, DiffRequest), 1);
    let (t, skipped) = (net.log.len(), net.nodes[0].stats().pushes_skipped);
    for _ in 0..2 {
        step(&mut net, &mut value, true);
    }
    assert_eq!(net.nodes[0].stats().pushes_skipped, skipped, "never skipped again");
    assert_eq!(net.count(t, 0, 1, DiffPush), 4, "pushed at A and B");
    assert_eq!(net.count(t, 1, 0, DiffRequest), 0);
}

#[test]
fn a_page_read_every_other_epoch_uses_its_pushes_chained() {
    use MsgKind::*;
    let mut net = Net::pushing_always(2).node_1_reads_page_1();
    // Like water's molecules: node 0 writes the page in two phases, node 1 reads it in the
    // phase after the first of them only. Every push is used, chained or not; nothing is asked.
    // Once the first chain was read, the pushes are applied in place at their barriers.
    let t = net.log.len();
    for step in 0..4u8 {
        net.write(0, 1, 0, 10 * step + 2);
        net.barrier(); // pushed, unused through the next phase
        net.write(0, 1, 1, 10 * step + 3);
        net.barrier(); // pushed, chained to the previous push
        assert!(net.nodes[1].validates_locally(&[PageIdx(1)]), "step {step}: the chain completes the page");
        assert_eq!([net.read(1, 1, 0), net.read(1, 1, 1)], [10 * step + 2, 10 * step + 3]);
        net.barrier(); // nothing written: nothing pushed
    }
    assert_eq!(net.count(t, 1, 0, DiffRequest), 0);
    assert_eq!(net.count(t, 1, 0, Unsubscribe), 0);
    assert_eq!(net.count(t, 0, 1, DiffPush), 8);
    let st = net.nodes[1].stats();
    assert_eq!((st.pushes_used, st.pushes_wasted, st.pushes_chained, st.pushes_in_place), (8, 0, 1, 6));
}

#[test]
fn a_push_cuts_writable_pages_without_revoking_their_access() {
    let mut net = Net::new(2);
    net.write(0, 1, 0, 1);
    net.write(0, 2, 0, 1);
    net.barrier();
    // Node 1 reads both pages, so node 0 pushes their next diffs.
    assert_eq!((net.read(1, 1, 0), net.read(1, 2, 0)), (1, 1));
    // Page 2 is written in an interval a release closes, page 1 in the one the arrival closes.
    net.write(0, 2, 0, 2);
    net.nodes[0].request_acquire(LockId(0)).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Acquired(LockId(0))));
    net.nodes[0].request_release(LockId(0)).unwrap();
    net.settle();
    net.write(0, 1, 0, 2);
    let before = [1, 2].map(|p| net.nodes[0].mem().protection_changes(PageIdx(p)));
    let pushed = net.nodes[0].stats().diffs_pushed;
    net.barrier();
    assert_eq!(net.nodes[0].stats().diffs_pushed, pushed + 2);
    // The application waited in the barrier while the twins were cut: page 1, likely still
    // being written, keeps a renewed twin and its access untouched; page 2 ends read-only.
    let changes = [1, 2].map(|p| net.nodes[0].mem().protection_changes(PageIdx(p)) - before[p as usize - 1]);
    assert_eq!(changes, [0, 1], "protection changes of pages 1 and 2 at the push");
    assert_eq!(net.nodes[0].mem().access(PageIdx(1)), Access::ReadWrite);
    assert_eq!(net.nodes[0].mem().access(PageIdx(2)), Access::Read);
    assert_eq!((net.read(1, 1, 0), net.read(1, 2, 0)), (2, 2));
    // The renewed twin holds what was pushed: the next diff carries only the next change.
    net.write(0, 1, 1, 3);
    net.barrier();
    assert_eq!((net.read(1, 1, 0), net.read(1, 1, 1)), (2, 3));
}

#[test]
fn a_twin_renewed_when_served_is_noticed_at_a_release_only_if_its_page_changed() {
    let mut net = Net::new(2);
    net.write(0, 1, 0, 1);
    net.barrier();
    // Node 1 asks for page 1 while node 0's twin is fresh: node 0 renews the twin and leaves the
    // page writable.
    assert_eq!(net.read(1, 1, 0), 1);
    assert_eq!(net.nodes[0].mem().access(PageIdx(1)), Access::ReadWrite);
    let notices = net.nodes[0].stats().write_notices_made;
    // A critical section that does not touch the page: the release compares it with the twin
    // and makes no notice; the twin, equal to the page, stays for the next interval and the
    // page writable. A second such section drops the twin and write-protects the page.
    for access in [Access::ReadWrite, Access::Read] {
        net.nodes[0].request_acquire(LockId(0)).unwrap();
        net.settle();
        assert_eq!(net.done(0), Some(AppDone::Acquired(LockId(0))));
        net.nodes[0].request_release(LockId(0)).unwrap();
        net.settle();
        assert_eq!(net.nodes[0].stats().write_notices_made, notices, "no notice for an unwritten page");
        assert_eq!(net.nodes[0].mem().access(PageIdx(1)), access);
    }

    // Renewed again, then written inside the critical section: noticed, and still writable.
    net.write(0, 1, 0, 2);
    net.barrier();
    assert_eq!(net.read(1, 1, 0), 2);
    let notices = net.nodes[0].stats().write_notices_made;
    net.nodes[0].request_acquire(LockId(0)).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Acquired(LockId(0))));
    net.write(0, 1, 0, 3);
    net.nodes[0].request_release(LockId(0)).unwrap();
    net.settle();
    assert_eq!(net.nodes[0].stats().write_notices_made, notices + 1);
    assert_eq!(net.nodes[0].mem().access(PageIdx(1)), Access::ReadWrite);
    net.barrier();
    assert_eq!(net.read(1, 1, 0), 3);
}

#[test]
fn a_subscriber_that_would_get_more_than_the_push_limit_fetches_instead() {
    use super::push::PUSH_MAX_PAGES;
    use MsgKind::*;
    let many = PUSH_MAX_PAGES as u32 + 1;
    let mut net = Net::with_pages(2, many + 1);
    for p in 0..many {
        net.write(0, p, 0, 1);
    }
    net.barrier();
    for p in 0..many {
        assert_eq!(net.read(1, p, 0), 1); // node 1 subscribes to every page
    }
    // All of them change: too many to push; node 1 asks when it reads, as without pushes.
    for p in 0..many {
        net.write(0, p, 0, 2);
    }
    let t = net.log.len();
    net.barrier();
    assert_eq!(net.count(t, 0, 1, DiffPush), 0);
    for p in 0..many {
        assert_eq!(net.read(1, p, 0), 2);
    }
    assert_eq!(net.count(t, 1, 0, DiffRequest), many as usize, "one miss per page, as it reads them");
    // A few change: they are pushed.
    for p in 0..3 {
        net.write(0, p, 0, 3);
    }
    let (t, pushed) = (net.log.len(), net.nodes[0].stats().diffs_pushed);
    net.barrier();
    assert_eq!(net.count(t, 0, 1, DiffPush), 1);
    assert_eq!(net.nodes[0].stats().diffs_pushed - pushed, 3);
    let t = net.log.len();
    assert_eq!(net.read(1, 1, 0), 3);
    assert_eq!(net.log.len(), t, "no message for a pushed page");
    // Three change again, but the push may carry the diffs of one page only: the other two are
    // left out, and fetched when read.
    let last = net.nodes[0].page_meta(PageIdx(0)).diffs.last().unwrap();
    let wire = DiffWire { seq: last.seq, first_vt: last.first_vt.clone(), diff: last.diff.clone() };
    let one_page = super::page::wire_bytes([&DiffList::from_elem(wire, 1)]);
    net.nodes[0].cfg.limits.reply_bytes = one_page;
    net.nodes[0].cfg.push_skip = false; // written every epoch: a push would be skipped
    for p in 0..3 {
        net.write(0, p, 0, 4);
    }
    let (t, pushed) = (net.log.len(), net.nodes[0].stats().diffs_pushed);
    net.barrier();
    assert_eq!((net.count(t, 0, 1, DiffPush), net.nodes[0].stats().diffs_pushed - pushed), (1, 1));
    for p in 0..3 {
        assert_eq!(net.read(1, p, 0), 4);
    }
    assert_eq!(net.count(t, 1, 0, DiffRequest), 2, "pages 1 and 2, left out of the push");
}

#[test]
fn a_barrier_looks_only_at_subscribed_pages_that_changed() {
    let mut net = Net::with_pages(2, 40);
    for p in 0..40 {
        net.write(0, p, 0, 1);
    }
    net.barrier();
    for p in 0..40 {
        assert_eq!(net.read(1, p, 0), 1); // node 1 subscribes to all 40 pages
    }
    let before = net.nodes[0].push.examined;
    for _ in 0..5 {
        net.barrier();
    }
    assert_eq!(net.nodes[0].push.examined, before, "pages nobody wrote are not looked at");
    net.write(0, 7, 0, 2);
    net.barrier();
    assert_eq!(net.nodes[0].push.examined, before + 1, "one written page, one look");
    assert_eq!(net.read(1, 7, 0), 2);
}

/// Allocates `bytes` for node `i` (through node 0's allocator); returns the offset.
fn alloc(net: &mut Net, i: usize, bytes: u64, align: u64) -> u64 {
    net.nodes[i].request_alloc(bytes, align).unwrap();
    net.settle();
    match net.done(i) {
        Some(AppDone::Allocated(Ok(at))) => at,
        other => panic!("allocation answered {other:?}"),
    }
}

#[test]
fn barriers_back_the_heap_allocated_so_far_once_on_every_node() {
    let mut net = Net::with_pages(3, 8);
    let backed = |net: &Net, i: usize| -> Vec<u32> {
        (0..8).map(|p| net.nodes[i].mem().times_backed(PageIdx(p))).collect()
    };
    assert_eq!(alloc(&mut net, 2, 3 * PAGE as u64 + 1, 8), 0);
    // Node 0 writes page 1, so the others take the barrier with page 1 invalid.
    net.write(0, 1, 0, 7);
    net.barrier();
    for i in 0..3 {
        assert_eq!(backed(&net, i), [1, 1, 1, 1, 0, 0, 0, 0], "node {i}");
        let s = net.nodes[i].stats();
        assert_eq!((s.pages_backed, s.pages_backed_mapped), (4, if i == 0 { 4 } else { 3 }), "node {i}");
    }
    // Nothing new allocated: nothing more backed.
    net.barrier();
    assert!((0..3).all(|i| backed(&net, i) == [1, 1, 1, 1, 0, 0, 0, 0]));
    // Freed memory stays backed; a new allocation beyond it is backed at the next barrier only.
    net.nodes[1].request_free(0).unwrap();
    net.settle();
    assert_eq!(net.done(1), Some(AppDone::Freed(Ok(()))));
    assert_eq!(alloc(&mut net, 1, 6 * PAGE as u64, PAGE as u64), 0);
    assert!((0..3).all(|i| backed(&net, i) == [1, 1, 1, 1, 0, 0, 0, 0]));
    net.barrier();
    for i in 0..3 {
        assert_eq!(backed(&net, i), [1, 1, 1, 1, 1, 1, 0, 0], "node {i}");
        assert_eq!(net.nodes[i].stats().pages_backed, 6);
    }
    assert_eq!(net.read(2, 1, 0), 7, "backing changed no byte");
}

#[test]
fn a_release_naming_a_heap_end_past_the_heap_backs_only_the_heap() {
    let mut net = Net::with_pages(2, 8);
    net.nodes[1].request_barrier(BarrierId(0)).unwrap();
    let release = Message::BarrierRelease {
        barrier: BarrierId(0),
        intervals: vec![],
        gc: false,
        heap_end: u64::MAX,
        pushed_by: vec![],
    };
    net.nodes[1].handle_message(NodeId(0), release).unwrap();
    assert_eq!(net.done(1), None, "node 1 passes once it has backed the heap");
    assert!(net.nodes[1].has_deferred());
    net.nodes[1].run_deferred().unwrap();
    assert_eq!(net.done(1), Some(AppDone::BarrierPassed(BarrierId(0))));
    assert_eq!(net.nodes[1].stats().pages_backed, 8);
}

#[test]
fn nodes_back_the_heap_while_their_application_waits_and_a_manager_after_its_release() {
    use MsgKind::*;
    let mut net = Net::with_pages(2, 8);
    let backed = |net: &Net, i: usize| net.nodes[i].stats().pages_backed;
    // Node 0 backs its own allocation at once; node 1 when the distributed handle comes.
    assert_eq!(alloc(&mut net, 0, 3 * PAGE as u64, 8), 0);
    assert_eq!((backed(&net, 0), backed(&net, 1)), (3, 0));
    net.nodes[0].request_distribute(Some(vec![1])).unwrap();
    net.nodes[1].request_distribute(None).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Distributed(vec![1])));
    assert_eq!(net.done(1), Some(AppDone::Distributed(vec![1])));
    assert_eq!((backed(&net, 0), backed(&net, 1)), (3, 3));
    // Node 1 allocates through node 0, whose application may be running meanwhile: node 0 only
    // notes the new end, and backs it at the next barrier.
    assert_eq!(alloc(&mut net, 1, 2 * PAGE as u64, PAGE as u64), 3 * PAGE as u64);
    assert_eq!((backed(&net, 0), backed(&net, 1)), (3, 3));
    // Node 1 arrives first; node 0, the manager, last: its release leaves before it backs, and
    // it passes only once it has.
    net.nodes[1].request_barrier(BarrierId(0)).unwrap();
    assert!(!net.nodes[1].has_deferred(), "node 1 has backed all it heard of");
    let (_, arrive) = net.nodes[1].poll_transmit().expect("the arrival");
    assert_eq!(arrive.kind(), BarrierArrive);
    net.nodes[0].handle_message(NodeId(1), arrive).unwrap();
    net.nodes[0].request_barrier(BarrierId(0)).unwrap();
    let (_, release) = net.nodes[0].poll_transmit().expect("the release");
    assert!(matches!(&release, Message::BarrierRelease { heap_end, .. } if *heap_end == 5 * PAGE as u64));
    assert_eq!((backed(&net, 0), net.done(0)), (3, None), "the manager backs after its release left");
    net.nodes[0].run_deferred().unwrap();
    assert_eq!((backed(&net, 0), net.done(0)), (5, Some(AppDone::BarrierPassed(BarrierId(0)))));
    // Node 1 backs what the release names before it passes.
    net.nodes[1].handle_message(NodeId(0), release).unwrap();
    assert_eq!((backed(&net, 1), net.done(1)), (3, None));
    net.nodes[1].run_deferred().unwrap();
    assert_eq!((backed(&net, 1), net.done(1)), (5, Some(AppDone::BarrierPassed(BarrierId(0)))));
}

#[test]
fn a_push_leaves_after_the_arrival_and_its_receiver_passes_only_with_it() {
    use MsgKind::*;
    let mut net = Net::new(2);
    net.write(1, 1, 0, 1);
    net.barrier();
    assert_eq!(net.read(0, 1, 0), 1, "node 0 reads page 1 and subscribes to node 1's diffs");
    net.write(1, 1, 0, 2);
    let t = net.log.len();
    // Node 0 (the manager) arrives first and waits; node 1 arrives last. Its arrival, naming
    // node 0 as the node it pushes to, goes before the push, which it has not even cut yet.
    net.nodes[0].request_barrier(BarrierId(0)).unwrap();
    net.nodes[1].request_barrier(BarrierId(0)).unwrap();
    assert!(net.nodes[1].has_deferred());
    let (to, arrive) = net.nodes[1].poll_transmit().expect("the arrival");
    assert!(matches!(&arrive, Message::BarrierArrive { pushes, .. } if *pushes == [NodeId(0)]), "{arrive:?}");
    assert!(net.nodes[1].poll_transmit().is_none(), "nothing but the arrival before the deferred work");
    // The manager completes the barrier and releases node 1, but does not pass it: node 1's push
    // is still to come.
    net.nodes[to.idx()].handle_message(NodeId(1), arrive).unwrap();
    assert_eq!(net.done(0), None, "the manager waits for the push announced to it");
    let (_, release) = net.nodes[0].poll_transmit().expect("the release");
    assert!(matches!(&release, Message::BarrierRelease { pushed_by, .. } if pushed_by.is_empty()));
    // One notice (page 1): the manager applied it at once.
    assert!(!net.nodes[0].has_deferred());
    assert_eq!(net.nodes[0].mem().access(PageIdx(1)), Access::None);
    // Node 1 takes the release before its own push is out: it waits for that too.
    net.nodes[1].handle_message(NodeId(0), release).unwrap();
    assert_eq!(net.done(1), None, "node 1 passes only once its push is sent");
    net.nodes[1].run_deferred().unwrap();
    assert_eq!(net.done(1), Some(AppDone::BarrierPassed(BarrierId(0))));
    let (_, push) = net.nodes[1].poll_transmit().expect("the push");
    assert_eq!(push.kind(), DiffPush);
    net.nodes[0].handle_message(NodeId(1), push).unwrap();
    assert_eq!(net.done(0), Some(AppDone::BarrierPassed(BarrierId(0))));
    // The push stands in for the request.
    let t2 = net.log.len();
    assert_eq!(net.read(0, 1, 0), 2);
    assert_eq!(net.log.len(), t2, "no message for a pushed page");
    assert_eq!(net.log.len(), t, "(the manual deliveries above were not logged)");
}

#[test]
fn a_stale_page_declared_overwritten_is_not_fetched_and_its_diff_is_whole() {
    use MsgKind::*;
    let mut net = Net::new(3);
    net.write(1, 1, 0, 7);
    net.write(1, 1, 1, 8);
    net.barrier();
    // Node 0 holds node 1's notice for page 1 and declares it overwrites the page: nothing is
    // fetched, and the page is writable at once.
    let t = net.log.len();
    let changes = net.nodes[0].mem().protection_changes(PageIdx(1));
    net.nodes[0].request_overwrite(&[PageIdx(1)], &[PageIdx(1)]).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Validated));
    assert_eq!(net.count(t, 0, 1, DiffRequest), 0, "no fetch for an overwritten page");
    assert_eq!(net.nodes[0].mem().access(PageIdx(1)), Access::ReadWrite);
    // Mapped writable in one change, not made readable first.
    assert_eq!(net.nodes[0].mem().protection_changes(PageIdx(1)) - changes, 1);
    assert_eq!(net.nodes[0].stats().pages_overwritten, 1);
    // Every byte is written; byte 0 with the value node 0's stale copy (and twin) holds.
    for b in 0..PAGE {
        net.write(0, 1, b, if b == 0 { 0 } else { 9 });
    }
    net.barrier();
    // The diff is the whole page: byte 0 reaches readers though it equals node 0's twin.
    assert_eq!((net.read(2, 1, 0), net.read(2, 1, 1)), (0, 9));
    assert_eq!((net.read(1, 1, 0), net.read(1, 1, 1)), (0, 9));
    // Node 1 writes again, after the overwrite; node 0's next fetch brings node 1's old diff
    // too (node 0 never applied a diff of node 1), which the overwrite superseded: skipped.
    net.write(1, 1, 2, 5);
    net.barrier();
    assert_eq!((net.read(0, 1, 0), net.read(0, 1, 1), net.read(0, 1, 2)), (0, 9, 5));
    assert_eq!(net.nodes[0].stats().diffs_superseded, 1);
    assert_eq!((net.read(2, 1, 0), net.read(2, 1, 2)), (0, 5));
}

#[test]
fn a_valid_page_declared_overwritten_is_diffed_whole() {
    let mut net = Net::new(2);
    net.write(1, 1, 0, 7);
    net.barrier();
    assert_eq!(net.read(0, 1, 0), 7);
    net.nodes[0].request_overwrite(&[PageIdx(1), PageIdx(2)], &[PageIdx(1)]).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Validated));
    assert_eq!(net.nodes[0].stats().pages_overwritten, 0, "page 1 was up to date: nothing superseded");
    // Page 1's twin would never be read: it was not copied (the simulated memory holds none,
    // and panics if one is read); page 2's was.
    assert_eq!((net.nodes[0].stats().twins_ahead, net.nodes[0].stats().twins_skipped), (2, 1));
    // Every byte written, byte 0 with the value it had.
    for b in 0..PAGE {
        net.write(0, 1, b, if b == 0 { 7 } else { 3 });
    }
    let made = net.nodes[0].stats().diff_bytes_created;
    net.barrier();
    assert_eq!((net.read(1, 1, 0), net.read(1, 1, 1)), (7, 3));
    // Node 0's diff of page 1 is the whole page: a two-byte run header, then the 64 bytes.
    assert_eq!(net.nodes[0].stats().diff_bytes_created - made, PAGE as u64 + 2);
}

#[test]
fn a_page_declared_overwritten_is_not_renewed_when_served() {
    let mut net = Net::new(2);
    // Node 0 overwrites page 1 through a declaring view and writes page 2 plainly, in the same
    // interval; node 1 reads both in the next one, while both twins are recent.
    net.nodes[0].request_overwrite(&[PageIdx(1), PageIdx(2)], &[PageIdx(1)]).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Validated));
    for b in 0..PAGE {
        net.write(0, 1, b, 4);
    }
    net.write(0, 2, 0, 6);
    net.barrier();
    assert_eq!((net.read(1, 1, 0), net.read(1, 2, 0)), (4, 6));
    // The output page lost its twin and write access; the other kept both (renewed).
    let stats = net.nodes[0].stats();
    assert_eq!((stats.renewals_skipped, stats.twins_renewed), (1, 1));
    assert_eq!(net.nodes[0].mem().access(PageIdx(1)), Access::Read);
    assert_eq!(net.nodes[0].mem().access(PageIdx(2)), Access::ReadWrite);
    // Written again, page 1 takes a fresh twin, and its next diff is an ordinary one.
    net.write(0, 1, 0, 5);
    assert_eq!(net.nodes[0].mem().access(PageIdx(1)), Access::ReadWrite);
    let made = net.nodes[0].stats().diff_bytes_created;
    net.barrier();
    assert_eq!((net.read(1, 1, 0), net.read(1, 1, 1)), (5, 4));
    assert!(net.nodes[0].stats().diff_bytes_created - made < PAGE as u64, "a one-byte change");
}

#[test]
fn a_page_of_the_write_view_served_with_an_old_twin_is_renewed_not_frozen() {
    // Node 0 writes pages 1 and 3 before the sort, and keeps their twins while it closes a
    // later interval (page 5 written): old twins, nobody having asked for them. It then opens a
    // write view of pages 1 and 2 (page 2 is stale, so the view fetches) and runs; node 1 reads
    // pages 1 and 3 meanwhile.
    let mut net = Net::with_pages(2, 8);
    net.write(0, 1, 0, 1);
    net.write(0, 3, 0, 3);
    net.write(1, 2, 0, 2);
    net.barrier();
    net.write(0, 5, 0, 5);
    net.barrier();
    net.nodes[0].request_validate(&[PageIdx(1), PageIdx(2)], true).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Validated));
    let renewed = net.nodes[0].stats().twins_renewed;
    for (p, value) in [(1, 1), (3, 3)] {
        let changes = net.nodes[0].mem().protection_changes(PageIdx(p));
        assert_eq!(net.read(1, p, 0), value);
        let frozen = net.nodes[0].mem().protection_changes(PageIdx(p)) > changes;
        let access = net.nodes[0].mem().access(PageIdx(p));
        if p == 1 {
            // In the view: renewed from a snapshot, still writable, never frozen.
            assert!(!frozen, "page 1 was frozen");
            assert_eq!(access, Access::ReadWrite);
        } else {
            // Outside it, an old twin: the page is frozen and stays read-only.
            assert!(frozen, "page 3 was not frozen");
            assert_eq!(access, Access::Read);
        }
    }
    assert_eq!(net.nodes[0].stats().twins_renewed, renewed + 1);
    // Node 0's next write to page 1 takes no fault; its diff goes to node 1 at the barrier.
    let faults = net.nodes[0].stats().write_faults;
    net.write(0, 1, 1, 7);
    assert_eq!(net.nodes[0].stats().write_faults, faults);
    net.barrier();
    assert_eq!((net.read(1, 1, 0), net.read(1, 1, 1)), (1, 7));
}

#[test]
fn pages_served_with_their_twins_renewed_are_never_frozen() {
    let mut net = Net::new(3);
    net.write(0, 1, 0, 1);
    net.write(0, 3, 0, 4);
    net.write(2, 2, 0, 2);
    net.barrier();
    // Node 1 asks node 0 for page `p`, which node 0 wrote and which is still writable; returns
    // the protection changes the serve made at node 0.
    let serve = |net: &mut Net, p: PageIdx| {
        net.nodes[1].handle_fault(p, false).unwrap();
        let (to, ask) = net.nodes[1].poll_transmit().expect("node 1's request");
        assert_eq!(to, NodeId(0));
        let changes = net.nodes[0].mem().protection_changes(p);
        net.nodes[0].handle_message(NodeId(1), ask).unwrap();
        net.settle();
        assert_eq!(net.done(1), Some(AppDone::FaultResolved(p)));
        assert_eq!(net.nodes[0].mem().access(p), Access::ReadWrite, "renewed");
        net.nodes[0].mem().protection_changes(p) - changes
    };
    // Node 0 waits in a view of page 2 (its request to node 2 held back), no mutable view
    // open, so nothing writes: page 1's twin is cut and renewed in place.
    net.nodes[0].set_mutable_views_open(false);
    net.nodes[0].request_validate(&[PageIdx(2)], false).unwrap();
    let (to, held) = net.nodes[0].poll_transmit().expect("node 0's request");
    assert_eq!((to, held.kind()), (NodeId(2), MsgKind::DiffRequest));
    assert_eq!(serve(&mut net, PageIdx(1)), 0, "no freeze while the application waits");
    assert_eq!(net.nodes[1].mem().app_read(PageIdx(1))[0], 1);
    net.nodes[2].handle_message(NodeId(0), held).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Validated));
    assert_eq!(net.read(0, 2, 0), 2);
    // Served while node 0's application runs: cut from a snapshot, which becomes the twin;
    // the page is never frozen.
    assert_eq!(serve(&mut net, PageIdx(3)), 0, "no freeze for a page whose twin is renewed");
    assert_eq!(net.nodes[1].mem().app_read(PageIdx(3))[0], 4);
    assert_eq!(net.nodes[0].stats().renewals_unfrozen, 1);
    // The twins renewed hold what was served: the next diffs bring the next changes, written
    // without a fault.
    let faults = net.nodes[0].stats().write_faults;
    net.write(0, 1, 1, 3);
    net.write(0, 3, 1, 5);
    assert_eq!(net.nodes[0].stats().write_faults, faults);
    net.barrier();
    assert_eq!((net.read(1, 1, 0), net.read(1, 1, 1)), (1, 3));
    assert_eq!((net.read(1, 3, 0), net.read(1, 3, 1)), (4, 5));
    // Renewed at both serves, and at the barrier's pushes of both pages to node 1.
    assert_eq!(net.nodes[0].stats().twins_renewed, 4);
}

#[test]
fn a_page_served_while_the_application_waits_in_a_view_with_a_mutable_view_open_keeps_a_store_made_meanwhile()
{
    // Node 0's application waits in a view of page 2 with a mutable view of page 1 open, whose
    // slice another thread writes meanwhile (safe code can hand it to a scoped thread). Node 1
    // asks for page 1 then: reading it in place would lose a store landing between its diff and
    // its renewed twin. It is cut from a snapshot instead, the store landing during the copy
    // and unseen by it, and reaches node 1 in the next interval's diff.
    let mut net = Net::new(3);
    net.write(0, 1, 0, 1);
    net.write(2, 2, 0, 2);
    net.barrier();
    // Unsaid (`Node::set_mutable_views_open`), a mutable view is taken to be open.
    net.nodes[0].request_validate(&[PageIdx(2)], false).unwrap();
    let (to, held) = net.nodes[0].poll_transmit().expect("node 0's request");
    assert_eq!((to, held.kind()), (NodeId(2), MsgKind::DiffRequest));
    net.nodes[1].handle_fault(PageIdx(1), false).unwrap();
    let (to, ask) = net.nodes[1].poll_transmit().expect("node 1's request");
    assert_eq!(to, NodeId(0));
    let changes = net.nodes[0].mem().protection_changes(PageIdx(1));
    let mem = net.nodes[0].mem_mut();
    mem.set_others_writing(true);
    mem.arm_store(MidStore { page: PageIdx(1), offset: 1, bytes: vec![9], lands: true, seen: false });
    net.nodes[0].handle_message(NodeId(1), ask).unwrap();
    let mem = net.nodes[0].mem_mut();
    mem.set_others_writing(false);
    assert_eq!(mem.take_store_ran(), Some(StoreRan::DuringSnapshot));
    assert_eq!(net.nodes[0].stats().renewals_unfrozen, 1);
    assert_eq!(net.nodes[0].mem().protection_changes(PageIdx(1)), changes, "never frozen");
    assert_eq!(net.nodes[0].mem().access(PageIdx(1)), Access::ReadWrite);
    net.settle();
    assert_eq!(net.done(1), Some(AppDone::FaultResolved(PageIdx(1))));
    assert_eq!(net.nodes[1].mem().app_read(PageIdx(1))[..2], [1, 0], "served without the store");
    net.nodes[2].handle_message(NodeId(0), held).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Validated));
    net.barrier();
    assert_eq!((net.read(1, 1, 0), net.read(1, 1, 1)), (1, 9), "the store is not lost");
}

#[test]
fn twinned_pages_among_the_pages_notices_name_are_revoked_in_the_same_call() {
    // Node 1 writes pages 1-6; node 0 writes other bytes of pages 1 and 6 (radix sort's pages
    // at each end of a run of the other node's). At the barrier node 0 cuts its twins of pages
    // 1 and 6 and invalidates 2-5: one call for all six, where no push is announced.
    let mut net = Net::with_pages(2, 8);
    for p in 1..=6 {
        assert_eq!(net.read(0, p, 0), 0);
    }
    for p in 1..=6 {
        net.write(1, p, 0, 7);
    }
    net.write(0, 1, 1, 8);
    net.write(0, 6, 1, 9);
    let calls = net.nodes[0].mem().invalidating_calls();
    net.barrier();
    assert_eq!(net.nodes[0].mem().invalidating_calls() - calls, 1);
    assert_eq!(net.nodes[0].stats().invalidations, 4, "pages 2-5; pages 1 and 6 were cut");
    for p in 1..=6 {
        assert_eq!(net.nodes[0].mem().access(PageIdx(p)), Access::None, "page {p}");
        assert_eq!(net.read(0, p, 0), 7);
        assert_eq!(net.read(1, p, 0), 7);
    }
    assert_eq!((net.read(0, 1, 1), net.read(1, 1, 1)), (8, 8));
    assert_eq!((net.read(0, 6, 1), net.read(1, 6, 1)), (9, 9));
}

#[test]
fn pages_invalidated_around_an_invalid_one_take_one_call() {
    let mut net = Net::with_pages(2, 8);
    for p in [1, 2, 3, 6] {
        net.write(1, p, 0, 1);
    }
    net.barrier();
    // Node 0 reads pages 1, 3 and 6 again; page 2 stays invalid.
    for p in [1, 3, 6] {
        assert_eq!(net.read(0, p, 0), 1);
    }
    for p in [1, 2, 3, 6] {
        net.write(1, p, 0, 2);
    }
    let calls = net.nodes[0].mem().invalidating_calls();
    let unchanged = net.nodes[0].mem().protection_changes(PageIdx(2));
    net.barrier();
    // Pages 1 and 3 in one call that covers page 2 (already invalid: no change); page 6 alone.
    assert_eq!(net.nodes[0].mem().invalidating_calls() - calls, 2);
    assert_eq!(net.nodes[0].mem().protection_changes(PageIdx(2)), unchanged);
    for p in [1, 2, 3, 6] {
        assert_eq!(net.nodes[0].mem().access(PageIdx(p)), Access::None, "page {p}");
        assert_eq!(net.read(0, p, 0), 2);
    }
    assert_eq!(net.nodes[0].mem().access(PageIdx(4)), Access::Read, "page 4 untouched");
}

#[test]
fn the_manager_applies_many_notices_of_a_release_after_sending_it() {
    let pages = super::barrier::DEFER_NOTICES_MIN as u32;
    let mut net = Net::with_pages(2, pages + 1);
    for p in 0..pages {
        net.write(1, p, 0, 5);
    }
    // Node 1 arrives first, the manager last.
    net.nodes[1].request_barrier(BarrierId(0)).unwrap();
    let (_, arrive) = net.nodes[1].poll_transmit().expect("the arrival");
    net.nodes[0].handle_message(NodeId(1), arrive).unwrap();
    net.nodes[0].request_barrier(BarrierId(0)).unwrap();
    let (_, release) = net.nodes[0].poll_transmit().expect("the release");
    // Node 1's notices are logged (the release is cut from the log) but not applied yet: the
    // pages are still valid at the manager, which has not passed.
    assert_eq!(net.nodes[0].mem().access(PageIdx(2)), Access::Read);
    assert_eq!((net.nodes[0].stats().invalidations, net.done(0)), (0, None));
    assert!(net.nodes[0].has_deferred());
    net.nodes[0].run_deferred().unwrap();
    assert_eq!(net.nodes[0].mem().access(PageIdx(2)), Access::None);
    assert_eq!(net.nodes[0].stats().invalidations, u64::from(pages));
    assert_eq!(net.done(0), Some(AppDone::BarrierPassed(BarrierId(0))));
    net.nodes[1].handle_message(NodeId(0), release).unwrap();
    assert_eq!(net.done(1), Some(AppDone::BarrierPassed(BarrierId(0))));
    net.settle();
    assert_eq!(net.read(0, 2, 0), 5);
    // One page fewer, and the manager applies them at once.
    for p in 1..pages {
        net.write(1, p, 0, 6);
    }
    net.nodes[1].request_barrier(BarrierId(0)).unwrap();
    let (_, arrive) = net.nodes[1].poll_transmit().expect("the arrival");
    net.nodes[0].handle_message(NodeId(1), arrive).unwrap();
    let before = net.nodes[0].stats().invalidations;
    net.nodes[0].request_barrier(BarrierId(0)).unwrap();
    assert!(!net.nodes[0].has_deferred());
    // Page 2, the only one read since, is invalid already.
    assert_eq!(net.nodes[0].stats().invalidations - before, 1);
    assert_eq!(net.nodes[0].mem().access(PageIdx(2)), Access::None);
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::BarrierPassed(BarrierId(0))));
    assert_eq!(net.done(1), Some(AppDone::BarrierPassed(BarrierId(0))));
}

#[test]
fn a_release_or_arrival_naming_a_bad_pusher_is_an_error() {
    let mut net = Net::new(2);
    net.nodes[1].request_barrier(BarrierId(0)).unwrap();
    let release = |pushed_by| Message::BarrierRelease {
        barrier: BarrierId(0),
        intervals: vec![],
        gc: false,
        heap_end: 0,
        pushed_by,
    };
    for bad in [NodeId(1), NodeId(7)] {
        let e = net.nodes[1].handle_message(NodeId(0), release(vec![bad])).unwrap_err().to_string();
        assert!(e.contains(&format!("push from {bad}")), "{e}");
    }
    let e = net.nodes[1].handle_message(NodeId(0), release(vec![NodeId(0); 2])).unwrap_err().to_string();
    assert!(e.contains("naming a pusher twice"), "{e}");
    let arrive = Message::BarrierArrive {
        barrier: BarrierId(0),
        vt: VectorTime::zero(2),
        intervals: vec![],
        gc: false,
        pushes: vec![NodeId(9)],
    };
    let e = net.nodes[0].handle_message(NodeId(1), arrive).unwrap_err().to_string();
    assert!(e.contains("push to node 9") || e.contains("push to 9"), "{e}");
}

/// An arrival's interval records are checked when it arrives, and a bad one is its sender's
/// error: checked only when the last node arrived, it was blamed on the manager, and the
/// episode's other arrivals were lost with it.
#[test]
fn an_arrival_with_a_bad_interval_record_is_its_senders_error() {
    let record = |node: u16, index, entries, page| {
        let mut vt = VectorTime::zero(entries);
        if usize::from(node) < entries {
            vt.set(NodeId(node), index);
        }
        IntervalRecord { node: NodeId(node), index, vt, pages: vec![PageIdx(page)], locks: vec![] }
    };
    let mut own_entry = record(1, 1, 3, 0);
    own_entry.vt.set(NodeId(1), 2);
    let mut unsorted = record(1, 1, 3, 2);
    unsorted.pages.push(PageIdx(1));
    let arrive = |rec| Message::BarrierArrive {
        barrier: BarrierId(0),
        vt: VectorTime::zero(3),
        intervals: vec![rec],
        gc: false,
        pushes: vec![],
    };
    let cases = [
        (record(1, 1, 2, 0), "unexpected interval record of node 1 with 2 vt entries from node 1"),
        (record(1, 1, 3, 1_000_000), "node 1 named page 1000000, but the heap has 4 pages"),
        (record(1, 5, 3, 0), "node 1 sent interval 5 of node 1 while we know only up to 0"),
        (record(2, 1, 3, 0), "unexpected arrival carrying an interval of node 2 from node 1"),
        (own_entry, "interval record node 1.1: its own vt entry is 2"),
        (unsorted, "interval record node 1.1: pages not ascending (page 2 then page 1)"),
    ];
    for (rec, named) in cases {
        let mut net = Net::new(3);
        let e = net.nodes[0].handle_message(NodeId(1), arrive(rec)).unwrap_err().to_string();
        assert!(e.contains(named), "{e}");
    }
    // A good record passes, and the barrier completes with the others' arrivals.
    let mut net = Net::new(3);
    net.nodes[0].handle_message(NodeId(1), arrive(record(1, 1, 3, 0))).unwrap();
}

/// A ping of a node the job does not have is the caller's error, naming it (a one-node job
/// pinging node 1 panicked on the message it could not send).
#[test]
fn a_ping_of_a_node_outside_the_job_is_an_error() {
    for n in [1, 2] {
        let mut net = Net::new(n);
        let e = net.nodes[0].request_ping(NodeId(n)).unwrap_err();
        assert_eq!(e.to_string(), format!("node {n} is out of range: this job has {n} nodes (ids 0..{n})"));
        assert!(!net.nodes[0].has_transmit());
    }
}

/// Allocation and free replies and the exit's release come from node 0 alone: from another node
/// they are errors naming it, not completions of the caller's request with made-up values (a
/// stray release let node 0 leave its exit early, and the last arrival then panicked).
#[test]
fn replies_only_node_0_sends_are_errors_from_anybody_else() {
    let mut net = Net::new(3);
    net.nodes[1].request_exit().unwrap();
    let e = net.nodes[1].handle_message(NodeId(2), Message::ExitRelease).unwrap_err().to_string();
    assert!(e.contains("unexpected exit release (only node 0 sends one) from node 2"), "{e}");
    net.nodes[0].request_exit().unwrap();
    let e = net.nodes[0].handle_message(NodeId(1), Message::ExitRelease).unwrap_err().to_string();
    assert!(e.contains("exit release (only node 0 sends one) from node 1"), "{e}");
    let mut net = Net::new(3);
    net.nodes[1].request_alloc(64, 8).unwrap();
    for reply in [Message::AllocReply { result: Ok(0) }, Message::FreeReply { result: Ok(()) }] {
        let e = net.nodes[1].handle_message(NodeId(2), reply).unwrap_err().to_string();
        assert!(e.contains("reply (only node 0 sends one) from node 2"), "{e}");
    }
    net.settle();
    assert!(matches!(net.done(1), Some(AppDone::Allocated(Ok(_)))));
}

/// Node 1 writes byte 0 of each of `npages` pages (page `p` gets `p + 1`), the nodes pass a
/// barrier, and node 0 (which now holds notices for all of them) streams views of 2+ pages.
fn streaming_setup(npages: u32) -> Net {
    let mut net = Net::with_pages(2, npages);
    for p in 0..npages {
        net.write(1, p, 0, p as u8 + 1);
    }
    net.barrier();
    net.nodes[0].cfg.stream_min_pages = 2;
    net
}

/// Node 0 takes a view of pages `0..npages`, which streams: it completes at once.
fn stream_view(net: &mut Net, npages: u32, write: bool) -> Vec<PageIdx> {
    let pages: Vec<PageIdx> = (0..npages).map(PageIdx).collect();
    net.nodes[0].request_validate(&pages, write).unwrap();
    assert_eq!(net.done(0), Some(AppDone::Validated), "returns before any answer");
    pages
}

/// The pages of the diff requests node 0 has queued, each request as (first, end).
fn queued_requests(node: &Node<VecMemory>) -> Vec<(u32, u32)> {
    (node.outbox.iter())
        .filter_map(|(_, m)| match m {
            Message::DiffRequest { asks } => Some((asks[0].page.0, asks[asks.len() - 1].page.0 + 1)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_streaming_view_returns_before_its_pages_and_asks_from_both_ends() {
    let mut net = streaming_setup(100);
    let pages = stream_view(&mut net, 100, false);
    assert!(net.nodes[0].streaming());
    assert!(pages.iter().all(|&p| net.nodes[0].mem().access(p) == Access::None));
    assert_eq!(queued_requests(&net.nodes[0]), vec![(0, 32), (68, 100), (32, 68)]);
    net.settle();
    assert!(!net.nodes[0].streaming());
    for p in 0..100 {
        assert_eq!(net.nodes[0].mem().access(PageIdx(p)), Access::Read);
        assert_eq!(net.read(0, p, 0), p as u8 + 1);
    }
    let s = net.nodes[0].stats();
    assert_eq!((s.streams, s.streamed_pages, s.diff_requests_sent), (1, 100, 3));
}

#[test]
fn a_view_below_the_threshold_or_under_a_lock_does_not_stream() {
    let mut net = streaming_setup(4);
    net.nodes[0].cfg.stream_min_pages = 3;
    net.nodes[0].request_validate(&[PageIdx(0), PageIdx(1)], false).unwrap();
    assert_eq!(net.done(0), None, "two pages: a plain view, which waits");
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Validated));
    net.nodes[0].request_acquire(LockId(0)).unwrap();
    assert_eq!(net.done(0), Some(AppDone::Acquired(LockId(0))));
    net.nodes[0].request_validate(&[PageIdx(2), PageIdx(3)], false).unwrap();
    assert_eq!(net.done(0), None, "under a lock: a plain view");
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Validated));
    assert_eq!(net.nodes[0].stats().streams, 0);
}

#[test]
fn a_fault_on_a_page_on_its_way_waits_for_it_and_asks_nothing_more() {
    let mut net = streaming_setup(100);
    stream_view(&mut net, 100, false);
    let since = net.log.len();
    net.nodes[0].handle_fault(PageIdx(99), false).unwrap();
    assert_eq!(queued_requests(&net.nodes[0]).len(), 3, "no request of its own");
    assert_eq!(net.done(0), None);
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::FaultResolved(PageIdx(99))));
    assert_eq!(net.count(since, 0, 1, MsgKind::DiffRequest), 3);
    assert_eq!(net.nodes[0].mem().app_read(PageIdx(99))[0], 100);
    assert_eq!(net.nodes[0].stats().stream_waits, 1);
}

#[test]
fn synchronization_waits_until_streamed_pages_are_in() {
    let mut net = streaming_setup(8);
    net.nodes[0].request_settle().unwrap();
    assert_eq!(net.done(0), Some(AppDone::Settled), "nothing on its way: at once");
    stream_view(&mut net, 8, false);
    net.nodes[0].request_settle().unwrap();
    assert_eq!(net.done(0), None);
    assert!(net.nodes[0].request_barrier(BarrierId(0)).is_err(), "busy settling");
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Settled));
    assert_eq!(net.nodes[0].stats().settles, 1);
    net.barrier();
}

#[test]
#[should_panic(expected = "settle first")]
fn notices_taken_in_while_pages_are_on_their_way_are_a_bug() {
    let mut net = streaming_setup(8);
    // Node 1 writes page 0 again, in a new twin (node 0 asks for the old one's diff first).
    assert_eq!(net.read(0, 0, 0), 1);
    net.write(1, 0, 1, 9);
    net.nodes[1].request_barrier(BarrierId(0)).unwrap();
    let (_, arrive) = net.nodes[1].poll_transmit().expect("the arrival");
    net.nodes[0].handle_message(NodeId(1), arrive).unwrap();
    stream_view(&mut net, 8, false);
    // Node 0 completes the barrier as its manager, taking in node 1's notice for page 0.
    let _ = net.nodes[0].request_barrier(BarrierId(0));
}

#[test]
fn a_streaming_mutable_view_twins_its_pages_as_they_arrive() {
    let mut net = streaming_setup(8);
    let pages = stream_view(&mut net, 8, true);
    net.settle();
    for &p in &pages {
        assert_eq!(net.nodes[0].mem().access(p), Access::ReadWrite, "{p}");
        assert!(net.nodes[0].page_meta(p).twin.is_some(), "{p}");
    }
    net.nodes[0].mem_mut().app_write(PageIdx(5))[1] = 42;
    net.barrier();
    assert_eq!((net.read(1, 5, 0), net.read(1, 5, 1)), (6, 42));
    // Twins made ahead are noticed only where the page changed: node 1 keeps page 4.
    assert_eq!(net.nodes[0].stats().write_notices_made, 1);
    assert_ne!(net.nodes[1].mem().access(PageIdx(4)), Access::None);
}

#[test]
fn a_mutable_view_maps_a_fetched_page_writable_in_one_change() {
    let mut net = Net::new(2);
    net.write(1, 2, 0, 7);
    net.barrier();
    assert_eq!(net.nodes[0].mem().access(PageIdx(2)), Access::None);
    let before = net.nodes[0].mem().protection_changes(PageIdx(2));
    net.nodes[0].request_validate(&[PageIdx(2), PageIdx(3)], true).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Validated));
    // Twinned while unmapped, then made writable: not made readable first, whose write
    // protection, cleared in place, leaves userfaultfd's entry read-only until a kernel fault.
    assert_eq!(net.nodes[0].mem().access(PageIdx(2)), Access::ReadWrite);
    assert!(net.nodes[0].page_meta(PageIdx(2)).twin.is_some());
    assert_eq!(net.nodes[0].mem().protection_changes(PageIdx(2)) - before, 1);
    assert_eq!(net.nodes[0].mem().app_read(PageIdx(2))[0], 7);
}

#[test]
fn a_page_copy_served_while_the_application_runs_sends_the_handlers_twin() {
    // Node 0's fault handler twins page 1 and makes it writable on the application's first write
    // (the fast path), and the application writes; the node hears of that twin only at its next
    // step. A page request comes first. The copy must be the twin, the base of the diff node 0
    // will make, not the page with the write in progress, and the page must stay writable: made
    // read-only again, its next write would twin it anew over the old twin, and the first write
    // would be in no diff.
    let mut net = Net::new(2);
    let p = PageIdx(1);
    let mem = net.nodes[0].mem_mut();
    mem.make_twin(p);
    mem.set_access(p, 1, Access::ReadWrite);
    mem.app_write(p)[10] = 0x11;
    net.nodes[0].handle_message(NodeId(1), Message::PageRequest { pages: vec![p] }).expect("served");
    let Some((to, Message::PageReply { pages })) = net.nodes[0].poll_transmit() else {
        panic!("no page reply")
    };
    assert_eq!((to, pages.len()), (NodeId(1), 1));
    assert_eq!(pages[0].bytes[10], 0, "the twin was sent, not the write in progress");
    assert_eq!(net.nodes[0].mem().access(p), Access::ReadWrite, "still writable");
    // The drain of the handler's twins that follows finds the page as the handler left it.
    net.nodes[0].handle_twin_made(p);
    net.nodes[0].request_barrier(BarrierId(0)).unwrap();
    assert!(net.nodes[0].stats().write_notices_made >= 1, "the write is noticed");
}

#[test]
fn an_exit_while_another_node_waits_at_a_barrier_is_an_error_naming_both() {
    // Node 0 (the manager) waits at barrier 1 when node 1 calls exit: they would wait for each
    // other forever.
    let mut net = Net::new(2);
    net.nodes[0].request_barrier(BarrierId(1)).unwrap();
    net.nodes[1].request_exit().unwrap();
    let Some((to, msg)) = net.nodes[1].poll_transmit() else { panic!("no exit arrival") };
    assert_eq!(to, NodeId(0));
    let err = net.nodes[0].handle_message(NodeId(1), msg).expect_err("a mismatch");
    assert_eq!(
        err,
        ProtocolError::ExitAtBarrier { exited: NodeId(1), waiting: NodeId(0), barrier: BarrierId(1) }
    );
    assert!(err.to_string().contains("node 1 called exit while node 0 waits at barrier 1"), "{err}");

    // The other way round: node 1 has called exit when node 0 arrives.
    let mut net = Net::new(2);
    net.nodes[1].request_exit().unwrap();
    net.settle();
    let err = net.nodes[0].request_barrier(BarrierId(0)).expect_err("a mismatch");
    assert_eq!(
        err,
        ProtocolError::ExitAtBarrier { exited: NodeId(1), waiting: NodeId(0), barrier: BarrierId(0) }
    );
    // Barrier 0 is also a collection's.
    assert!(err.to_string().contains("waits at barrier 0 (or in Tmk::collect, which is barrier 0)"), "{err}");
}

#[test]
fn a_distribute_node_0_will_not_answer_is_an_error_naming_the_waiting_node() {
    // Node 1 waits for a value; node 0 distributes it: nothing wrong, and the barrier after is
    // passed.
    let mut net = Net::new(2);
    net.nodes[1].request_distribute(None).unwrap();
    net.settle();
    net.nodes[0].request_distribute(Some(vec![7])).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Distributed(vec![7])));
    assert_eq!(net.done(1), Some(AppDone::Distributed(vec![7])));
    net.barrier();

    // Node 1 waits for a second value; node 0 goes into a barrier instead.
    net.nodes[1].request_distribute(None).unwrap();
    net.settle();
    let err = net.nodes[0].request_barrier(BarrierId(1)).expect_err("unanswered");
    let want =
        ProtocolError::DistributeUnanswered { waiting: NodeId(1), value: 1, root: "at barrier 1".into() };
    assert_eq!(err, want);
    assert!(
        err.to_string().starts_with("node 1 waits for distributed value 1 while node 0 is at barrier 1"),
        "{err}"
    );

    // The other way round: node 0 is in exit when node 1's wait comes.
    let mut net = Net::new(2);
    net.nodes[0].request_exit().unwrap();
    net.nodes[1].request_distribute(None).unwrap();
    let Some((_, wait)) = net.nodes[1].poll_transmit() else { panic!("no wait sent") };
    let err = net.nodes[0].handle_message(NodeId(1), wait).expect_err("unanswered");
    assert_eq!(
        err,
        ProtocolError::DistributeUnanswered { waiting: NodeId(1), value: 0, root: "in exit".into() }
    );
}

/// A value no frame would hold is refused on node 0, nothing sent; the largest that is allowed
/// goes, and the job goes on.
#[test]
fn a_value_too_large_to_distribute_is_refused_naming_its_size() {
    let mut net = Net::new(2);
    let err = net.nodes[0].request_distribute(Some(vec![0; MAX_DISTRIBUTE + 1])).expect_err("too large");
    assert_eq!(err, ProtocolError::DistributeTooLarge { bytes: MAX_DISTRIBUTE + 1, max: MAX_DISTRIBUTE });
    assert!(err.to_string().contains(&format!("distribute of {} bytes", MAX_DISTRIBUTE + 1)), "{err}");
    assert!(net.nodes[0].poll_transmit().is_none());
    net.nodes[0].request_distribute(Some(vec![3; MAX_DISTRIBUTE])).unwrap();
    net.nodes[1].request_distribute(None).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Distributed(vec![3; MAX_DISTRIBUTE])));
    assert_eq!(net.done(1), Some(AppDone::Distributed(vec![3; MAX_DISTRIBUTE])));
    net.barrier();
}

#[test]
fn a_distributed_value_nobody_takes_is_warned_of_at_exit() {
    let mut net = Net::new(2);
    net.nodes[0].request_distribute(Some(vec![1])).unwrap();
    net.nodes[0].request_distribute(Some(vec![2])).unwrap();
    net.settle();
    net.nodes[1].request_distribute(None).unwrap();
    assert_eq!(net.done(1), Some(AppDone::Distributed(vec![1])));
    net.nodes[1].request_exit().unwrap();
    let warning = net.nodes[1].poll_warning().expect("a warning");
    assert!(warning.starts_with("exiting with 1 distributed value from value 1 on never taken"), "{warning}");
}

#[test]
fn a_zero_collection_threshold_is_not_a_reason_to_warn_of_lock_only_phases() {
    // 0 asks every barrier to collect; a few lock rounds between barriers are no cause for the
    // overdue warning, which counts from 1 MiB then. (A 1-byte threshold warns at once.)
    for (threshold, warns) in [(0, false), (1, true)] {
        let mut net = Net::new(2);
        for node in &mut net.nodes {
            node.cfg.gc_threshold = threshold;
        }
        for round in 0..20 {
            for i in 0..2 {
                net.nodes[i].request_acquire(LockId(0)).unwrap();
                net.settle();
                assert_eq!(net.done(i), Some(AppDone::Acquired(LockId(0))));
                net.write(i, 1 + i as u32, round, 1);
                net.nodes[i].request_release(LockId(0)).unwrap();
                net.settle();
            }
        }
        let warned = net.nodes.iter_mut().any(|n| n.poll_warning().is_some());
        assert_eq!(warned, warns, "threshold {threshold}");
    }
}

#[test]
fn a_distribute_wait_from_a_node_past_a_barrier_node_0_still_leaves_is_no_error() {
    distribute_wait_while_node_0_leaves_barrier_0(2);
}

#[test]
fn a_distribute_wait_while_node_0_leaves_a_barrier_others_left_for_the_next_is_no_error() {
    // On three nodes, node 2 also passes barrier 0 and arrives at barrier 1 (it distributes
    // after it) while node 0 is still on its way out of barrier 0: an open episode is not node
    // 0 waiting in it.
    distribute_wait_while_node_0_leaves_barrier_0(3);
}

/// Node 1 allocates, so node 0 has heap to back at the barrier: deferred work that holds its
/// own passing after it released the others. Node 1 (and node 2, to arrive at barrier 1 at
/// once, if there are three nodes) passes, and waits for a distributed value while node 0 is
/// still in the barrier it released: not a mismatch, node 0 distributes the value once out.
fn distribute_wait_while_node_0_leaves_barrier_0(n: u16) {
    let mut net = Net::new(n);
    net.nodes[1].request_alloc(2 * PAGE as u64, PAGE as u64).unwrap();
    net.settle();
    assert!(matches!(net.done(1), Some(AppDone::Allocated(Ok(_)))));
    let deliver = |net: &mut Net, from: usize| {
        while let Some((to, msg)) = net.nodes[from].poll_transmit() {
            net.nodes[to.idx()].handle_message(NodeId(from as u16), msg).expect("no protocol error");
        }
    };
    let others = 1..usize::from(n);
    for i in others.clone() {
        net.nodes[i].request_barrier(BarrierId(0)).unwrap();
        deliver(&mut net, i);
    }
    net.nodes[0].request_barrier(BarrierId(0)).unwrap();
    assert!(net.nodes[0].has_deferred(), "node 0 backs the heap before it passes");
    deliver(&mut net, 0);
    for i in others {
        net.nodes[i].run_deferred().unwrap();
        assert_eq!(net.done(i), Some(AppDone::BarrierPassed(BarrierId(0))));
    }
    if n > 2 {
        net.nodes[2].request_barrier(BarrierId(1)).unwrap();
        deliver(&mut net, 2);
    }
    assert_eq!(net.done(0), None, "node 0 is still in barrier 0");
    net.nodes[1].request_distribute(None).unwrap();
    deliver(&mut net, 1);
    net.nodes[0].run_deferred().unwrap();
    assert_eq!(net.done(0), Some(AppDone::BarrierPassed(BarrierId(0))));
    net.nodes[0].request_distribute(Some(vec![5])).unwrap();
    net.settle();
    assert_eq!(net.done(1), Some(AppDone::Distributed(vec![5])));
}

/// Node `i` acquires lock `l`, messages delivered until it holds it.
fn acquire(net: &mut Net, i: usize, l: u32) {
    net.nodes[i].request_acquire(LockId(l)).unwrap();
    net.settle();
    assert_eq!(net.done(i), Some(AppDone::Acquired(LockId(l))));
}

/// Node `i` releases lock `l`.
fn release(net: &mut Net, i: usize, l: u32) {
    net.nodes[i].request_release(LockId(l)).unwrap();
    net.settle();
}

#[test]
fn a_copy_of_a_dropped_page_is_not_overlaid_with_an_older_diff_it_holds() {
    // Nodes 1 and 2 drop their copies of page 0 at a collection (node 0 wrote it). Node 0 then
    // writes byte 0 of a two-byte value under locks 0 and 1 (its diff holds that byte only), and
    // node 1 takes lock 1: node 1 knows of that write. Node 2 takes lock 0 and writes both bytes,
    // and node 0 takes lock 0 back, applying node 2's diff. Node 1 then reads the value, racing
    // with node 2's write: either write's two bytes may come back. The copy node 0 serves holds
    // node 2's bytes, and its own older diff, which node 1 asks for too: applied over the copy,
    // that diff gave byte 0 from node 0's write and byte 1 from node 2's, a value nobody wrote.
    let mut net = Net::new(3);
    net.collect_after_node_0_writes(0);
    acquire(&mut net, 0, 0);
    acquire(&mut net, 0, 1);
    net.write(0, 0, 0, 0xDD);
    release(&mut net, 0, 1);
    release(&mut net, 0, 0);
    acquire(&mut net, 1, 1);
    acquire(&mut net, 2, 0);
    assert_eq!(net.read(2, 0, 0), 0xDD);
    net.write(2, 0, 0, 0x0E);
    net.write(2, 0, 1, 0x01);
    release(&mut net, 2, 0);
    acquire(&mut net, 0, 0);
    assert_eq!(net.nodes[0].mem().app_read(PageIdx(0))[..2], [0x0E, 0x01], "node 0 has node 2's write");
    let got = [net.read(1, 0, 0), net.read(1, 0, 1)];
    assert!(got == [0xDD, 0x00] || got == [0x0E, 0x01], "node 1 read {got:x?}, half of each write");
}

#[test]
fn a_page_copy_that_does_not_say_which_diffs_it_holds_of_every_node_is_refused() {
    let mut net = Net::new(2);
    net.collect_after_node_0_writes(0);
    let p = PageIdx(0);
    net.nodes[1].handle_fault(p, false).unwrap();
    let holds = vec![Held::default(); 3];
    let copy = PageCopy { page: p, bytes: serde_bytes::ByteBuf::from(vec![0; PAGE]), holds };
    let err = net.nodes[1].handle_message(NodeId(0), Message::PageReply { pages: vec![copy] }).unwrap_err();
    assert!(
        err.to_string().contains("diffs held of 3 nodes, the job has 2"),
        "the error names the lengths: {err}"
    );
}

#[test]
fn a_copy_of_a_dropped_page_overwritten_whole_since_is_not_overlaid_with_what_it_superseded() {
    // Nodes 1 and 2 drop their copies of page 1 at a collection (node 0 wrote it). Node 1 writes
    // it; node 0, stale, overwrites it whole without fetching node 1's diff (superseded). Node 2
    // then reads it: the copy from node 0 holds the overwrite, and node 1's diff must not be
    // applied over it (it was, once the copy was taken as holding node 0's diff but not as
    // superseding node 1's).
    let mut net = Net::new(3);
    let p = PageIdx(1);
    net.collect_after_node_0_writes(1);
    assert_eq!(net.read(1, 1, 0), 1);
    net.write(1, 1, 0, 177);
    net.barrier();
    assert_eq!(net.nodes[0].mem().access(p), Access::None, "node 0 is stale");
    net.nodes[0].request_overwrite(&[p], &[p]).unwrap();
    net.settle();
    assert_eq!(net.done(0), Some(AppDone::Validated));
    assert_eq!(net.nodes[0].stats().pages_overwritten, 1, "node 1's diff superseded, not fetched");
    for b in 0..PAGE {
        net.write(0, 1, b, 250);
    }
    net.barrier();
    assert_eq!(net.read(2, 1, 0), 250, "node 1's older write came back over node 0's overwrite");
}

#[test]
fn a_collection_drops_the_notice_table_a_page_copy_made() {
    // Node 0 has cut a diff (of page 1, which node 1 reads), so the copies it serves hold one.
    // Node 1 drops page 0 at a collection and then reads it: the whole copy comes with the diffs
    // it holds, noted in a table of page 0 that no write notice made. Nobody writes page 0 again,
    // and the next collection must drop that table all the same (it outlived the collection,
    // and the accounting, once only pages that notices named were cleared).
    let mut net = Net::new(2).node_1_reads_page_1();
    net.collect_after_node_0_writes(0);
    assert_eq!(net.read(1, 0, 0), 1);
    assert!(!net.nodes[1].page_meta(PageIdx(0)).writers.is_empty(), "the copy's holds are noted");
    net.nodes.iter_mut().for_each(|n| n.cfg.gc_threshold = 0);
    net.barrier();
    assert_eq!(net.nodes[1].stats().collections, 2);
    assert!(net.nodes[1].page_meta(PageIdx(0)).writers.is_empty(), "the table outlived the collection");
}

#[test]
fn a_lock_taken_again_and_again_while_nothing_is_written_is_noted_once_in_the_interval() {
    // Node 0 polls lock 0 (its token is here) a thousand times, reading only: no interval is
    // recorded meanwhile. Its next write under the lock records one interval, naming the lock
    // once (it named it once per acquire, a thousand and one times).
    let mut net = Net::new(2);
    for _ in 0..1000 {
        assert!(net.nodes[0].acquire_if_here(LockId(0)).unwrap());
        net.nodes[0].release_here(LockId(0)).unwrap();
    }
    acquire(&mut net, 0, 0);
    acquire(&mut net, 0, 2);
    net.write(0, 1, 0, 7);
    release(&mut net, 0, 2);
    release(&mut net, 0, 0);
    let node = &net.nodes[0];
    let rec = node.log().get(NodeId(0), node.vt().get(NodeId(0))).expect("the write's interval");
    assert_eq!(rec.locks, [LockId(0), LockId(2)]);
}

/// A push of node 0's for barrier episode `episode`, naming `pages` pages from `first`, each
/// with `diffs` diffs of `bytes` bytes.
fn made_up_push(episode: u64, first: u32, pages: u32, diffs: u32, bytes: usize) -> Message {
    let pages = (first..first + pages)
        .map(|p| {
            let list = (1..=diffs)
                .map(|seq| DiffWire {
                    seq: seq.into(),
                    first_vt: VectorTime::from_entries(vec![1, 0]),
                    diff: Diff::whole(&vec![seq as u8; bytes]),
                })
                .collect();
            UnaskedDiffs { page: PageIdx(p), after_seq: 0, diffs: list }
        })
        .collect();
    Message::DiffPush { episode, upto: 1, pages }
}

#[test]
fn a_peer_pushes_once_an_episode_and_no_more_than_a_push_holds() {
    // A writer pushes to a subscriber once a barrier episode, at most `reply_bytes` of diffs,
    // and the subscriber passes an episode only with its announced pushes in. Pushes beyond
    // that (a faulty or hostile peer's) are refused by name instead of held until a barrier
    // (a lock-only phase has none): 64 pushes of 64 pages of 100 diffs each were all kept.
    let mut net = Net::with_pages(2, 4096);
    let refused = |net: &mut Net, msg: Message, why: &str| {
        let e = net.nodes[1].handle_message(NodeId(0), msg).expect_err(why).to_string();
        assert!(e.contains(why), "{e}");
    };
    net.nodes[1].handle_message(NodeId(0), made_up_push(1, 0, 64, 100, PAGE)).expect("the first push");
    refused(&mut net, made_up_push(1, 64, 64, 100, PAGE), "a second push of one episode");
    refused(&mut net, made_up_push(2, 0, 65, 1, PAGE), "larger than any node pushes");
    let many = (super::page::REPLY_BYTES / 64 / PAGE + 1) as u32;
    refused(&mut net, made_up_push(2, 0, 64, many, PAGE), "larger than any node pushes");
    refused(&mut net, made_up_push(3, 0, 1, 1, PAGE), "cannot have reached");
    // One push of episode 2 is fine; passing episode 1 (node 0 announced no push to the
    // barrier, so nothing waits for one) makes a push of it late, which no node sends.
    net.nodes[1].handle_message(NodeId(0), made_up_push(2, 0, 1, 1, PAGE)).expect("one of episode 2");
    let mut net = Net::new(2);
    net.barrier();
    refused(&mut net, made_up_push(1, 0, 1, 1, PAGE), "passed without it");
}

#[test]
fn a_collection_counts_every_push_of_an_unused_chain_wasted() {
    // Two pushes of page 1, chained and unused, are both wasted when a collection drops them,
    // as everywhere else (the collection counted the chain as one push).
    let mut net = Net::pushing_always(2).node_1_reads_page_1();
    net.write(0, 1, 0, 2);
    net.barrier();
    net.write(0, 1, 1, 3);
    net.barrier();
    let st = net.nodes[1].stats().clone();
    assert_eq!((st.pushes_chained, st.pushes_used, st.pushes_wasted), (1, 0, 0));
    net.nodes.iter_mut().for_each(|n| n.cfg.gc_threshold = 0);
    net.barrier();
    let st = net.nodes[1].stats();
    assert_eq!(st.collections, 1);
    assert_eq!((st.pushes_used, st.pushes_wasted), (0, 2), "two pushes received, neither used");
}

#[test]
fn an_unsubscribe_that_comes_before_the_planned_push_leaves_stands() {
    // Node 0 plans a push of page 1 to node 1 at its arrival; node 1's unsubscribe arrives
    // before the push is cut and sent. The push still goes (it was announced), but node 1 stays
    // unsubscribed (sending the push subscribed it again).
    let mut net = Net::pushing_always(2).node_1_reads_page_1();
    net.write(0, 1, 0, 5);
    net.nodes[0].request_barrier(BarrierId(0)).unwrap();
    assert!(net.nodes[0].has_deferred(), "a push is planned");
    net.nodes[0].handle_message(NodeId(1), Message::Unsubscribe { pages: vec![PageIdx(1)] }).unwrap();
    assert_eq!(net.nodes[0].subscription(PageIdx(1), NodeId(1)), None);
    net.nodes[0].run_deferred().unwrap();
    let sent: Vec<(NodeId, Message)> = std::iter::from_fn(|| net.nodes[0].poll_transmit()).collect();
    assert!(
        sent.iter().any(|(to, m)| *to == NodeId(1) && matches!(m, Message::DiffPush { .. })),
        "the announced push goes"
    );
    assert_eq!(net.nodes[0].subscription(PageIdx(1), NodeId(1)), None, "subscribed again");
}

#[test]
fn a_peer_asking_again_and_again_grows_no_list_of_pages_to_push() {
    // Node 0 holds a diff of page 1 that node 1 fetched. Asks for page 1 up to an older interval
    // (nothing to serve) each noted the page for the next push, in a list only a barrier
    // emptied: 1,000 requests of 256 asks left 256,000 entries. The pages are a set now.
    let mut net = Net::new(2).node_1_reads_page_1();
    let ask = DiffAsk { page: PageIdx(1), want: 0, after_seq: 0 };
    let most = Limits::default().pages_per_request;
    let before = net.nodes[0].cut_since_push_len();
    for _ in 0..1000 {
        let request = Message::DiffRequest { asks: vec![ask.clone(); most] };
        net.nodes[0].handle_message(NodeId(1), request).unwrap();
        while net.nodes[0].poll_transmit().is_some() {}
    }
    assert!(
        net.nodes[0].cut_since_push_len() <= before + 1,
        "{} pages noted",
        net.nodes[0].cut_since_push_len()
    );
}

#[test]
fn a_wish_naming_a_lock_twice_is_refused() {
    // A node wishes for each lock once, so a wish is no longer than the job's locks; one of a
    // million entries was taken and held with its request until the lock's release.
    let mut net = Net::new(2);
    net.nodes[0].request_acquire(LockId(0)).unwrap();
    assert_eq!(net.done(0), Some(AppDone::Acquired(LockId(0))));
    let request = |wished: &[Wished]| Message::LockRequest {
        lock: LockId(0),
        seq: 1,
        vt: VectorTime::zero(2),
        wish: Wish::new(wished),
    };
    let twice: Vec<Wished> = (0..1_000_000u32).map(|i| Wished { lock: LockId(1), place: i }).collect();
    let e = net.nodes[0].handle_message(NodeId(1), request(&twice)).unwrap_err().to_string();
    assert!(e.contains("a wish of 1000000 locks naming lock 1 twice"), "{e}");
    let once: Vec<Wished> = (1..8).map(|l| Wished { lock: LockId(l), place: 2 * l }).collect();
    net.nodes[0].handle_message(NodeId(1), request(&once)).expect("each lock once, at any places");
}

#[test]
fn a_diff_larger_than_any_of_a_page_is_refused() {
    // Nodes 0 and 2 both wrote page 1, and node 1 asks both. Node 0's reply carries a 32 MiB
    // diff of the 64-byte page: it was held, with the frame it came in, until node 2 answered,
    // and found malformed only when applied.
    let mut net = Net::new(3);
    net.write(0, 1, 0, 1);
    net.write(2, 1, 1, 2);
    net.barrier();
    net.nodes[1].handle_fault(PageIdx(1), false).unwrap();
    while net.nodes[1].poll_transmit().is_some() {}
    let diff = |bytes: usize| {
        let wire = DiffWire {
            seq: 1,
            first_vt: VectorTime::from_entries(vec![1, 0, 0]),
            diff: Diff::whole(&vec![0; bytes]),
        };
        Message::DiffReply {
            pages: vec![PageDiffs { page: PageIdx(1), diffs: DiffList::from_elem(wire, 1) }],
            continued: false,
        }
    };
    let e = net.nodes[1].handle_message(NodeId(0), diff(32 << 20)).unwrap_err().to_string();
    assert!(e.contains("diff of page 1 of 33554437 bytes (a diff of a page takes at most 192)"), "{e}");
    net.nodes[1].handle_message(NodeId(0), diff(PAGE)).expect("a whole page's diff");
}
