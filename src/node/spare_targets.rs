//! Empty directories kept for the target paths of mount-access publications.
//!
//! The spec has the plugin create a mount-access target on NodePublishVolume
//! and delete it on NodeUnpublishVolume. A `mkdir` and an `rmdir` for each
//! publication cost more than the bind mount between them on ext4 without a
//! journal, where a `mkdir` skips every inode freed in the last minute,
//! reading each one's deletion time: at 64 clients the targets' `mkdir` was
//! a tenth of the server's CPU. An unpublished target, once unmounted and
//! found empty, is moved into `spare/` in the state directory instead, and
//! the next publication on the same filesystem renames it to its target. No
//! inode is freed or allocated, and the rename touches only two entries.
//!
//! A target is only kept if it is a plain directory on the state
//! directory's filesystem, with the owner and mode a new one gets here, and
//! holds nothing: what was put in it while nothing was mounted on it would
//! otherwise turn up under another target (a kubelet's clean-up of that pod
//! would then fail on a directory that is not empty). Its extended
//! attributes are not compared: while it is a target a volume is mounted
//! over it and nobody sees them. Between the check and the rename only the
//! node's root could write in it; nothing else writes in `spare/` (0700).
//!
//! Nothing here is synced, as the `mkdir` and `rmdir` were not: a power cut
//! that undoes a move leaves an empty directory at a target or one more in
//! `spare/`, as an undone `rmdir` or `mkdir` would. A target on another
//! filesystem, or one that fails a check, is made and removed as before.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use nix::fcntl::{renameat2, RenameFlags, AT_FDCWD};

use crate::unpoisoned::lock;

/// Spares kept at most: as many as publications a busy node unpublishes
/// and publishes again at once; the rest are removed as before.
const KEEP: usize = 64;

/// The node's spares, once `install` has run (never, in node-less modes:
/// every target is then made and removed as before).
static SPARES: OnceLock<SpareTargets> = OnceLock::new();

