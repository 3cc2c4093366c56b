//! `cargo bench -p treadmarks-benches --bench diff`: what making and applying a diff costs, per
//! page, against copying the page.
//!
//! A writer diffs every page a peer asks for (`Diff::make`, twin against page) and the reader
//! applies each diff (`Diff::apply`); both run on the service threads, on the CPUs the
//! applications compute on. Four kinds of page, each a set of 4 KiB pages diffed against their
//! twins, in rounds (the pages stay in the cache, as a served run of pages does not: these are
//! the runtime's own costs, without cache misses):
//!
//! - **fill**: random 32-bit keys written over a zero page (a sort's input, qsort's and radix's
//!   first pass): every word changes, one in ~32 keeps a zero byte by chance;
//! - **swap**: random keys, half of them replaced (a partition): words change in 4, 8 or 0 of
//!   their bytes;
//! - **converge**: doubles changing their two low bytes (Jacobi, SOR near convergence);
//! - **sparse**: 1 word in 64 rewritten (a few fields of a structure).
//!
//! Each figure is reported beside a copy of the same pages (`copy_from_slice`, timed in the
//! same run, in rounds of its own), so the ratio says what diffing costs over the least any
//! transfer must do. Applying needs a fresh twin each time: a round copies the twins into a
//! scratch page and applies the diffs to it, right after a round of the copy alone; `apply` is
//! the median of those pairs' differences (negative when the apply is below the copy's noise). Without
//! `--bench` (e.g. under `cargo test --benches`) it runs fewer rounds, as a smoke run. Timings
//! are reported, never asserted.

#![forbid(unsafe_code)]

use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;
use treadmarks::protocol::diff::Diff;

const PAGE: usize = 4096;
const PAGES: usize = 256;

/// A xorshift generator: the same pages every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// `PAGES` (twin, page) pairs of one kind.
fn pages(kind: &str, rng: &mut Rng) -> Vec<(Vec<u8>, Vec<u8>)> {
    let keys = |rng: &mut Rng| -> Vec<u8> {
        (0..PAGE / 4).flat_map(|_| (rng.next() as u32).to_le_bytes()).collect()
    };
    (0..PAGES)
        .map(|_| match kind {
            "fill" => (vec![0; PAGE], keys(rng)),
            "swap" => {
                let twin = keys(rng);
                let mut page = twin.clone();
                for key in page.chunks_exact_mut(4) {
                    let r = rng.next();
                    if r & 1 == 0 {
                        key.copy_from_slice(&((r >> 32) as u32).to_le_bytes());
                    }
                }
                (twin, page)
            }
            "converge" => {
                let twin: Vec<u8> =
                    (0..PAGE / 8).flat_map(|i| (1.0 + i as f64 / 512.0).to_le_bytes()).collect();
                let mut page = twin.clone();
                for word in page.chunks_exact_mut(8) {
                    word[0] ^= 1 + (rng.next() % 255) as u8;
                    word[1] ^= 1 + (rng.next() % 255) as u8;
                }
                (twin, page)
            }
            _ => {
                let twin = keys(rng);
                let mut page = twin.clone();
                for word in page.chunks_exact_mut(8).step_by(64) {
                    word.copy_from_slice(&rng.next().to_le_bytes());
                }
                (twin, page)
            }
        })
        .collect()
}

/// Nanoseconds per page of one round of `f` over every pair (`f` is given the pair's index).
fn round(set: &[(Vec<u8>, Vec<u8>)], mut f: impl FnMut(usize, &[u8], &[u8])) -> f64 {
    let t = Instant::now();
    for (k, (twin, page)) in set.iter().enumerate() {
        f(k, twin, page);
    }
    t.elapsed().as_secs_f64() * 1e9 / set.len() as f64
}

/// The median of `xs` (the upper one of an even count).
fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() -> ExitCode {
    let rounds = if std::env::args().any(|a| a == "--bench") { 200 } else { 3 };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    println!(
        "treadmarks diff: {PAGES} pages of {PAGE} bytes per kind, medians of {rounds} rounds, ns per page"
    );
    println!(
        "{:<9} {:>8} {:>7} {:>7} {:>7} {:>11} {:>12}",
        "kind", "bytes", "copy", "make", "apply", "make/copy", "apply/copy"
    );
    for kind in ["fill", "swap", "converge", "sparse"] {
        let set = pages(kind, &mut rng);
        let diffs: Vec<Diff> = set.iter().map(|(twin, page)| Diff::make(twin, page)).collect();
        // Every diff turns its twin into its page: a bench of wrong diffs measures nothing.
        for ((twin, page), d) in set.iter().zip(&diffs) {
            let mut t = twin.clone();
            if d.apply(&mut t).is_err() || t != *page {
                eprintln!("treadmarks-benches diff: a {kind} diff does not rebuild its page");
                return ExitCode::FAILURE;
            }
        }
        let bytes = diffs.iter().map(Diff::encoded_len).sum::<usize>() / PAGES;
        let mut scratch = vec![0u8; PAGE];
        let mut applies = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            let copy = round(&set, |_, _, page| {
                scratch.copy_from_slice(page);
                black_box(&scratch);
            });
            let copy_apply = round(&set, |k, twin, _| {
                scratch.copy_from_slice(twin);
                let _ = black_box(diffs[k].apply(&mut scratch));
            });
            // The apply round copies the twin in first: that copy is not the diff's.
            applies.push(copy_apply - copy);
        }
        // The copy column as before, in rounds of its own (the pages then stay in the caches);
        // the paired copies only take the twin's copy off the apply.
        let apply = median(applies);
        let copy = median(
            (0..rounds)
                .map(|_| {
                    round(&set, |_, _, page| {
                        scratch.copy_from_slice(page);
                        black_box(&scratch);
                    })
                })
                .collect(),
        );
        let make = median(
            (0..rounds)
                .map(|_| {
                    round(&set, |_, twin, page| {
                        black_box(Diff::make(twin, page));
                    })
                })
                .collect(),
        );
        println!(
            "{kind:<9} {bytes:>8} {copy:>7.0} {make:>7.0} {apply:>7.0} {:>11.2} {:>12.2}",
            make / copy,
            apply / copy
        );
    }
    ExitCode::SUCCESS
}
