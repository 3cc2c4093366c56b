//! Tests of the memory layer on real mappings and real faults.
//!
//! The fault handler is process-global, so every test that installs it (or crashes) runs in a
//! child process: the parent test re-runs this test binary with `--exact <its own name>` and an
//! environment variable naming the child role; the child does the work and exits; the parent
//! checks the exit status and output (pattern of wasmtime's `tests/host_segfault.rs`). Children
//! are waited for with a deadline and killed if they hang.
//!
//! Tests that stay in the test process use heap bases of their own so they can run in parallel
//! ([`layout`] refuses a slot that another test of the process took).

mod faults;
mod heap;
mod malloc;

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use std::sync::Arc;

use super::{FaultBackend, Heap, HeapLayout, MemError};

/// Environment variable that selects the child role (the full test name).
const CHILD_VAR: &str = "TMK_MEM_TEST_CHILD";
/// What a child prints once the test's body returned.
const CHILD_DONE: &str = "treadmarks mem test child: body done";
/// How long a child may run before it is killed and the test fails.
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

/// A distinct, page-aligned base per test (`slot` < 256), far from the usual mmap and brk areas.
pub(super) fn test_base(slot: usize) -> usize {
    0x6100_0000_0000 + slot * 0x1_0000_0000
}

/// A protected heap layout of `npages` pages at `test_base(slot)`.
///
/// Panics if another test of this process took `slot` (tests run on threads named after them):
/// two tests mapping one base in one process fail whenever they happen to run at once.
pub(super) fn layout(slot: usize, npages: usize) -> HeapLayout {
    static TAKEN: std::sync::Mutex<Vec<(usize, String)>> = std::sync::Mutex::new(Vec::new());
    let me = std::thread::current().name().unwrap_or("an unnamed thread").to_owned();
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
    match taken.iter().find(|(s, _)| *s == slot) {
        Some((_, owner)) => assert_eq!(owner, &me, "heap slot {slot} is taken by another test"),
        None => taken.push((slot, me)),
    }
    drop(taken);
    HeapLayout { base: test_base(slot), size: npages * super::heap::system_page_size(), protect: true }
}

/// Maps `layout` on `backend`.
pub(super) fn map(layout: HeapLayout, backend: FaultBackend) -> Result<Arc<Heap>, MemError> {
    Heap::map_with(layout, backend)
}

/// Whether the userfaultfd backend can run here; if not, prints why (the uffd variant of a test
/// is then skipped, not failed; with `TMK_REQUIRE_UFFD=1`, it fails).
pub(super) fn uffd_or_skip() -> bool {
    match super::uffd_support() {
        Ok(()) => true,
        Err(u) if std::env::var("TMK_REQUIRE_UFFD").is_ok_and(|v| v == "1") => {
            panic!("TMK_REQUIRE_UFFD=1, and this kernel does not offer userfaultfd: {} ({})", u.why, u.fix)
        }
        Err(u) => {
            println!("skipping the userfaultfd variant: {} ({})", u.why, u.fix);
            false
        }
    }
}

/// What a child did.
pub(super) struct ChildOutput {
    pub(super) status: ExitStatus,
    pub(super) stdout: String,
    pub(super) stderr: String,
}

impl ChildOutput {
    /// The child ended well, and ran the test's body (a child whose `--exact` name matched no
    /// test would exit 0 too).
    pub(super) fn assert_success(&self) {
        assert!(
            self.status.success() && self.stdout.contains(CHILD_DONE),
            "child failed with {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
    }

    pub(super) fn assert_killed_by(&self, signal: libc::c_int) {
        assert_eq!(
            self.status.signal(),
            Some(signal),
            "child should die by signal {signal}, got {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.status,
            self.stdout,
            self.stderr
        );
    }
}

/// If this process is the child for `test` (a `module_path!()`-based name), runs `body` and exits
/// 0; a panic in `body` fails the child. Otherwise spawns that child and returns its output.
pub(super) fn run_in_child(test: &str, body: impl FnOnce()) -> ChildOutput {
    let test = test.strip_prefix("treadmarks::").unwrap_or(test);
    if std::env::var(CHILD_VAR).as_deref() == Ok(test) {
        body();
        println!("{CHILD_DONE}");
        std::process::exit(0);
    }
    let exe = std::env::current_exe().expect("path of the test binary");
    let mut cmd = Command::new(exe);
    // The child dies (SIGKILL) with this test's thread, which waits for it: a child hung in a
    // fault does not outlive a test process killed from outside.
    super::orphan::die_with_this_thread(&mut cmd);
    let mut child = cmd
        // An ignored test's children are ignored tests too (`fault_backend_costs`).
        .args(["--exact", test, "--include-ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, test)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the child test process");
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + CHILD_DEADLINE;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the child") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let status = child.wait().expect("reap the killed child");
            let stderr = err_reader.join().unwrap_or_default();
            panic!(
                "child {test} hung for {CHILD_DEADLINE:?} and was killed ({status:?})\n--- stderr\n{stderr}"
            );
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    ChildOutput {
        status,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    }
}

/// Name of a test function in the calling module, as libtest spells it.
macro_rules! test_name {
    ($f:ident) => {
        concat!(module_path!(), "::", stringify!($f))
    };
}
pub(super) use test_name;

/// Disables core dumps in a child that is about to crash on purpose.
pub(super) fn no_core_dumps() {
    let zero = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: passes a valid, live rlimit struct.
    unsafe { libc::setrlimit(libc::RLIMIT_CORE, &zero) };
}

/// This process's page-table entry for the page at `addr`, as `/proc/self/pagemap` shows it.
fn pagemap_entry(addr: usize) -> u64 {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
    f.seek(SeekFrom::Start((addr / 4096 * 8) as u64)).unwrap();
    let mut entry = [0u8; 8];
    f.read_exact(&mut entry).unwrap();
    u64::from_le_bytes(entry)
}

/// Whether this process's page table maps the page at `addr` (pagemap bit 63).
pub(crate) fn present(addr: usize) -> bool {
    pagemap_entry(addr) >> 63 == 1
}

/// Whether the entry of the page at `addr` is write-protected by userfaultfd (pagemap bit 57).
pub(crate) fn uffd_write_protected(addr: usize) -> bool {
    pagemap_entry(addr) >> 57 & 1 == 1
}
