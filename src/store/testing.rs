//! What the store's tests share: a store as a crash leaves it, one whose
//! flusher waits, and a look at redb beneath the overlay.

use std::path::Path;

use redb::ReadableDatabase;

use super::limits::Limits;
use super::record::decode;
use super::tables::VOLUMES;
use super::Store;
use crate::domain::volume::Volume;

pub(super) fn attach_limit(node: &str, max: u64) -> Limits {
    Limits {
        attach: Some((node.to_string(), max)),
        capacity: None,
    }
}

/// What a SIGKILL leaves: the files as they are while the store is
/// still open (the page cache survives a killed process).
pub(super) fn crash_copy(from: &Path) -> tempfile::TempDir {
    let to = tempfile::tempdir().unwrap();
    for f in ["state.redb", "state.wal"] {
        std::fs::copy(from.join(f), to.path().join(f)).unwrap();
    }
    to
}

/// A store whose flusher never runs: what waits stays waiting until a
/// reader or a round applies it, however slowly the test goes.
pub(super) fn open_held(dir: &Path) -> Store {
    let store = Store::open(dir).unwrap();
    store.commits.hold_flusher();
    store
}

/// The record of `id` as redb itself holds it, overlay aside.
pub(super) fn in_redb(store: &Store, id: &str) -> Option<Volume> {
    let txn = store.db.begin_read().unwrap();
    let t = txn.open_table(VOLUMES).unwrap();
    let raw = t.get(id).unwrap().map(|v| v.value().to_vec());
    raw.map(|raw| decode("volumes", id, &raw).unwrap())
}
