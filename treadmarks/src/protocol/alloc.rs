//! The shared-heap allocator. It lives on node 0 only, in the runtime's private memory, never in
//! the application view: other nodes ask node 0 with `AllocRequest`. First fit over a map of free
//! ranges, coalescing on free. Offsets are relative to the heap base.

use super::msg::AllocFailure;
use std::collections::BTreeMap;

/// First-fit allocator over `[0, size)`.
#[derive(Debug, Clone)]
pub struct Allocator {
    free: BTreeMap<u64, u64>,
    live: BTreeMap<u64, u64>,
    /// The end of the highest allocation ever made.
    high_water: u64,
}

impl Allocator {
    /// An allocator for a heap of `size` bytes.
    pub fn new(size: u64) -> Self {
        Allocator { free: BTreeMap::from([(0, size)]), live: BTreeMap::new(), high_water: 0 }
    }

    /// The end of the highest allocation ever made: no byte at or past it was ever handed out.
    pub fn high_water(&self) -> u64 {
        self.high_water
    }

    /// Allocates `bytes` aligned to `align` (a power of two); returns the offset.
    pub fn alloc(&mut self, bytes: u64, align: u64) -> Result<u64, AllocFailure> {
        if bytes == 0 || !align.is_power_of_two() {
            return Err(AllocFailure::Invalid { bytes, align });
        }
        let fit = self.free.iter().find_map(|(&start, &len)| {
            let at = start.checked_add(align - 1)? & !(align - 1);
            (at.checked_add(bytes)? <= start + len).then_some((start, len, at))
        });
        let Some((start, len, at)) = fit else {
            let largest_free = self.free.values().copied().max().unwrap_or(0);
            return Err(AllocFailure::OutOfMemory { requested: bytes, largest_free });
        };
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        if at + bytes < start + len {
            self.free.insert(at + bytes, start + len - at - bytes);
        }
        self.live.insert(at, bytes);
        self.high_water = self.high_water.max(at + bytes);
        Ok(at)
    }

    /// Frees the allocation starting at `offset`.
    pub fn free(&mut self, offset: u64) -> Result<(), AllocFailure> {
        let mut len = self.live.remove(&offset).ok_or(AllocFailure::NotAllocated { offset })?;
        let mut start = offset;
        if let Some((&next, &nlen)) = self.free.range(offset + len..).next()
            && next == offset + len
        {
            self.free.remove(&next);
            len += nlen;
        }
        if let Some((&prev, &plen)) = self.free.range(..offset).next_back()
            && prev + plen == offset
        {
            self.free.remove(&prev);
            start = prev;
            len += plen;
        }
        self.free.insert(start, len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_aligned_disjoint_and_reusable() {
        let mut a = Allocator::new(1 << 20);
        let x = a.alloc(100, 8).unwrap();
        let y = a.alloc(4096, 4096).unwrap();
        let z = a.alloc(8, 8).unwrap();
        assert_eq!(y % 4096, 0);
        assert!(x + 100 <= y && (z >= y + 4096 || z + 8 <= y));
        a.free(y).unwrap();
        a.free(x).unwrap();
        a.free(z).unwrap();
        assert_eq!(a.high_water(), y + 4096, "frees keep the mark");
        assert_eq!(a.alloc(1 << 20, 8).unwrap(), 0, "everything coalesced");
        assert_eq!(a.high_water(), 1 << 20);
    }

    #[test]
    fn exhaustion_and_bad_requests_are_errors_naming_the_values() {
        let mut a = Allocator::new(8192);
        a.alloc(4096, 8).unwrap();
        let e = a.alloc(8192, 8).unwrap_err();
        assert_eq!(e, AllocFailure::OutOfMemory { requested: 8192, largest_free: 4096 });
        assert!(e.to_string().contains("8192 bytes requested"));
        assert!(matches!(a.alloc(8, 3), Err(AllocFailure::Invalid { .. })));
        assert!(matches!(a.free(12), Err(AllocFailure::NotAllocated { offset: 12 })));
    }
}
