//! What a volume holds, as both movers see it: a walk of a filesystem
//! volume (files, directories, symlinks, hard links, devices, fifos, with
//! owners, modes, timestamps and xattrs) or of a block device, each file
//! or device as 1 MiB chunks with BLAKE3 hashes. The walk is the same code
//! on both ends, in the same order (names sorted bytewise), so the source's
//! digest of what it read and the target's digest of what it holds agree
//! exactly when the trees do: that comparison is what lets a copy serve.

use std::collections::HashMap;
use std::fs::{File, Metadata};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Chunk size: the unit of hashing, of a delta and of a message.
pub const CHUNK: usize = 1 << 20;
/// Deepest directory nesting walked (PATH_MAX bounds real trees well below).
const MAX_DEPTH: usize = 2048;
/// An SELinux label belongs to the cluster it is in, not to the data.
const SKIPPED_XATTRS: &[&str] = &["security.selinux"];

pub type Hash = [u8; 32];

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Dir,
    /// A regular file; its chunks follow.
    File {
        size: u64,
    },
    Symlink {
        #[serde(with = "serde_bytes")]
        target: Vec<u8>,
    },
    /// Another name of the file first walked at `to`.
    HardLink {
        #[serde(with = "serde_bytes")]
        to: Vec<u8>,
    },
    Fifo,
    Device {
        block: bool,
        rdev: u64,
    },
    /// A block volume: the whole device; its chunks follow.
    Volume {
        size: u64,
    },
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Relative to the volume's root, bytes of the name; empty: the root.
    #[serde(with = "serde_bytes")]
    pub path: Vec<u8>,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub mtime: (i64, i64),
    /// Kept, not compared: reading a file changes it.
    pub atime: (i64, i64),
    pub xattrs: Vec<Xattr>,
}

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Xattr {
    pub name: String,
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
}

impl Entry {
    pub fn rel(&self) -> &Path {
        Path::new(std::ffi::OsStr::from_bytes(&self.path))
    }

    pub fn has_chunks(&self) -> Option<u64> {
        match self.kind {
            Kind::File { size } | Kind::Volume { size } => Some(size),
            _ => None,
        }
    }
}

/// A relative path taken from the other end: plain names only, no `..`,
/// no root, no NUL; the root itself is the empty path.
pub fn checked_rel(bytes: &[u8]) -> Result<PathBuf, String> {
    if bytes.contains(&0) || bytes.len() > 4096 {
        return Err(format!(
            "path {:?} is not a usable relative path",
            String::from_utf8_lossy(bytes)
        ));
    }
    let path = Path::new(std::ffi::OsStr::from_bytes(bytes));
    if path
        .components()
        .any(|c| !matches!(c, Component::Normal(_)))
    {
        return Err(format!(
            "path {:?} leaves the volume (only plain names are taken)",
            path.display()
        ));
    }
    Ok(path.to_path_buf())
}

pub fn metadata_entry(path: Vec<u8>, full: &Path, meta: &Metadata) -> std::io::Result<Entry> {
    let ft = meta.file_type();
    let kind = if ft.is_dir() {
        Kind::Dir
    } else if ft.is_file() {
        Kind::File { size: meta.len() }
    } else if ft.is_symlink() {
        Kind::Symlink {
            target: std::fs::read_link(full)?.as_os_str().as_bytes().to_vec(),
        }
    } else if ft.is_fifo() {
        Kind::Fifo
    } else if ft.is_block_device() || ft.is_char_device() {
        Kind::Device {
            block: ft.is_block_device(),
            rdev: meta.rdev(),
        }
    } else {
        return Err(std::io::Error::other("a socket is not data"));
    };
    Ok(Entry {
        path,
        kind,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
        atime: (meta.atime(), meta.atime_nsec()),
        xattrs: xattrs_of(full)?,
    })
}

