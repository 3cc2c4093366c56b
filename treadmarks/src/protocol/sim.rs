//! Seeded simulation: several nodes in one process run random data-race-free programs over
//! [`VecMemory`], with messages delivered in a random (seeded) interleaving that keeps each link
//! FIFO, as TCP does. Every read is checked against a sequentially consistent oracle: in a
//! data-race-free program the last write to a word in the simulation's execution order is
//! ordered by happened-before with the read, so LRC must return exactly its value. The
//! happened-before oracle below ([`Hb`]) runs beside it and must allow that one value alone (the
//! program does not race), and after every acquire and barrier every word of every page the
//! node can read without a fault must hold a value it allows.
//!
//! Programs: phases separated by barriers. In each phase every word has a role: owned by one node
//! (only it reads and writes it), guarded by a lock (accessed only inside critical sections of
//! that lock), or read-only. Pages are tiny (64 bytes), so words of different owners share pages
//! (false sharing, multiple writers). Some phases give one node every word of a page, which it may
//! declare overwritten (`Node::request_overwrite`) and then write in full. Writes to read-only
//! pages take the fault handler's fast path or the protocol's slow path at random. Every message
//! is round-tripped through postcard.
//!
//! Racy programs (`generate_racy`) go further: any node reads or writes any word, outside any
//! lock or under any (nested ones too), so writes travel through chains of different locks and
//! through barriers, and reads race with writes. A happened-before oracle ([`Hb`]) follows the
//! application's synchronization with vector clocks of its own, and every read must return the
//! last write that happened before it or a later, concurrent one, never an older one. Values
//! are unique and change one to four bytes of a word ([`value`]), so a lost or torn byte shows.
//! In half the runs writes that race with another write of their word run too (elsewhere they
//! are skipped), and nodes declare pages overwritten while others write them: a word two
//! concurrent writes touched must then hold, at each byte, a byte some write of it put there
//! (what LRC with multiple writers can promise, [`Hb`]), and no node may fail or panic.
//! Some programs take views under locks, distribute values (node 0 at a phase's start, the
//! others then or a barrier later) and allocate and free parts of the heap (every allocation
//! checked aligned, inside the heap and clear of the live ones); each ends in its exit, which
//! other nodes may reach much later.
//!
//! While a node's service thread handles a message, its application may be running (it waits
//! in no call into the runtime): the node's memory then refuses any read of a read-only page's
//! bytes and any `*_while_blocked` call (`VecMemory::set_app_running`), since the fault
//! handler's fast path could be writing the page, as the page-sharing rule (`memory.rs`) says.
//! And if the application's next operation is a store, it may run in the middle of the step: on
//! a read-only page, when the step revokes it, the fast path twins it first and the store lands
//! or faults again; on a writable page, while the step copies it (a twin cut while the
//! application runs), the copy reads its word before or after the store (`Sim::service`). A
//! `Node::serve_page` that trusts the access it read before the revocation, as one once did,
//! failed the oracles at seeds 127 (racy) and 2,003, and `VecMemory`'s checks sooner, at seed
//! 590 (the programs of session 27: session 29's values and operations changed every seed's
//! program). These choices draw on a generator of their own, so a seed in which no store runs
//! mid-step interleaves as it would without them.
//!
//! A validation or a fault says, half the time, that a mutable view is open
//! (`Node::set_mutable_views_open`): while the application waits in it, another thread may be
//! writing through the view's slice, so the node's memory refuses any in-place read of a
//! writable page (`VecMemory::set_others_writing`), and the program's store after the one it
//! waits in, to a page already writable, may run in the middle of a step while the page is
//! copied. A core that read such pages in place whenever the application waited in any call, as
//! this one did until session 37, fails those checks at once, and, where the store lands between
//! the in-place cut and the renewed twin (tried by hand), the oracles at seed 118.
//!
//! Some runs give every link a speed of its own, and stall links for a while (FIFO still), so
//! forwards go stale and crossing grants happen often; after every lock step each lock's token
//! must exist exactly once (at a node, or in one grant in flight) with at most one holder.
//!
//! Fuzzing runs (of random, lock-walk and racy programs) stop a simulation at a random step, or
//! in one run in four at a random message of the exit, and hand one message's receiver a
//! corrupted copy of it (bits flipped, bytes dropped or repeated in its encoding; or the message
//! twice; or from another sender): the receiver must take it, or refuse it with an error, and
//! never panic. A copy taken may surface later, so the messages in flight, and those they
//! cause, are then delivered too, the applications stopped: again an error or nothing, never a
//! panic.
//!
//! A failure names its seed; `TMK_SIM_SEED=<seed> cargo test -p treadmarks sim` replays it.

use super::*;
use std::collections::VecDeque;

const PAGE: usize = 64;
const WORDS_PER_PAGE: u32 = (PAGE / 4) as u32;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Read(u32),
    Write(u32, u32),
    Acquire(LockId),
    Release(LockId),
    Barrier(BarrierId),
    /// Validate pages `first .. first + count` (a view about to be accessed).
    Validate(u32, u32),
    /// Validate pages `first .. first + count` for writing, declaring page `whole` (one of them)
    /// overwritten; the program writes all its words next. A data-race-free program's node owns
    /// the page whole in this phase; a racy program's may declare any page.
    Overwrite(u32, u32, u32),
    /// The `k`-th distribute: node 0 sends [`distributed`]`(k)`, the others take it, at the
    /// start of the same phase or of the next (values are kept until taken).
    Distribute(u32),
    /// The program's last operation: leave the job, while other nodes may still be running
    /// (and asking this one for diffs, or for locks it manages).
    Exit,
    /// Allocate this many bytes of the shared heap, aligned to the second (node 0's allocator;
    /// the heap is the programs' few pages, so it fills and allocations fail too).
    Alloc(u64, u64),
    /// Free this node's latest live allocation, if it has one.
    Free,
}

/// The bytes of the `k`-th distributed value.
fn distributed(k: u32) -> Vec<u8> {
    let mut bytes = k.to_le_bytes().to_vec();
    bytes.resize(1 + k as usize % 7, 0xD1);
    bytes
}

#[derive(Clone, Copy, PartialEq)]
enum Role {
    Owner(usize),
    Locked(u32),
    ReadOnly,
}

struct Shape {
    n: usize,
    words: u32,
    nlocks: u32,
    phases: usize,
    /// Consistency bytes past which barriers collect: tiny (most barriers collect) or never.
    gc_threshold: u64,
    /// Whether writers push diffs at barriers (`push.rs`).
    push: bool,
    push_skip: bool,
    /// Most lock tokens a grant bundles (`lock.rs`); 0: none.
    lock_bundle: usize,
    /// Lock walks ([`generate_walks`]) instead of random phases.
    walks: bool,
    /// Links of different speeds that stall now and then, instead of a uniform choice.
    skewed: bool,
    /// Views fetching at least this many pages stream (`stream.rs`); 0: none do.
    stream_min_pages: usize,
    /// The protocol's size limits: the defaults, or tiny ones that a simulation's few small
    /// pages reach ([`tiny_limits`]).
    limits: Limits,
    /// Racy programs across locks ([`generate_racy`]), checked by the happened-before oracle
    /// ([`Hb`]) instead of the sequentially consistent one.
    racy: bool,
    /// Racy programs only: writes that race with a write to the same word run instead of being
    /// skipped, and programs declare pages overwritten ([`generate_racy`]).
    write_races: bool,
}

