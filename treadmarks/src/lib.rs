//! treadmarks: TreadMarks-style lazy release consistency distributed shared memory.
//!
//! Layers (each in its own module; only `mem` may use `unsafe`):
//! - [`protocol`]: the pure LRC state machine (intervals, vector timestamps, write notices,
//!   twins and lazy diffs, locks, barriers). No I/O.
//! - [`mem`]: the shared heap mapping, page protection and fault capture.
//! - [`transport`]: TCP mesh, framing and the wire codec.
//! - `runtime`: the only place those three meet.

pub mod mem;
pub mod protocol;
pub mod transport;
