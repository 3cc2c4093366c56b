//! Byte-wise comparison of two equal-length buffers, a SIMD kernel for the diff code.
//!
//! [`Diff::make`](crate::protocol::diff::Diff::make) needs, for every 8-byte word of a page,
//! which of its bytes differ from the twin. Scalar bit tricks cost about a nanosecond per word;
//! SSE2 (part of the x86_64 baseline) compares 16 bytes and gathers their equality bits in three
//! instructions, about five times faster; AVX-512BW (checked at run time) compares 64 bytes into
//! a 64-bit mask that is eight words' masks as they lie, which took a page's masks from ~116 to
//! ~30 ns on the 2-vCPU VM. The intrinsics are `unsafe` to call, so the kernels live here, behind
//! safe functions; other targets use the portable fallback. [`word_sets`] then sorts the words
//! by their masks into bit sets (64 masks a compare with AVX-512BW), so that the encoder finds
//! runs by bit search instead of a data-dependent branch per word.

/// For each 8-byte word `i` of `a` and `b`, sets `masks[i]` bit `k` if byte `k` of the word
/// differs.
///
/// # Panics
///
/// If `a` and `b` differ in length, their length is not a multiple of 8, or `masks` does not
/// have one byte per word.
pub fn changed_byte_masks(a: &[u8], b: &[u8], masks: &mut [u8]) {
    assert_eq!(a.len(), b.len(), "changed_byte_masks of buffers of different sizes");
    assert!(a.len().is_multiple_of(8), "changed_byte_masks of {} bytes, not whole words", a.len());
    assert_eq!(masks.len(), a.len() / 8, "changed_byte_masks needs one mask byte per word");
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if avx512bw() {
        done = a.len() / 64 * 64;
        // SAFETY: `avx512bw` checked at run time that the CPU has the features the kernel is
        // compiled for.
        unsafe { masks_avx512(&a[..done], &b[..done], &mut masks[..done / 8]) };
    }
    let pairs = done + (a.len() - done) / 16 * 16;
    simd_pairs(&a[done..pairs], &b[done..pairs], &mut masks[done / 8..pairs / 8]);
    portable(&a[pairs..], &b[pairs..], &mut masks[pairs / 8..]);
}

/// Whether this CPU has AVX-512BW, whose byte compares yield a bit per byte: a 64-byte compare
/// gives eight words' masks at once, as they lie (about four times the SSE2 kernel's speed).
#[cfg(target_arch = "x86_64")]
fn avx512bw() -> bool {
    std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512bw")
}

