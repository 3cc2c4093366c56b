//! Per-page consistency state, twins, lazy diffs and access misses.
//!
//! # Page state
//! Protection lives in [`PageMemory::access`]; the rest here:
//! - `twin`: the page has a twin, made in interval `first` (possibly several intervals ago). While
//!   it has one the page is `ReadWrite` and in the node's twinned set, and a twin that differs
//!   from its page is noticed in interval `first` once that interval closes (later intervals
//!   need not notice it: whoever holds that notice asks for diffs up to at least that interval,
//!   which cuts the twin and so brings every write made until then; see `Node::close_interval`).
//!   A twin made ahead of writes, or renewed, that is still unchanged when its interval closes
//!   carries no notice: it is kept with `first` moved on, or dropped; one cut before its interval
//!   closed is unchanged, so its diff is empty. The page is *not* write-protected at interval
//!   ends: a page written every interval (the common case) then faults once, not once per
//!   interval. A notice is a claim "there may be changes up to here", which is safe.
//! - `writers[n]`: for each writer `n`, the newest interval `noticed` for which we hold a write
//!   notice, the newest interval `applied` whose changes we have, and the newest diff `applied_seq`
//!   of `n` we have applied. The page is stale (and invalid) while some `noticed > applied`;
//!   only while a barrier is being passed may a stale page stay readable, waiting for the
//!   pushes that may complete it in place (`push.rs`, "Applying in place").
//! - `diffs`: our own diffs of the page, oldest first.
//! - `whole`: the page was declared overwritten ([`Node::request_overwrite`]): the next diff cut
//!   from its twin is the whole page, and the page is noticed at its interval's close even if it
//!   equals its twin. For a page that was stale, this is needed (its twin may lack writes that
//!   readers hold); for a valid one it is cheaper to make and apply: a copy, not a comparison
//!   and a masked merge (though more bytes where many words keep their values).
//!
//! # Overwritten pages
//! A view may declare that the application overwrites every byte of some pages before reading
//! any (radix sort's runs, an output array). Such a page, stale here, is not fetched: for every
//! writer `n` with unapplied notices we set `applied` to `noticed` and note `superseded[n]`
//! (that interval), and the page is twinned as it is, marked `whole`. Why this is right for a
//! data-race-free program:
//! - every byte of the page is written in our open interval, which follows (happened after)
//!   every interval we hold notices of; so those writes are dead, here and at every node that
//!   learns of our interval, which also learns of everything before it;
//! - a diff of `n` whose first interval is at most `superseded[n]` holds only writes of such
//!   intervals: a write of `n` to the page after its interval `superseded[n]` either follows ours
//!   (then `n` took in our notice first, which cut its twin, so the write lies in a later diff),
//!   or races with ours. So such diffs are never applied here (a later request may still bring
//!   them, from an older `applied_seq`), and a reader applying them before our whole diff (in
//!   timestamp order) loses nothing;
//! - our diff is the whole page, so no byte equal by chance to our stale twin is left out;
//! - a copy of the page handed out after a collection (`Node::serve_page`) names
//!   `superseded[n]` beside the diffs it holds, so the requester skips the superseded diffs too:
//!   applied over a copy that holds our whole diff, they would put back bytes it replaced; over
//!   one that does not yet, our whole diff, applied after them, covers every byte anyway.
//!
//! # Which intervals one diff covers, and why applying diffs in timestamp order is right
//! A diff is made from the twin when somebody asks for it or when a write notice from another node
//! arrives for the page ("cutting" the twin). It covers our intervals `first ..= now`. Every write
//! notice for the page that we incorporate cuts the twin first, so for any other writer's interval
//! `s` that happened before one of the diff's intervals, `s` happened before the diff's *first*
//! interval. Hence ordering diffs by the timestamp of their first interval (any linear extension:
//! we use the entry sum, then node, then sequence) applies every pair of diffs that touch the
//! same byte in a data-race-free program in happened-before order. A requester never applies a
//! diff twice (`applied_seq`), and asks only for diffs whose first interval it knows of, so a diff
//! it applies early can never be overtaken by an older one later.

use super::ProtocolError;
use super::diff::Diff;
use super::ids::{DiffSeq, IntervalIdx, NodeId, PageIdx};
use super::memory::{Access, PageMemory};
use super::msg::{DiffAsk, DiffList, DiffWire, Held, Message, PageCopy, PageDiffs, UnaskedDiffs};
use super::node::{AppDone, Node, Pending};
use super::stream::from_both_ends;
use super::vtime::VectorTime;
use smallvec::SmallVec;

/// Most pages one diff or page request names: about a page of data per page asked, ~1 MiB per
/// reply with 4 KiB pages, unless the requester lacks several diffs of a page.
pub const PAGES_PER_REQUEST: usize = 256;

/// Most diff bytes one [`Message::DiffReply`] or [`Message::DiffPush`] carries, far below the
/// transport's frame limit (64 MiB). A requester that lacks many diffs of its pages (a reader
/// hundreds of lock hand-offs behind a writer that rewrites them) gets its answer in several
/// replies, a page's diffs cut between two if need be; a push leaves out the pages past it,
/// which the subscriber fetches. (The reply had been one frame whatever its size, and over the
/// frame limit failed the job.)
pub const REPLY_BYTES: usize = 8 << 20;

/// Bytes a diff takes in a message beyond its own (its sequence number and timestamp, at most).
fn wire_overhead(d: &DiffWire) -> usize {
    16 + 10 * d.first_vt.len()
}

/// Bytes the diffs of `pages` take in a message, about (at most).
pub(crate) fn wire_bytes<'a>(pages: impl IntoIterator<Item = &'a DiffList>) -> usize {
    pages.into_iter().flatten().map(|d| d.diff.encoded_len() + wire_overhead(d)).sum()
}

/// Memory a received diff takes while a miss holds it: its bytes, its entry and its timestamp.
fn held_size(d: &DiffWire) -> u64 {
    (d.diff.encoded_len() + size_of::<(NodeId, DiffWire)>() + 4 * d.first_vt.len()) as u64
}

