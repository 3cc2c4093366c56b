//! Streaming views: a view that fetches many pages returns as soon as its requests are out, and
//! the application computes on what it has while the rest arrive.
//!
//! A plain view ([`Node::request_validate`]) returns once every invalid page it covers is up to
//! date. Where a node takes a large range another node wrote (a quicksort worker popping a range
//! the other node partitioned), that leaves its CPU idle while the writer diffs page after page:
//! half of a 1,024-page fetch, on this project's machine. A streaming view fills that time with
//! the application's own work on the pages already there.
//!
//! - **Starting.** A validation that would fetch at least [`NodeConfig::stream_min_pages`](super::NodeConfig::stream_min_pages)
//!   pages, with no lock held, *streams*: it completes at once ([`AppDone::Validated`]) and its
//!   pages' misses (`MissFor::Stream`) are asked for as usual (one request per writer, split
//!   so that replies stay small), but the requests take pages alternately from both ends of the
//!   pages fetched from each writer (`from_both_ends`): a sweep from the start and a partition
//!   from both ends then each find their first pages early. Pages still on their way stay
//!   invalid: the application cannot touch them. The runtime lets only views of one range
//!   stream: a view declared in several parts (a transpose's comb of column blocks) is read
//!   across all its parts at once, in an order no request order could follow, and waits for
//!   them all (`Node::request_view`'s `stream`).
//! - **Arriving.** A page whose writers have all answered is brought up to date as in any miss,
//!   then made readable or, for a mutable view, twinned and made writable (a twin made ahead,
//!   noticed at the interval's end only if the page changed), in runs for all the pages one
//!   message completes (`Node::map_arrived`).
//! - **Waiting.** A fault on a page on its way sends nothing: the application waits for that
//!   page's miss, which becomes the fault's (`Node::fault`).
//! - **Settling.** Write notices must not be taken in while pages are on their way: a miss
//!   completes with the answers to what it asked, which a newer notice would leave stale. So a
//!   synchronization that can bring notices, or that leaves the job (an acquire of a token held
//!   elsewhere, a barrier, a collection, an allocation, a distribute, an exit, a ping), first
//!   waits until nothing is on its way ([`Node::request_settle`]); the runtime does this for the
//!   application. A release, or an acquire of a token held here, brings no notice and goes on.
//!
//! # Invariants
//! - `in_flight` is the number of misses started by streaming views (their `streamed` flag) that
//!   have not completed; a page in one of them is invalid.
//! - While `in_flight > 0`, no write notice of another node is applied (checked in
//!   `Node::apply_notices`): every streamed page that arrives is up to date with every notice
//!   the node holds, as a fetched page is in a plain view.
//! - `arrived` and `arrived_write` hold pages whose streamed miss completed during the step in
//!   progress; they are mapped (and emptied) before the step returns.
//!
//! Why the application sees what LRC promises: a streamed page is fetched against the notices
//! held when the view was taken, and none arrive until the view's pages are all in (settling),
//! so it reads what a plain view would have given it, only later.

use super::ProtocolError;
use super::ids::PageIdx;
use super::memory::{Access, PageMemory};
use super::node::{AppDone, Node, Pending};

/// The state of this node's streaming views.
#[derive(Debug, Default)]
pub(crate) struct StreamState {
    /// Streamed misses not yet complete.
    pub in_flight: usize,
    /// Pages whose streamed miss completed in this step: to make readable.
    pub arrived: Vec<PageIdx>,
    /// Pages whose streamed miss (of a mutable view) completed in this step: to twin and make
    /// writable.
    pub arrived_write: Vec<PageIdx>,
}

