//! One node of a test job: `tmk-testnode <scenario> -n N`. Each scenario checks its own results
//! on every node and exits non-zero on a mismatch; node 0 prints `PASS <scenario>` at the end.

use std::process::ExitCode;
use treadmarks::{Error, Shared, Tmk};

type R = treadmarks::Result<()>;

fn check(ok: bool, what: impl FnOnce() -> String) -> R {
    if ok { Ok(()) } else { Err(Error::Failed(what())) }
}

/// Node 0 allocates, everybody gets the handle.
fn shared<T: bytemuck::Pod>(tmk: &mut Tmk, len: usize) -> treadmarks::Result<Shared<[T]>> {
    let mut h = Shared::from_raw_parts(0, 0);
    if tmk.proc_id() == 0 {
        h = tmk.alloc_pages::<T>(len)?;
    }
    tmk.distribute(&mut h)?;
    Ok(h)
}

/// N nodes x 1000 lock-protected increments of one counter.
fn counter(tmk: &mut Tmk) -> R {
    counter_under(tmk, 0)
}

/// N nodes x 1000 increments of one counter under lock `lock`.
fn counter_under(tmk: &mut Tmk, lock: u32) -> R {
    let iters = 1000;
    let c = shared::<u64>(tmk, 1)?;
    for _ in 0..iters {
        let g = tmk.lock(lock)?;
        g.view_mut(&c)?[0] += 1;
    }
    tmk.barrier(0)?;
    let got = tmk.view(&c)?[0];
    check(got == (iters * tmk.nprocs()) as u64, || format!("counter is {got}, want {}", iters * tmk.nprocs()))
}

/// Nodes write interleaved words of one page between barriers; all see every value after.
fn interleaved(tmk: &mut Tmk) -> R {
    let words = 1024; // exactly one page of u32
    let a = shared::<u32>(tmk, words)?;
    let (me, n) = (tmk.proc_id(), tmk.nprocs());
    for round in 1..=20u32 {
        {
            let mut v = tmk.view_mut(&a)?;
            for w in (me..words).step_by(n) {
                v[w] = round * 10_000 + w as u32;
            }
        }
        tmk.barrier(1)?;
        let v = tmk.view(&a)?;
        if let Some(w) = (0..words).find(|&w| v[w] != round * 10_000 + w as u32) {
            return Err(Error::Failed(format!("round {round}: word {w} is {}", v[w])));
        }
        drop(v);
        tmk.barrier(2)?;
    }
    Ok(())
}

/// Every node but the last writes its own pages; the last, which never touched them, reads all.
fn never_held(tmk: &mut Tmk) -> R {
    let per = 3 * 512; // three pages of u64 per writer
    let (me, n) = (tmk.proc_id(), tmk.nprocs());
    let a = shared::<u64>(tmk, per * n)?;
    if me + 1 < n {
        let mut v = tmk.view_mut(&a.slice(me * per, (me + 1) * per))?;
        for (i, x) in v.iter_mut().enumerate() {
            *x = (me * per + i) as u64 * 7 + 1;
        }
    }
    tmk.barrier(0)?;
    if me + 1 == n {
        let v = tmk.view(&a.slice(0, (n - 1) * per))?;
        if let Some(i) = (0..v.len()).find(|&i| v[i] != i as u64 * 7 + 1) {
            return Err(Error::Failed(format!("element {i} is {}", v[i])));
        }
    }
    Ok(())
}

/// A token passes through the nodes in turn under one lock; each turn leaves a trail entry.
fn lock_chain(tmk: &mut Tmk) -> R {
    let rounds = 8;
    let (me, n) = (tmk.proc_id(), tmk.nprocs());
    let token = shared::<u64>(tmk, 1)?;
    let trail = shared::<u64>(tmk, rounds * n)?;
    let mut turns = 0;
    while turns < rounds {
        let g = tmk.lock(1)?;
        let t = g.view(&token)?[0] as usize;
        if t % n == me {
            g.view_mut(&trail)?[t] = me as u64 + 100;
            g.view_mut(&token)?[0] = t as u64 + 1;
            turns += 1;
        }
    }
    // Read the trail under the lock once the last turn is done: only locks order these writes.
    loop {
        let g = tmk.lock(1)?;
        if g.view(&token)?[0] as usize == rounds * n {
            let v = g.view(&trail)?;
            let bad = (0..rounds * n).find(|&k| v[k] != (k % n) as u64 + 100);
            return check(bad.is_none(), || format!("trail entry {bad:?} wrong: {:?}", &v[..]));
        }
    }
}

/// Water's force phase on N nodes, 64 locks, one word each (8 locks' words to a page): node `r`
/// takes all 64 once a step starting at lock `64 r / N`, adding to each lock's word. After the
/// first step the grants carry the next tokens of each walk (bundled; at more than 2 nodes only
/// those the granter or the acquirer manages, and forwards on their way to a former holder go
/// back to the manager), and every release, and every acquire whose token is here, runs on the
/// application thread.
fn lock_walk(tmk: &mut Tmk) -> R {
    let (me, n, steps, locks) = (tmk.proc_id(), tmk.nprocs(), 6, 64usize);
    let words = shared::<u64>(tmk, locks * 64)?;
    let order: Vec<usize> = (0..locks).map(|k| (k + me * locks / n) % locks).collect();
    for _ in 0..steps {
        for &l in &order {
            let g = tmk.lock(l as u32)?;
            g.view_mut(&words.slice(l * 64, l * 64 + 1))?[0] += 1;
        }
        tmk.barrier(0)?;
    }
    let want = (n * steps) as u64;
    let v = tmk.view(&words)?;
    let bad = (0..locks).find(|&l| v[l * 64] != want);
    check(bad.is_none(), || format!("lock {bad:?}'s word is {:?}, want {want}", bad.map(|l| v[l * 64])))?;
    drop(v);
    let s = tmk.stats()?;
    let p = &s.protocol;
    let acquires = p.lock_acquires_local + p.lock_acquires_remote;
    check(acquires == (steps * locks) as u64, || format!("{acquires} acquires"))?;
    check(p.lock_tokens_received > 0, || "no token came bundled".to_string())?;
    if n == 2 {
        // At 2 nodes every token can travel: at most half the acquires of the job remote (about
        // one in nine, unless timing keeps some tokens busy at the granter).
        let bound = (steps * locks / 2) as u64;
        check(p.lock_acquires_remote <= bound, || {
            format!(
                "{} remote acquires (bound {bound}), {} tokens received",
                p.lock_acquires_remote, p.lock_tokens_received
            )
        })?;
    }
    check(s.lock_ops_here == p.lock_acquires_local + acquires, || {
        format!(
            "{} lock operations on the application thread, want {} local acquires + {acquires} releases",
            s.lock_ops_here, p.lock_acquires_local
        )
    })
}

