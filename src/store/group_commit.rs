//! Group commit: concurrent writers share one transaction and one sync.
//!
//! Every durable commit costs a sync of the disk, so N concurrent calls
//! would pay N syncs one after the other. Here the first writer to arrive
//! becomes the leader: it takes every change queued so far, has them all
//! applied and synced once (by the store's `Round`), and the others wait
//! for its result; whoever queued meanwhile leads the next round. A lone
//! writer leads at once, so one client pays no extra hop or wait.
//!
//! A change must fail, if it fails, before it writes anything (check, then
//! write): the transaction is shared, so a change cannot be rolled back
//! alone. A failed commit fails every change in the round.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};

use super::error::{StoreError, StoreResult};

/// What applies one round: the changes (`None` asks only for a sync of
/// what earlier rounds left unsynced) and whether any must be durable.
pub trait Round<C>: Send + Sync {
    fn run(&self, changes: Vec<Option<C>>, durable: bool) -> Vec<StoreResult<()>>;
}

/// Where a writer waits: told its result, or that it leads the next round.
struct Slot {
    state: Mutex<SlotState>,
    wake: Condvar,
}

enum SlotState {
    Waiting,
    /// Waiting, and sleeping on the condition variable.
    Asleep,
    Lead,
    Done(StoreResult<()>),
}

impl Slot {
    fn lock(&self) -> MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the writer only if it sleeps: std's condition variable makes a
    /// futex call on every notify, waiter or not, and most slots are told
    /// by their own writer, which led the round (a lone writer always).
    fn tell(&self, news: SlotState) {
        let was = std::mem::replace(&mut *self.lock(), news);
        if matches!(was, SlotState::Asleep) {
            self.wake.notify_one();
        }
    }

    /// Blocks until told: the writer's result, or `Lead`.
    fn wait(&self) -> Result<StoreResult<()>, Lead> {
        let mut st = self.lock();
        loop {
            match std::mem::replace(&mut *st, SlotState::Waiting) {
                SlotState::Waiting | SlotState::Asleep => {
                    *st = SlotState::Asleep;
                    st = self.wake.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                SlotState::Lead => return Err(Lead),
                SlotState::Done(result) => return Ok(result),
            }
        }
    }
}

/// Told to run the next round.
struct Lead;

struct Queued<C> {
    change: Option<C>,
    durable: bool,
    slot: Arc<Slot>,
}

struct State<C> {
    queue: Vec<Queued<C>>,
    leading: bool,
    /// A lazy round committed since the last durable one.
    dirty: bool,
}

pub struct GroupCommit<C> {
    state: Mutex<State<C>>,
    rounds: std::sync::atomic::AtomicU64,
    round: Box<dyn Round<C>>,
    /// Told when a lazy round leaves changes that are not yet durable.
    flusher: Mutex<Option<std::sync::mpsc::SyncSender<()>>>,
    /// Tests that look at what waits hold the flusher off: a thread
    /// preempted past `FLUSH_AFTER` would otherwise see it applied.
    #[cfg(test)]
    flusher_held: std::sync::atomic::AtomicBool,
}

/// How long a lazy change may stay non-durable when no durable commit
/// follows it: the flusher makes it durable then.
pub const FLUSH_AFTER: std::time::Duration = std::time::Duration::from_millis(50);

/// Largest number of changes one transaction takes.
const MAX_ROUND: usize = 256;

impl<C: Send + 'static> GroupCommit<C> {
    pub fn new(round: Box<dyn Round<C>>) -> Self {
        GroupCommit {
            state: Mutex::new(State {
                queue: Vec::new(),
                leading: false,
                dirty: false,
            }),
            rounds: Default::default(),
            round,
            flusher: Mutex::new(None),
            #[cfg(test)]
            flusher_held: Default::default(),
        }
    }

