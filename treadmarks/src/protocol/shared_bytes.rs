//! [`SharedBytes`]: an immutable slice of a reference-counted buffer.
//!
//! A diff that arrives in a frame is a slice of that frame rather than a copy of it: a bulk
//! transfer then allocates and copies nothing per page, where a copy into a fresh allocation
//! cost a page fault per 4 KiB of new heap besides the copy (the largest cost of decoding a
//! reply of hundreds of pages). The frame lives as long as any diff cut from it.
//!
//! [`decode_sharing`] makes the buffer being decoded known to the [`Diff`](super::Diff)
//! deserializer for the duration of one decode; bytes the decoder hands it that lie inside that
//! buffer become slices of it, any others (or any outside a [`decode_sharing`]) are copied.
//!
//! Encoding, the other way round: [`encode_offering`] lets the diff serializer [`offer`] its
//! bytes to the encoder, which may keep them by reference and write them straight from the
//! writer's diff store (`transport::codec::encode_frame_parts`).
//!
//! Invariant: `start <= end <= owner.len()`, checked where a slice is made, so [`Deref`] cannot
//! panic.

use std::cell::RefCell;
use std::ops::Deref;
use std::sync::Arc;

/// What can own shared bytes: a received frame (which may go back to a pool when dropped), or
/// an allocation of its own.
pub trait ByteOwner: AsRef<[u8]> + Send + Sync + 'static {}

impl<T: AsRef<[u8]> + Send + Sync + 'static> ByteOwner for T {}

/// `owner[start..end]`, shared. Equality compares the bytes.
#[derive(Clone)]
pub struct SharedBytes {
    owner: Arc<dyn ByteOwner>,
    start: usize,
    end: usize,
}

impl SharedBytes {
    /// A copy of `bytes` in an allocation of its own.
    pub fn copy_of(bytes: &[u8]) -> SharedBytes {
        let owned: Arc<[u8]> = bytes.into();
        SharedBytes { owner: Arc::new(owned), start: 0, end: bytes.len() }
    }

    /// `part` as a slice of `owner`, if it lies inside it.
    pub fn slice_of(owner: &Arc<dyn ByteOwner>, part: &[u8]) -> Option<SharedBytes> {
        let whole = (**owner).as_ref();
        let base = whole.as_ptr() as usize;
        let at = part.as_ptr() as usize;
        let start = at.checked_sub(base)?;
        let end = start.checked_add(part.len())?;
        (end <= whole.len()).then(|| SharedBytes { owner: Arc::clone(owner), start, end })
    }

    /// Bytes of the buffer this slice keeps alive.
    pub fn owner_len(&self) -> usize {
        (*self.owner).as_ref().len()
    }
}

impl std::fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SharedBytes({} of {} bytes)", self.len(), self.owner_len())
    }
}

impl Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.end]
    }
}

impl Default for SharedBytes {
    fn default() -> Self {
        SharedBytes::copy_of(&[])
    }
}

impl PartialEq for SharedBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for SharedBytes {}

thread_local! {
    /// The buffer [`decode_sharing`] is decoding on this thread.
    static DECODING: RefCell<Option<Arc<dyn ByteOwner>>> = const { RefCell::new(None) };
    /// While [`encode_offering`] runs on this thread: the bytes the diff serializer is about
    /// to write, offered to the encoder ([`offer`]).
    static OFFERED: RefCell<Option<Option<SharedBytes>>> = const { RefCell::new(None) };
}

/// Runs `encode` with the diff serializer offering its bytes to the encoder ([`offer`],
/// [`take_offered`]), which may then keep them by reference instead of copying them (a frame
/// written in parts: `transport::codec::encode_frame_parts`).
pub fn encode_offering<T>(encode: impl FnOnce() -> T) -> T {
    /// Stops offering however `encode` ends (a panic too).
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            OFFERED.with_borrow_mut(|o| *o = None);
        }
    }
    OFFERED.with_borrow_mut(|o| *o = Some(None));
    let _clear = Clear;
    encode()
}

