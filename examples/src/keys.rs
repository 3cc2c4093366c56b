//! Reproducible pseudo-random keys for the sorting apps (`qsort`, `is`, `radix`).
//!
//! Key `i` is a pure function of the seed and `i` (a counter-based generator: SplitMix64's
//! finalizer of `seed + i`), so each node or thread generates exactly its own contiguous range of
//! the input, and the sequential check regenerates the whole input, without passing a generator
//! state around.

/// One 64-bit pseudo-random value for counter `i` (SplitMix64).
pub fn mix(seed: u64, i: u64) -> u64 {
    let mut z = seed.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `out` with keys `start..start + out.len()`, uniform over all `u32`s.
pub fn fill_uniform(out: &mut [u32], start: usize, seed: u64) {
    for (k, o) in out.iter_mut().enumerate() {
        *o = (mix(seed, (start + k) as u64) >> 32) as u32;
    }
}

/// The whole input of `n` uniform keys.
pub fn uniform(n: usize, seed: u64) -> Vec<u32> {
    let mut v = vec![0; n];
    fill_uniform(&mut v, 0, seed);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_agree_with_the_whole() {
        let all = uniform(1000, 7);
        let mut part = vec![0; 300];
        fill_uniform(&mut part, 500, 7);
        assert_eq!(part, all[500..800]);
        assert_ne!(uniform(10, 7), uniform(10, 8));
    }
}
