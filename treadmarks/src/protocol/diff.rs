//! Diffs: the bytes a node changed in a page, found by comparing the page with its twin.
//!
//! The page is compared a 64-bit word at a time (pages are a multiple of 8 bytes: every page size
//! is a power of two of at least 8). Encoding (a diff is a raw byte string on the wire, never a
//! sequence of serde elements): a sequence of runs of changed words, each
//!
//! ```text
//! full run:   varint gap, varint (len << 2),     8 * len data bytes
//! masked run: varint gap, varint (len << 2 | 1), len mask bytes, 8 * len data bytes
//! packed run: varint gap, varint (len << 2 | 2), len mask bytes, the changed bytes
//! dense run:  varint gap, varint (len << 2 | 3), ceil(len / 8) bitmap bytes,
//!             a mask byte per word not marked in the bitmap, the changed bytes
//! ```
//!
//! where `gap` is the number of unchanged words from the end of the previous run (or the page
//! start) to the run start, and `len` the number of words in the run. A run whose every byte
//! changed is *full* and its data is copied as is. Otherwise each word has a mask byte (bit `i`
//! set if byte `i` of the word changed) and applying writes only those bytes. A *masked* run
//! carries its words whole; a *packed* one only the bytes the masks select, word by word, low
//! byte first ([`crate::mem::pack`]). A *dense* run is a packed run whose fully changed words
//! are marked in a bitmap (bit `w % 8` of byte `w / 8`) instead of by a mask byte each: only the
//! other words have mask bytes. Packing a word with BMI2 costs about a nanosecond at each
//! end and saves the bytes that did not change, which cost the sender's socket write about half
//! a nanosecond each on the VM this was measured on: a run is packed when its words changed
//! [`PACK_MAX_BYTES`] bytes or fewer on average, or always where packing costs no more than
//! copying ([`crate::mem::pack::packs_cheaply`]: with AVX-512 VBMI2). Converging floating-point
//! data changes few bytes of a word: Jacobi's diffs shrank from ~4.2 KB to ~1.7 KB a page,
//! FFT's by a third.
//!
//! So diffs are exact to the byte: bytes equal to the twin are never written, and two nodes
//! writing disjoint bytes of one page (false sharing, even inside one word) merge correctly
//! whatever order their diffs are applied in. Yet making one is a word compare and a copy per
//! changed run, not a loop over bytes: floating-point data, whose words change in most but not
//! all of their bytes, would otherwise cost a run per word.
//!
//! Making a diff first computes every word's mask with a SIMD byte compare
//! ([`crate::mem::bytes`]), sorts the words into bit sets (changed at all, changed fully), then
//! cuts the changed words into runs by searching those sets, a few bit operations per run. Inside a stretch of changed
//! words, at least [`MIN_FULL_RUN`] consecutive fully changed words become a full run of their own
//! (no masks: copied with one `memcpy` when applied), and the words around them masked runs. A
//! page rewritten with random 64-bit values, where one word in ~30 keeps a byte by chance, then
//! costs a few run headers instead of a mask byte per word (~4.2 KB instead of ~4.6 KB a page),
//! and a page whose every byte changed is a single full run.
//!
//! Where every partly changed run is packed (AVX-512 VBMI2), such a page is one *dense* run
//! instead: a stretch of words holding [`MIN_FULL_RUN`] fully changed ones in a row, which the
//! encoder above splits into runs, goes whole, its full words marked a bit each. Each run cost
//! each end a few nanoseconds, and a page of random keys held ~60: making its diff took 0.79 µs
//! and applying it 0.69 µs, dense 0.49 and 0.28 µs, in as many bytes (4,162 against 4,165:
//! `cargo bench --bench diff`, kind `fill`). Alternated runs at 2 nodes, medians: fft 0.0390 →
//! 0.0368 s, qsort 0.0711 → 0.0682 s (10 and 14 runs). A stretch without such full words
//! stays one packed run: a dense run saves its full words' mask bytes, but expanding its masks
//! costs more than that saves when they are few (a page of partitioned keys, a full word in
//! four, applied in 0.86 µs dense against 0.56 packed).
//!
//! Where every partly changed run is packed, a stretch of changed words also bridges gaps of up
//! to [`BRIDGE_MAX_WORDS`] unchanged words: they join the packed run with a zero mask byte each
//! and no data, which costs no more bytes than the run header it saves. Run headers cost time
//! more than bytes: fft's pages, whose complex values keep a word here and there, took ~52 runs a
//! page, most of one to three words; bridged, making a diff took 1.1 µs instead of 1.4 and
//! applying it 0.6 µs instead of 1.2, at 1.6% fewer bytes. (Bridging gaps of up to 8 words
//! halved the cost again, for 5% more bytes; on a slower network than loopback, and for sparser
//! writes, whose bytes it would grow by half, that is the wrong trade.) The bridged stretches are
//! themselves a bit set, made with a few shifts per 64 words (`bridged`): searching for each
//! gap took two bit searches a gap, and a partitioned page of 32-bit keys (a word in four
//! unchanged, ~100 gaps) took 0.91 µs to diff instead of 0.53 (`cargo bench --bench diff`).
//!
//! A diff arrives from a peer, so [`Diff::apply`] checks every length and offset and returns a
//! [`DiffError`] instead of panicking.

use super::shared_bytes::{SharedBytes, offer, share_or_copy};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;

/// A run-length encoded diff of one page.
///
/// The bytes are shared: a writer keeps its diffs until a collection and hands each to every
/// node that asks, so cloning one into a reply is a reference count, not a copy; and a diff
/// decoded inside [`decode_sharing`](super::decode_sharing) is a slice of the frame it came in.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Diff(SharedBytes);

impl Serialize for Diff {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // An encoder writing a frame in parts keeps these bytes by reference (`shared_bytes`).
        offer(&self.0);
        s.serialize_bytes(&self.0)
    }
}

/// A peer's diff of no bytes is refused as it is decoded: no node records or sends one (a twin
/// that turned out unchanged makes no diff), and a list of them decoded into ~27 times its
/// wire bytes (3 bytes an entry, 80 in memory), the one list whose length no honest bound
/// limits (`transport::codec`). An entry now takes at least 4 bytes on the wire (~20 times).
fn some_bytes<E: serde::de::Error>(v: &[u8]) -> Result<&[u8], E> {
    if v.is_empty() { Err(E::custom("a diff of no bytes, which no node sends")) } else { Ok(v) }
}

