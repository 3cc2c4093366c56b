//! Interval records sent ahead: a grant, arrival or release whose records are too many for one
//! message sends their head first, in [`Message::Intervals`] parts.
//!
//! A lock grant carries every record the acquirer lacks, a barrier arrival every record of its
//! node's since its last, and a barrier release every record its node lacks. Those lists have
//! no bound: a node that takes a lock after hundreds of thousands of other nodes' intervals with
//! no barrier between (a lock-only program), or a barrier after as many lock hand-offs, is owed
//! all of them, and they did not fit the 64 MiB frame, so the job failed. Now a message whose
//! records take more than `limits.record_bytes` ([`RECORD_BYTES`]) keeps the tail of its list
//! that fits, and the head goes ahead of it on the same link in parts of at most that size,
//! oldest first: the receiver gets the very list the sender had.
//!
//! Invariants:
//! - the parts and their message are queued back to back for one peer, in order, and a link
//!   delivers in order, so a peer's parts belong to the next grant, arrival or release it
//!   sends; the receiver holds them (`RecordsAhead`) and puts them in front of that
//!   message's own records, giving exactly the list the sender had cut;
//! - every part and the records left in the message are non-empty and, but for a single record
//!   larger than the limit, at most `limits.record_bytes` by `record_wire_bytes` (a bound);
//! - a receiver holds at most [`Accounting::parts_limit`] per node of the job of records sent
//!   ahead of one message (their size in memory, as the consistency data counts it: a release
//!   may bring every other node's records); past it the peer is refused by name.

use super::error::ProtocolError;
use super::gc::Accounting;
use super::ids::NodeId;
use super::interval::IntervalRecord;
#[cfg(doc)]
use super::msg::Message;

/// Most bytes of interval records one message carries (`record_wire_bytes`); the rest goes
/// ahead. 8 MiB: an eighth of a frame, and far more than any application in the suite sends at
/// once (water's grants, the most, carry a few hundred bytes of records).
pub const RECORD_BYTES: usize = 8 << 20;

/// Bytes `r` takes in a message, at most: postcard writes each integer as a varint of at most
/// 5 bytes (3 for a node id) and each list's length before it.
pub(crate) fn record_wire_bytes(r: &IntervalRecord) -> usize {
    RECORD_WIRE_BYTES_LEAST + 5 * (r.vt.len() + r.pages.len() + r.locks.len())
}

/// [`record_wire_bytes`] of a record with empty lists, the least it gives.
const RECORD_WIRE_BYTES_LEAST: usize = 3 + 5 + 3 * 5;

/// Most records one list of a message holds: a list of more than one record is cut to
/// [`RECORD_BYTES`] by the records' wire bound (`record_wire_bytes`), which gives each at least
/// `RECORD_WIRE_BYTES_LEAST` (23 bytes). A decoder refuses a longer list by its length (`cautious.rs`):
/// a record takes ~100 bytes in memory and as few as 5 on the wire.
pub const MOST_RECORDS: usize = RECORD_BYTES / RECORD_WIRE_BYTES_LEAST + 1;

/// Cuts the head off `records` until what is left takes at most `budget` bytes, and returns the
/// head in parts of at most `budget` bytes each, in order (each holds at least one record,
/// and `records` keeps at least its last). Nothing is cut from a list that fits.
pub(crate) fn cut_ahead(records: &mut Vec<IntervalRecord>, budget: usize) -> Vec<Vec<IntervalRecord>> {
    // Most lists fit (every grant of every application in the suite): no allocation for them.
    if records.iter().map(record_wire_bytes).sum::<usize>() <= budget {
        return Vec::new();
    }
    let sizes: Vec<usize> = records.iter().map(record_wire_bytes).collect();
    // What the message keeps: the longest tail that fits, at least one record.
    let (mut keep_from, mut tail) = (records.len() - 1, sizes[records.len() - 1]);
    while keep_from > 0 && tail + sizes[keep_from - 1] <= budget {
        keep_from -= 1;
        tail += sizes[keep_from];
    }
    let kept = records.split_off(keep_from);
    let head = std::mem::replace(records, kept);
    let mut parts: Vec<Vec<IntervalRecord>> = Vec::new();
    let mut bytes = 0;
    for (r, size) in head.into_iter().zip(sizes) {
        match parts.last_mut() {
            Some(part) if bytes + size <= budget => part.push(r),
            _ => {
                parts.push(vec![r]);
                bytes = 0;
            }
        }
        bytes += size;
    }
    parts
}

