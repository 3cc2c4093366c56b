//! The service thread: drives the [`Node`] of a multi-node job from three sources — frames from
//! peers, commands from the application, faults from the signal handler — on a current-thread
//! tokio runtime (one thread: the two cores are shared with the application). The node sits
//! behind a mutex it shares with the application thread, which runs the lock operations and view
//! validations that need no message itself ([`super::Engine`]); everything else runs here.
//!
//! Whoever locks the node first drains the twins the fault handler made on its own
//! ([`super::lock_node`]), so the node knows every writable page before it closes an interval or
//! serves a diff.
//!
//! While the application waits for an answer (a command's reply, a fault's resolution), the
//! thread may poll its sockets instead of sleeping in `epoll` (the spin budget, see
//! [`crate::config::Config::service_spin`]): an answer then needs no wake-up of this thread,
//! which on a virtual machine costs an inter-processor interrupt and tens of microseconds.
//! Polling stops when the answer is handed over, or when the budget is spent; a peer's message
//! during the wait starts the budget again (the next tends to follow).
//!
//! Failure: a peer that dies, leaves early or sends garbage, or a protocol error, fails the job.
//! The application gets an error from its pending or next call; if it is blocked in a page fault
//! (where no error can be returned) the node prints why and exits with status 1 once its abort
//! is on its way to the peers ([`ABORT_FLUSH`]). Otherwise the node exits the same way a grace
//! period ([`GRACE`]) after the failure unless the application has dropped its `Tmk` by then,
//! whatever it does meanwhile (computing without calling into the runtime, or handling the
//! error); if it faults in that period, it waits out the period in its fault.

use super::{Command, Mailbox, Reply, SharedNode, lock_node, start};
use crate::error::Error;
use crate::failure::JobFailure;
use crate::mem::{FaultKind, Heap, HeapPages, ServiceFd, register_service_fd};
use crate::protocol::{AppDone, Message, Node, NodeId, ProtocolError, decode_sharing};
use crate::stats::Stats;
use crate::transport::{CloseCause, LinkEvent, Links, Mesh, codec};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

/// How long a node whose job failed waits for its application to notice before exiting.
const GRACE: Duration = Duration::from_secs(3);
/// How long a node whose job failed while its application is blocked in a fault goes on before
/// it ends itself (`Service::fail`), its links then flushed ([`EXIT_FLUSH`]).
const ABORT_FLUSH: Duration = Duration::from_millis(100);
/// How long a node waits, at its exit or its shutdown, for its peers to close their links.
const GOODBYE_WAIT: Duration = Duration::from_secs(5);
/// How long a node that ends itself on a failure ([`ABORT_FLUSH`], [`GRACE`]) waits for its link
/// writers to put what they hold on the wire whole, the aborts with it: a frame cut by the exit
/// reads to the peer as garbage, and an abort never written leaves it only an end of stream.
const EXIT_FLUSH: Duration = Duration::from_secs(1);
/// How long such a node then reads what its peers still send, so that its sockets close without
/// unread input (whose reset would throw away what the kernel had not sent yet).
const EXIT_DRAIN: Duration = Duration::from_millis(200);

#[derive(Debug, Clone, Copy, PartialEq)]
enum App {
    Running,
    InFault(Instant),
    InCommand,
}

struct Service {
    me: NodeId,
    node: SharedNode,
    heap: Arc<Heap>,
    mailbox: Arc<Mailbox>,
    links: Links,
    stats: Stats,
    app: App,
    failed: Option<JobFailure>,
    exiting: bool,
    exited: bool,
    shutdown: bool,
    /// When the collection in progress began.
    gc_started: Option<Instant>,
    open: Vec<bool>,
    /// How long to poll instead of sleeping once the application waits.
    spin: Duration,
    /// Until when to poll: set when the application starts waiting, cleared when it resumes.
    spin_until: Option<Instant>,
    /// A synchronization waiting for the pages of streaming views to arrive first
    /// (`protocol/stream.rs`): started once the node has settled.
    after_settle: Option<Command>,
    /// Completions handed to the application while it ran (of requests its own thread started
    /// and that asked a peer after all) whose `Command::AwaitStarted` has not come yet: that
    /// command is then answered already.
    answered_unasked: u32,
}

