//! Decouples volume observers from the RPC path. An observer that talks to a
//! remote API (the RelayVolume mirror) may be slow or down; RPCs must not
//! wait for it. Changes are queued per volume, latest wins (the observer
//! always sees a volume's newest state, never an older one after a newer
//! one), and one worker delivers them in order.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use crate::driver::VolumeObserver;
use crate::volume::Volume;

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
                    p.order.pop_front().and_then(|id| p.latest.remove(&id))
                };
                match next {
                    Some(Event::Changed(v)) => inner.changed(&v).await,
                    Some(Event::Removed(v)) => inner.removed(&v).await,
                    None => w.notified().await,
                }
            }
        });
        ObserverQueue { pending, wake }
    }

    fn push(&self, id: &str, event: Event) {
        let mut p = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        if p.latest.insert(id.to_string(), event).is_none() {
            p.order.push_back(id.to_string());
        }
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

#[tonic::async_trait]
impl VolumeObserver for ObserverQueue {
    async fn changed(&self, vol: &Volume) {
        self.push(&vol.id, Event::Changed(vol.clone()));
    }

    async fn removed(&self, vol: &Volume) {
        self.push(&vol.id, Event::Removed(vol.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::{Backing, Lifecycle};
    use std::collections::BTreeMap;
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

    #[tonic::async_trait]
    impl VolumeObserver for Slow {
        async fn changed(&self, vol: &Volume) {
            let _ = self.gate.acquire().await.map(|p| p.forget());
            self.seen
                .lock()
                .unwrap()
                .push((vol.id.clone(), vol.capacity_bytes, true));
        }
        async fn removed(&self, vol: &Volume) {
            let _ = self.gate.acquire().await.map(|p| p.forget());
            self.seen
                .lock()
                .unwrap()
                .push((vol.id.clone(), vol.capacity_bytes, false));
        }
    }

    fn vol(id: &str, bytes: u64) -> Volume {
        Volume {
            id: id.into(),
            name: id.into(),
            capacity_bytes: bytes,
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
}