/// A reply's pages cut into replies of at most `budget` diff bytes each (but at least one diff
/// each), with whether each reply's last page goes on in the next (`continued`). A page's diffs
/// stay in their order, and the replies in theirs; the requester completes a page once its
/// last part has come.
pub(crate) fn cut_reply(pages: Vec<PageDiffs>, budget: usize) -> Vec<(Vec<PageDiffs>, bool)> {
    if wire_bytes(pages.iter().map(|pd| &pd.diffs)) <= budget {
        return vec![(pages, false)];
    }
    let mut replies = Vec::new();
    let (mut reply, mut bytes) = (Vec::new(), 0);
    for PageDiffs { page, diffs } in pages {
        let mut part = PageDiffs { page, diffs: DiffList::new() };
        for d in diffs {
            let len = d.diff.encoded_len() + wire_overhead(&d);
            if bytes > 0 && bytes + len > budget {
                let continued = !part.diffs.is_empty();
                if continued {
                    reply.push(std::mem::replace(&mut part, PageDiffs { page, diffs: DiffList::new() }));
                }
                replies.push((std::mem::take(&mut reply), continued));
                bytes = 0;
            }
            bytes += len;
            part.diffs.push(d);
        }
        reply.push(part);
    }
    replies.push((reply, false));
    replies
}

/// Pages in the first request of a batch to one node; each further request names twice as many,
/// up to [`PAGES_PER_REQUEST`]. The first reply comes back (and is applied) while the writer still
/// diffs the rest, instead of after the writer has diffed a whole large request.
pub(crate) const FIRST_REQUEST_PAGES: usize = 32;

/// `items` cut into requests of `first` (32), twice as many, and so on up to `max` (256).
fn ramped<T>(mut items: &[T], first: usize, max: usize) -> impl Iterator<Item = &[T]> {
    let mut size = first.clamp(1, max.max(1));
    std::iter::from_fn(move || {
        if items.is_empty() {
            return None;
        }
        let (chunk, rest) = items.split_at(size.min(items.len()));
        items = rest;
        size = (size * 2).min(max.max(1));
        Some(chunk)
    })
}

/// How [`Node::cut_diff`] reads a page whose twin it cuts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cut {
    /// Nothing can write the page: it is invalid or frozen.
    Revoked,
    /// Nothing writes the page, writable or not: the application thread waits in a
    /// synchronization call, or in a view or a fault with no mutable view open
    /// ([`Node::app_still`]).
    Blocked,
    /// The application may be writing the page, which is writable and whose twin is renewed:
    /// the diff is cut from a [`PageMemory::snapshot`], which becomes the twin.
    Running,
}

/// `pages` sorted, each once (for membership tests by bisection).
fn sorted(pages: &[PageIdx]) -> Vec<PageIdx> {
    let mut v = pages.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

/// What we know about one writer of a page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterState {
    /// Newest interval of the writer for which we hold a write notice for the page.
    pub noticed: IntervalIdx,
    /// Newest interval of the writer whose changes to the page we have.
    pub applied: IntervalIdx,
    /// Newest diff of the writer for the page that we have applied.
    pub applied_seq: DiffSeq,
    /// The writer's diffs of the page whose first interval is at most this one were superseded
    /// by our overwrite of the whole page, and are never applied (see the module docs).
    pub superseded: IntervalIdx,
}

/// One of our own diffs of a page.
#[derive(Clone, Debug)]
pub struct OwnDiff {
    pub seq: DiffSeq,
    /// The interval the twin was made in.
    pub first: IntervalIdx,
    /// Timestamp of interval `first`.
    pub first_vt: VectorTime,
    /// The twin was made while the application held a lock ([`PageMeta::under_lock`]).
    pub under_lock: bool,
    pub diff: Diff,
}

/// Consistency state of one page.
#[derive(Clone, Debug, Default)]
pub struct PageMeta {
    /// The interval our twin was made in, if the page has a twin.
    pub twin: Option<IntervalIdx>,
    /// The twin was renewed when a diff was served (the page stayed writable), so the page may
    /// not have been written since: compare before noticing it.
    pub renewed: bool,
    /// A renewed twin found unchanged at one interval's close, kept as the next interval's twin:
    /// unchanged at that one's close too, it is dropped. Read only while `renewed`, and cleared
    /// wherever a twin is renewed.
    pub idle: bool,
    /// Per writer, indexed by node; empty until a notice arrives.
    pub writers: Vec<WriterState>,
    /// Our own diffs of the page, oldest first (`seq` rises along the list).
    pub diffs: Vec<OwnDiff>,
    /// Set when a collection dropped our copy: fetch a whole copy from this node first.
    pub base_from: Option<NodeId>,
    /// Declared overwritten (stale or valid): the next diff cut is the whole page (module docs).
    pub whole: bool,
    /// Our twin was made while the application held a lock (a twin renewed when a diff was cut
    /// keeps the flag of the one it replaces): only such pages are taken for data a lock
    /// protects (`lock.rs`).
    pub under_lock: bool,
}

impl PageMeta {
    /// The state of writer `n` of this page, `p`, allocating the per-writer table (and noting
    /// `p` in `tabled`, for the next collection to drop it).
    pub(crate) fn writer(
        &mut self,
        p: PageIdx,
        n: NodeId,
        nprocs: usize,
        tabled: &mut Vec<PageIdx>,
    ) -> &mut WriterState {
        if self.writers.is_empty() {
            self.writers = vec![WriterState::default(); nprocs];
            tabled.push(p);
        }
        &mut self.writers[n.idx()]
    }

    /// True while some write notice has not been applied.
    pub fn is_stale(&self) -> bool {
        self.writers.iter().any(|w| w.noticed > w.applied)
    }
}

/// Who is waiting for an access miss to complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MissFor {
    /// The application, blocked in a fault.
    App,
    /// A collecting barrier, validating a page this node wrote.
    Gc,
    /// The application, about to access a view ([`Node::request_validate`]).
    Validate,
    /// Nobody yet: a streaming view's page on its way (`stream.rs`). A fault on the page makes
    /// the miss the application's.
    Stream,
}

/// An access miss in progress.
#[derive(Debug)]
pub(crate) struct Miss {
    pub write: bool,
    pub purpose: MissFor,
    /// Started by a streaming view (counted in `StreamState::in_flight` until it completes).
    pub streamed: bool,
    /// Writers asked, with the interval asked up to, and whether they answered. Inline, as
    /// `diffs`, for the usual one or two writers: a fetch of thousands of pages then allocates
    /// nothing per page.
    pub asked: SmallVec<[(NodeId, IntervalIdx, bool); 2]>,
    pub diffs: SmallVec<[(NodeId, DiffWire); 1]>,
    /// Per writer whose replies are not all in, the memory that the diffs of its `continued`
    /// replies take in `diffs` (`Node::held_continued`, which bounds it).
    pub continued: SmallVec<[(NodeId, u64); 1]>,
    /// The node asked for a whole copy (the page was dropped by a collection), and the copy
    /// with what it holds of each writer's diffs ([`PageCopy::holds`]).
    pub base: Option<(NodeId, Option<BaseCopy>)>,
}

