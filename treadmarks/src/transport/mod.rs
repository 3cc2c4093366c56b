//! TCP mesh, frames and the wire codec.
#![forbid(unsafe_code)]