fn generate(rng: &mut Rng, s: &Shape) -> Vec<Vec<Op>> {
    let mut progs = vec![Vec::new(); s.n];
    let mut counter = 0u32;
    // Distributes: node 0's at the start of a phase; each other node's then or at the start of
    // the next phase (`late`), in order.
    let (mut distributes, mut late) = (0, vec![Vec::new(); s.n]);
    for phase in 0..s.phases {
        for (me, prog) in progs.iter_mut().enumerate() {
            prog.extend(late[me].drain(..).map(Op::Distribute));
        }
        if rng.chance(30) {
            let k = distributes;
            distributes += 1;
            for (me, prog) in progs.iter_mut().enumerate() {
                if me == 0 || rng.chance(50) {
                    prog.push(Op::Distribute(k));
                } else {
                    late[me].push(k);
                }
            }
        }
        let mut roles: Vec<Role> = (0..s.words)
            .map(|_| match rng.below(10) {
                0..=3 => Role::Owner(rng.below(s.n as u64) as usize),
                4..=6 => Role::Locked(rng.below(u64::from(s.nlocks)) as u32),
                _ => Role::ReadOnly,
            })
            .collect();
        let npages = s.words.div_ceil(WORDS_PER_PAGE);
        if rng.chance(40) {
            let (q, owner) = (rng.below(u64::from(npages)) as u32, rng.below(s.n as u64) as usize);
            let words = page_words(q, s.words);
            roles[words.start as usize..words.end as usize].fill(Role::Owner(owner));
        }
        for (me, prog) in progs.iter_mut().enumerate() {
            let free: Vec<u32> = (0..s.words)
                .filter(|&w| {
                    matches!(roles[w as usize], Role::ReadOnly) || roles[w as usize] == Role::Owner(me)
                })
                .collect();
            let whole_pages: Vec<u32> = (0..npages)
                .filter(|&q| page_words(q, s.words).all(|w| roles[w as usize] == Role::Owner(me)))
                .collect();
            for _ in 0..rng.below(25) {
                if rng.chance(10) {
                    let first = rng.below(u64::from(npages)) as u32;
                    prog.push(Op::Validate(first, 1 + rng.below(u64::from(npages - first)) as u32));
                }
                if rng.chance(5) {
                    prog.push(if rng.chance(60) {
                        Op::Alloc(1 + rng.below(64), 1 << rng.below(5))
                    } else {
                        Op::Free
                    });
                }
                if !whole_pages.is_empty() && rng.chance(15) {
                    let q = whole_pages[rng.below(whole_pages.len() as u64) as usize];
                    push_overwrite(rng, s, prog, &mut counter, q);
                }
                if rng.chance(35) {
                    let l = rng.below(u64::from(s.nlocks)) as u32;
                    let guarded: Vec<u32> =
                        (0..s.words).filter(|&w| roles[w as usize] == Role::Locked(l)).collect();
                    prog.push(Op::Acquire(LockId(l)));
                    if rng.chance(15) {
                        // A view under the lock: its twins made ahead belong to the lock's interval.
                        let first = rng.below(u64::from(npages)) as u32;
                        prog.push(Op::Validate(first, 1 + rng.below(u64::from(npages - first)) as u32));
                    }
                    for _ in 0..rng.below(5) {
                        if guarded.is_empty() {
                            break;
                        }
                        let w = guarded[rng.below(guarded.len() as u64) as usize];
                        counter += 1;
                        prog.push(if rng.chance(50) { Op::Write(w, value(counter)) } else { Op::Read(w) });
                    }
                    prog.push(Op::Release(LockId(l)));
                } else if !free.is_empty() {
                    let w = free[rng.below(free.len() as u64) as usize];
                    counter += 1;
                    let owned = roles[w as usize] == Role::Owner(me);
                    prog.push(if owned && rng.chance(60) {
                        Op::Write(w, value(counter))
                    } else {
                        Op::Read(w)
                    });
                }
            }
            prog.push(Op::Barrier(BarrierId((phase % 3) as u32)));
        }
    }
    for (me, prog) in progs.iter_mut().enumerate() {
        prog.extend(late[me].drain(..).map(Op::Distribute));
        prog.extend((0..s.words).map(Op::Read));
        prog.push(Op::Exit);
    }
    progs
}

/// Declares page `q` overwritten, in a view of it and up to a page on either side, and writes
/// each of its words.
fn push_overwrite(rng: &mut Rng, s: &Shape, prog: &mut Vec<Op>, counter: &mut u32, q: u32) {
    let npages = s.words.div_ceil(WORDS_PER_PAGE);
    let first = q.saturating_sub(rng.below(2) as u32);
    let end = (q + 1 + rng.below(2) as u32).min(npages);
    prog.push(Op::Overwrite(first, end - first, q));
    for w in page_words(q, s.words) {
        *counter += 1;
        prog.push(Op::Write(w, value(*counter)));
    }
}

/// The value the `counter`-th write of a program writes: unique (the low 16 bits are the
/// counter, which stays below 2^16), never 0 (the initial value), and with bytes set anywhere
/// in the word, so that a diff that loses, misplaces or tears any byte of it shows: a third of
/// the values keep their upper half zero, a third set byte 2 but not byte 3, and a third hash
/// into both.
fn value(counter: u32) -> u32 {
    assert!((1..1 << 16).contains(&counter), "write {counter}: values are unique below 2^16 writes");
    let high = counter.wrapping_mul(0x9E37_79B1) >> 16;
    let high = match counter % 3 {
        0 => 0,
        1 => high & 0xFF,
        _ => high,
    };
    counter | high << 16
}

/// Lock walks (Water's pattern): in every phase each node takes every lock once, starting at its
/// own offset and going round, reading and writing a few of the words that lock guards, so the
/// tokens move between nodes in long predictable runs that bundled grants (`lock.rs`) carry
/// together. Words are guarded by lock `w % nlocks` throughout.
fn generate_walks(rng: &mut Rng, s: &Shape) -> Vec<Vec<Op>> {
    let mut progs = vec![Vec::new(); s.n];
    let mut counter = 0u32;
    let nlocks = s.nlocks;
    for phase in 0..s.phases {
        for (me, prog) in progs.iter_mut().enumerate() {
            let start = (me as u32 * nlocks / s.n as u32 + phase as u32) % nlocks;
            for k in 0..nlocks {
                let l = (start + k) % nlocks;
                prog.push(Op::Acquire(LockId(l)));
                for _ in 0..rng.below(3) {
                    let w = l + nlocks * rng.below(u64::from(s.words / nlocks)) as u32;
                    counter += 1;
                    prog.push(if rng.chance(60) { Op::Write(w, value(counter)) } else { Op::Read(w) });
                }
                prog.push(Op::Release(LockId(l)));
            }
            prog.push(Op::Barrier(BarrierId((phase % 3) as u32)));
        }
    }
    for prog in &mut progs {
        prog.extend((0..s.words).map(Op::Read));
        prog.push(Op::Exit);
    }
    progs
}

struct SimNode {
    node: Node<VecMemory>,
    prog: Vec<Op>,
    pc: usize,
    blocked: bool,
    fast_twins: Vec<PageIdx>,
    exited: bool,
}

struct Sim {
    rng: Rng,
    /// The choices of stores in the middle of a step ([`Sim::service`]), apart from `rng`, so
    /// that a seed's interleaving stays what it was before they existed wherever none runs.
    mid_rng: Rng,
    nodes: Vec<SimNode>,
    links: Vec<VecDeque<Message>>,
    oracle: Vec<u32>,
    hb: Hb,
    /// The programs race ([`generate_racy`]): the happened-before oracle alone judges their
    /// reads, and their racing writes are skipped, or run with `write_races`. A data-race-free
    /// program's every read must be the one value both oracles allow, and none of its writes may
    /// race.
    racy: bool,
    write_races: bool,
    n: usize,
    seed: u64,
    /// Validations that completed without a message, as `Node::validates_locally` predicted.
    app_ops: AppOps,
    /// Stores that ran in the middle of a service step ([`Sim::service`]).
    mid_stores: MidStores,
    /// Per-link delivery weights (0: stalled for now); empty: every link and node alike.
    skew: Vec<u64>,
    /// Fuzzing: the step from which the next message delivered is corrupted, ending the run.
    fuzz_at: Option<u64>,
    /// Fuzzing: the message of the exit, counted from 0, that is corrupted instead.
    fuzz_exit_at: Option<u64>,
    /// Messages of the exit delivered so far.
    exit_messages: u64,
    /// The heap's live allocations, in the order they were made.
    allocations: Vec<Allocation>,
    /// `TMK_SIM_TRACE` set: every operation, delivery and completion is printed.
    trace: bool,
    /// Fuzzing: what the receiver did with the corrupted message.
    fuzzed: Option<Fuzzed>,
}

/// What a receiver did with a corrupted message (see [`Sim::deliver_corrupted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fuzzed {
    /// The codec refused the bytes: the protocol never saw them.
    Undecodable,
    /// The receiver took every copy without an error.
    Taken,
    /// The receiver refused a copy with an error.
    Refused,
}

/// Every word of every page node `i` may read without a fault holds a value the application
/// could read there now, read or not; on a page another node is overwriting meanwhile
/// (`Hb::overwriting`), a value written there at least. Checked after every acquire (by a grant,
/// or done at once with the token here) and every barrier.
fn valid_pages_hold_allowed_values(hb: &Hb, node: &Node<VecMemory>, i: usize, seed: u64, done: &AppDone) {
    for w in 0..hb.hist.len() as u32 {
        let (p, off) = locate(w);
        if node.mem().access(p) == Access::None {
            continue;
        }
        let got = u32::from_ne_bytes(node.mem().app_read(p)[off..off + 4].try_into().unwrap());
        assert!(
            hb.allows(i, w as usize, got),
            "seed {seed}: node {i} after {done:?}: valid {p} holds {got:#x} in word {w}, where LRC \
             allows {}; the word's writes: {}",
            hb.describe(i, w as usize),
            hb.history(w as usize)
        );
    }
}

fn locate(w: u32) -> (PageIdx, usize) {
    (PageIdx(w / WORDS_PER_PAGE), (w % WORDS_PER_PAGE) as usize * 4)
}

/// The words of page `q`, in a program of `words` words.
fn page_words(q: u32, words: u32) -> std::ops::Range<u32> {
    q * WORDS_PER_PAGE..((q + 1) * WORDS_PER_PAGE).min(words)
}