    /// Keeps the flusher from running from now on (tests only).
    #[cfg(test)]
    pub fn hold_flusher(&self) {
        self.flusher_held
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Starts the thread that makes lazy changes durable `FLUSH_AFTER`
    /// after they were committed, unless a durable commit did it before,
    /// and has pending changes applied. `unsettled` tells of changes
    /// committed beside the rounds or left pending (see `left_pending`).
    /// It holds no strong reference: it ends with the store.
    pub fn start_flusher(self: &Arc<Self>, unsettled: Box<dyn Fn() -> bool + Send>) {
        let (tx, rx) = std::sync::mpsc::sync_channel::<()>(1);
        *self.flusher.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
        let me: Weak<Self> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("store-flusher".into())
            .spawn(move || {
                while rx.recv().is_ok() {
                    std::thread::sleep(FLUSH_AFTER);
                    let Some(me) = me.upgrade() else {
                        return;
                    };
                    #[cfg(test)]
                    if me.flusher_held.load(std::sync::atomic::Ordering::SeqCst) {
                        continue;
                    }
                    let dirty = me.lock().dirty;
                    if dirty || unsettled() {
                        if let Err(e) = me.flush() {
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
    pub fn flush(&self) -> StoreResult<()> {
        self.enqueue(None, true)
    }

    /// Tells the flusher of a change committed without a round, or left
    /// for it to settle.
    pub fn left_pending(&self) {
        self.wake_flusher();
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

    fn lock(&self) -> MutexGuard<'_, State<C>> {
        // A panicking change cannot leave the state half-updated (it runs
        // outside the lock), so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `change` in a (possibly shared) round and returns once it
    /// is committed: durably when `durable`, otherwise only made visible,
    /// to be persisted by the next durable round.
    pub fn submit(&self, change: C, durable: bool) -> StoreResult<()> {
        self.enqueue(Some(change), durable)
    }

    /// Each waiter sleeps on a slot of its own and is woken once: with its
    /// result, or to lead the next round. (One condition variable for all
    /// woke every waiter after every round: with 64 concurrent calls the
    /// futex traffic took more CPU than the commits.)
    fn enqueue(&self, change: Option<C>, durable: bool) -> StoreResult<()> {
        let slot = Arc::new(Slot {
            state: Mutex::new(SlotState::Waiting),
            wake: Condvar::new(),
        });
        let lead = {
            let mut st = self.lock();
            st.queue.push(Queued {
                change,
                durable,
                slot: slot.clone(),
            });
            !std::mem::replace(&mut st.leading, true)
        };
        if !lead {
            if let Ok(result) = slot.wait() {
                return result;
            }
        }
        loop {
            self.lead_round();
            if let Ok(result) = slot.wait() {
                return result;
            }
        }
    }

    /// Runs one round of what is queued, tells its writers, and hands the
    /// lead to the oldest writer still queued, if any.
    fn lead_round(&self) {
        let round: Vec<Queued<C>> = {
            let mut st = self.lock();
            let take = st.queue.len().min(MAX_ROUND);
            st.queue.drain(..take).collect()
        };
        self.rounds
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let durable = round.iter().any(|q| q.durable);
        let mut slots = Vec::with_capacity(round.len());
        let changes: Vec<Option<C>> = round
            .into_iter()
            .map(|q| {
                slots.push(q.slot);
                q.change
            })
            .collect();
        // A panicking change must not leave `leading` set for ever (every
        // writer would wait): its round fails instead.
        let results = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.round.run(changes, durable)
        }))
        .unwrap_or_else(|_| {
            slots
                .iter()
                .map(|_| Err(StoreError::Worker("a store change panicked".into())))
                .collect()
        });
        let failed = results.iter().any(|r| r.is_err());
        let next = {
            let mut st = self.lock();
            if durable && !failed {
                st.dirty = false;
            } else if !st.dirty {
                st.dirty = true;
                self.wake_flusher();
            }
            let next = st.queue.first().map(|q| q.slot.clone());
            st.leading = next.is_some();
            next
        };
        let mut results = results.into_iter();
        for slot in slots {
            let r = results
                .next()
                .unwrap_or_else(|| Err(StoreError::Worker("round lost a result".into())));
            slot.tell(SlotState::Done(r));
        }
        if let Some(next) = next {
            next.tell(SlotState::Lead);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies numbers to a list; 0 panics, like a bug in a change.
    #[derive(Default)]
    struct Numbers(Arc<Mutex<Vec<(u32, bool)>>>);

    impl Round<u32> for Numbers {
        fn run(&self, changes: Vec<Option<u32>>, durable: bool) -> Vec<StoreResult<()>> {
            let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
            changes
                .into_iter()
                .map(|c| {
                    if c == Some(0) {
                        panic!("a bug");
                    }
                    if let Some(n) = c {
                        seen.push((n, durable));
                    }
                    Ok(())
                })
                .collect()
        }
    }

    #[test]
    fn a_panicking_change_fails_its_round_and_the_next_one_runs() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let gc = GroupCommit::new(Box::new(Numbers(seen.clone())));
        let panicked = gc.submit(0, true);
        assert!(
            matches!(panicked, Err(StoreError::Worker(_))),
            "{panicked:?}"
        );
        gc.submit(7, false).unwrap();
        gc.flush().unwrap();
        assert_eq!(
            *seen.lock().unwrap_or_else(|p| p.into_inner()),
            vec![(7, false)]
        );
        assert_eq!(gc.rounds(), 3);
    }

    /// A round that takes as long as a slow disk's sync.
    struct Slow(Numbers);

    impl Round<u32> for Slow {
        fn run(&self, changes: Vec<Option<u32>>, durable: bool) -> Vec<StoreResult<()>> {
            std::thread::sleep(std::time::Duration::from_millis(20));
            self.0.run(changes, durable)
        }
    }

    #[test]
    fn concurrent_writers_share_rounds() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let gc = Arc::new(GroupCommit::new(Box::new(Slow(Numbers(seen.clone())))));
        let start = Arc::new(std::sync::Barrier::new(64));
        let writers: Vec<_> = (1..=64)
            .map(|n| {
                let (gc, start) = (gc.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    gc.submit(n, true)
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap().unwrap();
        }
        let mut got: Vec<u32> = seen.lock().unwrap().iter().map(|(n, _)| *n).collect();
        got.sort_unstable();
        assert_eq!(got, (1..=64).collect::<Vec<_>>());
        // Those that queued while a round synced share the next one.
        assert!(gc.rounds() < 16, "{} rounds for 64 writers", gc.rounds());
    }

    #[test]
    fn more_writers_than_a_round_takes_all_get_their_own_result() {
        // Over MAX_ROUND writers queue behind a slow round: the lead passes
        // from round to round, and each writer learns its own outcome.
        struct Picky(Slow);
        impl Round<u32> for Picky {
            fn run(&self, changes: Vec<Option<u32>>, durable: bool) -> Vec<StoreResult<()>> {
                let odd: Vec<bool> = changes
                    .iter()
                    .map(|c| c.is_some_and(|n| n % 2 == 1))
                    .collect();
                let _ = self.0.run(changes, durable);
                odd.into_iter()
                    .map(|odd| {
                        if odd {
                            Err(StoreError::Worker("odd".into()))
                        } else {
                            Ok(())
                        }
                    })
                    .collect()
            }
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let gc = Arc::new(GroupCommit::new(Box::new(Picky(Slow(Numbers(
            seen.clone(),
        ))))));
        let n = MAX_ROUND as u32 * 2 + 50;
        let start = Arc::new(std::sync::Barrier::new(n as usize));
        let writers: Vec<_> = (1..=n)
            .map(|i| {
                let (gc, start) = (gc.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    (i, gc.submit(i, i % 3 == 0))
                })
            })
            .collect();
        for w in writers {
            let (i, result) = w.join().unwrap();
            assert_eq!(result.is_err(), i % 2 == 1, "writer {i}: {result:?}");
        }
        assert_eq!(seen.lock().unwrap().len(), n as usize);
        assert!(gc.rounds() >= 3, "{} rounds for {n} writers", gc.rounds());
    }
}
