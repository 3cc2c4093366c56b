//! The application's handle on the job: [`Tmk`]. See the crate docs for a complete program.
//!
#![forbid(unsafe_code)]

use crate::config::{Config, Role};
use crate::error::{Error, Result};
use crate::mem::{
    BorrowTracker, Doorbell, FaultBackend, FaultHandler, Heap, HeapLayout, HeapPages, Shared, View,
    ViewError, ViewMut,
};
use crate::protocol::{
    Access, AppDone, BarrierId, Limits, LockId, Node, NodeConfig, NodeId, PageIdx, ProtocolError,
};
use crate::runtime::launch::{self, Children, StartupWatch};
use crate::runtime::{Command, Engine, Mailbox, Reply, service};
use crate::stats::Stats;
use crate::transport::{MeshConfig, connect_mesh};
use bytemuck::Pod;
use std::net::{SocketAddr, TcpListener};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Fewest pages of a mutable view worth twinning ahead of its writes: a command to the runtime
/// costs a few page faults' worth.
const TWIN_AHEAD_MIN_PAGES: usize = 8;
// A mutable view of one page is never twinned ahead (`Tmk::settled` relies on it).
const _: () = assert!(TWIN_AHEAD_MIN_PAGES > 1);

/// One node's handle on the job.
///
/// # The rules
/// - One application thread per node touches the shared heap: the thread that called
///   [`Tmk::startup`]. A fault from any other thread aborts the process with a message.
///   (Threads inside a node come later.) A view's slice is `Send`, so safe code can hand it
///   to a scoped thread, and a write from there to a page already writable may take no fault.
///   Such a write is never lost: while a mutable view is open, the runtime never reads a
///   writable page in place (it cuts the page's diff from a copy, or takes access away
///   first), and the synchronization calls, which do, take the `Tmk` mutably, so no view is
///   open then. But an access from that thread to a page the runtime took access from
///   meanwhile faults and aborts the process: keep the heap to the application thread.
/// - Views ([`Tmk::view`], [`Tmk::view_mut`], and [`Tmk::view_parts`] /
///   [`Tmk::view_mut_parts`], which declare only parts of an array) borrow the `Tmk` immutably,
///   and every synchronization call (`lock`, `lock_release`, `barrier`, `collect`, `exit`) takes it
///   mutably, so a
///   view cannot outlive the next synchronization and the compiler cannot reuse a value loaded
///   before it.
///   Overlapping views follow `RefCell` rules, checked at run time ([`Error::View`]).
/// - A [`LockGuard`] derefs to the `Tmk`: inside a critical section, use the guard.
/// - Only `bytemuck::Pod` types live in the heap or are distributed: other processes write their
///   bytes, so every bit pattern must be valid.
/// - TreadMarks-style code can take raw pointers ([`Tmk::ptr`]); dereferencing them is the
///   caller's `unsafe`, under the same rule: no reference derived from one may be held across a
///   synchronization call.
/// - System calls that touch the shared heap fail with `EFAULT` instead of faulting: writing
///   into a protected page (`read(2)` into a shared buffer, say) on either fault backend, and
///   on the userfaultfd backend also reading from a page not mapped in the application view
///   (`write(2)` from a shared buffer). Go through private memory and copy.
pub struct Tmk {
    me: NodeId,
    nprocs: u16,
    args: Vec<String>,
    print_stats: bool,
    stats_json: bool,
    // Field order is drop order: stop the runtime, then the fault handler, then the heap.
    engine: Engine,
    children: Option<Children>,
    /// The launcher's claim on the CPUs its job is pinned to, held for the job's life.
    _cpu_claims: Option<crate::mem::sched::CpuClaims>,
    borrows: BorrowTracker,
    lock_wait: Duration,
    barrier_wait: Duration,
    /// Time spent validating views (views take `&self`, hence the cell).
    view_wait: std::cell::Cell<Duration>,
    exited: bool,
    /// The error the latest public call returned, if it failed, or that of a failed exit: what
    /// the peers are told if the application leaves without exiting (`Drop`). A cell, since
    /// views take `&self`.
    last_error: std::cell::RefCell<Option<String>>,
    exit_failed: bool,
    /// Pinned to one CPU (`Stats::pinned`).
    pinned: bool,
    /// What this node resolved its settings to ([`Tmk::collection_threshold`],
    /// [`Tmk::service_spin`]).
    collection_threshold: u64,
    service_spin: Duration,
    /// The application thread's affinity before it was pinned, put back at exit or drop.
    unpinned: Option<crate::mem::sched::Affinity>,
    /// Locks this node holds (releases are checked here, since they do not wait for a reply).
    held: Vec<u32>,
    nlocks: u32,
    _faults: Option<FaultHandler>,
    heap: Arc<Heap>,
}

/// Who this node is, not its runtime's state: a derived `Debug` printed every page's metadata
/// (tens of MB for the default heap) with the node's lock held, stalling its peers.
impl std::fmt::Debug for Tmk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tmk")
            .field("me", &self.me)
            .field("nprocs", &self.nprocs)
            .field("held", &self.held)
            .field("pinned", &self.pinned)
            .field("exited", &self.exited)
            .finish_non_exhaustive()
    }
}

impl Tmk {
    /// How long node 0 of a local job waits, after the job's exit, for the processes it
    /// started to end before it kills them ([`Tmk::exit`]).
    pub const EXIT_REAP_WAIT: Duration = Duration::from_secs(30);

    /// Starts this node: reads the configuration from `TMK_*` variables and `-n`/`--rank`/
    /// `--root` flags (see [`crate::config`]), spawns the other nodes if this process starts the
    /// job, maps the heap and meets the other nodes. Other arguments are in [`Tmk::args`].
    pub fn startup() -> Result<Tmk> {
        let (config, rest) = Config::from_env_and_args(Config::command_line()?)?;
        Tmk::startup_with(config, rest)
    }