impl Sim {
    fn new(seed: u64, s: &Shape) -> Sim {
        let mut rng = Rng(seed);
        let progs = if s.racy {
            generate_racy(&mut rng, s)
        } else if s.walks {
            generate_walks(&mut rng, s)
        } else {
            generate(&mut rng, s)
        };
        let npages = s.words.div_ceil(WORDS_PER_PAGE);
        let access = if s.n == 1 { Access::ReadWrite } else { Access::Read };
        let nodes = progs
            .into_iter()
            .enumerate()
            .map(|(i, prog)| {
                let cfg = NodeConfig {
                    me: NodeId(i as u16),
                    nprocs: s.n as u16,
                    nlocks: s.nlocks,
                    nbarriers: 3,
                    heap_size: (npages as usize * PAGE) as u64,
                    gc_threshold: s.gc_threshold,
                    push: s.push,
                    push_skip: s.push_skip,
                    lock_bundle: s.lock_bundle,
                    back_heap: true,
                    stream_min_pages: s.stream_min_pages,
                    consistency_limit: u64::MAX,
                    limits: s.limits,
                };
                let node = Node::new(cfg, VecMemory::new(npages, PAGE, access));
                SimNode { node, prog, pc: 0, blocked: false, fast_twins: Vec::new(), exited: false }
            })
            .collect();
        let skew = if s.skewed {
            (0..s.n * s.n).map(|_| [1, 2, 5, 20, 60][rng.below(5) as usize]).collect()
        } else {
            Vec::new()
        };
        Sim {
            rng,
            mid_rng: Rng(seed ^ 0x5707e),
            nodes,
            links: vec![VecDeque::new(); s.n * s.n],
            oracle: vec![0; s.words as usize],
            hb: Hb::new(s.n, s.nlocks as usize, s.words as usize),
            racy: s.racy,
            write_races: s.write_races,
            n: s.n,
            seed,
            app_ops: AppOps::default(),
            mid_stores: MidStores::default(),
            skew,
            fuzz_at: None,
            fuzz_exit_at: None,
            exit_messages: 0,
            allocations: Vec::new(),
            trace: std::env::var_os("TMK_SIM_TRACE").is_some(),
            fuzzed: None,
        }
    }

    /// Runs `f` on node `i` after reporting fast-path twins, then collects its output.
    fn core(&mut self, i: usize, f: impl FnOnce(&mut Node<VecMemory>) -> Result<(), ProtocolError>) {
        let seed = self.seed;
        let sn = &mut self.nodes[i];
        for p in sn.fast_twins.drain(..) {
            sn.node.handle_twin_made(p);
        }
        if let Err(e) = f(&mut sn.node) {
            panic!("seed {seed}: node {i}: protocol error: {e}");
        }
        while let Some((to, msg)) = sn.node.poll_transmit() {
            assert_ne!(to.idx(), i, "seed {seed}: message to self escaped");
            let bytes = postcard::to_allocvec(&msg).expect("encode");
            let back: Message = postcard::from_bytes(&bytes).expect("decode");
            assert_eq!(back, msg);
            self.links[i * self.n + to.idx()].push_back(back);
        }
        while let Some(done) = sn.node.poll_done() {
            if self.trace {
                eprintln!("node {i} done: {done:?}");
            }
            assert!(
                sn.blocked || matches!(done, AppDone::FaultResolved(_) | AppDone::Exited),
                "seed {seed}: node {i}: completion {done:?} while not blocked"
            );
            sn.blocked = false;
            {
                let hb = &mut self.hb;
                match done {
                    AppDone::Acquired(l) => hb.acquired(i, l.idx()),
                    AppDone::BarrierPassed(_) => hb.pass(i),
                    _ => {}
                }
                if matches!(done, AppDone::Acquired(_) | AppDone::BarrierPassed(_)) {
                    valid_pages_hold_allowed_values(hb, &sn.node, i, seed, &done);
                }
            }
            match (&done, sn.prog[sn.pc.min(sn.prog.len() - 1)]) {
                (AppDone::Allocated(Ok(offset)), Op::Alloc(bytes, align)) => {
                    let a = Allocation { node: i, offset: *offset, bytes };
                    let heap = sn.node.mem().npages() as u64 * sn.node.mem().page_size() as u64;
                    assert!(
                        offset.is_multiple_of(align) && offset + bytes <= heap,
                        "seed {seed}: node {i}: {a:?} (aligned to {align}) in a heap of {heap} bytes"
                    );
                    let overlap = self
                        .allocations
                        .iter()
                        .find(|b| b.offset < a.offset + a.bytes && a.offset < b.offset + b.bytes);
                    assert!(overlap.is_none(), "seed {seed}: {a:?} overlaps the live {overlap:?}");
                    self.allocations.push(a);
                    self.app_ops.allocations += 1;
                }
                (AppDone::Allocated(Err(e)), Op::Alloc(..)) => {
                    assert!(matches!(e, AllocFailure::OutOfMemory { .. }), "seed {seed}: node {i}: {e}");
                }
                (AppDone::Freed(r), Op::Free) => assert!(r.is_ok(), "seed {seed}: node {i}: {r:?}"),
                (AppDone::Allocated(_) | AppDone::Freed(_), op) => {
                    panic!("seed {seed}: node {i}: {done:?} at {op:?}")
                }
                _ => {}
            }
            if let AppDone::Distributed(got) = &done {
                let Op::Distribute(k) = sn.prog[sn.pc] else {
                    panic!("seed {seed}: node {i}: {done:?} unasked")
                };
                assert_eq!(*got, distributed(k), "seed {seed}: node {i}: distribute {k}");
                self.app_ops.distributes += 1;
            }
            match done {
                // Settled: the synchronization it preceded runs next.
                AppDone::FaultResolved(_) | AppDone::Settled => {}
                AppDone::Exited => {
                    sn.exited = true;
                    sn.pc += 1;
                }
                _ => sn.pc += 1,
            }
        }
    }

    /// Runs `f` on node `i`, a validation or a fault the application asks for, having said whether
    /// a mutable view is `open`: if so, another thread may be writing meanwhile, in the runtime's
    /// step that starts the request too (`VecMemory::set_others_writing`).
    fn requesting(
        &mut self,
        i: usize,
        open: bool,
        f: impl FnOnce(&mut Node<VecMemory>) -> Result<(), ProtocolError>,
    ) {
        self.nodes[i].node.set_mutable_views_open(open);
        self.nodes[i].node.mem_mut().set_others_writing(open);
        self.core(i, f);
        self.nodes[i].node.mem_mut().set_others_writing(false);
    }

    /// Runs `f` on node `i` as its service thread would: its application runs meanwhile unless
    /// it waits in the runtime or has exited, and its memory checks the page-sharing rule so.
    ///
    /// If its next operation is a store, the store may run in the middle of the step: to a
    /// read-only page, when the step revokes it, the fault handler's fast path twins it first
    /// (the core hears of that twin at its next step, as from the runtime's fault handler) and
    /// the store lands before the revocation or faults again after it; to a writable page, while
    /// the step copies it, before or after the copy reads its word ([`VecMemory::arm_store`]).
    ///
    /// While the application waits in a view or a fault with a mutable view open, another
    /// thread of it may be writing through that view's slice: the store after the one the
    /// application waits in, to a page already writable, may run so in the middle of the step
    /// (while the page is copied), and is then taken out of the program.
    fn service(&mut self, i: usize, f: impl FnOnce(&mut Node<VecMemory>) -> Result<(), ProtocolError>) {
        let sn = &self.nodes[i];
        let running = !sn.blocked && !sn.exited;
        let beside = sn.blocked && !sn.exited && sn.node.others_may_write();
        let next = if beside { sn.pc + 1 } else { sn.pc };
        let store = match sn.prog.get(next) {
            Some(&Op::Write(w, v))
                if (running || beside)
                    && match sn.node.mem().access(locate(w).0) {
                        Access::None => false,
                        Access::Read => running,
                        Access::ReadWrite => true,
                    }
                    && (self.write_races || self.hb.write_ok(i, w as usize))
                    && self.mid_rng.chance(50) =>
            {
                Some((w, v))
            }
            _ => None,
        };
        let mem = self.nodes[i].node.mem_mut();
        mem.set_app_running(running);
        mem.set_others_writing(beside);
        if let Some((w, v)) = store {
            let (page, offset) = locate(w);
            let (lands, seen) = (self.mid_rng.chance(50), self.mid_rng.chance(50));
            mem.arm_store(MidStore { page, offset, bytes: v.to_ne_bytes().to_vec(), lands, seen });
        }
        self.core(i, f);
        let mem = self.nodes[i].node.mem_mut();
        mem.set_app_running(false);
        mem.set_others_writing(false);
        let Some(ran) = mem.take_store_ran() else { return };
        let landed = match ran {
            StoreRan::FastPath(p, landed) => {
                self.mid_stores.fast_path += 1;
                self.nodes[i].fast_twins.push(p);
                landed
            }
            StoreRan::DuringSnapshot if beside => {
                self.mid_stores.beside += 1;
                true
            }
            StoreRan::DuringSnapshot => {
                self.mid_stores.during_snapshot += 1;
                true
            }
        };
        if let (true, Some((w, v))) = (landed, store) {
            self.wrote(i, w, v);
            if beside {
                self.nodes[i].prog.remove(next);
            } else {
                self.nodes[i].pc += 1;
            }
        }
    }

    /// Node `i`'s store of `v` into word `w` landed: both oracles take it. Only a racy program's
    /// write may race.
    fn wrote(&mut self, i: usize, w: u32, v: u32) {
        self.oracle[w as usize] = v;
        self.hb.wrote(i, w as usize, v);
        assert!(
            self.racy || !self.hb.raced[w as usize],
            "seed {}: node {i}: write to word {w} races",
            self.seed
        );
    }

