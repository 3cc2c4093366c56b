//! Packing the changed bytes of partly changed words, a bit-manipulation kernel for the diff
//! code.
//!
//! A diff carries a partly changed 8-byte word as its byte mask and the bytes the mask selects,
//! low byte first ([`crate::protocol::diff`]). Floating-point data that converges changes only
//! the low bytes of its mantissas: Jacobi's words change 2.4 bytes of 8 on average, FFT's 3-5,
//! Water's 5.8. Sending the whole word cost those diffs 2-3 times their changed bytes, and bytes
//! are what a write to a socket costs on this VM (about 0.5 µs per KB on loopback).
//!
//! With AVX-512 VBMI2, `vpcompressb` gathers the selected bytes of eight words (a 64-bit mask:
//! the eight mask bytes as they lie) and `vpexpandb` scatters them back, one instruction each;
//! with BMI2, `pext` and `pdep` do the same a word at a time. The intrinsics need CPU features,
//! checked once at run time, so the kernels live here, behind safe functions; without them (or
//! where `pext` is microcoded, as on AMD before Zen 3, ~250 cycles an instruction) a loop over
//! the mask's bits does the same. All produce the same bytes, so nodes on different CPUs
//! understand each other. On the 2-vCPU VM (Zen 4), a page of doubles changing 2-3 bytes a word
//! takes 0.43 µs to diff and 0.19 µs to apply packed, against 0.40 and 0.32 µs masked.

#[cfg(target_arch = "x86_64")]
use std::sync::OnceLock;

/// `EXPAND[m]`: the word with byte `i` all ones where bit `i` of `m` is set.
const EXPAND: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut m = 0;
    while m < 256 {
        let mut b = 0;
        while b < 8 {
            if (m >> b) & 1 == 1 {
                t[m] |= 0xff << (8 * b);
            }
            b += 1;
        }
        m += 1;
    }
    t
};

