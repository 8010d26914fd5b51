//! Durable driver state in an embedded transactional store (redb): volume,
//! snapshot and group-snapshot records plus the indexes that keep every call
//! O(log n) in the number of volumes. Each `put_*` / `remove_*` is durable
//! when it returns: the change is written to the write-ahead log (`wal`),
//! which one `fdatasync` makes durable and start-up replays over redb's last
//! checkpoint. A volume change waits there for a redb transaction that takes
//! many (the flusher's, in the background), and until then readers find it
//! in the `overlay`; other changes are applied to redb, without a sync, with
//! their round. A lazy change (`*_lazily`) waits for no sync either.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use redb::{Database, ReadableDatabase, ReadableTable, ReadableTableMetadata, TableDefinition};
use serde::{de::DeserializeOwned, Serialize};

use crate::domain::volume::{GroupSnapshot, Snapshot, Volume};
use crate::store::group_commit::{GroupCommit, Round};
use crate::store::overlay::{Counts, Delta, Overlay, Settled};
use crate::store::wal::Wal;

use super::error::{StoreError, StoreResult};
use super::index;

const VOLUMES: TableDefinition<&str, &[u8]> = TableDefinition::new("volumes");
const SNAPSHOTS: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshots");
const SNAPSHOT_NAMES: TableDefinition<&str, &str> = TableDefinition::new("snapshot_names");
/// `source volume id \0 snapshot id` → (), for ListSnapshots by source.
const SNAPSHOTS_BY_SOURCE: TableDefinition<&str, ()> = TableDefinition::new("snapshots_by_source");
const GROUPS: TableDefinition<&str, &[u8]> = TableDefinition::new("group_snapshots");
const GROUP_NAMES: TableDefinition<&str, &str> = TableDefinition::new("group_snapshot_names");
const COUNTERS: TableDefinition<&str, u64> = TableDefinition::new("counters");
/// The format of what this build writes to a state directory (the store
/// and its log), kept under [`STORE_FORMAT_KEY`] in COUNTERS. Raise it with
/// any change an older build would misread; a build that meets a newer
/// one refuses to start before it writes anything. Stores made before the
/// key existed are format 1.
pub const STORE_FORMAT: u64 = 1;
const STORE_FORMAT_KEY: &str = "store_format";
/// Set in COUNTERS once the unfinished index covers every record (stores
/// written before the index existed are indexed once, at open).
const UNFINISHED_INDEXED: &str = "index/unfinished_volumes";
/// `table/key` → the raw bytes of a record that could not be decoded. It is
/// moved here, out of the way, so one bad record never stops the driver.
const QUARANTINE: TableDefinition<&str, &[u8]> = TableDefinition::new("quarantine");
const ALLOCATED: &str = "allocated_bytes";
const CACHE_BYTES: usize = 4 << 20;
const ATTACHED_PREFIX: &str = "attached/";

/// What a volume write must stay within. Checked where the change is
/// logged, one writer at a time, against what every earlier change left:
/// two calls can never both take the last slot or the last bytes. Not
/// checked at replay (the change was within them then).
#[derive(Debug, Clone, Default)]
pub struct Limits {
    /// At most this many attachments on this node.
    pub attach: Option<(String, u64)>,
    /// At most this many bytes allocated to volumes and snapshots, for a
    /// change that grows a volume.
    pub capacity: Option<u64>,
}

impl Limits {
    /// Refuses `new` replacing `old` when it attaches to the limited node
    /// past its maximum (`attached` reads that node's count) or grows past
    /// the capacity (`allocated` reads the bytes allocated).
    fn check(
        &self,
        old: Option<&Volume>,
        new: Option<&Volume>,
        attached: impl FnOnce(&str) -> StoreResult<u64>,
        allocated: impl FnOnce() -> StoreResult<u64>,
    ) -> StoreResult<()> {
        if let Some((node, max)) = &self.attach {
            let on = |v: Option<&Volume>| v.is_some_and(|v| v.attached_to(node));
            if on(new) && !on(old) {
                let attached = attached(node)?;
                if attached >= *max {
                    return Err(StoreError::AttachLimit {
                        node: node.clone(),
                        attached,
                        max: *max,
                    });
                }
            }
        }
        if let Some(capacity) = self.capacity {
            let bytes = |v: Option<&Volume>| v.map_or(0, |v| v.capacity_bytes);
            let needed = bytes(new).saturating_sub(bytes(old));
            if needed > 0 {
                let allocated = allocated()?;
                if allocated.saturating_add(needed) > capacity {
                    return Err(StoreError::CapacityExceeded {
                        needed,
                        allocated,
                        capacity,
                    });
                }
            }
        }
        Ok(())
    }
}

/// One page of a listing and where the next one starts.
#[derive(Debug)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<String>,
}

#[derive(Clone)]
pub struct Store {
    db: Arc<Database>,
    commits: Arc<GroupCommit<Change>>,
    journal: Arc<Journal>,
}

/// One logged change: what replay applies again after a crash.
#[derive(Serialize, serde::Deserialize)]
enum Op {
    /// Shared with the overlay and the round that plans it: a record is
    /// copied once per write, where the caller hands it over.
    PutVolume(Arc<Volume>),
    RemoveVolume(String),
    PutSnapshot(Box<Snapshot>),
    RemoveSnapshot(String),
    PutGroup(Box<GroupSnapshot>),
    RemoveGroup(String),
    /// Moves undecodable records of `table` aside.
    Quarantine {
        table: String,
        ids: Vec<String>,
    },
}

impl Op {
    /// The volume a change writes (`None`: removes), for the overlay.
    fn pending_volume(&self) -> Option<(&str, Option<&Arc<Volume>>)> {
        match self {
            Op::PutVolume(vol) => Some((vol.id.as_str(), Some(vol))),
            Op::RemoveVolume(id) => Some((id.as_str(), None)),
            _ => None,
        }
    }
}

/// A change as submitted: the op, and the limits it must respect.
struct Change {
    op: Op,
    limits: Limits,
}

/// Bytes of write-ahead log between checkpoints: a few hundred full
/// lifecycles' worth of records, and zero-filled once per store.
const WAL_BYTES: u64 = 2 << 20;
/// Rounds between checkpoints at most: redb reclaims the pages that
/// unsynced commits free only at a durable commit, so its file would grow
/// with their number.
const CHECKPOINT_ROUNDS: u64 = 1024;
/// In COUNTERS: the last log record the durable redb state includes.
const WAL_CHECKPOINT: &str = "wal/checkpoint";