    fn step_app(&mut self, i: usize) {
        let seed = self.seed;
        let op = self.nodes[i].prog[self.nodes[i].pc];
        if self.trace {
            eprintln!("node {i} pc {}: {op:?}", self.nodes[i].pc);
        }
        let sn = &mut self.nodes[i];
        match op {
            Op::Read(w) => {
                let (p, off) = locate(w);
                if sn.node.mem().access(p) == Access::None {
                    sn.blocked = true;
                    let (write, open) = (self.rng.chance(20), self.rng.chance(50));
                    self.requesting(i, open, |n| n.handle_fault(p, write));
                } else {
                    let got = u32::from_ne_bytes(sn.node.mem().app_read(p)[off..off + 4].try_into().unwrap());
                    let hb = &mut self.hb;
                    let (allowed, exact) = hb.allowed(i, w as usize);
                    let raced = hb.raced[w as usize];
                    hb.raced_reads += u64::from(raced);
                    hb.overwriting_reads += u64::from(!raced && hb.overwriting(i, p));
                    if !self.racy {
                        // The last write in the simulation's order happened before the read.
                        assert_eq!(
                            allowed,
                            [self.oracle[w as usize]],
                            "seed {seed}: node {i}: the happened-before oracle disagrees with the \
                             sequential one on word {w} at pc {}: the program races",
                            sn.pc
                        );
                    }
                    // A data-race-free program's read must be exact, whatever `allows` would take.
                    let ok = if self.racy { hb.allows(i, w as usize, got) } else { allowed == [got] };
                    assert!(
                        ok,
                        "seed {seed}: node {i} read word {w} ({p}) at pc {}: got {got:#x}, LRC allows \
                         {}; the word's writes: {}",
                        sn.pc,
                        hb.describe(i, w as usize),
                        hb.history(w as usize)
                    );
                    hb.reads += 1;
                    hb.exact_reads += u64::from(exact && !raced);
                    sn.pc += 1;
                }
            }
            Op::Write(w, v) => {
                let (p, off) = locate(w);
                if !self.hb.write_ok(i, w as usize) && !self.write_races {
                    assert!(self.racy, "seed {seed}: node {i}: write to word {w} at pc {} races", sn.pc);
                    // It races with the word's last write: skipped.
                    self.hb.skipped_writes += 1;
                    sn.pc += 1;
                    return;
                }
                match sn.node.mem().access(p) {
                    Access::ReadWrite => {
                        sn.node.mem_mut().app_write(p)[off..off + 4].copy_from_slice(&v.to_ne_bytes());
                        self.wrote(i, w, v);
                        self.nodes[i].pc += 1;
                    }
                    Access::Read if self.rng.chance(50) => {
                        // The fault handler's fast path: twin, unprotect, report later.
                        let mem = sn.node.mem_mut();
                        mem.make_twin(p);
                        mem.set_access(p, 1, Access::ReadWrite);
                        sn.fast_twins.push(p);
                    }
                    _ => {
                        sn.blocked = true;
                        let (write, open) = (self.rng.chance(50), self.rng.chance(50));
                        self.requesting(i, open, |n| n.handle_fault(p, write));
                    }
                }
            }
            Op::Acquire(l) if sn.node.streaming() && !sn.node.token_here(l) => {
                // As the runtime does: a synchronization that may bring write notices waits for
                // the pages of streaming views first; an acquire of a token here does not.
                sn.blocked = true;
                self.core(i, |n| n.request_settle());
            }
            Op::Barrier(_) | Op::Distribute(_) | Op::Exit if sn.node.streaming() => {
                sn.blocked = true;
                self.core(i, |n| n.request_settle());
            }
            Op::Alloc(bytes, align) => {
                sn.blocked = true;
                self.core(i, |n| n.request_alloc(bytes, align));
            }
            Op::Free => match self.allocations.iter().rposition(|a| a.node == i) {
                Some(k) => {
                    let a = self.allocations.remove(k);
                    sn.blocked = true;
                    self.core(i, |n| n.request_free(a.offset));
                }
                None => sn.pc += 1,
            },
            Op::Exit => {
                sn.blocked = true;
                self.core(i, |n| n.request_exit());
            }
            Op::Distribute(k) => {
                sn.blocked = true;
                let value = (i == 0).then(|| distributed(k));
                self.core(i, |n| n.request_distribute(value));
            }
            Op::Acquire(l) if sn.node.token_here(l) && self.rng.chance(50) => {
                // As the runtime does on the application thread: done at once, no completion.
                let mut took = false;
                self.core(i, |n| n.acquire_if_here(l).map(|t| took = t));
                self.hb.acquired(i, l.idx());
                assert!(
                    took,
                    "seed {seed}: node {i}: the token of {l} is here but the acquire did not complete"
                );
                // A token that came bundled in another lock's grant is first used here.
                let done = AppDone::Acquired(l);
                valid_pages_hold_allowed_values(&self.hb, &self.nodes[i].node, i, seed, &done);
                self.nodes[i].pc += 1;
            }
            Op::Acquire(l) => {
                sn.blocked = true;
                self.core(i, |n| n.request_acquire(l));
            }
            Op::Release(l) => {
                sn.pc += 1;
                self.hb.released(i, l.idx());
                // The runtime runs releases on the application thread (`release_here`). A
                // release handed to the service thread (`request_release`) runs with the
                // application going on meanwhile, its next store maybe in the middle of it: the
                // case its freezing of the renewed twins is for.
                if self.rng.chance(50) {
                    self.core(i, |n| n.release_here(l));
                } else {
                    self.service(i, |n| n.request_release(l));
                }
            }
            Op::Barrier(b) => {
                sn.blocked = true;
                self.hb.arrive(i);
                self.core(i, |n| n.request_barrier(b));
            }
            Op::Validate(first, count) => {
                sn.blocked = true;
                let pages: Vec<PageIdx> = (first..first + count).map(PageIdx).collect();
                let write = self.rng.chance(50);
                // The runtime runs a validation on the application thread when the node says it
                // needs no message: it must then complete at once.
                let local = sn.node.validates_locally(&pages);
                self.app_ops.views_under_lock += u64::from(!sn.node.held_locks.is_empty());
                let open = self.rng.chance(50);
                self.requesting(i, open, |n| n.request_validate(&pages, write));
                assert!(
                    !local || !self.nodes[i].blocked,
                    "seed {seed}: node {i}: validation of {pages:?} said local but did not complete at once"
                );
                self.app_ops.local_views += u64::from(local);
            }
            Op::Overwrite(first, count, whole) => {
                sn.blocked = true;
                let pages: Vec<PageIdx> = (first..first + count).map(PageIdx).collect();
                let whole = [PageIdx(whole)];
                self.hb.overwrite(i, whole[0]);
                let mut words = page_words(whole[0].0, self.hb.raced.len() as u32);
                assert!(
                    self.racy || !words.any(|w| self.hb.raced[w as usize]),
                    "seed {seed}: node {i}: overwrite of {} races",
                    whole[0]
                );
                let local = sn.node.overwrites_locally(&pages, &whole);
                let open = self.rng.chance(50);
                self.requesting(i, open, |n| n.request_overwrite(&pages, &whole));
                assert!(
                    !local || !self.nodes[i].blocked,
                    "seed {seed}: node {i}: overwrite of {pages:?} said local but did not complete at once"
                );
            }
        }
    }

    /// Each lock's token is at exactly one node or in exactly one grant in flight, and at most
    /// one node holds the lock.
    fn check_tokens(&self) {
        for l in 0..self.nodes[0].node.locks.len() {
            let at: Vec<usize> = (0..self.n).filter(|&i| self.nodes[i].node.locks[l].token).collect();
            let holders = (0..self.n).filter(|&i| self.nodes[i].node.locks[l].held).count();
            let in_flight = (self.links.iter().flatten())
                .filter(|m| matches!(m, Message::LockGrant { lock, bundled, .. } if lock.idx() == l || bundled.contains(&LockId(l as u32))))
                .count();
            assert!(
                at.len() + in_flight == 1 && holders <= 1,
                "seed {}: lock {l}: token at nodes {at:?} and in {in_flight} grants in flight, {holders} holders",
                self.seed
            );
        }
    }

    /// An application step (weight 5) or a link by its weight; a stall changes now and then, and
    /// a stalled link moves only when nothing else can (a stall is a delay, not a loss).
    fn skewed_pick(&mut self, runnable: &[usize], busy: &[usize]) -> usize {
        if self.rng.chance(2) {
            let l = self.rng.below(self.skew.len() as u64) as usize;
            self.skew[l] = if self.skew[l] == 0 { [1, 5, 60][self.rng.below(3) as usize] } else { 0 };
        }
        let stuck = runnable.is_empty() && busy.iter().all(|&l| self.skew[l] == 0);
        let w = |l: usize| if stuck { 1 } else { self.skew[l] };
        let total = runnable.len() as u64 * 5 + busy.iter().map(|&l| w(l)).sum::<u64>();
        let mut x = self.rng.below(total);
        if x < runnable.len() as u64 * 5 {
            return (x / 5) as usize;
        }
        x -= runnable.len() as u64 * 5;
        for (k, &l) in busy.iter().enumerate() {
            if x < w(l) {
                return runnable.len() + k;
            }
            x -= w(l);
        }
        unreachable!("the weights add up")
    }