/// A whole copy of a page as it came: its bytes, and what it holds of each writer's diffs.
pub(crate) type BaseCopy = (Vec<u8>, Vec<Held>);

impl<M: PageMemory> Node<M> {
    /// Makes a twin in the open interval and makes the page writable (slow path).
    pub(crate) fn make_twin(&mut self, p: PageIdx) {
        self.mem.make_twin(p);
        self.mem.set_access(p, 1, Access::ReadWrite);
        let (open, under_lock) = (self.open_interval(), !self.held_locks.is_empty());
        let meta = &mut self.pages[p.idx()];
        (meta.twin, meta.under_lock) = (Some(open), under_lock);
        self.twinned.insert(p);
        self.opened_twins.push(p);
        self.stats.twins += 1;
    }

    /// Makes a diff from the twin and drops the twin; the page ends with protection `then`
    /// (`Read` when serving a request; incoming write notices cut with `None`, through
    /// [`Node::cut_revoked`] after revoking many pages in runs, as they invalidate them anyway).
    ///
    /// The page-sharing rule: write access is taken *before* the twin and page are read, and not
    /// by making the page `Read`: a write in that window would take the fault handler's fast
    /// path, which makes a fresh twin over the one this diff needs. The page is made invalid
    /// (here) or frozen ([`PageMemory::freeze`], when serving a request): either way a write
    /// faults into the slow path and waits for the service thread, which finishes the diff first.
    ///
    /// Serving a page whose twin was made in the latest closed interval (or the open one), which
    /// the application is likely still writing, *renews* the twin instead of dropping it: the
    /// page is copied into the twin and stays writable, so the next write does not fault. A
    /// renewed twin is noticed at the interval's end only if the page changed (see
    /// [`Node::close_interval`]). A page declared overwritten ([`Node::request_overwrite`]) is
    /// not renewed: it is an output, written in full once a phase through a view, which twins
    /// it ahead if it is written again. Renewing it would cost a copy and a remapping now, and
    /// a freeze and a comparison at the interval's close, to spare at best the view's copy
    /// (radix sort: 0.0761 → 0.0712 s, 11 alternated runs).
    pub(crate) fn cut_twin(&mut self, p: PageIdx, then: Access) {
        if self.pages[p.idx()].twin.is_none() {
            return;
        }
        let was_writable = self.mem.access(p) == Access::ReadWrite;
        if self.mem.access(p) != Access::None {
            self.mem.set_access(p, 1, Access::None);
        }
        let end = self.cut_revoked(p, then, was_writable);
        if end != Access::None {
            self.mem.set_access(p, 1, end);
        }
    }

    /// [`Node::cut_twin`] on a page already invalid or frozen (`Access::None`), leaving its final
    /// protection to the caller, which may set many pages' in runs: returns it.
    pub(crate) fn cut_revoked(&mut self, p: PageIdx, then: Access, was_writable: bool) -> Access {
        self.cut_diff(p, then, was_writable, Cut::Revoked)
    }

    /// Whether cutting the twin of page `p`, made in interval `first`, for protection `then`
    /// renews it (see [`Node::cut_twin`]): the page is being served (`then` is `Read`), was
    /// writable and twinned in the latest closed interval or the open one, or lies in the
    /// application's write view (`recent`), and was not declared overwritten. Returns
    /// (`recent`, renewed).
    ///
    /// The view: radix sort's pages at each end of a node's runs are written by both nodes,
    /// each keeping the twin its fill made before the sort; the other node fetches such a page
    /// while this one writes its part, and frozen, the page took a fault and a kernel write
    /// fault, ~420 pages a node a run.
    fn renewal(&self, p: PageIdx, first: IntervalIdx, then: Access, was_writable: bool) -> (bool, bool) {
        let recent = then == Access::Read
            && was_writable
            && (first >= self.vt.get(self.me) || self.writing.binary_search(&p).is_ok());
        (recent, recent && !self.pages[p.idx()].whole)
    }

    /// [`Node::cut_revoked`], or the same on a page still writable (see [`Cut`]). Returns the
    /// page's final protection.
    fn cut_diff(&mut self, p: PageIdx, then: Access, was_writable: bool, how: Cut) -> Access {
        let Some(first) = self.pages[p.idx()].twin.take() else { return then };
        let (recent, hot) = self.renewal(p, first, then, was_writable);
        if recent && !hot {
            self.stats.renewals_skipped += 1;
        }
        self.pages[p.idx()].renewed = false;
        self.twinned.remove(&p);
        let writable = how != Cut::Revoked && self.mem.access(p) == Access::ReadWrite;
        let whole = std::mem::take(&mut self.pages[p.idx()].whole);
        let diff = if how == Cut::Running {
            assert!(hot && writable, "{p}: cut while the application runs, but not renewed");
            // Diffed against a snapshot, which becomes the twin: the page stays writable.
            let mut snap = std::mem::take(&mut self.snapshot);
            snap.resize(self.mem.page_size(), 0);
            self.mem.snapshot(p, &mut snap);
            let diff = Diff::make(self.mem.twin(p), &snap);
            self.mem.set_twin(p, &snap);
            self.snapshot = snap;
            self.stats.renewals_unfrozen += 1;
            diff
        } else {
            let page = if writable { self.mem.page_while_blocked(p) } else { self.mem.page(p) };
            if whole { Diff::whole(page) } else { Diff::make(self.mem.twin(p), page) }
        };
        let end = if hot {
            match how {
                Cut::Running => {}
                _ if writable => self.mem.renew_twin_while_blocked(p),
                _ => self.mem.make_twin(p),
            }
            self.pages[p.idx()].twin = Some(self.open_interval());
            self.pages[p.idx()].renewed = true;
            self.pages[p.idx()].idle = false;
            self.twinned.insert(p);
            self.opened_twins.push(p);
            self.stats.twins_renewed += 1;
            Access::ReadWrite
        } else {
            then
        };
        if diff.is_empty() {
            return end;
        }
        let first_vt = match self.log.get(self.me, first) {
            Some(rec) => rec.vt.clone(),
            None => panic!("{p}: twin of interval {first} cut before the interval closed (vt {:?})", self.vt),
        };
        self.diff_seq += 1;
        self.acct.diff_bytes += (diff.encoded_len() + size_of::<OwnDiff>() + 4 * first_vt.len()) as u64;
        self.stats.diffs_created += 1;
        self.note_cut(p);
        self.stats.diff_bytes_created += diff.encoded_len() as u64;
        let under_lock = self.pages[p.idx()].under_lock;
        self.pages[p.idx()].diffs.push(OwnDiff { seq: self.diff_seq, first, first_vt, under_lock, diff });
        end
    }

