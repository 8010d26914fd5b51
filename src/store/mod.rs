//! Durable driver state: volume, snapshot and group snapshot records in an
//! embedded transactional store (redb), with a write-ahead log in front of
//! it. Its parts, from the top (`tests/suite/layering.rs` holds each to
//! importing only the ones below it):
//!
//! - `api`: the `Store` callers hold, its reads and writes.
//! - `journal`: what stands between a change and redb: the rounds of the
//!   group commit, the log they write and sync, its replay at start-up.
//! - `tables`: the redb tables and what one change does to them (records,
//!   indexes, counters, quarantine); `index`, the volume indexes.
//! - `limits`: what a volume write must stay within.
//! - `record`: records and logged changes as bytes.
//! - `group_commit`: writers that share one sync; `overlay`: the records
//!   the log holds that redb does not yet; `wal`: the log's file.
//!
//! May import: `csi`, `domain`, `rt`, `os`.

mod api;
pub mod error;
pub mod group_commit;
mod index;
mod journal;
mod limits;
pub mod overlay;
mod record;
mod tables;
#[cfg(test)]
mod testing;
pub mod wal;

pub use api::{Page, Store, STORE_FORMAT};
pub use error::{StoreError, StoreResult};
pub use limits::Limits;