/// Records peers sent ahead of their next grant, arrival or release, per peer.
#[derive(Debug)]
pub(crate) struct RecordsAhead {
    /// Per peer: its parts so far, in order, and their size in memory.
    held: Vec<(Vec<IntervalRecord>, u64)>,
}

impl RecordsAhead {
    /// Nothing held from any of `n` nodes.
    pub fn new(n: usize) -> RecordsAhead {
        RecordsAhead { held: vec![(Vec::new(), 0); n] }
    }

    /// Holds a part from `from`, refusing an empty one and one that would take what is held
    /// from it past `limit` bytes (in memory, [`Accounting::record_size`]).
    pub fn hold(&mut self, from: NodeId, part: Vec<IntervalRecord>, limit: u64) -> Result<(), ProtocolError> {
        if part.is_empty() {
            return Err(ProtocolError::Unexpected { from, what: "interval records sent ahead: none".into() });
        }
        let (records, bytes) = &mut self.held[from.idx()];
        *bytes += part.iter().map(Accounting::record_size).sum::<u64>();
        if *bytes > limit {
            return Err(ProtocolError::Unexpected {
                from,
                what: format!(
                    "{bytes} bytes of interval records sent ahead of one message, over the {limit} \
                     this node holds (its TMK_CONSISTENCY_LIMIT, but at least 64 MiB)"
                ),
            });
        }
        records.extend(part);
        Ok(())
    }

    /// `records` (a grant's, arrival's or release's from `from`) with what `from` sent ahead of
    /// them in front.
    pub fn complete(&mut self, from: NodeId, records: Vec<IntervalRecord>) -> Vec<IntervalRecord> {
        match self.held.get_mut(from.idx()) {
            Some((ahead, bytes)) if !ahead.is_empty() => {
                *bytes = 0;
                let mut all = std::mem::take(ahead);
                all.extend(records);
                all
            }
            _ => records,
        }
    }

    /// Records held from any peer.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.held.iter().map(|(r, _)| r.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ids::PageIdx;
    use crate::protocol::vtime::VectorTime;

    /// Record `index` of node 0 naming `pages` pages.
    fn rec(index: u32, pages: u32) -> IntervalRecord {
        IntervalRecord {
            node: NodeId(0),
            index,
            vt: VectorTime::from_entries(vec![index, 0]),
            pages: (0..pages).map(PageIdx).collect(),
            locks: vec![],
        }
    }

    fn indices(recs: &[IntervalRecord]) -> Vec<u32> {
        recs.iter().map(|r| r.index).collect()
    }

    #[test]
    fn the_wire_bound_holds_for_the_largest_values() {
        let mut r = rec(u32::MAX, 3);
        r.node = NodeId(u16::MAX);
        r.vt = VectorTime::from_entries(vec![u32::MAX; 4]);
        r.pages = vec![PageIdx(u32::MAX - 2), PageIdx(u32::MAX - 1), PageIdx(u32::MAX)];
        r.locks = vec![crate::protocol::LockId(u32::MAX)];
        let encoded = postcard::to_allocvec(&r).unwrap();
        assert!(encoded.len() <= record_wire_bytes(&r), "{} > {}", encoded.len(), record_wire_bytes(&r));
    }

    #[test]
    fn the_bound_on_records_held_is_the_consistency_limit_but_at_least_64_mib() {
        assert_eq!(Accounting::parts_limit(1 << 20), 64 << 20);
        assert_eq!(Accounting::parts_limit(u64::MAX), u64::MAX);
    }