    /// Serves a diff request for many pages: cuts every twin the requester needs with one
    /// protection change per run of pages (freeze, diff, then restore), instead of two or three
    /// per page, then answers page by page. Freezing takes only write access, so the application
    /// keeps reading the pages meanwhile; a write waits until the cut is done, which is what the
    /// page-sharing rule of [`Node::cut_twin`] needs.
    ///
    /// With `blocked` (nothing writes the pages: the application thread waits in a
    /// synchronization call, as at a push at this node's barrier arrival or a request that comes
    /// while it waits for a lock, or in a view or a fault with no mutable view open; see
    /// [`Node::app_still`]) nothing is frozen: the twins are cut from pages still writable, and
    /// those whose twins are renewed stay so untouched. A freeze and its undoing cost jacobi3d's
    /// arrival 14 µs of its 98 (16 pages): undoing it remaps the pages on userfaultfd, where
    /// clearing their write protection would leave their entries read-only and the next sweep's
    /// first writes faulting (`Heap::make_writable`). In fft's transposes, where each node serves
    /// the other's requests while it waits in its own view, the two cost ~1 µs a page (0.0512 →
    /// 0.0457 s). With a mutable view open, another thread may be writing through its slice, so
    /// a request that comes while the application waits in a view or a fault is served as while
    /// it runs (below). fft's transposes fetch before they open their mutable view, so they keep
    /// the in-place cut (served from snapshots, they took ~8% longer).
    ///
    /// While the application runs, a writable page whose twin is renewed is not frozen either:
    /// its diff is cut from a snapshot, which becomes its twin ([`PageMemory::snapshot`]; the
    /// docs of the `memory` module say why no write is lost). Only the pages whose twins are
    /// dropped are frozen, and they stay write-protected.
    pub(crate) fn serve_diff_request(&mut self, asks: &[DiffAsk], blocked: bool) -> Vec<PageDiffs> {
        self.cut_for_serving(asks.iter().map(|a| (a.page, a.want)), blocked);
        asks.iter().map(|a| self.serve_diffs(a.page, a.want, a.after_seq)).collect()
    }

    /// Cuts the twins that serving pages up to intervals `want` needs, as
    /// [`Node::serve_diff_request`] does (its docs say how), so that
    /// [`Node::serve_diffs`] finds nothing left to cut.
    pub(crate) fn cut_for_serving(
        &mut self,
        wants: impl Iterator<Item = (PageIdx, IntervalIdx)>,
        blocked: bool,
    ) {
        let closed = self.vt.get(self.me);
        let mut cut: Vec<(PageIdx, bool)> = wants
            .filter(|&(p, want)| self.pages[p.idx()].twin.is_some_and(|first| first <= want.min(closed)))
            .map(|(p, _)| (p, self.mem.access(p) == Access::ReadWrite))
            .collect();
        cut.sort_unstable();
        cut.dedup_by_key(|c| c.0);
        let cut: Vec<(PageIdx, bool, Cut)> = cut
            .into_iter()
            .map(|(p, was_writable)| {
                let how = match self.pages[p.idx()].twin {
                    _ if blocked => Cut::Blocked,
                    Some(first) if self.renewal(p, first, Access::Read, was_writable).1 => Cut::Running,
                    _ => Cut::Revoked,
                };
                (p, was_writable, how)
            })
            .collect();
        let revoke: Vec<PageIdx> = (cut.iter())
            .filter(|c| c.2 == Cut::Revoked && self.mem.access(c.0) != Access::None)
            .map(|c| c.0)
            .collect();
        self.freeze_in_runs(revoke);
        let (mut writable, mut readable) = (Vec::new(), Vec::new());
        for (p, was_writable, how) in cut {
            match self.cut_diff(p, Access::Read, was_writable, how) {
                Access::ReadWrite if how != Cut::Revoked && was_writable => {}
                Access::ReadWrite => writable.push(p),
                _ => readable.push(p),
            }
        }
        self.set_access_in_runs(writable, Access::ReadWrite);
        self.set_access_in_runs(readable, Access::Read);
    }

    /// A fault on page `p`. `write` is true if the fault is known to be a write; `views_open`:
    /// a mutable view is open ([`Node::set_mutable_views_open`]).
    pub(crate) fn fault(&mut self, p: PageIdx, write: bool, views_open: bool) -> Result<(), ProtocolError> {
        match self.mem.access(p) {
            Access::ReadWrite => self.done.push_back(AppDone::FaultResolved(p)),
            Access::Read => {
                self.stats.write_faults += 1;
                self.make_twin(p);
                self.done.push_back(AppDone::FaultResolved(p));
            }
            Access::None => {
                self.pending = Pending::Fault { views_open };
                if let Some(miss) = self.misses.get_mut(&p) {
                    // On its way for a streaming view (nothing else fetches while the application
                    // runs): wait for it, asking nothing more.
                    assert_eq!(
                        miss.purpose,
                        MissFor::Stream,
                        "{p}: fault on a page whose miss is not a stream's"
                    );
                    (miss.purpose, miss.write) = (MissFor::App, miss.write || write);
                    self.stats.stream_waits += 1;
                    return Ok(());
                }
                self.stats.read_misses += 1;
                return self.start_misses(&[p], write, MissFor::App);
            }
        }
        Ok(())
    }

    /// The application is about to access `pages` (a view): brings every invalid one up to date
    /// at once — one request per writer for all of them, in parallel — instead of one fault and
    /// one round trip per page. With `write`, it is about to write them too: every valid
    /// read-only page then gets its twin now and is made writable in runs, instead of faulting
    /// page by page. Such a twin is made ahead of any write, so it is noticed at the interval's
    /// end only if the page changed (like a renewed twin). Completes with
    /// [`AppDone::Validated`].
    ///
    /// A large fetch may stream: see [`Node::request_view`].
    pub fn request_validate(&mut self, pages: &[PageIdx], write: bool) -> Result<(), ProtocolError> {
        self.request_view(pages, write, &[], true)
    }

    /// [`Node::request_validate`] of `pages` for writing, where the application also declares
    /// that it overwrites every byte of the pages `whole` (some of `pages`) before it reads any:
    /// those that are stale are not fetched, but superseded (see the module docs), and all of
    /// them are diffed whole. Completes with [`AppDone::Validated`].
    pub fn request_overwrite(&mut self, pages: &[PageIdx], whole: &[PageIdx]) -> Result<(), ProtocolError> {
        self.request_view(pages, true, whole, true)
    }