impl<'de> Deserialize<'de> for Diff {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Diff, D::Error> {
        struct Bytes;
        impl<'de> serde::de::Visitor<'de> for Bytes {
            type Value = Diff;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("the bytes of a diff")
            }
            // A slice of the frame being decoded, else one allocation at the exact size.
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Diff, E> {
                some_bytes(v).map(|v| Diff(share_or_copy(v)))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Diff, E> {
                some_bytes(&v).map(|v| Diff(SharedBytes::copy_of(v)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Diff, A::Error> {
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(b) = seq.next_element()? {
                    v.push(b);
                }
                some_bytes(&v).map(|v| Diff(SharedBytes::copy_of(v)))
            }
        }
        d.deserialize_bytes(Bytes)
    }
}

impl std::fmt::Debug for Diff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Diff({} bytes)", self.0.len())
    }
}

/// A malformed diff.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiffError {
    /// The encoding ends in the middle of a run.
    #[error("diff truncated at byte {at} of {len}")]
    Truncated { at: usize, len: usize },
    /// A run reaches past the end of the page.
    #[error("diff run at offset {offset} of {len} bytes overruns the {page_size}-byte page")]
    Overrun { offset: usize, len: usize, page_size: usize },
}

/// One changed byte range of a page.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Run {
    /// Offset of the first changed byte.
    pub offset: usize,
    /// Number of changed bytes.
    pub len: usize,
}

const WORD: usize = 8;

/// Fewest consecutive fully changed words, inside a stretch of changed words, that are encoded as
/// a full run of their own: splitting a masked run costs up to two run headers (2-6 bytes) and
/// saves a mask byte per word.
pub const MIN_FULL_RUN: usize = 8;

/// Most changed bytes per word, on average over a run of partly changed words, for which the run
/// is packed rather than masked (see the module docs).
pub const PACK_MAX_BYTES: usize = 6;

/// Most unchanged words between two stretches of changed words that a packed run bridges, when
/// every partly changed run is packed ([`crate::mem::pack::packs_cheaply`]): a bridged word costs
/// its mask byte (zero, and no data), a run of its own two header bytes or more, and each run a
/// few nanoseconds to make and to apply. fft's pages (complex values, some kept) came out in ~52
/// runs, most of one to three words.
pub const BRIDGE_MAX_WORDS: usize = 2;

/// The kind of a run, in the low two bits of its header.
const FULL: usize = 0;
const MASKED: usize = 1;
const PACKED: usize = 2;
const DENSE: usize = 3;

