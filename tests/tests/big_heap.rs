//! A 2 GiB heap with a checkerboard of page states over more than 300,000 pages, on real
//! processes: it works on the userfaultfd backend, and the mprotect backend refuses it at startup
//! (it could need more kernel mappings than `vm.max_map_count` allows) with a clear error, never a
//! crash or a hang.
//!
//! The test re-runs its own binary as node 0 of a 2-node job (`--exact <this test>` with
//! `TMK_BIG_HEAP_CHILD=1`); node 0 spawns node 1 the same way, so both nodes run
//! [`checkerboard`].

mod support;

use std::process::Command;
use std::time::{Duration, Instant};
use support::{Job, heap_base};
use treadmarks::{Error, Shared, Tmk};

const CHILD: &str = "TMK_BIG_HEAP_CHILD";
const TEST: &str = "a_2_gib_heap_with_a_checkerboard_of_page_states";
/// Pages of the checkerboard: more than 300,000.
const PAGES: usize = 330_000;
const PAGE: usize = 4096;

fn value(p: usize, round: usize) -> u8 {
    ((p * 7 + round) % 251) as u8 + 1
}

fn check(ok: bool, what: impl FnOnce() -> String) -> treadmarks::Result<()> {
    if ok { Ok(()) } else { Err(Error::Failed(what())) }
}

/// Node 1 writes pages 0 mod 3; after a barrier node 0 holds them invalid, writes pages 2 mod 3
/// (read-write) and leaves pages 1 mod 3 read-only: invalid / read-only / read-write alternate
/// over `PAGES` pages. Node 0 then reads a sample of the invalid pages (fetching node 1's diffs
/// while its other pages keep every state), and after a barrier node 1 checks node 0's writes.
fn checkerboard(tmk: &mut Tmk) -> treadmarks::Result<String> {
    let me = tmk.proc_id();
    let mut a = Shared::from_raw_parts(0, 0);
    if me == 0 {
        a = tmk.alloc_pages::<u8>(PAGES * PAGE)?;
    }
    tmk.distribute(&mut a)?;
    let start = Instant::now();
    if me == 1 {
        let mut v = tmk.view_mut(&a)?;
        for p in (0..PAGES).step_by(3) {
            v[p * PAGE] = value(p, 1);
        }
    }
    tmk.barrier(0)?;
    let t_first = start.elapsed();
    if me == 0 {
        let mut v = tmk.view_mut(&a)?;
        for p in (2..PAGES).step_by(3) {
            v[p * PAGE + 1] = value(p, 2);
        }
        drop(v);
        // The checkerboard is in place on this node; read a sample of the invalid pages.
        let v = tmk.view(&a)?;
        for p in (0..PAGES).step_by(3 * 97) {
            let got = v[p * PAGE];
            check(got == value(p, 1), || format!("page {p}: read {got}, want {}", value(p, 1)))?;
        }
        for p in (1..PAGES).step_by(3 * 101) {
            check(v[p * PAGE] == 0, || format!("read-only page {p} is not zero"))?;
        }
    }
    let t_checker = start.elapsed();
    tmk.barrier(1)?;
    if me == 1 {
        let v = tmk.view(&a)?;
        for p in (2..PAGES).step_by(3 * 89) {
            let got = v[p * PAGE + 1];
            check(got == value(p, 2), || format!("page {p}: read {got}, want {}", value(p, 2)))?;
        }
    }
    tmk.barrier(2)?;
    Ok(format!(
        "node {me}: first writes + barrier {t_first:?}, checkerboard + sample reads {t_checker:?}, total {:?}",
        start.elapsed()
    ))
}

/// The body of a node process.
fn node_main() -> ! {
    let result = Tmk::startup().and_then(|mut tmk| {
        let line = checkerboard(&mut tmk)?;
        let me = tmk.proc_id();
        tmk.exit()?;
        Ok((me, line))
    });
    match result {
        Ok((me, line)) => {
            println!("{line}");
            if me == 0 {
                println!("PASS checkerboard");
            }
            std::process::exit(0)
        }
        Err(e) => {
            treadmarks::report(&format!("big-heap node: {e}"));
            std::process::exit(1)
        }
    }
}

fn job(backend: &str, slot: u64) -> support::Outcome {
    let mut cmd = Command::new(std::env::current_exe().expect("path of the test binary"));
    cmd.args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env_remove("TMK_RANK")
        .env_remove("TMK_ROOT")
        .env("TMK_NPROCS", "2")
        .env("TMK_FAULTS", backend)
        .env("TMK_HEAP_SIZE", "2GiB")
        .env("TMK_HEAP_BASE", heap_base(slot))
        .env("TMK_CONNECT_TIMEOUT", "20");
    Job::spawn(cmd).wait(Duration::from_secs(120))
}

#[test]
fn a_2_gib_heap_with_a_checkerboard_of_page_states() {
    if std::env::var(CHILD).is_ok() {
        node_main();
    }
    let backends = support::backends();
    if backends.contains(&"mprotect") {
        let out = job("mprotect", 40);
        assert_ne!(out.code, Some(0), "mprotect must refuse a 2 GiB heap: {out:#?}");
        assert!(out.code.is_some(), "refused with an error, not a crash: {out:#?}");
        for want in ["vm.max_map_count", "TMK_FAULTS=uffd", "524288 pages"] {
            assert!(out.stderr.contains(want), "the error must name {want:?}: {out:#?}");
        }
        assert!(out.elapsed < Duration::from_secs(20), "refused at startup, took {:?}", out.elapsed);
    }
    if backends.contains(&"uffd") {
        let out = job("uffd", 41);
        assert!(out.code == Some(0) && out.stdout.contains("PASS checkerboard"), "uffd: {out:#?}");
        for line in out.stdout.lines().filter(|l| l.starts_with("node ")) {
            println!("{line}");
        }
        println!("uffd 2 GiB checkerboard job took {:?}", out.elapsed);
    }
}
