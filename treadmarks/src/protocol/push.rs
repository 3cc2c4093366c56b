//! Diffs pushed at barriers to the nodes that read a page before (a lazy hybrid).
//!
//! Plain lazy release consistency fetches a page's diffs when the page is touched after the
//! barrier that invalidated it: one round trip per writer, while the reader waits. Iterative
//! programs read the same pages from the same writers at every step (a grid's boundary rows, the
//! molecules of the last phase), so the writer can send those diffs before it is asked.
//!
//! - **Subscribing.** A writer that serves a diff request for page `p` from node `s` records
//!   `s` as a subscriber of `p`, with the newest of its diffs of `p` that `s` now has. Lock
//!   grants send subscribed pages too (`lock.rs`), and move that diff on like a push.
//! - **Pushing.** Arriving at a barrier, just after closing its interval, the writer plans to
//!   serve each subscriber as if it had asked for every change of a subscribed page up to the
//!   interval just closed (`upto`), and names the subscribers it will push to in its arrival.
//!   Once the arrival is sent ([`Node::run_deferred`]), the twins are cut exactly as for a
//!   request, and the diffs go out in one [`Message::DiffPush`] per subscriber, tagged with the
//!   barrier's episode (the number of barriers passed once it completes) and the subscriber's
//!   assumed newest diff (`after_seq`); cutting them overlaps the manager's turn. The manager
//!   tells each subscriber whom to wait for, and a node passes the barrier only with its pushes
//!   in hand (`barrier.rs`). Only pages with a twin to cut or a diff the subscriber lacks are
//!   sent, and only to a subscriber that gets at most [`PUSH_MAX_PAGES`] of them: pushes are for
//!   the small exchanges of every step (boundary rows); the pages past
//!   [`super::page::REPLY_BYTES`] of diffs are left out and fetched. A bulk transfer goes
//!   faster as a fetch, whose ramped requests overlap the writer's diffing, the transfer and
//!   the reader's applying; a push diffs every page before it goes out. (At 2 nodes the limit
//!   made fft 6%, radix 8% and lu 3% faster; the iterative codes push 2-16 pages a step.)
//! - **Using.** The subscriber keeps the pushed diffs aside; memory is not touched. When the page
//!   misses later (a fault or a view), a writer's pushed diffs stand in for the request to that
//!   writer if they are complete: we know all of its intervals up to `upto`, the notice we hold
//!   is not newer than `upto`, and we have applied every diff up to `after_seq`. Then they hold
//!   exactly what a request would have brought (every diff of the page with a first interval up
//!   to `upto` was cut when they were made, later twins start after `upto`, and a diff's first
//!   interval always carries a write notice), so the miss applies them in timestamp order like
//!   fetched ones. Otherwise they are dropped and the writer is asked as usual, which also
//!   brings its idea of what we have back in line.
//! - **Chaining.** A push of a page that comes while the writer's previous push of it is still
//!   unused continues it when the writer's `after_seq` is the newest diff we hold from that
//!   push: the two are kept as one, covering both epochs' notices. Programs whose phases read a
//!   page every other epoch (water reads the other node's molecules in its force phase only,
//!   while they are written in the two phases around it) so use the pushes: without chaining,
//!   the push after the unread phase found its predecessor unused, both were dropped and the
//!   page fetched, and 87% of water's pushed pages went unused. At most [`PUSH_CHAIN`] pushes
//!   chain.
//! - **Applying in place.** Once a miss has used a writer's push of a page, the writer's next
//!   [`IN_PLACE_CREDITS`] pushes of it are applied at the barrier they come with, where the page
//!   stands: a release whose notices would invalidate the page (only that writer's notices
//!   unapplied, the page read-only, the writer announced to push to us) leaves it valid until
//!   the pushes are in; passing the barrier then applies the push if it completes the page, in
//!   place (`PageMemory::page_mut_while_blocked`: the application waits in the barrier), or
//!   invalidates the page as usual. The reader is spared unmapping the page, the miss, and
//!   mapping it again (jacobi3d's 16 boundary pages an iteration). A page applied in place gives
//!   no sign of being read, so when the credits run out the next push waits for a miss again:
//!   read, the credits come back; unread, the reader unsubscribes as below.
//! - **Unsubscribing.** Pushed diffs not used within [`PUSH_EPOCHS`] epochs of their chain's
//!   last push (the epoch it came with and the two after it), or whose next push cannot continue
//!   the chain, were not needed: they are dropped, and the writer is told
//!   ([`Message::Unsubscribe`]), so a page read once costs at most [`PUSH_CHAIN`] + 1 wasted
//!   pushes. Three epochs, not one: water's energy sums are written under a lock just before a
//!   step's last barrier and read under it two barriers later; kept for one epoch, every push
//!   of them was dropped, the reader unsubscribed, and the acquire that followed fetched the
//!   page, whose last diff the grant could not carry (its notice came with the barrier).
//!   Water at 2 nodes: 0.0551 → 0.0541 s (six alternated runs, medians, with the faster local
//!   acquire of that session).
//! - **Skipping.** A page written in the epoch after a barrier would be pushed again at the
//!   next one, so if its reader reads it only after that, the first push was for nothing: cut,
//!   sent and applied on the critical path of a barrier, where one cut at the next barrier would
//!   have carried both epochs' writes. The writer keeps, per subscribed page, the barriers at
//!   which it had something to push (its write history, one bit per episode); when the history
//!   repeats with a period of at most [`SKIP_PERIOD_MAX`] over three periods and says the next
//!   epoch writes the page again, the push is skipped. A subscriber that fetches a page whose
//!   push was skipped at the last barrier read it in between, and the page is pushed to it at
//!   every barrier again. Water writes its molecules in `correct` and `predict`, the epochs on
//!   either side of a step's last barrier, and reads them after the first barrier of the next
//!   step: its molecule pages were pushed at the last barrier only to be chained to (or applied
//!   in place before) the next push. Skipping it: water at 2 nodes 0.0537 → 0.0526 s (12
//!   alternated runs, medians; skipping every push at that barrier from the first step, a hack
//!   keyed to the episode number, gave 0.0538 → 0.0510 s). SOR's and Jacobi's pages, written
//!   every other epoch, show period 2 and are pushed at every barrier as before.
//! - **Collections** drop every subscription and every pushed diff, on both sides. A push is sent
//!   once its writer's arrival is out, before anyone knows whether the barrier collects: one that
//!   reaches its subscriber before the collecting release is kept, and may serve the
//!   collection's own validations (it is exactly what a request would bring); one that arrives
//!   while its receiver collects, or after, is dropped.
//! - **Bounds.** A writer pushes to a subscriber at most once a barrier episode, at most
//!   [`PUSH_MAX_PAGES`] pages and [`super::page::REPLY_BYTES`] of diffs, and a subscriber passes
//!   an episode only with its announced pushes in. A push beyond that (a second one of an
//!   episode, a larger one, one for an episode passed without it) is refused by name
//!   (`handle_diff_push`), so what a peer makes a node hold, pushes kept for [`PUSH_EPOCHS`]
//!   epochs and chained [`PUSH_CHAIN`] deep with the frames they came in, stays bounded with no
//!   barrier to sweep it.

