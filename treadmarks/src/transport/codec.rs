//! Frames and the wire codec: the one place that decides how a message becomes bytes.
//!
//! ```text
//!  ┌──────────────────────┬──────────────────────────────┐
//!  │ len: u32 little-end. │ payload: len bytes (postcard) │
//!  └──────────────────────┴──────────────────────────────┘
//!  len == 0            goodbye: the sender closes in order, nothing follows
//!  len >  MAX_FRAME    malformed: the reader stops and reports it
//! ```
//!
//! The payload codec is [postcard]: compact, serde-based and maintained. (The newest bincode,
//! 3.0.0, is an empty crate, and bincode 1.x/2.x carry an "unmaintained" advisory.) To swap the
//! codec, change [`encode_frame`], [`encode_frame_parts`] and [`decode_payload`]; nothing else
//! in the crate knows it.
//!
//! [`encode_frame_parts`] makes the same frame in parts: the diff bytes it carries stay where
//! the writer keeps them and are written from there (one vectored write), instead of being
//! copied into the frame first. radix sort's nodes send ~15-24 MB of diffs a run, each byte of
//! which was copied once more that way (0.0667 -> 0.0641 s, 12 alternated runs).
//!
//! This module owns the frame layout and the codec. It does not own sockets: [`FrameReader`] cuts
//! frames out of bytes handed to it, wherever they came from.
//!
//! Invariants:
//! - a frame produced by [`encode_frame`] has a payload of `1..=MAX_FRAME` bytes (a message that
//!   encodes to nothing would read as goodbye, so it is refused);
//! - decoding never panics, and a header above [`MAX_FRAME`], a truncated or garbled payload, or
//!   bytes left over after the message are all an `Err`;
//! - decoding reserves no more than a sequence's entries that actually decode (or 64 KiB ahead),
//!   and refuses the lists with a bound no honest sender exceeds (a reply's, push's or lock
//!   grant's pages, a message's interval records) by their length (`protocol/cautious.rs`). What
//!   decoded entries take in memory can still be several times their wire bytes: up to ~20 times
//!   (twice that with a list's growth) for one page's list of one-byte diffs (4 bytes on the
//!   wire, 80 decoded; a diff of no bytes, which no node sends, is refused, and a list of them
//!   had taken ~27 times), the one list with no such bound (a writer keeps a diff of a page per
//!   interval it wrote it in, until a collection).

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::error::{Result, TransportError};
use crate::protocol::NodeId;
use crate::protocol::shared_bytes::{SharedBytes, encode_offering, take_offered};
use std::io::IoSlice;

/// Bytes in a frame header (the payload length, `u32` little-endian).
pub const HEADER_LEN: usize = 4;

/// Largest payload a frame may carry: 64 MiB.
pub const MAX_FRAME: usize = 64 << 20;

/// The goodbye frame: a header announcing 0 bytes.
pub const GOODBYE_FRAME: [u8; HEADER_LEN] = [0; HEADER_LEN];

/// What a frame header announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameLen {
    /// The sender closes in order; no frame follows.
    Goodbye,
    /// A payload of this many bytes (`1..=MAX_FRAME`) follows.
    Payload(usize),
}

/// Parses a frame header. `from` only labels the error.
pub fn decode_header(header: [u8; HEADER_LEN], from: Option<NodeId>) -> Result<FrameLen> {
    let len = u32::from_le_bytes(header);
    if len == 0 {
        return Ok(FrameLen::Goodbye);
    }
    match usize::try_from(len) {
        Ok(len) if len <= MAX_FRAME => Ok(FrameLen::Payload(len)),
        _ => Err(TransportError::FrameTooLarge { len: len.into(), from }),
    }
}

/// Appends one frame (header and postcard payload) carrying `msg` to `out` and returns the
/// frame's size in bytes. On error `out` is left as it was.
pub fn encode_frame<T: Serialize + ?Sized>(msg: &T, out: &mut Vec<u8>) -> Result<usize> {
    let start = out.len();
    out.extend_from_slice(&GOODBYE_FRAME);
    let flavor = AppendVec { out, limit: start + HEADER_LEN + MAX_FRAME };
    match postcard::serialize_with_flavor(msg, flavor) {
        Ok(()) => {}
        Err(err) => {
            let produced = out.len() - start - HEADER_LEN;
            out.truncate(start);
            return Err(match err {
                postcard::Error::SerializeBufferFull => TransportError::MessageTooLarge { len: produced },
                source => TransportError::Encode { source },
            });
        }
    }
    let len = out.len() - start - HEADER_LEN;
    if let Err(e) = seal(&mut out[start..start + HEADER_LEN], len) {
        out.truncate(start);
        return Err(e);
    }
    Ok(HEADER_LEN + len)
}

