//! What the directory pool of earlier builds left in `pool/`.
//!
//! Earlier builds made empty directory volumes ahead of their creates in
//! `pool/a` and `pool/b`, and a create renamed one into `volumes/` with no
//! sync of its own, its durable record standing for the rename. That saved
//! 2-4 % of a lifecycle at one client (below what a mechanism that can
//! misjudge a directory at start-up must earn) and is gone; what it left is
//! settled once at start-up: an entry a record owns (a rename a power cut
//! undid) goes into place again before any call; any other goes to the
//! trash, never handed out, since it may be a deleted volume's directory.

use std::fs;
use std::io;
use std::path::PathBuf;
use std::sync::Mutex;

use crate::rt::unpoisoned::lock;

const HALVES: [&str; 2] = ["a", "b"];

pub struct PoolLeftovers {
    dir: PathBuf,
    /// Until start-up settles them.
    ids: Mutex<Vec<String>>,
}

impl PoolLeftovers {
    /// Notes the entries an earlier build left in `dir` (absent: none).
    pub fn open(dir: PathBuf) -> io::Result<PoolLeftovers> {
        let mut ids = Vec::new();
        for half in HALVES.map(|h| dir.join(h)) {
            let entries = match fs::read_dir(&half) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            for entry in entries {
                let entry = entry?;
                match entry.file_name().into_string() {
                    Ok(name) if is_entry_name(&name) => ids.push(name),
                    _ => {
                        tracing::warn!(path = %entry.path().display(), "unexpected entry in the directory pool; left alone")
                    }
                }
            }
        }
        ids.sort();
        Ok(PoolLeftovers {
            dir,
            ids: Mutex::new(ids),
        })
    }

    /// The ids of the entries left, once.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *lock(&self.ids))
    }

    /// Where entry `id` is, if it is still there.
    pub fn entry(&self, id: &str) -> Option<PathBuf> {
        if !is_entry_name(id) {
            return None;
        }
        HALVES
            .iter()
            .map(|half| self.dir.join(half).join(id))
            .find(|p| fs::symlink_metadata(p).is_ok())
    }

    /// Removes the emptied pool directories (left alone if anything is in
    /// them).
    pub fn remove_empty(&self) {
        for half in HALVES {
            let _ = fs::remove_dir(self.dir.join(half));
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

/// Names the pool gave its entries: volume ids.
fn is_entry_name(name: &str) -> bool {
    name.strip_prefix("vol-")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A fresh local volume id.
pub fn new_volume_id() -> String {
    format!("vol-{}", uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leftovers_are_listed_once_and_anything_else_is_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let none = PoolLeftovers::open(tmp.path().join("pool")).unwrap();
        assert!(none.take().is_empty(), "no pool: nothing left");
        let (a, b) = (new_volume_id(), new_volume_id());
        fs::create_dir_all(tmp.path().join("pool/a").join(&a)).unwrap();
        fs::create_dir_all(tmp.path().join("pool/b").join(&b)).unwrap();
        fs::create_dir_all(tmp.path().join("pool/b/not-an-id")).unwrap();
        let left = PoolLeftovers::open(tmp.path().join("pool")).unwrap();
        let mut expect = vec![a.clone(), b.clone()];
        expect.sort();
        assert_eq!(left.take(), expect);
        assert!(left.take().is_empty(), "handed over once");
        assert_eq!(left.entry(&a), Some(tmp.path().join("pool/a").join(&a)));
        assert_eq!(left.entry("../x"), None);
        fs::remove_dir(tmp.path().join("pool/a").join(&a)).unwrap();
        fs::remove_dir(tmp.path().join("pool/b").join(&b)).unwrap();
        left.remove_empty();
        assert!(tmp.path().join("pool/b/not-an-id").is_dir());
        assert!(!tmp.path().join("pool/a").exists());
    }
}