/// [`changed_byte_masks`] of whole 64-byte blocks: bit `8w + k` of a block's not-equal mask is
/// byte `k` of its word `w`, so the mask's little-endian bytes are the words' masks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn masks_avx512(a: &[u8], b: &[u8], masks: &mut [u8]) {
    use std::arch::x86_64::{_mm512_cmpneq_epi8_mask, _mm512_loadu_si512};
    for ((ca, cb), m) in a.chunks_exact(64).zip(b.chunks_exact(64)).zip(masks.chunks_exact_mut(8)) {
        // SAFETY: `ca` and `cb` are 64 bytes each; `loadu` needs no alignment.
        let (va, vb) =
            unsafe { (_mm512_loadu_si512(ca.as_ptr().cast()), _mm512_loadu_si512(cb.as_ptr().cast())) };
        m.copy_from_slice(&_mm512_cmpneq_epi8_mask(va, vb).to_le_bytes());
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
fn simd_pairs(a: &[u8], b: &[u8], masks: &mut [u8]) {
    use std::arch::x86_64::{_mm_cmpeq_epi8, _mm_movemask_epi8, _mm_set_epi64x};
    let lanes = |c: &[u8]| {
        let lo = i64::from_le_bytes(c[..8].try_into().expect("8 bytes"));
        let hi = i64::from_le_bytes(c[8..].try_into().expect("8 bytes"));
        (hi, lo)
    };
    for ((ca, cb), m) in a.chunks_exact(16).zip(b.chunks_exact(16)).zip(masks.chunks_exact_mut(2)) {
        let ((ahi, alo), (bhi, blo)) = (lanes(ca), lanes(cb));
        // SAFETY: SSE2 is enabled for this build (the cfg above), which is all these intrinsics
        // require; they operate on register values only and touch no memory.
        let equal =
            unsafe { _mm_movemask_epi8(_mm_cmpeq_epi8(_mm_set_epi64x(ahi, alo), _mm_set_epi64x(bhi, blo))) };
        let changed = !(equal as u32);
        m[0] = changed as u8;
        m[1] = (changed >> 8) as u8;
    }
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
fn simd_pairs(a: &[u8], b: &[u8], masks: &mut [u8]) {
    portable(a, b, masks);
}

fn portable(a: &[u8], b: &[u8], masks: &mut [u8]) {
    for ((ca, cb), m) in a.chunks_exact(8).zip(b.chunks_exact(8)).zip(masks.iter_mut()) {
        *m = nonzero_bytes(
            u64::from_le_bytes(ca.try_into().expect("8 bytes"))
                ^ u64::from_le_bytes(cb.try_into().expect("8 bytes")),
        );
    }
}

/// Bit `i` set if byte `i` of `x` is not zero.
fn nonzero_bytes(x: u64) -> u8 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // The high bit of every nonzero byte, moved to bit 8i, then gathered into bits 56..64 by a
    // multiplication without carries.
    let nonzero = (((x & LOW7) + LOW7) | x) & HIGH;
    ((nonzero >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8
}

/// Sorts the words of a page by their masks (from [`changed_byte_masks`]) into two bit sets, 64
/// words to an element: bit `i % 64` of element `i / 64` is set in `changed` if word `i` changed
/// at all, and in `full` if every byte of it changed. Bits past the last word are clear.
///
/// # Panics
///
/// If `changed` or `full` has not exactly one element per 64 masks (rounded up).
pub fn word_sets(masks: &[u8], changed: &mut [u64], full: &mut [u64]) {
    let n = masks.len().div_ceil(64);
    assert!(changed.len() == n && full.len() == n, "word_sets needs one bit per mask");
    #[cfg(target_arch = "x86_64")]
    let wide = avx512bw();
    for ((m, c), f) in masks.chunks(64).zip(changed.iter_mut()).zip(full.iter_mut()) {
        #[cfg(target_arch = "x86_64")]
        if m.len() == 64 && wide {
            // SAFETY: `avx512bw` checked at run time that the CPU has the features the kernel
            // is compiled for.
            (*c, *f) = unsafe { classes_avx512(m) };
            continue;
        }
        let (mut cs, mut fs) = (0u64, 0u64);
        let sixteens = m.len() / 16;
        for (k, m16) in m.chunks_exact(16).enumerate() {
            let (unchanged, all) = simd_classes(m16);
            cs |= u64::from(!unchanged) << (16 * k);
            fs |= u64::from(all) << (16 * k);
        }
        for (k, m8) in m[16 * sixteens..].chunks(8).enumerate() {
            let mut word = [0u8; 8];
            word[..m8.len()].copy_from_slice(m8);
            let x = u64::from_le_bytes(word);
            let shift = 16 * sixteens + 8 * k;
            // Padding (a short last chunk) reads as unchanged, so neither set gets its bits.
            cs |= u64::from(nonzero_bytes(x)) << shift;
            fs |= u64::from(!nonzero_bytes(!x) & (0xffu8 >> (8 - m8.len()))) << shift;
        }
        (*c, *f) = (cs, fs);
    }
}

/// For 64 masks: bit `i` set in the first value if mask `i` is not zero, in the second if it is
/// `0xff` (one element of each of [`word_sets`]' sets).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
fn classes_avx512(m: &[u8]) -> (u64, u64) {
    use std::arch::x86_64::{
        _mm512_cmpeq_epi8_mask, _mm512_cmpneq_epi8_mask, _mm512_loadu_si512, _mm512_set1_epi8,
    };
    assert_eq!(m.len(), 64, "classes_avx512 takes 64 masks");
    // SAFETY: `m` is 64 bytes (checked above); `loadu` needs no alignment.
    let v = unsafe { _mm512_loadu_si512(m.as_ptr().cast()) };
    (_mm512_cmpneq_epi8_mask(v, _mm512_set1_epi8(0)), _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8(-1)))
}

/// For 16 masks: bit `i` set in the first value if mask `i` is zero, in the second if it is
/// `0xff`.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
fn simd_classes(m: &[u8]) -> (u16, u16) {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_movemask_epi8, _mm_set_epi64x, _mm_set1_epi8, _mm_setzero_si128,
    };
    let lo = i64::from_le_bytes(m[..8].try_into().expect("8 bytes"));
    let hi = i64::from_le_bytes(m[8..16].try_into().expect("8 bytes"));
    // SAFETY: SSE2 is enabled for this build (the cfg above), which is all these intrinsics
    // require; they operate on register values only and touch no memory.
    unsafe {
        let v = _mm_set_epi64x(hi, lo);
        let zero = _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_setzero_si128()));
        let ones = _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(-1)));
        (zero as u16, ones as u16)
    }
}