use super::ProtocolError;
use super::ids::{DiffSeq, IntervalIdx, NodeId, PageIdx};
use super::memory::{Access, PageMemory};
use super::msg::{DiffAsk, DiffList, DiffWire, Message, PageDiffs, UnaskedDiffs};
use super::node::{Node, Pending};
use super::page::{PageMeta, WriterState, wire_bytes};
use std::collections::{BTreeMap, BTreeSet};

/// Most pages pushed to one subscriber at one barrier; a subscriber that would get more is
/// not pushed to at that barrier (it fetches what it touches, as without pushes).
pub const PUSH_MAX_PAGES: usize = 64;

/// Most pushes of one page by one writer kept as one while unused (see the module docs).
pub const PUSH_CHAIN: u32 = 2;

/// Epochs an unused push is kept: the one it came with and the next two (see the module docs).
pub const PUSH_EPOCHS: u64 = 3;

/// Longest period of a page's write history that predicts a rewrite ("Skipping" in the module
/// docs): a step of up to this many barriers.
pub const SKIP_PERIOD_MAX: u32 = 8;

/// A page's write history: bit `i` of `bits` is set if the page had something to push at
/// barrier episode `last - i`; `first` is the episode of its first record.
#[derive(Clone, Copy, Debug)]
struct WriteHistory {
    last: u64,
    first: u64,
    bits: u64,
}

impl WriteHistory {
    /// The page had something to push at `episode` (at least the last one recorded).
    fn record(&mut self, episode: u64) {
        let shift = episode - self.last;
        let older = if shift >= 64 { 0 } else { self.bits << shift };
        self.bits = older | 1;
        self.last = episode;
    }

