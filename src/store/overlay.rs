//! Volume records the store's log holds and redb does not hold yet.
//!
//! A volume change is written to the log (and synced, when it must be
//! durable) and applied to redb later, many changes to one transaction: a
//! redb transaction costs more than the log write, and it grows with the
//! size of the tables (copy-on-write pages, checksums). Until then readers
//! of a single record find it here, and readers of a counter add what the
//! pending changes add to it; a reader of an index has the pending changes
//! applied first (`Store::settle`).

use std::collections::HashMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::domain::volume::Volume;

/// What one change adds to the store's counters, against the record it
/// replaces: allocated bytes, and attachments per node.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Delta {
    pub allocated: i128,
    pub attached: Vec<(String, i64)>,
}

impl Delta {
    /// From `old` (what a reader finds before the change) to `new`.
    pub fn between(old: Option<&Volume>, new: Option<&Volume>) -> Delta {
        let bytes = |v: Option<&Volume>| i128::from(v.map_or(0, |v| v.capacity_bytes));
        let on = |v: Option<&Volume>, node: &str| i64::from(v.is_some_and(|v| v.attached_to(node)));
        let nodes: std::collections::BTreeSet<&String> = [old, new]
            .into_iter()
            .flatten()
            .flat_map(|v| v.nodes.keys())
            .collect();
        let attached = nodes
            .into_iter()
            .map(|node| (node.clone(), on(new, node) - on(old, node)))
            .filter(|(_, d)| *d != 0)
            .collect();
        Delta {
            allocated: bytes(new) - bytes(old),
            attached,
        }
    }
}

/// What every pending change adds to the counters redb holds.
#[derive(Debug, Default)]
pub struct Counts {
    pub allocated: i128,
    pub attached: HashMap<String, i64>,
}

impl Counts {
    pub fn add(&mut self, d: &Delta) {
        self.apply(d, 1);
    }

    fn apply(&mut self, d: &Delta, sign: i64) {
        self.allocated += d.allocated * i128::from(sign);
        for (node, n) in &d.attached {
            let slot = self.attached.entry(node.clone()).or_default();
            *slot += n * sign;
            if *slot == 0 {
                self.attached.remove(node);
            }
        }
    }

    /// Attachments the pending changes add on `node`.
    pub fn attached_on(&self, node: &str) -> i64 {
        self.attached.get(node).copied().unwrap_or(0)
    }
}

#[derive(Default)]
struct Pending {
    /// The latest pending record of each volume; `None` is a removal.
    /// Shared with the log's pending change that wrote it.
    latest: HashMap<String, Option<Arc<Volume>>>,
    counts: Counts,
}

/// Made only when no change is pending: a read of redb's indexes that
/// holds one sees every change logged before it (see `store::index`).
pub struct Settled(());

#[derive(Default)]
pub struct Overlay {
    pending: RwLock<Pending>,
}

impl Overlay {
    fn read(&self) -> RwLockReadGuard<'_, Pending> {
        // Writers replace whole entries: a poisoned map is still consistent.
        self.pending.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Pending> {
        self.pending.write().unwrap_or_else(|p| p.into_inner())
    }

    /// `Some(record)` when a change of volume `id` is pending: the record,
    /// or `None` when it is removed. `None` sends the reader to redb.
    pub fn volume(&self, id: &str) -> Option<Option<Volume>> {
        self.read().latest.get(id).map(|v| v.as_deref().cloned())
    }

    /// Like `volume`, without a copy of the record: for the store's own
    /// reads, which only look.
    pub fn shared(&self, id: &str) -> Option<Option<Arc<Volume>>> {
        self.read().latest.get(id).cloned()
    }

    /// A volume named `name` written by a pending change.
    pub fn volume_named(&self, name: &str) -> Option<Volume> {
        self.read()
            .latest
            .values()
            .flatten()
            .find(|v| v.name == name)
            .map(|v| Volume::clone(v))
    }

    pub fn is_empty(&self) -> bool {
        self.read().latest.is_empty()
    }

    /// `Some` when nothing is pending now.
    pub fn settled(&self) -> Option<Settled> {
        self.is_empty().then_some(Settled(()))
    }