    /// The decoders' cap on a list's records ([`MOST_RECORDS`]) holds for what a sender sends:
    /// no list of more than one record holds more than the budget over the least bound.
    #[test]
    fn no_list_a_sender_cuts_holds_more_records_than_the_cap() {
        let least = RECORD_WIRE_BYTES_LEAST;
        let mut empty = rec(1, 0);
        empty.vt = VectorTime::from_entries(vec![]);
        assert_eq!(record_wire_bytes(&empty), least);
        for budget in [least, 3 * least + 7, 50 * least] {
            let mut recs: Vec<_> = (1..=500).map(|_| empty.clone()).collect();
            let parts = cut_ahead(&mut recs, budget);
            let most = parts.iter().chain([&recs]).map(Vec::len).max().unwrap();
            assert!(most <= budget / least + 1, "budget {budget}: a list of {most}");
        }
    }

    #[test]
    fn a_list_that_fits_is_not_cut() {
        let mut recs = vec![rec(1, 2), rec(2, 2)];
        let budget = recs.iter().map(record_wire_bytes).sum();
        assert!(cut_ahead(&mut recs, budget).is_empty());
        assert_eq!(indices(&recs), [1, 2]);
    }

    #[test]
    fn the_tail_that_fits_stays_and_the_head_goes_in_parts_of_the_budget() {
        let one = record_wire_bytes(&rec(1, 2));
        for (budget, parts, kept) in [
            (2 * one, vec![vec![1, 2], vec![3, 4]], vec![5, 6]),
            (3 * one, vec![vec![1, 2, 3]], vec![4, 5, 6]),
            (one, vec![vec![1], vec![2], vec![3], vec![4], vec![5]], vec![6]),
            (1, vec![vec![1], vec![2], vec![3], vec![4], vec![5]], vec![6]),
        ] {
            let mut recs: Vec<_> = (1..=6).map(|i| rec(i, 2)).collect();
            let cut: Vec<Vec<u32>> = cut_ahead(&mut recs, budget).iter().map(|p| indices(p)).collect();
            assert_eq!((cut, indices(&recs)), (parts, kept), "budget {budget}");
        }
    }

    #[test]
    fn held_parts_go_in_front_of_their_message_once() {
        let mut ahead = RecordsAhead::new(3);
        ahead.hold(NodeId(2), vec![rec(1, 1)], u64::MAX).unwrap();
        ahead.hold(NodeId(2), vec![rec(2, 1), rec(3, 1)], u64::MAX).unwrap();
        assert_eq!(indices(&ahead.complete(NodeId(1), vec![rec(9, 1)])), [9], "another peer's");
        assert_eq!(indices(&ahead.complete(NodeId(2), vec![rec(4, 1)])), [1, 2, 3, 4]);
        assert_eq!(indices(&ahead.complete(NodeId(2), vec![rec(5, 1)])), [5]);
        assert_eq!(ahead.len(), 0);
    }

    #[test]
    fn an_empty_part_and_parts_past_the_limit_are_refused_naming_the_peer() {
        let mut ahead = RecordsAhead::new(3);
        let err = ahead.hold(NodeId(1), vec![], u64::MAX).unwrap_err();
        assert!(matches!(err, ProtocolError::Unexpected { from: NodeId(1), .. }), "{err}");
        let limit = 3 * Accounting::record_size(&rec(1, 1));
        ahead.hold(NodeId(1), vec![rec(1, 1), rec(2, 1)], limit).unwrap();
        let err = ahead.hold(NodeId(1), vec![rec(3, 1), rec(4, 1)], limit).unwrap_err();
        assert!(err.to_string().contains("TMK_CONSISTENCY_LIMIT"), "{err}");
        // What a completed message took is no longer counted.
        ahead.complete(NodeId(1), vec![]);
        ahead.hold(NodeId(1), vec![rec(3, 1), rec(4, 1)], limit).unwrap();
    }
}