/// Writes the header of a frame whose payload is `len` bytes (at most [`MAX_FRAME`]) into
/// `header`; an empty payload is refused.
fn seal(header: &mut [u8], len: usize) -> Result<()> {
    if len == 0 {
        return Err(TransportError::EmptyMessage);
    }
    let len = u32::try_from(len).expect("payload length is bounded by MAX_FRAME");
    header.copy_from_slice(&len.to_le_bytes());
    Ok(())
}

/// Encodes `msg` as a frame in a new vector (see [`encode_frame`]).
pub fn frame<T: Serialize + ?Sized>(msg: &T) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    encode_frame(msg, &mut out)?;
    Ok(out)
}

/// Smallest offered slice (a diff's bytes) that [`encode_frame_parts`] keeps by reference
/// rather than copying: below it, a slice costs more to describe to the kernel than to copy.
pub const SHARE_MIN: usize = 1024;

/// Most slices one frame keeps by reference: with the head's pieces between them they stay
/// within the kernel's 1,024 buffers a vectored write takes.
pub const MAX_SHARED: usize = 500;

/// A frame in parts: `head` holds the header and the payload but for the slices of `shared`,
/// each of which stands at its offset in `head` (ascending). The frame is
/// `head[..o1] ++ s1 ++ head[o1..o2] ++ s2 ++ .. ++ head[on..]`: written with one vectored
/// write, a diff's bytes go from the writer's store to the socket without a copy into the frame.
#[derive(Debug, Default)]
pub struct FrameParts {
    pub head: Vec<u8>,
    pub shared: Vec<(usize, SharedBytes)>,
}

impl FrameParts {
    /// Bytes in the frame, header included.
    pub fn len(&self) -> usize {
        self.head.len() + self.shared.iter().map(|(_, b)| b.len()).sum::<usize>()
    }

    /// Whether the frame is empty (never, for one [`encode_frame_parts`] made).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The frame's pieces in order, for a vectored write.
    pub fn io_slices(&self) -> Vec<IoSlice<'_>> {
        let mut out = Vec::with_capacity(2 * self.shared.len() + 1);
        let mut at = 0;
        for (offset, bytes) in &self.shared {
            out.push(IoSlice::new(&self.head[at..*offset]));
            out.push(IoSlice::new(bytes));
            at = *offset;
        }
        out.push(IoSlice::new(&self.head[at..]));
        out
    }

    /// Appends the frame's bytes from `skip` on to `out`.
    pub fn copy_from(&self, mut skip: usize, out: &mut Vec<u8>) {
        for piece in self.io_slices() {
            let piece: &[u8] = &piece;
            if skip >= piece.len() {
                skip -= piece.len();
                continue;
            }
            out.extend_from_slice(&piece[skip..]);
            skip = 0;
        }
    }
}

/// [`encode_frame`] of `msg` into `head` (cleared first), keeping by reference instead of
/// copying the diff bytes of at least [`SHARE_MIN`] that the diff serializer offers
/// ([`encode_offering`]), up to [`MAX_SHARED`] of them.
pub fn encode_frame_parts<T: Serialize + ?Sized>(msg: &T, mut head: Vec<u8>) -> Result<FrameParts> {
    head.clear();
    head.extend_from_slice(&GOODBYE_FRAME);
    let mut shared = Vec::new();
    let flavor = AppendParts { out: &mut head, shared: &mut shared, payload: 0 };
    let payload = match encode_offering(|| postcard::serialize_with_flavor(msg, flavor)) {
        Ok(payload) => payload,
        Err(postcard::Error::SerializeBufferFull) => {
            let len = head.len() - HEADER_LEN + shared.iter().map(|(_, b)| b.len()).sum::<usize>();
            return Err(TransportError::MessageTooLarge { len });
        }
        Err(source) => return Err(TransportError::Encode { source }),
    };
    seal(&mut head[..HEADER_LEN], payload)?;
    Ok(FrameParts { head, shared })
}

/// A postcard output flavor for [`encode_frame_parts`]: appends to `out`, but records offered
/// slices in `shared` at their offset instead; `payload` counts the bytes of both, refused past
/// [`MAX_FRAME`].
struct AppendParts<'a> {
    out: &'a mut Vec<u8>,
    shared: &'a mut Vec<(usize, SharedBytes)>,
    payload: usize,
}