    fn run(&mut self) {
        let mut steps = 0u64;
        loop {
            steps += 1;
            assert!(steps < 5_000_000, "seed {}: no progress", self.seed);
            let runnable: Vec<usize> = (0..self.n)
                .filter(|&i| !self.nodes[i].blocked && self.nodes[i].pc < self.nodes[i].prog.len())
                .collect();
            let busy: Vec<usize> = (0..self.links.len()).filter(|&l| !self.links[l].is_empty()).collect();
            // A node's deferred work (the pushes planned at its barrier arrival) runs at some
            // point after its arrival left: right away, or with messages delivered meanwhile.
            let deferred: Vec<usize> = (0..self.n).filter(|&i| self.nodes[i].node.has_deferred()).collect();
            if !deferred.is_empty() && ((runnable.is_empty() && busy.is_empty()) || self.rng.chance(30)) {
                let i = deferred[self.rng.below(deferred.len() as u64) as usize];
                self.service(i, |n| n.run_deferred());
                continue;
            }
            if runnable.is_empty() && busy.is_empty() {
                break;
            }
            let pick = if self.skew.is_empty() {
                self.rng.below((runnable.len() + busy.len()) as u64) as usize
            } else {
                self.skewed_pick(&runnable, &busy)
            };
            let lock_step = if pick < runnable.len() {
                let i = runnable[pick];
                let op = self.nodes[i].prog[self.nodes[i].pc];
                self.step_app(i);
                matches!(op, Op::Acquire(_) | Op::Release(_))
            } else {
                let l = busy[pick - runnable.len()];
                let (from, to) = (l / self.n, l % self.n);
                let msg = self.links[l].pop_front().expect("non-empty");
                if self.fuzz_at.is_some_and(|at| steps >= at) {
                    return self.deliver_corrupted(from, to, msg);
                }
                if msg.kind() == MsgKind::Exit {
                    if self.fuzz_exit_at == Some(self.exit_messages) {
                        return self.deliver_corrupted(from, to, msg);
                    }
                    self.exit_messages += 1;
                } else {
                    let sn = &self.nodes[to];
                    self.app_ops.served_in_exit +=
                        u64::from(sn.blocked && matches!(sn.prog[sn.pc], Op::Exit));
                }
                if self.trace {
                    let shown: String = format!("{msg:?}").chars().take(400).collect();
                    eprintln!("  {from} -> {to}: {shown}");
                }
                let lock_msg =
                    matches!(msg.kind(), MsgKind::LockRequest | MsgKind::LockForward | MsgKind::LockGrant);
                self.service(to, |n| n.handle_message(NodeId(from as u16), msg));
                lock_msg
            };
            if lock_step {
                self.check_tokens();
            }
        }
        for (i, sn) in self.nodes.iter().enumerate() {
            assert!(
                !sn.blocked && sn.pc == sn.prog.len(),
                "seed {}: deadlock: node {i} stuck at pc {} ({:?})",
                self.seed,
                sn.pc,
                sn.prog.get(sn.pc)
            );
        }
        // Every program ends in its exit, which completed everywhere.
        for (i, sn) in self.nodes.iter().enumerate() {
            assert!(sn.exited, "seed {}: node {i}: exit did not complete", self.seed);
            assert!(!sn.node.streaming(), "seed {}: node {i}: streamed pages left on their way", self.seed);
            assert_eq!(
                sn.node.ahead.len(),
                0,
                "seed {}: node {i}: records sent ahead of no message",
                self.seed
            );
            assert!(
                sn.node.held_continued.iter().all(|&b| b == 0),
                "seed {}: node {i}: continued diffs counted after every miss finished: {:?}",
                self.seed,
                sn.node.held_continued
            );
        }
    }
}

impl Sim {
    /// Fuzzing: hands node `to` a corrupted copy of `msg` from `from` and requires it to take
    /// it or refuse it with an error, not to panic. The applications stop here; if the copy was
    /// taken, the messages in flight, and those they cause, are delivered still
    /// ([`Sim::aftermath`]).
    fn deliver_corrupted(&mut self, from: usize, to: usize, msg: Message) {
        self.corrupt(from, to, msg);
        if self.fuzzed == Some(Fuzzed::Taken) {
            self.aftermath();
        }
    }

    /// Fuzzing, after a corrupted message was taken: delivers the messages in flight and those
    /// they cause, in a random order, while the applications stay where they are (their oracles
    /// would not hold). A node may refuse one with an error, which ends a job, but none may
    /// panic: a corruption taken in can surface later, as a stray exit release taken by node 0
    /// did at the last exit arrival, in an `expect`.
    fn aftermath(&mut self) {
        let seed = self.seed;
        for _ in 0..10_000 {
            let busy: Vec<usize> = (0..self.links.len()).filter(|&l| !self.links[l].is_empty()).collect();
            if busy.is_empty() {
                return;
            }
            let l = busy[self.rng.below(busy.len() as u64) as usize];
            let (from, to) = (l / self.n, l % self.n);
            let msg = self.links[l].pop_front().expect("non-empty");
            let shown = format!("{msg:?}");
            let node = &mut self.nodes[to].node;
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                node.handle_message(NodeId(from as u16), msg)?;
                let mut out = Vec::new();
                while let Some(sent) = node.poll_transmit() {
                    out.push(sent);
                }
                while node.poll_done().is_some() {}
                Ok::<_, ProtocolError>(out)
            }));
            match r {
                Ok(Ok(out)) => {
                    for (dest, m) in out {
                        self.links[to * self.n + dest.idx()].push_back(m);
                    }
                }
                Ok(Err(_)) => return,
                Err(e) => {
                    let why = e.downcast_ref::<String>().cloned().unwrap_or_default();
                    panic!(
                        "seed {seed}: node {to} panicked ({why}) after a corruption it took, on {shown} from node {from}"
                    );
                }
            }
        }
    }

    /// Hands node `to` a corrupted copy of `msg` and notes what it did ([`Sim::deliver_corrupted`]).
    fn corrupt(&mut self, from: usize, to: usize, msg: Message) {
        let seed = self.seed;
        let mut bytes = postcard::to_allocvec(&msg).expect("encode");
        let how = self.rng.below(5);
        let mut sender = from;
        let copies: Vec<Message> = match how {
            0..=2 => {
                for _ in 0..1 + self.rng.below(3) {
                    let i = self.rng.below(bytes.len() as u64) as usize;
                    match how {
                        0 => bytes[i] ^= 1 << self.rng.below(8),
                        1 => drop(bytes.remove(i)),
                        _ => bytes.insert(i, bytes[i]),
                    }
                    if bytes.is_empty() {
                        self.fuzzed = Some(Fuzzed::Undecodable);
                        return;
                    }
                }
                // A corruption the codec refuses never reaches the protocol (`codec.rs`).
                match postcard::from_bytes::<Message>(&bytes) {
                    Ok(m) => vec![m],
                    Err(_) => {
                        self.fuzzed = Some(Fuzzed::Undecodable);
                        return;
                    }
                }
            }
            3 => vec![msg.clone(), msg],
            _ => {
                sender = (from + 1 + self.rng.below((self.n as u64 - 1).max(1)) as usize) % self.n;
                vec![msg]
            }
        };
        self.fuzzed = Some(Fuzzed::Taken);
        for m in copies {
            let shown = format!("{m:?}");
            let node = &mut self.nodes[to].node;
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                node.handle_message(NodeId(sender as u16), m)?;
                // What it sends in answer travels too ([`Sim::aftermath`]).
                let mut out = Vec::new();
                while let Some(sent) = node.poll_transmit() {
                    out.push(sent);
                }
                Ok::<_, ProtocolError>(out)
            }));
            match r {
                Ok(Ok(out)) => {
                    for (dest, m) in out {
                        self.links[to * self.n + dest.idx()].push_back(m);
                    }
                }
                Ok(Err(_)) => {
                    self.fuzzed = Some(Fuzzed::Refused);
                    return;
                }
                Err(e) => {
                    let why = e.downcast_ref::<String>().cloned().unwrap_or_default();
                    panic!(
                        "seed {seed}: node {to} panicked ({why}) on corruption {how} from node {sender}: {shown}"
                    );
                }
            }
        }
    }
}

/// The default limits in half the runs; in the others, limits so small that a few pages of
/// 64 bytes reach them: pushes left out for too many pages, grants that carry only some of the
/// diffs they could, deferred notices at most barriers, requests of a page or two, replies cut
/// between diffs, pushes that leave pages out, grants and releases that send most of their
/// interval records ahead, and grants that carry the diffs of a page or three.
fn tiny_limits(pick: &mut Rng) -> Limits {
    if pick.chance(50) {
        return Limits::default();
    }
    Limits {
        push_max_pages: 1 + pick.below(2) as usize,
        piggyback_bytes: [16, 64, 256][pick.below(3) as usize],
        defer_notices_min: 1 + pick.below(3) as usize,
        first_request_pages: 1 + pick.below(2) as usize,
        pages_per_request: 1 + pick.below(3) as usize,
        reply_bytes: [1, 100, 400][pick.below(3) as usize],
        record_bytes: [1, 60, 300][pick.below(3) as usize],
        piggyback_pages: 1 + pick.below(3) as usize,
    }
}