    /// [`Node::request_validate`] (`whole` empty) or [`Node::request_overwrite`] (`write`),
    /// whichever the arguments say. With `stream`, a validation that would fetch at least
    /// [`NodeConfig::stream_min_pages`](super::NodeConfig::stream_min_pages) pages with no lock
    /// held completes at once, its pages arriving while the application runs (`stream.rs`);
    /// without, it completes once they are all in.
    pub fn request_view(
        &mut self,
        pages: &[PageIdx],
        write: bool,
        whole: &[PageIdx],
        stream: bool,
    ) -> Result<(), ProtocolError> {
        let whole = if write { whole } else { &[] };
        let views_open = self.take_views_open();
        self.begin("validate")?;
        for &p in pages.iter().chain(whole) {
            self.check_page(self.me, p)?;
        }
        // Each page once (a page asked for twice would be answered twice): the runtime passes
        // them sorted and distinct, which costs one look here.
        let distinct;
        let pages = if pages.windows(2).all(|w| w[0] < w[1]) {
            pages
        } else {
            distinct = sorted(pages);
            &distinct[..]
        };
        if write {
            self.writing = pages.to_vec();
        }
        // Only the declared pages that are also validated (against the write view's pages,
        // sorted once above; and only if there are any: this runs for every view).
        let whole: Vec<PageIdx> = if write && !whole.is_empty() {
            sorted(whole).into_iter().filter(|p| self.writing.binary_search(p).is_ok()).collect()
        } else {
            Vec::new()
        };
        // Superseded pages stay unmapped until they are twinned ahead, then are mapped writable
        // in one step (made readable first, each run took a mapping, then an unmapping and a
        // writable mapping: `Heap::make_writable`).
        let superseded: Vec<PageIdx> = whole.iter().copied().filter(|&p| self.supersedable(p)).collect();
        for &p in &superseded {
            self.supersede(p);
        }
        let invalid: Vec<PageIdx> = pages
            .iter()
            .copied()
            .filter(|&p| {
                self.mem.access(p) == Access::None
                    && !self.misses.contains_key(&p)
                    && superseded.binary_search(&p).is_err()
            })
            .collect();
        let then_write = if write { pages.to_vec() } else { Vec::new() };
        if invalid.is_empty() {
            self.twin_ahead(&then_write, &whole, &superseded);
            self.done.push_back(AppDone::Validated);
            return Ok(());
        }
        self.stats.view_misses += invalid.len() as u64;
        self.stats.validations += 1;
        if stream && self.streams(invalid.len()) {
            self.stats.streams += 1;
            self.stats.streamed_pages += invalid.len() as u64;
            self.start_misses(&invalid, write, MissFor::Stream)?;
            self.twin_ahead(&then_write, &whole, &superseded);
            self.map_arrived();
            self.done.push_back(AppDone::Validated);
            return self.deliver_local();
        }
        self.pending = Pending::Validate { left: invalid.len(), then_write, whole, superseded, views_open };
        self.start_misses(&invalid, false, MissFor::Validate)?;
        self.deliver_local()
    }

    /// Whether [`Node::request_validate`] of `pages` would complete at once, with no message:
    /// every invalid page waits for no whole copy, and each of its writers with unapplied
    /// notices pushed us exactly the diffs a request would bring (`push.rs`).
    pub fn validates_locally(&self, pages: &[PageIdx]) -> bool {
        self.overwrites_locally(pages, &[])
    }

    /// Whether [`Node::request_overwrite`] of `pages` and `whole` would complete at once: as
    /// [`Node::validates_locally`], but for the pages of `whole`, which need nothing fetched.
    pub fn overwrites_locally(&self, pages: &[PageIdx], whole: &[PageIdx]) -> bool {
        let npages = self.mem.npages();
        let whole = sorted(whole);
        matches!(self.pending, Pending::None)
            && pages.iter().all(|&p| {
                if p.0 >= npages || self.misses.contains_key(&p) {
                    return false;
                }
                if self.mem.access(p) != Access::None
                    || (whole.binary_search(&p).is_ok() && self.supersedable(p))
                {
                    return true;
                }
                let meta = &self.pages[p.idx()];
                meta.base_from.is_none()
                    && (meta.writers.iter().enumerate())
                        .filter(|(_, st)| st.noticed > st.applied)
                        .all(|(w, &st)| self.pushed_usable(p, NodeId(w as u16), st))
            })
    }

    /// Whether page `p`, declared overwritten, can be superseded instead of fetched: it is stale
    /// (invalid with unapplied notices, and not a copy a collection dropped, whose base comes
    /// from elsewhere) and no miss is fetching it already.
    fn supersedable(&self, p: PageIdx) -> bool {
        let meta = &self.pages[p.idx()];
        self.mem.access(p) == Access::None
            && meta.is_stale()
            && meta.base_from.is_none()
            && !self.misses.contains_key(&p)
    }

    /// Supersedes every unapplied notice of stale page `p`, about to be overwritten whole.
    fn supersede(&mut self, p: PageIdx) {
        let meta = &mut self.pages[p.idx()];
        for w in meta.writers.iter_mut().filter(|w| w.noticed > w.applied) {
            w.superseded = w.noticed;
            w.applied = w.noticed;
        }
        // Its copy is stale: whatever twin it gets next (made ahead by this view, in practice),
        // the diff cut from it must be whole.
        meta.whole = true;
        self.stats.pages_overwritten += 1;
    }

    /// Twins every valid read-only page of `pages` (ascending) and the `superseded` ones
    /// (unmapped, ascending) and makes them writable, in runs; then marks the twinned pages of
    /// `whole` (declared overwritten, ascending) to be diffed whole.
    fn twin_ahead(&mut self, pages: &[PageIdx], whole: &[PageIdx], superseded: &[PageIdx]) {
        let ahead: Vec<PageIdx> = (pages.iter().copied())
            .filter(|&p| self.mem.access(p) == Access::Read || superseded.binary_search(&p).is_ok())
            .collect();
        self.twin_ahead_of_writes(&ahead, whole);
        for &p in whole {
            let meta = &mut self.pages[p.idx()];
            meta.whole |= meta.twin.is_some();
        }
    }

