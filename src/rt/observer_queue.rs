//! Decouples volume observers from the RPC path. An observer that talks to a
//! remote API (the RelayVolume mirror) may be slow or down; RPCs must not
//! wait for it. Changes are queued per volume, latest wins (the observer
//! always sees a volume's newest state, never an older one after a newer
//! one), and one worker delivers them in order. A delivery that did not
//! land (the host API hiccuped) is queued again after a growing pause,
//! unless a newer state took its place meanwhile: a record a restarted
//! controller needs must not be lost to one failed write.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

/// First pause before a failed delivery is tried again; doubles per failure.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(60);

use crate::domain::observers::VolumeObserver;
use crate::domain::volume::Volume;

#[derive(Clone)]
enum Event {
    Changed(Volume),
    Removed(Volume),
}

#[derive(Default)]
struct Pending {
    /// Volume ids in the order they first became pending.
    order: VecDeque<String>,
    latest: HashMap<String, Event>,
    /// Failed deliveries in a row, per volume.
    failures: HashMap<String, u32>,
    /// The sequence number of each volume's newest queued state (numbers
    /// are never reused), so a retry can tell it has been superseded.
    newest: HashMap<String, u64>,
    next_seq: u64,
}

impl Pending {
    fn push(&mut self, id: &str, event: Event) {
        self.next_seq += 1;
        self.newest.insert(id.to_string(), self.next_seq);
        if self.latest.insert(id.to_string(), event).is_none() {
            self.order.push_back(id.to_string());
        }
    }
}

fn id_of(event: &Event) -> &str {
    match event {
        Event::Changed(v) | Event::Removed(v) => &v.id,
    }
}

pub struct ObserverQueue {
    pending: Arc<Mutex<Pending>>,
    wake: Arc<Notify>,
}

impl ObserverQueue {
    /// Starts the delivery worker on the current runtime.
    pub fn spawn(inner: Arc<dyn VolumeObserver>) -> Self {
        let pending: Arc<Mutex<Pending>> = Arc::default();
        let wake = Arc::new(Notify::new());
        let (p, w) = (pending.clone(), wake.clone());
        tokio::spawn(async move {
            loop {
                let next = {
                    let mut p = p.lock().unwrap_or_else(PoisonError::into_inner);
                    p.order.pop_front().and_then(|id| {
                        let seq = p.newest.get(&id).copied().unwrap_or_default();
                        p.latest.remove(&id).map(|e| (e, seq))
                    })
                };
                let Some((event, seq)) = next else {
                    w.notified().await;
                    continue;
                };
                let landed = match &event {
                    Event::Changed(v) => inner.changed(v).await,
                    Event::Removed(v) => inner.removed(v).await,
                };
                let id = id_of(&event).to_string();
                let mut pending = p.lock().unwrap_or_else(PoisonError::into_inner);
                if landed {
                    pending.failures.remove(&id);
                    if pending.newest.get(&id) == Some(&seq) {
                        pending.newest.remove(&id);
                    }
                    continue;
                }
                let failures = pending.failures.entry(id.clone()).or_insert(0);
                *failures = failures.saturating_add(1);
                let pause = RETRY_FIRST
                    .saturating_mul(1 << (*failures - 1).min(8))
                    .min(RETRY_MAX);
                drop(pending);
                let (p, w) = (p.clone(), w.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(pause).await;
                    let mut pending = p.lock().unwrap_or_else(PoisonError::into_inner);
                    // A newer state replaces the failed one, never the reverse.
                    if pending.newest.get(&id) == Some(&seq) {
                        pending.push(&id, event);
                        drop(pending);
                        w.notify_one();
                    }
                });
            }
        });
        ObserverQueue { pending, wake }
    }

    fn push(&self, id: &str, event: Event) {
        let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        p.push(id, event);
        drop(p);
        self.wake.notify_one();
    }

    pub fn backlog(&self) -> usize {
        self.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .latest
            .len()
    }
}