/// The shape of random-program run `seed`.
fn program_shape(seed: u64) -> Shape {
    let mut pick = Rng(seed ^ 0x5eed);
    let mut shape = Shape {
        n: 1 + pick.below(4) as usize,
        words: WORDS_PER_PAGE * (1 + pick.below(4) as u32),
        nlocks: 1 + pick.below(3) as u32,
        phases: 1 + pick.below(6) as usize,
        gc_threshold: [u64::MAX, 0, 300, 2000][pick.below(4) as usize],
        push: pick.below(4) != 0,
        push_skip: pick.below(2) != 0,
        lock_bundle: [0, 1, 2, 8][pick.below(4) as usize],
        walks: false,
        skewed: pick.below(4) == 0,
        stream_min_pages: [0, 1, 2, 3][pick.below(4) as usize],
        limits: tiny_limits(&mut pick),
        racy: false,
        write_races: false,
    };
    // One run in sixteen on 5-8 nodes (drawn last: the other runs keep their shapes).
    if pick.below(16) == 0 {
        shape.n = 5 + pick.below(4) as usize;
    }
    shape
}

/// The shape of lock-walk run `seed`.
fn walk_shape(seed: u64) -> Shape {
    let mut pick = Rng(seed ^ 0xa1c);
    let nlocks = 4 + pick.below(29) as u32;
    Shape {
        n: 2 + pick.below(3) as usize,
        words: nlocks * (1 + pick.below(3) as u32),
        nlocks,
        phases: 2 + pick.below(5) as usize,
        gc_threshold: [u64::MAX, 300][pick.below(2) as usize],
        push: pick.below(2) != 0,
        push_skip: pick.below(2) != 0,
        lock_bundle: [1, 4, 8, 32][pick.below(4) as usize],
        walks: true,
        skewed: pick.below(2) == 0,
        stream_min_pages: 0,
        limits: tiny_limits(&mut pick),
        racy: false,
        write_races: false,
    }
}

fn run_seed(seed: u64) -> (Vec<ProtocolStats>, AppOps, MidStores) {
    run_shape(seed, program_shape(seed))
}

fn run_walk_seed(seed: u64) -> (Vec<ProtocolStats>, AppOps, MidStores) {
    run_shape(seed, walk_shape(seed))
}

/// Stores that ran in the middle of a service step ([`Sim::service`]): through the fault
/// handler's fast path, and while their page was copied, by the application thread or by
/// another thread while it waited in a view or a fault (`beside`).
#[derive(Debug, Default, Clone, Copy)]
struct MidStores {
    fast_path: u64,
    during_snapshot: u64,
    beside: u64,
}

/// A live allocation of the shared heap, by the node that made it.
#[derive(Debug, Clone, Copy)]
struct Allocation {
    node: usize,
    offset: u64,
    bytes: u64,
}

/// Operations of the simulated applications worth counting: views (validations) that needed
/// no message (run on the application thread), views taken holding a lock (their twins made
/// ahead are noticed in the lock's interval), distributed values taken, messages (other than
/// the exit's) a node handled while it waited in its exit, and allocations made.
#[derive(Debug, Default, Clone, Copy)]
struct AppOps {
    local_views: u64,
    views_under_lock: u64,
    distributes: u64,
    served_in_exit: u64,
    allocations: u64,
}

impl std::ops::AddAssign for AppOps {
    fn add_assign(&mut self, o: AppOps) {
        self.local_views += o.local_views;
        self.views_under_lock += o.views_under_lock;
        self.distributes += o.distributes;
        self.served_in_exit += o.served_in_exit;
        self.allocations += o.allocations;
    }
}

impl std::ops::AddAssign for MidStores {
    fn add_assign(&mut self, o: MidStores) {
        self.fast_path += o.fast_path;
        self.during_snapshot += o.during_snapshot;
        self.beside += o.beside;
    }
}

/// Runs one simulation; returns every node's counters, what the applications did and the
/// stores that ran in the middle of a service step.
fn run_shape(seed: u64, shape: Shape) -> (Vec<ProtocolStats>, AppOps, MidStores) {
    run_sim(seed, shape, |sim| (sim.stats(), sim.app_ops, sim.mid_stores))
}

/// Runs one simulation and returns what `take` reads from it at the end; a failure names the
/// seed, the shape and how to replay it.
fn run_sim<T>(seed: u64, shape: Shape, take: impl FnOnce(&Sim) -> T) -> T {
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut sim = Sim::new(seed, &shape);
        sim.run();
        take(&sim)
    }));
    match result {
        Ok(taken) => taken,
        Err(e) => {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            panic!(
                "simulation failed for seed {seed} ({} nodes, {} words, {} locks, {} phases, lock walks: {}, skewed links: {}, racy: {}, write races: {}): {}\nreplay: TMK_SIM_SEED={seed} cargo test -p treadmarks sim",
                shape.n,
                shape.words,
                shape.nlocks,
                shape.phases,
                shape.walks,
                shape.skewed,
                shape.racy,
                shape.write_races,
                msg.unwrap_or_default()
            )
        }
    }
}

impl Sim {
    /// Every node's counters.
    fn stats(&self) -> Vec<ProtocolStats> {
        self.nodes.iter().map(|sn| sn.node.stats().clone()).collect()
    }
}

/// The seeds to run: `TMK_SIM_SEEDS=<n>` (the first `n`) or `TMK_SIM_SEEDS=<a>..<b>` (to hunt
/// past the seeds run before), else the first `default`.
fn seeds(default: u64) -> std::ops::Range<u64> {
    seed_range("TMK_SIM_SEEDS", default)
}

/// The seeds environment variable `var` names (`<n>`: `0..n`; `<a>..<b>`), or `0..default`.
fn seed_range(var: &str, default: u64) -> std::ops::Range<u64> {
    let Ok(v) = std::env::var(var) else { return 0..default };
    let parse =
        |s: &str| s.trim().parse::<u64>().unwrap_or_else(|_| panic!("{var}={v}: not <n> or <a>..<b>"));
    let range = match v.split_once("..") {
        Some((a, b)) => parse(a)..parse(b),
        None => 0..parse(&v),
    };
    // An empty range would pass having checked nothing.
    assert!(range.start < range.end, "{var}={v}: no seed in that range");
    range
}

#[test]
fn random_data_race_free_programs_read_sequentially_consistent_values() {
    if let Some(seed) = std::env::var("TMK_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        run_seed(seed);
        return;
    }
    let mut totals = ProtocolStats::default();
    let (mut app_ops, mut mid) = (AppOps::default(), MidStores::default());
    // The suite runs 5,000 seeds (`seeds`).
    // Seeds past the usual range that once failed, run every time (since session 29 changed the
    // programs, as more seeds: the scenario
    // `a_copy_of_a_dropped_page_overwritten_whole_since_is_not_overlaid_with_what_it_superseded`
    // pins the bug). 171,461: a copy of a page a
    // collection dropped, from a node that had overwritten it whole, was taken as holding that
    // node's whole diff but not as superseding the older diffs the overwrite replaced, and one
    // was applied over it (`Node::serve_page`).
    for seed in seeds(5000).chain([171_461]) {
        let (stats, local, m) = run_seed(seed);
        app_ops += local;
        mid += m;
        for s in &stats {
            totals += s;
        }
    }
    eprintln!(
        "sim totals: {totals:?}, {app_ops:?}, stores in a \
         service step: {mid:?}"
    );
    if seeds(5000).count() < 5000 {
        return; // a hunt through a short range: the coverage below is for the suite's runs
    }
    assert!(
        app_ops.local_views > 1000
            && app_ops.views_under_lock > 500
            && app_ops.distributes > 1000
            && app_ops.served_in_exit > 500
            && app_ops.allocations > 1000,
        "{app_ops:?}"
    );
    assert!(
        mid.fast_path > 40 && mid.during_snapshot > 40 && mid.beside > 5,
        "stores in the middle of a service step: {mid:?}"
    );
    // The runs must actually exercise the protocol, or the oracle proves nothing.
    assert!(totals.diffs_applied > 1000, "{totals:?}");
    assert!(totals.fast_twins > 1000 && totals.twins > 1000, "{totals:?}");
    assert!(totals.lock_acquires_remote > 1000 && totals.invalidations > 1000, "{totals:?}");
    assert!(
        totals.validations > 500 && totals.diffs_piggybacked > 500 && totals.twins_ahead > 500,
        "{totals:?}"
    );
    assert!(
        totals.diffs_pushed > 500
            && totals.pushes_used > 500
            && totals.pushes_wasted > 100
            && totals.pushes_chained > 300
            && totals.pushes_in_place > 200,
        "{totals:?}"
    );
    assert!(
        totals.lock_tokens_bundled > 300 && totals.lock_tokens_received == totals.lock_tokens_bundled,
        "{totals:?}"
    );
    assert!(
        totals.collections > 500 && totals.pages_dropped > 100 && totals.page_requests_sent > 100,
        "{totals:?}"
    );
    assert!(totals.pages_overwritten > 100 && totals.diffs_superseded > 10, "{totals:?}");
    assert!(totals.twins_renewed > 1000 && totals.renewals_unfrozen > 500, "{totals:?}");
    assert!(
        totals.renewals_skipped > 300 && totals.twins_skipped > 300 && totals.pushes_skipped > 100,
        "{totals:?}"
    );
    assert!(totals.lock_acquires_local > 10_000 && totals.pages_served > 1000, "{totals:?}");
    assert!(totals.pages_backed > 1000, "{totals:?}");
    assert!(totals.streams > 1000 && totals.stream_waits > 200 && totals.settles > 300, "{totals:?}");
}