    /// Starts this node with an explicit configuration. A launcher passes it, every setting
    /// but each node's place in the job, to the nodes it spawns ([`Config::to_vars`]), and a
    /// node it spawned runs with what the launcher passed, whatever configuration its own code
    /// gives here: the same `main` runs in every node, so code that builds a launcher's
    /// configuration (`Config { nprocs: 4, ..Config::default() }`) would otherwise make every
    /// spawned node a launcher too, each spawning nodes of its own.
    ///
    /// A process runs one node of one job, once: a second start, while the first node runs or
    /// after its job ended, is [`Error::AlreadyStarted`] (a node a launcher spawned would try
    /// to meet its ended job again, and a launcher's new nodes would run `main` from its start).
    /// A start that failed may be tried again.
    pub fn startup_with(config: Config, args: Vec<String>) -> Result<Tmk> {
        static STARTED: AtomicBool = AtomicBool::new(false);
        if STARTED.swap(true, Ordering::AcqRel) {
            return Err(Error::AlreadyStarted);
        }
        let started = Tmk::start(config, args);
        if started.is_err() {
            STARTED.store(false, Ordering::Release);
        }
        started
    }

    /// [`Tmk::startup_with`], once this process may start its node.
    fn start(config: Config, args: Vec<String>) -> Result<Tmk> {
        if let Some(pid) = launch::started_by_a_node() {
            return Err(crate::config::ConfigError::Invalid {
                name: "TMK_LAUNCHER_PID",
                value: pid.to_string(),
                why: format!(
                    "this process was started by a node of the job launched by pid {pid}, and inherited \
                     its variables: it cannot join that job; to start a job of its own, remove TMK_RANK, \
                     TMK_NPROCS, TMK_ROOT and TMK_LAUNCHER_PID from its environment"
                ),
            }
            .into());
        }
        // A node a launcher spawned here takes the launcher's settings, whatever its code builds.
        let spawned = launch::spawned_by_launcher();
        let config = if spawned { Config::from_env_and_args(Vec::new())?.0 } else { config };
        // A node started by hand to join a job (`TMK_RANK`, "Running across hosts") whose code
        // builds a launcher's configuration would start a whole job of its own, on this host.
        if config.role == Role::Launcher
            && let Some(rank) = std::env::var_os("TMK_RANK").filter(|r| !r.is_empty())
        {
            return Err(crate::config::ConfigError::Invalid {
                name: "TMK_RANK",
                value: rank.to_string_lossy().into_owned(),
                why: "set, but Tmk::startup_with was given a launcher's configuration, which would start \
                      a job of its own here: build it with Config::from_env_and_args to join a job"
                    .into(),
            }
            .into());
        }
        config.validate()?;
        let n = config.nprocs;
        let allowed_cpus = crate::mem::sched::allowed_cpus();
        // The CPUs a launcher claims for the job (`CpuClaims`), a socket each.
        let cpus_to_claim = allowed_cpus.min(usize::from(n));
        let claims = match config.role {
            Role::Launcher => cpus_to_claim as u64,
            Role::Member { .. } => 0,
        };
        crate::open_files::make_room(n, claims)?;
        match config.role {
            // Every node of the job starts here: their startup reserves must fit.
            Role::Launcher => config.check_startup_memory(n)?,
            // A node joining by hand: its own (a launcher checked those of the nodes it spawns).
            Role::Member { .. } if !spawned => config.check_startup_memory(1)?,
            Role::Member { .. } => {}
        }
        let me = match config.role {
            Role::Launcher => NodeId(0),
            Role::Member { rank } => NodeId(rank),
        };
        launch::follow_launcher(me);
        // Every node started by hand reads its own environment; a spawned node, the launcher's.
        if me == NodeId(0) || !spawned {
            let names: Vec<String> = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()).collect();
            for warning in crate::config::unknown_settings(names.iter().map(String::as_str)) {
                crate::report(&format!("treadmarks: warning: {warning}"));
            }
        }
        // A 1-node job never protects its heap, so it needs no fault backend.
        let backend = if n > 1 { crate::mem::select_backend(config.faults)? } else { FaultBackend::Mprotect };
        let mut config = config;
        if n > 1 && backend == FaultBackend::Mprotect && config.fit_heap {
            // Before the nodes are spawned: they are passed the size chosen here.
            let (fitted, limit) = crate::mem::fit_heap(config.heap_size);
            if fitted < config.heap_size {
                crate::report(&format!(
                    "treadmarks: on the mprotect fault backend every page can be a mapping of its own, and \
                     vm.max_map_count = {limit} allows a heap of {}, not {}: the heap is {} (set \
                     TMK_HEAP_SIZE to choose, use userfaultfd on Linux 6.2+, or raise the limit)",
                    crate::mem::Bytes(fitted),
                    crate::mem::Bytes(config.heap_size),
                    crate::mem::Bytes(fitted),
                ));
                config.heap_size = fitted;
            }
        }
        let layout = HeapLayout { base: config.heap_base, size: config.heap_size, protect: n > 1 };
        let heap = Heap::map_with(layout, backend)?;
        // A job started here has all its nodes on this machine.
        let local_job = matches!(config.role, Role::Launcher) || spawned;
        let local_nodes = if local_job { u64::from(n) } else { 1 };
        let consistency_limit = config.consistency_limit_bytes(local_nodes);
        let collection_threshold = config.collection_threshold(consistency_limit);
        let node_cfg = NodeConfig {
            me,
            nprocs: n,
            nlocks: config.nlocks,
            nbarriers: config.nbarriers,
            heap_size: config.heap_size as u64,
            gc_threshold: collection_threshold,
            push: config.push,
            push_skip: config.push_skip,
            back_heap: config.back_heap,
            // Alone, a node has every token: nothing to predict.
            lock_bundle: if n > 1 { config.lock_bundle } else { 0 },
            stream_min_pages: config.stream_min_pages,
            consistency_limit,
            limits: Limits {
                // The tests cut interval records into parts of a few bytes, to run that path
                // (`protocol/ahead.rs`) in real jobs. Only lower: a peer's decoder refuses a
                // list longer than the default cuts (`protocol/cautious.rs`).
                record_bytes: std::env::var("TMK_TEST_RECORD_BYTES")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .map_or(Limits::default().record_bytes, |b: usize| b.min(Limits::default().record_bytes)),
                ..Limits::default()
            },
        };
        let pages = HeapPages::claim(heap.clone()).expect("the heap was just mapped");
        let node = Node::new(node_cfg, pages);
        let mut children = None;
        let mut watch = None;
        let mut cpu_claims = None;
        let mut node_pinned = false;
        let mut resolved_spin = Duration::ZERO;
        let mut unpinned = None;
        let (engine, faults) = if n == 1 {
            (
                Engine::Local {
                    node: Box::new(node),
                    stats: Box::new(Stats::new(me, 1)),
                    heap: heap.clone(),
                },
                None,
            )
        } else {
            // Whether to pin, and the CPUs the launcher claimed for the job, if it did.
            let (listener, root, pin, claimed) = match config.role {
                Role::Launcher => {
                    let want = config.root.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
                    let l = TcpListener::bind(want).map_err(|e| match config.root {
                        // Most likely a root left set from a job across hosts: name the setting.
                        Some(_) => Error::Config(crate::config::ConfigError::Invalid {
                            name: "TMK_ROOT / --root",
                            value: want.to_string(),
                            why: format!("node 0 cannot listen there: {e}"),
                        }),
                        None => Error::Failed(format!("cannot listen on {want}: {e}")),
                    })?;
                    let addr = l.local_addr().map_err(|e| Error::Failed(e.to_string()))?;
                    // Pinned only to CPUs no other job here is pinned to (`CpuClaims`), unless
                    // the user says; the nodes hear the decision, and the CPUs, from the launcher.
                    use crate::mem::sched::{CpuClaim, CpuClaims};
                    let claim = config.pin.is_none().then(|| {
                        let names = std::env::var("TMK_TEST_CPU_CLAIMS").unwrap_or("treadmarks-cpu".into());
                        CpuClaims::take_named(&names, cpus_to_claim)
                    });
                    let pin = config.pin.or(claim.as_ref().and_then(CpuClaim::pin)).unwrap_or(true);
                    cpu_claims = claim.and_then(CpuClaim::into_claims);
                    let cpus = cpu_claims.as_ref().map(|c| c.cpus().to_vec());
                    watch = Some(StartupWatch::new(Children::spawn(&config, addr, pin, cpus.as_deref())?));
                    (Some(l), addr, pin, cpus)
                }
                Role::Member { .. } => {
                    let root = config.root.expect("validated: members know the root");
                    let listen = config.root_listen_addr().filter(|at| me == NodeId(0) && *at != root);
                    let listener = match listen {
                        Some(at) => {
                            let name = config.root_name.as_deref().unwrap_or_default();
                            let l = crate::transport::listen_everywhere(root.port()).map_err(|e| {
                                Error::Config(crate::config::ConfigError::Invalid {
                                    name: "TMK_ROOT / --root",
                                    value: format!("{name}:{}", root.port()),
                                    why: format!(
                                        "node 0 cannot listen on every interface at port {}: {e}",
                                        at.port()
                                    ),
                                })
                            })?;
                            crate::report(&format!(
                                "treadmarks: the root's name {name} resolves to {} here, a loopback \
                                 address the other hosts cannot reach: node 0 listens on {}",
                                root.ip(),
                                l.local_addr().map_or(at, |a| a)
                            ));
                            Some(l)
                        }
                        None => None,
                    };
                    (listener, root, config.pin.unwrap_or(local_job), launch::claimed_cpus())
                }
            };
            // All nodes of a job launched here share this machine's CPUs: give each its own
            // (its application and service threads), so that its protection changes need no
            // TLB shootdown on another CPU and its threads hand work to each other on one run
            // queue; a real-time service thread then preempts its own application at once.
            // Put back if the startup fails from here on (kept by the node otherwise).
            unpinned = Some(crate::mem::sched::AffinityGuard::take());
            // To the launcher's claimed CPUs in turn, or to the `me`-th allowed one.
            let pinned = pin
                && match claimed.filter(|c| !c.is_empty()) {
                    Some(cpus) => crate::mem::sched::pin_to(cpus[me.idx() % cpus.len()]).is_some(),
                    None => crate::mem::sched::pin_to_cpu(me.idx()).is_some(),
                };
            node_pinned = pinned;
            let service_rt = config.service_rt.unwrap_or(pinned);
            // A node with a CPU of its own wastes nothing by polling while its application
            // waits; a node sharing one would take it from the other node's computation.
            let own_cpu = pinned && usize::from(n) <= allowed_cpus;
            let service_spin = config.service_spin.unwrap_or(if own_cpu {
                crate::config::DEFAULT_SERVICE_SPIN
            } else {
                std::time::Duration::ZERO
            });
            resolved_spin = service_spin;
            let doorbell = Doorbell::new()?;
            doorbell.set_spin(config.app_spin);
            let faults = FaultHandler::install(heap.clone(), doorbell.clone())?;
            let mesh_cfg = MeshConfig {
                nprocs: n,
                rank: me,
                root,
                // Members meet node 0 at any address its name has; a launcher's nodes, at the
                // address it listens on.
                root_name: if spawned { None } else { config.root_name.clone() },
                fingerprint: config.fingerprint(),
                timeout: config.connect_timeout,
            };
            // Diff and twin memory backed now, while the other nodes start too, rather than in
            // the middle of the computation (`mem/chunk.rs`, `Heap::reserve_twins`).
            crate::mem::chunk::reserve(config.diff_reserve_bytes());
            heap.reserve_twins(config.twin_reserve);
            let mesh = connect_mesh(&mesh_cfg, listener);
            children = watch.take().map(StartupWatch::finish);
            let mesh = mesh?;
            let mailbox = Arc::new(Mailbox {
                command: Mutex::new(Default::default()),
                reply: Mutex::new(None),
                doorbell,
                failed: AtomicBool::new(false),
                lock_ops_here: AtomicU64::new(0),
                validations_here: AtomicU64::new(0),
                commands: AtomicU64::new(0),
            });
            let node = Arc::new(Mutex::new(node));
            let handle = service::spawn(
                node.clone(),
                heap.clone(),
                mailbox.clone(),
                mesh,
                service_rt,
                service_spin,
                config.malloc_reserve,
            )?;
            (Engine::Remote { mailbox, node, heap: heap.clone(), service: Some(handle) }, Some(faults))
        };
        Ok(Tmk {
            me,
            nprocs: n,
            args,
            print_stats: config.print_stats,
            stats_json: config.stats_json,
            engine,
            children,
            _cpu_claims: cpu_claims,
            borrows: BorrowTracker::claim(heap.clone()).expect("the heap was just mapped"),
            lock_wait: Duration::ZERO,
            barrier_wait: Duration::ZERO,
            view_wait: std::cell::Cell::new(Duration::ZERO),
            exited: false,
            last_error: std::cell::RefCell::new(None),
            exit_failed: false,
            pinned: node_pinned,
            collection_threshold,
            service_spin: resolved_spin,
            unpinned: unpinned.and_then(crate::mem::sched::AffinityGuard::disarm).filter(|_| node_pinned),
            held: Vec::new(),
            nlocks: config.nlocks,
            _faults: faults,
            heap,
        })
    }

    /// The consistency data (bytes) past which this node asks the next barrier to collect, as
    /// it resolved it: `TMK_GC_THRESHOLD`, else 32 MiB or a quarter of the heap, at most half
    /// the consistency limit ([`Config::collection_threshold`]).
    pub fn collection_threshold(&self) -> u64 {
        self.collection_threshold
    }

    /// How long this node's service thread polls after each message while the application waits
    /// (`TMK_SERVICE_SPIN_US`, else 1 ms where the node has a CPU of its own, else none; none in
    /// a one-node job, which has no service thread).
    pub fn service_spin(&self) -> Duration {
        self.service_spin
    }

    /// This node's rank, `0..nprocs()` (TreadMarks' `Tmk_proc_id`).
    pub fn proc_id(&self) -> usize {
        self.me.idx()
    }

    /// Number of nodes (TreadMarks' `Tmk_nprocs`).
    pub fn nprocs(&self) -> usize {
        self.nprocs as usize
    }

    /// Command-line arguments the runtime did not consume.
    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// Notes how a public call ended, the error the peers are told of if the application then
    /// leaves without calling exit: only the latest call's error explains a departure, and one
    /// handled long ago does not. Every public call passes its result through here, whether it
    /// failed on the service thread, in a check here, or on the application thread's own path.
    fn record<T>(&self, r: Result<T>) -> Result<T> {
        let mut last = self.last_error.borrow_mut();
        match &r {
            Ok(_) => *last = None,
            Err(e) => *last = Some(e.to_string()),
        }
        r
    }

    fn call(&mut self, cmd: Command) -> Result<Reply> {
        self.engine.call(cmd)
    }

    fn done(&mut self, cmd: Command) -> Result<AppDone> {
        match self.call(cmd)? {
            Reply::Done(d) => Ok(d),
            other => unreachable!("command answered with {other:?}"),
        }
    }

    /// Allocates a shared array of `len` zero-or-stale `T`s (TreadMarks' `Tmk_malloc`): memory
    /// freed earlier is not cleared. Any node may allocate; node 0 keeps the allocator.
    pub fn alloc<T: Pod>(&mut self, len: usize) -> Result<Shared<[T]>> {
        self.alloc_aligned(len, align_of::<T>().max(8))
    }

    /// Like [`Tmk::alloc`], starting on a page boundary (no false sharing with other data).
    pub fn alloc_pages<T: Pod>(&mut self, len: usize) -> Result<Shared<[T]>> {
        self.alloc_aligned(len, self.heap.page_size())
    }

    /// Like [`Tmk::alloc`], aligned to `align` bytes (a power of two).
    pub fn alloc_aligned<T: Pod>(&mut self, len: usize, align: usize) -> Result<Shared<[T]>> {
        let r = self.try_alloc_aligned(len, align);
        self.record(r)
    }

    fn try_alloc_aligned<T: Pod>(&mut self, len: usize, align: usize) -> Result<Shared<[T]>> {
        let bytes =
            len.checked_mul(size_of::<T>()).ok_or(Error::TooLarge { count: len, size: size_of::<T>() })?;
        let align = align.max(align_of::<T>());
        let heap_base = self.heap.app_base() as usize;
        if align.is_power_of_two() && !heap_base.is_multiple_of(align) {
            return Err(Error::Misaligned { align, heap_base });
        }
        match self.done(Command::Alloc { bytes: bytes.max(1) as u64, align: align as u64 })? {
            AppDone::Allocated(r) => {
                let offset = r.map_err(crate::protocol::ProtocolError::from)?;
                // Allocate the memory now rather than one first-touch fault at a time.
                self.heap.commit(offset, bytes as u64);
                Ok(Shared::from_raw_parts(offset, len as u64))
            }
            other => unreachable!("alloc answered with {other:?}"),
        }
    }

    /// Allocates one shared `T`.
    pub fn alloc_value<T: Pod>(&mut self) -> Result<Shared<T>> {
        Ok(Shared::from_offset(self.alloc::<T>(1)?.offset()))
    }

    /// Frees an allocation (TreadMarks' `Tmk_free`).
    pub fn free<T: ?Sized>(&mut self, h: Shared<T>) -> Result<()> {
        let r = match self.done(Command::Free(h.offset())) {
            Ok(AppDone::Freed(r)) => r.map_err(|e| crate::protocol::ProtocolError::from(e).into()),
            Ok(other) => unreachable!("free answered with {other:?}"),
            Err(e) => Err(e),
        };
        self.record(r)
    }

    /// Collective: every node calls it; afterwards every node's `value` is node 0's
    /// (TreadMarks' `Tmk_distribute`). Handles ([`Shared`]) are `Pod` and can be distributed.
    ///
    /// It passes a value, not the heap's contents, and it is not a synchronization: node 0
    /// returns once its value is sent. What node 0 wrote into the heap before it reaches the
    /// others at the next barrier (or through a lock). Calls pair up in order on every node: a
    /// node that waits for a value node 0 does not send fails the job once node 0 goes into a
    /// barrier or exit instead ([`ProtocolError::DistributeUnanswered`]); a node that exits
    /// with values node 0 sent that it never took warns, and one holding more untaken values
    /// than its consistency limit allows (at least 64 MiB) fails the job
    /// ([`ProtocolError::DistributeBacklog`]).
    pub fn distribute<T: Pod>(&mut self, value: &mut T) -> Result<()> {
        let mine = (self.me == NodeId(0)).then(|| bytemuck::bytes_of(value).to_vec());
        let r = match self.done(Command::Distribute(mine)) {
            Ok(AppDone::Distributed(bytes)) => bytemuck::try_pod_read_unaligned(&bytes)
                .map(|got: T| *value = got)
                .map_err(|_| Error::DistributeSize { got: bytes.len(), want: size_of::<T>() }),
            Ok(other) => unreachable!("distribute answered with {other:?}"),
            Err(e) => Err(e),
        };
        self.record(r)
    }

    /// Acquires lock `id`; the guard releases it when dropped.
    pub fn lock(&mut self, id: u32) -> Result<LockGuard<'_>> {
        self.lock_acquire(id)?;
        Ok(LockGuard { tmk: self, lock: id, released: false })
    }

    /// Acquires lock `id` (TreadMarks' `Tmk_lock_acquire`). Fails, besides on a bad id, when
    /// this node holds more consistency data than `TMK_CONSISTENCY_LIMIT` allows: a program that
    /// synchronizes with locks alone must call [`Tmk::collect`] now and then.
    pub fn lock_acquire(&mut self, id: u32) -> Result<()> {
        // A token here costs no wait (and no clock reads: a fifth of a local acquire's time).
        let r = match self.engine.acquire_here(LockId(id)) {
            Ok(true) => Ok(()),
            Ok(false) => {
                let t = Instant::now();
                let r = self.done(Command::Acquire(LockId(id)));
                self.lock_wait += t.elapsed();
                r.map(drop)
            }
            Err(e) => Err(e),
        };
        if r.is_ok() {
            self.held.push(id);
        }
        self.record(r)
    }

    /// Releases lock `id` (TreadMarks' `Tmk_lock_release`). Returns at once: the interval ends
    /// here, and a node waiting for the lock gets it from the service thread while the
    /// application goes on.
    pub fn lock_release(&mut self, id: u32) -> Result<()> {
        let r = self.release(id);
        self.record(r)
    }

    /// [`Tmk::lock_release`] without noting how it ended.
    fn release(&mut self, id: u32) -> Result<()> {
        match self.held.iter().position(|&l| l == id) {
            Some(i) => {
                self.held.swap_remove(i);
                self.call(Command::Release(LockId(id))).map(drop)
            }
            None if id >= self.nlocks => {
                Err(ProtocolError::UnknownLock { lock: LockId(id), nlocks: self.nlocks }.into())
            }
            None => Err(ProtocolError::NotHeld { lock: LockId(id) }.into()),
        }
    }

    /// Waits until every node has arrived at barrier `id` (TreadMarks' `Tmk_barrier`).
    pub fn barrier(&mut self, id: u32) -> Result<()> {
        let t = Instant::now();
        let r = self.done(Command::Barrier(BarrierId(id)));
        self.barrier_wait += t.elapsed();
        self.record(r.map(drop))
    }

    /// Collective: a barrier (it is barrier 0, so every node must call `collect` where the
    /// others do) that also collects consistency data (interval records, write notices, diffs,
    /// twins) whatever the threshold says. Barriers collect by themselves when a node passes
    /// `TMK_GC_THRESHOLD`; programs that synchronize only with locks call this now and then (a
    /// node warns when its data reaches twice the threshold with no barrier, and again at every
    /// doubling; its lock acquires fail past `TMK_CONSISTENCY_LIMIT`).
    pub fn collect(&mut self) -> Result<()> {
        let t = Instant::now();
        let r = self.done(Command::Collect(BarrierId(0)));
        self.barrier_wait += t.elapsed();
        self.record(r.map(drop))
    }

    /// Round trip to node `peer` through both runtimes (for measurements).
    pub fn ping(&mut self, peer: usize) -> Result<()> {
        // Out of range but within u16, the node refuses it (`Node::request_ping`).
        let r = match u16::try_from(peer) {
            Ok(id) => self.done(Command::Ping(NodeId(id))).map(drop),
            Err(_) => Err(ProtocolError::UnknownNode { node: peer as u64, nprocs: self.nprocs }.into()),
        };
        self.record(r)
    }

    /// A view of a shared array. See [`Tmk`] for the borrowing rules.
    ///
    /// A view declares what the application is about to touch: its invalid pages are brought up
    /// to date at once, in requests to each writer of 32 pages, then twice as many up to 256,
    /// before the view is returned
    /// (raw pointers fault page by page instead). A view that must fetch many pages (at least
    /// `TMK_STREAM_MIN_PAGES`, 64 by default) with no lock held *streams*: it returns as soon as
    /// its requests are out, its pages become readable as they arrive, touching one still on
    /// its way waits for that page, and the next synchronization that may bring write notices
    /// waits for the rest (`protocol/stream.rs`).
    pub fn view<T: Pod>(&self, h: &Shared<[T]>) -> Result<View<'_, T>> {
        let view = self.record(self.borrows.view(h).map_err(Error::from))?;
        if !self.settled(h) {
            let validated = self.validate_parts(h, std::iter::once(0..h.len()));
            self.record(validated)?;
        }
        Ok(view)
    }

    /// A view of a shared array of which the application declares it reads only `parts`
    /// (element ranges of `h`, in any order): their invalid pages are brought up to date at
    /// once, as by [`Tmk::view`], and any other invalid page of the view is fetched when first
    /// touched, as through a raw pointer. For reads that cover a small, scattered part of a big
    /// array: a transpose reads one column block of every row.
    pub fn view_parts<T: Pod>(
        &self,
        h: &Shared<[T]>,
        parts: impl IntoIterator<Item = Range<usize>>,
    ) -> Result<View<'_, T>> {
        let view = self.record(self.borrows.view(h).map_err(Error::from))?;
        let validated = self.validate_parts(h, parts);
        self.record(validated).map(|()| view)
    }

    /// Validates the pages of `parts` of `h` for a view ([`Tmk::view_parts`], and [`Tmk::view`]
    /// when it is not [`Tmk::settled`]).
    fn validate_parts<T>(
        &self,
        h: &Shared<[T]>,
        parts: impl IntoIterator<Item = Range<usize>>,
    ) -> Result<()> {
        let mut count = 0;
        let pages = self.pages_of_parts(h, parts.into_iter().inspect(|_| count += 1), Heap::invalid_pages)?;
        self.validate(pages, false, Vec::new(), count == 1, false)
    }

    /// Whether a view of all of `h` (in bounds) has nothing to validate: the node is alone, or
    /// `h` is empty or lies inside one readable page. A mutable view of one page is never
    /// twinned ahead (fewer than [`TWIN_AHEAD_MIN_PAGES`]), so its first write faults either way.
    fn settled<T>(&self, h: &Shared<[T]>) -> bool {
        self.nprocs == 1 || self.heap.readable_in_one_page(h.offset(), Self::bytes(h))
    }

    /// A mutable view of a shared array of which the application declares it touches only
    /// `parts`: they are validated (and twinned ahead) as by [`Tmk::view_mut`]; any other page
    /// of the view faults as usual when touched. For writes scattered over a big array that
    /// others write too: LU's blocks of a step.
    pub fn view_mut_parts<T: Pod>(
        &self,
        h: &Shared<[T]>,
        parts: impl IntoIterator<Item = Range<usize>>,
    ) -> Result<ViewMut<'_, T>> {
        self.view_mut_declared(h, parts.into_iter().collect(), false)
    }

    /// A mutable view of a shared array of which the application declares it overwrites every
    /// element of `parts` (element ranges of `h`, in any order) before it reads any of them: as
    /// [`Tmk::view_mut_parts`], except that the pages lying wholly inside a part are not brought
    /// up to date first when they are stale, since their bytes are about to be replaced, and are
    /// diffed whole afterwards, stale or not: a copy, not a comparison (see `protocol::page`),
    /// though more bytes where many words keep their values. For output written in full: radix
    /// sort's runs, one per digit value, land on pages the other nodes wrote at the previous pass.
    ///
    /// The declaration is the caller's promise to write every element of the parts through this
    /// view (so before the next synchronization, which the view cannot outlive) before reading
    /// it: an element read before it is written may hold stale bytes (never undefined
    /// behaviour: the elements are `Pod`), and one left unwritten keeps them, for every node that
    /// reads it later. Another node reading the parts while they are written (a data race) may
    /// get those stale bytes too, older than writes it knows of: a copy of the page served
    /// meanwhile holds them in place of the writes the overwrite supersedes. Under a lock, or over fewer than 8 pages that would fault, this is
    /// [`Tmk::view_mut_parts`].
    pub fn view_overwrite_parts<T: Pod>(
        &self,
        h: &Shared<[T]>,
        parts: impl IntoIterator<Item = Range<usize>>,
    ) -> Result<ViewMut<'_, T>> {
        self.view_mut_declared(h, parts.into_iter().collect(), true)
    }

    /// [`Tmk::view_mut_parts`], and with `overwrite` [`Tmk::view_overwrite_parts`].
    fn view_mut_declared<T: Pod>(
        &self,
        h: &Shared<[T]>,
        parts: Vec<Range<usize>>,
        overwrite: bool,
    ) -> Result<ViewMut<'_, T>> {
        let view = self.record(self.borrows.view_mut(h).map_err(Error::from))?;
        let validated = self.validate_declared(h, parts, overwrite);
        self.record(validated).map(|()| view)
    }

    /// Validates the pages of `parts` of `h` for a mutable view ([`Tmk::view_mut_declared`]).
    fn validate_declared<T: Pod>(
        &self,
        h: &Shared<[T]>,
        parts: Vec<Range<usize>>,
        overwrite: bool,
    ) -> Result<()> {
        let stream = parts.len() == 1;
        let all = self.pages_of_parts(h, parts.iter().cloned(), Heap::overlapping_pages)?;
        if self.held.is_empty() {
            let unwritable = all.iter().filter(|&&p| self.heap.access(p) != Access::ReadWrite).count();
            if unwritable >= TWIN_AHEAD_MIN_PAGES {
                // The pages wholly inside a part; the node keeps those it validates.
                let whole = if overwrite {
                    self.pages_of_parts(h, parts, |heap, offset, len| {
                        let ps = heap.page_size() as u64;
                        let first = offset.div_ceil(ps);
                        (first..(offset.saturating_add(len) / ps).max(first))
                            .map(|p| PageIdx(p as u32))
                            .collect()
                    })?
                } else {
                    Vec::new()
                };
                // Every page of the parts, writable ones too: the node renews the twin of one it
                // serves meanwhile rather than freezing it (`Node::request_view`).
                return self.validate(all, true, whole, stream, true);
            }
        }
        let invalid = all.into_iter().filter(|&p| self.heap.access(p) == Access::None).collect();
        self.validate(invalid, false, Vec::new(), stream, true)
    }

    /// The pages `pick` chooses among those overlapping `parts` of `h`, sorted, each once.
    fn pages_of_parts<T>(
        &self,
        h: &Shared<[T]>,
        parts: impl IntoIterator<Item = Range<usize>>,
        pick: impl Fn(&Heap, u64, u64) -> Vec<PageIdx>,
    ) -> Result<Vec<PageIdx>> {
        let mut pages = Vec::new();
        for part in parts {
            if part.start > part.end || part.end > h.len() {
                return Err(
                    ViewError::PartOutOfBounds { start: part.start, end: part.end, len: h.len() }.into()
                );
            }
            // Alone, a node's pages are all valid and writable, always: nothing to look up.
            if self.nprocs > 1 {
                let part = h.slice(part.start, part.end);
                pages.extend(pick(&self.heap, part.offset(), Self::bytes(&part)));
            }
        }
        pages.sort_unstable();
        pages.dedup();
        Ok(pages)
    }

    /// A mutable view of a shared array, validated like [`Tmk::view`]. It also declares writes:
    /// when it covers many pages that would fault on their first write, and no lock is held,
    /// they get their twins up front, in one step, instead of one fault each. A twin made ahead
    /// is noticed only if its page changed, which is checked when the interval ends. Under a
    /// lock pages fault one by one as usual: such a view tends to write a few entries of a larger
    /// structure (tsp's work queue), whose every page would be twinned, then compared at the
    /// release.
    pub fn view_mut<T: Pod>(&self, h: &Shared<[T]>) -> Result<ViewMut<'_, T>> {
        let view = self.record(self.borrows.view_mut(h).map_err(Error::from))?;
        if !self.settled(h) {
            let validated = self.validate_declared(h, std::iter::once(0..h.len()).collect(), false);
            self.record(validated)?;
        }
        Ok(view)
    }

    /// Brings `pages` up to date (and with `write`, twins them ahead of writes), timed as view
    /// wait. With `stream` (a view of one range, which the application tends to read from an
    /// end inward), a large fetch may return before its pages are in (`protocol/stream.rs`); a
    /// view declared in several parts (a transpose's comb) is read across its parts at once, in
    /// an order its requests could not follow, and waits for them all.
    ///
    /// `mutable`: the view is mutable, and so one of the heap's mutable views already. While
    /// another is open, another thread may write through its slice meanwhile
    /// (`Node::set_mutable_views_open`).
    fn validate(
        &self,
        pages: Vec<PageIdx>,
        write: bool,
        whole: Vec<PageIdx>,
        stream: bool,
        mutable: bool,
    ) -> Result<()> {
        if pages.is_empty() {
            return Ok(());
        }
        let views_open = self.heap.mutable_views() > u32::from(mutable);
        let t = Instant::now();
        let r = self.engine.validate(pages, write, whole, stream, views_open);
        self.view_wait.set(self.view_wait.get() + t.elapsed());
        r
    }

    fn bytes<T>(h: &Shared<[T]>) -> u64 {
        // Saturating: a made-up handle too long for the address space is out of every heap
        // (the borrow's range check refuses it), never wrapped round to a short range.
        (h.len() as u64).saturating_mul(size_of::<T>() as u64)
    }

    /// Reads a shared value.
    pub fn get<T: Pod>(&self, h: &Shared<T>) -> Result<T> {
        Ok(self.view(&h.as_array())?[0])
    }

    /// Writes a shared value.
    pub fn set<T: Pod>(&self, h: &Shared<T>, value: T) -> Result<()> {
        self.view_mut(&h.as_array())?[0] = value;
        Ok(())
    }

    /// Raw pointer to the first element, for TreadMarks-style code. Dereferencing it is the
    /// caller's `unsafe`; the rules are in [`Tmk`]'s docs.
    pub fn ptr<T>(&self, h: &Shared<[T]>) -> *mut T {
        self.heap.app_base().wrapping_add(h.offset() as usize).cast()
    }

    /// This node's statistics so far.
    pub fn stats(&mut self) -> Result<Stats> {
        let r = match self.call(Command::Stats) {
            Ok(Reply::Stats(s)) => Ok(self.with_app_side(*s)),
            Ok(other) => unreachable!("stats answered with {other:?}"),
            Err(e) => Err(e),
        };
        self.record(r)
    }

    /// The runtime's statistics `s` with what the application thread counts itself.
    fn with_app_side(&self, mut s: Stats) -> Stats {
        s.pinned = self.pinned;
        s.lock_wait = self.lock_wait;
        s.barrier_wait = self.barrier_wait;
        s.view_wait = self.view_wait.get();
        s
    }

    /// Orderly end of the job: waits until every node has called `exit`, prints statistics if
    /// asked (`TMK_STATS=1`), and on node 0 of a local job reaps the other nodes, reporting any
    /// that failed. Required: a `Tmk` dropped without it fails the job (its peers are told that
    /// its application left without calling exit, and why its last call into treadmarks failed,
    /// if it did). Exiting while holding a lock is an error ([`ProtocolError::ExitHolding`]), and so is
    /// exiting while another node waits at a barrier ([`ProtocolError::ExitAtBarrier`]); the
    /// peers are told. Node 0 of a local job waits at most [`Tmk::EXIT_REAP_WAIT`] (30 s) after the
    /// job's exit for the processes it started to end (a node's `main` may go on after its
    /// exit), then kills those still running and returns an error naming the first.
    pub fn exit(mut self) -> Result<()> {
        self.exit_inner().map(drop)
    }

    /// Like [`Tmk::exit`], returning this node's final statistics, taken as the exit completes
    /// (every node has called it): the exit's messages and what this node served the others
    /// while it waited for them are in.
    pub fn exit_with_stats(mut self) -> Result<Stats> {
        self.exit_inner()
    }

    fn exit_inner(&mut self) -> Result<Stats> {
        let exited = self.rendezvous();
        if let Err(e) = &exited {
            (*self.last_error.get_mut(), self.exit_failed) = (Some(e.to_string()), true);
        }
        exited
    }

    /// The exit itself: [`Tmk::exit`] less the note of its failure.
    fn rendezvous(&mut self) -> Result<Stats> {
        // The final statistics are taken as the exit completes: its messages, and what this node
        // served the others while it waited for them, are in.
        let stats = match self.call(Command::Exit)? {
            Reply::Exited(s) => self.with_app_side(*s),
            other => unreachable!("exit answered with {other:?}"),
        };
        self.exited = true;
        self.engine.join()?;
        if let Some(a) = self.unpinned.take() {
            a.restore();
        }
        if self.stats_json {
            crate::report(&format!("TMK_STATS {}", stats.to_json()));
        } else if self.print_stats {
            crate::report(&stats.to_string());
        }
        if let Some(children) = self.children.take() {
            children.wait(Self::EXIT_REAP_WAIT)?;
        }
        Ok(stats)
    }
}

