//! Durable driver state: volume, snapshot and group snapshot records in an
//! embedded transactional store (redb), with a write-ahead log in front of
//! it (`wal`), writers that share one sync (`group_commit`) and the records
//! the log holds that redb does not yet (`overlay`).
//!
//! May import: `csi`, `domain`, `rt`, `os`.

mod db;
pub mod error;
pub mod group_commit;
mod index;
pub mod overlay;
pub mod wal;

pub use db::*;
pub use error::{StoreError, StoreResult};