/// Starts the service thread for `node` over `mesh` (real-time if `service_rt` and allowed);
/// returns once its links are up.
pub(crate) fn spawn(
    node: SharedNode,
    heap: Arc<Heap>,
    mailbox: Arc<Mailbox>,
    mesh: Mesh,
    service_rt: bool,
    spin: Duration,
    malloc_reserve: usize,
) -> crate::Result<std::thread::JoinHandle<()>> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (me, nprocs) = {
        let n = node.lock().expect("node");
        (n.id(), n.nprocs())
    };
    let name = format!("tmk-service-{}", me.0);
    let handle = std::thread::Builder::new()
        .name(name)
        .spawn(move || {
            if service_rt {
                crate::mem::sched::prioritize_service_thread();
            }
            if malloc_reserve > 0 {
                crate::mem::malloc::keep_freed();
                crate::mem::malloc::warm_thread_heap(malloc_reserve);
            }
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return drop(ready_tx.send(Err(Error::Failed(format!("cannot start tokio: {e}"))))),
            };
            // A panic in here is a broken invariant (or an mprotect the kernel refused, which no
            // call can report); the application thread may be blocked waiting on this thread, so
            // end the process rather than leave it hanging.
            let served = std::panic::catch_unwind(AssertUnwindSafe(|| {
                rt.block_on(async move {
                    let (tx, rx) = mpsc::unbounded_channel();
                    let links = match Links::start(mesh, tx) {
                        Ok(links) => links,
                        Err(e) => return drop(ready_tx.send(Err(e.into()))),
                    };
                    // Before the start is reported: a failure here is the caller's error.
                    let doorbell = match register_service_fd(mailbox.doorbell.clone()) {
                        Ok(fd) => fd,
                        Err(e) => {
                            let why = format!("cannot watch the doorbell's eventfd: {e}");
                            return drop(ready_tx.send(Err(Error::Failed(why))));
                        }
                    };
                    let svc = Service {
                        me,
                        node,
                        heap,
                        mailbox,
                        links,
                        stats: Stats::new(me, nprocs as u16),
                        app: App::Running,
                        failed: None,
                        exiting: false,
                        answered_unasked: 0,
                        exited: false,
                        shutdown: false,
                        gc_started: None,
                        open: (0..nprocs).map(|n| n != me.idx()).collect(),
                        spin,
                        spin_until: None,
                        after_settle: None,
                    };
                    let _ = ready_tx.send(Ok(()));
                    svc.run(rx, doorbell).await;
                })
            }));
            if served.is_err() {
                crate::report(&format!("treadmarks: {me}: internal error in the service thread; exiting"));
                std::process::exit(101);
            }
        })
        .map_err(|e| Error::Failed(format!("cannot start the service thread: {e}")))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(Error::Failed("the service thread died while starting".into())),
    }
}

