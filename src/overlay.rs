//! Volume records the store's log holds and redb does not hold yet.
//!
//! A lazy change (a node call's intent or outcome) is written to the log
//! and applied to redb later, with the next round that commits anyway:
//! a redb transaction costs more than the log write, and it grows with the
//! size of the tables (copy-on-write pages, checksums). Until then readers
//! of a single record find it here; a reader of an index has the pending
//! changes applied first (`Store::settle`).

use std::collections::HashMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::volume::Volume;

/// The latest pending record of each volume; `None` is a pending removal.
#[derive(Default)]
pub struct Overlay {
    latest: RwLock<HashMap<String, Option<Volume>>>,
}

impl Overlay {
    fn read(&self) -> RwLockReadGuard<'_, HashMap<String, Option<Volume>>> {
        // Writers replace whole entries: a poisoned map is still consistent.
        self.latest.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, HashMap<String, Option<Volume>>> {
        self.latest.write().unwrap_or_else(|p| p.into_inner())
    }

    /// `Some(record)` when a change of volume `id` is pending: the record,
    /// or `None` when it is removed. `None` sends the reader to redb.
    pub fn volume(&self, id: &str) -> Option<Option<Volume>> {
        self.read().get(id).cloned()
    }

    /// A volume named `name` written by a pending change.
    pub fn volume_named(&self, name: &str) -> Option<Volume> {
        self.read()
            .values()
            .flatten()
            .find(|v| v.name == name)
            .cloned()
    }

    /// Every pending change: the latest record of each volume, or `None`
    /// for a removal.
    pub fn pending(&self) -> Vec<(String, Option<Volume>)> {
        self.read()
            .iter()
            .map(|(id, v)| (id.clone(), v.clone()))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.read().is_empty()
    }

    pub fn put(&self, vol: &Volume) {
        self.write().insert(vol.id.clone(), Some(vol.clone()));
    }

    pub fn remove(&self, id: &str) {
        self.write().insert(id.to_string(), None);
    }

    /// Forgets every pending change, once redb has committed them: a
    /// reader then finds them there.
    pub fn clear(&self) {
        self.write().clear();
    }

    /// Keeps only `pending` (in log order, the latest wins), once redb has
    /// committed the changes before them. The map is swapped whole: a
    /// reader never finds an entry missing that redb does not hold yet.
    pub fn keep_only<'a>(&self, pending: impl IntoIterator<Item = (&'a str, Option<&'a Volume>)>) {
        let mut latest = HashMap::new();
        for (id, vol) in pending {
            latest.insert(id.to_string(), vol.cloned());
        }
        *self.write() = latest;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::volume::sample as vol;

    #[test]
    fn the_latest_change_wins_and_a_removal_hides_the_record() {
        let o = Overlay::default();
        assert!(o.volume("a").is_none(), "nothing pending: read redb");
        o.put(&vol("a", "pvc-a"));
        assert_eq!(o.volume_named("pvc-a").map(|v| v.id), Some("a".into()));
        o.remove("a");
        assert_eq!(o.volume("a"), Some(None), "a pending removal answers none");
        assert!(o.volume_named("pvc-a").is_none());
        o.clear();
        assert!(o.is_empty() && o.volume("a").is_none());
    }
}