    /// Whether the history predicts a write in the epoch after `episode` (the last recorded):
    /// it repeats with some period `t` over its last `3 t` episodes, all recorded, and the
    /// episode `t - 1` back was written.
    fn rewrite_predicted(&self) -> bool {
        (1..=SKIP_PERIOD_MAX).find_map(|t| {
            let span = 3 * u64::from(t);
            if self.last - self.first + 1 < span {
                return None;
            }
            let mask = (1u64 << (span - u64::from(t))) - 1;
            (self.bits & mask == (self.bits >> t) & mask).then_some(self.bits >> (t - 1) & 1 == 1)
        }) == Some(true)
    }
}

/// Pushes of one page by one writer applied in place after a miss used one (see the module
/// docs): of every `IN_PLACE_CREDITS + 1` pushes of a page read every epoch, one is left to a
/// miss, which checks that the page is still read.
pub const IN_PLACE_CREDITS: u32 = 8;

/// Diffs a writer pushed to us for one page, kept until a miss uses them or the epoch ends.
#[derive(Debug, Clone)]
pub(crate) struct Pushed {
    /// Barrier episode they were pushed at (the newest push's, when chained).
    episode: u64,
    /// Newest interval of the writer they cover.
    upto: IntervalIdx,
    /// The writer assumed we had applied its diffs of the page up to this one.
    after_seq: DiffSeq,
    diffs: DiffList,
    /// Pushes chained into this entry.
    pushes: u32,
}

impl Pushed {
    /// The newest of the writer's diffs we hold through this entry: what the writer assumes we
    /// have after it, and so the `after_seq` of a push that continues it.
    fn newest(&self) -> DiffSeq {
        self.diffs.iter().map(|d| d.seq).max().unwrap_or(0).max(self.after_seq)
    }
}

/// Both sides of pushing: the subscribers of our pages, and the diffs pushed to us.
#[derive(Debug, Default)]
pub(crate) struct PushState {
    /// Per page we wrote, the nodes that read it, with the newest of our diffs each has.
    subscribers: BTreeMap<PageIdx, Vec<(NodeId, DiffSeq)>>,
    /// Diffs pushed to us, by page and writer.
    pushed: BTreeMap<(PageIdx, NodeId), Pushed>,
    /// Episode of the last collecting barrier (pushes for it or earlier are stale).
    collected_at: u64,
    /// Subscribed pages whose twin was cut (a diff made) since the last push: with the pages
    /// twinned now, the only ones that can have something to push. A set, each page once: a
    /// phase of locks alone passes no barrier to empty it, and a peer's every request could
    /// name a page again (a list grew by a page an ask, without end).
    cut_since_push: BTreeSet<PageIdx>,
    /// Subscribed pages looked at by pushes so far (tests check it does not grow with pages
    /// read once and left alone).
    pub(crate) examined: u64,
    /// The push planned at our barrier arrival, to cut and send once the arrival is out: per
    /// subscriber (at most [`PUSH_MAX_PAGES`] pages each, none empty), with its episode and
    /// `upto`.
    planned: Vec<(NodeId, Vec<DiffAsk>)>,
    planned_for: (u64, IntervalIdx),
    /// Per subscribed page, the barriers at which it had something to push ("Skipping").
    written: BTreeMap<PageIdx, WriteHistory>,
    /// (page, subscriber) whose push the last barrier skipped.
    skipped: Vec<(PageIdx, NodeId)>,
    /// (page, subscriber) that fetched the page after its push was skipped: always pushed.
    never_skip: std::collections::BTreeSet<(PageIdx, NodeId)>,
    /// Pushes received for barrier episodes not passed yet: (episode, writer).
    arrived: Vec<(u64, NodeId)>,
    /// Per page and writer whose push a miss used: how many of its next pushes are applied in
    /// place.
    credits: BTreeMap<(PageIdx, NodeId), u32>,
    /// While a barrier is being passed: the writers announced to push to us, and the pages whose
    /// invalidation waits for their pushes.
    expected_from: Vec<NodeId>,
    deferred: Vec<PageIdx>,
}

impl PushState {
    fn subscribe(&mut self, p: PageIdx, s: NodeId, seq: DiffSeq) {
        if !self.advance(p, s, seq) {
            self.subscribers.entry(p).or_default().push((s, seq));
        }
    }

