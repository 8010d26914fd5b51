//! Group commit: concurrent writers share one transaction and one fsync.
//!
//! redb has one writer at a time and every durable commit costs an fsync,
//! so N concurrent calls used to pay N fsyncs one after the other. Here the
//! first writer to arrive becomes the leader: it takes every change queued
//! so far, applies them all in one transaction and commits once; the others
//! wait for its result, and whoever queued meanwhile leads the next round.
//! A lone writer leads at once, so one client pays no extra hop or wait.
//!
//! A change must fail, if it fails, before it writes anything (check, then
//! write): the transaction is shared, so a change cannot be rolled back
//! alone. A failed commit fails every change in the round.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};

use redb::{Database, Durability, WriteTransaction};

use crate::store::{StoreError, StoreResult};

/// One change to apply inside the shared transaction.
pub type Change = Box<dyn FnOnce(&WriteTransaction) -> StoreResult<()> + Send>;

struct Queued {
    ticket: u64,
    change: Change,
    durable: bool,
}

#[derive(Default)]
struct State {
    next_ticket: u64,
    queue: Vec<Queued>,
    leading: bool,
    results: HashMap<u64, StoreResult<()>>,
    /// A lazy round committed since the last durable one.
    dirty: bool,
}

#[derive(Default)]
pub struct GroupCommit {
    state: Mutex<State>,
    done: Condvar,
    rounds: std::sync::atomic::AtomicU64,
    /// Told when a lazy round leaves changes that are not yet durable.
    flusher: Mutex<Option<std::sync::mpsc::SyncSender<()>>>,
}

/// How long a lazy change may stay non-durable when no durable commit
/// follows it: the flusher makes it durable then.
pub const FLUSH_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// Largest number of changes one transaction takes.
const MAX_ROUND: usize = 256;

impl GroupCommit {
    /// Starts the thread that makes lazy changes durable `FLUSH_AFTER`
    /// after they were committed, unless a durable commit did it before.
    /// It holds no strong reference: it ends with the store.
    pub fn start_flusher(self: &std::sync::Arc<Self>, db: &std::sync::Arc<Database>) {
        let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
        *self.flusher.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        let (me, db) = (
            std::sync::Arc::downgrade(self),
            std::sync::Arc::downgrade(db),
        );
        let spawned = std::thread::Builder::new()
            .name("store-flusher".into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    std::thread::sleep(FLUSH_AFTER);
                    let (Some(me), Some(db)) = (me.upgrade(), db.upgrade()) else {
                        return;
                    };
                    if me.lock().dirty {
                        if let Err(e) = me.flush(&db) {
                            tracing::error!(error = %e, "cannot make lazy store changes durable");
                        }
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "no store flusher: lazy changes become durable with the next durable commit only");
        }
    }

    /// Makes every change committed so far durable.
    pub fn flush(&self, db: &Database) -> StoreResult<()> {
        self.submit(db, Box::new(|_| Ok(())), true)
    }

    fn wake_flusher(&self) {
        if let Some(tx) = self
            .flusher
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            let _ = tx.try_send(());
        }
    }

    /// Transactions committed so far.
    pub fn rounds(&self) -> u64 {
        self.rounds.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking change cannot leave the state half-updated (it runs
        // outside the lock), so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `change` in a (possibly shared) transaction and returns once
    /// it is committed: durably (fsynced) when `durable`, otherwise only
    /// made visible, to be persisted by the next durable commit.
    pub fn submit(&self, db: &Database, change: Change, durable: bool) -> StoreResult<()> {
        let mut st = self.lock();
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.queue.push(Queued {
            ticket,
            change,
            durable,
        });
        loop {
            if let Some(result) = st.results.remove(&ticket) {
                return result;
            }
            if !st.leading {
                st.leading = true;
                let take = st.queue.len().min(MAX_ROUND);
                let round: Vec<Queued> = st.queue.drain(..take).collect();
                drop(st);
                self.rounds
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let durable = round.iter().any(|q| q.durable);
                let tickets: Vec<u64> = round.iter().map(|q| q.ticket).collect();
                // A panicking change must not leave `leading` set for ever
                // (every writer would wait): its round fails instead.
                let results =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_round(db, round)))
                        .unwrap_or_else(|_| {
                            tickets
                                .into_iter()
                                .map(|t| {
                                    (t, Err(StoreError::Worker("a store change panicked".into())))
                                })
                                .collect()
                        });
                st = self.lock();
                st.leading = false;
                if durable {
                    st.dirty = false;
                } else if !st.dirty {
                    st.dirty = true;
                    self.wake_flusher();
                }
                st.results.extend(results);
                self.done.notify_all();
                continue;
            }
            st = self.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }
}

fn run_round(db: &Database, round: Vec<Queued>) -> Vec<(u64, StoreResult<()>)> {
    let tickets: Vec<u64> = round.iter().map(|q| q.ticket).collect();
    let durable = round.iter().any(|q| q.durable);
    let txn = match begin(db, durable) {
        Ok(t) => t,
        Err(e) => {
            let msg = e.to_string();
            return tickets
                .into_iter()
                .map(|t| (t, Err(StoreError::Worker(msg.clone()))))
                .collect();
        }
    };
    let mut results = Vec::with_capacity(round.len());
    for q in round {
        match (q.change)(&txn) {
            // A refusal is decided before the change writes anything.
            Err(refused @ StoreError::AttachLimit { .. }) => results.push((q.ticket, Err(refused))),
            Err(e) => {
                // Anything else may have left a partial write: nothing of
                // this round is committed.
                let msg = format!("transaction abandoned: {e}");
                let _ = txn.abort();
                return tickets
                    .into_iter()
                    .map(|t| (t, Err(StoreError::Worker(msg.clone()))))
                    .collect();
            }
            Ok(()) => results.push((q.ticket, Ok(()))),
        }
    }
    if let Err(e) = txn.commit() {
        let msg = format!("commit failed: {e}");
        return tickets
            .into_iter()
            .map(|t| (t, Err(StoreError::Worker(msg.clone()))))
            .collect();
    }
    results
}

fn begin(db: &Database, durable: bool) -> StoreResult<WriteTransaction> {
    let mut txn = db.begin_write()?;
    if !durable {
        txn.set_durability(Durability::None)
            .map_err(|e| StoreError::Worker(e.to_string()))?;
    }
    Ok(txn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::ReadableDatabase;

    const T: redb::TableDefinition<&str, u64> = redb::TableDefinition::new("t");

    #[test]
    fn a_failing_or_panicking_change_fails_its_round_and_the_next_one_runs() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path().join("db")).unwrap();
        let gc = GroupCommit::default();
        let panicked = gc.submit(&db, Box::new(|_| panic!("a bug")), true);
        assert!(
            matches!(panicked, Err(StoreError::Worker(_))),
            "{panicked:?}"
        );
        gc.submit(
            &db,
            Box::new(|txn| {
                txn.open_table(T)?.insert("k", 1)?;
                Ok(())
            }),
            true,
        )
        .unwrap();
        let read = db.begin_read().unwrap();
        let v = read
            .open_table(T)
            .unwrap()
            .get("k")
            .unwrap()
            .map(|v| v.value());
        assert_eq!(v, Some(1));
        assert_eq!(gc.rounds(), 2);
    }
}
