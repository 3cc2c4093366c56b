//! treadmarks: TreadMarks-style lazy release consistency distributed shared memory.
//!
//! N processes (nodes), on one host or several, share one heap mapped at the same address on
//! every node. A node sees another's writes after a chain of synchronization orders them (a lock
//! acquire after the writer's release, or a barrier), so data-race-free programs see sequentially
//! consistent memory. Start with [`Tmk`].
//!
//! Layers (each in its own module; only `mem` may use `unsafe`):
//! - [`protocol`]: the pure LRC state machine (intervals, vector timestamps, write notices,
//!   twins and lazy diffs, locks, barriers). No I/O.
//! - [`mem`]: the shared heap mapping, page protection and fault capture.
//! - [`transport`]: TCP mesh, framing and the wire codec.
//! - `runtime`: the only place those three meet.

pub mod config;
pub mod error;
pub mod mem;
pub mod protocol;
mod runtime;
pub mod stats;
mod tmk;
pub mod transport;

pub use config::Config;
pub use error::{Error, Result};
pub use mem::{Shared, View, ViewMut};
pub use stats::Stats;
pub use tmk::{LockGuard, Tmk};

/// Writes `text` to standard error with one `write(2)`, so that lines from the several node
/// processes of a job that share one terminal or pipe never interleave mid-line (a pipe keeps
/// writes of up to 4 KiB whole).
pub fn report(text: &str) {
    use std::io::Write;
    let mut buf = String::with_capacity(text.len() + 1);
    buf.push_str(text);
    if !buf.ends_with('\n') {
        buf.push('\n');
    }
    let _ = std::io::stderr().lock().write_all(buf.as_bytes());
}