fn xattrs_of(full: &Path) -> std::io::Result<Vec<Xattr>> {
    let mut out = Vec::new();
    let names = match xattr::list(full) {
        Ok(n) => n,
        // A filesystem without xattrs has none to keep.
        Err(e) if e.raw_os_error() == Some(nix::libc::ENOTSUP) => return Ok(out),
        Err(e) => return Err(e),
    };
    for name in names {
        let Some(name) = name.to_str().map(str::to_string) else {
            continue;
        };
        if SKIPPED_XATTRS.contains(&name.as_str()) {
            continue;
        }
        if let Some(value) = xattr::get(full, &name)? {
            out.push(Xattr { name, value });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// What a visit sees: an entry, and for a file or volume its chunks in
/// order (hash and bytes; the bytes only where the visitor asks for them).
pub trait Visit {
    fn entry(&mut self, entry: &Entry) -> std::io::Result<()>;
    /// Chunk `index` of the current file or volume, its hash and bytes.
    fn chunk(&mut self, index: u64, hash: &Hash, bytes: &[u8]) -> std::io::Result<()>;
    /// After the last chunk of a file or volume.
    fn end_of(&mut self, _entry: &Entry) -> std::io::Result<()> {
        Ok(())
    }
}

/// The digest both ends compare: every entry but its atime, with its
/// chunks' hashes, in walk order.
#[derive(Default)]
pub struct Digest {
    hasher: blake3::Hasher,
    pub entries: u64,
    pub bytes: u64,
}

impl Digest {
    pub fn entry(&mut self, e: &Entry) {
        let mut compared = e.clone();
        compared.atime = (0, 0);
        // postcard of a value is deterministic.
        if let Ok(b) = postcard::to_stdvec(&compared) {
            self.hasher.update(&(b.len() as u64).to_le_bytes());
            self.hasher.update(&b);
        }
        self.entries += 1;
    }

    pub fn chunk(&mut self, hash: &Hash, len: usize) {
        self.hasher.update(hash);
        self.bytes += len as u64;
    }

    pub fn finish(&self) -> Hash {
        *self.hasher.finalize().as_bytes()
    }
}

pub fn hash(bytes: &[u8]) -> Hash {
    *blake3::hash(bytes).as_bytes()
}

/// Walks the filesystem tree at `root` in the order both ends share,
/// calling `visit` for each entry and chunk. A file that vanishes during
/// the walk (a live source) is left out.
pub fn walk_tree(root: &Path, visit: &mut dyn Visit) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(root)?;
    let mut links: HashMap<(u64, u64), Vec<u8>> = HashMap::new();
    let entry = metadata_entry(Vec::new(), root, &meta)?;
    visit.entry(&entry)?;
    walk_dir(root, &mut Vec::new(), visit, &mut links, 0)
}

fn walk_dir(
    root: &Path,
    rel: &mut Vec<u8>,
    visit: &mut dyn Visit,
    links: &mut HashMap<(u64, u64), Vec<u8>>,
    depth: usize,
) -> std::io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(std::io::Error::other(format!(
            "directories nest deeper than {MAX_DEPTH}"
        )));
    }
    let dir = root.join(std::ffi::OsStr::from_bytes(rel));
    let mut names: Vec<Vec<u8>> = match std::fs::read_dir(&dir) {
        Ok(rd) => rd
            .filter_map(Result::ok)
            .map(|d| d.file_name().as_bytes().to_vec())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    names.sort();
    for name in names {
        let len = rel.len();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(&name);
        let full = root.join(std::ffi::OsStr::from_bytes(rel));
        let result = walk_one(root, rel, &full, visit, links, depth);
        rel.truncate(len);
        result?;
    }
    Ok(())
}

fn walk_one(
    root: &Path,
    rel: &mut Vec<u8>,
    full: &Path,
    visit: &mut dyn Visit,
    links: &mut HashMap<(u64, u64), Vec<u8>>,
    depth: usize,
) -> std::io::Result<()> {
    let meta = match std::fs::symlink_metadata(full) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if meta.file_type().is_socket() {
        return Ok(());
    }
    let mut entry = match metadata_entry(rel.clone(), full, &meta) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if meta.is_file() && meta.nlink() > 1 {
        let key = (meta.dev(), meta.ino());
        if let Some(first) = links.get(&key) {
            entry.kind = Kind::HardLink { to: first.clone() };
            entry.xattrs.clear();
            return visit.entry(&entry);
        }
        links.insert(key, rel.clone());
    }
    let is_dir = meta.is_dir();
    if let Kind::File { size } = entry.kind {
        let file = match File::open(full) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        visit.entry(&entry)?;
        chunks_of(file, size, visit)?;
        visit.end_of(&entry)?;
        return Ok(());
    }
    visit.entry(&entry)?;
    if is_dir {
        walk_dir(root, rel, visit, links, depth + 1)?;
    }
    Ok(())
}

/// Reads `size` bytes of `src` as chunks (a file shorter than it says by
/// now ends early; the digest then differs, as it must).
pub fn chunks_of(mut src: impl Read, size: u64, visit: &mut dyn Visit) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let mut left = size;
    let mut index = 0u64;
    while left > 0 {
        let want = (left as usize).min(CHUNK);
        let mut got = 0;
        while got < want {
            match src.read(&mut buf[got..want])? {
                0 => break,
                n => got += n,
            }
        }
        if got == 0 {
            break;
        }
        let h = hash(&buf[..got]);
        visit.chunk(index, &h, &buf[..got])?;
        left -= got as u64;
        index += 1;
        if got < want {
            break;
        }
    }
    Ok(())
}

/// The size of a block device (or of a file standing for one in tests).
pub fn device_size(path: &Path) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f = File::open(path)?;
    f.seek(SeekFrom::End(0))
}