fn put_varint(out: &mut Vec<u8>, mut v: usize) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(b: &[u8], at: &mut usize) -> Option<usize> {
    let mut v = 0usize;
    for shift in (0..35).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// Per-thread scratch of [`Diff::make`], kept between calls so that making a diff allocates only
/// the diff itself, at its exact size.
#[derive(Default)]
struct Scratch {
    /// Which bytes of each word changed.
    masks: Vec<u8>,
    /// Words changed at all, fully, and the first words of [`MIN_FULL_RUN`] fully changed ones:
    /// bit sets, 64 words to an element.
    changed: Vec<u64>,
    full: Vec<u64>,
    full_runs: Vec<u64>,
    /// The changed words and the unchanged ones bridged between them: one stretch of set bits
    /// per stretch the encoder cuts into runs.
    stretches: Vec<u64>,
    /// The encoding.
    out: Vec<u8>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The first set bit of `set` at or after `from` and before `end`.
fn next_one(set: &[u64], from: usize, end: usize) -> Option<usize> {
    next_bit(set, from, end, 0)
}

/// The first clear bit of `set` at or after `from`, or `end` if there is none before it.
fn next_zero(set: &[u64], from: usize, end: usize) -> usize {
    next_bit(set, from, end, !0).unwrap_or(end)
}

/// The first bit at or after `from` and before `end` of `set`, each element XORed with `flip`.
fn next_bit(set: &[u64], from: usize, end: usize, flip: u64) -> Option<usize> {
    if from >= end {
        return None;
    }
    let mut k = from / 64;
    let mut x = (set[k] ^ flip) & (!0u64 << (from % 64));
    loop {
        if x != 0 {
            return Some(k * 64 + x.trailing_zeros() as usize).filter(|&i| i < end);
        }
        k += 1;
        if k * 64 >= end {
            return None;
        }
        x = set[k] ^ flip;
    }
}

/// Sets in `out` the bits of `changed` and the clear bits between them in gaps of at most
/// `bridge`: bit i is filled if a set bit lies `a` before it and another `c` after it, with
/// `a + c <= bridge + 1`. A few shifts per 64 words, where finding each gap by bit search cost
/// two searches a gap (pages where one word in four keeps its value have ~100 gaps).
fn bridged(changed: &[u64], bridge: usize, out: &mut [u64]) {
    for k in 0..changed.len() {
        let x = changed[k];
        let (prev, next) = (if k > 0 { changed[k - 1] } else { 0 }, changed.get(k + 1).copied().unwrap_or(0));
        // Bit i of `before(a)`: bit i - a of the whole set; of `after(c)`: bit i + c.
        let before = |a: usize| x << a | prev >> (64 - a);
        let after = |c: usize| x >> c | next << (64 - c);
        out[k] = match bridge {
            0 => x,
            // The default, unrolled: a gap of one, or the first or second bit of a gap of two.
            2 => x | before(1) & (after(1) | after(2)) | before(2) & after(1),
            _ => (1..=bridge)
                .flat_map(|a| (1..=bridge + 1 - a).map(move |c| (a, c)))
                .fold(x, |filled, (a, c)| filled | before(a) & after(c)),
        };
    }
}

/// Appends the encoding of `page`'s changed words to `out`, given which bytes of each word changed
/// (`s.masks`), as bit sets made by [`crate::mem::bytes::word_sets`].
///
/// It costs a few bit operations per run rather than a branch per word: floating-point data,
/// where fully and partly changed words alternate at random, made a per-word loop the largest
/// cost of a bulk transfer.
fn encode(s: &mut Scratch, page: &[u8]) {
    let Scratch { masks, changed, full, full_runs, stretches, out } = s;
    let words = masks.len();
    // Bit i of `full_runs`: words i..i + MIN_FULL_RUN all changed fully.
    for k in 0..full.len() {
        let (x, next) = (full[k], full.get(k + 1).copied().unwrap_or(0));
        full_runs[k] = (1..MIN_FULL_RUN).fold(x, |r, sh| r & (x >> sh | next << (64 - sh)));
    }
    let mut prev_end = 0usize;
    let pack_all = crate::mem::pack::packs_cheaply();
    bridged(changed, if pack_all { BRIDGE_MAX_WORDS } else { 0 }, stretches);
    // Words start..end as one run, but for bridged unchanged words at either end (which belong
    // in the gap): full if every word changed fully.
    let mut emit = |mut start: usize, mut end: usize| {
        while start < end && masks[start] == 0 {
            start += 1;
        }
        while end > start && masks[end - 1] == 0 {
            end -= 1;
        }
        if start == end {
            return;
        }
        let (words, m) = (&page[start * WORD..end * WORD], &masks[start..end]);
        let masked = next_bit(full, start, end, !0).is_some();
        // Dense where the words hold a stretch of MIN_FULL_RUN fully changed ones, which a
        // packed run would carry with a mask byte each and a masked or packed run split out
        // (two run headers, and a run more to make and apply, each time).
        let kind = if !masked {
            FULL
        } else if pack_all
            && end - start >= MIN_FULL_RUN
            && next_one(full_runs, start, end + 1 - MIN_FULL_RUN).is_some()
        {
            DENSE
        } else if pack_all || crate::mem::pack::packed_len(m) <= PACK_MAX_BYTES * m.len() {
            PACKED
        } else {
            MASKED
        };
        put_varint(out, start - prev_end);
        put_varint(out, (end - start) << 2 | kind);
        match kind {
            FULL => out.extend_from_slice(words),
            MASKED => {
                out.extend_from_slice(m);
                out.extend_from_slice(words);
            }
            PACKED => {
                out.extend_from_slice(m);
                crate::mem::pack::pack(words, m, out);
            }
            _ => {
                crate::mem::pack::shorten_masks(m, out);
                crate::mem::pack::pack(words, m, out);
            }
        }
        prev_end = end;
    };
    let mut w = 0usize;
    while let Some(start) = next_one(stretches, w, words) {
        let end = next_zero(stretches, start, words);
        // Changed words start..end (unchanged ones bridged). Where every partly changed run is
        // packed, one run: dense, or full if every word changed fully. Otherwise full runs for
        // stretches of at least MIN_FULL_RUN fully changed words (or for all of what is left if
        // it is fully changed), masked or packed runs for the rest.
        let mut from = start;
        while let Some(i) = next_one(full_runs, from, end).filter(|_| !pack_all) {
            let j = next_zero(full, i, end);
            emit(from, i);
            emit(i, j);
            from = j;
        }
        emit(from, end);
        w = end;
    }
}

/// One decoded run: its first word, its length in words, its masks (`None` if full; if dense,
/// those of the words not full), its full bitmap if dense, whether it is packed (dense runs
/// are), and its data (all of its words, or if packed the bytes the masks select).
struct RunRef<'a> {
    first_word: usize,
    words: usize,
    masks: Option<&'a [u8]>,
    full: Option<&'a [u8]>,
    packed: bool,
    data: &'a [u8],
}

impl RunRef<'_> {
    /// Every word's mask (all `0xff` for a full run).
    fn word_masks(&self) -> Vec<u8> {
        match (self.masks, self.full) {
            (None, _) => vec![0xff; self.words],
            (Some(m), None) => m.to_vec(),
            (Some(rest), Some(bitmap)) => {
                let mut masks = vec![0; self.words];
                crate::mem::pack::expand_masks(bitmap, rest, &mut masks);
                masks
            }
        }
    }
}

impl Diff {
    /// The diff that turns `twin` into `page`.
    pub fn make(twin: &[u8], page: &[u8]) -> Diff {
        assert_eq!(twin.len(), page.len(), "twin and page differ in size");
        assert!(page.len().is_multiple_of(WORD), "a page of {} bytes is not whole words", page.len());
        SCRATCH.with_borrow_mut(|s| {
            let words = page.len() / WORD;
            s.masks.resize(words, 0);
            crate::mem::bytes::changed_byte_masks(twin, page, &mut s.masks);
            for set in [&mut s.changed, &mut s.full, &mut s.full_runs, &mut s.stretches] {
                set.resize(words.div_ceil(64), 0);
            }
            crate::mem::bytes::word_sets(&s.masks, &mut s.changed, &mut s.full);
            s.out.clear();
            encode(s, page);
            Diff(crate::mem::chunk::store(&s.out))
        })
    }

    /// The diff that writes all of `page`: one full run. What a page declared overwritten is
    /// diffed as, whatever its twin holds ([`crate::protocol::page`]).
    pub fn whole(page: &[u8]) -> Diff {
        assert!(page.len().is_multiple_of(WORD), "a page of {} bytes is not whole words", page.len());
        // The header in the scratch buffer, the page copied once, straight into the chunk.
        SCRATCH.with_borrow_mut(|s| {
            s.out.clear();
            put_varint(&mut s.out, 0);
            put_varint(&mut s.out, (page.len() / WORD) << 2 | FULL);
            Diff(crate::mem::chunk::store_parts(&[&s.out, page]))
        })
    }

    /// This diff in an allocation of its own, if it is part of a larger buffer (the frame it
    /// arrived in), which it would otherwise keep alive.
    pub(crate) fn detached(self) -> Diff {
        if self.0.owner_len() > self.0.len() { Diff(SharedBytes::copy_of(&self.0)) } else { self }
    }

    /// Most bytes a diff of a page of `page_size` bytes is accepted from a peer in. Every run
    /// covers a word at least and costs two varints of a few bytes, a mask byte or a bitmap bit
    /// a word, and at most the word's 8 bytes: a page whose every word changed in part takes
    /// 9/8 of the page and a header in masked runs (where packing them costs more than it
    /// saves), and the largest of a test of many shapes took 4,141 bytes of 4,096 here (packed);
    /// a whole page's diff is 3 bytes more than it. Twice the page leaves room for any
    /// encoding's headers. A larger diff from a peer would be held, maybe long, before being
    /// applied and found malformed.
    pub fn most_encoded_len(page_size: usize) -> usize {
        2 * page_size + 64
    }