/// Pages written but never asked for produce no diff; one read produces exactly one.
fn lazy(tmk: &mut Tmk) -> R {
    let me = tmk.proc_id();
    let a = shared::<u64>(tmk, 10 * 512)?;
    if me == 0 {
        tmk.view_mut(&a)?.iter_mut().enumerate().for_each(|(i, x)| *x = i as u64);
    }
    tmk.barrier(0)?;
    tmk.barrier(0)?;
    if me == 0 {
        let d = tmk.stats()?.protocol.diffs_created;
        check(d == 0, || format!("{d} diffs made for pages nobody asked for"))?;
    }
    tmk.barrier(0)?;
    if me == 1 {
        // A view declares what is touched: view just the one element, not all ten pages.
        let x = tmk.view(&a.slice(3 * 512 + 5, 3 * 512 + 6))?[0];
        check(x == 3 * 512 + 5, || format!("read {x}"))?;
    }
    tmk.barrier(0)?;
    if me == 0 {
        let d = tmk.stats()?.protocol.diffs_created;
        check(d == 1, || format!("{d} diffs made for one page read once"))?;
    }
    Ok(())
}

/// Views that declare parts of an array fetch the pages of those parts at once and leave the
/// other pages to their faults: node 0 writes 40 pages; node 1 reads parts of pages 5 and 7
/// (and touches page 9 undeclared), then writes parts of ten pages 20..30 (twinned ahead) and
/// touches page 35 undeclared. Node 0 sees the writes, and made diffs only for the pages node 1
/// declared or touched.
fn parts(tmk: &mut Tmk) -> R {
    const W: usize = 512; // u64 words per page
    let me = tmk.proc_id();
    let a = shared::<u64>(tmk, 40 * W)?;
    if me == 0 {
        tmk.view_mut(&a)?.iter_mut().enumerate().for_each(|(i, x)| *x = i as u64);
    }
    tmk.barrier(0)?;
    if me == 1 {
        let v = tmk.view_parts(&a, [7 * W..8 * W, 5 * W + 1..5 * W + 2])?;
        let got = [v[5 * W + 1], v[7 * W + 3], v[9 * W + 4]];
        let want = [5 * W + 1, 7 * W + 3, 9 * W + 4].map(|i| i as u64);
        check(got == want, || format!("read {got:?}, want {want:?}"))?;
        let e = tmk.view_parts(&a, std::iter::once(0..40 * W + 1)).unwrap_err().to_string();
        check(e.contains("part 0..20481") && e.contains("20480-element"), || e.clone())?;
        drop(v);
        let mut v = tmk.view_mut_parts(&a, (20..30).map(|p| p * W + 100..p * W + 200))?;
        for p in (20..30).chain([35]) {
            v[p * W + 150] += 1_000_000;
        }
        drop(v);
        let e = tmk
            .view_mut_parts(&a, std::iter::once(std::ops::Range { start: 5, end: 4 }))
            .unwrap_err()
            .to_string();
        check(e.contains("part 5..4"), || e.clone())?;
    }
    tmk.barrier(0)?;
    if me == 0 {
        let d = tmk.stats()?.protocol.diffs_created;
        check(d == 14, || format!("{d} diffs made for 3 pages read and 11 written"))?;
        let v = tmk.view(&a)?;
        let bad = (0..40 * W).find(|&i| {
            let bumped = (i % W == 150 && (20..30).contains(&(i / W))) || i == 35 * W + 150;
            v[i] != i as u64 + if bumped { 1_000_000 } else { 0 }
        });
        check(bad.is_none(), || format!("word {bad:?} does not hold node 1's write"))?;
    }
    Ok(())
}

