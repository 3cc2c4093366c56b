//! TCP mesh, frames and the wire codec.
//!
//! This layer owns every socket of a node and the byte format on them. It knows nothing of the
//! protocol's messages beyond "a serde type": it moves opaque, length-prefixed frames between
//! ranks.
//!
//! - [`codec`]: the frame layout (`u32` LE length, then a postcard payload; length 0 = goodbye)
//!   and the one place the payload codec is chosen.
//! - [`mesh`]: the bootstrap meeting with blocking std sockets, ending in one stream per pair.
//! - [`link`]: the tokio side: a reader and a writer task per peer, frames in, events out.
//! - [`error`]: [`TransportError`], the one error type of this layer.
//!
//! A node's sockets live through three phases, in this order:
//! 1. [`connect_mesh`] (blocking, before tokio starts) meets every other node and returns a
//!    [`Mesh`] of one checked stream per peer;
//! 2. [`Links::start`] (inside the service thread's current-thread runtime) takes the streams
//!    over; frames go out with [`Links::send`] and come back as [`LinkEvent`]s;
//! 3. [`Links::goodbye`] then [`Links::flush_and_close`] end the job in order; each peer sees
//!    [`CloseCause::Goodbye`], anything else ([`CloseCause::Eof`], an error) is a failure.
//!
//! It does not own message types, retries or ordering between different peers: those belong to
//! the protocol and the runtime.
#![forbid(unsafe_code)]

pub mod codec;
pub mod error;
pub mod link;
pub mod mesh;

pub use codec::{
    FrameLen, FrameParts, FrameReader, GOODBYE_FRAME, HEADER_LEN, MAX_FRAME, decode_header, decode_payload,
    encode_frame, encode_frame_parts,
};
pub use error::TransportError;
pub use link::{CloseCause, LinkCounters, LinkEvent, Links};
pub use mesh::{Mesh, MeshConfig, connect_mesh, listen_everywhere};