    /// True if the diff changes nothing.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Encoded size in bytes.
    pub fn encoded_len(&self) -> usize {
        self.0.len()
    }

    /// The encoded bytes.
    pub fn encoded(&self) -> &[u8] {
        &self.0
    }

    /// The changed byte ranges, exact to the byte (for the race checker and for tests).
    pub fn runs(&self, page_size: usize) -> Result<Vec<Run>, DiffError> {
        let mut runs: Vec<Run> = Vec::new();
        let mut push = |offset: usize| match runs.last_mut() {
            Some(r) if r.offset + r.len == offset => r.len += 1,
            _ => runs.push(Run { offset, len: 1 }),
        };
        self.walk(page_size, |run| {
            for (k, mask) in run.word_masks().into_iter().enumerate() {
                for b in (0..WORD).filter(|b| (mask >> b) & 1 == 1) {
                    push((run.first_word + k) * WORD + b);
                }
            }
        })?;
        Ok(runs)
    }

    /// Writes the diff's changed bytes into `page`. A malformed diff leaves `page` untouched.
    pub fn apply(&self, page: &mut [u8]) -> Result<(), DiffError> {
        let b: &[u8] = &self.0;
        SPANS.with_borrow_mut(|runs| {
            runs.clear();
            spans(b, page.len(), |span| runs.push(span))?;
            runs.iter().for_each(|span| apply_run(span.run(b), page));
            Ok(())
        })
    }

    fn walk<'a>(&'a self, page_size: usize, mut f: impl FnMut(RunRef<'a>)) -> Result<(), DiffError> {
        // Deref the shared bytes once (a call through the owner's vtable), not per field.
        let b: &'a [u8] = &self.0;
        spans(b, page_size, |span| f(span.run(b)))
    }
}

/// Writes the changed bytes of one run, checked, into `page`.
fn apply_run(run: RunRef<'_>, page: &mut [u8]) {
    let at = run.first_word * WORD;
    let dst = &mut page[at..at + run.words * WORD];
    match (run.masks, run.full) {
        (None, _) => dst.copy_from_slice(run.data),
        (Some(rest), Some(bitmap)) => crate::mem::pack::unpack_dense(dst, bitmap, rest, run.data),
        (Some(masks), None) if run.packed => crate::mem::pack::unpack(dst, masks, run.data),
        (Some(masks), None) => {
            let words = dst.chunks_exact_mut(WORD).zip(run.data.chunks_exact(WORD));
            for ((d, s), &m) in words.zip(masks) {
                let keep = crate::mem::pack::byte_mask(m);
                let old = u64::from_le_bytes((&*d).try_into().expect("8 bytes"));
                let new = u64::from_le_bytes(s.try_into().expect("8 bytes"));
                d.copy_from_slice(&((old & !keep) | (new & keep)).to_le_bytes());
            }
        }
    }
}

/// Where one run's parts lie in a diff's encoding: a [`RunRef`] by byte offsets, which
/// [`Diff::apply`] keeps between checking every run and applying them.
#[derive(Clone, Copy)]
struct RunSpan {
    first_word: usize,
    words: usize,
    kind: usize,
    /// Where the bitmap (dense runs), the masks and the data begin, and where the data ends.
    bitmap: usize,
    masks: usize,
    data: usize,
    end: usize,
}

impl RunSpan {
    fn run<'a>(&self, b: &'a [u8]) -> RunRef<'a> {
        RunRef {
            first_word: self.first_word,
            words: self.words,
            masks: (self.kind != FULL).then(|| &b[self.masks..self.data]),
            full: (self.kind == DENSE).then(|| &b[self.bitmap..self.masks]),
            packed: self.kind == PACKED || self.kind == DENSE,
            data: &b[self.data..self.end],
        }
    }
}

/// Decodes the runs of the encoding `b` for a page of `page_size` bytes, checking every length
/// and offset, and hands each to `f` in order.
fn spans(b: &[u8], page_size: usize, mut f: impl FnMut(RunSpan)) -> Result<(), DiffError> {
    let words = page_size / WORD;
    let (mut at, mut pos) = (0usize, 0usize);
    while at < b.len() {
        let truncated = DiffError::Truncated { at, len: b.len() };
        let gap = get_varint(b, &mut at).ok_or(truncated.clone())?;
        let header = get_varint(b, &mut at).ok_or(truncated.clone())?;
        let (len, kind) = (header >> 2, header & 3);
        let first_word = pos.checked_add(gap).filter(|f| f.checked_add(len).is_some_and(|e| e <= words));
        let first_word = first_word.ok_or(DiffError::Overrun {
            offset: pos.saturating_add(gap).saturating_mul(WORD),
            len: len.saturating_mul(WORD),
            page_size,
        })?;
        let bitmap = at;
        let masks = if kind == DENSE { bitmap + len.div_ceil(8) } else { bitmap };
        let mask_bytes = match kind {
            FULL => 0,
            DENSE => crate::mem::pack::shortened_len(b.get(bitmap..masks).ok_or(truncated.clone())?, len),
            _ => len,
        };
        let data = masks + mask_bytes;
        let m = b.get(masks..data).ok_or(truncated.clone())?;
        let data_len = match kind {
            // A dense run's full words carry their 8 bytes each.
            PACKED | DENSE => crate::mem::pack::packed_len(m) + WORD * (len - mask_bytes),
            _ => len * WORD,
        };
        let end = data + data_len;
        if end > b.len() {
            return Err(truncated);
        }
        f(RunSpan { first_word, words: len, kind, bitmap, masks, data, end });
        at = end;
        pos = first_word + len;
    }
    Ok(())
}