impl Service {
    async fn run(mut self, mut events: mpsc::UnboundedReceiver<LinkEvent>, doorbell: AsyncFd<ServiceFd>) {
        let mut deadline: Option<tokio::time::Instant> = None;
        // Once every link's reader has ended, the channel answers `None` at once, forever: it
        // is left out of the select, or this loop would spin a CPU until the exit.
        let mut events_open = true;
        // Set when the failure's deadline passes: the node flushes its links and exits.
        let mut give_up = false;
        while !self.exited && !self.shutdown && !give_up {
            // Work the node left for after its messages went out (the pushes planned at a
            // barrier arrival, which the arrival, already written, announced).
            if self.failed.is_none() && self.node().has_deferred() {
                let ran = self.node().run_deferred();
                if let Err(e) = ran {
                    self.fail(JobFailure::Deferred(e));
                }
                if self.pump() {
                    tokio::task::yield_now().await;
                }
                continue;
            }
            if self.failed.is_some() && deadline.is_none() {
                // Blocked in a fault, the application can be told nothing: exit once the abort
                // is out. Otherwise give it the grace period to notice. (Set before waiting, so
                // that a failure in the deferred work above is bounded too.)
                let wait = if matches!(self.app, App::InFault(_)) { ABORT_FLUSH } else { GRACE };
                deadline = Some(tokio::time::Instant::now() + wait);
            }
            let polling = self.polling();
            tokio::select! {
                ev = events.recv(), if events_open => match ev {
                    Some(ev) => self.on_link(ev),
                    None => {
                        events_open = false;
                        self.fail(JobFailure::AllConnectionsGone);
                    }
                },
                ready = doorbell.readable() => {
                    if let Ok(mut guard) = ready {
                        guard.clear_ready();
                    }
                    self.mailbox.doorbell.clear_service();
                    self.on_doorbell();
                }
                _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if deadline.is_some() => {
                    give_up = true;
                    continue;
                }
                // Gives the runtime a turn, in which it polls the sockets without sleeping.
                _ = tokio::task::yield_now(), if polling => {}
            }
            let sent = self.pump();
            if sent {
                // Let the link writers put the frames on the wire before the next event is
                // handled. Otherwise, with more requests already queued (a bulk fetch ramps its
                // requests), this loop serves them all before the first reply leaves, and the
                // requester applies nothing until the writer has diffed everything.
                tokio::task::yield_now().await;
            }
        }
        if give_up {
            let why = self.failed.as_ref().map_or(String::new(), ToString::to_string);
            self.links.flush_and_close_within(EXIT_FLUSH).await;
            wait_closed(&mut self.open, &mut events, EXIT_DRAIN).await;
            if matches!(self.app, App::InFault(_)) {
                fault_exit(self.me, &why);
            }
            crate::report(&format!("treadmarks: {}: exiting: {why}", self.me));
            std::process::exit(1);
        }
        if self.shutdown {
            let mailbox = self.mailbox.clone();
            // The aborts go out and the write halves close; then the peers, told, close theirs
            // (their application answered, or their grace period over): reading on until they
            // do means no socket closes with unread input, whose reset would throw away what
            // the kernel had not yet sent, the abort perhaps.
            self.links.flush_and_close().await;
            wait_closed(&mut self.open, &mut events, GOODBYE_WAIT).await;
            *mailbox.reply.lock().expect("mailbox") = Some(Ok(Reply::ShutDown));
            return mailbox.doorbell.wake_app();
        }
        // Orderly close: say goodbye, then wait (bounded) until every peer has said it too, so no
        // socket is closed with unread data (which would reset the peer's connection).
        self.links.goodbye();
        wait_closed(&mut self.open, &mut events, GOODBYE_WAIT).await;
        self.links.flush_and_close().await;
    }

    /// Whether to poll rather than sleep: the application waits and the budget is not spent.
    fn polling(&mut self) -> bool {
        match self.spin_until {
            Some(until) if Instant::now() < until => true,
            Some(_) => {
                self.spin_until = None;
                false
            }
            None => false,
        }
    }

    /// The application now waits for an answer.
    fn app_waits(&mut self, how: App) {
        self.app = how;
        self.poll_a_budget();
    }

    /// A peer's message came while the application waits: poll a budget more, as the next one
    /// (a peer's next request, the rest of a fetch) tends to follow, and a sleeping thread's
    /// wake-up costs more than the message's handling.
    fn peer_spoke(&mut self) {
        if !matches!(self.app, App::Running) {
            self.poll_a_budget();
        }
    }

    /// Polls the sockets for a spin budget from now instead of sleeping (none if there is none).
    fn poll_a_budget(&mut self) {
        if !self.spin.is_zero() {
            self.spin_until = Some(Instant::now() + self.spin);
        }
    }

    /// The application has its answer and runs again.
    fn app_resumes(&mut self) {
        self.app = App::Running;
        self.spin_until = None;
    }