/// Streaming views (`TMK_STREAM_MIN_PAGES=16` in the test): node 0 fills three arrays of 300
/// pages; node 1, holding its notices, takes a view of the first and reads it from its last page
/// down (the first read faults on a page still on its way and waits for it), a mutable view of
/// the second and adds 1 to every word as the pages arrive, and a view of the third of which it
/// reads one word, then acquires a lock node 0 holds: the acquire first waits for the rest of
/// the third array, which must then be there. Node 0 checks the second array's new values.
fn stream(tmk: &mut Tmk) -> R {
    const W: usize = 512; // u64 words per page
    const N: usize = 300 * W;
    let me = tmk.proc_id();
    let arrays = [shared::<u64>(tmk, N)?, shared::<u64>(tmk, N)?, shared::<u64>(tmk, N)?];
    let value = |k: usize, i: usize| (k * N + i) as u64;
    if me == 0 {
        for (k, a) in arrays.iter().enumerate() {
            tmk.view_mut(a)?.iter_mut().enumerate().for_each(|(i, x)| *x = value(k, i));
        }
        let g = tmk.lock(0)?;
        g.unlock()?;
    }
    tmk.barrier(0)?;
    if me == 1 {
        let v = tmk.view(&arrays[0])?;
        let bad = (0..N).rev().find(|&i| v[i] != value(0, i));
        check(bad.is_none(), || format!("array 0, word {bad:?}: not node 0's value"))?;
        drop(v);
        let mut v = tmk.view_mut(&arrays[1])?;
        for (i, x) in v.iter_mut().enumerate() {
            check(*x == value(1, i), || format!("array 1, word {i} is {x}, want {}", value(1, i)))?;
            *x += 1;
        }
        drop(v);
        let first = tmk.view(&arrays[2])?[0];
        check(first == value(2, 0), || format!("array 2, word 0 is {first}"))?;
        let g = tmk.lock(0)?;
        let v = g.view(&arrays[2])?;
        let bad = (0..N).find(|&i| v[i] != value(2, i));
        check(bad.is_none(), || format!("array 2, word {bad:?}: not node 0's value"))?;
        drop(v);
        g.unlock()?;
        let s = tmk.stats()?.protocol;
        check(s.streams == 3 && s.streamed_pages == 900, || {
            format!("{} views streamed {} pages", s.streams, s.streamed_pages)
        })?;
    }
    tmk.barrier(0)?;
    if me == 0 {
        let v = tmk.view(&arrays[1])?;
        let bad = (0..N).find(|&i| v[i] != value(1, i) + 1);
        check(bad.is_none(), || format!("array 1, word {bad:?} lacks node 1's increment"))?;
    }
    Ok(())
}

/// Node 1 fills 40 pages; node 0, holding its notices, declares it overwrites a range covering
/// pages 3..=29 wholly and 2 and 30 in part, and writes it (a third of the words with 0, what its
/// own stale copy holds): only the two partial pages are fetched, and every other node reads
/// node 0's values, zeros included. Node 1 then writes one overwritten page again, and node 0's
/// fetch of it skips node 1's superseded diff.
fn overwrite(tmk: &mut Tmk) -> R {
    const W: usize = 512; // u64 words per page
    let me = tmk.proc_id();
    let a = shared::<u64>(tmk, 40 * W)?;
    if me == 1 {
        tmk.view_mut(&a)?.iter_mut().enumerate().for_each(|(i, x)| *x = i as u64);
    }
    tmk.barrier(0)?;
    let part = 2 * W + 100..30 * W + 7;
    let mine = |i: usize| if i.is_multiple_of(3) { 0 } else { 7_000_000 + i as u64 };
    if me == 0 {
        let before = tmk.stats()?.protocol;
        let mut v = tmk.view_overwrite_parts(&a, [part.clone()])?;
        part.clone().for_each(|i| v[i] = mine(i));
        drop(v);
        let after = tmk.stats()?.protocol;
        let (skipped, fetched) =
            (after.pages_overwritten - before.pages_overwritten, after.diffs_applied - before.diffs_applied);
        check((skipped, fetched) == (27, 2), || {
            format!("{skipped} pages overwritten unfetched and {fetched} diffs applied, want 27 and 2")
        })?;
        let e =
            tmk.view_overwrite_parts(&a, std::iter::once(40 * W - 1..40 * W + 1)).unwrap_err().to_string();
        check(e.contains("part 20479..20481") && e.contains("20480-element"), || e.clone())?;
    }
    tmk.barrier(0)?;
    let want = |i: usize| if part.contains(&i) { mine(i) } else { i as u64 };
    let v = tmk.view(&a)?;
    let bad = (0..40 * W).find(|&i| v[i] != want(i));
    check(bad.is_none(), || format!("word {bad:?}: {:?}, want {:?}", bad.map(|i| v[i]), bad.map(want)))?;
    drop(v);
    tmk.barrier(0)?;
    if me == 1 {
        tmk.view_mut(&a)?[10 * W + 5] = 42;
    }
    tmk.barrier(0)?;
    if me == 0 {
        let v = tmk.view(&a.slice(10 * W, 11 * W))?;
        let bad = (0..W).find(|&k| v[k] != if k == 5 { 42 } else { want(10 * W + k) });
        check(bad.is_none(), || format!("page 10 word {bad:?} after node 1's rewrite"))?;
        drop(v);
        let skipped = tmk.stats()?.protocol.diffs_superseded;
        check(skipped >= 1, || format!("{skipped} superseded diffs skipped"))?;
    }
    Ok(())
}