thread_local! {
    /// The runs of the diff being applied, checked ([`Diff::apply`]).
    static SPANS: RefCell<Vec<RunSpan>> = const { RefCell::new(Vec::new()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    fn scribble(rng: &mut Rng, page: &mut [u8], only: impl Fn(usize) -> bool) {
        for _ in 0..rng.below(40) {
            let start = rng.below(page.len());
            let len = rng.below(64).min(page.len() - start);
            for (i, byte) in page.iter_mut().enumerate().skip(start).take(len) {
                if only(i) {
                    *byte = rng.next() as u8;
                }
            }
        }
    }

    #[test]
    fn diff_applied_to_twin_gives_page() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        for _ in 0..2000 {
            let mut twin = vec![0u8; 4096];
            scribble(&mut rng, &mut twin, |_| true);
            let mut page = twin.clone();
            scribble(&mut rng, &mut page, |_| true);
            let d = Diff::make(&twin, &page);
            let mut t = twin.clone();
            d.apply(&mut t).unwrap();
            assert_eq!(t, page);
            let changed: usize = d.runs(4096).unwrap().iter().map(|r| r.len).sum();
            let truth = twin.iter().zip(&page).filter(|(a, b)| a != b).count();
            assert_eq!(changed, truth, "runs are exact to the byte");
        }
    }

    #[test]
    fn partly_changed_words_carry_only_their_changed_bytes() {
        // Converging doubles: every word changes in its two low bytes only.
        let twin: Vec<u8> = (0..512).flat_map(|i| (1.0 + f64::from(i) / 512.0).to_le_bytes()).collect();
        let mut page = twin.clone();
        for w in page.chunks_exact_mut(WORD) {
            w[0] ^= 0x5a;
            w[1] ^= 0xa5;
        }
        let d = Diff::make(&twin, &page);
        // One packed run: three header bytes (gap 0; 512 << 2 | 2 as a varint), then per word
        // a mask byte and two data bytes.
        assert_eq!(d.encoded_len(), 1 + 2 + 512 * 3);
        let mut t = twin.clone();
        d.apply(&mut t).unwrap();
        assert_eq!(t, page);
        let runs = d.runs(4096).unwrap();
        assert_eq!(runs.len(), 512);
        assert!(runs.iter().enumerate().all(|(i, r)| *r == Run { offset: i * WORD, len: 2 }));
        // Seven bytes of eight changed: the words travel whole, unless packing is as cheap as
        // copying them.
        let mut page = twin.clone();
        for w in page.chunks_exact_mut(WORD) {
            w[..7].iter_mut().for_each(|b| *b ^= 0x81);
        }
        let d = Diff::make(&twin, &page);
        let per_word = if crate::mem::pack::packs_cheaply() { 8 } else { 9 };
        assert_eq!(d.encoded_len(), 1 + 2 + 512 * per_word);
        let mut t = twin.clone();
        d.apply(&mut t).unwrap();
        assert_eq!(t, page);
    }

    #[test]
    fn diffs_of_two_writers_of_disjoint_bytes_merge_in_either_order() {
        let mut rng = Rng(0xdead_beef_cafe_f00d);
        for _ in 0..1000 {
            let mut base = vec![0u8; 4096];
            scribble(&mut rng, &mut base, |_| true);
            // Writer A owns even 4-byte words, writer B odd ones; byte-level interleaving too.
            let stride = 1 + rng.below(8);
            let (mut a, mut b) = (base.clone(), base.clone());
            scribble(&mut rng, &mut a, |i| (i / stride).is_multiple_of(2));
            scribble(&mut rng, &mut b, |i| (i / stride) % 2 == 1);
            let (da, db) = (Diff::make(&base, &a), Diff::make(&base, &b));
            let expect: Vec<u8> =
                (0..4096).map(|i| if (i / stride).is_multiple_of(2) { a[i] } else { b[i] }).collect();
            for order in [[&da, &db], [&db, &da]] {
                let mut m = base.clone();
                for d in order {
                    d.apply(&mut m).unwrap();
                }
                assert_eq!(m, expect);
            }
        }
    }

    #[test]
    fn random_bytes_as_a_diff_are_an_error_or_a_change_never_a_panic() {
        let mut state = 0x1234_5678_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for i in 0..200_000u64 {
            let len = (next() % 24) as usize;
            // Small run headers half the time, so that many runs fit the page and are applied.
            let bytes: Vec<u8> = (0..len)
                .map(|k| if k < 2 && next() % 2 == 0 { next() as u8 & 0x3f } else { next() as u8 })
                .collect();
            let page_size = 8 << (i % 6);
            let diff = Diff(SharedBytes::copy_of(&bytes));
            let mut page = vec![0u8; page_size];
            let _ = diff.apply(&mut page);
            let _ = diff.runs(page_size);
        }
    }

    #[test]
    fn malformed_diffs_are_errors_and_change_nothing() {
        let mut rng = Rng(42);
        let twin = vec![0u8; 256];
        let mut page = twin.clone();
        scribble(&mut rng, &mut page, |_| true);
        let good = Diff::make(&twin, &page);
        for _ in 0..5000 {
            let mut bytes = good.0.to_vec();
            if bytes.is_empty() {
                break;
            }
            match rng.below(3) {
                0 => bytes.truncate(rng.below(bytes.len())),
                1 => {
                    let i = rng.below(bytes.len());
                    bytes[i] = rng.next() as u8;
                }
                _ => bytes.extend((0..rng.below(9)).map(|_| rng.next() as u8)),
            }
            let mut target = vec![7u8; 256];
            if Diff(SharedBytes::copy_of(&bytes)).apply(&mut target).is_err() {
                assert_eq!(target, vec![7u8; 256]);
            }
        }
        assert!(matches!(
            Diff(SharedBytes::copy_of(&[0x05, 0xfc, 0xff, 0x03])).apply(&mut [0; 16]),
            Err(DiffError::Overrun { .. })
        ));
        assert!(matches!(
            Diff(SharedBytes::copy_of(&[0x01, 0x08, 1])).apply(&mut [0; 16]),
            Err(DiffError::Overrun { .. })
        ));
        assert!(matches!(
            Diff(SharedBytes::copy_of(&[0x00, 0x04, 1])).apply(&mut [0; 16]),
            Err(DiffError::Truncated { .. })
        ));
        assert!(matches!(
            Diff(SharedBytes::copy_of(&[0x00, 0x05, 1])).apply(&mut [0; 16]),
            Err(DiffError::Truncated { .. })
        ));
        assert!(matches!(
            Diff(SharedBytes::copy_of(&[0x00, 0x06, 3, 1])).apply(&mut [0; 16]),
            Err(DiffError::Truncated { .. })
        ));
        // A dense run of one word: its bitmap byte (full), then 8 bytes of data, cut short; and
        // one whose word is not full, without its mask.
        assert!(matches!(
            Diff(SharedBytes::copy_of(&[0x00, 0x07, 1, 9, 9])).apply(&mut [0; 16]),
            Err(DiffError::Truncated { .. })
        ));
        assert!(matches!(
            Diff(SharedBytes::copy_of(&[0x00, 0x07, 0])).apply(&mut [0; 16]),
            Err(DiffError::Truncated { .. })
        ));
        assert!(matches!(
            Diff(SharedBytes::copy_of(&[0x00, 0x07])).apply(&mut [0; 16]),
            Err(DiffError::Truncated { .. })
        ));
    }

    #[test]
    fn full_and_partly_changed_words_round_trip() {
        // A page of floats, all changed (full runs), then of counters changed in their low
        // bytes only (masked runs), then every other word (runs of one word).
        let twin: Vec<u8> = (0..512u64).flat_map(|i| (i as f64 * 0.37).to_le_bytes()).collect();
        let pages: [Vec<u8>; 3] = [
            (0..512u64).flat_map(|i| (i as f64 * 0.41 + 1e-3).to_le_bytes()).collect(),
            twin.chunks(8)
                .enumerate()
                .flat_map(|(i, c)| {
                    let mut c = c.to_vec();
                    c[0] ^= 0x5a | (i as u8 & 1);
                    c
                })
                .collect(),
            twin.chunks(8)
                .enumerate()
                .flat_map(|(i, c)| if i % 2 == 0 { c.to_vec() } else { vec![0xee; 8] })
                .collect(),
        ];
        for page in pages {
            let d = Diff::make(&twin, &page);
            let mut t = twin.clone();
            d.apply(&mut t).unwrap();
            assert_eq!(t, page);
            let changed: usize = d.runs(4096).unwrap().iter().map(|r| r.len).sum();
            assert_eq!(changed, twin.iter().zip(&page).filter(|(a, b)| a != b).count());
        }
    }

    #[test]
    fn a_fully_changed_page_is_one_full_run() {
        let twin: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        let page: Vec<u8> = twin.iter().map(|b| !b).collect();
        let d = Diff::make(&twin, &page);
        // gap 0, header 512 << 2 (full) as a varint, then the page as is.
        assert_eq!(&d.0[..3], &[0x00, 0x80, 0x10]);
        assert_eq!(&d.0[3..], &page[..]);
        let mut t = twin.clone();
        d.apply(&mut t).unwrap();
        assert_eq!(t, page);
        assert_eq!(d.runs(4096).unwrap(), vec![Run { offset: 0, len: 4096 }]);
        // The same bytes cut short, or claimed for a smaller page, are typed errors.
        let mut short = d.0.to_vec();
        short.truncate(2000);
        assert!(matches!(Diff(SharedBytes::copy_of(&short)).apply(&mut t), Err(DiffError::Truncated { .. })));
        assert!(matches!(d.apply(&mut [0; 2048]), Err(DiffError::Overrun { .. })));
        // A whole-page diff is that same encoding, whatever the twin: it writes every byte, even
        // those equal to the twin's.
        assert_eq!(Diff::whole(&page), d);
        let mut other = page.clone();
        other[..8].copy_from_slice(&twin[..8]);
        let (mut by_make, mut by_whole) = (page.clone(), page.clone());
        Diff::make(&twin, &other).apply(&mut by_make).unwrap();
        Diff::whole(&other).apply(&mut by_whole).unwrap();
        assert_eq!(&by_make[..8], &page[..8], "make leaves the bytes equal to the twin");
        assert_eq!(by_whole, other);
        assert_eq!(t, page, "failed applies change nothing");
    }

    #[test]
    fn long_fully_changed_stretches_are_split_out_of_masked_runs() {
        let twin = vec![0u8; 4096];
        let mut rng = Rng(99);
        for _ in 0..500 {
            // Every word changes; a few keep one byte, at random places.
            let mut page = vec![0x11u8; 4096];
            for _ in 0..rng.below(40) {
                page[rng.below(4096)] = 0;
            }
            let d = Diff::make(&twin, &page);
            let mut t = twin.clone();
            d.apply(&mut t).unwrap();
            assert_eq!(t, page);
            let changed: usize = d.runs(4096).unwrap().iter().map(|r| r.len).sum();
            assert_eq!(changed, page.iter().filter(|&&b| b != 0).count());
            // Far less than a mask byte per word.
            assert!(d.encoded_len() < 4096 + 40 * 8, "{} bytes", d.encoded_len());
        }
        // A stretch of MIN_FULL_RUN fully changed words between partly changed ones is its own
        // run; a shorter one stays masked. Where every partly changed run is packed, both are
        // one dense run.
        let split = if crate::mem::pack::packs_cheaply() { 1 } else { 3 };
        for (stretch, runs) in [(MIN_FULL_RUN, split), (MIN_FULL_RUN - 1, 1)] {
            let mut page = vec![0u8; 4096];
            page[..8].copy_from_slice(&[1, 1, 1, 1, 1, 1, 1, 0]);
            page[8..8 + 8 * stretch].fill(2);
            page[8 + 8 * stretch..16 + 8 * stretch].copy_from_slice(&[0, 3, 3, 3, 3, 3, 3, 3]);
            let d = Diff::make(&twin, &page);
            let mut n = 0;
            d.walk(4096, |_| n += 1).unwrap();
            assert_eq!(n, runs, "stretch of {stretch}");
            let mut t = twin.clone();
            d.apply(&mut t).unwrap();
            assert_eq!(t, page);
        }
    }

    #[test]
    fn random_keys_over_a_page_are_one_dense_run_where_every_run_is_packed() {
        // Random 32-bit keys written over zeros (a sort's input): a word in ~30 keeps a zero
        // byte, which split the old encoding into ~60 full and packed runs.
        let mut rng = Rng(0x7777_1234_abcd_0001);
        let twin = vec![0u8; 4096];
        let page: Vec<u8> = (0..1024).flat_map(|_| (rng.next() as u32).to_le_bytes()).collect();
        let mut masks = vec![0; 512];
        crate::mem::bytes::changed_byte_masks(&twin, &page, &mut masks);
        let (partial, changed) = (
            masks.iter().filter(|&&m| m != 0xff).count(),
            masks.iter().map(|m| m.count_ones() as usize).sum::<usize>(),
        );
        assert!(partial > 0, "the page has partly changed words");
        let d = Diff::make(&twin, &page);
        let mut t = twin.clone();
        d.apply(&mut t).unwrap();
        assert_eq!(t, page);
        let runs: usize = d.runs(4096).unwrap().iter().map(|r| r.len).sum();
        assert_eq!(runs, changed, "exact to the byte");
        if crate::mem::pack::packs_cheaply() {
            let mut kinds = Vec::new();
            d.walk(4096, |r| kinds.push(r.full.is_some())).unwrap();
            assert_eq!(kinds, vec![true], "one dense run");
            // Header (gap 0, 512 << 2 | 3: three bytes), a bit per word, a mask per word not
            // full, the changed bytes.
            assert_eq!(d.encoded_len(), 3 + 64 + partial + changed);
        }
    }

    /// The encoder as first written, a branch per word: the reference for the bit-set one. Runs
    /// of partly changed words are packed as the encoder packs them here, or with `pack` set,
    /// always or never (as a node with another kernel may).
    fn reference_encode(masks: &[u8], page: &[u8], pack: Option<bool>) -> Vec<u8> {
        let mut out = Vec::new();
        let mut prev_end = 0usize;
        // A node that packs every partly changed run bridges short gaps and splits out no full
        // runs; one that does not, neither.
        let pack_all = pack.unwrap_or_else(crate::mem::pack::packs_cheaply);
        let bridge = if pack_all { BRIDGE_MAX_WORDS } else { 0 };
        let mut emit = |out: &mut Vec<u8>, from: usize, to: usize| {
            // Unchanged words at either end are left to the gaps.
            let Some(start) = (from..to).find(|&w| masks[w] != 0) else { return };
            let end = 1 + (start..to).rfind(|&w| masks[w] != 0).expect("start is changed");
            let masked = masks[start..end].iter().any(|&m| m != 0xff);
            let changed: usize = masks[start..end].iter().map(|m| m.count_ones() as usize).sum();
            let pack_all = pack.unwrap_or_else(crate::mem::pack::packs_cheaply);
            let long_full = masks[start..end].windows(MIN_FULL_RUN).any(|w| w.iter().all(|&m| m == 0xff));
            let dense = masked && pack_all && long_full;
            let packed = masked && (pack_all || changed <= PACK_MAX_BYTES * (end - start));
            put_varint(out, start - prev_end);
            let kind = if dense {
                3
            } else if packed {
                2
            } else {
                usize::from(masked)
            };
            put_varint(out, (end - start) << 2 | kind);
            if dense {
                // The full bitmap, a bit per word, then the masks of the words not full.
                for group in masks[start..end].chunks(8) {
                    out.push(
                        group.iter().enumerate().filter(|(_, m)| **m == 0xff).fold(0, |f, (b, _)| f | 1 << b),
                    );
                }
                out.extend(masks[start..end].iter().filter(|&&m| m != 0xff));
            } else if masked {
                out.extend_from_slice(&masks[start..end]);
            }
            if packed {
                // Each word's selected bytes, low byte first.
                for w in start..end {
                    out.extend((0..WORD).filter(|b| (masks[w] >> b) & 1 == 1).map(|b| page[w * WORD + b]));
                }
            } else {
                out.extend_from_slice(&page[start * WORD..end * WORD]);
            }
            prev_end = end;
        };
        let (words, mut w) = (masks.len(), 0);
        while w < words {
            while w < words && masks[w] == 0 {
                w += 1;
            }
            if w == words {
                break;
            }
            let start = w;
            // Changed words, and gaps of at most `bridge` unchanged ones between them.
            loop {
                while w < words && masks[w] != 0 {
                    w += 1;
                }
                let mut g = w;
                while g < words && masks[g] == 0 && g - w < bridge {
                    g += 1;
                }
                if g > w && g < words && masks[g] != 0 {
                    w = g;
                } else {
                    break;
                }
            }
            let (mut from, mut i) = (start, start);
            while i < w {
                if masks[i] != 0xff {
                    i += 1;
                    continue;
                }
                let mut j = i;
                while j < w && masks[j] == 0xff {
                    j += 1;
                }
                if !pack_all && (j - i >= MIN_FULL_RUN || (i == from && j == w)) {
                    emit(&mut out, from, i);
                    emit(&mut out, i, j);
                    from = j;
                }
                i = j;
            }
            emit(&mut out, from, w);
        }
        out
    }

    #[test]
    fn the_encoding_is_the_reference_encoders() {
        let mut rng = Rng(0x0bad_cafe_1234_5678);
        for size in [8, 16, 64, 256, 512, 4096, 8192] {
            for _ in 0..3000 / (1 + size / 1024) {
                let twin: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
                // Words unchanged, changed fully or in some bytes, in stretches of random
                // lengths (so runs cross 64-word boundaries and meet the page ends).
                let mut page = twin.clone();
                let mut w = 0;
                while w < size / WORD {
                    let (kind, len) = (rng.below(4), 1 + rng.below(24));
                    for v in w..(w + len).min(size / WORD) {
                        for b in 0..WORD {
                            let change = match kind {
                                0 => false,
                                1 => true,
                                2 => rng.below(8) != 0,
                                _ => b != 7,
                            };
                            if change {
                                page[v * WORD + b] ^= 1 + (rng.next() % 255) as u8;
                            }
                        }
                    }
                    w += len;
                }
                let d = Diff::make(&twin, &page);
                let mut masks = vec![0; size / WORD];
                crate::mem::bytes::changed_byte_masks(&twin, &page, &mut masks);
                assert_eq!(&d.0[..], &reference_encode(&masks, &page, None)[..], "page of {size} bytes");
                // What a node packing every run, or none, would send applies alike.
                for pack in [true, false] {
                    let other = Diff(SharedBytes::copy_of(&reference_encode(&masks, &page, Some(pack))));
                    let mut t = twin.clone();
                    other.apply(&mut t).unwrap();
                    assert_eq!(t, page, "page of {size} bytes, every run packed: {pack}");
                    assert_eq!(other.runs(size).unwrap(), d.runs(size).unwrap());
                }
                let mut t = twin.clone();
                d.apply(&mut t).unwrap();
                assert_eq!(t, page);
            }
        }
    }

    #[test]
    fn bridging_fills_exactly_the_gaps_of_at_most_bridge_clear_bits() {
        let mut rng = Rng(0x5eed_b1d9_e5e7_0001);
        for len in [1usize, 2, 3, 8, 64, 65, 128, 200, 512] {
            for bridge in 0..=3 {
                for _ in 0..300 {
                    // Sparse, dense and clustered sets, so that gaps of every length meet the
                    // element boundaries.
                    let density = 1 + rng.below(7);
                    let bits: Vec<bool> = (0..len).map(|_| rng.below(8) < density).collect();
                    let n = len.div_ceil(64);
                    let mut set = vec![0u64; n];
                    for (i, _) in bits.iter().enumerate().filter(|(_, b)| **b) {
                        set[i / 64] |= 1 << (i % 64);
                    }
                    let mut out = vec![!0u64; n];
                    bridged(&set, bridge, &mut out);
                    // The reference: a clear bit is filled if the run of clear bits holding it
                    // has set bits on both sides and at most `bridge` bits.
                    for i in 0..n * 64 {
                        let want = i < len && {
                            let left = (0..i).rev().find(|&j| bits[j]);
                            let right = (i..len).find(|&j| bits[j]);
                            bits[i] || matches!((left, right), (Some(l), Some(r)) if r - l - 1 <= bridge)
                        };
                        assert_eq!(
                            out[i / 64] >> (i % 64) & 1 == 1,
                            want,
                            "len {len} bridge {bridge} bit {i}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn short_gaps_are_bridged_where_every_run_is_packed() {
        let twin = vec![0u8; 64 * WORD];
        let mut page = twin.clone();
        // Three bytes of words 0, 1, 3, 4 and 8: a gap of one word, then one of three.
        for w in [0, 1, 3, 4, 8] {
            page[w * WORD..w * WORD + 3].fill(9);
        }
        let d = Diff::make(&twin, &page);
        // Bridged: words 0-4 in one packed run (2 header bytes, 5 masks, 12 bytes), then word 8
        // (2 header bytes, a mask, 3 bytes). Not bridged: runs 0-1 and 3-4 of 10 bytes each.
        let bridged = crate::mem::pack::packs_cheaply();
        assert_eq!(d.encoded_len(), if bridged { 19 + 6 } else { 10 + 10 + 6 });
        let mut t = twin.clone();
        d.apply(&mut t).unwrap();
        assert_eq!(t, page);
        let bytes = |r: &[Run]| r.iter().map(|r| r.len).sum::<usize>();
        assert_eq!(bytes(&d.runs(page.len()).unwrap()), 15, "a bridged word changes no byte");
    }

    #[test]
    fn clones_share_bytes_and_the_wire_form_is_a_byte_string() {
        let twin = vec![0u8; 4096];
        let page: Vec<u8> = (0..4096u32).map(|i| (i % 7) as u8).collect();
        let d = Diff::make(&twin, &page);
        let c = d.clone();
        assert_eq!(d.0.as_ptr(), c.0.as_ptr(), "a clone is a reference count");
        // Encoded exactly as serde_bytes encodes a byte vector (as before the bytes were shared).
        let wire = postcard::to_allocvec(&d).unwrap();
        assert_eq!(wire, postcard::to_allocvec(&serde_bytes::Bytes::new(&d.0)).unwrap());
        let back: Diff = postcard::from_bytes(&wire).unwrap();
        assert_eq!(back, d);
        assert_eq!(back.0.owner_len(), d.encoded_len(), "decoded outside a frame: a copy");
        // Decoded from a frame: a slice of it, no copy.
        let frame: std::sync::Arc<dyn super::super::ByteOwner> = std::sync::Arc::new(wire.clone());
        let shared: Diff = super::super::decode_sharing(frame, |b| postcard::from_bytes(b)).unwrap();
        assert_eq!(shared, d);
        assert_eq!(shared.0.owner_len(), wire.len(), "a slice of the frame");
        // Detached, its own allocation, keeping the frame alive no more; one already alone stays.
        let alone = shared.detached();
        assert_eq!((alone.0.owner_len(), &alone), (d.encoded_len(), &d));
        let ptr = alone.0.as_ptr();
        assert_eq!(alone.detached().0.as_ptr(), ptr, "no copy of a diff already alone");
        // Cut short: an error, not a panic.
        assert!(postcard::from_bytes::<Diff>(&wire[..wire.len() - 1]).is_err());
    }

    #[test]
    fn no_diff_a_node_makes_is_larger_than_a_peer_may_send() {
        // Changed words spread every way the encoder may cut them: a byte of every word, of
        // every other word, every third, random bytes at several densities, whole pages; on
        // the runtime's page size and the simulation's.
        let mut rng = Rng(0x0dd5_ba11_5eed_0001);
        for page_size in [64, 4096] {
            let most = Diff::most_encoded_len(page_size);
            let mut largest = 0;
            let twin = vec![0u8; page_size];
            let mut pages: Vec<Vec<u8>> = (1..4)
                .map(|every| (0..page_size).map(|i| u8::from(i % (8 * every) == 3)).collect())
                .collect();
            pages.push(vec![0xff; page_size]);
            pages.push((0..page_size).map(|i| u8::from(i % 8 != 0)).collect());
            for permille in [50, 300, 500, 700, 950] {
                for _ in 0..50 {
                    pages.push((0..page_size).map(|_| u8::from(rng.below(1000) < permille)).collect());
                }
            }
            for page in &pages {
                let len = Diff::make(&twin, page).encoded_len();
                largest = largest.max(len);
                assert!(len <= most, "a diff of {len} bytes of a {page_size}-byte page");
            }
            assert!(largest * 5 <= page_size * 6 + 64, "{largest} bytes of a {page_size}-byte page");
            assert!(Diff::whole(&twin).encoded_len() <= most);
        }
    }

    #[test]
    fn a_diff_of_no_bytes_is_refused_as_it_is_decoded() {
        let wire = postcard::to_allocvec(&Diff::default()).unwrap();
        assert_eq!(wire, [0]);
        let e = postcard::from_bytes::<Diff>(&wire).unwrap_err();
        assert!(e.to_string().contains("no bytes") || matches!(e, postcard::Error::SerdeDeCustom), "{e}");
        let one: Diff = postcard::from_bytes(&[1, 9]).unwrap();
        assert_eq!(one.encoded_len(), 1, "one byte is decoded (and checked when applied)");
    }

    #[test]
    fn identical_pages_give_an_empty_diff() {
        assert!(Diff::make(&[3; 4096], &[3; 4096]).is_empty());
    }
}
