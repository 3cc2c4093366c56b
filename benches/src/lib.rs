//! Micro-benchmarks of the treadmarks core: fault costs, round trips, locks, barriers and diff
//! misses, measured in one `cargo bench -p treadmarks-benches` run (see `benches/core.rs`).
//!
//! - [`faults`]: single-process fault costs (bare `mprotect` fault vs. the twinning fast path);
//! - [`job`]: the multi-node figures, run by every node of a job;
//! - [`reexec`]: running this bench again as a separate launcher (for a job of another size);
//! - [`summary`], [`json`], [`report`]: statistics, the machine-readable line and the table.

#![forbid(unsafe_code)]

pub mod faults;
pub mod job;
pub mod json;
pub mod reexec;
pub mod report;
pub mod summary;

/// Errors of the bench: anything, with a message.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
/// Result of the bench helpers.
pub type Result<T> = std::result::Result<T, BoxError>;