/// `items` cut into requests taken alternately from the front and the back, each end's
/// requests ramping as a plain fetch's do (`page.rs`: from `FIRST_REQUEST_PAGES`, doubling) up
/// to `max`; each request lists
/// its items in ascending order. Every item is in exactly one request.
pub(crate) fn from_both_ends<T>(items: &[T], first: usize, max: usize) -> Vec<&[T]> {
    let (mut lo, mut hi) = (0, items.len());
    let max = max.max(1);
    let (mut front, mut back) = (first.clamp(1, max), first.clamp(1, max));
    let mut out = Vec::new();
    let mut from_front = true;
    while lo < hi {
        if from_front {
            let end = (lo + front).min(hi);
            out.push(&items[lo..end]);
            lo = end;
            front = (front * 2).min(max);
        } else {
            let start = hi.saturating_sub(back).max(lo);
            out.push(&items[start..hi]);
            hi = start;
            back = (back * 2).min(max);
        }
        from_front = !from_front;
    }
    out
}

impl<M: PageMemory> Node<M> {
    /// Whether a validation that would fetch `pages` pages streams (see the module docs).
    pub(crate) fn streams(&self, pages: usize) -> bool {
        let min = self.cfg.stream_min_pages;
        min > 0 && pages >= min && self.held_locks.is_empty() && self.nprocs() > 1
    }

    /// Whether pages of a streaming view are still on their way: the application must settle
    /// ([`Node::request_settle`]) before a synchronization that may bring write notices.
    pub fn streaming(&self) -> bool {
        self.stream.in_flight > 0
    }

    /// Waits until no page of a streaming view is on its way any more (see the module docs).
    /// Completes with [`AppDone::Settled`], at once if nothing is.
    pub fn request_settle(&mut self) -> Result<(), ProtocolError> {
        self.begin("settle")?;
        if self.streaming() {
            self.stats.settles += 1;
            self.pending = Pending::Settle;
        } else {
            self.done.push_back(AppDone::Settled);
        }
        Ok(())
    }

    /// A streamed miss of page `p`, now up to date, completed (`write`: twin it ahead).
    pub(crate) fn stream_arrived(&mut self, p: PageIdx, write: bool) {
        if write {
            self.stream.arrived_write.push(p);
        } else {
            self.stream.arrived.push(p);
        }
    }

    /// One streamed miss less on its way; the last one completes a pending settle.
    pub(crate) fn stream_done(&mut self) {
        self.stream.in_flight -= 1;
        if self.stream.in_flight == 0 && matches!(self.pending, Pending::Settle) {
            self.pending = Pending::None;
            self.done.push_back(AppDone::Settled);
        }
    }

    /// Makes the streamed pages that arrived in this step accessible, in runs: readable, or
    /// twinned ahead and writable for a mutable view.
    pub(crate) fn map_arrived(&mut self) {
        if !self.stream.arrived.is_empty() {
            let mut pages = std::mem::take(&mut self.stream.arrived);
            pages.sort_unstable();
            self.set_access_in_runs(pages.iter().copied(), Access::Read);
            pages.clear();
            self.stream.arrived = pages;
        }
        if !self.stream.arrived_write.is_empty() {
            let mut pages = std::mem::take(&mut self.stream.arrived_write);
            pages.sort_unstable();
            self.twin_ahead_of_writes(&pages, &[]);
            pages.clear();
            self.stream.arrived_write = pages;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ends_alternate_and_ramp() {
        let items: Vec<u32> = (0..300).collect();
        let chunks = from_both_ends(&items, 32, 256);
        let bounds: Vec<(u32, u32)> = chunks.iter().map(|c| (c[0], c[c.len() - 1] + 1)).collect();
        assert_eq!(bounds, vec![(0, 32), (268, 300), (32, 96), (204, 268), (96, 204)]);
    }

    #[test]
    fn every_item_once_whatever_the_length() {
        for len in [0, 1, 31, 32, 33, 64, 65, 100, 1000, 5000] {
            let items: Vec<usize> = (0..len).collect();
            for max in [32, 64, 256] {
                let chunks = from_both_ends(&items, 32, max);
                let mut seen: Vec<usize> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
                assert!(chunks.iter().all(|c| !c.is_empty() && c.len() <= max), "len {len} max {max}");
                assert!(chunks.iter().all(|c| c.windows(2).all(|w| w[0] < w[1])));
                seen.sort_unstable();
                assert_eq!(seen, items, "len {len} max {max}");
            }
        }
    }
}