impl postcard::ser_flavors::Flavor for AppendParts<'_> {
    type Output = usize;

    #[inline]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        if self.payload + data.len() > MAX_FRAME {
            return Err(postcard::Error::SerializeBufferFull);
        }
        self.payload += data.len();
        if data.len() >= SHARE_MIN
            && self.shared.len() < MAX_SHARED
            && let Some(bytes) = take_offered(data)
        {
            self.shared.push((self.out.len(), bytes));
        } else {
            self.out.extend_from_slice(data);
        }
        Ok(())
    }

    #[inline]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.try_extend(&[data])
    }

    fn finalize(self) -> postcard::Result<usize> {
        Ok(self.payload)
    }
}

/// Decodes one message from a frame's payload (the bytes after the header). The whole payload
/// must be consumed.
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T> {
    let len = payload.len();
    let (msg, rest) =
        postcard::take_from_bytes(payload).map_err(|source| TransportError::Decode { len, source })?;
    if !rest.is_empty() {
        return Err(TransportError::TrailingBytes { len, extra: rest.len() });
    }
    Ok(msg)
}

/// A postcard output flavor that appends to a borrowed vector, copying slices in one go and
/// refusing to grow past `limit`.
struct AppendVec<'a> {
    out: &'a mut Vec<u8>,
    limit: usize,
}

impl postcard::ser_flavors::Flavor for AppendVec<'_> {
    type Output = ();

    #[inline]
    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        if self.out.len() + data.len() > self.limit {
            return Err(postcard::Error::SerializeBufferFull);
        }
        self.out.extend_from_slice(data);
        Ok(())
    }

    #[inline]
    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.try_extend(&[data])
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}

/// One frame cut out of a byte stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// A payload (without its header), to give to [`decode_payload`].
    Payload(Vec<u8>),
    /// The goodbye frame.
    Goodbye,
}

/// Cuts frames out of a byte stream fed to it in pieces of any size.
///
/// Feed bytes with [`push`](Self::push), take frames with [`next_frame`](Self::next_frame) until
/// it returns `Ok(None)`, and call [`finish`](Self::finish) at the end of the stream to learn
/// whether it stopped between frames. After an `Err` the stream is unusable.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
    /// Bytes of `buf` already handed out as frames.
    consumed: usize,
    from: Option<NodeId>,
}

impl FrameReader {
    /// A reader for a stream whose sender is not known.
    pub fn new() -> Self {
        Self::default()
    }

    /// A reader for a stream from `from` (used only to label errors).
    pub fn from_node(from: NodeId) -> Self {
        Self { from: Some(from), ..Self::default() }
    }