    /// Runs `read` (a read of redb's counters) with what the pending changes
    /// add to them. No commit of pending changes to redb happens meanwhile
    /// (`retire` holds them off), so the two agree.
    pub fn with_counts<T>(&self, read: impl FnOnce(&Counts) -> T) -> T {
        let pending = self.read();
        read(&pending.counts)
    }

    /// Records a pending change of volume `id` (`None`: its removal).
    pub fn add(&self, id: &str, record: Option<&Arc<Volume>>, delta: &Delta) {
        let mut pending = self.write();
        pending.latest.insert(id.to_string(), record.cloned());
        pending.counts.add(delta);
    }

    /// Runs `commit` (redb taking pending changes) with readers held off,
    /// and once it succeeded forgets the changes it applied (their deltas)
    /// and keeps only `remaining` (in log order, the latest wins): a reader
    /// finds each change here or in redb, never in both or neither.
    pub fn retire<'a, T, E>(
        &self,
        commit: impl FnOnce() -> Result<T, E>,
        applied: impl IntoIterator<Item = &'a Delta>,
        remaining: impl IntoIterator<Item = (&'a str, Option<&'a Arc<Volume>>)>,
    ) -> Result<T, E> {
        let mut pending = self.write();
        let committed = commit()?;
        for d in applied {
            pending.counts.apply(d, -1);
        }
        let mut latest = HashMap::new();
        for (id, vol) in remaining {
            latest.insert(id.to_string(), vol.cloned());
        }
        pending.latest = latest;
        Ok(committed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::domain::volume::{sample as vol, with_attachment};

    #[test]
    fn the_latest_change_wins_and_a_removal_hides_the_record() {
        let o = Overlay::default();
        assert!(o.volume("a").is_none(), "nothing pending: read redb");
        let a = Arc::new(vol("a", "pvc-a"));
        o.add("a", Some(&a), &Delta::between(None, Some(&*a)));
        assert_eq!(o.volume_named("pvc-a").map(|v| v.id), Some("a".into()));
        // The store's own reads share the record the change wrote.
        let shared = o.shared("a").flatten().unwrap();
        assert!(Arc::ptr_eq(&shared, &a));
        o.add("a", None, &Delta::between(Some(&*a), None));
        assert_eq!(o.volume("a"), Some(None), "a pending removal answers none");
        assert!(o.volume_named("pvc-a").is_none());
        o.with_counts(|c| assert_eq!((c.allocated, c.attached.len()), (0, 0)));
        let none: [(&str, Option<&Arc<Volume>>); 0] = [];
        o.retire(|| Ok::<(), ()>(()), [], none).unwrap();
        assert!(o.is_empty() && o.volume("a").is_none());
    }

    #[test]
    fn counts_follow_each_change_and_forget_it_once_applied() {
        let o = Overlay::default();
        let a = Arc::new(with_attachment(vol("a", "pvc-a"), "n1"));
        let mut a2 = with_attachment(Volume::clone(&a), "n2");
        a2.nodes.remove("n1");
        a2.capacity_bytes = 300;
        let a2 = Arc::new(a2);
        let first = Delta::between(None, Some(&*a));
        let second = Delta::between(Some(&*a), Some(&*a2));
        assert_eq!(second.allocated, 200);
        assert_eq!(second.attached.len(), 2);
        o.add("a", Some(&a), &first);
        o.add("a", Some(&a2), &second);
        o.with_counts(|c| {
            assert_eq!(c.allocated, 300);
            assert_eq!((c.attached_on("n1"), c.attached_on("n2")), (0, 1));
        });
        // A failed commit changes nothing.
        assert!(o.retire(|| Err::<(), _>("no"), [&first], []).is_err());
        o.with_counts(|c| assert_eq!(c.allocated, 300));
        // redb took the first change; the second is still pending.
        o.retire(|| Ok::<(), ()>(()), [&first], [("a", Some(&a2))])
            .unwrap();
        o.with_counts(|c| {
            assert_eq!(c.allocated, 200);
            assert_eq!((c.attached_on("n1"), c.attached_on("n2")), (-1, 1));
        });
        assert_eq!(o.volume("a"), Some(Some(Volume::clone(&a2))));
    }
}