/// Each node rewrites its own page every step and reads its left neighbour's between two barriers:
/// after the first step the neighbour's diffs come pushed with the barrier, not asked for. Then
/// the nodes stop reading, and the pushes stop after going unused.
fn push(tmk: &mut Tmk) -> R {
    const STEPS: u64 = 20;
    let (me, n) = (tmk.proc_id(), tmk.nprocs());
    let a = shared::<u64>(tmk, n * 512)?;
    let left = (me + n - 1) % n;
    let read_left = |tmk: &mut Tmk, step: u64| -> R {
        let got = tmk.view(&a.slice(left * 512, left * 512 + 512))?.to_vec();
        let want = |i: usize| step * 1000 + (left * 512 + i) as u64;
        let bad = got.iter().enumerate().find(|&(i, &x)| x != want(i));
        check(bad.is_none(), || format!("step {step}: node {left}'s word {bad:?} is stale"))
    };
    for step in 1..=STEPS {
        for (i, x) in tmk.view_mut(&a.slice(me * 512, me * 512 + 512))?.iter_mut().enumerate() {
            *x = step * 1000 + (me * 512 + i) as u64;
        }
        tmk.barrier(0)?;
        read_left(tmk, step)?;
        tmk.barrier(0)?;
    }
    // Without pushes every step would ask once. A push races the barrier release only across
    // different links (writer → reader, manager → reader), so allow a few late ones.
    let p = tmk.stats()?.protocol;
    check(p.diff_requests_sent <= STEPS / 2, || {
        format!("{} diff requests in {STEPS} steps", p.diff_requests_sent)
    })?;
    check(p.pushes_used >= STEPS / 2, || format!("{} pushes used in {STEPS} steps", p.pushes_used))?;
    // A reader whose misses used its pushes has them applied in place for up to IN_PLACE_CREDITS
    // more barriers, which show no sign of reading; then the rule below.
    let credits = u64::from(treadmarks::protocol::push::IN_PLACE_CREDITS);
    let idle = 6 + credits;
    for step in STEPS + 1..=STEPS + idle {
        tmk.view_mut(&a.slice(me * 512, me * 512 + 512))?[0] = step;
        tmk.barrier(0)?;
    }
    let q = tmk.stats()?.protocol;
    let pushed = q.diffs_pushed - p.diffs_pushed;
    // The reader unsubscribes when a push finds its predecessors unused and cannot chain to
    // them, at its third push after the in-place ones at the latest (two chain). The writer may
    // push once more
    // before that arrives; after that, only node 0, the barrier manager, is sure to have it: the
    // unsubscribe travels on the same link as the reader's next arrival, which node 0 takes in
    // before the barrier completes. Another writer gets the unsubscribe on a link of its own,
    // with no order against the manager's release.
    if me == 0 {
        check(pushed <= 4 + credits, || {
            format!("{pushed} diffs pushed in {idle} steps to a node that stopped reading")
        })?;
    }
    // The page is now written at every barrier: once three epochs of that are in its history,
    // the writer skips its pushes as superseded by the next (`push.rs`, "Skipping"), so the
    // reader may never see one unused.
    check(q.pushes_wasted + q.pushes_skipped >= 1, || {
        format!("{} unused pushes counted, {} skipped", q.pushes_wasted, q.pushes_skipped)
    })?;
    // Reading again fetches as usual.
    let x = tmk.view(&a.slice(left * 512, left * 512 + 1))?[0];
    check(x == STEPS + idle, || format!("after the pushes stopped, node {left}'s first word is {x}"))
}

/// Node 2 dies after the first barrier; the others must fail fast, naming it.
fn kill(tmk: &mut Tmk) -> R {
    tmk.barrier(0)?;
    if tmk.proc_id() == 2 {
        std::process::exit(3);
    }
    for _ in 0..1000 {
        tmk.barrier(0)?;
    }
    Err(Error::Failed("the job went on without node 2".into()))
}

/// Node 1 dies after the barrier; node 0, once it knows (a call fails), computing (asleep)
/// meanwhile, prints how much CPU its service thread used in the second after it learned of the
/// death, and how many service threads it found before and after: a failed job must leave it
/// idle until the node exits, not spinning.
fn quiet_after_peer_death(tmk: &mut Tmk) -> R {
    use std::time::{Duration, Instant};
    tmk.barrier(0)?;
    if tmk.proc_id() == 1 {
        std::process::exit(3);
    }
    // Until node 1's death is seen: a failed job answers every call with its failure (node 1
    // may answer a ping or two before it is gone).
    let deadline = Instant::now() + Duration::from_secs(10);
    let died = loop {
        match tmk.ping(1) {
            Ok(_) => check(Instant::now() < deadline, || "node 1's death went unnoticed for 10 s".into())?,
            Err(e) => break e,
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // Typed, naming the dead node: a program can tell which peer it lost.
    let named = matches!(&died, Error::Job(f) if f.node() == Some(treadmarks::NodeId(1)));
    check(named, || format!("node 1's death was reported as {died:#?}"))?;
    let (threads_before, before) = service_cpu_ticks();
    std::thread::sleep(Duration::from_millis(1000));
    let (threads_after, after) = service_cpu_ticks();
    println!("SERVICE_CPU_TICKS {} THREADS {threads_before} {threads_after}", after.saturating_sub(before));
    Ok(())
}

/// How many threads of this process are service threads (named `tmk-service-<node>`), and their
/// user and system CPU ticks together (`/proc/self/task/*/stat`).
fn service_cpu_ticks() -> (usize, u64) {
    let (mut threads, mut ticks) = (0, 0);
    for task in std::fs::read_dir("/proc/self/task").into_iter().flatten().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else { continue };
        // "pid (comm) state ... utime stime ...": fields 14 and 15, counted after the comm.
        let Some((comm, rest)) = stat.split_once(") ") else { continue };
        if comm.contains("tmk-service") {
            let fields: Vec<&str> = rest.split(' ').collect();
            threads += 1;
            ticks += fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
        }
    }
    (threads, ticks)
}

/// Node 2 gives up with an error after the first barrier (its `Tmk` dropped without exiting);
/// the others must fail fast, saying so.
fn give_up(tmk: &mut Tmk) -> R {
    let a = shared::<u64>(tmk, 4)?;
    tmk.barrier(0)?;
    if tmk.proc_id() == 2 {
        // An error handled, then a call that succeeds without the service thread: the peers
        // are told of neither (the handled error used to be their reason).
        check(tmk.barrier(999).is_err(), || "barrier 999 passed".into())?;
        tmk.view(&a)?;
        return Err(Error::Failed("node 2 gives up".into()));
    }
    for _ in 0..1000 {
        tmk.barrier(0)?;
    }
    Err(Error::Failed("the job went on without node 2".into()))
}

/// Node 2 leaves on the error of a call checked on the application thread, made while it holds
/// a lock whose guard the `?` then drops (releasing it): the peers are told that call's error.
fn give_up_on_error(tmk: &mut Tmk) -> R {
    tmk.barrier(0)?;
    if tmk.proc_id() == 2 {
        let mut g = tmk.lock(3)?;
        g.lock_acquire(5000)?;
    }
    for _ in 0..1000 {
        tmk.barrier(0)?;
    }
    Err(Error::Failed("the job went on without node 2".into()))
}

/// Node 0 goes into exit at once; the others then pass lock 0, which node 0 manages, among
/// themselves, node 0 forwarding their requests while it waits in exit.
fn served_in_exit(tmk: &mut Tmk) -> R {
    let c = shared::<u64>(tmk, 1)?;
    tmk.barrier(0)?;
    if tmk.proc_id() != 0 {
        for _ in 0..200 {
            let g = tmk.lock(0)?;
            g.view_mut(&c)?[0] += 1;
        }
    }
    Ok(())
}

/// Node 0 waits at barrier 1 while the others go on to exit: the manager must fail the job
/// naming both, not leave everybody waiting.
fn exit_at_barrier(tmk: &mut Tmk) -> R {
    tmk.barrier(0)?;
    if tmk.proc_id() == 0 {
        tmk.barrier(1)?;
        return Err(Error::Failed("node 0 passed barrier 1 alone".into()));
    }
    Ok(())
}

/// Node 0, the launcher, leaves by `process::exit` while the others wait at a barrier: they
/// must say that the launcher died and exit, not wait, nor vanish in silence.
fn launcher_dies(tmk: &mut Tmk) -> R {
    tmk.barrier(0)?;
    if tmk.proc_id() == 0 {
        std::process::exit(3);
    }
    tmk.barrier(0)?;
    Err(Error::Failed("passed a barrier without node 0".into()))
}

/// The others wait for a value node 0 never distributes: it goes into a barrier instead.
fn distribute_unanswered(tmk: &mut Tmk) -> R {
    tmk.barrier(0)?;
    if tmk.proc_id() == 0 {
        tmk.barrier(1)?;
    } else {
        let mut value = 0u64;
        tmk.distribute(&mut value)?;
    }
    Err(Error::Failed("a distribute or a barrier went through unmatched".into()))
}

/// Each node says how many CPUs it may run on (1: pinned).
fn affinity(tmk: &mut Tmk) -> R {
    println!("NODE {} CPUS {}", tmk.proc_id(), treadmarks::mem::sched::allowed_cpus());
    tmk.barrier(0)
}

/// Node 1 goes on to exit holding lock 3: its exit fails, and its peers must hear why.
fn exit_holding(tmk: &mut Tmk) -> R {
    tmk.barrier(0)?;
    if tmk.proc_id() == 1 {
        tmk.lock_acquire(3)?;
    }
    Ok(())
}

/// Node 1 writes four pages and dies after the barrier. Node 0 reads them inside `eprintln!`,
/// holding the standard library's lock on standard error: its service thread learns of the
/// death meanwhile, and when the read faults, the node must report and exit, not wait for that
/// lock forever.
fn fault_in_eprintln(tmk: &mut Tmk) -> R {
    let a = shared::<u64>(tmk, 4 * 512)?;
    if tmk.proc_id() == 1 {
        tmk.view_mut(&a)?.fill(1);
    }
    tmk.barrier(0)?;
    if tmk.proc_id() == 1 {
        std::process::exit(3);
    }
    /// Sums the words when printed, after a pause in which node 1's death is noticed.
    struct SlowSum<'a>(&'a [u64]);
    impl std::fmt::Display for SlowSum<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            std::thread::sleep(std::time::Duration::from_millis(300));
            write!(f, "{}", self.0.iter().sum::<u64>())
        }
    }
    // A view of no part: its pages fault when touched, inside the print.
    let v = tmk.view_parts(&a, std::iter::empty())?;
    eprintln!("sum {}", SlowSum(&v));
    Err(Error::Failed("node 0 read the pages of a node that had died".into()))
}