/// The leader's side of the group commit: logs a round and syncs the log.
/// Volume changes wait in the log (and the overlay) for a redb transaction
/// that takes many at once; other changes are applied to redb with the
/// round. Every so often redb commits durably instead (a checkpoint) and
/// the log starts again.
struct Journal {
    db: Arc<Database>,
    /// Held by whoever opens a redb write transaction (a round, a settle,
    /// a checkpoint), before `log`: a round lets go of `log` during its
    /// sync but not of its transaction.
    writer: Mutex<()>,
    log: Mutex<Log>,
    /// The log's file, synced without `log` held: lazy writers append
    /// meanwhile instead of waiting out the fdatasync.
    syncer: std::fs::File,
    /// Runs once during the next sync, with `log` let go; its error
    /// stands for the sync's, as a failing disk's would.
    #[cfg(test)]
    during_sync: Mutex<Option<SyncHook>>,
    /// Readers' view of `Log::deferred`.
    overlay: Overlay,
}

/// What a test runs during a sync, in the sync's stead when it fails.
#[cfg(test)]
type SyncHook = Box<dyn FnOnce() -> std::io::Result<()> + Send>;

/// Volume changes the log holds and redb does not yet, at most: the next
/// round beyond it applies them all (the flusher usually does before).
const MAX_DEFERRED: usize = 256;

/// A logged change waiting to be applied to redb, with a volume record's
/// encoding so that it is not encoded twice, and what it adds to the
/// counters.
struct Deferred {
    op: Op,
    record: Option<Vec<u8>>,
    delta: Delta,
}

struct Log {
    wal: Wal,
    rounds_since_checkpoint: u64,
    /// A log write or sync failed: what reached the disk is unknown, so
    /// nothing more is accepted until a restart replays the log.
    failed: Option<String>,
    /// Volume changes logged but not applied to redb, in log order: the
    /// next transaction applies them first (see `overlay`).
    deferred: Vec<Deferred>,
    /// The last log record known to be durable.
    synced_upto: u64,
    /// Makes the next application of pending changes fail, as a redb
    /// error would.
    #[cfg(test)]
    refuse_apply: bool,
}

fn decode<T: DeserializeOwned>(table: &'static str, key: &str, bytes: &[u8]) -> StoreResult<T> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt {
        table,
        key: key.to_string(),
        source,
    })
}

fn encode<T: Serialize>(value: &T) -> StoreResult<Vec<u8>> {
    thread_local! {
        /// Records are written here and copied out at their size: written
        /// straight into a new Vec, a record of a few hundred bytes had it
        /// grown (and copied) three or four times.
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        let written = serde_json::to_writer(&mut *buf, value).map_err(StoreError::Encode);
        let out = written.map(|()| buf.to_vec());
        if buf.capacity() > SCRATCH_KEPT {
            *buf = Vec::new();
        }
        out
    })
}

/// The largest scratch buffer a thread keeps between encodings.
const SCRATCH_KEPT: usize = 64 << 10;

fn pair(a: &str, b: &str) -> String {
    format!("{a}\0{b}")
}

