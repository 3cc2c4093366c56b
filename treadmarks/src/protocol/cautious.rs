//! Decoding a `SmallVec` from a peer's message without reserving what its length prefix claims.
//!
//! `smallvec`'s own `Deserialize` reserves the sequence's size hint up front, and postcard's hint
//! is the wire's length prefix, bounded only by the bytes left in the frame: a 64 MiB frame
//! whose diff list claims 64 M entries made the receiver reserve ~5 GB before the first entry
//! failed to decode. As serde does for a `Vec`, [`small_vec`] reserves at most
//! [`PREALLOC_BYTES`] ahead and grows as entries actually decode.
//!
//! Invariant: decoding a sequence of `n` entries allocates no more than the entries' size
//! (rounded up by growth) or [`PREALLOC_BYTES`], whichever is more; the wire format is
//! `smallvec`'s (a sequence), so what a peer encodes is decoded unchanged.

use serde::de::{Deserialize, Deserializer, SeqAccess, Visitor};
use smallvec::{Array, SmallVec};
use std::fmt;
use std::marker::PhantomData;

/// Most bytes reserved ahead of the entries a sequence's length prefix announces.
pub const PREALLOC_BYTES: usize = 1 << 16;

/// Decodes a `SmallVec` (use as `#[serde(deserialize_with = "...")]`), reserving at most
/// [`PREALLOC_BYTES`] ahead of the entries that decode.
pub fn small_vec<'de, D, A>(deserializer: D) -> Result<SmallVec<A>, D::Error>
where
    D: Deserializer<'de>,
    A: Array,
    A::Item: Deserialize<'de>,
{
    struct Entries<A>(PhantomData<A>);
    impl<'de, A> Visitor<'de> for Entries<A>
    where
        A: Array,
        A::Item: Deserialize<'de>,
    {
        type Value = SmallVec<A>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a sequence")
        }
        fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<SmallVec<A>, S::Error> {
            let most = PREALLOC_BYTES / size_of::<A::Item>().max(1);
            let mut out = SmallVec::with_capacity(seq.size_hint().unwrap_or(0).min(most));
            while let Some(entry) = seq.next_element()? {
                out.push(entry);
            }
            Ok(out)
        }
    }
    deserializer.deserialize_seq(Entries(PhantomData))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::value::{Error, SeqAccessDeserializer, U32Deserializer};
    use serde::de::{DeserializeSeed, IntoDeserializer};

    /// A sequence of `entries` whose length prefix claims `claims`.
    struct Lying {
        entries: std::vec::IntoIter<u32>,
        claims: usize,
    }

    impl<'de> SeqAccess<'de> for Lying {
        type Error = Error;
        fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Error> {
            let next: Option<U32Deserializer<Error>> =
                self.entries.next().map(IntoDeserializer::into_deserializer);
            next.map(|e| seed.deserialize(e)).transpose()
        }
        fn size_hint(&self) -> Option<usize> {
            Some(self.claims)
        }
    }

    #[test]
    fn a_length_prefix_that_lies_reserves_no_more_than_the_bound() {
        let lying = Lying { entries: vec![1, 2, 3].into_iter(), claims: usize::MAX / 8 };
        let got: SmallVec<[u32; 2]> = small_vec(SeqAccessDeserializer::new(lying)).unwrap();
        assert_eq!(got.as_slice(), [1, 2, 3]);
        assert!(got.capacity() <= PREALLOC_BYTES / 4, "reserved {} entries", got.capacity());
        // smallvec's own decoder takes the claim at its word (here it cannot even try).
        let lying = Lying { entries: vec![1, 2, 3].into_iter(), claims: usize::MAX / 8 };
        assert!(SmallVec::<[u32; 2]>::deserialize(SeqAccessDeserializer::new(lying)).is_err());
    }

    #[test]
    fn the_wire_format_is_smallvecs() {
        #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
        struct Both {
            #[serde(deserialize_with = "small_vec")]
            ours: SmallVec<[u64; 1]>,
            theirs: SmallVec<[u64; 1]>,
        }
        let v: SmallVec<[u64; 1]> = (0..100u64).map(|i| i * 7919).collect();
        let both = Both { ours: v.clone(), theirs: v };
        let bytes = postcard::to_allocvec(&both).unwrap();
        let back: Both = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, both);
        assert_eq!(postcard::to_allocvec(&back.ours).unwrap(), postcard::to_allocvec(&back.theirs).unwrap());
    }
}