    /// Twins `pages` (ascending, none writable, all up to date or superseded) ahead of writes
    /// and makes them writable, in runs. The pages of `whole` (ascending; declared overwritten)
    /// get a twin that is never read, since their diff is the whole page: no copy is made
    /// ([`PageMemory::skip_twin`]; radix sort's output pages, ~1,800 a node a pass).
    pub(crate) fn twin_ahead_of_writes(&mut self, pages: &[PageIdx], whole: &[PageIdx]) {
        let open = self.open_interval();
        let declared = |p: &PageIdx| whole.binary_search(p).is_ok();
        let copied: Vec<PageIdx> = pages.iter().copied().filter(|p| !declared(p)).collect();
        self.mem.prepare_twins(&copied);
        let mut twinned = Vec::new();
        let under_lock = !self.held_locks.is_empty();
        for &p in pages {
            if declared(&p) {
                self.mem.skip_twin(p);
                self.pages[p.idx()].whole = true;
                self.stats.twins_skipped += 1;
            } else {
                self.mem.make_twin(p);
            }
            let meta = &mut self.pages[p.idx()];
            meta.twin = Some(open);
            meta.under_lock = under_lock;
            meta.renewed = true;
            meta.idle = false;
            self.twinned.insert(p);
            self.opened_twins.push(p);
            twinned.push(p);
        }
        self.stats.twins_ahead += twinned.len() as u64;
        self.set_access_in_runs(twinned, Access::ReadWrite);
    }

    /// Asks every writer with unapplied notices for its diffs of `pages` (one request per writer,
    /// in parallel), and the holders of whole copies for the pages a collection dropped. A
    /// writer whose diffs were pushed to us already (`push.rs`) is not asked.
    pub(crate) fn start_misses(
        &mut self,
        pages: &[PageIdx],
        write: bool,
        purpose: MissFor,
    ) -> Result<(), ProtocolError> {
        let (n, limits) = (self.nprocs(), self.cfg.limits);
        let mut asks: Vec<Vec<DiffAsk>> = vec![Vec::new(); n];
        let mut copies: Vec<Vec<PageIdx>> = vec![Vec::new(); n];
        for &p in pages {
            let (mut asked, mut diffs) = (SmallVec::new(), SmallVec::new());
            for (w, asks_w) in asks.iter_mut().enumerate() {
                // (Read in place: a list of the stale writers would be an allocation a page.)
                let Some(&st) = self.pages[p.idx()].writers.get(w) else { break };
                if st.noticed <= st.applied {
                    continue;
                }
                let writer = NodeId(w as u16);
                if let Some(pushed) = self.take_pushed(p, writer, st) {
                    if purpose != MissFor::Gc {
                        self.note_push_read(p, writer);
                    }
                    asked.push((writer, st.noticed, true));
                    diffs.extend(pushed.into_iter().map(|d| (writer, d)));
                } else {
                    asked.push((writer, st.noticed, false));
                    asks_w.push(DiffAsk { page: p, want: st.noticed, after_seq: st.applied_seq });
                }
            }
            let base = self.pages[p.idx()].base_from.map(|h| {
                copies[h.idx()].push(p);
                (h, None)
            });
            let streamed = purpose == MissFor::Stream;
            self.stream.in_flight += usize::from(streamed);
            let continued = SmallVec::new();
            self.misses.insert(p, Miss { write, purpose, streamed, asked, diffs, continued, base });
        }
        // One request per writer, split into requests of at most `pages_per_request` pages (a
        // server refuses more; a reply larger than `reply_bytes` comes in parts), and ramped so
        // that the writer's diffing, the transfer and our applying overlap.
        for (w, asks) in asks.into_iter().enumerate() {
            let chunks: Vec<&[DiffAsk]> = if purpose == MissFor::Stream {
                from_both_ends(&asks, limits.first_request_pages, limits.pages_per_request)
            } else {
                ramped(&asks, limits.first_request_pages, limits.pages_per_request).collect()
            };
            for chunk in chunks {
                self.stats.diff_requests_sent += 1;
                self.outbox.push_back((NodeId(w as u16), Message::DiffRequest { asks: chunk.to_vec() }));
            }
        }
        for (h, pages) in copies.into_iter().enumerate() {
            for chunk in ramped(&pages, limits.first_request_pages, limits.pages_per_request) {
                self.stats.page_requests_sent += chunk.len() as u64;
                self.outbox.push_back((NodeId(h as u16), Message::PageRequest { pages: chunk.to_vec() }));
            }
        }
        for &p in pages {
            self.try_finish_miss(p)?;
        }
        Ok(())
    }

    /// A whole copy of page `p` (for a node that dropped it at a collection).
    ///
    /// If the page has a twin, the twin is sent, not the page: the twin is what our later diff
    /// of the page is made against, so the copy plus that diff gives exactly the page. Sending
    /// the page itself would hand out writes in progress that the diff, which holds only the
    /// bytes that differ from the twin, could later fail to overwrite (a word written twice,
    /// ending with bytes equal to the twin's, say). The twin is new enough: every twin was made
    /// after our last collection, when our copy was valid. While a collection is still in
    /// progress here (the requester finished it first), any twin is the epoch's and about to be
    /// dropped; the application is blocked in the barrier and every node has validated, so the
    /// page itself is the epoch's final state and is sent. Access is revoked while the bytes are
    /// read, then restored.
    ///
    /// The copy names, per writer, the diffs it holds ([`Held`]): all of ours cut so far (the
    /// twin, or the page without one, holds every write of ours up to the last cut), and of every
    /// other writer those up to the newest we applied, and those our overwrite of the whole page
    /// superseded (see "Overwritten pages" above). The requester applies only the others over it.
    /// The copy may hold writes the requester has no notice of yet (applied here since the
    /// collection), and applying an older diff over one of them, a diff of ours this copy holds
    /// already, say, would put back the bytes the older diff changed and leave the newer write's
    /// other bytes: a racing reader then read a value nobody wrote (the racy-program simulation's
    /// seed 60,304, in session 26's programs). A superseded diff applied over a copy marked as
    /// holding our whole diff would put back bytes our overwrite replaced (the data-race-free
    /// simulation's seed 171,461, then). Until our overwrite is done, though, the copy holds the
    /// stale bytes of the words we have not written yet in place of the superseded writes: a
    /// reader racing with the overwrite may get them, older than writes it knows of.
    ///
    /// The application may be running (a page request is served whenever it comes), so the page
    /// may have been twinned by the fault handler since this node last heard of its twins: the
    /// access it had is learned from the revocation itself ([`PageMemory::revoke`]), and a page
    /// writable without a twin known here has a twin the handler made, which is sent. Trusting
    /// an earlier [`PageMemory::access`] instead sent the page with writes in progress, and
    /// restored it read-only, so that the next write twinned it again, over the old twin, and
    /// the writes before it were in no diff.
    pub(crate) fn serve_page(&mut self, p: PageIdx) -> PageCopy {
        let access = self.mem.revoke(p);
        // A page declared overwritten has no twin to read ([`PageMemory::skip_twin`]): its
        // bytes before the overwrite matter to nobody, since a reader that knows of the
        // overwrite applies its whole-page diff over them, and one that does not, reading the
        // page while this node overwrites every byte of it, races with the overwrite.
        let meta = &self.pages[p.idx()];
        let handler_twin = access == Access::ReadWrite && meta.twin.is_none() && self.nprocs() > 1;
        let twin_is_base = (meta.twin.is_some() || handler_twin) && !meta.whole && self.gc.is_none();
        let src = if twin_is_base { self.mem.twin(p) } else { self.mem.page(p) };
        let bytes = serde_bytes::ByteBuf::from(src.to_vec());
        if access != Access::None {
            self.mem.set_access(p, 1, access);
        }
        self.stats.pages_served += 1;
        let writers = &self.pages[p.idx()].writers;
        let holds = (0..self.nprocs())
            .map(|n| match writers.get(n) {
                _ if n == self.me.idx() => Held { seq: self.diff_seq, superseded: 0 },
                Some(w) => Held { seq: w.applied_seq, superseded: w.superseded },
                None => Held::default(),
            })
            .collect();
        PageCopy { page: p, bytes, holds }
    }

