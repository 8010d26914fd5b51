//! The redb tables and what one change does to them: the records, their
//! name and source indexes, the counters (bytes allocated, attachments per
//! node, and the store's own marks) and the quarantine. A change is applied
//! here when it is first written and again, the same way, when the log is
//! replayed, so what replay rebuilds is what the call left. The volume
//! indexes' tables are `index`'s.

use redb::{ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;

use super::error::{StoreError, StoreResult};
use super::index;
use super::limits::Limits;
use super::record::{decode, encode, encode_op, Encoded, Op};
use crate::domain::volume::{GroupSnapshot, Snapshot, Volume};

pub(super) const VOLUMES: TableDefinition<&str, &[u8]> = TableDefinition::new("volumes");
pub(super) const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots");
pub(super) const SNAPSHOT_NAMES: TableDefinition<&str, &str> =
    TableDefinition::new("snapshot_names");
/// `source volume id \0 snapshot id` → (), for ListSnapshots by source.
pub(super) const SNAPSHOTS_BY_SOURCE: TableDefinition<&str, ()> =
    TableDefinition::new("snapshots_by_source");
pub(super) const GROUPS: TableDefinition<&str, &[u8]> = TableDefinition::new("group_snapshots");
pub(super) const GROUP_NAMES: TableDefinition<&str, &str> =
    TableDefinition::new("group_snapshot_names");
pub(super) const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
/// Set in COUNTERS once the unfinished index covers every record (stores
/// written before the index existed are indexed once, at open).
pub(super) const UNFINISHED_INDEXED: &str = "index/unfinished_volumes";
/// `table/key` → the raw bytes of a record that could not be decoded. It is
/// moved here, out of the way, so one bad record never stops the driver.
pub(super) const QUARANTINE: TableDefinition<&str, &[u8]> = TableDefinition::new("quarantine");
pub(super) const ALLOCATED: &str = "allocated_bytes";
pub(super) const ATTACHED_PREFIX: &str = "attached/";

pub(super) fn pair(a: &str, b: &str) -> String {
    format!("{a}\0{b}")
}

/// Applies one op inside a write transaction (first time or at replay).
pub(super) fn apply(txn: &redb::WriteTransaction, op: &Op, limits: &Limits) -> StoreResult<()> {
    match op {
        Op::PutVolume(vol) => write_volume(txn, vol, &encode(vol)?, limits),
        Op::RemoveVolume(id) => {
            index::unfinished(txn)?.remove(id.as_str())?;
            if let Some(old) = take::<Volume>(txn, VOLUMES, "volumes", id)? {
                index::release_name(txn, &old.name, id)?;
                adjust(txn, ALLOCATED, old.capacity_bytes, 0)?;
                reindex_nodes(txn, Some(&old), None)?;
            }
            Ok(())
        }
        Op::PutSnapshot(snap) => {
            let mut snaps = txn.open_table(SNAPSHOTS)?;
            // An undecodable old record is simply replaced.
            let old_bytes = match snaps.get(snap.id.as_str())? {
                Some(v) => decode::<Snapshot>("snapshots", &snap.id, v.value())
                    .map_or(0, |old| old.charged_bytes()),
                None => 0,
            };
            snaps.insert(snap.id.as_str(), encode(snap)?.as_slice())?;
            txn.open_table(SNAPSHOT_NAMES)?
                .insert(snap.name.as_str(), snap.id.as_str())?;
            txn.open_table(SNAPSHOTS_BY_SOURCE)?
                .insert(pair(&snap.source_volume_id, &snap.id).as_str(), ())?;
            adjust(txn, ALLOCATED, old_bytes, snap.charged_bytes())
        }
        Op::RemoveSnapshot(id) => {
            if let Some(old) = take::<Snapshot>(txn, SNAPSHOTS, "snapshots", id)? {
                release_name(txn, SNAPSHOT_NAMES, &old.name, id)?;
                txn.open_table(SNAPSHOTS_BY_SOURCE)?
                    .remove(pair(&old.source_volume_id, id).as_str())?;
                adjust(txn, ALLOCATED, old.charged_bytes(), 0)?;
            }
            Ok(())
        }
        Op::PutGroup(group) => {
            txn.open_table(GROUPS)?
                .insert(group.id.as_str(), encode(group)?.as_slice())?;
            txn.open_table(GROUP_NAMES)?
                .insert(group.name.as_str(), group.id.as_str())?;
            Ok(())
        }
        Op::RemoveGroup(id) => {
            if let Some(old) = take::<GroupSnapshot>(txn, GROUPS, "group_snapshots", id)? {
                release_name(txn, GROUP_NAMES, &old.name, id)?;
            }
            Ok(())
        }
        Op::Quarantine { table, ids } => {
            let (def, table) = match table.as_str() {
                "volumes" => (VOLUMES, "volumes"),
                "snapshots" => (SNAPSHOTS, "snapshots"),
                "group_snapshots" => (GROUPS, "group_snapshots"),
                other => {
                    return Err(StoreError::Worker(format!(
                        "quarantine of unknown table {other:?}"
                    )))
                }
            };
            for id in ids {
                let raw = txn
                    .open_table(def)?
                    .remove(id.as_str())?
                    .map(|v| v.value().to_vec());
                if let Some(raw) = raw {
                    quarantine_in(txn, table, id, &raw)?;
                }
            }
            Ok(())
        }
    }
}

/// Applies `op`, using a volume record's encoding when there is one.
pub(super) fn apply_encoded(
    txn: &redb::WriteTransaction,
    op: &Op,
    record: Option<&[u8]>,
    limits: &Limits,
) -> StoreResult<()> {
    match (op, record) {
        (Op::PutVolume(vol), Some(record)) => write_volume(txn, vol, record, limits),
        _ => apply(txn, op, limits),
    }
}

/// Applies `op` and returns it encoded for the log.
pub(super) fn apply_and_encode(
    txn: &redb::WriteTransaction,
    op: &Op,
    limits: &Limits,
) -> StoreResult<Encoded> {
    let encoded = encode_op(op)?;
    apply_encoded(txn, op, encoded.record(), limits)?;
    Ok(encoded)
}

/// Writes a volume record (`record`, its encoding) and its indexes; refuses
/// (before writing anything) a change past `limits`.
fn write_volume(
    txn: &redb::WriteTransaction,
    vol: &Volume,
    record: &[u8],
    limits: &Limits,
) -> StoreResult<()> {
    let mut volumes = txn.open_table(VOLUMES)?;
    let raw = volumes.get(vol.id.as_str())?.map(|v| v.value().to_vec());
    let old: Option<Volume> = match raw {
        Some(raw) => match decode("volumes", &vol.id, &raw) {
            Ok(old) => Some(old),
            Err(StoreError::Corrupt { .. }) => {
                quarantine_in(txn, "volumes", &vol.id, &raw)?;
                None
            }
            Err(e) => return Err(e),
        },
        None => None,
    };
    limits.check(
        old.as_ref(),
        Some(vol),
        |node| counter(txn, &format!("{ATTACHED_PREFIX}{node}")),
        || counter(txn, ALLOCATED),
    )?;
    volumes.insert(vol.id.as_str(), record)?;
    // Index writes that change nothing still dirty their table's pages, and
    // most puts (a stage, a publish) change only the record itself.
    if old.as_ref().is_none_or(|o| o.name != vol.name) {
        index::names(txn)?.insert(vol.name.as_str(), vol.id.as_str())?;
    }
    let is_ready = |v: &Volume| v.lifecycle == crate::domain::volume::Lifecycle::Ready;
    if old.as_ref().is_none_or(|o| is_ready(o) != is_ready(vol)) {
        let mut unfinished = index::unfinished(txn)?;
        if is_ready(vol) {
            unfinished.remove(vol.id.as_str())?;
        } else {
            unfinished.insert(vol.id.as_str(), ())?;
        }
    }
    let old_bytes = old.as_ref().map_or(0, |o| o.capacity_bytes);
    adjust(txn, ALLOCATED, old_bytes, vol.capacity_bytes)?;
    reindex_nodes(txn, old.as_ref(), Some(vol))
}

/// Fills the unfinished index from every record (once per store).
pub(super) fn index_unfinished(txn: &redb::WriteTransaction) -> StoreResult<()> {
    let mut ids = Vec::new();
    {
        let volumes = txn.open_table(VOLUMES)?;
        for entry in volumes.iter()? {
            let (k, v) = entry?;
            let unfinished = decode::<Volume>("volumes", k.value(), v.value())
                .is_ok_and(|vol| vol.lifecycle != crate::domain::volume::Lifecycle::Ready);
            if unfinished {
                ids.push(k.value().to_string());
            }
        }
    }
    let mut index = index::unfinished(txn)?;
    for id in ids {
        index.insert(id.as_str(), ())?;
    }
    Ok(())
}

/// Removes and returns a record inside a write transaction.
fn take<T: DeserializeOwned>(
    txn: &redb::WriteTransaction,
    def: TableDefinition<&str, &[u8]>,
    table: &'static str,
    id: &str,
) -> StoreResult<Option<T>> {
    let raw = txn.open_table(def)?.remove(id)?.map(|v| v.value().to_vec());
    let Some(raw) = raw else { return Ok(None) };
    match decode(table, id, &raw) {
        Err(StoreError::Corrupt { .. }) => {
            quarantine_in(txn, table, id, &raw)?;
            Ok(None)
        }
        other => other.map(Some),
    }
}

/// Keeps the raw bytes of an undecodable record aside; for a volume, also
/// drops its node-index entries (their attach counts with them), which
/// nothing could otherwise clear.
fn quarantine_in(
    txn: &redb::WriteTransaction,
    table: &'static str,
    id: &str,
    raw: &[u8],
) -> StoreResult<()> {
    tracing::error!(
        table,
        id,
        bytes = raw.len(),
        "record cannot be decoded; moved to quarantine, the driver carries on without it"
    );
    crate::rt::metrics::housekeeping("quarantined_record");
    txn.open_table(QUARANTINE)?
        .insert(format!("{table}/{id}").as_str(), raw)?;
    if table != "volumes" {
        return Ok(());
    }
    index::unfinished(txn)?.remove(id)?;
    let suffix = format!("\0{id}");
    let mut stale = Vec::new();
    {
        let index = index::nodes(txn)?;
        for entry in index.iter()? {
            let (k, v) = entry?;
            if k.value().ends_with(&suffix) {
                stale.push((k.value().to_string(), v.value()));
            }
        }
    }
    let mut index = index::nodes(txn)?;
    for (key, attached) in stale {
        index.remove(key.as_str())?;
        if attached == 1 {
            if let Some((node, _)) = key.split_once('\0') {
                adjust(txn, &format!("{ATTACHED_PREFIX}{node}"), 1, 0)?;
            }
        }
    }
    Ok(())
}

/// Frees `name` in a name index if it still points at `id` (a newer record
/// may have taken the name since).
fn release_name(
    txn: &redb::WriteTransaction,
    def: TableDefinition<&str, &str>,
    name: &str,
    id: &str,
) -> StoreResult<()> {
    let mut names = txn.open_table(def)?;
    let owned = names.get(name)?.is_some_and(|v| v.value() == id);
    if owned {
        names.remove(name)?;
    }
    Ok(())
}

pub(super) fn counter(txn: &redb::WriteTransaction, key: &str) -> StoreResult<u64> {
    let t = txn.open_table(COUNTERS)?;
    let value = t.get(key)?.map_or(0, |v| v.value());
    Ok(value)
}

fn adjust(txn: &redb::WriteTransaction, key: &str, minus: u64, plus: u64) -> StoreResult<()> {
    if minus == plus {
        return Ok(());
    }
    let mut t = txn.open_table(COUNTERS)?;
    let current = t.get(key)?.map_or(0, |v| v.value());
    let next = current.saturating_sub(minus).saturating_add(plus);
    if next == 0 {
        t.remove(key)?;
    } else {
        t.insert(key, next)?;
    }
    Ok(())
}

/// Keeps the node index and the per-node attached counters equal to what the
/// volume records say, touching only the nodes this volume is on.
fn reindex_nodes(
    txn: &redb::WriteTransaction,
    old: Option<&Volume>,
    new: Option<&Volume>,
) -> StoreResult<()> {
    let state = |v: Option<&Volume>, node: &str| -> Option<u8> {
        v.and_then(|v| v.nodes.get(node))
            .map(|n| u8::from(n.attachment.is_some()))
    };
    let mut nodes: Vec<&str> = Vec::new();
    for v in [old, new].into_iter().flatten() {
        nodes.extend(v.nodes.keys().map(String::as_str));
    }
    nodes.sort_unstable();
    nodes.dedup();
    let id = new.or(old).map(|v| v.id.as_str()).unwrap_or_default();
    let mut index = index::nodes(txn)?;
    for node in nodes {
        let (before, after) = (state(old, node), state(new, node));
        if before == after {
            continue;
        }
        let key = pair(node, id);
        match after {
            Some(a) => index.insert(key.as_str(), a)?,
            None => index.remove(key.as_str())?,
        };
        let counter = format!("{ATTACHED_PREFIX}{node}");
        adjust(
            txn,
            &counter,
            u64::from(before == Some(1)),
            u64::from(after == Some(1)),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::volume::Lifecycle;
    use crate::domain::volume::{sample as vol, with_attachment};
    use crate::store::Store;

    /// All of them: those a listing shows, over several pages, and those
    /// it leaves out because their create or delete has not finished.
    #[tokio::test]
    async fn all_volumes_holds_every_record_once() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        for i in 0..1500 {
            store
                .put_volume(&vol(&format!("v{i:04}"), &format!("n{i}")))
                .unwrap();
        }
        let mut unfinished = vol("creating", "name-creating");
        unfinished.lifecycle = Lifecycle::Provisioning;
        store.put_volume(&unfinished).unwrap();
        let all = store.all_volumes().await.unwrap();
        let mut ids: Vec<&str> = all.iter().map(|v| v.id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 1501);
        assert_eq!(all.len(), 1501);
        assert!(ids.contains(&"creating"));
    }

    #[test]
    fn records_indexes_and_counters_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let a = with_attachment(vol("a", "name-a"), "n1");
            store.put_volume(&a).unwrap();
            store.put_volume(&vol("b", "name-b")).unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.volume_by_name("name-a").unwrap().unwrap().id, "a");
        assert_eq!(store.attached_count("n1").unwrap(), 1);
        assert_eq!(store.allocated_bytes().unwrap(), 200);
        assert_eq!(store.volumes_on_node("n1").unwrap().len(), 1);
        let mut a = store.volume("a").unwrap().unwrap();
        a.nodes.clear();
        store.put_volume(&a).unwrap();
        assert_eq!(store.attached_count("n1").unwrap(), 0);
        assert!(store.volumes_on_node("n1").unwrap().is_empty());
        store.remove_volume("a").unwrap();
        assert!(store.volume_by_name("name-a").unwrap().is_none());
        assert_eq!(store.allocated_bytes().unwrap(), 100);
    }

    fn corrupt(store: &Store, id: &str) {
        let txn = store.db.begin_write().unwrap();
        txn.open_table(VOLUMES)
            .unwrap()
            .insert(id, b"{not json".as_slice())
            .unwrap();
        txn.commit().unwrap();
    }

    #[test]
    fn an_undecodable_record_is_quarantined_and_the_rest_keeps_working() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let bad = with_attachment(vol("bad", "name-bad"), "n1");
        store.put_volume(&bad).unwrap();
        store.put_volume(&vol("good", "name-good")).unwrap();
        // In redb, not pending, before the disk damages one.
        store.checkpoint().unwrap();
        corrupt(&store, "bad");
        // Start-up (the node's reconciliation) reads the node's volumes.
        assert!(store.volumes_on_node("n1").unwrap().is_empty());
        assert_eq!(store.quarantined().unwrap(), 1);
        assert_eq!(
            store.attached_count("n1").unwrap(),
            0,
            "its attachment is released"
        );
        assert!(store.volume("bad").unwrap().is_none());
        let page = store.list_volumes(None, 10).unwrap();
        assert_eq!(page.items.len(), 1);
        assert_eq!(page.items[0].id, "good");

        // Listing meets one first; writing over one replaces it.
        corrupt(&store, "good");
        assert!(store.list_volumes(None, 10).unwrap().items.is_empty());
        assert_eq!(store.quarantined().unwrap(), 2);
        corrupt(&store, "again");
        store.put_volume(&vol("again", "name-again")).unwrap();
        assert_eq!(store.volume("again").unwrap().unwrap().name, "name-again");
        assert_eq!(store.quarantined().unwrap(), 3);
        corrupt(&store, "gone");
        store.remove_volume("gone").unwrap();
        assert!(store.volume("gone").unwrap().is_none());
    }

    #[test]
    fn unfinished_volumes_are_indexed_through_their_lifecycle() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let ids = |s: &Store| {
            s.unfinished_volumes()
                .unwrap()
                .into_iter()
                .map(|v| v.id)
                .collect::<Vec<_>>()
        };
        let mut a = vol("a", "name-a");
        a.lifecycle = Lifecycle::Provisioning;
        store.put_volume(&a).unwrap();
        store.put_volume(&vol("b", "name-b")).unwrap();
        assert_eq!(ids(&store), ["a"]);
        a.lifecycle = Lifecycle::Ready;
        store.put_volume_lazily(&a).unwrap();
        assert!(ids(&store).is_empty());
        a.lifecycle = Lifecycle::Deleting;
        store.put_volume(&a).unwrap();
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(ids(&store), ["a"]);
        store.remove_volume("a").unwrap();
        assert!(ids(&store).is_empty());
    }
}