/// Whether packing costs no more than copying words whole here (the AVX-512 kernel: a page of
/// doubles packs about as fast as it copies, and unpacks faster than a masked merge), so that
/// every partly changed run is worth packing.
pub fn packs_cheaply() -> bool {
    #[cfg(target_arch = "x86_64")]
    return kernel() == Kernel::Avx512;
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The word with byte `i` all ones where bit `i` of `m` is set.
#[inline]
pub fn byte_mask(m: u8) -> u64 {
    EXPAND[usize::from(m)]
}

/// Number of bytes [`pack`] appends for `masks`: the bits set in them.
pub fn packed_len(masks: &[u8]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if kernel() != Kernel::Portable {
        // SAFETY: `kernel` checked at run time that the CPU has POPCNT and BMI2, the features
        // `packed_len_popcnt` is compiled for.
        return unsafe { packed_len_popcnt(masks) };
    }
    packed_len_portable(masks)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi2,popcnt")]
fn packed_len_popcnt(masks: &[u8]) -> usize {
    packed_len_portable(masks)
}

/// [`packed_len`] in baseline instructions: the baseline x86_64 has no popcount instruction,
/// so eight masks are counted at a time.
fn packed_len_portable(masks: &[u8]) -> usize {
    let mut eights = masks.chunks_exact(8);
    let words: usize = eights
        .by_ref()
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")).count_ones() as usize)
        .sum();
    words + eights.remainder().iter().map(|m| m.count_ones() as usize).sum::<usize>()
}

/// Appends to `out` the masks of a *dense* run of words ([`crate::protocol::diff`]), shortened:
/// first its full bitmap, bit `w % 8` of byte `w / 8` set where mask `w` is `0xff` (the word
/// changed fully; bits past the last word clear), then every mask that is not `0xff`, in order.
/// A run of random keys, where one word in ~30 keeps a byte, so costs a bit a word and a byte
/// per partly changed word, instead of a byte per word. [`expand_masks`] inverts it.
pub fn shorten_masks(masks: &[u8], out: &mut Vec<u8>) {
    #[cfg(target_arch = "x86_64")]
    if kernel() == Kernel::Avx512 {
        // SAFETY: `kernel` checked at run time that the CPU has the features
        // `shorten_masks_avx512` is compiled for.
        return unsafe { shorten_masks_avx512(masks, out) };
    }
    #[cfg(target_arch = "x86_64")]
    if kernel() != Kernel::Portable {
        // SAFETY: `kernel` checked at run time that the CPU has BMI2 and POPCNT, the features
        // `shorten_masks_bmi2` is compiled for.
        return unsafe { shorten_masks_bmi2(masks, out) };
    }
    shorten_masks_portable(masks, out);
}

/// The number of masks [`shorten_masks`] keeps after a full bitmap of `words` words: those of
/// the words not full. Bits past the last word are not counted.
pub fn shortened_len(bitmap: &[u8], words: usize) -> usize {
    let (whole, bits) = ((words / 8).min(bitmap.len()), &bitmap[..words.div_ceil(8).min(bitmap.len())]);
    let mut eights = bits[..whole].chunks_exact(8);
    let mut full: usize = eights
        .by_ref()
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")).count_ones() as usize)
        .sum();
    full += eights.remainder().iter().map(|b| b.count_ones() as usize).sum::<usize>();
    if let Some(&last) = bits.get(whole) {
        full += (last & group_bits(words % 8)).count_ones() as usize;
    }
    words - full
}

/// The masks of the first `n` words of a group of eight (all eight from 8 on).
fn group_bits(n: usize) -> u8 {
    if n >= 8 { 0xff } else { (1u8 << n) - 1 }
}

/// Writes into `masks` (one per word of the run) the masks [`shorten_masks`] shortened into
/// `bitmap` (at least a bit per word) and `rest` (exactly [`shortened_len`] masks).
///
/// # Panics
///
/// If `bitmap` has fewer bits than `masks` has words, or `rest` is not exactly the masks of the
/// words the bitmap does not mark full.
pub fn expand_masks(bitmap: &[u8], rest: &[u8], masks: &mut [u8]) {
    assert!(bitmap.len() * 8 >= masks.len(), "expand_masks needs a bit per word");
    assert_eq!(rest.len(), shortened_len(bitmap, masks.len()), "expand_masks needs a mask per word not full");
    // SAFETY: both requirements were asserted just above.
    unsafe { expand_masks_unchecked(bitmap, rest, masks) }
}

/// [`expand_masks`] without its checks.
///
/// # Safety
///
/// `bitmap` has at least a bit per word of `masks`, and `rest` is exactly
/// [`shortened_len`]`(bitmap, masks.len())` masks long: the kernels read and write by those
/// lengths.
unsafe fn expand_masks_unchecked(bitmap: &[u8], rest: &[u8], masks: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if kernel() == Kernel::Avx512 {
        // SAFETY: `kernel` checked at run time that the CPU has the features
        // `expand_masks_avx512` is compiled for; the caller, the lengths it reads by.
        return unsafe { expand_masks_avx512(bitmap, rest, masks) };
    }
    #[cfg(target_arch = "x86_64")]
    if kernel() != Kernel::Portable {
        // SAFETY: `kernel` checked at run time that the CPU has BMI2 and POPCNT, the features
        // `expand_masks_bmi2` is compiled for.
        return unsafe { expand_masks_bmi2(bitmap, rest, masks) };
    }
    expand_masks_portable(bitmap, rest, masks);
}

/// [`unpack`] for a dense run: the masks as [`shorten_masks`] left them (`bitmap`, at least a
/// bit per word, and `rest`, exactly [`shortened_len`] masks), expanded on the way.
///
/// # Panics
///
/// If `dst` is not whole words, `bitmap` has fewer bits than `dst` has words, `rest` is not the
/// masks of the words the bitmap does not mark full, or `packed` is not exactly the bytes the
/// masks select.
pub fn unpack_dense(dst: &mut [u8], bitmap: &[u8], rest: &[u8], packed: &[u8]) {
    assert!(dst.len().is_multiple_of(8), "unpack_dense needs whole words");
    let words = dst.len() / 8;
    assert!(bitmap.len() * 8 >= words, "unpack_dense needs a bit per word");
    let shortened = shortened_len(bitmap, words);
    assert_eq!(rest.len(), shortened, "unpack_dense needs a mask per word not full");
    // The masks expanded a chunk at a time on the stack, then the chunk unpacked. Each chunk's
    // masks and bytes are cut by their counts, which makes them exactly what `expand_masks` and
    // `unpack` check; the bytes are counted once, by chunk, and checked whole at the end.
    let mut masks = [0u8; DENSE_CHUNK];
    let (mut rest, mut packed) = (rest, packed);
    for (c, dst) in dst.chunks_mut(8 * DENSE_CHUNK).enumerate() {
        let n = dst.len() / 8;
        let bits = &bitmap[c * DENSE_CHUNK / 8..][..n.div_ceil(8)];
        let (kept, later) = rest.split_at(shortened_len(bits, n));
        // SAFETY: `bits` has a bit per word of the chunk, and `kept` is exactly the masks of
        // its words not full (cut by that count; `rest` holds them all, asserted above).
        unsafe { expand_masks_unchecked(bits, kept, &mut masks[..n]) };
        let (bytes, after) = packed
            .split_at_checked(packed_len(&masks[..n]))
            .expect("unpack_dense needs the bytes the masks select");
        // SAFETY: `dst` holds a word per mask of the chunk, and `bytes` is exactly the bytes
        // those masks select (cut by that count).
        unsafe { unpack_unchecked(dst, &masks[..n], bytes) };
        (rest, packed) = (later, after);
    }
    assert!(packed.is_empty(), "unpack_dense needs the bytes the masks select, and no more");
}

/// Words [`unpack_dense`] expands the masks of at a time.
const DENSE_CHUNK: usize = 512;

/// The bits of the first `n` of 64 lanes (all from 64 on).
fn lanes(n: usize) -> u64 {
    if n >= 64 { !0 } else { (1u64 << n) - 1 }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,bmi2,popcnt")]
fn shorten_masks_avx512(masks: &[u8], out: &mut Vec<u8>) {
    use std::arch::x86_64::{
        _mm512_cmpeq_epi8_mask, _mm512_maskz_compress_epi8, _mm512_maskz_loadu_epi8, _mm512_set1_epi8,
        _mm512_storeu_si512,
    };
    let bitmap_len = masks.len().div_ceil(8);
    // The bitmap, 8 bytes a group of 64 masks (the last group's cut to the bitmap's length),
    // then room for 64 masks a group, which the next group's overwrite where this one kept
    // fewer.
    let groups = masks.len().div_ceil(64);
    out.reserve(bitmap_len + 64 * groups);
    let base = out.len();
    let dst = out.spare_capacity_mut().as_mut_ptr().cast::<u8>();
    let mut at = bitmap_len;
    for (g, m) in masks.chunks(64).enumerate() {
        let valid = lanes(m.len());
        // SAFETY: the load reads only the lanes `valid` selects, the `m.len()` bytes of `m`.
        let v = unsafe { _mm512_maskz_loadu_epi8(valid, m.as_ptr().cast()) };
        let full = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8(-1)) & valid;
        let bits = full.to_le_bytes();
        let bits = &bits[..m.len().div_ceil(8)];
        // Group `g` writes its bitmap bytes, `8 g..8 g + bits.len()`, all below `bitmap_len`
        // (where no mask goes), and 64 bytes at `at`, which is `bitmap_len` plus at most 64 per
        // group before this one.
        // SAFETY: so both writes lie in the `bitmap_len + 64 * groups` bytes reserved above;
        // unaligned stores need no alignment.
        unsafe {
            std::ptr::copy_nonoverlapping(bits.as_ptr(), dst.add(8 * g), bits.len());
            _mm512_storeu_si512(dst.add(at).cast(), _mm512_maskz_compress_epi8(!full & valid, v));
        }
        at += (!full & valid).count_ones() as usize;
    }
    // SAFETY: the bitmap's `bitmap_len` bytes and the `at - bitmap_len` masks after it were all
    // written above (each group's kept masks at the running `at`, contiguous), inside the
    // reserved capacity.
    unsafe { out.set_len(base + at) };
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,bmi2,popcnt")]
fn expand_masks_avx512(bitmap: &[u8], rest: &[u8], masks: &mut [u8]) {
    use std::arch::x86_64::{
        _mm512_mask_expand_epi8, _mm512_mask_storeu_epi8, _mm512_maskz_loadu_epi8, _mm512_set1_epi8,
        _mm512_storeu_si512,
    };
    let mut at = 0;
    for (g, m) in masks.chunks_mut(64).enumerate() {
        let valid = lanes(m.len());
        let full = word_at(bitmap, 8 * g, (bitmap.len() - 8 * g).min(8)) & valid;
        let n = (!full & valid).count_ones() as usize;
        // SAFETY: the load reads only the `n` lanes its mask selects, the next `n` bytes of
        // `rest` (`expand_masks` checked it holds a mask per word not full); the store writes
        // only the `m.len()` lanes `valid` selects, inside `m`.
        unsafe {
            let v = _mm512_maskz_loadu_epi8(lanes(n), rest.as_ptr().add(at).cast());
            let x = _mm512_mask_expand_epi8(_mm512_set1_epi8(-1), !full & valid, v);
            if m.len() == 64 {
                _mm512_storeu_si512(m.as_mut_ptr().cast(), x);
            } else {
                _mm512_mask_storeu_epi8(m.as_mut_ptr().cast(), valid, x);
            }
        }
        at += n;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi2,popcnt")]
fn shorten_masks_bmi2(masks: &[u8], out: &mut Vec<u8>) {
    use std::arch::x86_64::_pext_u64;
    let groups = masks.len().div_ceil(8);
    // The bitmap, then room for a whole word of masks per group, which the next group's
    // overwrite where this one kept fewer.
    out.reserve(groups + 8 * groups);
    let base = out.len();
    let dst = out.spare_capacity_mut().as_mut_ptr().cast::<u8>();
    let mut at = groups;
    for (g, m) in masks.chunks(8).enumerate() {
        let x = group_masks(m);
        // A mask is 0xff where its byte of `!x` is zero. `((y & LOW7) + LOW7) | y` has a byte's
        // high bit set where that byte of `y` is not zero (no carry crosses a byte), and the
        // multiplication gathers the eight high bits into the top byte.
        const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
        let not_full = ((((!x) & LOW7) + LOW7) | !x) & 0x8080_8080_8080_8080;
        let full = ((!not_full & 0x8080_8080_8080_8080) >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56;
        let full = full as u8 & group_bits(m.len());
        let keep = !EXPAND[usize::from(full)] & EXPAND[usize::from(group_bits(m.len()))];
        // SAFETY: `g < groups` and `at` is at most `groups` plus 8 per group before this one,
        // so both writes lie in the `groups + 8 * groups` bytes of spare capacity reserved
        // above; `write_unaligned` needs no alignment.
        unsafe {
            dst.add(g).write(full);
            dst.add(at).cast::<u64>().write_unaligned(_pext_u64(x, keep).to_le());
        }
        at += m.len() - full.count_ones() as usize;
    }
    // SAFETY: the bitmap's `groups` bytes and the `at - groups` masks after it were all written
    // above, contiguous, inside the reserved capacity.
    unsafe { out.set_len(base + at) };
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi2,popcnt")]
fn expand_masks_bmi2(bitmap: &[u8], rest: &[u8], masks: &mut [u8]) {
    use std::arch::x86_64::_pdep_u64;
    let mut at = 0;
    for (m, &bits) in masks.chunks_mut(8).zip(bitmap) {
        let (all, full) = (group_bits(m.len()), bits & group_bits(m.len()));
        let n = usize::from(all.count_ones() as u8 - full.count_ones() as u8);
        // pdep takes as many masks as the group needs.
        let v = word_at(rest, at, n);
        at += n;
        let full_bytes = EXPAND[usize::from(full)];
        let x = full_bytes | _pdep_u64(v, !full_bytes & EXPAND[usize::from(all)]);
        m.copy_from_slice(&x.to_le_bytes()[..m.len()]);
    }
}

fn shorten_masks_portable(masks: &[u8], out: &mut Vec<u8>) {
    out.extend(
        masks
            .chunks(8)
            .map(|m| m.iter().enumerate().filter(|(_, x)| **x == 0xff).fold(0u8, |f, (b, _)| f | 1 << b)),
    );
    out.extend(masks.iter().filter(|&&m| m != 0xff));
}

fn expand_masks_portable(bitmap: &[u8], rest: &[u8], masks: &mut [u8]) {
    let mut rest = rest.iter();
    for (w, m) in masks.iter_mut().enumerate() {
        *m = if (bitmap[w / 8] >> (w % 8)) & 1 == 1 {
            0xff
        } else {
            *rest.next().expect("shortened_len checked")
        };
    }
}

/// Appends to `out`, for each 8-byte word `i` of `words`, the bytes `masks[i]` selects (bit `k`
/// selects byte `k`), low byte first: [`packed_len`]`(masks)` bytes in all.
///
/// # Panics
///
/// If `words` does not hold exactly one 8-byte word per mask.
pub fn pack(words: &[u8], masks: &[u8], out: &mut Vec<u8>) {
    assert_eq!(words.len(), masks.len() * 8, "pack needs one 8-byte word per mask");
    #[cfg(target_arch = "x86_64")]
    match kernel() {
        // SAFETY: `kernel` checked at run time that the CPU has the features `pack_avx512` is
        // compiled for.
        Kernel::Avx512 => return unsafe { pack_avx512(words, masks, out) },
        // SAFETY: as above, for `pack_bmi2`.
        Kernel::Bmi2 => return unsafe { pack_bmi2(words, masks, out) },
        Kernel::Portable => {}
    }
    pack_portable(words, masks, out);
}

/// The inverse of [`pack`]: for each 8-byte word `i` of `dst`, writes the next
/// `masks[i].count_ones()` bytes of `packed` into the bytes `masks[i]` selects, and leaves the
/// others alone.
///
/// # Panics
///
/// If `dst` does not hold exactly one 8-byte word per mask, or `packed` is not exactly
/// [`packed_len`]`(masks)` bytes long.
pub fn unpack(dst: &mut [u8], masks: &[u8], packed: &[u8]) {
    assert_eq!(dst.len(), masks.len() * 8, "unpack needs one 8-byte word per mask");
    assert_eq!(packed.len(), packed_len(masks), "unpack needs the bytes the masks select");
    // SAFETY: both requirements were asserted just above.
    unsafe { unpack_unchecked(dst, masks, packed) }
}

/// [`unpack`] without its checks.
///
/// # Safety
///
/// `dst` holds exactly one 8-byte word per mask, and `packed` is exactly
/// [`packed_len`]`(masks)` bytes long: the kernels read and write by those lengths.
unsafe fn unpack_unchecked(dst: &mut [u8], masks: &[u8], packed: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    match kernel() {
        // SAFETY: `kernel` checked at run time that the CPU has the features `unpack_avx512` is
        // compiled for; the caller, the lengths it reads and writes by.
        Kernel::Avx512 => return unsafe { unpack_avx512(dst, masks, packed) },
        // SAFETY: as above, for `unpack_bmi2`.
        Kernel::Bmi2 => return unsafe { unpack_bmi2(dst, masks, packed) },
        Kernel::Portable => {}
    }
    unpack_portable(dst, masks, packed);
}

/// The fastest kernel this CPU runs.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernel {
    /// AVX-512 VBMI2 `vpcompressb`/`vpexpandb`: eight words at a time (with BMI2 for the rest).
    Avx512,
    /// BMI2 `pext`/`pdep` (and POPCNT): a word at a time.
    Bmi2,
    /// A loop over each mask's bits.
    Portable,
}

/// Detected once: BMI2 counts only where `pext` and `pdep` are in hardware (not on AMD before
/// Zen 3, family 0x19).
#[cfg(target_arch = "x86_64")]
fn kernel() -> Kernel {
    static KERNEL: OnceLock<Kernel> = OnceLock::new();
    *KERNEL.get_or_init(|| {
        use std::arch::x86_64::__cpuid;
        if !std::arch::is_x86_feature_detected!("bmi2") || !std::arch::is_x86_feature_detected!("popcnt") {
            return Kernel::Portable;
        }
        let vendor = __cpuid(0);
        // "AuthenticAMD", in the register order CPUID returns it.
        if (vendor.ebx, vendor.edx, vendor.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163) {
            let eax = __cpuid(1).eax;
            let base = (eax >> 8) & 0xf;
            let family = if base == 0xf { base + ((eax >> 20) & 0xff) } else { base };
            if family < 0x19 {
                return Kernel::Portable;
            }
        }
        let avx512 = std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vbmi2");
        if avx512 { Kernel::Avx512 } else { Kernel::Bmi2 }
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,bmi2,popcnt")]
fn pack_avx512(words: &[u8], masks: &[u8], out: &mut Vec<u8>) {
    use std::arch::x86_64::{_mm512_loadu_si512, _mm512_maskz_compress_epi8, _mm512_storeu_si512};
    let eights = masks.len() / 8;
    // Each group's bytes are stored as 64 whole bytes, of which the next group's overwrite the
    // unused ones: room for 64 bytes a group.
    out.reserve(eights * 64 + 64);
    let base = out.len();
    let dst = out.spare_capacity_mut().as_mut_ptr().cast::<u8>();
    let mut at = 0;
    for g in 0..eights {
        // Bit 8w + b selects byte b of word w: the eight masks, as they lie.
        let k = u64::from_le_bytes(masks[8 * g..8 * g + 8].try_into().expect("8 masks"));
        // SAFETY: words 8g..8g + 8 are the 64 bytes at 64g, inside `words` (8 bytes a mask);
        // `loadu` needs no alignment.
        let v = unsafe { _mm512_loadu_si512(words.as_ptr().add(64 * g).cast()) };
        // SAFETY: `at` is at most 64 per group before this one, so the 64 bytes stored at
        // `dst + at` lie in the spare capacity reserved above; `storeu` needs no alignment.
        unsafe { _mm512_storeu_si512(dst.add(at).cast(), _mm512_maskz_compress_epi8(k, v)) };
        at += k.count_ones() as usize;
    }
    // SAFETY: the `at` bytes after the old length were all written above (each group's selected
    // bytes at the running `at`, contiguous), inside the reserved capacity.
    unsafe { out.set_len(base + at) };
    pack_bmi2(&words[64 * eights..], &masks[8 * eights..], out);
}

/// Up to eight masks as one little-endian word (bit `8 w + b`: byte `b` of word `w`).
#[cfg(target_arch = "x86_64")]
fn group_masks(m: &[u8]) -> u64 {
    word_at(m, 0, m.len())
}

/// The `n` (at most 8) bytes of `bytes` at `at`, as the low bytes of a little-endian word: one
/// load where eight bytes are there (the bytes past the `n` are then whatever follows), else
/// those `n` and zeros.
#[cfg(target_arch = "x86_64")]
fn word_at(bytes: &[u8], at: usize, n: usize) -> u64 {
    match bytes.get(at..at + 8) {
        Some(eight) => u64::from_le_bytes(eight.try_into().expect("8 bytes")),
        None => {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(&bytes[at..at + n]);
            u64::from_le_bytes(b)
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vbmi2,bmi2,popcnt")]
fn unpack_avx512(dst: &mut [u8], masks: &[u8], packed: &[u8]) {
    use std::arch::x86_64::{
        _mm512_loadu_si512, _mm512_mask_expand_epi8, _mm512_mask_storeu_epi8, _mm512_maskz_loadu_epi8,
        _mm512_storeu_si512,
    };
    let mut at = 0;
    for (m, d) in masks.chunks(8).zip(dst.chunks_mut(64)) {
        let k = group_masks(m);
        let here = lanes(d.len());
        // The packed bytes are read 64 at a time where there are 64, else only those there are:
        // a masked load reads only the lanes it selects, and `at` is at most `packed.len()`
        // (`unpack` checked that `packed` holds every byte the masks select).
        // SAFETY: so every read lies in `packed`, and `d` (the group's bytes of `dst`, not
        // aliased) is all the loads and stores of `d` touch; none needs alignment.
        unsafe {
            let src = if at + 64 <= packed.len() {
                _mm512_loadu_si512(packed.as_ptr().add(at).cast())
            } else {
                _mm512_maskz_loadu_epi8(lanes(packed.len() - at), packed.as_ptr().add(at).cast())
            };
            if d.len() == 64 {
                let old = _mm512_loadu_si512(d.as_ptr().cast());
                _mm512_storeu_si512(d.as_mut_ptr().cast(), _mm512_mask_expand_epi8(old, k, src));
            } else {
                let old = _mm512_maskz_loadu_epi8(here, d.as_ptr().cast());
                _mm512_mask_storeu_epi8(d.as_mut_ptr().cast(), here, _mm512_mask_expand_epi8(old, k, src));
            }
        }
        at += k.count_ones() as usize;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi2,popcnt")]
fn pack_bmi2(words: &[u8], masks: &[u8], out: &mut Vec<u8>) {
    use std::arch::x86_64::_pext_u64;
    // Each word's bytes are stored as a whole word, of which the next word's overwrite the
    // unused ones: room for a whole word each.
    out.reserve(masks.len() * 8);
    let base = out.len();
    let dst = out.spare_capacity_mut().as_mut_ptr().cast::<u8>();
    let mut at = 0;
    for (w, &m) in words.chunks_exact(8).zip(masks) {
        let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        // SAFETY: `at` (the bytes packed so far) is at most 8 per word before this one, so the
        // 8 bytes written at `dst + at` lie in the 8 bytes per word of spare capacity reserved
        // above; `write_unaligned` needs no alignment.
        unsafe { dst.add(at).cast::<u64>().write_unaligned(_pext_u64(v, EXPAND[usize::from(m)]).to_le()) };
        at += m.count_ones() as usize;
    }
    // SAFETY: the `at` bytes after the old length were all written above (each word wrote its
    // packed bytes at the running `at`, and the packings are contiguous), and fit in the
    // reserved capacity.
    unsafe { out.set_len(base + at) };
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi2,popcnt")]
fn unpack_bmi2(dst: &mut [u8], masks: &[u8], packed: &[u8]) {
    use std::arch::x86_64::_pdep_u64;
    let mut at = 0;
    for (d, &m) in dst.chunks_exact_mut(8).zip(masks) {
        let n = m.count_ones() as usize;
        // pdep takes as many bytes as the mask selects.
        let v = word_at(packed, at, n);
        at += n;
        let keep = EXPAND[usize::from(m)];
        let old = u64::from_le_bytes((&*d).try_into().expect("8 bytes"));
        d.copy_from_slice(&((old & !keep) | _pdep_u64(v, keep)).to_le_bytes());
    }
}

fn pack_portable(words: &[u8], masks: &[u8], out: &mut Vec<u8>) {
    out.reserve(packed_len(masks));
    for (w, &m) in words.chunks_exact(8).zip(masks) {
        out.extend((0..8).filter(|b| (m >> b) & 1 == 1).map(|b| w[b]));
    }
}

fn unpack_portable(dst: &mut [u8], masks: &[u8], packed: &[u8]) {
    let mut bytes = packed.iter();
    for (d, &m) in dst.chunks_exact_mut(8).zip(masks) {
        for b in (0..8).filter(|b| (m >> b) & 1 == 1) {
            d[b] = *bytes.next().expect("packed_len checked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    #[test]
    fn unpack_inverts_pack_on_every_path() {
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        for round in 0..500 {
            // Every mask value in order, then random lengths (groups of eight words and a
            // rest) and masks.
            let words = if round == 0 { 256 } else { 1 + (rng(&mut seed) % 64) as usize };
            let page: Vec<u8> = (0..words * 8).map(|_| rng(&mut seed) as u8).collect();
            let masks: Vec<u8> =
                (0..words).map(|i| if round == 0 { i as u8 } else { rng(&mut seed) as u8 }).collect();
            let mut packed = Vec::new();
            pack_portable(&page, &masks, &mut packed);
            assert_eq!(packed.len(), packed_len(&masks));
            // Unselected bytes keep what the destination held.
            let old: Vec<u8> = (0..page.len()).map(|i| (i as u8) ^ 0xee).collect();
            let mut expected = old.clone();
            for (i, &m) in masks.iter().enumerate() {
                for b in (0..8).filter(|b| (m >> b) & 1 == 1) {
                    expected[i * 8 + b] = page[i * 8 + b];
                }
            }
            let mut out = old.clone();
            unpack_portable(&mut out, &masks, &packed);
            assert_eq!(out, expected);
            let mut via_api = Vec::new();
            pack(&page, &masks, &mut via_api);
            assert_eq!(via_api, packed, "the dispatched kernel packs the same bytes");
            let mut out = old.clone();
            unpack(&mut out, &masks, &packed);
            assert_eq!(out, expected);
            #[cfg(target_arch = "x86_64")]
            if kernel() == Kernel::Avx512 {
                let mut wide = Vec::new();
                // SAFETY: `kernel` detected the features.
                unsafe { pack_avx512(&page, &masks, &mut wide) };
                assert_eq!(wide, packed, "vpcompressb packs as the portable loop does");
                let mut out = old.clone();
                // SAFETY: `kernel` detected the features.
                unsafe { unpack_avx512(&mut out, &masks, &packed) };
                assert_eq!(out, expected, "vpexpandb unpacks as the portable loop does");
            }
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("bmi2") && std::arch::is_x86_feature_detected!("popcnt") {
                let mut bmi2 = Vec::new();
                // SAFETY: BMI2 and POPCNT were just detected.
                unsafe { pack_bmi2(&page, &masks, &mut bmi2) };
                assert_eq!(bmi2, packed, "pext packs as the portable loop does");
                let mut out = old.clone();
                // SAFETY: BMI2 and POPCNT were just detected.
                unsafe { unpack_bmi2(&mut out, &masks, &packed) };
                assert_eq!(out, expected, "pdep unpacks as the portable loop does");
            }
        }
    }

    #[test]
    fn dense_masks_shorten_and_expand_alike_on_every_path() {
        let mut seed = 0x2545_f491_4f6c_dd1d;
        for round in 0..2000 {
            // Lengths across the 8- and 64-mask groups; masks mostly full, some not, some zero.
            let words = 1 + (rng(&mut seed) % 200) as usize;
            let masks: Vec<u8> = (0..words)
                .map(|_| match rng(&mut seed) % 8 {
                    0 => 0,
                    1 | 2 => rng(&mut seed) as u8,
                    _ if round % 3 == 0 => rng(&mut seed) as u8 | 1,
                    _ => 0xff,
                })
                .collect();
            let mut short = Vec::new();
            shorten_masks_portable(&masks, &mut short);
            let bitmap_len = words.div_ceil(8);
            assert_eq!(short.len(), bitmap_len + masks.iter().filter(|&&m| m != 0xff).count());
            assert_eq!(shortened_len(&short[..bitmap_len], words), short.len() - bitmap_len);
            let (bitmap, rest) = short.split_at(bitmap_len);
            let mut via_api = Vec::new();
            shorten_masks(&masks, &mut via_api);
            assert_eq!(via_api, short, "the dispatched kernel shortens alike");
            let mut expanded = vec![0x5a; words];
            expand_masks_portable(bitmap, rest, &mut expanded);
            assert_eq!(expanded, masks);
            let mut expanded = vec![0x5a; words];
            expand_masks(bitmap, rest, &mut expanded);
            assert_eq!(expanded, masks, "the dispatched kernel expands alike");
            #[cfg(target_arch = "x86_64")]
            for k in [Kernel::Avx512, Kernel::Bmi2] {
                if k == Kernel::Avx512 && kernel() != Kernel::Avx512 || kernel() == Kernel::Portable {
                    continue;
                }
                let mut out = Vec::new();
                let mut expanded = vec![0x5a; words];
                // SAFETY: `kernel` detected the features of the kernel tried (AVX-512 ones only
                // when it chose them; BMI2 whenever it chose any but the portable one).
                unsafe {
                    if k == Kernel::Avx512 {
                        shorten_masks_avx512(&masks, &mut out);
                        expand_masks_avx512(bitmap, rest, &mut expanded);
                    } else {
                        shorten_masks_bmi2(&masks, &mut out);
                        expand_masks_bmi2(bitmap, rest, &mut expanded);
                    }
                }
                assert_eq!(out, short, "{k:?} shortens as the portable loop does");
                assert_eq!(expanded, masks, "{k:?} expands as the portable loop does");
            }
            // A dense run unpacks as its expanded masks do.
            let page: Vec<u8> = (0..words * 8).map(|_| rng(&mut seed) as u8).collect();
            let mut packed = Vec::new();
            pack(&page, &masks, &mut packed);
            let old: Vec<u8> = (0..page.len()).map(|i| (i as u8) ^ 0x33).collect();
            let (mut by_masks, mut by_dense) = (old.clone(), old.clone());
            unpack(&mut by_masks, &masks, &packed);
            unpack_dense(&mut by_dense, bitmap, rest, &packed);
            assert_eq!(by_dense, by_masks);
        }
    }

    #[test]
    #[should_panic(expected = "a mask per word not full")]
    fn expand_refuses_missing_masks() {
        // Word 1 is not full and has no mask.
        expand_masks(&[0b01], &[], &mut [0u8; 2]);
    }

    #[test]
    #[should_panic(expected = "the bytes the masks select")]
    fn unpack_refuses_a_short_packing() {
        unpack(&mut [0u8; 8], &[0b11], &[1]);
    }
}