impl Store {
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
        let syncer = wal
            .syncer()
            .map_err(|e| StoreError::Worker(e.to_string()))?;
        let journal = Arc::new(Journal {
            db: db.clone(),
            writer: Mutex::new(()),
            log: Mutex::new(Log {
                synced_upto: wal.next_lsn() - 1,
                wal,
                rounds_since_checkpoint: 0,
                failed: None,
                deferred: Vec::new(),
                #[cfg(test)]
                refuse_apply: false,
            }),
            syncer,
            #[cfg(test)]
            during_sync: Mutex::new(None),
            overlay: Overlay::default(),
        });
        let commits = Arc::new(GroupCommit::new(Box::new(JournalRound(journal.clone()))));
        let weak = Arc::downgrade(&journal);
        commits.start_flusher(Box::new(move || {
            weak.upgrade().is_some_and(|j| {
                let log = j.lock();
                log.unsynced() || !log.deferred.is_empty()
            })
        }));
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
        if let Some(settled) = self.journal.overlay.settled() {
            return Ok(settled);
        }
        let _writer = self.journal.writer();
        let mut log = self.journal.lock();
        if let Some(failed) = &log.failed {
            return Err(StoreError::Worker(failed.clone()));
        }
        self.journal.settle_in(&mut log)?;
        // Nothing is logged while `log` is held: all was applied.
        self.journal
            .overlay
            .settled()
            .ok_or_else(|| StoreError::Worker("changes still pending after settling".into()))
    }

    pub fn healthy(&self) -> StoreResult<()> {
        if let Some(failed) = &self.journal.lock().failed {
            return Err(StoreError::Worker(failed.clone()));
        }
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
        *self
            .journal
            .during_sync
            .lock()
            .unwrap_or_else(|p| p.into_inner()) =
            Some(Box::new(|| Err(std::io::Error::other("injected EIO"))));
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

/// Applies one op inside a write transaction (first time or at replay).
fn apply(txn: &redb::WriteTransaction, op: &Op, limits: &Limits) -> StoreResult<()> {
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

/// Opens the log and applies, in `txn`, what it holds past redb's last
/// checkpoint; `txn` then records the new checkpoint.
fn replay(txn: &redb::WriteTransaction, dir: &Path) -> StoreResult<(Wal, usize)> {
    let path = dir.join("state.wal");
    let after = counter(txn, WAL_CHECKPOINT)?;
    let (wal, records) = Wal::open(&path, WAL_BYTES, after)
        .map_err(|e| StoreError::Worker(format!("write-ahead log {}: {e}", path.display())))?;
    let replayed = records.len();
    for record in records {
        let ops: Vec<Op> = serde_json::from_slice(&record.payload).map_err(|e| {
            StoreError::Worker(format!(
                "write-ahead log {} record {} cannot be read ({e}); it was written by another \
                 version of csi-relay: start that version once to checkpoint it",
                path.display(),
                record.lsn
            ))
        })?;
        for op in &ops {
            apply(txn, op, &Limits::default())?;
        }
    }
    if replayed > 0 {
        tracing::info!(
            records = replayed,
            "store changes replayed from the write-ahead log"
        );
    }
    let last = wal.next_lsn() - 1;
    if last != after {
        txn.open_table(COUNTERS)?.insert(WAL_CHECKPOINT, last)?;
    }
    Ok((wal, replayed))
}

struct JournalRound(Arc<Journal>);

impl Round<Change> for JournalRound {
    fn run(&self, changes: Vec<Option<Change>>, durable: bool) -> Vec<StoreResult<()>> {
        self.0.run(changes, durable)
    }
}

fn all_failed(n: usize, msg: &str) -> Vec<StoreResult<()>> {
    (0..n)
        .map(|_| Err(StoreError::Worker(msg.to_string())))
        .collect()
}

impl Journal {
    fn lock(&self) -> MutexGuard<'_, Log> {
        // The log's fields change only after the write they describe.
        self.log.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn writer(&self) -> MutexGuard<'_, ()> {
        self.writer.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Syncs the log up to its last record with `log` let go meanwhile
    /// (lazy writes append behind the records being synced), counts it as
    /// `cause`, and takes `log` again; when the sync fails, the store stops
    /// and this gives the failed results of a round of `n`. The caller
    /// holds `writer`: no checkpoint restarts the log under the sync.
    fn sync<'a>(
        &'a self,
        log: MutexGuard<'a, Log>,
        n: usize,
        cause: &'static str,
    ) -> Result<MutexGuard<'a, Log>, Vec<StoreResult<()>>> {
        let upto = log.wal.next_lsn() - 1;
        drop(log);
        #[cfg(test)]
        let injected = match self.during_sync.lock().ok().and_then(|mut f| f.take()) {
            Some(f) => f(),
            None => Ok(()),
        };
        #[cfg(not(test))]
        let injected = Ok(());
        let synced = injected.and_then(|()| self.syncer.sync_data());
        let mut log = self.lock();
        if let Err(e) = synced {
            return Err(log.fail(n, &e));
        }
        log.synced_upto = log.synced_upto.max(upto);
        crate::rt::metrics::store_sync(cause);
        Ok(log)
    }

    /// Syncs what is logged, outside the rounds (see `Store::sync`).
    fn sync_log(&self) -> StoreResult<()> {
        let _writer = self.writer();
        let log = self.lock();
        if let Some(failed) = &log.failed {
            return Err(StoreError::Worker(failed.clone()));
        }
        if !log.unsynced() {
            return Ok(());
        }
        match self.sync(log, 1, "sync") {
            Ok(_) => Ok(()),
            Err(failed) => failed
                .into_iter()
                .next()
                .unwrap_or_else(|| Err(StoreError::Worker("log sync failed".into()))),
        }
    }

    /// A counter of volume records as the pending changes leave it, without
    /// a transaction to apply them (CreateVolume, ControllerPublish and the
    /// attach limit read one each): redb's value of `key` plus what
    /// `pending` says they add to it. No commit of pending changes comes in
    /// between (see `Overlay::with_counts`).
    fn counter(&self, key: &str, pending: impl FnOnce(&Counts) -> i128) -> StoreResult<u64> {
        self.overlay.with_counts(|counts| {
            let txn = self.db.begin_read()?;
            let held = txn.open_table(COUNTERS)?.get(key)?.map_or(0, |v| v.value());
            let value = i128::from(held) + pending(counts);
            Ok(u64::try_from(value.max(0)).unwrap_or(u64::MAX))
        })
    }

    fn run(&self, changes: Vec<Option<Change>>, durable: bool) -> Vec<StoreResult<()>> {
        let n = changes.len();
        let _writer = self.writer();
        let mut log = self.lock();
        if let Some(failed) = &log.failed {
            return all_failed(n, failed);
        }
        if changes.iter().all(Option::is_none) {
            // Only a sync of what lazy writes left unsynced (the flusher),
            // which may as well apply what is pending.
            if durable && log.unsynced() {
                log = match self.sync(log, n, "flush") {
                    Ok(log) => log,
                    Err(failed) => return failed,
                };
            }
            if let Err(e) = self.settle_in(&mut log) {
                return all_failed(n, &e.to_string());
            }
            return (0..n).map(|_| Ok(())).collect();
        }
        let changes = match self.defer(&mut log, changes) {
            Ok(results) => {
                if durable && log.failed.is_none() && log.unsynced() {
                    if let Err(failed) = self.sync(log, n, "commit") {
                        return failed;
                    }
                }
                return results;
            }
            Err(changes) => changes,
        };
        let mut txn = match self.db.begin_write() {
            Ok(t) => t,
            Err(e) => return all_failed(n, &e.to_string()),
        };
        // What is pending comes first, as in the log.
        if let Err(failed) = apply_pending(&txn, &mut log) {
            let _ = txn.abort();
            return all_failed(n, &failed);
        }
        // Lazy writes may add to them while the log is synced.
        let pending = log.deferred.len();
        let mut results = Vec::with_capacity(n);
        // The round's ops as a JSON list, as replay reads it.
        let mut payload = vec![b'['];
        let mut logged = 0;
        for change in changes {
            let Some(Change { op, limits }) = change else {
                results.push(Ok(()));
                continue;
            };
            match apply_and_encode(&txn, &op, &limits) {
                // A refusal is decided before the change writes anything.
                Err(refused) if refused.is_refusal() => results.push(Err(refused)),
                Err(e) => {
                    // Anything else may have left a partial write: nothing
                    // of this round is committed.
                    let _ = txn.abort();
                    return all_failed(n, &format!("transaction abandoned: {e}"));
                }
                Ok(encoded) => {
                    results.push(Ok(()));
                    if logged > 0 {
                        payload.push(b',');
                    }
                    encoded.log_into(&mut payload);
                    logged += 1;
                }
            }
        }
        if logged == 0 {
            if log.deferred.is_empty() {
                let _ = txn.abort();
                return results;
            }
            // Every change was refused; what was pending is applied still.
            return match self.commit_pending(txn, &mut log, pending) {
                Ok(()) => results,
                Err(e) => all_failed(n, &log.fail_applying(&e)),
            };
        }
        payload.push(b']');
        log.rounds_since_checkpoint += 1;
        if !log.wal.fits(payload.len()) || log.rounds_since_checkpoint >= CHECKPOINT_ROUNDS {
            // This round is the checkpoint: redb commits it durably and
            // the log, covered up to here, starts again.
            return match self.commit_applied(&mut log, pending, |log| checkpoint_in(txn, log)) {
                Ok(()) => results,
                Err(e) => all_failed(n, &format!("checkpoint failed: {e}")),
            };
        }
        if let Err(e) = log.wal.append(&payload) {
            let _ = txn.abort();
            return log.fail(n, &e);
        }
        if durable {
            log = match self.sync(log, n, "commit") {
                Ok(log) => log,
                Err(failed) => {
                    let _ = txn.abort();
                    return failed;
                }
            };
        }
        let committed = self.commit_applied(&mut log, pending, |_| {
            txn.set_durability(redb::Durability::None)
                .map_err(|e| StoreError::Worker(e.to_string()))?;
            Ok(txn.commit()?)
        });
        if let Err(e) = committed {
            // The log holds the round: it is applied at the next start.
            log.failed = Some(format!(
                "store commit failed after its log record was written ({e}); restart csi-relay to replay the log"
            ));
            return all_failed(n, &format!("commit failed: {e}"));
        }
        results
    }

    /// Logs one lazy change at once (see `defer`), or hands it back for a
    /// round.
    fn write_lazily(&self, change: Change) -> Result<StoreResult<()>, Change> {
        let mut log = self.lock();
        if let Some(failed) = &log.failed {
            return Ok(Err(StoreError::Worker(failed.clone())));
        }
        match self.defer(&mut log, vec![Some(change)]) {
            Ok(mut results) => Ok(results
                .pop()
                .unwrap_or_else(|| Err(StoreError::Worker("lazy write lost its result".into())))),
            Err(mut changes) => match changes.pop().flatten() {
                Some(change) => Err(change),
                None => Ok(Err(StoreError::Worker("lazy write lost its change".into()))),
            },
        }
    }

    /// Logs a round of volume changes without applying them to redb: they
    /// wait in `Log::deferred` (readers see them in the overlay) for a later
    /// transaction, which takes many at once. An attach limit is checked
    /// here, against redb's count plus what pending changes add: nothing
    /// commits to redb while `log` is held. Hands the changes back when
    /// they must take the ordinary path: anything but volume records, more
    /// pending than `MAX_DEFERRED`, or a log too full for them.
    fn defer(
        &self,
        log: &mut Log,
        changes: Vec<Option<Change>>,
    ) -> Result<Vec<StoreResult<()>>, Vec<Option<Change>>> {
        let n = changes.len();
        let deferrable =
            |c: &Option<Change>| c.as_ref().is_some_and(|c| c.op.pending_volume().is_some());
        if log.deferred.len() + n > MAX_DEFERRED || !changes.iter().all(deferrable) {
            return Err(changes);
        }
        let Ok(planned) = self.plan(&changes) else {
            // The ordinary path reports it.
            return Err(changes);
        };
        let size: usize = planned.iter().flatten().map(|e| e.0.logged_len() + 1).sum();
        let mut payload = Vec::with_capacity(size + 2);
        payload.push(b'[');
        for e in planned.iter().flatten() {
            if payload.len() > 1 {
                payload.push(b',');
            }
            e.0.log_into(&mut payload);
        }
        payload.push(b']');
        let logged = planned.iter().any(Result::is_ok);
        if logged && !log.wal.fits(payload.len()) {
            return Err(changes);
        }
        if logged {
            if let Err(e) = log.wal.append(&payload) {
                return Ok(log.fail(n, &e));
            }
        }
        let mut results = Vec::with_capacity(n);
        for (change, plan) in changes.into_iter().flatten().zip(planned) {
            let (encoded, delta) = match plan {
                Ok(plan) => plan,
                Err(refused) => {
                    results.push(Err(refused));
                    continue;
                }
            };
            if let Some((id, vol)) = change.op.pending_volume() {
                self.overlay.add(id, vol, &delta);
            }
            log.deferred.push(Deferred {
                op: change.op,
                record: encoded.into_record(),
                delta,
            });
            results.push(Ok(()));
        }
        Ok(results)
    }

    /// For each change of a round (all volume changes), in order: its
    /// encoding and what it adds to the counters, or its refusal by an
    /// attach limit. `Err` when any cannot be encoded or read against.
    fn plan(&self, changes: &[Option<Change>]) -> StoreResult<Vec<Planned>> {
        // Records and counts as the round's earlier changes leave them.
        let mut round: std::collections::HashMap<&str, Option<&Arc<Volume>>> = Default::default();
        let mut round_counts = Counts::default();
        let mut redb: Option<redb::ReadTransaction> = None;
        let mut planned = Vec::with_capacity(changes.len());
        for change in changes.iter().flatten() {
            let Some((id, new)) = change.op.pending_volume() else {
                return Err(StoreError::Worker("not a volume change".into()));
            };
            let old: Option<Arc<Volume>> = match round.get(id) {
                Some(v) => v.cloned(),
                None => match self.overlay.shared(id) {
                    Some(v) => v,
                    None => {
                        let txn = match &redb {
                            Some(t) => t,
                            None => redb.insert(self.db.begin_read()?),
                        };
                        let raw = txn.open_table(VOLUMES)?.get(id)?;
                        // An undecodable record is quarantined when the
                        // change is applied, and counts as none then.
                        raw.and_then(|raw| decode::<Volume>("volumes", id, raw.value()).ok())
                            .map(Arc::new)
                    }
                },
            };
            let within = change.limits.check(
                old.as_deref(),
                new.map(|v| &**v),
                |node| {
                    self.counter(&format!("{ATTACHED_PREFIX}{node}"), |c| {
                        i128::from(c.attached_on(node) + round_counts.attached_on(node))
                    })
                },
                || self.counter(ALLOCATED, |c| c.allocated + round_counts.allocated),
            );
            match within {
                Err(refused) if refused.is_refusal() => {
                    planned.push(Err(refused));
                    continue;
                }
                other => other?,
            }
            let delta = Delta::between(old.as_deref(), new.map(|v| &**v));
            round_counts.add(&delta);
            round.insert(id, new);
            planned.push(Ok((encode_op(&change.op)?, delta)));
        }
        Ok(planned)
    }

    /// Applies what is pending to redb, without a sync (the log already
    /// holds it).
    fn settle_in(&self, log: &mut Log) -> StoreResult<()> {
        if log.deferred.is_empty() {
            return Ok(());
        }
        let txn = self.db.begin_write()?;
        if let Err(failed) = apply_pending(&txn, log) {
            let _ = txn.abort();
            return Err(StoreError::Worker(failed));
        }
        let pending = log.deferred.len();
        self.commit_pending(txn, log, pending)
            .map_err(|e| StoreError::Worker(log.fail_applying(&e)))
    }

    /// Commits, without a sync, a transaction that applied the pending
    /// changes and nothing the log does not already hold.
    fn commit_pending(
        &self,
        mut txn: redb::WriteTransaction,
        log: &mut Log,
        pending: usize,
    ) -> StoreResult<()> {
        self.commit_applied(log, pending, |log| {
            log.rounds_since_checkpoint += 1;
            txn.set_durability(redb::Durability::None)
                .map_err(|e| StoreError::Worker(e.to_string()))?;
            Ok(txn.commit()?)
        })
    }

    /// Commits a transaction that applied the first `count` pending changes
    /// (`commit`), and forgets them once it succeeded; later ones (logged
    /// during the round's sync) stay pending.
    fn commit_applied<T>(
        &self,
        log: &mut Log,
        count: usize,
        commit: impl FnOnce(&mut Log) -> StoreResult<T>,
    ) -> StoreResult<T> {
        let mut deferred = std::mem::take(&mut log.deferred);
        let count = count.min(deferred.len());
        let (done, rest) = deferred.split_at(count);
        let committed = self.overlay.retire(
            || commit(log),
            done.iter().map(|d| &d.delta),
            rest.iter().filter_map(|d| d.op.pending_volume()),
        );
        if committed.is_ok() {
            deferred.drain(..count);
        }
        log.deferred = deferred;
        committed
    }

    /// A durable redb commit that covers every log record so far.
    fn checkpoint(&self) -> StoreResult<()> {
        let _writer = self.writer();
        let mut log = self.lock();
        if let Some(failed) = &log.failed {
            return Err(StoreError::Worker(failed.clone()));
        }
        let txn = self.db.begin_write()?;
        if let Err(failed) = apply_pending(&txn, &mut log) {
            let _ = txn.abort();
            return Err(StoreError::Worker(failed));
        }
        let pending = log.deferred.len();
        self.commit_applied(&mut log, pending, |log| checkpoint_in(txn, log))
    }
}