/// Bad input from the application gives typed errors that name the value; the job goes on.
fn errors(tmk: &mut Tmk) -> R {
    let e = tmk.lock_acquire(5000).unwrap_err().to_string();
    check(e.contains("lock 5000") && e.contains("1024"), || e.clone())?;
    let e = tmk.barrier(999).unwrap_err().to_string();
    check(e.contains("barrier 999"), || e.clone())?;
    let e = tmk.lock_release(3).unwrap_err().to_string();
    check(e.contains("lock 3") && e.contains("not hold"), || e.clone())?;
    let e = tmk.alloc::<u8>(1 << 40).unwrap_err().to_string();
    check(e.contains("1099511627776 bytes requested"), || e.clone())?;
    // Aligned more than the heap's base (the tests' bases lie between 2^46 and 2^47).
    let e = tmk.alloc_aligned::<u8>(1, 1 << 46).unwrap_err().to_string();
    check(e.contains("aligned to 70368744177664 bytes") && e.contains("TMK_HEAP_BASE"), || e.clone())?;
    let bogus: Shared<[u64]> = Shared::from_raw_parts(u64::MAX - 7, 2);
    let e = tmk.view(&bogus).unwrap_err().to_string();
    check(e.contains("outside"), || e.clone())?;
    let a = shared::<u64>(tmk, 4)?;
    let v = tmk.view(&a)?;
    let e = tmk.view_mut(&a).unwrap_err().to_string();
    check(e.contains("already borrowed"), || e.clone())?;
    drop(v);
    tmk.barrier(0)
}

/// A program that synchronizes with locks alone: each node takes the lock it manages (its token
/// never leaves it, so no message goes out) and rewrites a page of its own under it, until its
/// consistency data passes `TMK_CONSISTENCY_LIMIT` and the acquire fails, naming the bytes; it
/// must have been warned first (the test reads the warning). A collection then lets it go on.
fn lock_only(tmk: &mut Tmk) -> R {
    let (me, n) = (tmk.proc_id(), tmk.nprocs());
    // Rewritten in a later interval, before its diff is asked for, a page is noticed in no new
    // interval (its diff, when cut, holds both writes): each round writes a page of its own.
    const PAGES: usize = 2048;
    let a = shared::<u64>(tmk, n * PAGES * 512)?;
    let lock = u32::try_from(me).expect("a few nodes");
    // The threshold the test sets, under half the limit it sets, is the one the node resolved.
    let threshold = tmk.collection_threshold();
    check(threshold == 8192, || format!("node {me} collects at {threshold} bytes, not 8192"))?;
    let mut rounds = 0u64;
    let failed = loop {
        match tmk.lock(lock) {
            Ok(guard) => {
                let page = me * PAGES + rounds as usize;
                guard.view_mut(&a.slice(page * 512, (page + 1) * 512))?.fill(rounds);
                rounds += 1;
                check(rounds < PAGES as u64, || {
                    format!("node {me}: {PAGES} pages rewritten never reached the limit")
                })?;
            }
            Err(e) => break e,
        }
    };
    let named = matches!(failed, Error::Protocol(treadmarks::ProtocolError::ConsistencyLimit { .. }));
    check(named, || format!("node {me}: the acquire failed with {failed}"))?;
    println!("NODE {me} LIMIT AFTER {rounds} ROUNDS: {failed}");
    tmk.collect()?;
    tmk.lock(lock).map(drop)
}

