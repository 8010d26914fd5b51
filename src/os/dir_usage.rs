//! What a directory volume holds. A directory has no filesystem of its own,
//! so statvfs on it reports the whole state-dir filesystem (hundreds of
//! gigabytes for a 64 MiB claim); the kubelet's volume stats and a pod's
//! eviction decisions need the volume's own figure, counted file by file.

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Bytes on disk and entries under one directory tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirUsage {
    pub bytes: u64,
    pub entries: u64,
}

/// The kubelet asks about every minute; a tree too large to count within
/// these bounds gets no byte figure rather than a wrong one.
pub const WALK_BUDGET: Duration = Duration::from_secs(20);
pub const WALK_MAX_ENTRIES: u64 = 2_000_000;

/// Counts the allocated bytes (st_blocks, so sparse files count what they
/// hold) of everything under `root` on `root`'s own filesystem: a mount
/// inside the volume belongs to something else. A file with several links
/// counts once. `None` when the tree exceeds `budget` or `max_entries`.
pub fn measure(root: &Path, budget: Duration, max_entries: u64) -> io::Result<Option<DirUsage>> {
    let started = Instant::now();
    let top = std::fs::symlink_metadata(root)?;
    let dev = top.dev();
    let mut usage = DirUsage {
        bytes: top.blocks() * 512,
        entries: 0,
    };
    let mut linked: HashSet<(u64, u64)> = HashSet::new();
    let mut pending: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            // Removed by the pod while counting: nothing left to count.
            Err(e) if e.kind() == io::ErrorKind::NotFound && dir != root => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = match entry {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            usage.entries += 1;
            if usage.entries > max_entries || started.elapsed() > budget {
                return Ok(None);
            }
            let meta = match entry.metadata() {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            };
            if meta.dev() != dev {
                continue;
            }
            if !meta.is_dir() && meta.nlink() > 1 && !linked.insert((meta.dev(), meta.ino())) {
                continue;
            }
            usage.bytes += meta.blocks() * 512;
            if meta.is_dir() {
                pending.push(entry.path());
            }
        }
    }
    Ok(Some(usage))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn write(path: &Path, bytes: usize) {
        let mut f = std::fs::File::create(path).unwrap();
        f.write_all(&vec![7u8; bytes]).unwrap();
        f.sync_all().unwrap();
    }

    #[test]
    fn counts_allocated_bytes_once_per_file_and_stops_at_its_bounds() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        write(&root.join("one"), 1 << 20);
        write(&root.join("a/b/two"), 3 << 20);
        std::fs::hard_link(root.join("one"), root.join("a/one-again")).unwrap();
        // Sparse: a large length, almost nothing allocated.
        let sparse = std::fs::File::create(root.join("sparse")).unwrap();
        sparse.set_len(1 << 30).unwrap();
        std::os::unix::fs::symlink("/", root.join("a/escape")).unwrap();

        let u = measure(root, WALK_BUDGET, WALK_MAX_ENTRIES)
            .unwrap()
            .unwrap();
        assert_eq!(u.entries, 7, "{u:?}");
        let data = 4u64 << 20;
        assert!(u.bytes >= data, "{u:?}");
        // Directories and the symlink take a few blocks each; the hard link
        // and the sparse file's length add nothing, the symlink is not followed.
        assert!(u.bytes < data + (256 << 10), "{u:?}");

        assert_eq!(measure(root, WALK_BUDGET, 3).unwrap(), None);
        assert_eq!(
            measure(root, Duration::ZERO, WALK_MAX_ENTRIES).unwrap(),
            None
        );
        assert!(measure(&root.join("missing"), WALK_BUDGET, 10).is_err());
    }
}