/// Applies the pending changes in `txn`: of each volume, every removal and
/// the last change. What they leave (record, indexes, counters) is what
/// all of them in log order leave, since each write compares with what
/// redb holds and a removal clears it; and a volume's lifecycle writes its
/// record a dozen times before a transaction comes.
/// When they cannot be applied, the store stops (`Log::fail_applying`) and
/// this says why.
fn apply_pending(txn: &redb::WriteTransaction, log: &mut Log) -> Result<(), String> {
    #[cfg(test)]
    if log.refuse_apply && !log.deferred.is_empty() {
        return Err(log.fail_applying(&StoreError::Worker("injected".into())));
    }
    let applied = {
        let mut last = std::collections::HashMap::with_capacity(log.deferred.len());
        for (i, d) in log.deferred.iter().enumerate() {
            last.insert(d.op.pending_volume().map(|(id, _)| id), i);
        }
        log.deferred
            .iter()
            .enumerate()
            .filter(|(i, d)| {
                let id = d.op.pending_volume().map(|(id, _)| id);
                // Only volume changes wait here; anything else is applied.
                id.is_none() || matches!(d.op, Op::RemoveVolume(_)) || last.get(&id) == Some(i)
            })
            .try_for_each(|(_, d)| {
                apply_encoded(txn, &d.op, d.record.as_deref(), &Limits::default())
            })
    };
    applied.map_err(|e| log.fail_applying(&e))
}

