//! Diffs: the bytes a node changed in a page, found by comparing the page with its twin.
//!
//! Encoding (a diff is a raw byte string on the wire, never a sequence of serde elements):
//! a sequence of runs, each `varint gap, varint len, len bytes`, where `gap` is the distance from
//! the end of the previous run (or the page start) to the run start. Runs are exact to the byte:
//! bytes equal to the twin are never included, so two nodes writing disjoint bytes of one page
//! (false sharing, even inside one word) merge correctly whatever order their diffs are applied in.
//!
//! A diff arrives from a peer, so [`Diff::apply`] checks every length and offset and returns a
//! [`DiffError`] instead of panicking.

use serde::{Deserialize, Serialize};

/// A run-length encoded diff of one page.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Diff(#[serde(with = "serde_bytes")] Vec<u8>);

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

const LO: u64 = 0x0101_0101_0101_0101;
const HI: u64 = 0x8080_8080_8080_8080;

#[inline]
fn word(b: &[u8], i: usize) -> u64 {
    u64::from_ne_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// True if no byte of `x` is zero: all eight bytes of the word changed.
#[inline]
fn all_bytes_nonzero(x: u64) -> bool {
    (x.wrapping_sub(LO) & !x & HI) == 0
}

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

impl Diff {
    /// The diff that turns `twin` into `page`.
    pub fn make(twin: &[u8], page: &[u8]) -> Diff {
        assert_eq!(twin.len(), page.len(), "twin and page differ in size");
        let n = page.len();
        let mut out = Vec::new();
        let (mut i, mut prev_end) = (0usize, 0usize);
        while i < n {
            while i + 8 <= n && word(twin, i) == word(page, i) {
                i += 8;
            }
            while i < n && twin[i] == page[i] {
                i += 1;
            }
            if i >= n {
                break;
            }
            let start = i;
            loop {
                while i + 8 <= n && all_bytes_nonzero(word(twin, i) ^ word(page, i)) {
                    i += 8;
                }
                if i < n && twin[i] != page[i] {
                    i += 1;
                } else {
                    break;
                }
            }
            put_varint(&mut out, start - prev_end);
            put_varint(&mut out, i - start);
            out.extend_from_slice(&page[start..i]);
            prev_end = i;
        }
        Diff(out)
    }

    /// True if the diff changes nothing.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Encoded size in bytes.
    pub fn encoded_len(&self) -> usize {
        self.0.len()
    }

    /// The changed byte ranges (for the race checker and for tests).
    pub fn runs(&self, page_size: usize) -> Result<Vec<Run>, DiffError> {
        let mut runs = Vec::new();
        self.walk(page_size, |offset, data| runs.push(Run { offset, len: data.len() }))?;
        Ok(runs)
    }

    /// Writes the diff's bytes into `page`. A malformed diff leaves `page` untouched.
    pub fn apply(&self, page: &mut [u8]) -> Result<(), DiffError> {
        self.walk(page.len(), |_, _| {})?;
        self.walk(page.len(), |offset, data| page[offset..offset + data.len()].copy_from_slice(data))
    }

    fn walk(&self, page_size: usize, mut f: impl FnMut(usize, &[u8])) -> Result<(), DiffError> {
        let b = &self.0;
        let (mut at, mut pos) = (0usize, 0usize);
        while at < b.len() {
            let truncated = DiffError::Truncated { at, len: b.len() };
            let gap = get_varint(b, &mut at).ok_or(truncated.clone())?;
            let len = get_varint(b, &mut at).ok_or(truncated.clone())?;
            let offset = pos.checked_add(gap).filter(|o| o.checked_add(len).is_some_and(|e| e <= page_size));
            let offset =
                offset.ok_or(DiffError::Overrun { offset: pos.saturating_add(gap), len, page_size })?;
            let data = b.get(at..at + len).ok_or(truncated)?;
            f(offset, data);
            at += len;
            pos = offset + len;
        }
        Ok(())
    }
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
    fn malformed_diffs_are_errors_and_change_nothing() {
        let mut rng = Rng(42);
        let twin = vec![0u8; 256];
        let mut page = twin.clone();
        scribble(&mut rng, &mut page, |_| true);
        let good = Diff::make(&twin, &page);
        for _ in 0..5000 {
            let mut bytes = good.0.clone();
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
            if Diff(bytes).apply(&mut target).is_err() {
                assert_eq!(target, vec![7u8; 256]);
            }
        }
        assert!(matches!(
            Diff(vec![0x05, 0xff, 0xff, 0x03]).apply(&mut [0; 16]),
            Err(DiffError::Overrun { .. })
        ));
        assert!(matches!(Diff(vec![0x00, 0x04, 1]).apply(&mut [0; 16]), Err(DiffError::Truncated { .. })));
    }

    #[test]
    fn identical_pages_give_an_empty_diff() {
        assert!(Diff::make(&[3; 4096], &[3; 4096]).is_empty());
    }
}