    pub(crate) fn handle_page_reply(
        &mut self,
        from: NodeId,
        p: PageIdx,
        bytes: Vec<u8>,
        holds: Vec<Held>,
    ) -> Result<(), ProtocolError> {
        let (page_size, nprocs) = (self.mem.page_size(), self.nprocs());
        let slot =
            self.misses.get_mut(&p).and_then(|m| m.base.as_mut()).filter(|(h, b)| *h == from && b.is_none());
        match slot {
            Some(slot) if bytes.len() == page_size && holds.len() == nprocs => {
                slot.1 = Some((bytes, holds));
            }
            _ => {
                let what = format!(
                    "page reply for {p} ({} bytes, pages are {page_size}; diffs held of {} nodes, \
                     the job has {nprocs})",
                    bytes.len(),
                    holds.len()
                );
                return Err(ProtocolError::Unexpected { from, what });
            }
        }
        self.try_finish_miss(p)
    }

    /// Applies diffs that came with a lock grant from `from`, if they make the page valid: `from`
    /// must be the page's only writer with unapplied notices, and before the grant (`before`,
    /// our state of `from` then) we must have had its diffs up to the one the grant assumed
    /// (`after_seq`), applied or pushed to us. A usable push is taken along: the grant's diffs
    /// continue it. Otherwise they are ignored and the page is fetched as usual when touched.
    pub(crate) fn apply_piggybacked(
        &mut self,
        from: NodeId,
        d: UnaskedDiffs,
        before: WriterState,
    ) -> Result<(), ProtocolError> {
        let p = d.page;
        let meta = &self.pages[p.idx()];
        let only_from =
            meta.writers.iter().enumerate().all(|(n, w)| w.applied >= w.noticed || n == from.idx());
        if self.mem.access(p) != Access::None || meta.base_from.is_some() || !only_from || !meta.is_stale() {
            return Ok(());
        }
        let pushed = self.pushed_newest(p, from, before);
        if before.applied_seq.max(pushed.unwrap_or(0)) < d.after_seq {
            return Ok(());
        }
        let mut diffs = d.diffs;
        if pushed.is_some() {
            diffs.extend(self.take_pushed(p, from, before).into_iter().flatten());
        }
        self.complete_from(p, from, diffs, false)?;
        self.mem.set_access(p, 1, Access::Read);
        Ok(())
    }

    /// Completes page `p`, whose only stale writer is `from`, with `diffs`: every diff of
    /// `from`'s we lack (a grant's, a push's), applied in order, and marks its notices applied.
    /// `in_place`: the page is read-only and stays so, the application waiting in a barrier
    /// (`push.rs`); otherwise it is invalid, and the caller restores its access.
    pub(crate) fn complete_from(
        &mut self,
        p: PageIdx,
        from: NodeId,
        mut diffs: DiffList,
        in_place: bool,
    ) -> Result<(), ProtocolError> {
        diffs.sort_by_key(|d| d.seq);
        for d in &diffs {
            self.apply_diff_where(p, from, d, in_place)?;
        }
        let nprocs = self.nprocs();
        let st = self.pages[p.idx()].writer(p, from, nprocs, &mut self.acct.tabled);
        st.applied = st.noticed;
        Ok(())
    }

    /// Applies one of `from`'s diffs to invalid page `p`, unless it was applied before (a writer's
    /// diffs of a page are numbered in order, so a diff is never applied twice).
    fn apply_diff(&mut self, p: PageIdx, from: NodeId, d: &DiffWire) -> Result<(), ProtocolError> {
        self.apply_diff_where(p, from, d, false)
    }

    /// [`Node::apply_diff`]; `in_place`: to read-only page `p` while the application waits.
    fn apply_diff_where(
        &mut self,
        p: PageIdx,
        from: NodeId,
        d: &DiffWire,
        in_place: bool,
    ) -> Result<(), ProtocolError> {
        let nprocs = self.nprocs();
        let st = self.pages[p.idx()].writer(p, from, nprocs, &mut self.acct.tabled);
        if d.seq <= st.applied_seq {
            return Ok(());
        }
        if d.first_vt.get(from) <= st.superseded {
            st.applied_seq = d.seq;
            self.stats.diffs_superseded += 1;
            return Ok(());
        }
        let page = if in_place { self.mem.page_mut_while_blocked(p) } else { self.mem.page_mut(p) };
        d.diff.apply(page).map_err(|source| ProtocolError::BadDiff { from, page: p, source })?;
        // Noted once applied: a malformed diff is not taken for one applied (the error ends the
        // job all the same).
        st.applied_seq = d.seq;
        self.stats.diffs_applied += 1;
        self.stats.diff_bytes_applied += d.diff.encoded_len() as u64;
        Ok(())
    }

    /// Serves one page of a diff request: cuts the twin if it holds changes the requester
    /// wants, then returns every diff it has not applied yet whose first interval it knows of.
    pub(crate) fn serve_diffs(&mut self, p: PageIdx, want: IntervalIdx, after_seq: DiffSeq) -> PageDiffs {
        self.stats.diff_requests_served += 1;
        let closed = self.vt.get(self.me);
        if self.pages[p.idx()].twin.is_some_and(|first| first <= want.min(closed)) {
            self.cut_twin(p, Access::Read);
        }
        // Diffs are kept in the order they were made (rising `seq`), and a page read every
        // epoch keeps one per epoch until a collection, of which the reader usually lacks the
        // newest only: find the first it lacks from the end (touching only what it gets).
        let kept = &self.pages[p.idx()].diffs;
        let lacked = kept.iter().rev().take_while(|d| d.seq > after_seq).count();
        let diffs = kept[kept.len() - lacked..]
            .iter()
            .filter(|d| d.first <= want)
            .map(|d| DiffWire { seq: d.seq, first_vt: d.first_vt.clone(), diff: d.diff.clone() })
            .collect();
        PageDiffs { page: p, diffs }
    }