    /// Appends bytes received from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.consumed > 0 && self.consumed == self.buf.len() {
            self.buf.clear();
            self.consumed = 0;
        } else if self.consumed > self.buf.capacity() / 2 {
            self.buf.drain(..self.consumed);
            self.consumed = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet handed out as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.consumed
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed, or an `Err` for an
    /// oversize header.
    pub fn next_frame(&mut self) -> Result<Option<Frame>> {
        let rest = &self.buf[self.consumed..];
        let Some(header) = rest.first_chunk::<HEADER_LEN>() else {
            return Ok(None);
        };
        match decode_header(*header, self.from)? {
            FrameLen::Goodbye => {
                self.consumed += HEADER_LEN;
                Ok(Some(Frame::Goodbye))
            }
            FrameLen::Payload(len) => {
                let Some(payload) = rest.get(HEADER_LEN..HEADER_LEN + len) else {
                    return Ok(None);
                };
                let payload = payload.to_vec();
                self.consumed += HEADER_LEN + len;
                Ok(Some(Frame::Payload(payload)))
            }
        }
    }

    /// Checks that the stream ended between frames.
    pub fn finish(&self) -> Result<()> {
        let rest = &self.buf[self.consumed..];
        if rest.is_empty() {
            return Ok(());
        }
        let want = match rest.first_chunk::<HEADER_LEN>() {
            Some(header) => match decode_header(*header, self.from)? {
                FrameLen::Goodbye => HEADER_LEN,
                FrameLen::Payload(len) => HEADER_LEN + len,
            },
            None => HEADER_LEN,
        };
        Err(TransportError::TruncatedFrame { have: rest.len(), want, from: self.from })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_bytes::ByteBuf;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Sample {
        node: NodeId,
        tag: u64,
        page: ByteBuf,
        notices: Vec<(u32, u32)>,
        name: String,
        maybe: Option<Vec<u16>>,
    }

    fn sample(seed: u64) -> Sample {
        Sample {
            node: NodeId(3),
            tag: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            page: ByteBuf::from((0..4096u32).map(|i| (i as u64 ^ seed) as u8).collect::<Vec<_>>()),
            notices: (0..17).map(|i| (i, i * 1000 + seed as u32)).collect(),
            name: "lock 7".to_owned(),
            maybe: Some(vec![1, 2, 65535]),
        }
    }

    /// A tiny deterministic generator, so no test depends on `rand`.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn round_trip_keeps_bytes_and_vectors() {
        let msg = sample(42);
        let mut out = vec![0xAA]; // encode_frame appends
        let n = encode_frame(&msg, &mut out).unwrap();
        assert_eq!(n, out.len() - 1);
        let header: [u8; 4] = out[1..5].try_into().unwrap();
        assert_eq!(decode_header(header, None).unwrap(), FrameLen::Payload(n - HEADER_LEN));
        let back: Sample = decode_payload(&out[5..]).unwrap();
        assert_eq!(back, msg);
    }

    #[test]
    fn a_frame_in_parts_is_the_frame_with_big_diffs_by_reference() {
        use crate::protocol::Diff;
        // Whole-page diffs (4 KiB and more: shared) and one-word ones (copied), in a vector.
        let page = |seed: u8| (0..4096u32).map(|i| (i as u8) ^ seed).collect::<Vec<u8>>();
        let diffs: Vec<Diff> = (0..8u8)
            .map(|k| if k % 3 == 2 { Diff::make(&[0; 64], &[k + 1; 64][..]) } else { Diff::whole(&page(k)) })
            .collect();
        let msg = (7u32, diffs.clone(), "end".to_owned());
        let flat = frame(&msg).unwrap();
        let parts = encode_frame_parts(&msg, vec![1, 2, 3]).unwrap();
        assert_eq!(parts.len(), flat.len());
        let mut joined = Vec::new();
        parts.copy_from(0, &mut joined);
        assert_eq!(joined, flat, "the pieces in order are the frame");
        let big = diffs.iter().filter(|d| d.encoded_len() >= SHARE_MIN).count();
        assert_eq!((parts.shared.len(), big), (6, 6), "the big diffs are by reference, the rest copied");
        for ((_, bytes), d) in parts.shared.iter().zip(diffs.iter().filter(|d| d.encoded_len() >= SHARE_MIN))
        {
            assert_eq!(bytes.as_ptr(), d.encoded().as_ptr(), "the diff's own bytes, not a copy");
        }
        let mut tail = Vec::new();
        parts.copy_from(5000, &mut tail);
        assert_eq!(tail, flat[5000..], "a rest from any point");
        let back: (u32, Vec<Diff>, String) = decode_payload(&flat[HEADER_LEN..]).unwrap();
        assert_eq!(back, msg);
        // At most MAX_SHARED slices a frame, so that a vectored write takes them all.
        let many: Vec<Diff> = (0..MAX_SHARED + 20).map(|k| Diff::whole(&page(k as u8))).collect();
        let parts = encode_frame_parts(&many, Vec::new()).unwrap();
        assert_eq!(parts.shared.len(), MAX_SHARED);
        assert!(parts.io_slices().len() <= 1024);
        let mut joined = Vec::new();
        parts.copy_from(0, &mut joined);
        assert_eq!(joined, frame(&many).unwrap());
    }

    /// The largest value `distribute` sends fits a frame, with fields at their widest.
    #[test]
    fn the_largest_distribute_fits_a_frame() {
        use crate::protocol::{MAX_DISTRIBUTE, Message};
        let msg = Message::Distribute {
            seq: u64::MAX,
            bytes: ByteBuf::from(vec![7; MAX_DISTRIBUTE]),
            heap_end: u64::MAX,
        };
        let mut out = Vec::new();
        encode_frame(&msg, &mut out).unwrap();
        assert!(out.len() <= HEADER_LEN + MAX_FRAME, "{} bytes", out.len());
    }

    #[test]
    fn frame_reader_cuts_frames_from_pieces() {
        let msgs: Vec<Sample> = (0..5).map(sample).collect();
        let mut stream = Vec::new();
        for m in &msgs {
            encode_frame(m, &mut stream).unwrap();
        }
        stream.extend_from_slice(&GOODBYE_FRAME);

        let mut rng = XorShift(7);
        let mut reader = FrameReader::from_node(NodeId(1));
        let mut got = Vec::new();
        let mut goodbye = false;
        let mut at = 0;
        while at < stream.len() {
            let step = 1 + rng.below(3000);
            let end = (at + step).min(stream.len());
            reader.push(&stream[at..end]);
            at = end;
            while let Some(frame) = reader.next_frame().unwrap() {
                match frame {
                    Frame::Payload(p) => got.push(decode_payload::<Sample>(&p).unwrap()),
                    Frame::Goodbye => goodbye = true,
                }
            }
        }
        assert!(goodbye);
        assert_eq!(got, msgs);
        assert_eq!(reader.buffered(), 0);
        reader.finish().unwrap();
    }

    #[test]
    fn truncated_payload_is_an_error() {
        let msg = sample(1);
        let mut out = Vec::new();
        encode_frame(&msg, &mut out).unwrap();
        let payload = &out[HEADER_LEN..];
        for cut in [0, 1, 5, payload.len() / 2, payload.len() - 1] {
            let err = decode_payload::<Sample>(&payload[..cut]).unwrap_err();
            assert!(matches!(err, TransportError::Decode { len, .. } if len == cut), "cut at {cut}: {err}");
            assert!(err.to_string().contains(&format!("{cut} bytes")), "{err}");
        }
        // A stream cut inside a frame.
        let mut reader = FrameReader::from_node(NodeId(2));
        reader.push(&out[..out.len() - 3]);
        assert_eq!(reader.next_frame().unwrap(), None);
        let err = reader.finish().unwrap_err();
        assert!(matches!(err, TransportError::TruncatedFrame { .. }), "{err}");
        assert!(err.to_string().contains("node 2"), "{err}");
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        let mut out = Vec::new();
        encode_frame(&7u32, &mut out).unwrap();
        out.push(0);
        let err = decode_payload::<u32>(&out[HEADER_LEN..]).unwrap_err();
        assert!(matches!(err, TransportError::TrailingBytes { extra: 1, .. }), "{err}");
    }

    #[test]
    fn garbled_payloads_never_panic() {
        let mut clean = Vec::new();
        encode_frame(&sample(9), &mut clean).unwrap();
        let clean = clean.split_off(HEADER_LEN);
        let mut rng = XorShift(0x5eed_1234_abcd_0001);
        let (mut ok, mut err) = (0, 0);
        for _ in 0..20_000 {
            let mut bytes = clean.clone();
            for _ in 0..1 + rng.below(8) {
                match rng.below(4) {
                    0 => {
                        let i = rng.below(bytes.len());
                        bytes[i] = rng.next() as u8;
                    }
                    1 => {
                        let i = rng.below(bytes.len());
                        bytes[i] ^= 1 << rng.below(8);
                    }
                    2 => {
                        let cut = rng.below(bytes.len() + 1);
                        bytes.truncate(cut);
                    }
                    _ => {
                        // Garble the front, where lengths and discriminants live.
                        let i = rng.below(bytes.len().min(16));
                        bytes[i] = 0xff;
                    }
                }
                if bytes.is_empty() {
                    break;
                }
            }
            match decode_payload::<Sample>(&bytes) {
                Ok(_) => ok += 1,
                Err(_) => err += 1,
            }
        }
        assert!(err > 0, "mutations should break some payloads ({ok} decoded)");
    }

    #[test]
    fn oversize_header_is_an_error() {
        let too_big = u32::try_from(MAX_FRAME + 1).unwrap().to_le_bytes();
        let err = decode_header(too_big, Some(NodeId(1))).unwrap_err();
        assert!(
            matches!(err, TransportError::FrameTooLarge { len, from: Some(NodeId(1)) } if len == MAX_FRAME as u64 + 1),
            "{err}"
        );
        assert_eq!(
            err.to_string(),
            format!("frame of {} bytes from node 1 exceeds the 64 MiB limit", MAX_FRAME + 1)
        );
        assert_eq!(
            decode_header(u32::try_from(MAX_FRAME).unwrap().to_le_bytes(), None).unwrap(),
            FrameLen::Payload(MAX_FRAME)
        );

        let mut reader = FrameReader::new();
        reader.push(&[0xff; 4]);
        reader.push(&[1, 2, 3]);
        assert!(matches!(reader.next_frame(), Err(TransportError::FrameTooLarge { .. })));
    }

    #[test]
    fn oversize_and_empty_messages_are_refused() {
        let mut out = vec![1, 2, 3];
        let big = ByteBuf::from(vec![0u8; MAX_FRAME]); // + its length prefix: one byte too many
        let err = encode_frame(&big, &mut out).unwrap_err();
        assert!(matches!(err, TransportError::MessageTooLarge { .. }), "{err}");
        assert_eq!(out, [1, 2, 3]);

        let err = encode_frame(&(), &mut out).unwrap_err();
        assert!(matches!(err, TransportError::EmptyMessage), "{err}");
        assert_eq!(out, [1, 2, 3]);
    }
}