    /// The node, locked, and told of the fast path's twins (hold it for one step only).
    fn node(&self) -> std::sync::MutexGuard<'_, Node<HeapPages>> {
        lock_node(&self.heap, &self.node)
    }

    fn on_link(&mut self, ev: LinkEvent) {
        match ev {
            LinkEvent::Frame { from, payload, .. } => {
                if self.failed.is_some() {
                    return;
                }
                let len = payload.len();
                // Diffs in the message point into the payload, which goes back to the links'
                // pool once the last of them is dropped.
                let decoded = decode_sharing(self.links.share(payload), codec::decode_payload);
                let msg: Message = match decoded {
                    Ok(m) => m,
                    Err(e) => return self.fail(JobFailure::Malformed { node: from, reason: e.to_string() }),
                };
                self.stats.count_received(from, msg.kind(), len + 4);
                let handled = self.node().handle_message(from, msg);
                if let Err(e) = handled {
                    self.fail(JobFailure::PeerMessage { node: from, error: e });
                }
                self.peer_spoke();
            }
            LinkEvent::Closed { from, cause } => {
                self.open[from.idx()] = false;
                let how = match cause {
                    CloseCause::Goodbye if self.exiting => return,
                    _ if self.exited => return,
                    CloseCause::Goodbye => "left the job before this node finished".to_string(),
                    CloseCause::Eof => {
                        "closed its connection without saying goodbye (it died or was killed)".into()
                    }
                    // A process that dies with bytes unread sends a reset, not an end.
                    CloseCause::Error(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                        format!("closed its connection without saying goodbye (it died or was killed): {e}")
                    }
                    CloseCause::Error(e) => format!("connection failed: {e}"),
                    CloseCause::Malformed(e) => format!("sent a malformed frame: {e}"),
                };
                // The reading side may see only the stream's end where writing met the cause.
                let write_error = self.links.write_error(from).map(str::to_owned);
                self.fail(JobFailure::PeerLost { node: from, how, write_error });
            }
        }
    }

    fn on_doorbell(&mut self) {
        // Commands first: the application posted them (releases need no answer and do not wait)
        // before it faulted, so program order puts them before the fault.
        loop {
            let cmd = self.mailbox.command.lock().expect("mailbox").pop_front();
            match cmd {
                Some(cmd) => self.on_command(cmd),
                None => break,
            }
        }
        if let Some((page, kind)) = self.mailbox.doorbell.take_fault() {
            self.app_waits(App::InFault(Instant::now()));
            if self.failed.is_some() {
                // The job failed while the application ran: it stays in this fault until the
                // failure's deadline (`run`), by when the abort has left for the peers.
                return;
            }
            // The application thread waits in the fault, so the count of its views holds still.
            let views_open = self.heap.mutable_views() > 0;
            let handled = {
                let mut node = self.node();
                node.set_mutable_views_open(views_open);
                node.handle_fault(page, kind == FaultKind::Write)
            };
            if let Err(e) = handled {
                self.fail(JobFailure::Fault { page, error: e });
            }
        }
    }

    fn on_command(&mut self, cmd: Command) {
        if let Command::Release(lock) = cmd {
            // Posted without waiting (only once the job failed; the application releases on its
            // own thread otherwise): anything wrong is reported at its next call.
            let released = if self.failed.is_none() { self.node().request_release(lock) } else { Ok(()) };
            if let Err(e) = released {
                self.fail(JobFailure::Release { lock, error: e });
            }
            return;
        }
        if let Command::Shutdown { why } = cmd {
            // Unless the job failed already (and the peers were told why), they would see only
            // a closed connection, as from a node that was killed. Failed while the application
            // counts as running, nothing is answered yet: the answer comes once the abort is
            // flushed (`run`).
            self.fail(JobFailure::ShutDown(why));
            self.app_waits(App::InCommand);
            self.shutdown = true;
            return;
        }
        if let Command::AwaitStarted = cmd {
            // Its completion may have come first, and answered the application already; if not,
            // it answers now (the job failed: a completion is no longer handed over) or later.
            if self.answered_unasked > 0 {
                self.answered_unasked -= 1;
                return;
            }
            self.app_waits(App::InCommand);
            if let Some(why) = &self.failed {
                self.reply(Err(Error::Job(why.clone())));
            }
            return;
        }
        self.app_waits(App::InCommand);
        if let Some(why) = &self.failed {
            return self.reply(Err(Error::Job(why.clone())));
        }
        match cmd {
            Command::Stats => {
                let s = self.snapshot();
                self.reply(Ok(Reply::Stats(Box::new(s))));
            }
            cmd => {
                self.exiting |= matches!(cmd, Command::Exit);
                if settles_first(&cmd) && self.node().streaming() {
                    let settling = self.node().request_settle();
                    match settling {
                        Ok(()) => self.after_settle = Some(cmd),
                        Err(e) => self.reply(Err(e.into())),
                    }
                    return;
                }
                let started = start(&mut self.node(), cmd);
                self.answer_started(started);
            }
        }
    }

    /// Answers a command [`start`] began: at once if it needed no completion, with its error
    /// if it failed; otherwise its completion answers later.
    fn answer_started(&mut self, started: Result<Option<Reply>, ProtocolError>) {
        match started {
            Ok(Some(r)) => self.reply(Ok(r)),
            Ok(None) => {}
            Err(e) => self.reply(Err(e.into())),
        }
    }

    fn snapshot(&self) -> Stats {
        self.snapshot_of(&mut self.node())
    }

    /// [`Service::snapshot`] with the node already locked.
    fn snapshot_of(&self, node: &mut Node<HeapPages>) -> Stats {
        let mut s = super::node_snapshot(&self.stats, node);
        let c = self.heap.counters();
        s.fast_write_faults = c.fast_write_faults;
        s.fault_handoffs = c.handoffs;
        s.minor_maps = c.minor_maps;
        s.zero_twins = c.zero_twins;
        (s.twin_slots_used, s.twin_slots_reserved) = self.heap.twin_slots();
        let chunks = crate::mem::chunk::counts();
        (s.diff_chunks_mapped, s.diff_chunks_reserved, s.diff_chunks_reused) =
            (chunks.mapped, chunks.reserved, chunks.reused);
        s.lock_ops_here = self.mailbox.lock_ops_here.load(Ordering::Relaxed);
        s.validations_here = self.mailbox.validations_here.load(Ordering::Relaxed);
        s.commands = self.mailbox.commands.load(Ordering::Relaxed);
        s
    }

    /// Sends what the node wants sent and hands completions to the application; returns true if
    /// it queued a frame.
    fn pump(&mut self) -> bool {
        let shared = Arc::clone(&self.node);
        let mut node = lock_node(&self.heap, &shared);
        match (self.gc_started, node.collecting()) {
            (None, true) => self.gc_started = Some(Instant::now()),
            (Some(t), false) => {
                self.stats.gc_time += t.elapsed();
                self.gc_started = None;
            }
            _ => {}
        }
        while let Some(w) = node.poll_warning() {
            crate::report(&format!("treadmarks: {}: warning: {w}", self.me));
        }
        let mut sent_any = false;
        loop {
            while let Some((to, msg)) = node.poll_transmit() {
                sent_any = true;
                // Diffs go from their store to the socket, not through the frame (`FrameParts`).
                let kind = msg.kind();
                let sent = codec::encode_frame_parts(&msg, self.links.buffer())
                    .map_err(|e| e.to_string())
                    .and_then(|parts| {
                        self.stats.count_sent(to, kind, parts.len());
                        self.links.send_parts(to, parts).map_err(|e| e.to_string())
                    });
                if let Err(e) = sent {
                    self.fail(JobFailure::Send { node: to, kind, reason: e });
                }
            }
            if !self.hand_over(&mut node) {
                return sent_any;
            }
        }
    }

    /// Hands the node's completions to the application; returns true if one of them started a
    /// synchronization that had waited for the node to settle (which may have queued messages).
    fn hand_over(&mut self, node: &mut Node<HeapPages>) -> bool {
        let mut started = false;
        while let Some(done) = node.poll_done() {
            match done {
                // A failed job's application was answered with the failure (or stays in its
                // fault until the node exits): a completion after it would answer twice.
                _ if self.failed.is_some() => {}
                AppDone::Settled => {
                    let cmd = self.after_settle.take().expect("a settle only before a synchronization");
                    started = true;
                    self.answer_started(start(node, cmd));
                }
                AppDone::FaultResolved(_) => {
                    if let App::InFault(t) = self.app {
                        self.stats.miss_wait += t.elapsed();
                    }
                    self.app_resumes();
                    self.mailbox.doorbell.fault_resolved();
                }
                AppDone::Exited => {
                    // The final statistics: the exit's messages and all the node served while
                    // it waited in exit are in (`pump` sent what the node queued first).
                    self.exited = true;
                    let s = self.snapshot_of(node);
                    self.reply(Ok(Reply::Exited(Box::new(s))));
                }
                other => {
                    // While the application runs, only a request its own thread started completes
                    // (`Command::AwaitStarted`).
                    if matches!(self.app, App::Running) {
                        self.answered_unasked += 1;
                    }
                    self.reply(Ok(Reply::Done(other)))
                }
            }
        }
        started
    }

    fn reply(&mut self, r: crate::Result<Reply>) {
        *self.mailbox.reply.lock().expect("mailbox") = Some(r);
        self.app_resumes();
        self.mailbox.doorbell.wake_app();
    }

    fn fail(&mut self, why: JobFailure) {
        if self.failed.is_some() {
            return;
        }
        crate::report(&format!("treadmarks: {}: job failed: {why}", self.me));
        self.mailbox.failed.store(true, Ordering::Release);
        // Tell every peer why, so nodes that only see this node go away name the real cause.
        for n in 0..self.open.len() {
            if self.open[n] {
                let mut frame = Vec::new();
                let abort = Message::Abort { reason: why.to_string() };
                if codec::encode_frame(&abort, &mut frame).is_ok() {
                    let _ = self.links.send(NodeId(n as u16), frame);
                }
            }
        }
        match self.app {
            // Exits once the abort is on its way (`run`'s deadline): a peer would otherwise
            // see only a closed connection.
            App::InFault(_) => {}
            App::InCommand => self.reply(Err(Error::Job(why.clone()))),
            App::Running => {}
        }
        self.failed = Some(why);
    }
}

