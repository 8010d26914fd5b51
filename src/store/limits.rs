//! What a volume write must stay within: attachments on a node and the
//! bytes allocated. Checked in two places, both below the `Store`: as the
//! journal logs a volume change that waits for redb (`Journal::plan`), and
//! as the tables apply one that does not wait (`tables::write_volume`).

use super::error::{StoreError, StoreResult};
use crate::domain::volume::Volume;

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
    pub(super) fn check(
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::domain::volume::sample as vol;
    use crate::store::Store;

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
}