#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
fn simd_classes(m: &[u8]) -> (u16, u16) {
    let half = |h: &[u8]| u64::from_le_bytes(h.try_into().expect("8 bytes"));
    let (lo, hi) = (half(&m[..8]), half(&m[8..16]));
    let zero = |x: u64| u16::from(!nonzero_bytes(x));
    (zero(lo) | zero(hi) << 8, zero(!lo) | zero(!hi) << 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[u8], b: &[u8]) -> Vec<u8> {
        a.chunks(8)
            .zip(b.chunks(8))
            .map(|(x, y)| (0..8).fold(0u8, |m, k| m | (u8::from(x[k] != y[k]) << k)))
            .collect()
    }

    #[test]
    fn masks_match_a_byte_by_byte_compare() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for len in [0, 8, 16, 24, 64, 4096 + 8, 4096] {
            for _ in 0..200 {
                let a: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                // Each byte equal with probability 1/2 (SIMD pair, odd tail word, all patterns).
                let b: Vec<u8> = a
                    .iter()
                    .map(|&x| if next() & 1 == 0 { x } else { x ^ (1 + next() as u8 % 255) })
                    .collect();
                let mut m = vec![0xa5; len / 8];
                changed_byte_masks(&a, &b, &mut m);
                assert_eq!(m, naive(&a, &b), "len {len}");
                let mut p = vec![0xa5; len / 8];
                portable(&a, &b, &mut p);
                assert_eq!(p, m);
                // The SSE2 kernel too, where the AVX-512 one takes the whole blocks.
                let pairs = len / 16 * 16;
                let mut s = vec![0xa5; pairs / 8];
                simd_pairs(&a[..pairs], &b[..pairs], &mut s);
                assert_eq!(s, m[..pairs / 8]);
            }
        }
    }

    #[test]
    fn word_sets_sort_words_by_their_masks() {
        let mut s = 0x2545_f491_4f6c_dd1du64;
        for len in [1usize, 7, 8, 15, 16, 17, 63, 64, 65, 100, 512] {
            for _ in 0..200 {
                let masks: Vec<u8> = (0..len)
                    .map(|_| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        [0, 0xff, s as u8][(s >> 40) as usize % 3]
                    })
                    .collect();
                let n = len.div_ceil(64);
                let (mut changed, mut full) = (vec![!0; n], vec![!0; n]);
                word_sets(&masks, &mut changed, &mut full);
                for i in 0..n * 64 {
                    let bit = |set: &[u64]| set[i / 64] >> (i % 64) & 1 == 1;
                    let m = masks.get(i).copied();
                    assert_eq!(bit(&changed), m.is_some_and(|m| m != 0), "len {len} word {i}");
                    assert_eq!(bit(&full), m == Some(0xff), "len {len} word {i}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "one mask byte per word")]
    fn a_mask_buffer_of_the_wrong_size_panics() {
        changed_byte_masks(&[0; 16], &[1; 16], &mut [0; 1]);
    }
}
