//! The volume indexes (by name, by node, unfinished) and the one way to
//! read them.
//!
//! A volume change waits in the log and the overlay before redb holds it,
//! index entries included (see `overlay`). An index read in redb is right
//! only once the pending changes are applied, so every read here takes a
//! `Settled`, which only `Overlay::settled` makes, when nothing is pending.
//! The table definitions are private to this module: a read that skips
//! settling does not compile. The one read without it, a name lookup on
//! CreateVolume's path, asks the overlay itself before the index.

use redb::{ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use super::error::StoreResult;
use crate::domain::volume::Volume;
use crate::store::overlay::{Overlay, Settled};

const VOLUME_NAMES: TableDefinition<&str, &str> = TableDefinition::new("volume_names");
/// `node id \0 volume id` → attached (1) or only node-side state (0).
const NODE_VOLUMES: TableDefinition<&str, u8> = TableDefinition::new("node_volumes");
/// Ids of volume records whose create or delete has not finished, so
/// start-up and housekeeping find them without reading every record.
const UNFINISHED_VOLUMES: TableDefinition<&str, ()> = TableDefinition::new("unfinished_volumes");

/// The index tables, to be written (or read) inside a write transaction,
/// where the pending changes are applied first.
pub(super) fn names(
    txn: &WriteTransaction,
) -> StoreResult<redb::Table<'_, &'static str, &'static str>> {
    Ok(txn.open_table(VOLUME_NAMES)?)
}

pub(super) fn nodes(txn: &WriteTransaction) -> StoreResult<redb::Table<'_, &'static str, u8>> {
    Ok(txn.open_table(NODE_VOLUMES)?)
}

pub(super) fn unfinished(txn: &WriteTransaction) -> StoreResult<redb::Table<'_, &'static str, ()>> {
    Ok(txn.open_table(UNFINISHED_VOLUMES)?)
}

/// What a name lookup found.
pub(super) enum Named {
    /// A pending change wrote a record of this name.
    Pending(Box<Volume>),
    /// redb's index names this id (whose record the caller reads, overlay
    /// first).
    Indexed(String),
    Absent,
}

/// The volume named `name`: a pending record first, then redb's index.
pub(super) fn named(db: &redb::Database, pending: &Overlay, name: &str) -> StoreResult<Named> {
    if let Some(vol) = pending.volume_named(name) {
        return Ok(Named::Pending(Box::new(vol)));
    }
    let txn = db.begin_read()?;
    let id = txn.open_table(VOLUME_NAMES)?.get(name)?;
    Ok(id.map_or(Named::Absent, |id| Named::Indexed(id.value().to_string())))
}

/// Ids of the unfinished volumes.
pub(super) fn unfinished_ids(db: &redb::Database, _settled: &Settled) -> StoreResult<Vec<String>> {
    let txn = db.begin_read()?;
    let t = txn.open_table(UNFINISHED_VOLUMES)?;
    let mut ids = Vec::new();
    for entry in t.iter()? {
        ids.push(entry?.0.value().to_string());
    }
    Ok(ids)
}

/// Ids of the volumes with any state on `node`.
pub(super) fn ids_on_node(
    db: &redb::Database,
    _settled: &Settled,
    node: &str,
) -> StoreResult<Vec<String>> {
    let txn = db.begin_read()?;
    let t = txn.open_table(NODE_VOLUMES)?;
    let (lo, hi) = prefix_bounds(node);
    let mut ids = Vec::new();
    for entry in t.range::<&str>(lo.as_str()..hi.as_str())? {
        let (k, _) = entry?;
        if let Some((_, vol)) = k.value().split_once('\0') {
            ids.push(vol.to_string());
        }
    }
    Ok(ids)
}

/// Frees `name` in the name index if it still points at `id` (a newer
/// record may have taken the name since).
pub(super) fn release_name(txn: &WriteTransaction, name: &str, id: &str) -> StoreResult<()> {
    let mut names = names(txn)?;
    let owned = names.get(name)?.is_some_and(|v| v.value() == id);
    if owned {
        names.remove(name)?;
    }
    Ok(())
}

/// Range over every key starting with `prefix\0`.
pub(super) fn prefix_bounds(prefix: &str) -> (String, String) {
    (format!("{prefix}\0"), format!("{prefix}\u{1}"))
}