/// Offers `bytes`, which the caller serializes next, to the encoder if an [`encode_offering`]
/// runs on this thread.
pub fn offer(bytes: &SharedBytes) {
    OFFERED.with_borrow_mut(|o| {
        if let Some(slot) = o {
            *slot = Some(bytes.clone());
        }
    });
}

/// The offered bytes if `data` is them (the same address and length), taken.
pub fn take_offered(data: &[u8]) -> Option<SharedBytes> {
    OFFERED.with_borrow_mut(|o| {
        let slot = o.as_mut()?;
        let offered = slot.take()?;
        (offered.as_ptr() == data.as_ptr() && offered.len() == data.len()).then_some(offered)
    })
}

/// Runs `decode` on the bytes of `buffer`; bytes the diff deserializer meets inside `buffer`
/// meanwhile are shared with it instead of copied.
pub fn decode_sharing<T>(buffer: Arc<dyn ByteOwner>, decode: impl FnOnce(&[u8]) -> T) -> T {
    /// Clears the thread's buffer however `decode` ends (a panic too).
    struct Clear;
    impl Drop for Clear {
        fn drop(&mut self) {
            DECODING.with_borrow_mut(|d| *d = None);
        }
    }
    DECODING.with_borrow_mut(|d| *d = Some(Arc::clone(&buffer)));
    let _clear = Clear;
    decode((*buffer).as_ref())
}

/// `bytes` shared with the buffer being decoded if they lie in it, else copied.
pub(crate) fn share_or_copy(bytes: &[u8]) -> SharedBytes {
    DECODING
        .with_borrow(|d| d.as_ref().and_then(|owner| SharedBytes::slice_of(owner, bytes)))
        .unwrap_or_else(|| SharedBytes::copy_of(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_inside_the_owner_share_and_others_do_not() {
        let owner: Arc<dyn ByteOwner> = Arc::new(vec![1u8, 2, 3, 4, 5, 6]);
        let whole = (*owner).as_ref();
        let part = SharedBytes::slice_of(&owner, &whole[2..5]).expect("inside");
        assert_eq!(&*part, &[3, 4, 5]);
        assert_eq!(part.owner_len(), 6);
        assert!(SharedBytes::slice_of(&owner, &[3u8, 4, 5]).is_none(), "equal bytes elsewhere");
        let empty_at_end = SharedBytes::slice_of(&owner, &whole[6..]).expect("empty tail");
        assert!(empty_at_end.is_empty());
        assert_eq!(SharedBytes::copy_of(&[3, 4, 5]), part);
    }

    #[test]
    fn offered_bytes_are_taken_only_while_encoding_and_only_as_themselves() {
        let bytes = SharedBytes::copy_of(&[7u8; 32]);
        offer(&bytes);
        assert!(take_offered(&bytes).is_none(), "nothing offered outside an encode");
        encode_offering(|| {
            offer(&bytes);
            assert!(take_offered(&bytes[..16]).is_none(), "a part of them is not them");
            assert!(take_offered(&bytes).is_none(), "taken (and dropped) by the failed match");
            offer(&bytes);
            let equal = [7u8; 32];
            assert!(take_offered(&equal).is_none(), "equal bytes elsewhere are not them");
            offer(&bytes);
            assert_eq!(take_offered(&bytes).expect("offered").owner_len(), 32);
        });
        offer(&bytes);
        assert!(take_offered(&bytes).is_none(), "cleared after the encode");
    }

    #[test]
    fn decoding_shares_only_while_it_runs() {
        let owner: Arc<dyn ByteOwner> = Arc::new(vec![9u8; 64]);
        let shared = decode_sharing(Arc::clone(&owner), |b| share_or_copy(&b[8..16]));
        assert_eq!(shared.owner_len(), 64, "a slice of the decoded buffer");
        let copied = share_or_copy(&(*owner).as_ref()[8..16]);
        assert_eq!(copied.owner_len(), 8, "outside a decode, a copy");
        let again = Arc::clone(&owner);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            decode_sharing(again, |_| panic!("bad frame"))
        }));
        assert!(result.is_err());
        assert_eq!(share_or_copy(&(*owner).as_ref()[0..4]).owner_len(), 4, "cleared after a panic");
    }
}
