//! [`TwinRing`]: the single-producer/single-consumer queue of pages twinned by the signal handler.
//!
//! Producer: the fault handler on the application thread ([`TwinRing::push`], lock-free, no
//! allocation). Consumer: whichever runtime thread holds the node at the time, the service thread
//! or the application thread running a lock operation itself ([`TwinRing::drain`]; the node's
//! mutex orders the drains).
//!
//! A per-page `queued` flag keeps every page in the ring at most once: `push` only enqueues a
//! page whose flag it flipped from false to true, and `drain` clears the flag after removing the
//! page. So the ring never holds more than `npages` entries and can never be full, even if a page
//! is revoked and re-twinned several times between two drains.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use crate::protocol::ids::PageIdx;

/// See the module docs.
#[derive(Debug)]
pub(super) struct TwinRing {
    slots: Box<[AtomicU32]>,
    queued: Box<[AtomicBool]>,
    /// Next slot to pop (consumer-owned). Monotonic; the slot is `head % slots.len()`.
    head: AtomicUsize,
    /// Next slot to push (producer-owned). Monotonic.
    tail: AtomicUsize,
    /// Set while a drain runs, to catch two consumers.
    draining: AtomicBool,
}

impl TwinRing {
    /// A ring for pages `0..npages`, preallocated.
    pub(super) fn new(npages: u32) -> Self {
        let n = npages as usize;
        TwinRing {
            slots: (0..n.max(1)).map(|_| AtomicU32::new(0)).collect(),
            queued: (0..n).map(|_| AtomicBool::new(false)).collect(),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
        }
    }

    /// Enqueues `page` unless it is already queued. Async-signal-safe. Must only be called by
    /// one thread at a time (the application thread's fault handler).
    pub(super) fn push(&self, page: u32) {
        if self.queued[page as usize].swap(true, Ordering::AcqRel) {
            return;
        }
        let tail = self.tail.load(Ordering::Relaxed);
        let head = self.head.load(Ordering::Acquire);
        // Cannot be full: at most one entry per page (module docs). Checked anyway, since a
        // corrupted ring would be worse than a missed twin report.
        if tail.wrapping_sub(head) >= self.slots.len() {
            return;
        }
        self.slots[tail % self.slots.len()].store(page, Ordering::Relaxed);
        self.tail.store(tail.wrapping_add(1), Ordering::Release);
    }

    /// Whether `page` is queued (a twin the handler made that no drain has taken yet).
    pub(super) fn is_queued(&self, page: u32) -> bool {
        self.queued[page as usize].load(Ordering::Acquire)
    }

    /// Pops every page queued when the drain starts, calling `f` on each. Panics if two threads
    /// drain at once (a bug in the caller: the runtime drains only while it holds the node).
    pub(super) fn drain(&self, mut f: impl FnMut(PageIdx)) {
        // Nothing queued (most drains: every lock operation drains first): no read-modify-write.
        if self.head.load(Ordering::Relaxed) == self.tail.load(Ordering::Acquire) {
            return;
        }
        assert!(
            !self.draining.swap(true, Ordering::Acquire),
            "Heap::drain_fast_twins called from two threads at once (drain only while holding the node)"
        );
        struct Done<'a>(&'a AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _done = Done(&self.draining);
        let mut head = self.head.load(Ordering::Relaxed);
        let tail = self.tail.load(Ordering::Acquire);
        while head != tail {
            let page = self.slots[head % self.slots.len()].load(Ordering::Relaxed);
            head = head.wrapping_add(1);
            self.head.store(head, Ordering::Release);
            // Queued until the node has heard of it: a fault meanwhile keeps this twin
            // (`Heap::twin_at_fault`), and a push of the page, the same twin, is not needed.
            f(PageIdx(page));
            self.queued[page as usize].store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drained(ring: &TwinRing) -> Vec<u32> {
        let mut v = Vec::new();
        ring.drain(|p| v.push(p.0));
        v
    }

    #[test]
    fn each_page_once_between_drains() {
        let ring = TwinRing::new(3);
        for p in [2, 0, 2, 1, 0, 2] {
            ring.push(p);
        }
        assert_eq!(drained(&ring), vec![2, 0, 1]);
        assert_eq!(drained(&ring), Vec::<u32>::new());
        for round in 0..10 {
            ring.push(round % 3);
            ring.push((round + 1) % 3);
            assert_eq!(drained(&ring), vec![round % 3, (round + 1) % 3]);
        }
    }

    #[test]
    fn concurrent_producer_consumer_loses_nothing() {
        let ring = std::sync::Arc::new(TwinRing::new(64));
        let seen = std::sync::Arc::new((0..64).map(|_| AtomicUsize::new(0)).collect::<Vec<_>>());
        let producer = {
            let ring = ring.clone();
            std::thread::spawn(move || {
                for i in 0..200_000u32 {
                    ring.push(i % 64);
                }
            })
        };
        let mut total = 0usize;
        while !producer.is_finished() {
            ring.drain(|p| {
                seen[p.idx()].fetch_add(1, Ordering::Relaxed);
                total += 1;
            });
        }
        producer.join().unwrap();
        ring.drain(|p| {
            seen[p.idx()].fetch_add(1, Ordering::Relaxed);
            total += 1;
        });
        // Every page was pushed, so every page was drained at least once.
        assert!(seen.iter().all(|c| c.load(Ordering::Relaxed) >= 1));
        assert!(total <= 200_000);
    }
}
