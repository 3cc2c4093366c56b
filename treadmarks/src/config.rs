//! Job configuration, from the environment and the command line.
//!
//! | setting | variable | flag | default |
//! |---|---|---|---|
//! | nodes | `TMK_NPROCS` | `-n N`, `--nprocs N` | 1 |
//! | this node's rank (join an existing job) | `TMK_RANK` | `--rank R` | unset: start the job |
//! | where node 0 listens / others meet it | `TMK_ROOT` | `--root HOST:PORT` | `127.0.0.1:0` when launching |
//! | heap size | `TMK_HEAP_SIZE` (`256MiB`, `1GiB`, bytes) | | 1 GiB; on the mprotect backend (multi-node jobs) at most what `vm.max_map_count` allows (240 MiB at its default), said once |
//! | heap base address | `TMK_HEAP_BASE` (hex) | | `0x600000000000` |
//! | locks / barriers | `TMK_LOCKS` / `TMK_BARRIERS` | | 1024 / 64 |
//! | collect consistency data past | `TMK_GC_THRESHOLD` (`1MiB`, bytes) | | 32 MiB or a quarter of the heap, if less |
//! | fail a lock acquire past this much consistency data (a program that never collects; barriers collect at half of it if that is below the threshold) | `TMK_CONSISTENCY_LIMIT` (bytes; 0: no limit) | | half the machine's memory over the job's nodes on it |
//! | print statistics at exit | `TMK_STATS=1` (a table), `TMK_STATS=json` (one line) | | off |
//! | bound on meeting the other nodes | `TMK_CONNECT_TIMEOUT` (seconds) | | 30 |
//! | how long the application polls for a reply, or for a fault's resolution, before it sleeps | `TMK_SPIN_US` (µs) | | 100 |
//! | push diffs at barriers to pages' earlier readers | `TMK_PUSH=0` turns it off | | on |
//! | skip a page's push when its write history says the next epoch rewrites it (until its reader fetches it after a skip) | `TMK_PUSH_SKIP=0` turns it off | | on |
//! | heap pages allocated so far backed with memory ahead of their first touch (the valid ones mapped, too): node 0 in its own allocations, the others when a distributed value comes, everybody at barriers | `TMK_BACK_HEAP=0` turns it off | | on |
//! | diff memory backed at startup (multi-node jobs) | `TMK_DIFF_RESERVE` (`16MiB`, bytes; 0 turns it off) | | the collection threshold plus one 2 MiB chunk, at most 64 MiB |
//! | twin memory backed at startup (multi-node jobs): the twins of the first pages twinned | `TMK_TWIN_RESERVE` (bytes; 0 turns it off) | | 32 MiB, at most the heap |
//! | the service thread's allocator heap backed at startup (multi-node jobs; glibc: the C allocator then keeps freed memory and takes blocks under 32 MiB from its heaps, process-wide, see `mem/malloc.rs`) | `TMK_MALLOC_RESERVE` (bytes; 0 turns it off) | | 16 MiB |
//! | most lock tokens a grant passes along unasked (locks the acquirer took after this one last time, or the ids after it; the granter keeps those it expects to take no later than the acquirer) | `TMK_LOCK_BUNDLE` (0 turns it off) | | 256 |
//! | pin each node (its application and service threads) to one CPU | `TMK_PIN=1` / `TMK_PIN=0` | | on in a job started with `-n N` on one machine, to CPUs no other job here is pinned to (the launcher claims the first free ones for the job's life; where too few are free the job runs unpinned, and says so); with `TMK_PIN=1`, node `r` to the `r`-th allowed CPU modulo their number; off for nodes that join with `TMK_RANK` |
//! | real-time (`SCHED_FIFO`) service thread, so it preempts its own application thread at once (needs privilege; ignored without) | `TMK_SERVICE_RT=1` / `TMK_SERVICE_RT=0` | | as pinning |
//! | how long the service thread polls its sockets, instead of sleeping, while the application waits for an answer | `TMK_SERVICE_SPIN_US` (µs) | | 1000 when pinned with a CPU to each node of the job, else 0 |
//! | fault backend | `TMK_FAULTS` (`auto`, `uffd`, `mprotect`) | | `auto`: userfaultfd if the kernel offers it |
//! | pages a view of one range must fetch to stream (return before its pages are in) | `TMK_STREAM_MIN_PAGES` (0 turns it off) | | 64 |
//!
//! Flags win over variables. Flags this module does not know are left for the application.
//! On/off settings take `1`, `on`, `true` or `yes` and `0`, `off`, `false` or `no`; a value that
//! does not parse is refused with an error naming the setting and the value.

use std::net::SocketAddr;
use std::time::Duration;

pub use crate::mem::FaultsMode;

/// A bad setting, naming it and its value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A value that does not parse.
    #[error("bad value {value:?} for {name}: {why}")]
    Invalid { name: &'static str, value: String, why: String },
    /// A flag without its value.
    #[error("{flag} needs a value")]
    MissingValue { flag: String },
}

/// How this process takes part in the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Started alone: this process is node 0 and spawns nodes `1..nprocs` on this machine.
    Launcher,
    /// Joins an existing job as node `rank`, meeting node 0 at `root`.
    Member { rank: u16 },
}

/// Everything a node needs to start.
#[derive(Clone, Debug)]
pub struct Config {
    pub nprocs: u16,
    pub role: Role,
    pub root: Option<SocketAddr>,
    /// The host name `root` was resolved from (`TMK_ROOT=host-a:7000`); `None` where it was given
    /// as an address. See [`Config::root_listen_addr`].
    pub root_name: Option<String>,
    pub heap_size: usize,
    /// On the mprotect fault backend, shrink a heap larger than `vm.max_map_count` allows to the
    /// largest that fits, saying so, instead of refusing to start ([`crate::mem::fit_heap`]).
    /// On by default; `TMK_HEAP_SIZE` turns it off (a size asked for is used or refused), and so
    /// does `fit_heap: false` in a configuration built in code. A launcher passes its nodes the
    /// size it chose; nodes started by hand each choose for their machine (and meet only if they
    /// agree).
    pub fit_heap: bool,
    pub heap_base: usize,
    pub nlocks: u32,
    pub nbarriers: u32,
    /// Consistency data (bytes) past which a node asks the next barrier to collect
    /// (`TMK_GC_THRESHOLD`); `None`: [`Config::gc_threshold_bytes`]'s default, which follows the
    /// heap's size as it is at startup (after [`Config::fit_heap`]).
    pub gc_threshold: Option<u64>,
    /// Push diffs at barriers to the pages' earlier readers (`protocol/push.rs`).
    pub push: bool,
    /// Skip the push of a page that its write history says is written again in the next epoch
    /// (`protocol/push.rs`, "Skipping").
    pub push_skip: bool,
    /// Back the allocated heap with memory ahead of its first touch (`protocol/collective.rs`).
    pub back_heap: bool,
    /// Diff memory (bytes) a node of a multi-node job backs at startup (`TMK_DIFF_RESERVE`,
    /// `mem/chunk.rs`); `None`: [`Config::diff_reserve_bytes`]'s default.
    pub diff_reserve: Option<u64>,
    /// Twin memory (bytes) a node of a multi-node job backs at startup (`TMK_TWIN_RESERVE`,
    /// `mem::Heap::reserve_twins`).
    pub twin_reserve: usize,
    /// Allocator heap (bytes) the service thread of a multi-node job backs at startup
    /// (`TMK_MALLOC_RESERVE`, `mem/malloc.rs`); 0: none, and the allocator is left as
    /// it is.
    pub malloc_reserve: usize,
    /// Most lock tokens a grant passes along unasked (`protocol/lock.rs`); 0: none.
    pub lock_bundle: usize,
    /// A view that would fetch at least this many pages streams (`TMK_STREAM_MIN_PAGES`,
    /// `protocol/stream.rs`); 0: none does.
    pub stream_min_pages: usize,
    pub print_stats: bool,
    /// Print them as one JSON line (`TMK_STATS=json`) instead of a table.
    pub stats_json: bool,
    pub connect_timeout: Duration,
    /// How page faults are caught (`TMK_FAULTS`): see `mem::FaultBackend` and the README.
    pub faults: FaultsMode,
    /// Pin this node to one CPU (`TMK_PIN`); `None`: only in a job launched on one machine.
    pub pin: Option<bool>,
    /// Real-time service thread (`TMK_SERVICE_RT`); `None`: when pinned.
    pub service_rt: Option<bool>,
    /// How long the service thread polls while the application waits (`TMK_SERVICE_SPIN_US`),
    /// counted from the wait's start and again from each peer's message during it; `None`:
    /// [`DEFAULT_SERVICE_SPIN`] when the node has a CPU of its own, else none.
    pub service_spin: Option<Duration>,
    /// How long the application thread polls for a reply, or for a fault's resolution, before
    /// it sleeps (`TMK_SPIN_US`).
    pub app_spin: Duration,
    /// Consistency data past which a lock acquire fails (`TMK_CONSISTENCY_LIMIT`; 0: none);
    /// `None`: half this machine's memory over the job's nodes on it
    /// ([`Config::consistency_limit_bytes`]).
    pub consistency_limit: Option<u64>,
}