#[test]
fn lock_walks_with_bundled_grants_read_sequentially_consistent_values() {
    if let Some(seed) = std::env::var("TMK_SIM_SEED").ok().and_then(|s| s.parse().ok()) {
        run_walk_seed(seed);
        return;
    }
    let mut totals = ProtocolStats::default();
    // A fifth of the seeds of the others (the suite runs 1,000).
    let all = seeds(5000);
    for seed in all.start / 5..all.end.div_ceil(5) {
        for s in &run_walk_seed(seed).0 {
            totals += s;
        }
    }
    eprintln!("lock walk totals: {totals:?}");
    if all.count() < 5000 {
        return; // a hunt through a short range: the coverage below is for the suite's runs
    }
    // The runs must move many tokens in bundles, and send stale forwards back to managers.
    assert!(totals.lock_tokens_bundled > 20_000 && totals.lock_acquires_local > 20_000, "{totals:?}");
    assert_eq!(totals.lock_tokens_received, totals.lock_tokens_bundled);
    assert!(totals.lock_forwards_returned > 100 && totals.diffs_piggybacked > 1000, "{totals:?}");
}

#[test]
fn corrupted_messages_are_taken_or_refused_never_a_panic() {
    // `TMK_SIM_FUZZ=<n>` runs more, `TMK_SIM_FUZZ=<a>..<b>` a range (the suite runs 3,000).
    let range = seed_range("TMK_SIM_FUZZ", 3000);
    let seeds = range.end.saturating_sub(range.start);
    let mut outcomes = std::collections::BTreeMap::new();
    for seed in range {
        // Random programs, lock walks and racy programs in turn, on every shape they run on.
        let shape = match seed % 3 {
            0 => program_shape(seed),
            1 => walk_shape(seed),
            _ => racy_shape(seed),
        };
        let mut pick = Rng(seed ^ 0xf022);
        let mut sim = Sim::new(seed, &shape);
        // One run in four (of any kind) corrupts a message of the exit, where the others
        // stop sooner.
        if pick.below(4) == 0 && shape.n > 1 {
            // An arrival from each node but node 0, then a release to each.
            sim.fuzz_exit_at = Some(pick.below(2 * (shape.n as u64 - 1)));
        } else {
            sim.fuzz_at = Some(pick.below(400));
        }
        sim.run();
        if let Some(f) = sim.fuzzed {
            *outcomes.entry(format!("{f:?}")).or_insert(0u64) += 1;
        }
    }
    eprintln!("corrupted messages: {outcomes:?}");
    // The corruptions must reach the protocol, both as messages it refuses and ones it takes.
    let count = |k: &str| outcomes.get(k).copied().unwrap_or(0);
    assert!(count("Refused") > seeds / 4 && count("Taken") > seeds / 20, "{outcomes:?}");
}

/// The happened-before oracle of racy programs: vector clocks kept at the application's level
/// (a release orders what came before it at the releaser before the lock's next acquire; a
/// barrier orders every arrival before every departure), and every word's history of writes.
/// Unless write-write races run (`Shape::write_races`), a write runs only if the word's last
/// write happened before it (a program's write that races with another write is skipped), so
/// each word's writes are totally ordered by happened-before; reads may race. A read must
/// return the last write that happened before it, or a later one (concurrent with the read),
/// never an older one: with no race, exactly one value.
///
/// A word two concurrent writes touched (a declaration that its page is overwritten counts as a
/// write of it, [`Hb::overwrite`]) is *raced* from then on, and a read of it is judged byte by
/// byte: each byte must be one that some write of the word (or its initial zero) put there. No more
/// can be asked of LRC with multiple writers, for two reasons. Diffs are exact to the byte, so two
/// concurrent writers' diffs of a word, applied in either order, leave a mix of their bytes, and
/// two nodes may apply them in different orders and keep different values (until a diff of the
/// whole page replaces them). And a later writer whose copy already holds, by such a race, the byte
/// it writes leaves that byte out of its diff, so a node that applies its diff but not the racing
/// one can keep a byte older than writes that happened before its read. The check still catches a
/// byte out of thin air: from another word, torn off a diff or put at the wrong place.
struct Hb {
    /// Per node, its vector clock.
    vc: Vec<Vec<u32>>,
    /// Per lock, the clock its last release left.
    lock_vc: Vec<Vec<u32>>,
    /// Per barrier episode, the arrivals' clocks.
    arrivals: Vec<Vec<Vec<u32>>>,
    /// Per node, the barrier episodes it has passed.
    episode: Vec<usize>,
    /// Per word, its writes in order: (value, node, the node's own clock then).
    hist: Vec<Vec<(u32, usize, u32)>>,
    /// Pages declared overwritten: (page, node, the node's own clock then).
    overwrites: Vec<(PageIdx, usize, u32)>,
    /// Per word, whether two of its writes (an overwrite declaration of its page counting as
    /// one) were concurrent: its reads are judged byte by byte from then on.
    raced: Vec<bool>,
    skipped_writes: u64,
    /// Writes that raced with an earlier write of their word or an overwrite of its page, and ran.
    racing_writes: u64,
    /// Reads of raced words.
    raced_reads: u64,
    /// Reads of other words on a page another node is overwriting, unseen ([`Hb::overwriting`]).
    overwriting_reads: u64,
    reads: u64,
    exact_reads: u64,
}

impl Hb {
    fn new(n: usize, nlocks: usize, words: usize) -> Hb {
        let vc = (0..n).map(|i| (0..n).map(|j| u32::from(i == j)).collect()).collect();
        Hb {
            vc,
            lock_vc: vec![vec![0; n]; nlocks],
            arrivals: Vec::new(),
            episode: vec![0; n],
            hist: vec![Vec::new(); words],
            overwrites: Vec::new(),
            raced: vec![false; words],
            skipped_writes: 0,
            racing_writes: 0,
            raced_reads: 0,
            overwriting_reads: 0,
            reads: 0,
            exact_reads: 0,
        }
    }
    fn join(a: &mut [u32], b: &[u32]) {
        for (x, y) in a.iter_mut().zip(b) {
            *x = (*x).max(*y);
        }
    }
    fn seen(&self, i: usize, node: usize, clock: u32) -> bool {
        node == i || self.vc[i][node] >= clock
    }
    fn acquired(&mut self, i: usize, l: usize) {
        let lv = self.lock_vc[l].clone();
        Self::join(&mut self.vc[i], &lv);
    }
    fn released(&mut self, i: usize, l: usize) {
        let v = self.vc[i].clone();
        Self::join(&mut self.lock_vc[l], &v);
        self.vc[i][i] += 1;
    }
    fn arrive(&mut self, i: usize) {
        let ep = self.episode[i];
        if self.arrivals.len() <= ep {
            self.arrivals.resize(ep + 1, Vec::new());
        }
        let v = self.vc[i].clone();
        self.arrivals[ep].push(v);
        self.vc[i][i] += 1;
    }
    fn pass(&mut self, i: usize) {
        let ep = self.episode[i];
        let all = self.arrivals[ep].clone();
        assert_eq!(all.len(), self.vc.len(), "passed a barrier before everybody arrived");
        for v in &all {
            Self::join(&mut self.vc[i], v);
        }
        self.episode[i] += 1;
    }
    /// Node `i` declares page `p` overwritten: it writes every word of it next, without
    /// fetching the writes it has not seen (`Node::request_overwrite`). Its whole diff of the
    /// page may be cut before it has written every word, and then holds its stale copy of the
    /// others: so the declaration races, as a write of every word of the page, with the words'
    /// writes it has not seen (and, in [`Hb::wrote`], with writes that have not seen it).
    fn overwrite(&mut self, i: usize, p: PageIdx) {
        for w in page_words(p.0, self.hist.len() as u32) {
            if !self.write_ok(i, w as usize) {
                self.raced[w as usize] = true;
            }
        }
        self.overwrites.push((p, i, self.vc[i][i]));
    }
    /// Whether another node overwrites page `p` in an interval node `i` has not seen: until
    /// it has, `i`'s copy of the page may hold that node's stale bytes where it has not written
    /// yet (a copy of the page served meanwhile takes them, in place of writes the overwrite
    /// supersedes, older than the words' last writes `i` knows of). Only a read that races with
    /// the overwrite could see them: a data-race-free program reads none.
    fn overwriting(&self, i: usize, p: PageIdx) -> bool {
        self.overwrites.iter().any(|&(q, n, c)| q == p && n != i && !self.seen(i, n, c))
    }
    fn write_ok(&self, i: usize, w: usize) -> bool {
        self.hist[w].last().is_none_or(|&(_, n, c)| self.seen(i, n, c))
    }
    fn wrote(&mut self, i: usize, w: usize, v: u32) {
        if !self.write_ok(i, w) || self.overwriting(i, locate(w as u32).0) {
            self.raced[w] = true;
            self.racing_writes += 1;
        }
        let c = self.vc[i][i];
        self.hist[w].push((v, i, c));
    }
    /// How a read of word `w` at node `i` is judged now: in a raced word, byte by byte; on a page
    /// another node is overwriting meanwhile ([`Hb::overwriting`]), against any value written
    /// there; else against the values [`Hb::allowed`] names.
    fn rule(&self, i: usize, w: usize) -> ReadRule {
        if self.raced[w] {
            ReadRule::Bytes
        } else if self.overwriting(i, locate(w as u32).0) {
            ReadRule::AnyWritten
        } else {
            ReadRule::Values(self.allowed(i, w).0)
        }
    }
    /// Whether node `i` may read `got` in word `w` now ([`Hb::rule`]); byte by byte, each byte
    /// must be one some write of the word put there, at its place, or zero.
    fn allows(&self, i: usize, w: usize, got: u32) -> bool {
        let hist = &self.hist[w];
        match self.rule(i, w) {
            ReadRule::Bytes => {
                let written = |k: usize, b: u8| b == 0 || hist.iter().any(|e| e.0.to_ne_bytes()[k] == b);
                got.to_ne_bytes().iter().enumerate().all(|(k, &b)| written(k, b))
            }
            ReadRule::AnyWritten => got == 0 || hist.iter().any(|e| e.0 == got),
            ReadRule::Values(values) => values.contains(&got),
        }
    }
    /// Word `w`'s writes, for a failure's message.
    fn history(&self, w: usize) -> String {
        let writes: Vec<String> =
            self.hist[w].iter().map(|&(v, n, c)| format!("{v:#x} by node {n} at its clock {c}")).collect();
        format!("[{}]", writes.join(", "))
    }
    /// What [`Hb::allows`] allows, for a failure's message.
    fn describe(&self, i: usize, w: usize) -> String {
        match self.rule(i, w) {
            ReadRule::Bytes => "any byte of the word's writes (a write-write race)".into(),
            ReadRule::AnyWritten => "any value written there (another node is overwriting the page)".into(),
            ReadRule::Values(values) => format!("{values:x?}"),
        }
    }
    /// The values a read of `w` at node `i` may return, and whether that is exactly one.
    fn allowed(&self, i: usize, w: usize) -> (Vec<u32>, bool) {
        let h = &self.hist[w];
        let k = h.iter().rposition(|&(_, n, c)| self.seen(i, n, c));
        let mut vals: Vec<u32> = match k {
            Some(k) => h[k..].iter().map(|e| e.0).collect(),
            None => std::iter::once(0).chain(h.iter().map(|e| e.0)).collect(),
        };
        vals.dedup();
        let exact = vals.len() == 1;
        (vals, exact)
    }
}