impl Drop for Tmk {
    /// A job left without [`Tmk::exit`] has failed (or the application gave up): let the service
    /// thread flush what it queued (abort messages), bounded, then wait (bounded) for any spawned
    /// nodes to exit, killing those that do not, and reap them.
    fn drop(&mut self) {
        if !self.exited && matches!(self.engine, Engine::Remote { .. }) {
            let why = match (self.last_error.get_mut().as_ref(), self.exit_failed) {
                (Some(e), true) => format!("its exit failed: {e}"),
                _ if std::thread::panicking() => {
                    "its application left without calling exit (it panicked)".into()
                }
                (Some(e), false) => format!(
                    "its application left without calling exit (its last call into treadmarks failed: {e})"
                ),
                (None, _) => "its application left without calling exit (an error or an early return)".into(),
            };
            let _ = self.engine.call(Command::Shutdown { why });
            let _ = self.engine.join();
        }
        if let Some(a) = self.unpinned.take() {
            a.restore();
        }
        // The other nodes notice a failed job within seconds and exit by themselves, saying why;
        // give them that long before they are killed (`Children::wait` kills on timeout).
        if let Some(children) = self.children.take() {
            let _ = children.wait(Duration::from_secs(10));
        }
    }
}

impl From<crate::mem::ViewError> for Error {
    fn from(e: crate::mem::ViewError) -> Self {
        Error::View(e)
    }
}