/// Commits `txn` durably, naming the last log record it includes, then
/// lets the log start again from its beginning.
fn checkpoint_in(txn: redb::WriteTransaction, log: &mut Log) -> StoreResult<()> {
    let last = log.wal.next_lsn() - 1;
    txn.open_table(COUNTERS)?.insert(WAL_CHECKPOINT, last)?;
    txn.commit()?;
    crate::rt::metrics::store_sync("checkpoint");
    log.wal.reset();
    log.synced_upto = last;
    log.rounds_since_checkpoint = 0;
    Ok(())
}

impl Log {
    /// The log holds records written since its last sync.
    fn unsynced(&self) -> bool {
        self.wal.next_lsn() - 1 > self.synced_upto
    }

    /// Pending changes the log holds could not be applied to redb: this
    /// process cannot go on from a state it cannot build; a restart
    /// replays the log.
    fn fail_applying(&mut self, e: &StoreError) -> String {
        let msg = format!(
            "logged store changes cannot be applied ({e}); csi-relay accepts no change until \
             it is restarted and replays the log"
        );
        tracing::error!(error = %e, "pending store changes cannot be applied");
        self.failed = Some(msg.clone());
        msg
    }

    fn fail(&mut self, n: usize, e: &std::io::Error) -> Vec<StoreResult<()>> {
        let msg = format!(
            "the store's write-ahead log cannot be written or synced ({e}); csi-relay accepts no \
             change until it is restarted and replays the log"
        );
        tracing::error!(error = %e, "write-ahead log failed");
        self.failed = Some(msg.clone());
        all_failed(n, &msg)
    }
}

/// A volume change of a round: its encoding and what it adds to the
/// counters, or its refusal.
type Planned = StoreResult<(Encoded, Delta)>;

/// An op encoded once: a volume record as its table holds it (the log
/// wraps it as serde writes the op, straight into the round's payload), or
/// any other op as the log holds it.
enum Encoded {
    Volume(Vec<u8>),
    Other(Vec<u8>),
}

/// What serde writes before the record of an `Op::PutVolume` (and `}` after).
const PUT_VOLUME_OPEN: &[u8] = br#"{"PutVolume":"#;

impl Encoded {
    /// Bytes `log_into` appends.
    fn logged_len(&self) -> usize {
        match self {
            Encoded::Volume(record) => PUT_VOLUME_OPEN.len() + record.len() + 1,
            Encoded::Other(logged) => logged.len(),
        }
    }

    /// Appends the op as the log holds it.
    fn log_into(&self, out: &mut Vec<u8>) {
        match self {
            Encoded::Volume(record) => {
                out.extend_from_slice(PUT_VOLUME_OPEN);
                out.extend_from_slice(record);
                out.push(b'}');
            }
            Encoded::Other(logged) => out.extend_from_slice(logged),
        }
    }

    /// A volume record's encoding, for its table.
    fn record(&self) -> Option<&[u8]> {
        match self {
            Encoded::Volume(record) => Some(record),
            Encoded::Other(_) => None,
        }
    }

    fn into_record(self) -> Option<Vec<u8>> {
        match self {
            Encoded::Volume(record) => Some(record),
            Encoded::Other(_) => None,
        }
    }
}

/// Encodes `op` for the log and, a volume record, for its table: once.
fn encode_op(op: &Op) -> StoreResult<Encoded> {
    match op {
        Op::PutVolume(vol) => Ok(Encoded::Volume(encode(vol)?)),
        _ => Ok(Encoded::Other(encode(op)?)),
    }
}