/// How [`Hb`] judges a read ([`Hb::rule`]).
enum ReadRule {
    /// A raced word: each byte one some write of it put there, or zero.
    Bytes,
    /// Another node is overwriting the page, unseen: any value written to the word, or zero.
    AnyWritten,
    /// One of these values.
    Values(Vec<u32>),
}

/// Random racy programs whose accesses cross locks: any word read or written anywhere, outside
/// any lock or under any (nested locks taken in order), so that writes reach readers through
/// chains of different locks and through barriers; the writes that race with a write run with
/// `write_races`, where they are skipped otherwise ([`Hb`]). With `write_races`, programs also
/// declare any page overwritten (racing with every other node's writes to it) and then write
/// all its words.
fn generate_racy(rng: &mut Rng, s: &Shape) -> Vec<Vec<Op>> {
    let mut progs = vec![Vec::new(); s.n];
    let mut counter = 0u32;
    let npages = s.words.div_ceil(WORDS_PER_PAGE);
    for phase in 0..s.phases {
        for prog in progs.iter_mut() {
            for _ in 0..rng.below(30) {
                // Drawn only with `write_races`: other runs keep their programs.
                if s.write_races && rng.chance(8) {
                    let q = rng.below(u64::from(npages)) as u32;
                    push_overwrite(rng, s, prog, &mut counter, q);
                }
                if rng.chance(10) {
                    let first = rng.below(u64::from(npages)) as u32;
                    prog.push(Op::Validate(first, 1 + rng.below(u64::from(npages - first)) as u32));
                }
                let w = rng.below(u64::from(s.words)) as u32;
                if rng.chance(45) {
                    let a = rng.below(u64::from(s.nlocks)) as u32;
                    let b = rng.below(u64::from(s.nlocks)) as u32;
                    let mut ls = vec![a.min(b)];
                    if a != b && rng.chance(40) {
                        ls.push(a.max(b));
                    }
                    for &l in &ls {
                        prog.push(Op::Acquire(LockId(l)));
                    }
                    if rng.chance(15) {
                        let first = rng.below(u64::from(npages)) as u32;
                        prog.push(Op::Validate(first, 1 + rng.below(u64::from(npages - first)) as u32));
                    }
                    for _ in 0..rng.below(5) {
                        let w = rng.below(u64::from(s.words)) as u32;
                        counter += 1;
                        prog.push(if rng.chance(50) { Op::Write(w, value(counter)) } else { Op::Read(w) });
                    }
                    for &l in ls.iter().rev() {
                        prog.push(Op::Release(LockId(l)));
                    }
                } else {
                    counter += 1;
                    prog.push(if rng.chance(40) { Op::Write(w, value(counter)) } else { Op::Read(w) });
                }
            }
            prog.push(Op::Barrier(BarrierId((phase % 3) as u32)));
        }
    }
    for prog in &mut progs {
        prog.extend((0..s.words).map(Op::Read));
        prog.push(Op::Exit);
    }
    progs
}

/// The shape of racy-program run `seed`: a random program's, on 2-4 nodes with up to 4 locks,
/// one run in sixteen on 5-8 nodes; in half the runs write-write races run.
fn racy_shape(seed: u64) -> Shape {
    let mut pick = Rng(seed ^ 0xd1a);
    let (mut n, nlocks) = (2 + pick.below(3) as usize, 1 + pick.below(4) as u32);
    // Drawn last: the other runs keep their shapes.
    if pick.below(16) == 0 {
        n = 5 + pick.below(4) as usize;
    }
    let write_races = pick.below(2) == 0;
    Shape { n, nlocks, racy: true, write_races, ..program_shape(seed ^ 0xd1a) }
}

#[test]
fn racy_programs_across_locks_read_values_happened_before_allows() {
    let (from, to) = match std::env::var("TMK_SIM_SEED").ok().and_then(|s| s.parse::<u64>().ok()) {
        Some(seed) => (seed, seed + 1),
        // The suite runs 5,000 seeds (`seeds`).
        None => (seeds(5000).start, seeds(5000).end),
    };
    let (mut reads, mut exact, mut skipped, mut mid) = (0, 0, 0, MidStores::default());
    let (mut racing, mut raced_reads, mut overwriting_reads) = (0, 0, 0);
    let mut totals = ProtocolStats::default();
    // Seeds past the usual range that once failed, run every time (since session 29 changed the
    // programs, as more seeds: the scenario
    // `a_copy_of_a_dropped_page_is_not_overlaid_with_an_older_diff_it_holds` pins the bug).
    // 60,304: a copy of a page a
    // collection dropped, served with a newer write than the requester knew of, had an older
    // diff it already held applied over it, and a racing read got half of each value
    // (`Node::serve_page`).
    let regressions = if to - from > 1 { &[60_304][..] } else { &[] };
    for seed in (from..to).chain(regressions.iter().copied()) {
        let (r, e, k, f, stats, races) = run_sim(seed, racy_shape(seed), |sim| {
            let hb = &sim.hb;
            let races = (hb.racing_writes, hb.raced_reads, hb.overwriting_reads);
            (hb.reads, hb.exact_reads, hb.skipped_writes, sim.mid_stores, sim.stats(), races)
        });
        (reads, exact, skipped) = (reads + r, exact + e, skipped + k);
        (racing, raced_reads) = (racing + races.0, raced_reads + races.1);
        overwriting_reads += races.2;
        mid += f;
        for s in &stats {
            totals += s;
        }
    }
    eprintln!(
        "racy: reads {reads}, exact {exact}, writes skipped {skipped}, racing writes run {racing}, \
         reads of raced words {raced_reads}, of others on a page being overwritten \
         {overwriting_reads}, stores in a service step {mid:?}; totals {totals:?}"
    );
    if to - from < 5000 {
        return; // a replay, or a hunt through a short range: the coverage is for the suite's runs
    }
    // The runs must race (reads with several allowed values, writes skipped) and move data
    // through the protocol's every path, or the oracle proves little.
    assert!(
        reads > 100_000 && exact < reads && exact > reads / 2 && skipped > 1000,
        "{reads} {exact} {skipped}"
    );
    // A quarter of what the suite's runs showed when these floors were set (session 33).
    assert!(
        racing > 60_000 && raced_reads > 90_000 && overwriting_reads > 4_000,
        "{racing} {raced_reads} {overwriting_reads}"
    );
    assert!(totals.pages_overwritten > 600 && totals.diffs_superseded > 1500, "{totals:?}");
    assert!(totals.diffs_applied > 10_000 && totals.diffs_piggybacked > 10_000, "{totals:?}");
    assert!(totals.lock_acquires_remote > 10_000 && totals.fast_twins > 10_000, "{totals:?}");
    assert!(
        totals.pushes_used > 1000 && totals.pushes_in_place > 100 && totals.collections > 100,
        "{totals:?}"
    );
    assert!(totals.streams > 500 && totals.lock_tokens_bundled > 100, "{totals:?}");
    assert!(
        mid.fast_path > 40 && mid.during_snapshot > 40 && mid.beside > 5,
        "stores in the middle of a service step: {mid:?}"
    );
}