/// Allocator heap the service thread backs at startup, by default (`mem/malloc.rs`): radix at
/// 2 nodes grew it by ~3 MiB a node during its computation.
pub const DEFAULT_MALLOC_RESERVE: usize = 16 << 20;

/// Most lock tokens a grant passes along unasked, by default. Water's 512 locks a step cost 2
/// round trips a node instead of 512 (16 at 32, 4 at 128): each node walks them in two halves of
/// 256, and a grant now carries a whole half. A wish of 256 lock ids adds ~512 bytes to a
/// request. Water, alternated medians: at 2 nodes 0.0874 s at 32, 0.0849 s at 128 (11 runs,
/// an early version); then, once a remote acquire cost mostly the wake-up of the granter's
/// service thread, 0.0732 s at 128, 0.0706 s at 256 (15 runs), 0.0703 against 0.0711 s at 512;
/// at 4 nodes 0.69-0.71 s at 128, 0.63-0.66 s at 256 (5 runs each).
pub const DEFAULT_LOCK_BUNDLE: usize = 256;

/// Consistency data (interval records, diffs, writer tables) past which a barrier collects, by
/// default. Collecting costs ~1 ms a time at 2 nodes and frees the diffs' memory for reuse
/// (`mem/chunk.rs`), but makes every page written afterwards twin again and may fetch pages
/// whole. In alternated runs at 2 nodes, jacobi3d (~75 KB of diffs an iteration) ran 0.68-0.70 s
/// at 32 MiB against 0.70-0.75 s at 64 MiB (the old default), and radix 0.140-0.147 s against
/// 0.142-0.19 s; at 16 MiB radix collected mid-sort and ran 6% slower.
pub const DEFAULT_GC_THRESHOLD: u64 = 32 << 20;

/// Twin memory a node of a multi-node job backs at startup, by default: the twins of the first
/// 8,192 pages it twins. At 2 nodes radix twins 23 MiB of distinct pages a node (the most of the
/// suite), fft 16 MiB, the others less.
pub const DEFAULT_TWIN_RESERVE: usize = 32 << 20;

/// Pages a view must fetch to stream (`protocol/stream.rs`), by default.
pub const DEFAULT_STREAM_MIN_PAGES: usize = 64;

/// Largest heap a job may have (`TMK_HEAP_SIZE`).
pub const MAX_HEAP_SIZE: usize = 64 << 30;

/// Longest a thread may poll before it sleeps (`TMK_SPIN_US`, `TMK_SERVICE_SPIN_US`), in µs.
pub const MAX_SPIN_US: u64 = 1_000_000;

/// Most locks a job may have (`TMK_LOCKS`).
pub const MAX_LOCKS: u32 = 1 << 20;

/// Most barriers a job may have (`TMK_BARRIERS`).
pub const MAX_BARRIERS: u32 = 1 << 16;

/// Most lock tokens a grant may pass along unasked (`TMK_LOCK_BUNDLE`): every node keeps a ring
/// of eight times as many of its acquires.
pub const MAX_LOCK_BUNDLE: usize = 1 << 16;

/// Largest allocator heap backed at startup (`TMK_MALLOC_RESERVE`).
pub const MAX_MALLOC_RESERVE: usize = 1 << 30;

/// Longest bound on meeting the other nodes, in seconds (`TMK_CONNECT_TIMEOUT`).
pub const MAX_CONNECT_TIMEOUT_S: u64 = 86_400;

/// The application thread's polling budget, by default.
pub const DEFAULT_APP_SPIN: Duration = Duration::from_micros(100);

/// The service thread's polling budget for a node pinned to a CPU of its own.
pub const DEFAULT_SERVICE_SPIN: Duration = Duration::from_micros(1000);

impl Default for Config {
    fn default() -> Self {
        Config {
            nprocs: 1,
            role: Role::Launcher,
            root: None,
            root_name: None,
            heap_size: 1 << 30,
            fit_heap: true,
            heap_base: 0x6000_0000_0000,
            nlocks: 1024,
            nbarriers: 64,
            gc_threshold: None,
            push: true,
            push_skip: true,
            back_heap: true,
            malloc_reserve: DEFAULT_MALLOC_RESERVE,
            diff_reserve: None,
            twin_reserve: DEFAULT_TWIN_RESERVE,
            lock_bundle: DEFAULT_LOCK_BUNDLE,
            stream_min_pages: DEFAULT_STREAM_MIN_PAGES,
            print_stats: false,
            stats_json: false,
            connect_timeout: Duration::from_secs(30),
            faults: FaultsMode::Auto,
            pin: None,
            service_rt: None,
            service_spin: None,
            app_spin: DEFAULT_APP_SPIN,
            consistency_limit: None,
        }
    }
}

fn invalid(name: &'static str, value: &str, why: impl ToString) -> ConfigError {
    ConfigError::Invalid { name, value: value.to_string(), why: why.to_string() }
}

/// This machine's memory (`MemTotal` in `/proc/meminfo`), if it can be read.
fn physical_memory() -> Option<u64> {
    crate::headroom::meminfo("MemTotal:")
}

/// An on/off setting: `1`, `on`, `true` or `yes`; `0`, `off`, `false` or `no`.
fn switch(name: &'static str, v: &str) -> Result<bool, ConfigError> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "on" | "true" | "yes" => Ok(true),
        "0" | "off" | "false" | "no" => Ok(false),
        _ => Err(invalid(name, v, "expected 1 or 0 (on/off, true/false, yes/no)")),
    }
}