/// Applies `op`, using a volume record's encoding when there is one.
fn apply_encoded(
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
fn apply_and_encode(
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
fn index_unfinished(txn: &redb::WriteTransaction) -> StoreResult<()> {
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

fn counter(txn: &redb::WriteTransaction, key: &str) -> StoreResult<u64> {
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

    fn attach_limit(node: &str, max: u64) -> Limits {
        Limits {
            attach: Some((node.to_string(), max)),
            capacity: None,
        }
    }

    fn capacity(bytes: u64) -> Limits {
        Limits {
            attach: None,
            capacity: Some(bytes),
        }
    }

    // Creates of different names run at once (the per-name locks do not
    // serialise them): the bytes they take are counted where each is
    // logged, so together they never pass the capacity; a growth counts
    // only what it adds, and a lazy write is held to it too.
    #[test]
    fn concurrent_creates_and_growths_never_pass_the_capacity() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        // `sample` volumes hold 100 bytes: 9 fit in 900.
        let gate = Arc::new(std::sync::Barrier::new(24));
        let writers: Vec<_> = (0..24)
            .map(|i| {
                let (store, gate) = (store.clone(), gate.clone());
                std::thread::spawn(move || {
                    gate.wait();
                    let v = vol(&format!("v{i}"), &format!("n{i}"));
                    match store.put_volume_limited(&v, capacity(900)) {
                        Ok(()) => 1,
                        Err(StoreError::CapacityExceeded { .. }) => 0,
                        Err(e) => panic!("{e}"),
                    }
                })
            })
            .collect();
        let created: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
        assert_eq!(created, 9);
        assert_eq!(store.allocated_bytes().unwrap(), 900);
        let mut listed = store.list_volumes(None, 100).unwrap().items;
        let grown = &mut listed[0];
        grown.capacity_bytes = 150;
        store.put_volume_limited(grown, capacity(1000)).unwrap();
        assert_eq!(store.allocated_bytes().unwrap(), 950);
        grown.capacity_bytes = 250;
        let e = store.put_volume_limited(grown, capacity(1000)).unwrap_err();
        assert!(
            e.to_string()
                .contains("100 more bytes requested but only 50 of 1000 bytes are free"),
            "{e}"
        );
        let lazy = store.put_shared(Arc::new(vol("lazy", "lazy")), false, capacity(1000));
        assert!(
            matches!(lazy, Err(StoreError::CapacityExceeded { .. })),
            "{lazy:?}"
        );
        // A change that takes nothing more passes at any capacity.
        grown.capacity_bytes = 150;
        grown.parameters.insert("k".into(), "v".into());
        store.put_volume_limited(grown, capacity(0)).unwrap();
        assert_eq!(store.allocated_bytes().unwrap(), 950);
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

    /// What a SIGKILL leaves: the files as they are while the store is
    /// still open (the page cache survives a killed process).
    fn crash_copy(from: &Path) -> tempfile::TempDir {
        let to = tempfile::tempdir().unwrap();
        for f in ["state.redb", "state.wal"] {
            std::fs::copy(from.join(f), to.path().join(f)).unwrap();
        }
        to
    }

    #[test]
    fn a_crash_loses_no_change_the_log_holds_and_checkpoints_keep_it_short() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let a = with_attachment(vol("a", "name-a"), "n1");
        store.put_volume(&a).unwrap();
        store.put_volume_lazily(&vol("b", "name-b")).unwrap();
        store.put_volume(&vol("c", "name-c")).unwrap();
        store.remove_volume("c").unwrap();

        let crashed = crash_copy(dir.path());
        let after = Store::open(crashed.path()).unwrap();
        assert_eq!(after.volume("a").unwrap().unwrap(), a);
        assert!(
            after.volume("b").unwrap().is_some(),
            "a lazy change synced by a later durable one"
        );
        assert!(after.volume("c").unwrap().is_none());
        assert_eq!(after.attached_count("n1").unwrap(), 1);
        assert_eq!(after.allocated_bytes().unwrap(), 200);
        // Replay ends in a checkpoint: a second crash replays nothing twice.
        drop(after);
        let again = Store::open(crash_copy(crashed.path()).path()).unwrap();
        assert_eq!(again.allocated_bytes().unwrap(), 200);

        // Past CHECKPOINT_ROUNDS the log starts again; nothing is lost.
        let rounds = CHECKPOINT_ROUNDS + 10;
        for i in 0..rounds {
            store
                .put_volume(&vol(&format!("v{i}"), &format!("n{i}")))
                .unwrap();
        }
        assert!(store.journal.lock().wal.used() < WAL_BYTES / 4);
        let crashed = crash_copy(dir.path());
        let after = Store::open(crashed.path()).unwrap();
        assert_eq!(after.allocated_bytes().unwrap(), 200 + rounds * 100);
        assert!(after.volume(&format!("v{}", rounds - 1)).unwrap().is_some());
    }

    /// A store whose flusher never runs: what waits stays waiting until a
    /// reader or a round applies it, however slowly the test goes.
    fn open_held(dir: &Path) -> Store {
        let store = Store::open(dir).unwrap();
        store.commits.hold_flusher();
        store
    }

    /// The record of `id` as redb itself holds it, overlay aside.
    fn in_redb(store: &Store, id: &str) -> Option<Volume> {
        let txn = store.db.begin_read().unwrap();
        let t = txn.open_table(VOLUMES).unwrap();
        let raw = t.get(id).unwrap().map(|v| v.value().to_vec());
        raw.map(|raw| decode("volumes", id, &raw).unwrap())
    }

    #[test]
    fn a_lazy_change_waits_in_the_log_and_every_reader_sees_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_held(dir.path());
        let mut a = with_attachment(vol("a", "name-a"), "n1");
        a.lifecycle = Lifecycle::Provisioning;
        store.put_volume_lazily(&a).unwrap();
        assert!(
            in_redb(&store, "a").is_none(),
            "a lazy change costs no redb commit"
        );
        assert_eq!(store.volume("a").unwrap(), Some(a.clone()));
        assert_eq!(store.volume_by_name("name-a").unwrap(), Some(a.clone()));
        // Counters count it without applying it; readers of indexes have
        // it applied first.
        assert_eq!(store.attached_count("n1").unwrap(), 1);
        assert_eq!(store.attached_count("n2").unwrap(), 0);
        assert_eq!(store.allocated_bytes().unwrap(), 100);
        assert!(in_redb(&store, "a").is_none());
        assert_eq!(store.unfinished_volumes().unwrap(), vec![a.clone()]);
        assert_eq!(in_redb(&store, "a"), Some(a.clone()));

        store.remove_volume_lazily("a").unwrap();
        assert!(in_redb(&store, "a").is_some());
        assert_eq!(
            store.volume("a").unwrap(),
            None,
            "a pending removal hides it"
        );
        assert_eq!(store.volume_by_name("name-a").unwrap(), None);
        assert_eq!(store.attached_count("n1").unwrap(), 0);
        assert_eq!(store.allocated_bytes().unwrap(), 0);
        assert!(in_redb(&store, "a").is_some(), "counted, not applied");
        assert!(store.volumes_on_node("n1").unwrap().is_empty());
        assert!(in_redb(&store, "a").is_none());

        // A durable change waits too (its log record synced): the next
        // transaction applies every pending change, in log order.
        store.put_volume_lazily(&vol("b", "name-b")).unwrap();
        let mut b2 = vol("b", "name-b");
        b2.capacity_bytes = 300;
        store.put_volume_lazily(&b2).unwrap();
        store.put_volume(&vol("c", "name-c")).unwrap();
        assert!(!store.journal.lock().unsynced(), "a durable change syncs");
        assert!(in_redb(&store, "b").is_none() && in_redb(&store, "c").is_none());
        assert_eq!(store.allocated_bytes().unwrap(), 400);
        store.remove_group("no-such-group").unwrap();
        assert_eq!(in_redb(&store, "b"), Some(b2.clone()));
        assert!(in_redb(&store, "c").is_some());
        // A durable change of a record with a pending one wins.
        store.put_volume_lazily(&vol("c", "name-c")).unwrap();
        let mut c2 = vol("c", "name-c");
        c2.capacity_bytes = 7;
        store.put_volume(&c2).unwrap();
        assert_eq!(store.volume("c").unwrap(), Some(c2.clone()));
        assert_eq!(store.allocated_bytes().unwrap(), 307);

        // Pending when the process dies: the log has it.
        store.remove_volume_lazily("b").unwrap();
        store.put_volume_lazily(&vol("d", "name-d")).unwrap();
        let crashed = crash_copy(dir.path());
        let after = Store::open(crashed.path()).unwrap();
        assert_eq!(after.volume("b").unwrap(), None);
        assert!(after.volume("d").unwrap().is_some());
        assert_eq!(after.allocated_bytes().unwrap(), 107);
        // A clean stop applies them too.
        store.checkpoint().unwrap();
        assert!(in_redb(&store, "b").is_none() && in_redb(&store, "d").is_some());
    }

    #[test]
    fn a_lazy_change_is_not_held_up_by_a_sync_and_stays_pending_past_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_held(dir.path());
        store.put_volume_lazily(&vol("a", "name-a")).unwrap();
        let mut a2 = vol("a", "name-a");
        a2.capacity_bytes = 5;
        let (tx, rx) = std::sync::mpsc::channel();
        let during = store.clone();
        let lazy = a2.clone();
        *store.journal.during_sync.lock().unwrap() = Some(Box::new(move || {
            let (done, wait) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                let _ = done.send(
                    during
                        .put_volume_lazily(&lazy)
                        .and_then(|()| during.put_volume_lazily(&vol("b", "name-b"))),
                );
            });
            // With the log held across the sync these writes would wait
            // for the round, which waits here: they time out.
            let _ = tx.send(wait.recv_timeout(std::time::Duration::from_secs(5)));
            Ok(())
        }));
        // A change of another kind takes a round of its own, with a redb
        // transaction that applies what is pending first.
        let writer = {
            let s = store.clone();
            std::thread::spawn(move || s.remove_group("no-such-group"))
        };
        let lazy = rx.recv_timeout(std::time::Duration::from_secs(20));
        assert!(
            matches!(lazy, Ok(Ok(Ok(())))),
            "lazy writes went on during the sync: {lazy:?}"
        );
        writer.join().unwrap().unwrap();
        // The round applied the first `a`, not what came during its sync.
        assert_eq!(in_redb(&store, "a").map(|v| v.capacity_bytes), Some(100));
        assert!(in_redb(&store, "b").is_none());
        assert_eq!(store.volume("a").unwrap(), Some(a2.clone()));
        assert!(store.volume("b").unwrap().is_some());
        assert!(
            store.journal.lock().unsynced(),
            "written after the sync began"
        );
        assert_eq!(store.allocated_bytes().unwrap(), 105);
        let crashed = crash_copy(dir.path());
        let after = Store::open(crashed.path()).unwrap();
        assert_eq!(after.volume("a").unwrap(), Some(a2.clone()));
        assert!(after.volume("b").unwrap().is_some());
        assert_eq!(after.allocated_bytes().unwrap(), 105);
        assert_eq!(store.list_volumes(None, 10).unwrap().items.len(), 2);
        assert_eq!(in_redb(&store, "a"), Some(a2));
    }

    #[test]
    fn a_lazy_change_is_synced_in_the_background_soon_after() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.put_volume_lazily(&vol("a", "name-a")).unwrap();
        assert!(store.journal.lock().unsynced(), "logged, not synced");
        let deadline = std::time::Instant::now() + crate::store::group_commit::FLUSH_AFTER * 40;
        while store.journal.lock().unsynced() {
            assert!(
                std::time::Instant::now() < deadline,
                "the flusher never synced a lazy change"
            );
            std::thread::sleep(crate::store::group_commit::FLUSH_AFTER / 5);
        }
        assert!(in_redb(&store, "a").is_some(), "and applied it to redb");
    }

    #[test]
    fn a_sync_makes_what_was_logged_lazily_durable_and_leaves_it_pending() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_held(dir.path());
        store.put_volume_lazily(&vol("a", "name-a")).unwrap();
        assert!(store.journal.lock().unsynced());
        store.sync().unwrap();
        assert!(!store.journal.lock().unsynced(), "the log was synced");
        assert!(in_redb(&store, "a").is_none(), "a sync applies nothing");
        assert!(store.volume("a").unwrap().is_some());
        // A log that failed is not synced again: the caller hears why.
        store.put_volume_lazily(&vol("b", "name-b")).unwrap();
        store.journal.lock().fail(1, &std::io::Error::other("EIO"));
        let e = store.sync().unwrap_err();
        assert!(e.to_string().contains("restarted"), "{e}");
    }

    #[test]
    fn a_change_over_the_attach_limit_is_refused_before_it_is_logged() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_held(dir.path());
        let a = with_attachment(vol("a", "name-a"), "n1");
        store.put_volume(&a).unwrap();
        let c = with_attachment(vol("c", "name-c"), "n1");
        // The count is redb's (nothing yet) plus the pending attachment.
        assert!(in_redb(&store, "a").is_none());
        let refused = store.put_volume_limited(&c, attach_limit("n1", 1));
        assert!(
            matches!(refused, Err(StoreError::AttachLimit { attached: 1, .. })),
            "{refused:?}"
        );
        assert!(store.volume("c").unwrap().is_none());
        let lsn = store.journal.lock().wal.next_lsn();
        assert!(store.put_volume_limited(&c, attach_limit("n1", 1)).is_err());
        assert_eq!(store.journal.lock().wal.next_lsn(), lsn, "nothing logged");
        // Re-publishing what is attached already is within the limit.
        store.put_volume_limited(&a, attach_limit("n1", 1)).unwrap();
        store.put_volume_limited(&c, attach_limit("n1", 2)).unwrap();
        assert_eq!(store.attached_count("n1").unwrap(), 2);
        let crashed = crash_copy(dir.path());
        assert_eq!(
            Store::open(crashed.path())
                .unwrap()
                .attached_count("n1")
                .unwrap(),
            2
        );
    }

    #[test]
    fn a_round_whose_every_change_is_refused_still_applies_what_was_pending() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_held(dir.path());
        let a = with_attachment(vol("a", "name-a"), "n1");
        store.put_volume(&a).unwrap();
        // As many pending as there may be: the next change takes a round.
        while store.journal.lock().deferred.len() < MAX_DEFERRED {
            let i = store.journal.lock().deferred.len();
            store
                .put_volume_lazily(&vol(&format!("b{i}"), &format!("name-b{i}")))
                .unwrap();
        }
        let c = with_attachment(vol("c", "name-c"), "n1");
        let refused = store.put_volume_limited(&c, attach_limit("n1", 1));
        assert!(
            matches!(refused, Err(StoreError::AttachLimit { .. })),
            "{refused:?}"
        );
        assert!(
            in_redb(&store, "b1").is_some(),
            "the pending changes were committed"
        );
        assert!(store.journal.lock().deferred.is_empty());
        assert!(in_redb(&store, "c").is_none());
        assert!(store.volume("b1").unwrap().is_some());
        assert_eq!(store.attached_count("n1").unwrap(), 1);
    }

    /// A volume change as the property test below makes it.
    #[derive(Debug, Clone)]
    enum Change {
        Put {
            id: u8,
            size: u64,
            on: [bool; 2],
            ready: bool,
        },
        Remove(u8),
    }

    fn change() -> impl proptest::strategy::Strategy<Value = Change> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0..4u8, 0..4u64, any::<[bool; 2]>(), any::<bool>())
                .prop_map(|(id, size, on, ready)| Change::Put { id, size, on, ready }),
            1 => (0..4u8).prop_map(Change::Remove),
        ]
    }

    /// Everything a reader can ask of the volumes, for comparing stores.
    fn view(store: &Store) -> Vec<String> {
        // Reads that settle pending changes come last.
        let mut out = vec![format!("allocated {}", store.allocated_bytes().unwrap())];
        for node in ["n0", "n1"] {
            out.push(format!("{node} {}", store.attached_count(node).unwrap()));
        }
        for id in 0..4u8 {
            out.push(format!("{:?}", store.volume(&format!("v{id}")).unwrap()));
            let named = store.volume_by_name(&format!("name-{id}")).unwrap();
            out.push(format!("{:?}", named.map(|v| v.id)));
        }
        for node in ["n0", "n1"] {
            let on: Vec<String> = store
                .volumes_on_node(node)
                .unwrap()
                .into_iter()
                .map(|v| v.id)
                .collect();
            out.push(format!("{node} {on:?}"));
        }
        let unfinished: Vec<String> = store
            .unfinished_volumes()
            .unwrap()
            .into_iter()
            .map(|v| v.id)
            .collect();
        out.push(format!("unfinished {unfinished:?}"));
        out
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(48))]
        /// Applying only the last pending change of each volume (and its
        /// removals) leaves redb as applying every change in log order does
        /// (replay after a crash): records, names, counters, node index.
        #[test]
        fn pending_changes_applied_together_leave_what_each_in_turn_leaves(
            changes in proptest::collection::vec(change(), 1..60),
            durable in proptest::collection::vec(proptest::prelude::any::<bool>(), 60),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(dir.path()).unwrap();
            for (c, durable) in changes.iter().zip(durable) {
                match c {
                    Change::Put { id, size, on, ready } => {
                        let mut v = vol(&format!("v{id}"), &format!("name-{id}"));
                        v.capacity_bytes = size * 100;
                        if !ready {
                            v.lifecycle = Lifecycle::Provisioning;
                        }
                        for (n, on) in on.iter().enumerate() {
                            if *on {
                                v = with_attachment(v, &format!("n{n}"));
                            }
                        }
                        if durable { store.put_volume(&v) } else { store.put_volume_lazily(&v) }.unwrap();
                    }
                    Change::Remove(id) => {
                        let id = format!("v{id}");
                        if durable { store.remove_volume(&id) } else { store.remove_volume_lazily(&id) }.unwrap();
                    }
                }
            }
            let pending = view(&store);
            let crashed = crash_copy(dir.path());
            store.checkpoint().unwrap();
            proptest::prop_assert!(store.journal.overlay.is_empty());
            let applied = view(&store);
            let replayed = view(&Store::open(crashed.path()).unwrap());
            proptest::prop_assert_eq!(&applied, &replayed);
            proptest::prop_assert_eq!(&pending, &replayed);
        }
    }

    #[test]
    fn pending_lazy_changes_stay_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        for i in 0..MAX_DEFERRED + 1 {
            store
                .put_volume_lazily(&vol(&format!("v{i}"), &format!("n{i}")))
                .unwrap();
        }
        assert!(store.journal.lock().deferred.len() <= MAX_DEFERRED);
        assert!(in_redb(&store, "v0").is_some(), "the oldest were applied");
        let last = format!("v{MAX_DEFERRED}");
        assert!(store.volume(&last).unwrap().is_some());
    }

    #[test]
    fn a_log_record_this_version_cannot_read_stops_start_up_and_names_it() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path()).unwrap());
        let (mut wal, _) = Wal::open(&dir.path().join("state.wal"), WAL_BYTES, 0).unwrap();
        wal.append(br#"[{"SomeFutureOp":1}]"#).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let refused = Store::open(dir.path()).err().expect("start-up must refuse");
        let msg = refused.to_string();
        assert!(
            msg.contains("state.wal") && msg.contains("record 1"),
            "{msg}"
        );
    }

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
    fn after_a_log_failure_no_change_is_accepted_and_probe_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        store.put_volume(&vol("a", "name-a")).unwrap();
        let e = std::io::Error::other("EIO");
        let failed = store.journal.lock().fail(1, &e);
        assert!(failed[0].is_err());
        let refused = store.put_volume(&vol("b", "name-b")).unwrap_err();
        assert!(refused.to_string().contains("restarted"), "{refused}");
        assert!(store.healthy().is_err());
        assert!(store.volume("b").unwrap().is_none());
        // A restart replays the log and accepts changes again.
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        store.healthy().unwrap();
        assert!(store.volume("a").unwrap().is_some());
        store.put_volume(&vol("b", "name-b")).unwrap();
    }

    #[test]
    fn pending_changes_that_cannot_be_applied_stop_the_store_and_a_restart_keeps_them() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_held(dir.path());
        store.journal.lock().refuse_apply = true;
        // Told to the CO as done: one synced, one only logged.
        store.put_volume(&vol("a", "name-a")).unwrap();
        store.put_volume_lazily(&vol("b", "name-b")).unwrap();
        // An index read applies them first.
        let e = store.list_volumes(None, 10).unwrap_err();
        assert!(e.to_string().contains("restarted"), "{e}");
        assert!(store.healthy().is_err());
        let refused = store.put_volume(&vol("c", "name-c")).unwrap_err();
        assert!(refused.to_string().contains("restarted"), "{refused}");
        assert!(in_redb(&store, "a").is_none());
        // A restart replays the log into redb: nothing the CO was told is lost.
        drop(store);
        let store = Store::open(dir.path()).unwrap();
        store.healthy().unwrap();
        assert!(in_redb(&store, "a").is_some() && in_redb(&store, "b").is_some());
        assert_eq!(store.allocated_bytes().unwrap(), 200);
        assert!(store.volume("c").unwrap().is_none());
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
    fn concurrent_writers_share_commits_and_the_attach_limit_holds() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let writers: Vec<_> = (0..16)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    let mut attached = 0;
                    for i in 0..20 {
                        let v = with_attachment(
                            vol(&format!("v{t}-{i}"), &format!("n{t}-{i}")),
                            "busy-node",
                        );
                        match store.put_volume_limited(&v, attach_limit("busy-node", 40)) {
                            Ok(()) => attached += 1,
                            Err(StoreError::AttachLimit { .. }) => {
                                store.put_volume(&vol(&v.id, &v.name)).unwrap()
                            }
                            Err(e) => panic!("{e}"),
                        }
                    }
                    attached
                })
            })
            .collect();
        let attached: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
        assert_eq!(attached, 40);
        assert_eq!(store.attached_count("busy-node").unwrap(), 40);
        assert_eq!(store.list_volumes(None, 1000).unwrap().items.len(), 320);
        assert_eq!(store.allocated_bytes().unwrap(), 320 * 100);
        // 320 records (plus the refusals' second write) in fewer commits.
        assert!(
            store.commit_rounds() < 300,
            "{} commits for 600 writes",
            store.commit_rounds()
        );
    }

    #[test]
    fn a_volume_encoded_once_is_logged_exactly_as_serde_writes_the_op() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let v = with_attachment(vol("a", "name-a"), "node-1");
        let op = Op::PutVolume(Arc::new(v));
        let txn = store.db.begin_write().unwrap();
        for op in [op, Op::RemoveVolume("a".into())] {
            let encoded = apply_and_encode(&txn, &op, &Limits::default()).unwrap();
            let mut logged = Vec::new();
            encoded.log_into(&mut logged);
            assert_eq!(logged, serde_json::to_vec(&op).unwrap());
            assert_eq!(encoded.logged_len(), logged.len());
        }
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