    /// `from`'s diffs of `p` for our miss; `last`: the last of them (not `continued` in the
    /// next reply).
    pub(crate) fn handle_diff_reply(
        &mut self,
        from: NodeId,
        p: PageIdx,
        diffs: DiffList,
        last: bool,
    ) -> Result<(), ProtocolError> {
        let slot = self.misses.get_mut(&p).and_then(|m| {
            let i = m.asked.iter().position(|(n, _, answered)| *n == from && !answered)?;
            m.asked[i].2 = last;
            Some(m)
        });
        let Some(miss) = slot else {
            return Err(ProtocolError::Unexpected { from, what: format!("diff reply for {p}") });
        };
        // A writer's diffs of a page come in the order it made them, each once, whatever the
        // number of replies they come in.
        let mut prev = miss.diffs.iter().rev().find(|(n, _)| *n == from).map(|(_, d)| d.seq);
        for d in &diffs {
            if let Some(before) = prev.filter(|&s| d.seq <= s) {
                return Err(ProtocolError::Unexpected {
                    from,
                    what: format!("diff {} of {p} after its diff {before}", d.seq),
                });
            }
            prev = Some(d.seq);
        }
        if last {
            miss.diffs.extend(diffs.into_iter().map(|d| (from, d)));
            // The writer's replies are all in: what they hold no longer counts against it.
            if let Some(i) = miss.continued.iter().position(|(n, _)| *n == from) {
                self.held_continued[from.idx()] -= miss.continued.swap_remove(i).1;
            }
        } else {
            // Held past its message, for as many replies as the writer sends: out of the frame
            // it came in (a small diff would keep a whole frame alive), and counted.
            let bytes: u64 = diffs.iter().map(held_size).sum();
            match miss.continued.iter_mut().find(|(n, _)| *n == from) {
                Some((_, b)) => *b += bytes,
                None => miss.continued.push((from, bytes)),
            }
            miss.diffs.extend(diffs.into_iter().map(|d| (from, DiffWire { diff: d.diff.detached(), ..d })));
            let held = &mut self.held_continued[from.idx()];
            *held += bytes;
            let limit = super::gc::Accounting::parts_limit(self.cfg.consistency_limit);
            if *held > limit {
                return Err(ProtocolError::Unexpected {
                    from,
                    what: format!(
                        "{held} bytes of diffs in replies it said it would continue, over the {limit} \
                         this node holds from a peer (its TMK_CONSISTENCY_LIMIT, but at least 64 MiB)"
                    ),
                });
            }
        }
        if !last {
            return Ok(());
        }
        self.try_finish_miss(p)
    }

    /// Once every writer (and the base copy's holder) has answered: installs the base copy, then
    /// applies the diffs in timestamp order.
    fn try_finish_miss(&mut self, p: PageIdx) -> Result<(), ProtocolError> {
        let Some(miss) = self.misses.get(&p) else { return Ok(()) };
        if miss.asked.iter().any(|a| !a.2) || miss.base.as_ref().is_some_and(|b| b.1.is_none()) {
            return Ok(());
        }
        let mut miss = self.misses.remove(&p).expect("checked");
        for &(n, bytes) in &miss.continued {
            self.held_continued[n.idx()] -= bytes;
        }
        let nprocs = self.nprocs();
        if let Some((_, Some((bytes, holds)))) = miss.base.take() {
            self.mem.page_mut(p).copy_from_slice(&bytes);
            self.pages[p.idx()].base_from = None;
            // The diffs the copy holds are applied already (`serve_page` says why they must not
            // be applied again).
            for (n, &held) in holds.iter().enumerate().filter(|&(_, &h)| h != Held::default()) {
                let w = self.pages[p.idx()].writer(p, NodeId(n as u16), nprocs, &mut self.acct.tabled);
                w.applied_seq = w.applied_seq.max(held.seq);
                w.superseded = w.superseded.max(held.superseded);
            }
        }
        miss.diffs.sort_by_key(|(n, d)| (d.first_vt.sum(), *n, d.seq));
        for (n, d) in &miss.diffs {
            self.apply_diff(p, *n, d)?;
        }
        for (n, want, _) in &miss.asked {
            let w = self.pages[p.idx()].writer(p, *n, nprocs, &mut self.acct.tabled);
            w.applied = w.applied.max(*want);
        }
        invariant!(!self.pages[p.idx()].is_stale(), "{p} still stale after its miss");
        if miss.streamed {
            self.stream_done();
        }
        if miss.purpose == MissFor::Stream {
            self.stream_arrived(p, miss.write);
        } else if miss.write {
            self.make_twin(p);
        } else if miss.purpose == MissFor::Validate {
            // Made readable with the rest of the validation, in runs.
            self.validated.push(p);
        } else {
            self.mem.set_access(p, 1, Access::Read);
        }
        match miss.purpose {
            MissFor::App => {
                self.pending = Pending::None;
                self.done.push_back(AppDone::FaultResolved(p));
            }
            MissFor::Gc => self.gc_page_validated(),
            MissFor::Stream => {}
            MissFor::Validate => {
                let Pending::Validate { left, .. } = &mut self.pending else {
                    unreachable!("a validation miss outside request_validate")
                };
                *left -= 1;
                if *left == 0 {
                    let mut pages = std::mem::take(&mut self.validated);
                    pages.sort_unstable();
                    let Pending::Validate { then_write, whole, superseded, .. } =
                        std::mem::take(&mut self.pending)
                    else {
                        unreachable!("checked above")
                    };
                    // The fetched pages the view writes are twinned while still unmapped and
                    // mapped writable at once (made readable first, clearing their write
                    // protection would leave on userfaultfd a read-only entry whose first write
                    // faults in the kernel); the others are made readable.
                    let writes = sorted(&then_write);
                    let (to_twin, readable): (Vec<PageIdx>, Vec<PageIdx>) =
                        pages.into_iter().partition(|p| writes.binary_search(p).is_ok());
                    self.set_access_in_runs(readable, Access::Read);
                    self.twin_ahead_of_writes(&to_twin, &whole);
                    self.twin_ahead(&then_write, &whole, &superseded);
                    self.done.push_back(AppDone::Validated);
                }
            }
        }
        Ok(())
    }
}