/// The address `v` (`HOST:PORT`, a name or an address) names, the first a name resolves to, and
/// its host if that is a name rather than an address. A name is looked up on a thread of its
/// own and waited for at most `wait` (the meeting's bound): a resolver that does not answer (a
/// name server gone) fails the configuration then, instead of holding the node up for as long
/// as the resolver's own retries take.
fn address(name: &'static str, v: &str, wait: Duration) -> Result<(SocketAddr, Option<String>), ConfigError> {
    use std::net::ToSocketAddrs;
    if let Ok(addr) = v.trim().parse::<SocketAddr>() {
        return Ok((addr, None));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = v.to_string();
    // Left to finish on its own if it outlasts the wait; it holds nothing the node needs.
    std::thread::spawn(move || {
        let _ = tx.send(owned.to_socket_addrs().map(|mut addrs| addrs.next()));
    });
    let resolved = rx.recv_timeout(wait).map_err(|_| {
        let secs = wait.as_secs_f64().ceil();
        invalid(name, v, format!("the name did not resolve within {secs} s (TMK_CONNECT_TIMEOUT)"))
    })?;
    let addr = resolved
        .map_err(|e| invalid(name, v, e))?
        .ok_or_else(|| invalid(name, v, "the name resolves to no address"))?;
    let host = v.trim().rsplit_once(':').map_or(v, |(host, _)| host);
    Ok((addr, Some(host.to_string())))
}

/// A runtime flag (`-n`, `--nprocs`, `--rank` or `--root`) and its value.
type Flag = (String, String);

/// The runtime's flags in `args`, in order, and the arguments left for the application.
fn split_flags(args: Vec<String>) -> Result<(Vec<Flag>, Vec<String>), ConfigError> {
    let (mut flags, mut rest) = (Vec::new(), Vec::new());
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        // Everything after `--` is the application's, `--` included (its own parser may want
        // it): `prog -n 2 -- -n 1024` leaves it `-- -n 1024`.
        if a == "--" {
            rest.push(a);
            rest.extend(it);
            break;
        }
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") || f == "-n" => (f.to_string(), Some(v.to_string())),
            // `-n4`, as a short option may be written.
            _ if a.len() > 2 && a.starts_with("-n") && a[2..].bytes().all(|b| b.is_ascii_digit()) => {
                ("-n".to_string(), Some(a[2..].to_string()))
            }
            _ => (a.clone(), None),
        };
        if !matches!(flag.as_str(), "-n" | "--nprocs" | "--rank" | "--root") {
            rest.push(a);
            continue;
        }
        match inline.or_else(|| it.next()) {
            Some(value) => flags.push((flag, value)),
            None => return Err(ConfigError::MissingValue { flag }),
        }
    }
    Ok((flags, rest))
}

fn num<T: std::str::FromStr>(name: &'static str, v: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    v.trim().parse().map_err(|e| invalid(name, v, e))
}

/// The settings the `TMK_*` variables hold (the table in the module docs).
pub const SETTINGS: &[&str] = &[
    "TMK_NPROCS",
    "TMK_RANK",
    "TMK_ROOT",
    "TMK_HEAP_SIZE",
    "TMK_HEAP_BASE",
    "TMK_LOCKS",
    "TMK_BARRIERS",
    "TMK_GC_THRESHOLD",
    "TMK_PIN",
    "TMK_SERVICE_RT",
    "TMK_SERVICE_SPIN_US",
    "TMK_SPIN_US",
    "TMK_CONSISTENCY_LIMIT",
    "TMK_DIFF_RESERVE",
    "TMK_TWIN_RESERVE",
    "TMK_MALLOC_RESERVE",
    "TMK_PUSH",
    "TMK_PUSH_SKIP",
    "TMK_BACK_HEAP",
    "TMK_LOCK_BUNDLE",
    "TMK_STREAM_MIN_PAGES",
    "TMK_STATS",
    "TMK_CONNECT_TIMEOUT",
    "TMK_FAULTS",
];

/// `TMK_*` names a launcher passes its nodes, and this workspace's tests and tools use among
/// themselves (not settings): prefixes, and whole names.
const INTERNAL_PREFIXES: &[&str] = &["TMK_SIM_", "TMK_TEST_", "TMK_BENCH_"];
const INTERNAL_NAMES: &[&str] = &[
    "TMK_LAUNCHER_PID",
    "TMK_LAUNCHER_CPUS",
    "TMK_MEM_TEST_CHILD",
    "TMK_BIG_HEAP_CHILD",
    "TMK_REQUIRE_NETNS",
    "TMK_REQUIRE_UFFD",
];

/// A warning for each `TMK_*` variable among `names` that is no setting (a typo, most likely,
/// which would otherwise be ignored in silence), naming the setting it is closest to.
pub fn unknown_settings<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    names
        .into_iter()
        .filter(|n| n.starts_with("TMK_") && !SETTINGS.contains(n))
        .filter(|n| !INTERNAL_PREFIXES.iter().any(|p| n.starts_with(p)) && !INTERNAL_NAMES.contains(n))
        .map(|n| {
            let near =
                SETTINGS.iter().min_by_key(|s| edit_distance(n, s)).filter(|s| edit_distance(n, s) <= 3);
            match near {
                Some(s) => format!("{n} is not a setting, and is ignored (did you mean {s}?)"),
                None => format!("{n} is not a setting, and is ignored"),
            }
        })
        .collect()
}

/// Levenshtein distance of two ASCII names.
fn edit_distance(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut diag = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let next = (diag + usize::from(ca != cb)).min(row[j] + 1).min(row[j + 1] + 1);
            diag = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

/// Parses `1048576`, `64KiB`, `256MiB`, `1GiB` (also `K`, `M`, `G`, `KB`...: powers of 1024).
pub fn parse_size(name: &'static str, v: &str) -> Result<usize, ConfigError> {
    let t = v.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: usize = digits.parse().map_err(|e| invalid(name, v, e))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        other => return Err(invalid(name, v, format!("unknown unit {other:?} (use KiB, MiB or GiB)"))),
    };
    n.checked_mul(1 << shift).ok_or_else(|| invalid(name, v, "too large"))
}

impl Config {
    /// The settings a launcher passes to the nodes it spawns, as the `TMK_*` variables that
    /// [`Config::from_env_and_args`] reads back to the same values (`None`: the variable is
    /// removed, so that the default applies, not a value the launcher's environment happens to
    /// hold). Every setting but the node's place in the job (`nprocs`, `role`, `root`, `pin`),
    /// which the launcher sets itself. Durations go in whole microseconds (the spins) and
    /// seconds (the meeting's bound, rounded up), as they are read.
    pub fn to_vars(&self) -> Vec<(&'static str, Option<String>)> {
        let on = |b: bool| Some(if b { "1" } else { "0" }.to_string());
        let stats = if self.stats_json {
            "json"
        } else if self.print_stats {
            "1"
        } else {
            "0"
        };
        vec![
            ("TMK_HEAP_SIZE", Some(self.heap_size.to_string())),
            ("TMK_HEAP_BASE", Some(format!("{:#x}", self.heap_base))),
            ("TMK_LOCKS", Some(self.nlocks.to_string())),
            ("TMK_BARRIERS", Some(self.nbarriers.to_string())),
            ("TMK_GC_THRESHOLD", self.gc_threshold.map(|b| b.to_string())),
            ("TMK_SERVICE_RT", self.service_rt.and_then(on)),
            ("TMK_SERVICE_SPIN_US", self.service_spin.map(|d| d.as_micros().to_string())),
            ("TMK_SPIN_US", Some(self.app_spin.as_micros().to_string())),
            ("TMK_CONSISTENCY_LIMIT", self.consistency_limit.map(|b| b.to_string())),
            ("TMK_DIFF_RESERVE", self.diff_reserve.map(|b| b.to_string())),
            ("TMK_TWIN_RESERVE", Some(self.twin_reserve.to_string())),
            ("TMK_MALLOC_RESERVE", Some(self.malloc_reserve.to_string())),
            ("TMK_PUSH", on(self.push)),
            ("TMK_PUSH_SKIP", on(self.push_skip)),
            ("TMK_BACK_HEAP", on(self.back_heap)),
            ("TMK_LOCK_BUNDLE", Some(self.lock_bundle.to_string())),
            ("TMK_STREAM_MIN_PAGES", Some(self.stream_min_pages.to_string())),
            ("TMK_STATS", Some(stats.to_string())),
            ("TMK_CONNECT_TIMEOUT", Some(self.connect_timeout.as_secs_f64().ceil().to_string())),
            ("TMK_FAULTS", Some(self.faults.name().to_string())),
        ]
    }

