//! Durable driver state in an embedded transactional store (redb): volume,
//! snapshot and group-snapshot records plus the indexes that keep every call
//! O(log n) in the number of volumes. Each `put_*` / `remove_*` is one
//! fsynced transaction: when it returns, the change survives a crash.

use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::{de::DeserializeOwned, Serialize};

use crate::volume::{GroupSnapshot, Snapshot, Volume};

const VOLUMES: TableDefinition<&str, &[u8]> = TableDefinition::new("volumes");
const VOLUME_NAMES: TableDefinition<&str, &str> = TableDefinition::new("volume_names");
const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots");
const SNAPSHOT_NAMES: TableDefinition<&str, &str> = TableDefinition::new("snapshot_names");
/// `source volume id \0 snapshot id` → (), for ListSnapshots by source.
const SNAPSHOTS_BY_SOURCE: TableDefinition<&str, ()> = TableDefinition::new("snapshots_by_source");
const GROUPS: TableDefinition<&str, &[u8]> = TableDefinition::new("group_snapshots");
const GROUP_NAMES: TableDefinition<&str, &str> = TableDefinition::new("group_snapshot_names");
/// `node id \0 volume id` → attached (1) or only node-side state (0).
const NODE_VOLUMES: TableDefinition<&str, u8> = TableDefinition::new("node_volumes");
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
const ALLOCATED: &str = "allocated_bytes";
const ATTACHED_PREFIX: &str = "attached/";

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("embedded store: {0}")]
    Db(#[from] redb::Error),
    #[error("record {key:?} in table {table} cannot be decoded: {source}")]
    Corrupt {
        table: &'static str,
        key: String,
        source: serde_json::Error,
    },
    #[error("record cannot be encoded: {0}")]
    Encode(serde_json::Error),
    #[error("store worker stopped: {0}")]
    Worker(String),
}

macro_rules! db_err {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self { StoreError::Db(e.into()) }
        }
    )*};
}
db_err!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

pub type StoreResult<T> = Result<T, StoreError>;

/// One page of a listing and where the next one starts.
#[derive(Debug)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

#[derive(Clone)]
pub struct Store {
    db: Arc<Database>,
}

fn decode<T: DeserializeOwned>(table: &'static str, key: &str, bytes: &[u8]) -> StoreResult<T> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt {
        table,
        key: key.to_string(),
        source,
    })
}

fn encode<T: Serialize>(value: &T) -> StoreResult<Vec<u8>> {
    serde_json::to_vec(value).map_err(StoreError::Encode)
}

fn pair(a: &str, b: &str) -> String {
    format!("{a}\0{b}")
}

/// Range over every key starting with `prefix\0`.
fn prefix_bounds(prefix: &str) -> (String, String) {
    (format!("{prefix}\0"), format!("{prefix}\u{1}"))
}

impl Store {
    pub fn open(dir: &Path) -> StoreResult<Self> {
        let db = Database::create(dir.join("state.redb"))?;
        let txn = db.begin_write()?;
        {
            // Create every table up front so readers never meet a missing one.
            txn.open_table(VOLUMES)?;
            txn.open_table(VOLUME_NAMES)?;
            txn.open_table(SNAPSHOTS)?;
            txn.open_table(SNAPSHOT_NAMES)?;
            txn.open_table(SNAPSHOTS_BY_SOURCE)?;
            txn.open_table(GROUPS)?;
            txn.open_table(GROUP_NAMES)?;
            txn.open_table(NODE_VOLUMES)?;
            txn.open_table(COUNTERS)?;
        }
        txn.commit()?;
        Ok(Store { db: Arc::new(db) })
    }

    /// Runs blocking store work off the async executor.
    pub async fn run<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> StoreResult<T> + Send + 'static,
    {
        let store = self.clone();
        tokio::task::spawn_blocking(move || f(&store))
            .await
            .map_err(|e| StoreError::Worker(e.to_string()))?
    }

    pub fn healthy(&self) -> StoreResult<()> {
        let txn = self.db.begin_read()?;
        txn.open_table(COUNTERS)?;
        Ok(())
    }

