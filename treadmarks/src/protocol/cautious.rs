//! Decoding a peer's sequences without reserving what their length prefixes claim, and the
//! page lists of a reply or a push no longer than any node sends.
//!
//! `smallvec`'s own `Deserialize` reserves the sequence's size hint up front, and postcard's hint
//! is the wire's length prefix, bounded only by the bytes left in the frame: a 64 MiB frame
//! whose diff list claims 64 M entries made the receiver reserve ~5 GB before the first entry
//! failed to decode. As serde does for a `Vec`, [`small_vec`] reserves at most
//! [`PREALLOC_BYTES`] ahead and grows as entries actually decode.
//!
//! A list of pages takes up to ~50 times as much memory decoded as on the wire (a page with no
//! diffs: 2 bytes sent, 96 decoded), so a 64 MiB frame listing 33 M of them decoded into ~3.2 GB
//! before any check saw a page. The lists with a bound that no honest node exceeds are refused by
//! their length prefix, before an entry is decoded: a diff or page reply answers one request of
//! at most [`PAGES_PER_REQUEST`] pages ([`request_pages`]), a push carries at most
//! [`PUSH_MAX_PAGES`] ([`push_pages`]), a lock grant at most [`PIGGYBACK_MAX_PAGES`]
//! ([`grant_pages`]), and a list of interval records at most [`MOST_RECORDS`] ([`records`]).
//! (The limits can only be lowered, in tests.)
//!
//! Invariant: decoding a sequence of `n` entries allocates no more than the entries' size
//! (rounded up by growth) or [`PREALLOC_BYTES`], whichever is more; the wire format is
//! `smallvec`'s or `Vec`'s (a sequence), so what a peer encodes is decoded unchanged.

use super::ahead::MOST_RECORDS;
use super::lock::PIGGYBACK_MAX_PAGES;
use super::page::PAGES_PER_REQUEST;
use super::push::PUSH_MAX_PAGES;
use serde::de::{Deserialize, Deserializer, Error, SeqAccess, Visitor};
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

/// Decodes the pages of a diff or page reply: at most [`PAGES_PER_REQUEST`], the most a request
/// names (use as `#[serde(deserialize_with = "...")]`).
pub fn request_pages<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    vec_at_most(d, PAGES_PER_REQUEST, "pages, the most a request names")
}

/// Decodes the interval records of a grant, arrival, release or part sent ahead: at most
/// [`MOST_RECORDS`], the most a sender puts in one list.
pub fn records<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    vec_at_most(d, MOST_RECORDS, "interval records, the most one list holds")
}

/// Decodes the pages a lock grant carries diffs of: at most [`PIGGYBACK_MAX_PAGES`].
pub fn grant_pages<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    vec_at_most(d, PIGGYBACK_MAX_PAGES, "pages, the most a lock grant carries")
}

/// Decodes the pages of a push: at most [`PUSH_MAX_PAGES`].
pub fn push_pages<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    vec_at_most(d, PUSH_MAX_PAGES, "pages, the most a push carries")
}

/// Decodes a `Vec` of at most `most` entries; a longer one is refused by its length prefix (or,
/// from a format without one, at entry `most + 1`), naming its length.
fn vec_at_most<'de, D, T>(deserializer: D, most: usize, what: &'static str) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Entries<T> {
        most: usize,
        what: &'static str,
        entries: PhantomData<T>,
    }
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Entries<T> {
        type Value = Vec<T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "at most {} {}", self.most, self.what)
        }
        fn visit_seq<S: SeqAccess<'de>>(self, mut seq: S) -> Result<Vec<T>, S::Error> {
            let claimed = seq.size_hint().unwrap_or(0);
            if claimed > self.most {
                return Err(S::Error::invalid_length(claimed, &self));
            }
            let mut out = Vec::with_capacity(claimed.min(PREALLOC_BYTES / size_of::<T>().max(1)));
            while let Some(entry) = seq.next_element()? {
                if out.len() == self.most {
                    return Err(S::Error::invalid_length(self.most + 1, &self));
                }
                out.push(entry);
            }
            Ok(out)
        }
    }
    deserializer.deserialize_seq(Entries { most, what, entries: PhantomData })
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

    /// A reply, push or grant listing more pages, or a list of more interval records, than any
    /// node sends is refused by its length, before an entry is decoded; one at the limit decodes.
    #[test]
    fn lists_longer_than_any_node_sends_are_refused_by_their_length() {
        use crate::protocol::PageIdx;
        use crate::protocol::msg::{Message, PageDiffs, UnaskedDiffs};
        let reply = |n: usize| Message::DiffReply {
            pages: vec![PageDiffs { page: PageIdx(0), diffs: Default::default() }; n],
            continued: false,
        };
        let push = |n: usize| Message::DiffPush {
            episode: 1,
            upto: 1,
            pages: vec![UnaskedDiffs { page: PageIdx(0), after_seq: 0, diffs: Default::default() }; n],
        };
        let grant = |n: usize| Message::LockGrant {
            lock: crate::protocol::LockId(0),
            intervals: Vec::new(),
            diffs: vec![UnaskedDiffs { page: PageIdx(0), after_seq: 0, diffs: Default::default() }; n],
            bundled: Vec::new(),
        };
        let decode = |m: Message| postcard::from_bytes::<Message>(&postcard::to_allocvec(&m).unwrap());
        assert!(decode(reply(PAGES_PER_REQUEST)).is_ok());
        assert!(decode(push(PUSH_MAX_PAGES)).is_ok());
        assert!(decode(grant(PIGGYBACK_MAX_PAGES)).is_ok());
        // postcard's errors name no value; serde's own decoder shows what the visitor says.
        assert!(decode(reply(PAGES_PER_REQUEST + 1)).is_err());
        assert!(decode(push(PUSH_MAX_PAGES + 1)).is_err());
        assert!(decode(grant(PIGGYBACK_MAX_PAGES + 1)).is_err());
        let lying = Lying { entries: vec![1, 2, 3].into_iter(), claims: 33_000_000 };
        let err = request_pages::<_, u32>(SeqAccessDeserializer::new(lying)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid length 33000000, expected at most 256 pages, the most a request names"
        );
        let lying = Lying { entries: vec![1].into_iter(), claims: MOST_RECORDS + 1 };
        let err = records::<_, u32>(SeqAccessDeserializer::new(lying)).unwrap_err();
        assert!(err.to_string().starts_with(&format!("invalid length {}", MOST_RECORDS + 1)), "{err}");
        // A format that gives no length is cut off at the first page too many.
        let no_length = Lying { entries: (0..100).collect::<Vec<u32>>().into_iter(), claims: 0 };
        let err = push_pages::<_, u32>(SeqAccessDeserializer::new(no_length)).unwrap_err();
        assert_eq!(err.to_string(), "invalid length 65, expected at most 64 pages, the most a push carries");
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