/// Whether `cmd` waits until no page of a streaming view is on its way: it may bring write
/// notices or leave the job (`protocol/stream.rs`). A release (and an acquire whose token is
/// here, which the application thread runs itself) brings none.
fn settles_first(cmd: &Command) -> bool {
    !matches!(
        cmd,
        Command::Release(_)
            | Command::Validate { .. }
            | Command::AwaitStarted
            | Command::Stats
            | Command::Shutdown { .. }
    )
}

/// The application thread is blocked in a page fault, where no error can be returned.
fn fault_exit(me: NodeId, why: &str) -> ! {
    crate::report(&format!(
        "treadmarks: {me}: the application is blocked in a page fault and the job failed ({why}); exiting"
    ));
    std::process::exit(1);
}

/// Reads and drops what the peers still send until every link in `open` is closed for reading,
/// for at most `bound`.
async fn wait_closed(open: &mut [bool], events: &mut mpsc::UnboundedReceiver<LinkEvent>, bound: Duration) {
    let _ = tokio::time::timeout(bound, async {
        while open.iter().any(|&o| o) {
            match events.recv().await {
                Some(LinkEvent::Closed { from, .. }) => open[from.idx()] = false,
                Some(LinkEvent::Frame { .. }) => {}
                None => break,
            }
        }
    })
    .await;
}