    /// Sets the newest diff of `p` that subscriber `s` has, if it subscribes; returns whether it
    /// does.
    fn advance(&mut self, p: PageIdx, s: NodeId, seq: DiffSeq) -> bool {
        let mut subs = self.subscribers.get_mut(&p).into_iter().flatten();
        subs.find(|(n, _)| *n == s).map(|entry| entry.1 = seq).is_some()
    }
}

impl<M: PageMemory> Node<M> {
    /// Subscribed pages whose twin was cut since the last push (tests check the set's bound).
    #[cfg(test)]
    pub(crate) fn cut_since_push_len(&self) -> usize {
        self.push.cut_since_push.len()
    }

    /// A diff of page `p` was just made: remember the page for the next push if somebody
    /// subscribes to it.
    pub(crate) fn note_cut(&mut self, p: PageIdx) {
        if self.push.subscribers.contains_key(&p) {
            self.push.cut_since_push.insert(p);
        }
    }

    /// Node `s`'s subscription to our page `p` (it fetched the page from us and has not left
    /// pushed diffs of it unused since): the newest of our diffs of `p` it has.
    pub(crate) fn subscription(&self, p: PageIdx, s: NodeId) -> Option<DiffSeq> {
        self.push.subscribers.get(&p)?.iter().find(|&&(n, _)| n == s).map(|&(_, seq)| seq)
    }

    /// Diffs of page `p` went to node `s` unasked, on a grant: if it subscribes to the page, it
    /// has them now (as a push assumes; if it could not apply them, its next fetch sets this
    /// right).
    pub(crate) fn sent_to_subscriber(&mut self, p: PageIdx, s: NodeId, diffs: &[DiffWire]) {
        let Some(newest) = diffs.iter().map(|d| d.seq).max() else { return };
        let mut subs = self.push.subscribers.get_mut(&p).into_iter().flatten();
        if let Some(entry) = subs.find(|(n, _)| *n == s) {
            entry.1 = entry.1.max(newest);
        }
    }

    /// After serving `asks` from `from` with `served` (in the same order): `from` subscribes to
    /// those pages, and now has every diff it was sent.
    pub(crate) fn note_subscribers(&mut self, from: NodeId, asks: &[DiffAsk], served: &[PageDiffs]) {
        self.note_sent(from, asks, served, true);
    }

    /// [`Node::note_subscribers`], or with `subscribe` false (a push, planned before `to` may have
    /// unsubscribed) only for the pages `to` still subscribes to.
    fn note_sent(&mut self, to: NodeId, asks: &[DiffAsk], served: &[PageDiffs], subscribe: bool) {
        if !self.cfg.push {
            return;
        }
        for (a, pd) in asks.iter().zip(served) {
            let newest = pd.diffs.iter().map(|d| d.seq).max().unwrap_or(0).max(a.after_seq);
            if subscribe {
                self.push.subscribe(a.page, to, newest);
            } else if !self.push.advance(a.page, to, newest) {
                continue;
            }
            // It asked up to an older interval than our newest diff: that one is for the next push.
            if self.pages[a.page.idx()].diffs.last().is_some_and(|d| d.seq > newest) {
                self.push.cut_since_push.insert(a.page);
            }
        }
    }