/// A long iterative kernel (thousands of barriers) under a small collection threshold: every
/// node collects, its consistency data stays bounded, and the result equals the sequential one.
fn gc_long(tmk: &mut Tmk) -> R {
    let (me, n) = (tmk.proc_id(), tmk.nprocs());
    let len = n * 8 * 512; // eight pages of u64 per node
    let iterations = 2000;
    let step = |src: &[u64], i: usize| {
        let l = if i == 0 { 7 } else { src[i - 1] };
        let r = if i + 1 == src.len() { 11 } else { src[i + 1] };
        l.wrapping_add(src[i].wrapping_mul(3)).wrapping_add(r).rotate_left(1)
    };
    let a = shared::<u64>(tmk, len)?;
    let b = shared::<u64>(tmk, len)?;
    let (lo, hi) = (me * len / n, (me + 1) * len / n);
    tmk.view_mut(&a.slice(lo, hi))?.iter_mut().enumerate().for_each(|(k, x)| *x = (lo + k) as u64);
    tmk.barrier(0)?;
    for it in 0..iterations {
        let (src, dst) = if it % 2 == 0 { (a, b) } else { (b, a) };
        {
            let src = tmk.view(&src)?;
            let mut out = tmk.view_mut(&dst.slice(lo, hi))?;
            for (k, x) in out.iter_mut().enumerate() {
                *x = step(&src, lo + k);
            }
        }
        tmk.barrier(0)?;
    }
    let mut seq: Vec<u64> = (0..len as u64).collect();
    for _ in 0..iterations {
        seq = (0..len).map(|i| step(&seq, i)).collect();
    }
    let result = if iterations % 2 == 0 { a } else { b };
    check(*tmk.view(&result)? == seq[..], || "result differs from the sequential run".into())?;
    let s = tmk.stats()?;
    let threshold: u64 =
        std::env::var("TMK_GC_THRESHOLD").ok().and_then(|v| v.parse().ok()).unwrap_or(u64::MAX);
    let slack = 256 << 10;
    let p = &s.protocol;
    check(p.collections >= 5, || format!("only {} collections", p.collections))?;
    check(p.peak_consistency_bytes <= threshold + slack, || {
        format!(
            "peak consistency data {} B > threshold {threshold} + slack {slack}",
            p.peak_consistency_bytes
        )
    })?;
    // Diff memory is backed at startup, as much as a node holds before a collection (the
    // threshold and a chunk, unless TMK_DIFF_RESERVE says otherwise); collections hand it back
    // for reuse, so the run maps no more than the chunks in use at once.
    use treadmarks::mem::chunk::{CHUNK, POOL_CHUNKS};
    const CHUNK_BYTES: u64 = CHUNK as u64;
    let reserve = std::env::var("TMK_DIFF_RESERVE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(threshold.saturating_add(CHUNK_BYTES));
    let reserved = reserve.div_ceil(CHUNK_BYTES).min(POOL_CHUNKS as u64);
    check(s.diff_chunks_reserved == reserved, || {
        format!("{} diff chunks reserved, want {reserved} for {reserve} B", s.diff_chunks_reserved)
    })?;
    check(reserved == 0 || s.diff_chunks_mapped == reserved, || {
        format!("{} diff chunks mapped beyond the {reserved} reserved", s.diff_chunks_mapped - reserved)
    })?;
    println!(
        "node {me}: {} collections, peak {} B, {} B reclaimed, diff chunks {} mapped ({} reserved), {} reused",
        p.collections,
        p.peak_consistency_bytes,
        p.gc_bytes_reclaimed,
        s.diff_chunks_mapped,
        s.diff_chunks_reserved,
        s.diff_chunks_reused
    );
    Ok(())
}

/// A counter incremented under a lock across collections loses no update.
fn gc_counter(tmk: &mut Tmk) -> R {
    let rounds = 10;
    let c = shared::<u64>(tmk, 1)?;
    for _ in 0..rounds {
        for _ in 0..50 {
            let g = tmk.lock(0)?;
            g.view_mut(&c)?[0] += 1;
        }
        tmk.collect()?;
    }
    let got = tmk.view(&c)?[0];
    let want = (rounds * 50 * tmk.nprocs()) as u64;
    check(got == want, || format!("counter is {got}, want {want}"))?;
    let collections = tmk.stats()?.protocol.collections;
    check(collections == rounds as u64, || format!("{collections} collections, want {rounds}"))
}

/// A page written by several nodes, collected, then read by a node that dropped its stale copy:
/// it fetches a whole copy from a writer.
fn gc_base_copy(tmk: &mut Tmk) -> R {
    let (me, n) = (tmk.proc_id(), tmk.nprocs());
    let a = shared::<u32>(tmk, 1024)?; // one page
    let reader = n - 1;
    if me == reader {
        check(tmk.view(&a)?[0] == 0, || "fresh page not zero".into())?; // holds a valid copy
    }
    tmk.barrier(0)?;
    if me != reader {
        let mut v = tmk.view_mut(&a)?;
        for w in (me..1024).step_by(n - 1) {
            v[w] = 1000 + w as u32;
        }
    }
    tmk.collect()?; // the reader's copy is stale and it wrote nothing: it drops it
    if me == reader {
        let v = tmk.view(&a)?;
        let bad = (0..1024).find(|&w| v[w] != 1000 + w as u32);
        check(bad.is_none(), || format!("word {bad:?} wrong after the collection"))?;
        drop(v);
        let s = tmk.stats()?.protocol;
        check(s.pages_dropped == 1 && s.page_requests_sent == 1, || {
            format!("dropped {} fetched {}", s.pages_dropped, s.page_requests_sent)
        })?;
    }
    tmk.barrier(0)
}

/// Commands whose replies the application takes by polling, each followed by a real page fault:
/// a wake-up left over from a reply must not end a fault's wait early.
fn reply_then_fault(tmk: &mut Tmk) -> R {
    let pages = 300;
    let a = shared::<u64>(tmk, pages * 512)?;
    if tmk.proc_id() == 1 {
        let mut v = tmk.view_mut(&a)?;
        for p in 0..pages {
            v[p * 512] = p as u64 + 1;
        }
    }
    tmk.barrier(0)?;
    if tmk.proc_id() == 0 {
        let base = tmk.ptr(&a);
        for p in 0..pages {
            tmk.ping(1)?;
            // SAFETY: `a` is a live allocation of `pages * 512` u64s, so the element is in bounds
            // and aligned; no view or reference to it exists; the read faults (the page is
            // invalid) and returns once the runtime has brought the page up to date.
            let x = unsafe { std::ptr::read_volatile(base.add(p * 512)) };
            check(x == p as u64 + 1, || format!("page {p} read {x}"))?;
        }
    }
    tmk.barrier(0)
}

/// The page-sharing rule on real processes: node 1 serves diffs of pages it keeps writing.
/// Each page's first half (A) is written by node 1 before a barrier; after it node 1 rewrites
/// the second halves (B) in a loop while node 0 reads A, so node 1 serves every diff of a page
/// its application is writing at that moment. Node 0 must see A exactly; after a final barrier,
/// everybody sees node 1's last B.
fn serve_while_writing(tmk: &mut Tmk) -> R {
    let (pages, rounds) = (64, 200);
    let a = shared::<u64>(tmk, pages * 512)?;
    let me = tmk.proc_id();
    if me == 1 {
        let mut v = tmk.view_mut(&a)?;
        for p in 0..pages {
            for w in 0..256 {
                v[p * 512 + w] = (p * 1000 + w) as u64;
            }
        }
    }
    tmk.barrier(0)?;
    if me == 1 {
        for r in 1..=rounds as u64 {
            let mut v = tmk.view_mut(&a)?;
            for p in 0..pages {
                for w in 256..512 {
                    v[p * 512 + w] = r * 1_000_000 + (p * 1000 + w) as u64;
                }
            }
        }
    } else if me == 0 {
        for p in 0..pages {
            let v = tmk.view(&a.slice(p * 512, p * 512 + 256))?;
            let bad = (0..256).find(|&w| v[w] != (p * 1000 + w) as u64);
            check(bad.is_none(), || format!("page {p}: word {bad:?} is {}", v[bad.unwrap_or(0)]))?;
        }
    }
    tmk.barrier(0)?;
    let v = tmk.view(&a)?;
    for p in 0..pages {
        for w in 256..512 {
            let want = rounds as u64 * 1_000_000 + (p * 1000 + w) as u64;
            check(v[p * 512 + w] == want, || {
                format!("page {p} word {w} is {}, want {want}", v[p * 512 + w])
            })?;
        }
    }
    Ok(())
}

/// `serve_while_writing` with node 1's writer another thread: node 1's application hands its
/// mutable view's slice of the second halves (B) to a scoped thread, which rewrites them round
/// after round, while the application thread views, page by page, an array node 0 wrote (each
/// view a fetch: the runtime serves node 0's requests for the first halves (A) while it waits,
/// with a mutable view open). Nothing aborts, node 0 sees A exactly and node 1 node 0's array,
/// and after a barrier everybody sees the writer's last B.
fn scoped_writer(tmk: &mut Tmk) -> R {
    let (pages, rounds) = (32, 400);
    let a = shared::<u64>(tmk, pages * 512)?;
    let c = shared::<u64>(tmk, pages * 512)?;
    let me = tmk.proc_id();
    let b_word = |r: u64, p: usize, w: usize| r * 1_000_000 + (p * 1000 + w) as u64;
    if me == 1 {
        let mut v = tmk.view_mut(&a)?;
        for p in 0..pages {
            for w in 0..256 {
                v[p * 512 + w] = (p * 1000 + w) as u64;
            }
        }
    } else if me == 0 {
        let mut v = tmk.view_mut(&c)?;
        for (i, x) in v.iter_mut().enumerate() {
            *x = 7 * i as u64 + 1;
        }
    }
    tmk.barrier(0)?;
    if me == 1 {
        let mut v = tmk.view_mut(&a)?;
        // Every page writable before its slice leaves this thread: a fault from another thread
        // aborts the node.
        for p in 0..pages {
            v[p * 512 + 256] = b_word(0, p, 256);
        }
        let slice: &mut [u64] = &mut v;
        std::thread::scope(|s| -> R {
            s.spawn(|| {
                for r in 1..=rounds as u64 {
                    for p in 0..pages {
                        for w in 256..512 {
                            slice[p * 512 + w] = b_word(r, p, w);
                        }
                    }
                }
            });
            for p in 0..pages {
                let v = tmk.view(&c.slice(p * 512, p * 512 + 512))?;
                let bad = (0..512).find(|&w| v[w] != 7 * (p * 512 + w) as u64 + 1);
                check(bad.is_none(), || format!("c page {p}: word {bad:?} is {}", v[bad.unwrap_or(0)]))?;
            }
            Ok(())
        })?;
    } else if me == 0 {
        for p in 0..pages {
            let v = tmk.view(&a.slice(p * 512, p * 512 + 256))?;
            let bad = (0..256).find(|&w| v[w] != (p * 1000 + w) as u64);
            check(bad.is_none(), || format!("page {p}: word {bad:?} is {}", v[bad.unwrap_or(0)]))?;
        }
    }
    tmk.barrier(0)?;
    let v = tmk.view(&a)?;
    for p in 0..pages {
        for w in 256..512 {
            let want = b_word(rounds as u64, p, w);
            check(v[p * 512 + w] == want, || {
                format!("page {p} word {w} is {}, want {want}", v[p * 512 + w])
            })?;
        }
    }
    Ok(())
}

/// Scenario `explicit-config`: the launcher started with a configuration of its own making
/// ([`start`]), 16 locks where the environment says nothing; every node must run with it.
fn explicit_config(tmk: &mut Tmk) -> R {
    let e = tmk.lock_acquire(16).unwrap_err().to_string();
    check(e.contains("lock 16") && e.contains("16 locks"), || format!("node {}: {e}", tmk.proc_id()))?;
    counter_under(tmk, 15)
}

/// Scenario `start-twice`: a second start while the node runs is refused (and again after its
/// exit, in `main`): a process runs one node of one job, once.
fn start_twice(tmk: &mut Tmk) -> R {
    let again = Tmk::startup().map(|_| ()).unwrap_err();
    check(matches!(again, Error::AlreadyStarted), || format!("node {}: {again}", tmk.proc_id()))?;
    tmk.barrier(0)
}

/// Scenario `hang`: a job stuck after its nodes met, as a deadlocked one is: each node waits
/// at a barrier, then sleeps 120 s and fails. For the test that kills the test process running
/// it: the job must die with it, long before.
fn hang(tmk: &mut Tmk) -> R {
    tmk.barrier(0)?;
    std::thread::sleep(std::time::Duration::from_secs(120));
    Err(Error::Failed("nobody killed the job in 120 s".into()))
}

/// Starts this node: by the environment and arguments, as `Tmk::startup` does; in
/// `explicit-config`, every node by `Tmk::startup_with` with a configuration made in code, a
/// launcher's with 16 locks, as a program that builds its own would (the nodes the launcher
/// spawns must run with the launcher's, not become launchers themselves).
fn start() -> treadmarks::Result<Tmk> {
    if std::env::args().nth(1).is_none_or(|s| s != "explicit-config") {
        return Tmk::startup();
    }
    let (config, rest) = treadmarks::Config::from_env_and_args(treadmarks::Config::command_line()?)?;
    let role = treadmarks::config::Role::Launcher;
    Tmk::startup_with(treadmarks::Config { nlocks: 16, role, ..config }, rest)
}

fn main() -> ExitCode {
    // A node that dies before it meets the others (TMK_TEST_DIE_AT_STARTUP=<rank>).
    if let (Ok(rank), Ok(die)) = (std::env::var("TMK_RANK"), std::env::var("TMK_TEST_DIE_AT_STARTUP"))
        && rank == die
    {
        return ExitCode::from(3);
    }
    let result = start().and_then(|mut tmk| {
        let scenario = tmk.args().first().cloned().unwrap_or_default();
        let r = match scenario.as_str() {
            "counter" => counter(&mut tmk),
            "interleaved" => interleaved(&mut tmk),
            "never-held" => never_held(&mut tmk),
            "lock-chain" => lock_chain(&mut tmk),
            "lazy" => lazy(&mut tmk),
            "lock-walk" => lock_walk(&mut tmk),
            "parts" => parts(&mut tmk),
            "overwrite" => overwrite(&mut tmk),
            "stream" => stream(&mut tmk),
            "push" => push(&mut tmk),
            "kill" => kill(&mut tmk),
            "give-up" => give_up(&mut tmk),
            "served-in-exit" => served_in_exit(&mut tmk),
            "give-up-on-error" => give_up_on_error(&mut tmk),
            "quiet-after-peer-death" => quiet_after_peer_death(&mut tmk),
            "fault-in-eprintln" => fault_in_eprintln(&mut tmk),
            "errors" => errors(&mut tmk),
            "gc-long" => gc_long(&mut tmk),
            "lock-only" => lock_only(&mut tmk),
            "reply-then-fault" => reply_then_fault(&mut tmk),
            "serve-while-writing" => serve_while_writing(&mut tmk),
            "scoped-writer" => scoped_writer(&mut tmk),
            "gc-counter" => gc_counter(&mut tmk),
            "gc-base-copy" => gc_base_copy(&mut tmk),
            "exit-at-barrier" => exit_at_barrier(&mut tmk),
            "exit-holding" => exit_holding(&mut tmk),
            "affinity" => affinity(&mut tmk),
            "distribute-unanswered" => distribute_unanswered(&mut tmk),
            "launcher-dies" => launcher_dies(&mut tmk),
            "explicit-config" => explicit_config(&mut tmk),
            "hang" => hang(&mut tmk),
            "start-twice" => start_twice(&mut tmk),
            other => Err(Error::Failed(format!("unknown scenario {other:?}"))),
        };
        r?;
        let me = tmk.proc_id();
        tmk.exit()?;
        if scenario == "start-twice" {
            let again = Tmk::startup().map(|_| ()).unwrap_err();
            check(matches!(again, Error::AlreadyStarted), || format!("node {me} after exit: {again}"))?;
            println!("NODE {me} STARTED ONCE");
        }
        if scenario == "affinity" {
            // Unpinned again: a program that goes on after its job keeps its CPUs.
            println!("NODE {me} AFTER EXIT CPUS {}", treadmarks::mem::sched::allowed_cpus());
        }
        if me == 0 {
            println!("PASS {scenario}");
        }
        Ok(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            treadmarks::report(&format!("tmk-testnode: {e}"));
            ExitCode::FAILURE
        }
    }
}
