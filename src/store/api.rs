//! The `Store` callers hold: durable driver state in an embedded
//! transactional store (redb), volume, snapshot and group-snapshot records
//! plus the indexes that keep every call O(log n) in the number of volumes.
//! Each `put_*` / `remove_*` is durable when it returns: the change is
//! written to the write-ahead log (`wal`), which one `fdatasync` makes
//! durable and start-up replays over redb's last checkpoint. A volume
//! change waits there for a redb transaction that takes many (the
//! flusher's, in the background), and until then readers find it in the
//! `overlay`; other changes are applied to redb, without a sync, with their
//! round (`journal`). A lazy change (`*_lazily`) waits for no sync either.

use std::path::Path;
use std::sync::Arc;

use redb::{Database, ReadableDatabase, ReadableTableMetadata, TableDefinition};
use serde::de::DeserializeOwned;

use super::error::{StoreError, StoreResult};
use super::group_commit::GroupCommit;
use super::index;
use super::journal::{replay, Change, Journal};
use super::limits::Limits;
use super::overlay::Settled;
use super::record::{decode, Op};
use super::tables::{
    counter, index_unfinished, pair, ALLOCATED, ATTACHED_PREFIX, COUNTERS, GROUPS, GROUP_NAMES,
    QUARANTINE, SNAPSHOTS, SNAPSHOTS_BY_SOURCE, SNAPSHOT_NAMES, UNFINISHED_INDEXED, VOLUMES,
};
use crate::domain::volume::{GroupSnapshot, Snapshot, Volume};

/// The format of what this build writes to a state directory (the store
/// and its log), kept under [`STORE_FORMAT_KEY`] in COUNTERS. Raise it with
/// any change an older build would misread; a build that meets a newer
/// one refuses to start before it writes anything. Stores made before the
/// key existed are format 1.
pub const STORE_FORMAT: u64 = 1;
const STORE_FORMAT_KEY: &str = "store_format";

/// redb's page cache, its write buffer (half at most) included. A record
/// is read by key through a few pages; what the cache misses comes from
/// the kernel's page cache in microseconds. 4 MiB was 0.4 KiB per volume
/// of the controller's memory at 10,000 member volumes
/// (`bench/member-scale.sh`) for no figure a user sees.
const CACHE_BYTES: usize = 1 << 20;

/// One page of a listing and where the next one starts.
#[derive(Debug)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

#[derive(Clone)]
pub struct Store {
    // Shared with the parts' tests, which look beneath the calls.
    pub(super) db: Arc<Database>,
    pub(super) commits: Arc<GroupCommit<Change>>,
    pub(super) journal: Arc<Journal>,
}

