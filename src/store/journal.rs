//! The journal: what stands between a change and redb. A round of the
//! group commit logs its changes to the write-ahead log (`wal`) and syncs
//! it once for all of them. Volume changes then wait in the log, and for
//! readers in the `overlay`, for a redb transaction that takes many (the
//! flusher's, in the background); other changes are applied to redb,
//! without a sync, with their round. Every so often redb commits durably
//! instead (a checkpoint) and the log starts again; start-up replays what
//! the log holds past the last checkpoint.

use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use redb::{Database, ReadableDatabase};

use super::error::{StoreError, StoreResult};
use super::group_commit::{GroupCommit, Round};
use super::limits::Limits;
use super::overlay::{Counts, Delta, Overlay, Settled};
use super::record::{decode, encode_op, Encoded, Op};
use super::tables::{
    apply, apply_and_encode, apply_encoded, counter, ALLOCATED, ATTACHED_PREFIX, COUNTERS, VOLUMES,
};
use super::wal::Wal;
use crate::domain::volume::Volume;

/// A change as submitted: the op, and the limits it must respect.
pub(super) struct Change {
    pub(super) op: Op,
    pub(super) limits: Limits,
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
pub(super) struct Journal {
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
    pub(super) overlay: Overlay,
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

/// Opens the log and applies, in `txn`, what it holds past redb's last
/// checkpoint; `txn` then records the new checkpoint.
pub(super) fn replay(txn: &redb::WriteTransaction, dir: &Path) -> StoreResult<(Wal, usize)> {
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
    /// The journal of `wal`, which `db` has just replayed, and the group
    /// commit whose rounds it runs, with its flusher started.
    pub(super) fn start(
        db: Arc<Database>,
        wal: Wal,
    ) -> StoreResult<(Arc<Journal>, Arc<GroupCommit<Change>>)> {
        let syncer = wal
            .syncer()
            .map_err(|e| StoreError::Worker(e.to_string()))?;
        let journal = Arc::new(Journal {
            db,
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
        Ok((journal, commits))
    }

    /// Makes the next sync of the log fail, as a failing disk would
    /// (tests only).
    #[cfg(test)]
    pub(super) fn fail_next_sync(&self) {
        *self.during_sync.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(Box::new(|| Err(std::io::Error::other("injected EIO"))));
    }

    /// Applies the changes still pending to redb (see `Store::settle`).
    pub(super) fn settle(&self) -> StoreResult<Settled> {
        if let Some(settled) = self.overlay.settled() {
            return Ok(settled);
        }
        let _writer = self.writer();
        let mut log = self.lock();
        if let Some(failed) = &log.failed {
            return Err(StoreError::Worker(failed.clone()));
        }
        self.settle_in(&mut log)?;
        // Nothing is logged while `log` is held: all was applied.
        self.overlay
            .settled()
            .ok_or_else(|| StoreError::Worker("changes still pending after settling".into()))
    }

    /// Why the store accepts no change, if it stopped (see `Log::failed`).
    pub(super) fn running(&self) -> StoreResult<()> {
        if let Some(failed) = &self.lock().failed {
            return Err(StoreError::Worker(failed.clone()));
        }
        Ok(())
    }

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
    pub(super) fn sync_log(&self) -> StoreResult<()> {
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
    pub(super) fn counter(
        &self,
        key: &str,
        pending: impl FnOnce(&Counts) -> i128,
    ) -> StoreResult<u64> {
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
    pub(super) fn write_lazily(&self, change: Change) -> Result<StoreResult<()>, Change> {
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
    pub(super) fn checkpoint(&self) -> StoreResult<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::volume::Lifecycle;
    use crate::domain::volume::{sample as vol, with_attachment};
    use crate::store::testing::{attach_limit, crash_copy, in_redb, open_held};
    use crate::store::Store;

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
}