#[async_trait::async_trait]
impl VolumeObserver for ObserverQueue {
    async fn changed(&self, vol: &Volume) -> bool {
        self.push(&vol.id, Event::Changed(vol.clone()));
        true
    }

    async fn removed(&self, vol: &Volume) -> bool {
        self.push(&vol.id, Event::Removed(vol.clone()));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    struct Slow {
        seen: Mutex<Vec<(String, u64, bool)>>,
        gate: tokio::sync::Semaphore,
    }

    impl Default for Slow {
        fn default() -> Self {
            Slow {
                seen: Mutex::default(),
                gate: tokio::sync::Semaphore::new(0),
            }
        }
    }

    #[async_trait::async_trait]
    impl VolumeObserver for Slow {
        async fn changed(&self, vol: &Volume) -> bool {
            let _ = self.gate.acquire().await.map(|p| p.forget());
            self.seen
                .lock()
                .unwrap()
                .push((vol.id.clone(), vol.capacity_bytes, true));
            true
        }
        async fn removed(&self, vol: &Volume) -> bool {
            let _ = self.gate.acquire().await.map(|p| p.forget());
            self.seen
                .lock()
                .unwrap()
                .push((vol.id.clone(), vol.capacity_bytes, false));
            true
        }
    }

    fn vol(id: &str, bytes: u64) -> Volume {
        Volume {
            capacity_bytes: bytes,
            ..crate::domain::volume::sample(id, id)
        }
    }

    #[tokio::test]
    async fn callers_never_wait_and_the_latest_state_wins() {
        let slow = Arc::new(Slow::default());
        let q = ObserverQueue::spawn(slow.clone());
        // The observer is blocked; these return at once all the same.
        let started = std::time::Instant::now();
        q.changed(&vol("a", 1)).await;
        tokio::time::sleep(Duration::from_millis(20)).await; // the worker takes "a"=1 and blocks
        for bytes in 2..=50 {
            q.changed(&vol("a", bytes)).await;
        }
        q.changed(&vol("b", 7)).await;
        q.removed(&vol("b", 7)).await;
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(q.backlog(), 2, "one pending entry per volume");
        slow.gate.add_permits(100);
        for _ in 0..100 {
            if slow.seen.lock().unwrap().len() == 3 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let seen = slow.seen.lock().unwrap().clone();
        assert_eq!(
            seen,
            vec![
                ("a".into(), 1, true),
                ("a".into(), 50, true),
                ("b".into(), 7, false)
            ],
            "older states are skipped, never delivered after newer ones"
        );
    }

    /// Fails the first `fail` deliveries of each call.
    struct Flaky {
        fail: Mutex<u32>,
        seen: Mutex<Vec<u64>>,
    }

    #[async_trait::async_trait]
    impl VolumeObserver for Flaky {
        async fn changed(&self, vol: &Volume) -> bool {
            self.seen.lock().unwrap().push(vol.capacity_bytes);
            let mut fail = self.fail.lock().unwrap();
            if *fail > 0 {
                *fail -= 1;
                return false;
            }
            true
        }
        async fn removed(&self, _vol: &Volume) -> bool {
            true
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_delivery_is_retried_until_it_lands_unless_superseded() {
        let flaky = Arc::new(Flaky {
            fail: Mutex::new(3),
            seen: Mutex::default(),
        });
        let q = ObserverQueue::spawn(flaky.clone());
        q.changed(&vol("a", 1)).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            *flaky.seen.lock().unwrap(),
            [1, 1, 1, 1],
            "delivered again after each failure, until it landed"
        );
        // A failed delivery is not resent once a newer state is queued.
        *flaky.fail.lock().unwrap() = 1;
        q.changed(&vol("a", 2)).await;
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
        q.changed(&vol("a", 3)).await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(*flaky.seen.lock().unwrap(), [1, 1, 1, 1, 2, 3]);
        assert_eq!(q.backlog(), 0);
    }
}