    /// This process's arguments, without the program name, for [`Config::from_env_and_args`]:
    /// one that is not UTF-8 is an error naming it (`std::env::args` panics on it).
    pub fn command_line() -> Result<Vec<String>, ConfigError> {
        std::env::args_os()
            .skip(1)
            .map(|arg| {
                arg.into_string().map_err(|bad| ConfigError::Invalid {
                    name: "the command line",
                    value: bad.to_string_lossy().into_owned(),
                    why: "an argument that is not UTF-8".into(),
                })
            })
            .collect()
    }

    /// Reads the `TMK_*` variables, then the flags in `args` (without the program name).
    /// Returns the configuration and the arguments it did not consume.
    pub fn from_env_and_args(args: Vec<String>) -> Result<(Config, Vec<String>), ConfigError> {
        Self::from_vars_and_args(|k| std::env::var_os(k), args)
    }

    /// [`Config::from_env_and_args`] with the variables `var` gives.
    fn from_vars_and_args(
        var: impl Fn(&str) -> Option<std::ffi::OsString>,
        args: Vec<String>,
    ) -> Result<(Config, Vec<String>), ConfigError> {
        let mut c = Config::default();
        // Set by the launcher in the nodes it spawns (not settings of the user's); the pid alone
        // is a launcher's that another program started.
        let spawned = crate::runtime::launch::spawned_by_launcher_in(&var);
        let (flags, rest) = split_flags(args)?;
        // A node a launcher spawned was given the launcher's arguments, these flags among them,
        // and the launcher's settings for them in its environment, which win: its rank, and the
        // address the launcher listens on where `--root` may name port 0. Elsewhere flags win,
        // and the variables they override are not read (a bad one refused, a host name looked up).
        let flags = if spawned { Vec::new() } else { flags };
        let flagged = |names: &[&str]| flags.iter().any(|(f, _)| names.contains(&f.as_str()));
        // Set and not empty; a value that is not UTF-8 is refused, not taken for unset.
        let env = |k: &'static str| match var(k).map(std::ffi::OsString::into_string) {
            None => Ok(None),
            Some(Ok(v)) => Ok(Some(v).filter(|v| !v.is_empty())),
            Some(Err(v)) => Err(invalid(k, &v.to_string_lossy(), "not UTF-8")),
        };
        if !flagged(&["-n", "--nprocs"])
            && let Some(v) = env("TMK_NPROCS")?
        {
            c.nprocs = num("TMK_NPROCS", &v)?;
        }
        if !flagged(&["--rank"])
            && let Some(v) = env("TMK_RANK")?
        {
            c.role = Role::Member { rank: num("TMK_RANK", &v)? };
        }
        // Resolved last, once the meeting's bound that waits for it is known.
        let mut root = None;
        if !flagged(&["--root"])
            && let Some(v) = env("TMK_ROOT")?
        {
            root = Some(("TMK_ROOT", v));
        }
        if let Some(v) = env("TMK_HEAP_SIZE")? {
            c.heap_size = parse_size("TMK_HEAP_SIZE", &v)?;
            c.fit_heap = false;
        }
        if let Some(v) = env("TMK_HEAP_BASE")? {
            let hex = v.trim().trim_start_matches("0x");
            c.heap_base = usize::from_str_radix(hex, 16).map_err(|e| invalid("TMK_HEAP_BASE", &v, e))?;
        }
        if let Some(v) = env("TMK_LOCKS")? {
            c.nlocks = num("TMK_LOCKS", &v)?;
        }
        if let Some(v) = env("TMK_BARRIERS")? {
            c.nbarriers = num("TMK_BARRIERS", &v)?;
        }
        if let Some(v) = env("TMK_GC_THRESHOLD")? {
            c.gc_threshold = Some(parse_size("TMK_GC_THRESHOLD", &v)? as u64);
        }
        if let Some(v) = env("TMK_PIN")? {
            c.pin = Some(switch("TMK_PIN", &v)?);
        }
        if let Some(v) = env("TMK_SERVICE_RT")? {
            c.service_rt = Some(switch("TMK_SERVICE_RT", &v)?);
        }
        if let Some(v) = env("TMK_SERVICE_SPIN_US")? {
            c.service_spin = Some(Duration::from_micros(num("TMK_SERVICE_SPIN_US", &v)?));
        }
        if let Some(v) = env("TMK_SPIN_US")? {
            c.app_spin = Duration::from_micros(num("TMK_SPIN_US", &v)?);
        }
        if let Some(v) = env("TMK_CONSISTENCY_LIMIT")? {
            c.consistency_limit = Some(parse_size("TMK_CONSISTENCY_LIMIT", &v)? as u64);
        }
        if let Some(v) = env("TMK_DIFF_RESERVE")? {
            c.diff_reserve = Some(parse_size("TMK_DIFF_RESERVE", &v)? as u64);
        }
        if let Some(v) = env("TMK_TWIN_RESERVE")? {
            c.twin_reserve = parse_size("TMK_TWIN_RESERVE", &v)?;
        }
        if let Some(v) = env("TMK_MALLOC_RESERVE")? {
            c.malloc_reserve = parse_size("TMK_MALLOC_RESERVE", &v)?;
        }
        if let Some(v) = env("TMK_PUSH")? {
            c.push = switch("TMK_PUSH", &v)?;
        }
        if let Some(v) = env("TMK_PUSH_SKIP")? {
            c.push_skip = switch("TMK_PUSH_SKIP", &v)?;
        }
        if let Some(v) = env("TMK_BACK_HEAP")? {
            c.back_heap = switch("TMK_BACK_HEAP", &v)?;
        }
        if let Some(v) = env("TMK_LOCK_BUNDLE")? {
            c.lock_bundle = num("TMK_LOCK_BUNDLE", &v)?;
        }
        if let Some(v) = env("TMK_STREAM_MIN_PAGES")? {
            c.stream_min_pages = num("TMK_STREAM_MIN_PAGES", &v)?;
        }
        if let Some(v) = env("TMK_STATS")? {
            c.stats_json = v.eq_ignore_ascii_case("json");
            c.print_stats = c.stats_json
                || switch("TMK_STATS", &v)
                    .map_err(|_| invalid("TMK_STATS", &v, "expected 1 or 0 (on/off, ...) or json"))?;
        }
        if let Some(v) = env("TMK_CONNECT_TIMEOUT")? {
            c.connect_timeout = Duration::from_secs(num("TMK_CONNECT_TIMEOUT", &v)?);
        }
        if let Some(v) = env("TMK_FAULTS")? {
            c.faults = v.parse().map_err(|why: String| invalid("TMK_FAULTS", &v, why))?;
        }
        for (flag, value) in flags {
            match flag.as_str() {
                "-n" => c.nprocs = num("-n", &value)?,
                "--nprocs" => c.nprocs = num("--nprocs", &value)?,
                "--rank" => c.role = Role::Member { rank: num("--rank", &value)? },
                _ => root = Some(("--root", value)),
            }
        }
        if let Some((name, v)) = root {
            let wait = c.connect_timeout.max(Duration::from_secs(1));
            (c.root, c.root_name) = address(name, &v, wait).map(|(a, n)| (Some(a), n))?;
        }
        c.validate()?;
        Ok((c, rest))
    }

    /// Where node 0 listens, when it joins a job by hand: the root's address, or every interface at its
    /// port (`[::]`: [`crate::transport::listen_everywhere`] takes IPv4 there too, or IPv4 alone on a
    /// host without IPv6) where the root was given as a host name that resolves to a loopback address
    /// here but is no loopback name (`localhost`): Debian and Ubuntu map the host's own name to
    /// 127.0.1.1 in `/etc/hosts`, and a node 0 listening there was unreachable from the other hosts,
    /// whose resolvers give its network address (an IPv6 one, maybe); they failed at the meeting's
    /// timeout.
    pub fn root_listen_addr(&self) -> Option<SocketAddr> {
        let root = self.root?;
        // The names resolvers give the loopback addresses (`/etc/hosts` of Debian, Red Hat, ...).
        let local_name = |n: &str| {
            let n = n.trim_end_matches('.').to_ascii_lowercase();
            n.ends_with(".localhost")
                || [
                    "localhost",
                    "localhost4",
                    "localhost6",
                    "ip6-localhost",
                    "ip6-loopback",
                    "localhost.localdomain",
                    "localhost4.localdomain4",
                    "localhost6.localdomain6",
                ]
                .contains(&n.as_str())
        };
        match &self.root_name {
            Some(name) if root.ip().is_loopback() && !local_name(name) => {
                Some(SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), root.port()))
            }
            _ => Some(root),
        }
    }

    /// Checks the settings against each other.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let n = self.nprocs.to_string();
        if self.nprocs == 0 {
            return Err(invalid("TMK_NPROCS / -n", &n, "a job needs at least one node"));
        }
        if let Role::Member { rank } = self.role {
            if rank >= self.nprocs {
                let why = format!("the job has {} nodes", self.nprocs);
                return Err(invalid("TMK_RANK / --rank", &rank.to_string(), why));
            }
            if self.root.is_none() && self.nprocs > 1 {
                return Err(invalid("TMK_ROOT", "", "a node joining a job must know where node 0 listens"));
            }
        }
        if self.heap_size == 0 || !self.heap_size.is_multiple_of(4096) {
            return Err(invalid(
                "TMK_HEAP_SIZE",
                &self.heap_size.to_string(),
                "must be a non-zero multiple of 4 KiB",
            ));
        }
        let base = format!("{:#x}", self.heap_base);
        if self.heap_base == 0 {
            return Err(invalid("TMK_HEAP_BASE", &base, "must not be 0"));
        }
        if self.heap_base.checked_add(self.heap_size).is_none() {
            let why = format!("a heap of {} bytes there would end past the address space", self.heap_size);
            return Err(invalid("TMK_HEAP_BASE", &base, why));
        }
        if !self.heap_base.is_multiple_of(4096) {
            return Err(invalid("TMK_HEAP_BASE", &base, "must be page aligned"));
        }
        if self.nlocks == 0 {
            return Err(invalid("TMK_LOCKS", "0", "a job needs at least one lock"));
        }
        if self.nbarriers == 0 {
            return Err(invalid("TMK_BARRIERS", "0", "a job needs at least one barrier"));
        }
        // Bounds on what every node allocates up front, so that an excessive value is an error
        // naming it rather than an allocation failure that aborts the process.
        let bounds: [(&'static str, u64, u64, &str); 8] = [
            (
                "TMK_HEAP_SIZE",
                self.heap_size as u64,
                MAX_HEAP_SIZE as u64,
                "bytes (64 GiB): every node keeps ~80 bytes of state a 4 KiB page",
            ),
            (
                "TMK_LOCKS",
                u64::from(self.nlocks),
                u64::from(MAX_LOCKS),
                "locks: every node keeps the state of every lock",
            ),
            ("TMK_BARRIERS", u64::from(self.nbarriers), u64::from(MAX_BARRIERS), "barriers"),
            (
                "TMK_LOCK_BUNDLE",
                self.lock_bundle as u64,
                MAX_LOCK_BUNDLE as u64,
                "locks: every node keeps a ring of eight times as many of its acquires",
            ),
            (
                "TMK_MALLOC_RESERVE",
                self.malloc_reserve as u64,
                MAX_MALLOC_RESERVE as u64,
                "bytes (1 GiB), backed at startup",
            ),
            // In whole seconds rounded up, as it is passed to spawned nodes.
            (
                "TMK_CONNECT_TIMEOUT",
                self.connect_timeout.as_secs() + u64::from(self.connect_timeout.subsec_nanos() > 0),
                MAX_CONNECT_TIMEOUT_S,
                "s (a day)",
            ),
            (
                "TMK_SPIN_US",
                self.app_spin.as_micros().try_into().unwrap_or(u64::MAX),
                MAX_SPIN_US,
                "µs (a second): the application polls this long in every wait before it sleeps",
            ),
            (
                "TMK_SERVICE_SPIN_US",
                self.service_spin.map_or(0, |d| d.as_micros().try_into().unwrap_or(u64::MAX)),
                MAX_SPIN_US,
                "µs (a second): a service thread polls this long after every message before it sleeps",
            ),
        ];
        if let Some(&(name, value, max, what)) = bounds.iter().find(|b| b.1 > b.2) {
            return Err(invalid(name, &value.to_string(), format!("at most {max} {what}")));
        }
        if self.connect_timeout.is_zero() {
            return Err(invalid("TMK_CONNECT_TIMEOUT", "0", "at least 1 s: the nodes need time to meet"));
        }
        Ok(())
    }

    /// The consistency data past which a lock acquire fails, for a node sharing this machine
    /// with `local_nodes` of the job: as set (0: none), else half the machine's memory
    /// (`/proc/meminfo`) over them; no limit where the memory is unknown.
    pub fn consistency_limit_bytes(&self, local_nodes: u64) -> u64 {
        match self.consistency_limit {
            Some(0) => u64::MAX,
            Some(limit) => limit,
            None => physical_memory().map_or(u64::MAX, |m| m / 2 / local_nodes.max(1)),
        }
    }

    /// The consistency data past which a barrier collects, under a node's consistency limit
    /// `limit` ([`Config::consistency_limit_bytes`]): the collection threshold, or half the
    /// limit if that is less, so that a program that calls barriers collects long before its
    /// lock acquires would fail (a limit at or below the threshold made them fail, barriers or
    /// not), and one that never does still gets its limit.
    pub fn collection_threshold(&self, limit: u64) -> u64 {
        self.gc_threshold_bytes().min(limit / 2)
    }

    /// The collection threshold: as set, else [`DEFAULT_GC_THRESHOLD`] or a quarter of the heap,
    /// if less (a small heap's consistency data would otherwise outgrow it before a collection).
    pub fn gc_threshold_bytes(&self) -> u64 {
        self.gc_threshold.unwrap_or(DEFAULT_GC_THRESHOLD.min(self.heap_size as u64 / 4))
    }

    /// Diff memory to back at startup: as set, else the diffs a node holds before its first
    /// collection: the collection threshold, and one chunk more, since the collection comes at
    /// the barrier after the threshold is passed (the chunk pool caps it at 64 MiB).
    pub fn diff_reserve_bytes(&self) -> u64 {
        self.diff_reserve.unwrap_or(self.gc_threshold_bytes().saturating_add(crate::mem::chunk::CHUNK as u64))
    }

    /// Memory a node of a multi-node job backs at startup, in bytes: its diff reserve (as the
    /// chunk pool caps it), its twin reserve and its allocator reserve.
    pub fn startup_reserves(&self) -> [u64; 3] {
        let pool = (crate::mem::chunk::POOL_CHUNKS * crate::mem::chunk::CHUNK) as u64;
        [
            self.diff_reserve_bytes().min(pool),
            self.twin_reserve.min(self.heap_size) as u64,
            self.malloc_reserve as u64,
        ]
    }

    /// Refuses a multi-node job that would start `nodes` of its nodes on this machine (all of
    /// them for a launcher, one for a node joining by hand) whose startup reserves
    /// ([`Config::startup_reserves`]) exceed the memory it may still take (the machine's
    /// `MemAvailable`, or less where its memory cgroup, a container's, allows less): they would
    /// push it into swap or the OOM killer while the nodes meet, and the job would time out with
    /// no word of why. A one-node job backs no reserves.
    pub fn check_startup_memory(&self, nodes: u16) -> Result<(), ConfigError> {
        let Some((available, whose)) = crate::headroom::available() else { return Ok(()) };
        let [diffs, twins, alloc] = self.startup_reserves();
        let each = diffs + twins + alloc;
        let total = each * u64::from(nodes);
        if self.nprocs < 2 || total <= available {
            return Ok(());
        }
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        let why = format!(
            "{nodes} nodes here back {} MiB each at startup (diffs {}, twins {}, allocator {} MiB), \
             {:.1} GiB, more than the {:.1} GiB {whose}: run fewer, or lower TMK_DIFF_RESERVE, \
             TMK_TWIN_RESERVE and TMK_MALLOC_RESERVE (0 turns each off)",
            each >> 20,
            diffs >> 20,
            twins >> 20,
            alloc >> 20,
            gib(total),
            gib(available)
        );
        // A node joining by hand has no node count of its own to lower: name its largest reserve.
        Err(if nodes == 1 {
            let (name, value) =
                [("TMK_DIFF_RESERVE", diffs), ("TMK_TWIN_RESERVE", twins), ("TMK_MALLOC_RESERVE", alloc)]
                    .into_iter()
                    .max_by_key(|&(_, v)| v)
                    .expect("three reserves");
            invalid(name, &value.to_string(), why.replacen("run fewer, or lower", "lower", 1))
        } else {
            invalid("TMK_NPROCS", &nodes.to_string(), why)
        })
    }

    /// What must be identical on every node of a job.
    pub fn fingerprint(&self) -> String {
        format!(
            "nprocs={} heap={}@{:#x} locks={} barriers={} page={} proto={}",
            self.nprocs,
            self.heap_size,
            self.heap_base,
            self.nlocks,
            self.nbarriers,
            crate::mem::system_page_size(),
            env!("CARGO_PKG_VERSION")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("x", "1MiB").unwrap(), 1 << 20);
        assert_eq!(parse_size("x", "64 KiB").unwrap(), 64 << 10);
        assert_eq!(parse_size("x", "4096").unwrap(), 4096);
        let e = parse_size("TMK_HEAP_SIZE", "3 parsecs").unwrap_err().to_string();
        assert!(e.contains("TMK_HEAP_SIZE") && e.contains("parsecs"), "{e}");
        // A value without digits is named whole, not as the empty digits before its unit.
        let e = parse_size("TMK_HEAP_SIZE", "foo").unwrap_err().to_string();
        assert!(e.contains("\"foo\""), "{e}");
    }

    #[test]
    fn every_setting_read_is_known_and_typos_are_named_with_the_setting_meant() {
        // Every variable this module reads through `env` is among the settings.
        let source = include_str!("config.rs");
        for read in source.split("env(\"").skip(1) {
            let name = &read[..read.find('"').expect("a quoted name")];
            assert!(SETTINGS.contains(&name), "{name} is read but not among SETTINGS");
        }
        assert!(unknown_settings(SETTINGS.iter().copied()).is_empty());
        assert!(unknown_settings(["PATH", "TMK_SIM_SEEDS", "TMK_BENCH_JSON", "TMK_LAUNCHER_PID"]).is_empty());
        assert_eq!(unknown_settings(["TMK_LAUNCHER_PIDS"]).len(), 1, "whole names are whole");
        assert_eq!(
            unknown_settings(["TMK_NPROC", "TMK_BOGUS_SETTING_OF_MINE"]),
            [
                "TMK_NPROC is not a setting, and is ignored (did you mean TMK_NPROCS?)",
                "TMK_BOGUS_SETTING_OF_MINE is not a setting, and is ignored",
            ]
        );
    }

    #[test]
    fn a_job_whose_startup_reserves_exceed_the_memory_available_is_refused() {
        let c = Config { nprocs: 2, ..Config::default() };
        let [diffs, twins, alloc] = c.startup_reserves();
        assert_eq!((diffs, twins, alloc), ((32 << 20) + (2 << 20), 32 << 20, 16 << 20));
        let Some((available, _)) = crate::headroom::available() else { return };
        let too_many = u16::try_from(available / (diffs + twins + alloc) + 1).unwrap_or(u16::MAX);
        let e = c.check_startup_memory(too_many).unwrap_err().to_string();
        assert!(e.contains("back 82 MiB each at startup (diffs 34, twins 32, allocator 16 MiB)"), "{e}");
        assert!(e.contains("TMK_TWIN_RESERVE"), "{e}");
        assert!(c.check_startup_memory(2).is_ok());
        let none = Config { diff_reserve: Some(0), twin_reserve: 0, malloc_reserve: 0, ..c.clone() };
        assert!(none.check_startup_memory(u16::MAX).is_ok(), "nothing backed, nothing to fit");
        // One node joining by hand, its twin reserve beyond the machine: refused too (it was
        // not checked), and a one-node job backs nothing.
        let huge =
            Config { heap_size: 64 << 30, twin_reserve: 64 << 30, role: Role::Member { rank: 1 }, ..c };
        if available < 64 << 30 {
            let e = huge.check_startup_memory(1).unwrap_err().to_string();
            assert!(e.contains("twins 65536") && e.contains("TMK_TWIN_RESERVE"), "{e}");
        }
        assert!(Config { nprocs: 1, ..huge }.check_startup_memory(1).is_ok());
    }

    #[test]
    fn a_zero_connect_timeout_is_refused() {
        let c = Config { connect_timeout: Duration::ZERO, ..Config::default() };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("TMK_CONNECT_TIMEOUT") && e.contains("at least 1 s"), "{e}");
        // A timeout a launcher accepts, its spawned nodes accept too: it is passed to them in
        // whole seconds rounded up (86,401 here, which they refused).
        let c = Config { connect_timeout: Duration::from_millis(86_400_500), ..Config::default() };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("TMK_CONNECT_TIMEOUT") && e.contains("86401"), "{e}");
    }

    /// Settings that are out of range, or would have a thread poll for ever, are refused, each
    /// naming the setting to change.
    #[test]
    fn settings_out_of_range_are_refused_by_name() {
        let d = Config::default;
        let root = Some(SocketAddr::from(([127, 0, 0, 1], 7000)));
        let cases = [
            (Config { nprocs: 0, ..d() }, "TMK_NPROCS / -n"),
            (Config { nprocs: 4, role: Role::Member { rank: 4 }, root, ..d() }, "TMK_RANK / --rank"),
            (Config { nlocks: 0, ..d() }, "TMK_LOCKS"),
            (Config { nbarriers: 0, ..d() }, "TMK_BARRIERS"),
            (Config { app_spin: Duration::MAX, ..d() }, "TMK_SPIN_US"),
            (Config { service_spin: Some(Duration::from_secs(2)), ..d() }, "TMK_SERVICE_SPIN_US"),
            (Config { heap_base: 0, ..d() }, "TMK_HEAP_BASE"),
            (Config { heap_base: usize::MAX & !4095, ..d() }, "TMK_HEAP_BASE"),
        ];
        for (c, name) in cases {
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(&format!("for {name}")), "{name}: {e}");
        }
    }

    /// A consistency limit below twice the collection threshold brings the collections forward
    /// to half of it: a program calling barriers collects before its acquires would fail (they
    /// failed, barriers or not, when the limit was at or below the threshold). Collections
    /// turned off leave the limit as it is.
    #[test]
    fn a_consistency_limit_brings_collections_forward_to_half_of_it() {
        let c =
            Config { consistency_limit: Some(16 << 20), gc_threshold: Some(32 << 20), ..Config::default() };
        assert!(c.validate().is_ok());
        let limit = c.consistency_limit_bytes(4);
        assert_eq!((limit, c.collection_threshold(limit)), (16 << 20, 8 << 20));
        let roomy = Config { consistency_limit: Some(1 << 30), ..c.clone() };
        assert_eq!(roomy.collection_threshold(roomy.consistency_limit_bytes(4)), 32 << 20);
        let never = Config { gc_threshold: Some(u64::MAX), consistency_limit: Some(0), ..c };
        assert_eq!(never.collection_threshold(never.consistency_limit_bytes(4)), u64::MAX / 2);
    }

    /// The default threshold follows the heap as it is at startup, however the configuration was
    /// built: a configuration built in code for a 64 MiB heap kept 32 MiB (the environment's
    /// was capped at a quarter of the heap), and a heap shrunk to fit `vm.max_map_count` kept
    /// the quarter of the size asked for.
    #[test]
    fn the_default_collection_threshold_is_a_quarter_of_a_small_heap() {
        let small = Config { heap_size: 64 << 20, ..Config::default() };
        assert_eq!(small.gc_threshold_bytes(), 16 << 20);
        assert_eq!(Config::default().gc_threshold_bytes(), DEFAULT_GC_THRESHOLD);
        let set = Config { gc_threshold: Some(48 << 20), ..small.clone() };
        assert_eq!(set.gc_threshold_bytes(), 48 << 20, "a threshold set is kept");
        let var = |k: &str| (k == "TMK_HEAP_SIZE").then(|| std::ffi::OsString::from("64MiB"));
        let (from_env, _) = Config::from_vars_and_args(var, Vec::new()).unwrap();
        assert_eq!(from_env.gc_threshold_bytes(), small.gc_threshold_bytes());
        // A launcher passes no threshold it was not given: its nodes reckon it from the size.
        assert!(small.to_vars().contains(&("TMK_GC_THRESHOLD", None)));
    }

    #[test]
    fn diff_reserve_defaults_to_the_collection_threshold() {
        let mut c = Config { gc_threshold: Some(8 << 20), ..Config::default() };
        assert_eq!(c.diff_reserve_bytes(), (8 << 20) + crate::mem::chunk::CHUNK as u64);
        c.diff_reserve = Some(0);
        assert_eq!(c.diff_reserve_bytes(), 0, "0 turns it off");
        // A threshold of "never" does not wrap around to a reserve of almost nothing.
        let never = Config { gc_threshold: Some(u64::MAX), ..Config::default() };
        assert_eq!(never.diff_reserve_bytes(), u64::MAX);
    }

    #[test]
    fn fault_modes_parse() {
        assert_eq!("uffd".parse::<FaultsMode>(), Ok(FaultsMode::Uffd));
        assert_eq!(" MPROTECT".parse::<FaultsMode>(), Ok(FaultsMode::Mprotect));
        assert_eq!("auto".parse::<FaultsMode>(), Ok(FaultsMode::Auto));
        assert!("segv".parse::<FaultsMode>().is_err());
        assert_eq!(Config::default().faults, FaultsMode::Auto);
    }

    #[test]
    fn flags_are_consumed_and_the_rest_is_left() {
        let args = ["-n", "4", "--size", "100", "--root=127.0.0.1:9", "x"].map(String::from).to_vec();
        let (c, rest) = Config::from_env_and_args(args).unwrap();
        assert_eq!(c.nprocs, 4);
        assert_eq!(c.root, Some("127.0.0.1:9".parse().unwrap()));
        assert_eq!(rest, ["--size", "100", "x"]);
        let e = Config::from_env_and_args(vec!["-n".into(), "zero".into()]).unwrap_err();
        assert_eq!(e.to_string(), "bad value \"zero\" for -n: invalid digit found in string");
        for spelled in [&["-n=3"][..], &["-n3"], &["--nprocs=3"], &["--nprocs", "3"]] {
            let (c, rest) =
                Config::from_env_and_args(spelled.iter().map(|s| s.to_string()).collect()).unwrap();
            assert_eq!((c.nprocs, rest.len()), (3, 0), "{spelled:?}");
        }
        // After `--`, nothing is the runtime's.
        let args = ["-n", "2", "--", "-n", "1024", "--root", "x"].map(String::from).to_vec();
        let (c, rest) = Config::from_env_and_args(args).unwrap();
        assert_eq!(c.nprocs, 2);
        assert_eq!(rest, ["--", "-n", "1024", "--root", "x"]);
        // `-name` is no node count.
        let (c, rest) = Config::from_env_and_args(vec!["-name".into()]).unwrap();
        assert_eq!((c.nprocs, rest), (1, vec!["-name".to_string()]));
    }

    /// A node a launcher spawned takes its rank, node count and node 0's address from the
    /// launcher's variables, not from the launcher's flags it was given too: a `--root` naming
    /// port 0 had the nodes call on port 0 until the meeting timed out.
    #[test]
    fn a_spawned_node_takes_the_launchers_variables_over_its_flags() {
        let parent = nix::unistd::getppid().as_raw().to_string();
        let vars = |spawned: bool| {
            let parent = parent.clone();
            move |k: &str| {
                let v = match k {
                    "TMK_RANK" => "2",
                    "TMK_NPROCS" => "4",
                    "TMK_ROOT" => "10.0.0.5:4100",
                    "TMK_LAUNCHER_PID" if spawned => &parent,
                    _ => return None,
                };
                Some(std::ffi::OsString::from(v))
            }
        };
        let args = || ["-n", "4", "--root", "10.0.0.5:0", "--size", "9"].map(String::from).to_vec();
        let (c, rest) = Config::from_vars_and_args(vars(true), args()).unwrap();
        assert_eq!(
            (c.nprocs, c.role, c.root),
            (4, Role::Member { rank: 2 }, Some("10.0.0.5:4100".parse().unwrap()))
        );
        assert_eq!(rest, ["--size", "9"]);
        // Started by hand with both, a node's flags win.
        let (c, _) = Config::from_vars_and_args(vars(false), args()).unwrap();
        assert_eq!(c.root, Some("10.0.0.5:0".parse().unwrap()));
        // A launcher told only its parent's pid (a rank set empty is no rank): its flags win.
        let launcher = |k: &str| match k {
            "TMK_LAUNCHER_PID" => Some(std::ffi::OsString::from("1234")),
            "TMK_RANK" => Some(std::ffi::OsString::new()),
            _ => None,
        };
        let (c, _) = Config::from_vars_and_args(launcher, args()).unwrap();
        assert_eq!((c.nprocs, c.role, c.root), (4, Role::Launcher, Some("10.0.0.5:0".parse().unwrap())));
        // A program a spawned node starts inherits its variables, but the launcher is not its
        // parent: it is no node of that job, and its flags win.
        let not_parent = (nix::unistd::getppid().as_raw() + 1).to_string();
        let inherited = |k: &str| match k {
            "TMK_LAUNCHER_PID" => Some(std::ffi::OsString::from(&not_parent)),
            k => vars(true)(k),
        };
        let (c, _) = Config::from_vars_and_args(inherited, args()).unwrap();
        assert_eq!(c.root, Some("10.0.0.5:0".parse().unwrap()));
    }

    /// Flags win over variables, and a variable a flag overrides is not read: a bad one was
    /// refused (`TMK_NPROCS=four prog -n 2`), and a stale host name looked up (a name server
    /// that does not answer stalled the start).
    #[test]
    fn a_variable_a_flag_overrides_is_not_read() {
        let stale = |k: &str| match k {
            "TMK_NPROCS" => Some(std::ffi::OsString::from("four")),
            "TMK_RANK" => Some(std::ffi::OsString::from("-1")),
            "TMK_ROOT" => Some(std::ffi::OsString::from("no-such-host.invalid:7000")),
            _ => None,
        };
        let args = ["-n", "2", "--rank", "1", "--root", "127.0.0.1:9"].map(String::from).to_vec();
        let (c, _) = Config::from_vars_and_args(stale, args).unwrap();
        assert_eq!(
            (c.nprocs, c.role, c.root),
            (2, Role::Member { rank: 1 }, Some("127.0.0.1:9".parse().unwrap()))
        );
        let e = Config::from_vars_and_args(stale, vec!["--rank".into(), "1".into()]).unwrap_err();
        assert!(e.to_string().contains("TMK_NPROCS"), "without a flag the variable is read: {e}");
    }

    /// What a launcher passes its nodes reads back as its own settings, every one of them, the
    /// unset ones unset (a launcher started with an explicit configuration ran its nodes on their
    /// environment's, and met them with a fingerprint mismatch or settings of their own).
    #[test]
    fn the_settings_a_launcher_passes_read_back_as_its_own() {
        let changed = Config {
            heap_size: 96 << 20,
            heap_base: 0x5123_4000_0000,
            nlocks: 77,
            nbarriers: 9,
            gc_threshold: Some(123_456),
            push: false,
            push_skip: false,
            back_heap: false,
            malloc_reserve: 3 << 20,
            diff_reserve: Some(5 << 20),
            twin_reserve: 7 << 20,
            lock_bundle: 3,
            stream_min_pages: 11,
            print_stats: true,
            stats_json: true,
            connect_timeout: Duration::from_secs(17),
            faults: FaultsMode::Mprotect,
            service_rt: Some(false),
            service_spin: Some(Duration::from_micros(250)),
            app_spin: Duration::from_micros(7),
            consistency_limit: Some(1 << 30),
            ..Config::default()
        };
        let with_stats = |print_stats, stats_json| Config { print_stats, stats_json, ..Config::default() };
        for c in [Config::default(), changed, with_stats(true, false), with_stats(false, false)] {
            let vars = c.to_vars();
            // Whatever the environment held is replaced or removed.
            let var = |k: &str| match vars.iter().find(|(name, _)| *name == k) {
                Some((_, v)) => v.clone().map(std::ffi::OsString::from),
                None => Some(std::ffi::OsString::from("0")).filter(|_| k == "TMK_PIN"),
            };
            let (back, rest) = Config::from_vars_and_args(var, Vec::new()).unwrap();
            assert!(rest.is_empty());
            let mut want = c.clone();
            (want.pin, want.fit_heap) = (Some(false), false);
            assert_eq!(format!("{back:?}"), format!("{want:?}"));
        }
        // Every setting is passed on but the node's place in the job, which the launcher sets.
        let passed: Vec<&str> = Config::default().to_vars().iter().map(|(k, _)| *k).collect();
        for name in SETTINGS.iter().filter(|n| !["TMK_NPROCS", "TMK_RANK", "TMK_ROOT", "TMK_PIN"].contains(n))
        {
            assert!(passed.contains(name), "{name} is not passed to spawned nodes");
        }
    }

    /// Nodes that disagree on the page size must not meet: a page index would name other bytes
    /// on each, and a diff cut on 4 KiB pages would pass the bounds of a 16 KiB one.
    #[test]
    fn the_fingerprint_holds_the_page_size_and_the_shared_settings() {
        let fp = Config { nprocs: 3, nlocks: 5, ..Config::default() }.fingerprint();
        let page = format!(" page={} ", crate::mem::system_page_size());
        assert!(fp.contains(&page) && fp.contains("nprocs=3 ") && fp.contains(" locks=5 "), "{fp}");
    }

    /// A setting whose value is not UTF-8 is refused by name, not taken for unset.
    #[test]
    fn a_setting_that_is_not_utf8_is_refused() {
        use std::os::unix::ffi::OsStringExt;
        let var = |k: &str| (k == "TMK_HEAP_SIZE").then(|| std::ffi::OsString::from_vec(vec![b'1', 0xff]));
        let e = Config::from_vars_and_args(var, Vec::new()).unwrap_err().to_string();
        assert!(e.contains("TMK_HEAP_SIZE") && e.contains("not UTF-8"), "{e}");
    }

    #[test]
    fn sizes_that_would_not_fit_in_memory_are_refused_by_name() {
        for (field, name) in [
            ("heap", "TMK_HEAP_SIZE"),
            ("locks", "TMK_LOCKS"),
            ("malloc", "TMK_MALLOC_RESERVE"),
            ("timeout", "TMK_CONNECT_TIMEOUT"),
            ("bundle", "TMK_LOCK_BUNDLE"),
        ] {
            let mut c = Config::default();
            match field {
                "heap" => c.heap_size = 4096 << 30,
                "locks" => c.nlocks = 4_000_000_000,
                "malloc" => c.malloc_reserve = 100 << 30,
                "bundle" => c.lock_bundle = u32::MAX as usize,
                _ => c.connect_timeout = Duration::from_secs(u64::MAX),
            }
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(name) && e.contains("at most"), "{e}");
        }
        assert!(Config::default().validate().is_ok());
    }

    #[test]
    fn switches_take_the_usual_words_and_refuse_the_rest() {
        for (v, on) in
            [("1", true), ("ON", true), ("true", true), ("0", false), ("off", false), ("No", false)]
        {
            assert_eq!(switch("TMK_PUSH", v).unwrap(), on, "{v}");
        }
        let e = switch("TMK_PUSH", "maybe").unwrap_err();
        assert!(e.to_string().contains("\"maybe\" for TMK_PUSH"), "{e}");
    }

    #[test]
    fn the_root_may_be_named_by_host() {
        let (c, _) = Config::from_env_and_args(vec!["--root".into(), "localhost:9".into()]).unwrap();
        let root = c.root.unwrap();
        assert!(root.ip().is_loopback() && root.port() == 9, "{root}");
        let e = Config::from_env_and_args(vec!["--root".into(), "localhost".into()]).unwrap_err();
        assert!(e.to_string().contains("\"localhost\" for --root"), "{e}");
        // Node 0 listens where `localhost` names, but on every interface where the host's own
        // name resolves to a loopback address (Debian's 127.0.1.1), which other hosts, resolving
        // it to its network address, cannot reach.
        assert_eq!((c.root_name.as_deref(), c.root_listen_addr()), (Some("localhost"), Some(root)));
        let own = |ip: &str| Config {
            root: Some(SocketAddr::new(ip.parse().unwrap(), 7000)),
            root_name: Some("host-a".into()),
            ..Config::default()
        };
        assert_eq!(own("127.0.1.1").root_listen_addr(), Some("[::]:7000".parse().unwrap()));
        assert_eq!(own("::1").root_listen_addr(), Some("[::]:7000".parse().unwrap()));
        assert_eq!(own("10.0.0.1").root_listen_addr(), Some("10.0.0.1:7000".parse().unwrap()));
        for local in ["localhost.", "LOCALHOST", "localhost4", "ip6-localhost", "localhost.localdomain"] {
            let c = Config { root_name: Some(local.into()), ..own("127.0.0.1") };
            assert_eq!(c.root_listen_addr(), c.root, "{local}");
        }
        // An address given is where node 0 listens, loopback or not.
        let (c, _) = Config::from_env_and_args(vec!["--root".into(), "127.0.1.1:7000".into()]).unwrap();
        assert_eq!((c.root_name.as_deref(), c.root_listen_addr()), (None, c.root));
    }
}