    /// At barrier arrival, with the interval closed: plans to push to every subscriber the diffs
    /// of its pages that changed since it last got them (see the module docs); returns the
    /// subscribers that get a push. `Node::send_planned_push` sends it.
    pub(crate) fn plan_push(&mut self) -> Vec<NodeId> {
        if self.push.subscribers.is_empty() {
            self.push.cut_since_push.clear();
            self.push.skipped.clear();
            return Vec::new();
        }
        let closed = self.vt.get(self.me);
        let episode = self.stats.barriers + 1;
        let mut asks: Vec<Vec<DiffAsk>> = vec![Vec::new(); self.nprocs()];
        // Only a subscribed page with a twin from a closed interval, or cut since the last push,
        // can have a twin to cut or a diff a subscriber lacks (a twin kept unchanged for the open
        // interval holds nothing new). Walking the smaller of the two sets (twins, subscribed
        // pages) keeps a barrier's cost from growing with the other: 4,000 pages read once made
        // every later barrier at 2 nodes 60 µs instead of 25 when all subscriptions were walked,
        // and SOR, which keeps a thousand pages twinned and a few subscribed, lost 8% when all
        // twins were.
        let mut candidates: Vec<PageIdx> =
            std::mem::take(&mut self.push.cut_since_push).into_iter().collect();
        let cuttable = |p: &PageIdx| self.pages[p.idx()].twin.is_some_and(|first| first <= closed);
        let (twinned, subscribers) = (&self.twinned, &self.push.subscribers);
        if twinned.len() <= subscribers.len() {
            candidates.extend(twinned.iter().copied().filter(|p| subscribers.contains_key(p) && cuttable(p)));
        } else {
            // `twinned` holds exactly the pages with a twin: ask each page's twin, not the set.
            candidates.extend(subscribers.keys().copied().filter(cuttable));
        }
        candidates.sort_unstable();
        candidates.dedup();
        let mut skips: Vec<Vec<PageIdx>> = vec![Vec::new(); self.nprocs()];
        for p in candidates {
            let Some(subs) = self.push.subscribers.get(&p) else { continue };
            self.push.examined += 1;
            let meta = &self.pages[p.idx()];
            let twin_to_cut = meta.twin.is_some_and(|first| first <= closed);
            let newest = meta.diffs.last().map_or(0, |d| d.seq);
            // Cut for a grant or a request since, and sent along: nothing new for anybody.
            if !twin_to_cut && subs.iter().all(|&(_, seq)| newest <= seq) {
                continue;
            }
            let history =
                self.push.written.entry(p).or_insert(WriteHistory { last: episode, first: episode, bits: 0 });
            history.record(episode);
            let rewritten = self.cfg.push_skip && history.rewrite_predicted();
            for &(s, seq) in subs {
                if !(twin_to_cut || newest > seq) {
                    continue;
                }
                if rewritten && !self.push.never_skip.contains(&(p, s)) {
                    skips[s.idx()].push(p);
                    continue;
                }
                asks[s.idx()].push(DiffAsk { page: p, want: closed, after_seq: seq });
            }
        }
        // Skips count only where the push would have gone: a subscriber over the limit fetches
        // anyway, and its fetch must not read as a sign that a skip was wrong.
        self.push.skipped.clear();
        let max = self.cfg.limits.push_max_pages;
        for (s, pages) in skips.into_iter().enumerate() {
            if !pages.is_empty() && asks[s].len() + pages.len() <= max {
                self.stats.pushes_skipped += pages.len() as u64;
                self.push.skipped.extend(pages.into_iter().map(|p| (p, NodeId(s as u16))));
            }
        }
        self.push.planned = (asks.into_iter().enumerate())
            .filter(|(_, asks)| !asks.is_empty() && asks.len() <= max)
            .map(|(s, asks)| (NodeId(s as u16), asks))
            .collect();
        self.push.planned_for = (episode, closed);
        self.push.planned.iter().map(|(to, _)| *to).collect()
    }

    /// Whether a push planned at our barrier arrival is still to be sent.
    pub(crate) fn push_planned(&self) -> bool {
        !self.push.planned.is_empty()
    }

    /// A collecting barrier drops pushes: the planned one is not sent.
    pub(crate) fn drop_planned_push(&mut self) {
        self.push.planned.clear();
    }

    /// Whether `from`'s push for barrier episode `episode` has come.
    pub(crate) fn push_arrived(&self, episode: u64, from: NodeId) -> bool {
        self.push.arrived.contains(&(episode, from))
    }

    /// Cuts the twins of the push planned at our barrier arrival and sends it, one message per
    /// subscriber. The application waits in the barrier until it is sent (`try_pass`), so
    /// the twins are cut without revoking write access first.
    pub(crate) fn send_planned_push(&mut self) {
        assert!(
            matches!(self.pending, Pending::Barrier(_)),
            "a push sent outside the barrier it was planned at ({:?})",
            self.pending
        );
        let (episode, closed) = self.push.planned_for;
        for (to, mut asks) in std::mem::take(&mut self.push.planned) {
            let mut served = self.serve_diff_request(&asks, true);
            // The pages past `limits.reply_bytes` are left out; the subscriber fetches them.
            let mut bytes = 0;
            let fit = served
                .iter()
                .take_while(|pd| {
                    bytes += wire_bytes([&pd.diffs]);
                    bytes <= self.cfg.limits.reply_bytes
                })
                .count();
            served.truncate(fit);
            // Their twins may be cut now: looked at again at the next barrier.
            self.push.cut_since_push.extend(asks.drain(fit..).map(|a| a.page));
            // An unsubscribe that came since the push was planned stands: the push still goes
            // (it was announced), but subscribes nobody again.
            self.note_sent(to, &asks, &served, false);
            // A page whose twin turned out unchanged goes too, with no diffs: its notice still
            // stands, and the push saves the subscriber asking for nothing.
            let pages: Vec<UnaskedDiffs> = asks
                .iter()
                .zip(served)
                .map(|(a, pd)| UnaskedDiffs { page: pd.page, after_seq: a.after_seq, diffs: pd.diffs })
                .collect();
            self.stats.diffs_pushed += pages.iter().map(|pd| pd.diffs.len() as u64).sum::<u64>();
            self.outbox.push_back((to, Message::DiffPush { episode, upto: closed, pages }));
        }
    }

