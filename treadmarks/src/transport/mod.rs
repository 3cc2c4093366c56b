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
#![forbid(unsafe_code)]

pub mod codec;
pub mod error;
pub mod link;
pub mod mesh;

pub use codec::{
    FrameLen, FrameReader, GOODBYE_FRAME, HEADER_LEN, MAX_FRAME, decode_header, decode_payload,
    encode_frame,
};
pub use error::TransportError;
pub use link::{CloseCause, LinkCounters, LinkEvent, Links};
pub use mesh::{Mesh, MeshConfig, connect_mesh};