/// A held lock; dropping it releases the lock. Derefs to the [`Tmk`].
#[derive(Debug)]
#[must_use = "dropping the guard releases the lock at once: bind it (`let guard = tmk.lock(l)?`)"]
pub struct LockGuard<'a> {
    tmk: &'a mut Tmk,
    lock: u32,
    released: bool,
}

impl LockGuard<'_> {
    /// Releases the lock, returning any error (dropping the guard releases too, and can only
    /// print an error: the lock already released through the guard's `Tmk`, say).
    pub fn unlock(mut self) -> Result<()> {
        self.released = true;
        self.tmk.lock_release(self.lock)
    }
}

impl std::ops::Deref for LockGuard<'_> {
    type Target = Tmk;
    fn deref(&self) -> &Tmk {
        self.tmk
    }
}

impl std::ops::DerefMut for LockGuard<'_> {
    fn deref_mut(&mut self) -> &mut Tmk {
        self.tmk
    }
}

impl Drop for LockGuard<'_> {
    fn drop(&mut self) {
        // Dropped as a `?` leaves its scope, say: a release that succeeds does not hide the
        // error the peers are to hear of (only a failed one is noted).
        if !self.released
            && let Err(e) = self.tmk.release(self.lock)
        {
            crate::report(&format!("treadmarks: {}: release of lock {} failed: {e}", self.tmk.me, self.lock));
            *self.tmk.last_error.get_mut() = Some(e.to_string());
        }
    }
}