    pub(crate) fn handle_diff_push(
        &mut self,
        from: NodeId,
        episode: u64,
        upto: IntervalIdx,
        pages: Vec<UnaskedDiffs>,
    ) -> Result<(), ProtocolError> {
        for pd in &pages {
            self.check_page(from, pd.page)?;
        }
        let passed = self.stats.barriers;
        let bytes = wire_bytes(pages.iter().map(|pd| &pd.diffs));
        let most_bytes = self.cfg.limits.reply_bytes.max(super::page::REPLY_BYTES);
        // The writer passed every barrier before `episode`, so we have arrived at `episode - 1`.
        // It pushes to us once an episode, with at most `push_max_pages` pages and `reply_bytes`
        // of diffs (the default's, if ours is lower), and we pass an episode only once its
        // announced pushes are in: a push for the episode we passed last comes late only if
        // that barrier collected (and is dropped below). So what a peer can make us hold is
        // bounded (the module docs' "Bounds").
        let refused = if from == self.me || episode > passed + 2 {
            Some("from a barrier episode the writer cannot have reached")
        } else if pages.len() > self.cfg.limits.push_max_pages || bytes > most_bytes {
            Some("larger than any node pushes")
        } else if episode > passed && self.push.arrived.contains(&(episode, from)) {
            Some("a second push of one episode")
        } else if episode == passed && episode > self.push.collected_at {
            Some("for an episode passed without it")
        } else {
            None
        };
        if let Some(why) = refused {
            return Err(ProtocolError::Unexpected {
                from,
                what: format!(
                    "diff push of {} pages and {bytes} bytes of diffs for barrier episode {episode} \
                     (we passed {passed}): {why}",
                    pages.len()
                ),
            });
        }
        if episode > passed {
            self.push.arrived.push((episode, from));
        }
        // Pushed for an epoch that is over, or before a collection (whose state is gone).
        if episode < passed || episode <= self.push.collected_at || self.gc.is_some() {
            self.stats.pushes_wasted += pages.len() as u64;
            return Ok(());
        }
        let mut unused = Vec::new();
        for pd in pages {
            let asking = self.misses.get(&pd.page).is_some_and(|m| m.asked.iter().any(|a| a.0 == from));
            if asking {
                self.stats.pushes_wasted += 1;
                continue;
            }
            // An earlier push of the page still unused: chain the new one to it if it continues
            // it (see the module docs). Otherwise we do not read the page, and the new push
            // could not be used either: it assumes we applied the earlier one.
            if let Some(mut held) = self.push.pushed.remove(&(pd.page, from)) {
                if held.pushes < PUSH_CHAIN && pd.after_seq == held.newest() && upto >= held.upto {
                    held.diffs.extend(pd.diffs);
                    (held.episode, held.upto, held.pushes) = (episode, upto, held.pushes + 1);
                    self.stats.pushes_chained += 1;
                    self.push.pushed.insert((pd.page, from), held);
                    continue;
                }
                self.stats.pushes_wasted += u64::from(held.pushes) + 1;
                unused.push(pd.page);
                continue;
            }
            let entry = Pushed { episode, upto, after_seq: pd.after_seq, diffs: pd.diffs, pushes: 1 };
            self.push.pushed.insert((pd.page, from), entry);
        }
        if !unused.is_empty() {
            self.outbox.push_back((from, Message::Unsubscribe { pages: unused }));
        }
        self.note_push_for_passing(from, episode)
    }

    pub(crate) fn handle_unsubscribe(
        &mut self,
        from: NodeId,
        pages: Vec<PageIdx>,
    ) -> Result<(), ProtocolError> {
        for &p in &pages {
            self.check_page(from, p)?;
        }
        for p in pages {
            if let Some(subs) = self.push.subscribers.get_mut(&p) {
                subs.retain(|(n, _)| *n != from);
                if subs.is_empty() {
                    self.push.subscribers.remove(&p);
                    self.push.written.remove(&p);
                }
            }
        }
        Ok(())
    }