pub struct SpareTargets {
    dir: PathBuf,
    /// What a new target directory is like here: its filesystem, owner and
    /// mode (this process's umask applied).
    like: Like,
    free: Mutex<Vec<PathBuf>>,
    next: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Like {
    dev: u64,
    uid: u32,
    gid: u32,
    mode: u32,
}

impl Like {
    fn of(m: &fs::Metadata) -> Self {
        Like {
            dev: m.dev(),
            uid: m.uid(),
            gid: m.gid(),
            mode: m.mode() & 0o7777,
        }
    }
}

/// Sets up the node's spares in `dir`. A failure only means every target
/// is made and removed as before; it is logged, not returned.
pub fn install(dir: &Path) {
    match SpareTargets::open(dir) {
        Ok(spares) => {
            let _ = SPARES.set(spares);
        }
        Err(e) => tracing::warn!(
            dir = %dir.display(),
            error = %e,
            "no spare target directories: each target is made and removed"
        ),
    }
}

/// Puts a spare directory at `target` (which the caller has checked).
/// False when none was placed: the caller makes the target itself.
pub fn place(target: &Path) -> bool {
    SPARES.get().is_some_and(|s| s.place(target))
}

/// Moves the unmounted directory at `target` in as a spare. False when it
/// was left where it is: the caller removes it itself.
pub fn take_back(target: &Path) -> bool {
    SPARES.get().is_some_and(|s| s.take_back(target))
}

impl SpareTargets {
    /// Opens `dir` (made, 0700, if missing). What an earlier run left there
    /// is kept if it still passes the checks a returned target passes. One
    /// new directory is made to learn what a new target is like.
    pub fn open(dir: &Path) -> std::io::Result<Self> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        let mut left = Vec::new();
        let mut next = 0u64;
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            if let Some(n) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<u64>().ok())
            {
                next = next.max(n.saturating_add(1));
            }
            left.push(entry.path());
        }
        let first = dir.join(next.to_string());
        fs::create_dir(&first)?;
        let like = Like::of(&fs::symlink_metadata(&first)?);
        let spares = SpareTargets {
            dir: dir.to_path_buf(),
            like,
            free: Mutex::new(vec![first]),
            next: AtomicU64::new(next.saturating_add(1)),
        };
        let mut kept = lock(&spares.free);
        let mut passed_over = 0usize;
        for path in left {
            if !spares.unused(&path) {
                passed_over += 1;
            } else if kept.len() < KEEP {
                kept.push(path);
            } else {
                // One more than are kept (the one just made): empty, so
                // removing it loses nothing.
                let _ = fs::remove_dir(&path);
            }
        }
        if passed_over > 0 {
            tracing::warn!(
                dir = %dir.display(),
                passed_over,
                "entries in the spare target directory are left alone: not empty or not like a new target"
            );
        }
        drop(kept);
        Ok(spares)
    }

    pub fn place(&self, target: &Path) -> bool {
        let Some(spare) = lock(&self.free).pop() else {
            return false;
        };
        match renameat2(
            AT_FDCWD,
            &spare,
            AT_FDCWD,
            target,
            RenameFlags::RENAME_NOREPLACE,
        ) {
            Ok(()) => true,
            Err(_) => {
                // The target is there already, its parent is missing, or it
                // is on another filesystem: the spare stays one.
                if fs::symlink_metadata(&spare).is_ok() {
                    lock(&self.free).push(spare);
                }
                false
            }
        }
    }

    pub fn take_back(&self, target: &Path) -> bool {
        if lock(&self.free).len() >= KEEP || !self.unused(target) {
            return false;
        }
        let spare = self
            .dir
            .join(self.next.fetch_add(1, Ordering::Relaxed).to_string());
        match renameat2(
            AT_FDCWD,
            target,
            AT_FDCWD,
            &spare,
            RenameFlags::RENAME_NOREPLACE,
        ) {
            Ok(()) => {
                lock(&self.free).push(spare);
                true
            }
            Err(_) => false,
        }
    }

    /// Whether `path` is a directory like a new target here, no mount
    /// point, with nothing in it.
    fn unused(&self, path: &Path) -> bool {
        let Ok(meta) = fs::symlink_metadata(path) else {
            return false;
        };
        // A directory's link count is two plus one per subdirectory; a
        // mount point shows the mounted root, on another device or as
        // another inode with entries (checked below).
        meta.is_dir()
            && meta.nlink() == 2
            && Like::of(&meta) == self.like
            && fs::read_dir(path).is_ok_and(|mut d| d.next().is_none())
    }

    #[cfg(test)]
    fn count(&self) -> usize {
        lock(&self.free).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn ino(p: &Path) -> u64 {
        fs::symlink_metadata(p).unwrap().ino()
    }

    #[test]
    fn an_unpublished_target_is_the_next_one_without_a_new_inode() {
        let tmp = tempfile::tempdir().unwrap();
        let spares = SpareTargets::open(&tmp.path().join("spare")).unwrap();
        let first = tmp.path().join("pod-a/target");
        fs::create_dir(tmp.path().join("pod-a")).unwrap();
        assert!(spares.place(&first));
        assert!(first.is_dir());
        assert_eq!(spares.count(), 0);
        let inode = ino(&first);

        // None left: the caller makes its own.
        let second = tmp.path().join("pod-b-target");
        assert!(!spares.place(&second));
        assert!(!second.exists());

        assert!(spares.take_back(&first));
        assert!(!first.exists(), "the target path is gone, as the spec asks");
        assert_eq!(spares.count(), 1);
        assert!(spares.place(&second));
        assert_eq!(ino(&second), inode, "the same directory serves again");
        assert_eq!(
            fs::metadata(&second).unwrap().permissions().mode() & 0o7777,
            spares.like.mode
        );
    }

    #[test]
    fn a_target_that_holds_anything_or_is_no_plain_directory_stays_where_it_is() {
        let tmp = tempfile::tempdir().unwrap();
        let spares = SpareTargets::open(&tmp.path().join("spare")).unwrap();
        let with_file = tmp.path().join("with-file");
        fs::create_dir(&with_file).unwrap();
        fs::write(with_file.join("data"), b"someone's").unwrap();
        let with_dir = tmp.path().join("with-dir");
        fs::create_dir_all(with_dir.join("sub")).unwrap();
        let other_mode = tmp.path().join("other-mode");
        fs::create_dir(&other_mode).unwrap();
        fs::set_permissions(&other_mode, fs::Permissions::from_mode(0o1777)).unwrap();
        let file = tmp.path().join("block-target");
        fs::write(&file, b"").unwrap();
        let link = tmp.path().join("link");
        let empty = tmp.path().join("empty");
        fs::create_dir(&empty).unwrap();
        std::os::unix::fs::symlink(&empty, &link).unwrap();
        for path in [&with_file, &with_dir, &other_mode, &file, &link] {
            assert!(!spares.take_back(path), "{}", path.display());
            assert!(fs::symlink_metadata(path).is_ok(), "{}", path.display());
        }
        assert_eq!(fs::read(with_file.join("data")).unwrap(), b"someone's");
        assert_eq!(spares.count(), 1, "only the one made at open");
        assert!(!spares.take_back(&tmp.path().join("absent")));
    }

    #[test]
    fn a_place_that_cannot_be_made_keeps_the_spare_and_a_vanished_spare_is_forgotten() {
        let tmp = tempfile::tempdir().unwrap();
        let spares = SpareTargets::open(&tmp.path().join("spare")).unwrap();
        // Its parent is missing: the caller makes the whole path.
        assert!(!spares.place(&tmp.path().join("no/parent/target")));
        // Something is there already: it is neither replaced nor reused.
        let there = tmp.path().join("there");
        fs::create_dir(&there).unwrap();
        fs::write(there.join("x"), b"1").unwrap();
        assert!(!spares.place(&there));
        assert_eq!(fs::read(there.join("x")).unwrap(), b"1");
        assert_eq!(spares.count(), 1);
        // A spare removed from under the node is forgotten, not tried by
        // every later publication.
        fs::remove_dir(
            fs::read_dir(&spares.dir)
                .unwrap()
                .next()
                .unwrap()
                .unwrap()
                .path(),
        )
        .unwrap();
        let target = tmp.path().join("target");
        assert!(!spares.place(&target));
        assert!(!target.exists());
        assert_eq!(spares.count(), 0);
    }

    // The name a take-back moves to is taken (not by this node): the
    // target stays for the caller to remove, and what has the name stays.
    #[test]
    fn a_taken_spare_name_leaves_the_target_where_it_is() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("spare");
        let spares = SpareTargets::open(&dir).unwrap();
        let next = spares.next.load(Ordering::Relaxed).to_string();
        // An empty directory: a plain rename would replace it.
        fs::create_dir(dir.join(&next)).unwrap();
        let in_the_way = ino(&dir.join(&next));
        let target = tmp.path().join("target");
        fs::create_dir(&target).unwrap();
        assert!(!spares.take_back(&target));
        assert!(target.is_dir());
        assert_eq!(ino(&dir.join(&next)), in_the_way);
        assert_eq!(spares.count(), 1);
        // The next name is free: the one after serves.
        assert!(spares.take_back(&target));
        assert_eq!(spares.count(), 2);
    }

    #[test]
    fn no_more_than_are_kept_and_what_a_restart_finds_is_checked_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("spare");
        let spares = SpareTargets::open(&dir).unwrap();
        for i in 0..KEEP + 3 {
            let t = tmp.path().join(format!("t{i}"));
            fs::create_dir(&t).unwrap();
            let kept = spares.take_back(&t);
            assert_eq!(kept, i + 1 < KEEP, "{i}");
            assert_eq!(t.exists(), !kept);
        }
        assert_eq!(spares.count(), KEEP);
        drop(spares);
        // A spare something was written in since is not used again.
        let spoiled = fs::read_dir(&dir).unwrap().next().unwrap().unwrap().path();
        fs::write(spoiled.join("stray"), b"").unwrap();
        let again = SpareTargets::open(&dir).unwrap();
        assert_eq!(again.count(), KEEP, "the kept ones, up to the bound");
        let placed: Vec<PathBuf> = (0..KEEP)
            .map(|i| tmp.path().join(format!("p{i}")))
            .collect();
        for t in &placed {
            assert!(again.place(t));
            assert!(fs::read_dir(t).unwrap().next().is_none(), "{}", t.display());
        }
        assert!(spoiled.join("stray").exists(), "passed over, not removed");
        for t in &placed {
            assert!(again.take_back(t));
        }
        drop(again);
        let entries = || fs::read_dir(&dir).unwrap().count();
        let before = entries();
        drop(SpareTargets::open(&dir).unwrap());
        assert_eq!(entries(), before, "restarts do not pile up directories");
    }
}