/// Walks a block volume: one entry, its chunks; its first `len` bytes
/// where given (a target's device may be larger than the source's).
pub fn walk_device(path: &Path, len: Option<u64>, visit: &mut dyn Visit) -> std::io::Result<()> {
    let size = device_size(path)?;
    let size = len.map_or(size, |l| l.min(size));
    let entry = Entry {
        path: Vec::new(),
        kind: Kind::Volume { size },
        mode: 0,
        uid: 0,
        gid: 0,
        mtime: (0, 0),
        atime: (0, 0),
        xattrs: Vec::new(),
    };
    visit.entry(&entry)?;
    chunks_of(File::open(path)?, size, visit)?;
    visit.end_of(&entry)
}

/// Bytes a walk reads: the sizes of the regular files (or the device).
pub fn total_bytes(place: &Place) -> std::io::Result<u64> {
    fn du(dir: &Path, depth: usize) -> u64 {
        if depth > MAX_DEPTH {
            return 0;
        }
        let Ok(rd) = std::fs::read_dir(dir) else {
            return 0;
        };
        rd.filter_map(Result::ok)
            .map(|d| match d.file_type() {
                Ok(t) if t.is_dir() => du(&d.path(), depth + 1),
                Ok(t) if t.is_file() => d.metadata().map(|m| m.len()).unwrap_or(0),
                _ => 0,
            })
            .sum()
    }
    match place {
        Place::Tree(p) => Ok(du(p, 0)),
        Place::Device(p, len) => Ok(device_size(p)?.min(len.unwrap_or(u64::MAX))),
    }
}

/// What a volume holds at a place: a tree or a device.
#[derive(Debug, Clone)]
pub enum Place {
    Tree(PathBuf),
    /// A block device, and how much of it is the volume's (None: all).
    Device(PathBuf, Option<u64>),
}

impl Place {
    pub fn walk(&self, visit: &mut dyn Visit) -> std::io::Result<()> {
        match self {
            Place::Tree(p) => walk_tree(p, visit),
            Place::Device(p, len) => walk_device(p, *len, visit),
        }
    }
}

/// The digest and per-file chunk hashes of a place, read whole.
pub struct Summary {
    pub digest: Hash,
    pub entries: u64,
    pub bytes: u64,
    /// Path → (size, chunk hashes) of every file (or the volume).
    pub files: Vec<(Vec<u8>, u64, Vec<Hash>)>,
}

pub fn summarize(place: &Place) -> std::io::Result<Summary> {
    struct S {
        digest: Digest,
        files: Vec<(Vec<u8>, u64, Vec<Hash>)>,
    }
    impl Visit for S {
        fn entry(&mut self, e: &Entry) -> std::io::Result<()> {
            self.digest.entry(e);
            if let Some(size) = e.has_chunks() {
                self.files.push((e.path.clone(), size, Vec::new()));
            }
            Ok(())
        }
        fn chunk(&mut self, _i: u64, h: &Hash, b: &[u8]) -> std::io::Result<()> {
            self.digest.chunk(h, b.len());
            if let Some(f) = self.files.last_mut() {
                f.2.push(*h);
            }
            Ok(())
        }
    }
    let mut s = S {
        digest: Digest::default(),
        files: Vec::new(),
    };
    place.walk(&mut s)?;
    Ok(Summary {
        digest: s.digest.finish(),
        entries: s.digest.entries,
        bytes: s.digest.bytes,
        files: s.files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_from_the_other_end_stay_inside() {
        assert!(checked_rel(b"a/b/c").is_ok());
        assert_eq!(checked_rel(b"").expect("root"), PathBuf::new());
        for bad in [&b"../x"[..], b"/etc/passwd", b"a/../../b", b"a\0b", b"./a"] {
            assert!(
                checked_rel(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn the_digest_tells_content_and_metadata_changes_but_not_reading() {
        let dir = tempfile::tempdir().expect("tmp");
        let root = dir.path();
        std::fs::write(root.join("a"), vec![7u8; CHUNK + 10]).expect("a");
        std::fs::create_dir(root.join("d")).expect("d");
        std::os::unix::fs::symlink("a", root.join("d/l")).expect("l");
        let place = Place::Tree(root.to_path_buf());
        let first = summarize(&place).expect("sum");
        assert_eq!(first.files.len(), 1);
        assert_eq!(first.files[0].2.len(), 2, "two chunks");
        let _ = std::fs::read(root.join("a")).expect("read");
        assert_eq!(summarize(&place).expect("sum").digest, first.digest);
        let mut new = vec![8u8; CHUNK];
        new.extend_from_slice(&[7u8; 10]);
        std::fs::write(root.join("a"), new).expect("a");
        let changed = summarize(&place).expect("sum");
        assert_ne!(changed.digest, first.digest);
        assert_eq!(
            changed.files[0].2[1], first.files[0].2[1],
            "last chunk equal"
        );
    }
}