    /// The diffs `w` pushed for page `p`, if they complete `p` for `w` (whose state we hold is
    /// `st`); taken either way.
    pub(crate) fn take_pushed(&mut self, p: PageIdx, w: NodeId, st: WriterState) -> Option<DiffList> {
        let e = self.push.pushed.remove(&(p, w))?;
        if self.completes(&e, w, st) {
            self.stats.pushes_used += u64::from(e.pushes);
            Some(e.diffs)
        } else {
            self.stats.pushes_wasted += u64::from(e.pushes);
            None
        }
    }

    /// Whether diffs `w` pushed of page `p` are exactly what a request would bring, given our
    /// state `st` of that writer (see [`Node::take_pushed`]).
    pub(crate) fn pushed_usable(&self, p: PageIdx, w: NodeId, st: WriterState) -> bool {
        self.push.pushed.get(&(p, w)).is_some_and(|e| self.completes(e, w, st))
    }

    /// The newest diff of `w`'s usable push of page `p` (see [`Node::pushed_usable`]).
    pub(crate) fn pushed_newest(&self, p: PageIdx, w: NodeId, st: WriterState) -> Option<DiffSeq> {
        let e = self.push.pushed.get(&(p, w))?;
        self.completes(e, w, st).then(|| e.newest())
    }

    /// Whether pushed diffs `e` of writer `w` cover exactly the notices of it we hold unapplied.
    fn completes(&self, e: &Pushed, w: NodeId, st: WriterState) -> bool {
        e.upto <= self.vt.get(w) && e.upto >= st.noticed && e.after_seq <= st.applied_seq
    }

    /// A barrier passed: pushed diffs whose [`PUSH_EPOCHS`] epochs ended with it were not
    /// needed. Drops them and unsubscribes from their pages.
    pub(crate) fn sweep_pushed(&mut self) {
        let passed = self.stats.barriers;
        self.push.arrived.retain(|&(episode, _)| episode > passed);
        let mut unused: Vec<Vec<PageIdx>> = vec![Vec::new(); self.nprocs()];
        let mut wasted = 0;
        let credits = &mut self.push.credits;
        self.push.pushed.retain(|&(p, w), e| {
            let keep = e.episode + PUSH_EPOCHS > passed;
            if !keep {
                credits.remove(&(p, w));
                unused[w.idx()].push(p);
                wasted += u64::from(e.pushes);
            }
            keep
        });
        self.stats.pushes_wasted += wasted;
        for (w, pages) in unused.into_iter().enumerate() {
            if !pages.is_empty() {
                self.outbox.push_back((NodeId(w as u16), Message::Unsubscribe { pages }));
            }
        }
    }

    /// A miss used `w`'s push of page `p`: its next pushes are applied in place.
    pub(crate) fn note_push_read(&mut self, p: PageIdx, w: NodeId) {
        self.push.credits.insert((p, w), IN_PLACE_CREDITS);
    }

    /// Released from a barrier that is not a collection: `from` announced pushes to us.
    pub(crate) fn expect_pushes(&mut self, from: Vec<NodeId>) {
        self.push.expected_from = from;
    }

    /// Whether some invalidation may wait for pushes: a barrier's release announced some.
    pub(crate) fn may_defer_invalidations(&self) -> bool {
        !self.push.expected_from.is_empty()
    }

    /// Whether the invalidation of page `p`, whose notices a barrier's release just applied,
    /// waits for the pushes (see the module docs): its only stale writer announced a push, has
    /// credit for the page, and the page is read-only and wholly ours to update.
    pub(crate) fn defers_invalidation(&self, p: PageIdx) -> bool {
        if !self.may_defer_invalidations() {
            return false;
        }
        let meta = &self.pages[p.idx()];
        let Some((w, _)) = sole_stale_writer(meta) else { return false };
        self.push.expected_from.contains(&w)
            && self.push.credits.get(&(p, w)).is_some_and(|&c| c > 0)
            && self.mem.access(p) == Access::Read
            && meta.twin.is_none()
            && meta.base_from.is_none()
            && !self.misses.contains_key(&p)
    }

    /// Pages whose invalidation waits for the barrier's pushes.
    pub(crate) fn defer_invalidation(&mut self, pages: Vec<PageIdx>) {
        self.push.deferred.extend(pages);
    }