impl Store {
    /// Removes the store in `dir` (its database and its log), so the next
    /// [`Store::open`] starts empty.
    pub fn discard(dir: &Path) -> std::io::Result<()> {
        for file in ["state.redb", "state.wal"] {
            match std::fs::remove_file(dir.join(file)) {
                Ok(()) => tracing::info!(
                    file,
                    "discarded the store: records come from the host cluster"
                ),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub fn open(dir: &Path) -> StoreResult<Self> {
        // A newer build's store is read before it is opened for writing
        // (which marks the file): what a newer build wrote stays as it was.
        // A file that was not closed cleanly cannot be opened read-only; it
        // is read once open for writing (redb's repair is its own, nothing
        // of ours is written before).
        let checked = match redb::ReadOnlyDatabase::open(dir.join("state.redb")) {
            Ok(read_only) => {
                check_format(dir, &read_only.begin_read()?)?;
                true
            }
            Err(_) => false,
        };
        // Records are small and read by key: a modest page cache keeps the
        // memory of a store of tens of thousands of volumes bounded (the
        // kernel's page cache holds the rest).
        let db = Database::builder()
            .set_cache_size(CACHE_BYTES)
            .set_repair_callback(|session| {
                // A file not closed cleanly is read whole to rebuild its
                // allocator state: worth a line, start-up takes longer.
                if session.progress() == 0.0 {
                    tracing::warn!("state.redb was not closed cleanly; checking it before serving");
                }
            })
            .create(dir.join("state.redb"))?;
        if !checked {
            check_format(dir, &db.begin_read()?)?;
        }
        let txn = db.begin_write()?;
        let tables_before = txn.list_tables()?.count();
        let (wal, changed) = {
            // Create every table up front so readers never meet a missing one.
            txn.open_table(VOLUMES)?;
            index::names(&txn)?;
            txn.open_table(SNAPSHOTS)?;
            txn.open_table(SNAPSHOT_NAMES)?;
            txn.open_table(SNAPSHOTS_BY_SOURCE)?;
            txn.open_table(GROUPS)?;
            txn.open_table(GROUP_NAMES)?;
            index::nodes(&txn)?;
            txn.open_table(COUNTERS)?;
            txn.open_table(QUARANTINE)?;
            index::unfinished(&txn)?;
            let (wal, replayed) = replay(&txn, dir)?;
            let mut changed = replayed > 0 || txn.list_tables()?.count() != tables_before;
            if counter(&txn, STORE_FORMAT_KEY)? != STORE_FORMAT {
                txn.open_table(COUNTERS)?
                    .insert(STORE_FORMAT_KEY, STORE_FORMAT)?;
                changed = true;
            }
            if counter(&txn, UNFINISHED_INDEXED)? == 0 {
                index_unfinished(&txn)?;
                txn.open_table(COUNTERS)?.insert(UNFINISHED_INDEXED, 1)?;
                changed = true;
            }
            (wal, changed)
        };
        if changed {
            // This durable commit is the checkpoint of everything replayed.
            txn.commit()?;
        } else {
            // Nothing to make durable: a start after a clean stop does not
            // wait for a sync (start -> Probe ready with 10,000 volumes).
            txn.abort()?;
        }
        let db = Arc::new(db);
        let (journal, commits) = Journal::start(db.clone(), wal)?;
        Ok(Store {
            db,
            commits,
            journal,
        })
    }

    /// Makes every change durable in redb itself and empties the log, so
    /// the next start replays nothing (a clean shutdown).
    pub fn checkpoint(&self) -> StoreResult<()> {
        self.journal.checkpoint()
    }

    /// Makes every change logged so far durable, and only that: what
    /// waits to be applied keeps waiting (a flush would apply it too).
    pub fn sync(&self) -> StoreResult<()> {
        self.journal.sync_log()
    }

    /// Transactions committed through the group commit so far.
    pub fn commit_rounds(&self) -> u64 {
        self.commits.rounds()
    }

    /// Runs one change through the group commit (see `group_commit`); a
    /// lazy volume change is logged at once instead, beside the rounds: in
    /// a round it would wait for the sync the durable changes beside it
    /// ask for. A volume change left pending (see `Journal::defer`) wakes
    /// the flusher, which applies it to redb in the background.
    fn write(&self, durable: bool, op: Op, limits: Limits) -> StoreResult<()> {
        let change = Change { op, limits };
        let result = if durable {
            self.commits.submit(change, true)
        } else {
            match self.journal.write_lazily(change) {
                Ok(result) => result,
                Err(change) => self.commits.submit(change, false),
            }
        };
        self.commits.left_pending();
        result
    }

    /// Runs store work that may wait for an fsync off the async thread
    /// (in place when the caller already is; see `offload`).
    pub async fn run<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> StoreResult<T> + Send + 'static,
    {
        let store = self.clone();
        crate::rt::offload::blocking(move || f(&store))
            .await
            .map_err(|e| StoreError::Worker(e.to_string()))?
    }

    /// Applies the changes still pending to redb, so that a read of an
    /// index sees them; the proof it hands out is what index reads take
    /// (`index`). A read of one record or a counter needs no settling (it
    /// looks at the overlay first).
    fn settle(&self) -> StoreResult<Settled> {
        self.journal.settle()
    }

    pub fn healthy(&self) -> StoreResult<()> {
        self.journal.running()?;
        let txn = self.db.begin_read()?;
        txn.open_table(COUNTERS)?;
        Ok(())
    }

    fn get<T: DeserializeOwned>(
        &self,
        def: TableDefinition<'static, &'static str, &'static [u8]>,
        table: &'static str,
        id: &str,
    ) -> StoreResult<Option<T>> {
        let decoded = {
            let txn = self.db.begin_read()?;
            let t = txn.open_table(def)?;
            let value = t.get(id)?;
            value.map(|v| decode(table, id, v.value())).transpose()
        };
        match decoded {
            Err(StoreError::Corrupt { .. }) => {
                self.quarantine(table, &[id.to_string()])?;
                Ok(None)
            }
            other => other,
        }
    }

    /// Moves undecodable records out of `table` (and a volume's entries out
    /// of the node index), logging and counting each.
    fn quarantine(&self, table: &'static str, ids: &[String]) -> StoreResult<()> {
        if ids.is_empty() {
            return Ok(());
        }
        let op = Op::Quarantine {
            table: table.to_string(),
            ids: ids.to_vec(),
        };
        self.write(true, op, Limits::default())
    }

    /// How many records are in quarantine.
    pub fn quarantined(&self) -> StoreResult<u64> {
        // Applying a pending change over an undecodable record moves it.
        let _settled = self.settle()?;
        let txn = self.db.begin_read()?;
        let n = txn.open_table(QUARANTINE)?.len()?;
        Ok(n)
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
        def: TableDefinition<'static, &'static str, &'static [u8]>,
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
        let mut corrupt = Vec::new();
        let mut next = None;
        for entry in range {
            let (k, v) = entry?;
            let item: T = match decode(table, k.value(), v.value()) {
                Ok(item) => item,
                Err(StoreError::Corrupt { .. }) => {
                    corrupt.push(k.value().to_string());
                    continue;
                }
                Err(e) => return Err(e),
            };
            if !keep(&item) {
                continue;
            }
            if items.len() == limit {
                next = last;
                break;
            }
            last = Some(k.value().to_string());
            items.push(item);
        }
        drop(t);
        drop(txn);
        self.quarantine(table, &corrupt)?;
        Ok(Page { items, next })
    }

    // ---- volumes ----

    /// Makes the next sync of the log fail, as a failing disk would
    /// (tests only).
    #[cfg(test)]
    pub fn fail_next_sync(&self) {
        self.journal.fail_next_sync();
    }

    pub fn volume(&self, id: &str) -> StoreResult<Option<Volume>> {
        if let Some(pending) = self.journal.overlay.volume(id) {
            return Ok(pending);
        }
        self.get(VOLUMES, "volumes", id)
    }

    pub fn volume_by_name(&self, name: &str) -> StoreResult<Option<Volume>> {
        match index::named(&self.db, &self.journal.overlay, name)? {
            index::Named::Pending(vol) => Ok(Some(*vol)),
            index::Named::Indexed(id) => self.volume(&id),
            index::Named::Absent => Ok(None),
        }
    }

    /// Inserts or replaces a volume record and keeps every index in step;
    /// durable when this returns.
    pub fn put_volume(&self, vol: &Volume) -> StoreResult<()> {
        self.put_volume_limited(vol, Limits::default())
    }

    /// Like `put_volume`, but commits nothing and answers `AttachLimit` or
    /// `CapacityExceeded` if the record would go past `limits` (see
    /// `Limits`).
    pub fn put_volume_limited(&self, vol: &Volume, limits: Limits) -> StoreResult<()> {
        self.put_shared(Arc::new(vol.clone()), true, limits)
    }

    /// Writes a record the caller hands over, within `limits`: durably (as
    /// `put_volume_limited`) or lazily (as `put_volume_lazily`).
    pub fn put_shared(&self, vol: Arc<Volume>, durable: bool, limits: Limits) -> StoreResult<()> {
        self.write(durable, Op::PutVolume(vol), limits)
    }

    /// Like `put_volume`, for a change that needs no sync of its own: a
    /// crash may lose it, and start-up derives it again from a durable
    /// witness (the mount table, the backend's data). It becomes durable
    /// with the next durable commit.
    pub fn put_volume_lazily(&self, vol: &Volume) -> StoreResult<()> {
        self.put_shared(Arc::new(vol.clone()), false, Limits::default())
    }

    pub fn remove_volume(&self, id: &str) -> StoreResult<()> {
        self.write(true, Op::RemoveVolume(id.to_string()), Limits::default())
    }

    /// Like `remove_volume`, lazily (see `put_volume_lazily`).
    pub fn remove_volume_lazily(&self, id: &str) -> StoreResult<()> {
        self.write(false, Op::RemoveVolume(id.to_string()), Limits::default())
    }

    pub fn list_volumes(&self, after: Option<&str>, limit: usize) -> StoreResult<Page<Volume>> {
        let _settled = self.settle()?;
        self.page(VOLUMES, "volumes", after, limit, |v: &Volume| {
            v.lifecycle == crate::domain::volume::Lifecycle::Ready
        })
    }

    /// Every volume record, off the async thread: those listings show,
    /// page by page, and those whose create or delete has not finished.
    pub async fn all_volumes(&self) -> StoreResult<Vec<Volume>> {
        let mut all = self.run(|s| s.unfinished_volumes()).await?;
        let mut after: Option<String> = None;
        loop {
            let from = after.take();
            let page = self
                .run(move |s| s.list_volumes(from.as_deref(), 1024))
                .await?;
            all.extend(page.items);
            match page.next {
                Some(next) => after = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// Volume records whose create or delete has not finished; the cost
    /// grows with their number only.
    pub fn unfinished_volumes(&self) -> StoreResult<Vec<Volume>> {
        let settled = self.settle()?;
        self.volumes_of(index::unfinished_ids(&self.db, &settled)?)
    }

    /// The records of `ids` that exist (an index may name one removed since).
    fn volumes_of(&self, ids: Vec<String>) -> StoreResult<Vec<Volume>> {
        let mut vols = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(v) = self.volume(&id)? {
                vols.push(v);
            }
        }
        Ok(vols)
    }

    /// Snapshot records whose create or delete has not finished.
    pub fn unfinished_snapshots(&self) -> StoreResult<Vec<Snapshot>> {
        Ok(self
            .page(SNAPSHOTS, "snapshots", None, usize::MAX, |s: &Snapshot| {
                s.lifecycle != crate::domain::volume::Lifecycle::Ready
            })?
            .items)
    }

    /// Volumes with ControllerPublish recorded on `node`.
    pub fn attached_count(&self, node: &str) -> StoreResult<u64> {
        self.journal
            .counter(&format!("{ATTACHED_PREFIX}{node}"), |c| {
                i128::from(c.attached_on(node))
            })
    }

    /// Every volume that has any state on `node` (for the node's restart
    /// reconciliation); cost grows with that node's volumes only.
    pub fn volumes_on_node(&self, node: &str) -> StoreResult<Vec<Volume>> {
        let settled = self.settle()?;
        self.volumes_of(index::ids_on_node(&self.db, &settled, node)?)
    }

    /// Bytes of every volume and snapshot (pending changes are of volumes
    /// only).
    pub fn allocated_bytes(&self) -> StoreResult<u64> {
        self.journal.counter(ALLOCATED, |c| c.allocated)
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
        self.write(
            true,
            Op::PutSnapshot(Box::new(snap.clone())),
            Limits::default(),
        )
    }

    pub fn remove_snapshot(&self, id: &str) -> StoreResult<()> {
        self.write(true, Op::RemoveSnapshot(id.to_string()), Limits::default())
    }

    pub fn list_snapshots(&self, after: Option<&str>, limit: usize) -> StoreResult<Page<Snapshot>> {
        self.page(SNAPSHOTS, "snapshots", after, limit, |s: &Snapshot| {
            s.lifecycle == crate::domain::volume::Lifecycle::Ready
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
        let (lo, hi) = index::prefix_bounds(source);
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
            // An undecodable snapshot is quarantined by the next direct read.
            let Ok(snap) = decode::<Snapshot>("snapshots", id, raw.value()) else {
                continue;
            };
            if snap.lifecycle != crate::domain::volume::Lifecycle::Ready {
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

    /// Group snapshot records whose create or delete has not finished.
    pub fn unfinished_groups(&self) -> StoreResult<Vec<GroupSnapshot>> {
        Ok(self
            .page(
                GROUPS,
                "group_snapshots",
                None,
                usize::MAX,
                |g: &GroupSnapshot| g.lifecycle != crate::domain::volume::Lifecycle::Ready,
            )?
            .items)
    }

    pub fn put_group(&self, group: &GroupSnapshot) -> StoreResult<()> {
        self.write(
            true,
            Op::PutGroup(Box::new(group.clone())),
            Limits::default(),
        )
    }

    pub fn remove_group(&self, id: &str) -> StoreResult<()> {
        self.write(true, Op::RemoveGroup(id.to_string()), Limits::default())
    }
}

/// Refuses a store whose format is newer than [`STORE_FORMAT`].
fn check_format(dir: &Path, txn: &redb::ReadTransaction) -> StoreResult<()> {
    let found = match txn.open_table(COUNTERS) {
        Ok(t) => t.get(STORE_FORMAT_KEY)?.map_or(0, |v| v.value()),
        Err(redb::TableError::TableDoesNotExist(_)) => 0,
        Err(e) => return Err(e.into()),
    };
    if found > STORE_FORMAT {
        return Err(StoreError::NewerFormat {
            dir: dir.display().to_string(),
            found,
            known: STORE_FORMAT,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::volume::sample as vol;

    #[test]
    fn a_store_of_a_newer_format_is_refused_and_left_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.put_volume(&vol("a", "name-a")).unwrap();
        store.checkpoint().unwrap();
        drop(store);
        {
            let db = Database::create(dir.path().join("state.redb")).unwrap();
            let txn = db.begin_write().unwrap();
            assert_eq!(counter(&txn, STORE_FORMAT_KEY).unwrap(), STORE_FORMAT);
            txn.open_table(COUNTERS)
                .unwrap()
                .insert(STORE_FORMAT_KEY, STORE_FORMAT + 1)
                .unwrap();
            txn.commit().unwrap();
        }
        let files = |dir: &Path| -> Vec<(String, Vec<u8>)> {
            let mut v: Vec<_> = std::fs::read_dir(dir)
                .unwrap()
                .flatten()
                .map(|e| {
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        std::fs::read(e.path()).unwrap(),
                    )
                })
                .collect();
            v.sort();
            v
        };
        let before = files(dir.path());
        let refused = Store::open(dir.path())
            .err()
            .expect("a newer format must be refused");
        let msg = refused.to_string();
        assert!(
            msg.contains(&format!("store format {}", STORE_FORMAT + 1))
                && msg.contains(&format!("the format {STORE_FORMAT} this build"))
                && msg.contains(&dir.path().display().to_string()),
            "{msg}"
        );
        assert!(
            before == files(dir.path()),
            "the refused store was written to"
        );
    }

    #[test]
    fn a_store_of_a_newer_format_left_by_a_crash_is_refused_too() {
        // A copy of the file taken while a newer build had it open is what
        // a crash leaves: not closed cleanly, so not readable before redb
        // repairs it.
        let open = tempfile::tempdir().unwrap();
        let crashed = tempfile::tempdir().unwrap();
        drop(Store::open(open.path()).unwrap());
        let db = Database::create(open.path().join("state.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(COUNTERS)
            .unwrap()
            .insert(STORE_FORMAT_KEY, STORE_FORMAT + 1)
            .unwrap();
        txn.commit().unwrap();
        std::fs::copy(
            open.path().join("state.redb"),
            crashed.path().join("state.redb"),
        )
        .unwrap();
        drop(db);
        assert!(
            redb::ReadOnlyDatabase::open(crashed.path().join("state.redb")).is_err(),
            "the copy must stand for a file that needs repair"
        );
        let refused = Store::open(crashed.path())
            .err()
            .expect("a newer format must be refused");
        assert!(
            refused
                .to_string()
                .contains(&format!("store format {}", STORE_FORMAT + 1)),
            "{refused}"
        );
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

    #[test]
    fn a_discarded_store_opens_empty_and_a_missing_one_is_no_error() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store.put_volume(&vol("v1", "n1")).unwrap();
            store.checkpoint().unwrap();
        }
        Store::discard(dir.path()).unwrap();
        assert!(!dir.path().join("state.redb").exists());
        assert!(!dir.path().join("state.wal").exists());
        let store = Store::open(dir.path()).unwrap();
        assert!(store.volume("v1").unwrap().is_none());
        drop(store);
        Store::discard(dir.path()).unwrap();
        Store::discard(&dir.path().join("nowhere")).unwrap();
    }

    #[test]
    fn a_store_that_cannot_be_removed_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        // A directory where the database file would be: not removable as
        // a file, and said so instead of opening a stale store.
        std::fs::create_dir(dir.path().join("state.redb")).unwrap();
        assert!(Store::discard(dir.path()).is_err());
    }
}