    fn get<T: DeserializeOwned>(
        &self,
        def: TableDefinition<&str, &[u8]>,
        table: &'static str,
        id: &str,
    ) -> StoreResult<Option<T>> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(def)?;
        let value = t.get(id)?;
        value.map(|v| decode(table, id, v.value())).transpose()
    }

    fn id_by_name(
        &self,
        def: TableDefinition<&str, &str>,
        name: &str,
    ) -> StoreResult<Option<String>> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(def)?;
        let id = t.get(name)?.map(|v| v.value().to_string());
        Ok(id)
    }

    fn page<T: DeserializeOwned>(
        &self,
        def: TableDefinition<&str, &[u8]>,
        table: &'static str,
        after: Option<&str>,
        limit: usize,
        keep: impl Fn(&T) -> bool,
    ) -> StoreResult<Page<T>> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(def)?;
        let range = match after {
            Some(after) => {
                t.range::<&str>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded))?
            }
            None => t.range::<&str>(..)?,
        };
        let mut items = Vec::new();
        let mut last = None;
        for entry in range {
            let (k, v) = entry?;
            let item: T = decode(table, k.value(), v.value())?;
            if !keep(&item) {
                continue;
            }
            if items.len() == limit {
                return Ok(Page { items, next: last });
            }
            last = Some(k.value().to_string());
            items.push(item);
        }
        Ok(Page { items, next: None })
    }

    // ---- volumes ----

    pub fn volume(&self, id: &str) -> StoreResult<Option<Volume>> {
        self.get(VOLUMES, "volumes", id)
    }

    pub fn volume_by_name(&self, name: &str) -> StoreResult<Option<Volume>> {
        match self.id_by_name(VOLUME_NAMES, name)? {
            Some(id) => self.volume(&id),
            None => Ok(None),
        }
    }

    /// Inserts or replaces a volume record and keeps every index in step.
    pub fn put_volume(&self, vol: &Volume) -> StoreResult<()> {
        let txn = self.db.begin_write()?;
        {
            let mut volumes = txn.open_table(VOLUMES)?;
            let old: Option<Volume> = match volumes.get(vol.id.as_str())? {
                Some(v) => Some(decode("volumes", &vol.id, v.value())?),
                None => None,
            };
            volumes.insert(vol.id.as_str(), encode(vol)?.as_slice())?;
            txn.open_table(VOLUME_NAMES)?
                .insert(vol.name.as_str(), vol.id.as_str())?;
            let old_bytes = old.as_ref().map_or(0, |o| o.capacity_bytes);
            adjust(&txn, ALLOCATED, old_bytes, vol.capacity_bytes)?;
            reindex_nodes(&txn, old.as_ref(), Some(vol))?;
        }
        txn.commit()?;
        Ok(())
    }

    pub fn remove_volume(&self, id: &str) -> StoreResult<()> {
        let txn = self.db.begin_write()?;
        {
            if let Some(old) = take::<Volume>(&txn, VOLUMES, "volumes", id)? {
                release_name(&txn, VOLUME_NAMES, &old.name, id)?;
                adjust(&txn, ALLOCATED, old.capacity_bytes, 0)?;
                reindex_nodes(&txn, Some(&old), None)?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    pub fn list_volumes(&self, after: Option<&str>, limit: usize) -> StoreResult<Page<Volume>> {
        self.page(VOLUMES, "volumes", after, limit, |v: &Volume| {
            v.lifecycle == crate::volume::Lifecycle::Ready
        })
    }

    /// Volumes with ControllerPublish recorded on `node`.
    pub fn attached_count(&self, node: &str) -> StoreResult<u64> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(COUNTERS)?;
        let count = t
            .get(format!("{ATTACHED_PREFIX}{node}").as_str())?
            .map_or(0, |v| v.value());
        Ok(count)
    }

    /// Every volume that has any state on `node` (for the node's restart
    /// reconciliation); cost grows with that node's volumes only.
    pub fn volumes_on_node(&self, node: &str) -> StoreResult<Vec<Volume>> {
        let ids: Vec<String> = {
            let txn = self.db.begin_read()?;
            let t = txn.open_table(NODE_VOLUMES)?;
            let (lo, hi) = prefix_bounds(node);
            let mut ids = Vec::new();
            for entry in t.range::<&str>(lo.as_str()..hi.as_str())? {
                let (k, _) = entry?;
                if let Some((_, vol)) = k.value().split_once('\0') {
                    ids.push(vol.to_string());
                }
            }
            ids
        };
        let mut vols = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(v) = self.volume(&id)? {
                vols.push(v);
            }
        }
        Ok(vols)
    }

    pub fn allocated_bytes(&self) -> StoreResult<u64> {
        let txn = self.db.begin_read()?;
        let t = txn.open_table(COUNTERS)?;
        let v = t.get(ALLOCATED)?.map_or(0, |v| v.value());
        Ok(v)
    }

    // ---- snapshots ----

    pub fn snapshot(&self, id: &str) -> StoreResult<Option<Snapshot>> {
        self.get(SNAPSHOTS, "snapshots", id)
    }

    pub fn snapshot_by_name(&self, name: &str) -> StoreResult<Option<Snapshot>> {
        match self.id_by_name(SNAPSHOT_NAMES, name)? {
            Some(id) => self.snapshot(&id),
            None => Ok(None),
        }
    }

    pub fn put_snapshot(&self, snap: &Snapshot) -> StoreResult<()> {
        let txn = self.db.begin_write()?;
        {
            let mut snaps = txn.open_table(SNAPSHOTS)?;
            let old_bytes = match snaps.get(snap.id.as_str())? {
                Some(v) => decode::<Snapshot>("snapshots", &snap.id, v.value())?.size_bytes,
                None => 0,
            };
            snaps.insert(snap.id.as_str(), encode(snap)?.as_slice())?;
            txn.open_table(SNAPSHOT_NAMES)?
                .insert(snap.name.as_str(), snap.id.as_str())?;
            txn.open_table(SNAPSHOTS_BY_SOURCE)?
                .insert(pair(&snap.source_volume_id, &snap.id).as_str(), ())?;
            adjust(&txn, ALLOCATED, old_bytes, snap.size_bytes)?;
        }
        txn.commit()?;
        Ok(())
    }

    pub fn remove_snapshot(&self, id: &str) -> StoreResult<()> {
        let txn = self.db.begin_write()?;
        {
            if let Some(old) = take::<Snapshot>(&txn, SNAPSHOTS, "snapshots", id)? {
                release_name(&txn, SNAPSHOT_NAMES, &old.name, id)?;
                txn.open_table(SNAPSHOTS_BY_SOURCE)?
                    .remove(pair(&old.source_volume_id, id).as_str())?;
                adjust(&txn, ALLOCATED, old.size_bytes, 0)?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    pub fn list_snapshots(&self, after: Option<&str>, limit: usize) -> StoreResult<Page<Snapshot>> {
        self.page(SNAPSHOTS, "snapshots", after, limit, |s: &Snapshot| {
            s.lifecycle == crate::volume::Lifecycle::Ready
        })
    }

    /// Snapshots of one source volume, paginated by snapshot id.
    pub fn list_snapshots_of(
        &self,
        source: &str,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<Page<Snapshot>> {
        let txn = self.db.begin_read()?;
        let index = txn.open_table(SNAPSHOTS_BY_SOURCE)?;
        let snaps = txn.open_table(SNAPSHOTS)?;
        let (lo, hi) = prefix_bounds(source);
        let start = match after {
            Some(a) => pair(source, a),
            None => lo,
        };
        let mut items = Vec::new();
        let mut last = None;
        for entry in index.range::<&str>(start.as_str()..hi.as_str())? {
            let (k, _) = entry?;
            let Some((_, id)) = k.value().split_once('\0') else {
                continue;
            };
            if Some(id) == after {
                continue;
            }
            let Some(raw) = snaps.get(id)? else { continue };
            let snap: Snapshot = decode("snapshots", id, raw.value())?;
            if snap.lifecycle != crate::volume::Lifecycle::Ready {
                continue;
            }
            if items.len() == limit {
                return Ok(Page { items, next: last });
            }
            last = Some(id.to_string());
            items.push(snap);
        }
        Ok(Page { items, next: None })
    }

    // ---- group snapshots ----

    pub fn group(&self, id: &str) -> StoreResult<Option<GroupSnapshot>> {
        self.get(GROUPS, "group_snapshots", id)
    }

    pub fn group_by_name(&self, name: &str) -> StoreResult<Option<GroupSnapshot>> {
        match self.id_by_name(GROUP_NAMES, name)? {
            Some(id) => self.group(&id),
            None => Ok(None),
        }
    }

    pub fn put_group(&self, group: &GroupSnapshot) -> StoreResult<()> {
        let txn = self.db.begin_write()?;
        {
            txn.open_table(GROUPS)?
                .insert(group.id.as_str(), encode(group)?.as_slice())?;
            txn.open_table(GROUP_NAMES)?
                .insert(group.name.as_str(), group.id.as_str())?;
        }
        txn.commit()?;
        Ok(())
    }

    pub fn remove_group(&self, id: &str) -> StoreResult<()> {
        let txn = self.db.begin_write()?;
        {
            if let Some(old) = take::<GroupSnapshot>(&txn, GROUPS, "group_snapshots", id)? {
                release_name(&txn, GROUP_NAMES, &old.name, id)?;
            }
        }
        txn.commit()?;
        Ok(())
    }
}

/// Removes and returns a record inside a write transaction.
fn take<T: DeserializeOwned>(
    txn: &redb::WriteTransaction,
    def: TableDefinition<&str, &[u8]>,
    table: &'static str,
    id: &str,
) -> StoreResult<Option<T>> {
    let mut t = txn.open_table(def)?;
    let old = t.remove(id)?;
    old.map(|v| decode(table, id, v.value())).transpose()
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

/// Keeps NODE_VOLUMES and the per-node attached counters equal to what the
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
    let mut index = txn.open_table(NODE_VOLUMES)?;
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
    use crate::capability::{AccessMode, AccessType, Capability};
    use crate::volume::{Attachment, Backing, Lifecycle, NodeRecord};
    use std::collections::BTreeMap;

    fn vol(id: &str, name: &str) -> Volume {
        Volume {
            id: id.into(),
            name: name.into(),
            capacity_bytes: 100,
            backing: Backing::Directory,
            capabilities: vec![],
            parameters: BTreeMap::new(),
            mutable_parameters: BTreeMap::new(),
            source: None,
            topology: vec![],
            context: BTreeMap::new(),
            created_unix: 0,
            lifecycle: Lifecycle::Ready,
            ephemeral: false,
            nodes: BTreeMap::new(),
        }
    }

    fn attach(v: &mut Volume, node: &str) {
        v.nodes.insert(
            node.into(),
            NodeRecord {
                attachment: Some(Attachment {
                    readonly: false,
                    capability: Capability {
                        mode: AccessMode::SingleNodeWriter,
                        access: AccessType::Block,
                    },
                    publish_context: BTreeMap::new(),
                }),
                ..Default::default()
            },
        );
    }

    #[test]
    fn records_indexes_and_counters_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            let mut a = vol("a", "name-a");
            attach(&mut a, "n1");
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

    #[test]
    fn pages_continue_after_the_last_id_even_if_it_was_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        for i in 0..5 {
            store
                .put_volume(&vol(&format!("v{i}"), &format!("n{i}")))
                .unwrap();
        }
        let p1 = store.list_volumes(None, 2).unwrap();
        assert_eq!(
            p1.items.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(),
            ["v0", "v1"]
        );
        let next = p1.next.unwrap();
        store.remove_volume(&next).unwrap();
        let p2 = store.list_volumes(Some(&next), 2).unwrap();
        assert_eq!(
            p2.items.iter().map(|v| v.id.as_str()).collect::<Vec<_>>(),
            ["v2", "v3"]
        );
        let p3 = store.list_volumes(p2.next.as_deref(), 2).unwrap();
        assert_eq!(p3.items.len(), 1);
        assert!(p3.next.is_none());
    }
}