    /// Passing the barrier, every push in: applies in place the pushes that complete a deferred
    /// page, and invalidates the other deferred pages. The application still waits.
    pub(crate) fn settle_deferred(&mut self) -> Result<(), ProtocolError> {
        self.push.expected_from.clear();
        let mut invalid = Vec::new();
        for p in std::mem::take(&mut self.push.deferred) {
            let meta = &self.pages[p.idx()];
            let Some((w, st)) = sole_stale_writer(meta) else {
                // No notice arrives while the application waits; should one have, the page is
                // invalidated as usual.
                if meta.is_stale() {
                    invalid.push(p);
                }
                continue;
            };
            // An unusable push stays for the miss to judge (and count).
            if !self.pushed_usable(p, w, st) {
                invalid.push(p);
                continue;
            }
            let diffs = self.take_pushed(p, w, st).expect("a usable push is taken");
            self.complete_from(p, w, diffs, true)?;
            self.stats.pushes_in_place += 1;
            if let Some(c) = self.push.credits.get_mut(&(p, w)) {
                *c = c.saturating_sub(1);
            }
        }
        invalid.sort_unstable();
        self.invalidate(&invalid);
        Ok(())
    }

    /// `from` asks for pages: those whose push to it the last barrier skipped were read before
    /// the next one, and are pushed to it at every barrier from now on ("Skipping").
    pub(crate) fn note_fetched_after_skip(&mut self, from: NodeId, asks: &[DiffAsk]) {
        for a in asks {
            if self.push.skipped.contains(&(a.page, from)) {
                self.push.never_skip.insert((a.page, from));
            }
        }
    }

    /// A collection dropped the consistency data that subscriptions and pushed diffs refer to.
    pub(crate) fn forget_pushes(&mut self) {
        self.push.subscribers.clear();
        self.push.written.clear();
        self.push.skipped.clear();
        self.push.cut_since_push.clear();
        self.push.credits.clear();
        self.stats.pushes_wasted += self.push.pushed.values().map(|e| u64::from(e.pushes)).sum::<u64>();
        self.push.pushed.clear();
        self.push.collected_at = self.stats.barriers + 1;
    }
}

/// The one writer of a page whose notices we have not all applied, with our state of it; `None`
/// if there are none or several.
fn sole_stale_writer(meta: &PageMeta) -> Option<(NodeId, WriterState)> {
    let mut stale = meta.writers.iter().enumerate().filter(|(_, st)| st.noticed > st.applied);
    match (stale.next(), stale.next()) {
        (Some((w, &st)), None) => Some((NodeId(w as u16), st)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The history after recording at the episodes where `written` is true, from episode 1.
    fn history(written: &[bool]) -> WriteHistory {
        let first = 1 + written.iter().position(|&w| w).expect("a write") as u64;
        let mut h = WriteHistory { last: first, first, bits: 0 };
        for (i, _) in written.iter().enumerate().filter(|(_, w)| **w) {
            h.record(1 + i as u64);
        }
        h
    }

    #[test]
    fn a_rewrite_is_predicted_from_three_periods_of_history() {
        let water = |steps: usize| -> Vec<bool> { (0..steps).flat_map(|_| [true, false, true]).collect() };
        // Written before barriers 1 and 3 of each step of 3: after barrier 3 comes barrier 1's
        // epoch, which writes; after barrier 1 comes barrier 2's, which does not.
        assert!(history(&water(3)).rewrite_predicted(), "at barrier 3 of the third step");
        let mut at_1 = water(3);
        at_1.push(true);
        assert!(!history(&at_1).rewrite_predicted(), "at barrier 1 of the fourth step");
        // Two periods are not enough.
        assert!(!history(&water(2)).rewrite_predicted());
        // Written every other epoch (SOR's red and black pages): never rewritten next.
        let sor: Vec<bool> = (0..12).map(|i| i % 2 == 0).collect();
        assert!(!history(&sor).rewrite_predicted());
        // Written every epoch: rewritten next, once three epochs were seen.
        assert!(history(&[true; 3]).rewrite_predicted());
        assert!(!history(&[true; 2]).rewrite_predicted());
        // No period of at most SKIP_PERIOD_MAX: nothing predicted.
        let irregular = [true, true, false, true, false, false, true, true, true, false, false, false, true];
        assert!(!history(&irregular).rewrite_predicted());
        // A gap longer than the bits hold starts over.
        let mut h = history(&[true; 5]);
        h.record(h.last + 100);
        assert_eq!(h.bits, 1);
    }
}
