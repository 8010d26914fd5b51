//! The target mover's side: tell what it holds (`Index`), then apply a
//! pass (`Apply`): every entry the source sent, the chunks that changed,
//! the removal of what the source no longer has, the directories'
//! metadata last; then read everything back and answer its digest.
//!
//! Paths come from the other end and are checked (`tree::checked_rel`);
//! every ancestor of a path written must be a real directory of this pass
//! (never a symlink), so nothing is written outside the volume. Nothing
//! else uses the target's claim during a move: no pod but this mover
//! mounts it until the copy is verified.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::{FallocateFlags, AT_FDCWD};
use nix::sys::stat::{Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

use super::channel::Channel;
use super::tree::{self, Entry, Kind, Place, CHUNK};
use super::wire::{self, Msg};

/// Answers `Index`: the chunk hashes of every file (or of the device).
pub async fn index<S: AsyncRead + AsyncWrite + Unpin>(
    ch: &mut Channel<S>,
    place: &Place,
) -> Result<(), String> {
    let at = place.clone();
    let summary = tokio::task::spawn_blocking(move || tree::summarize(&at))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("reading the target volume: {e}"))?;
    for (path, size, chunks) in summary.files {
        ch.send(&Msg::Have { path, size, chunks })
            .await
            .map_err(|e| e.to_string())?;
    }
    ch.send(&Msg::HaveEnd).await.map_err(|e| e.to_string())
}

/// Applies one pass after `Apply`; answers `Applied` or `Failed`.
pub async fn apply<S: AsyncRead + AsyncWrite + Unpin>(
    ch: &mut Channel<S>,
    place: &Place,
) -> Result<(), String> {
    let (tx, mut rx) = mpsc::channel::<Msg>(8);
    let at = place.clone();
    let applier = tokio::task::spawn_blocking(move || -> Result<Msg, String> {
        let mut a = Applier::new(at.clone());
        while let Some(msg) = rx.blocking_recv() {
            match msg {
                Msg::Total { .. } => {}
                Msg::Entry(e) => a.entry(e).map_err(|e| format!("writing the target: {e}"))?,
                Msg::Chunk { index, lz4, data } => {
                    let bytes = wire::unpack(lz4, data, CHUNK)?;
                    a.chunk(index, &bytes)
                        .map_err(|e| format!("writing the target: {e}"))?
                }
                Msg::Zero { index, len } => a
                    .zero(index, u64::from(len).min(CHUNK as u64))
                    .map_err(|e| format!("writing the target: {e}"))?,
                Msg::End { .. } => {
                    let place = a
                        .finish()
                        .map_err(|e| format!("finishing the target: {e}"))?;
                    let s = tree::summarize(&place)
                        .map_err(|e| format!("reading the target back: {e}"))?;
                    return Ok(Msg::Applied {
                        digest: s.digest,
                        entries: s.entries,
                        bytes: s.bytes,
                    });
                }
                Msg::Failed { why } => return Err(format!("the source failed: {why}")),
                other => return Err(format!("{} in a pass", other.name())),
            }
        }
        Err("the pass ended before its End".into())
    });
    loop {
        let msg: Msg = match ch.recv().await {
            Ok(m) => m,
            Err(e) => {
                drop(tx);
                let _ = applier.await;
                return Err(e.to_string());
            }
        };
        let last = matches!(msg, Msg::End { .. } | Msg::Failed { .. });
        if tx.send(msg).await.is_err() || last {
            break;
        }
    }
    drop(tx);
    let answer = match applier.await {
        Ok(Ok(applied)) => applied,
        Ok(Err(why)) => Msg::Failed { why },
        Err(e) => Msg::Failed { why: e.to_string() },
    };
    ch.send(&answer).await.map_err(|e| e.to_string())
}

struct Current {
    file: File,
    entry: Entry,
    full: PathBuf,
    old_len: u64,
    size: u64,
}

struct Applier {
    place: Place,
    seen: HashSet<PathBuf>,
    dirs: Vec<(PathBuf, Entry)>,
    current: Option<Current>,
    /// A block volume's length as the source has it.
    volume_len: Option<u64>,
}

impl Applier {
    fn new(place: Place) -> Self {
        Applier {
            place,
            seen: HashSet::new(),
            dirs: Vec::new(),
            current: None,
            volume_len: None,
        }
    }

    fn root(&self) -> std::io::Result<&Path> {
        match &self.place {
            Place::Tree(p) => Ok(p),
            Place::Device(..) => Err(std::io::Error::other(
                "the source sent files, the target is a block volume",
            )),
        }
    }

    fn close_current(&mut self) -> std::io::Result<()> {
        if let Some(c) = self.current.take() {
            if c.entry.kind != (Kind::Volume { size: c.size }) {
                c.file.sync_all()?;
                drop(c.file);
                meta(&c.full, &c.entry)?;
            } else {
                c.file.sync_all()?;
            }
        }
        Ok(())
    }

    fn entry(&mut self, e: Entry) -> std::io::Result<()> {
        self.close_current()?;
        if let Kind::Volume { size } = e.kind {
            let Place::Device(dev, _) = &self.place else {
                return Err(std::io::Error::other(
                    "the source is a block volume, the target a filesystem",
                ));
            };
            let have = tree::device_size(dev)?;
            if have < size {
                return Err(std::io::Error::other(format!(
                    "the target device has {have} bytes, the source {size}"
                )));
            }
            let file = OpenOptions::new().write(true).open(dev)?;
            self.volume_len = Some(size);
            self.current = Some(Current {
                file,
                full: dev.clone(),
                old_len: have,
                size,
                entry: e,
            });
            return Ok(());
        }
        let rel = tree::checked_rel(&e.path).map_err(std::io::Error::other)?;
        let root = self.root()?.to_path_buf();
        real_dirs_above(&root, &rel)?;
        let full = root.join(&rel);
        self.seen.insert(rel.clone());
        let existing = std::fs::symlink_metadata(&full).ok();
        match &e.kind {
            Kind::Dir => {
                match &existing {
                    Some(m) if m.is_dir() => {}
                    Some(_) => {
                        remove(&full)?;
                        std::fs::create_dir(&full)?;
                    }
                    None => std::fs::create_dir(&full)?,
                }
                self.dirs.push((full, e));
            }
            Kind::File { size } => {
                let size = *size;
                let mut old_len = 0;
                match &existing {
                    Some(m) if m.is_file() && m.nlink() > 1 => {
                        // Another name shares this inode: write a copy of
                        // its own, keeping the bytes the index announced.
                        let tmp = full.with_file_name(format!(
                            ".relay-move-{}",
                            full.file_name()
                                .map(|n| n.to_string_lossy().into_owned())
                                .unwrap_or_default()
                        ));
                        std::fs::copy(&full, &tmp)?;
                        std::fs::rename(&tmp, &full)?;
                        old_len = m.len();
                    }
                    Some(m) if m.is_file() => old_len = m.len(),
                    Some(_) => remove(&full)?,
                    None => {}
                }
                let file = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o600)
                    .custom_flags(nix::libc::O_NOFOLLOW)
                    .open(&full)?;
                file.set_len(size)?;
                self.current = Some(Current {
                    file,
                    full,
                    old_len,
                    size,
                    entry: e,
                });
            }
            Kind::Symlink { target } => {
                let same = existing
                    .as_ref()
                    .is_some_and(|m| m.file_type().is_symlink())
                    && std::fs::read_link(&full)
                        .is_ok_and(|t| t.as_os_str().as_bytes() == target.as_slice());
                if !same {
                    if existing.is_some() {
                        remove(&full)?;
                    }
                    std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(target), &full)?;
                }
                meta(&full, &e)?;
            }
            Kind::HardLink { to } => {
                let to = root.join(tree::checked_rel(to).map_err(std::io::Error::other)?);
                real_dirs_above(&root, to.strip_prefix(&root).unwrap_or(&to))?;
                let first = std::fs::symlink_metadata(&to)?;
                if !first.is_file() {
                    return Err(std::io::Error::other("a hard link to something not a file"));
                }
                let same = existing
                    .as_ref()
                    .is_some_and(|m| m.dev() == first.dev() && m.ino() == first.ino());
                if !same {
                    if existing.is_some() {
                        remove(&full)?;
                    }
                    std::fs::hard_link(&to, &full)?;
                }
            }
            Kind::Fifo | Kind::Device { .. } => {
                let (flag, rdev) = match e.kind {
                    Kind::Device { block: true, rdev } => (SFlag::S_IFBLK, rdev),
                    Kind::Device { block: false, rdev } => (SFlag::S_IFCHR, rdev),
                    _ => (SFlag::S_IFIFO, 0),
                };
                let same = existing.as_ref().is_some_and(|m| {
                    (m.mode() & SFlag::S_IFMT.bits()) == flag.bits() && m.rdev() == rdev
                });
                if !same {
                    if existing.is_some() {
                        remove(&full)?;
                    }
                    nix::sys::stat::mknod(&full, flag, Mode::from_bits_truncate(0o600), rdev)?;
                }
                meta(&full, &e)?;
            }
            Kind::Volume { .. } => {}
        }
        Ok(())
    }

    fn chunk(&mut self, index: u64, bytes: &[u8]) -> std::io::Result<()> {
        let c = self
            .current
            .as_ref()
            .ok_or_else(|| std::io::Error::other("a chunk outside a file"))?;
        let at = index.saturating_mul(CHUNK as u64);
        if at.saturating_add(bytes.len() as u64) > c.size {
            return Err(std::io::Error::other("a chunk past the end of its file"));
        }
        c.file.write_all_at(bytes, at)
    }

    fn zero(&mut self, index: u64, len: u64) -> std::io::Result<()> {
        let c = self
            .current
            .as_ref()
            .ok_or_else(|| std::io::Error::other("a chunk outside a file"))?;
        let at = index.saturating_mul(CHUNK as u64);
        let end = at.saturating_add(len).min(c.size);
        if at >= c.old_len || at >= end {
            return Ok(()); // beyond the old end: set_len left zeros
        }
        let punched = nix::fcntl::fallocate(
            &c.file,
            FallocateFlags::FALLOC_FL_PUNCH_HOLE | FallocateFlags::FALLOC_FL_KEEP_SIZE,
            at as i64,
            (end - at) as i64,
        );
        if punched.is_err() {
            c.file.write_all_at(&vec![0u8; (end - at) as usize], at)?;
        }
        Ok(())
    }

    /// Removes what this pass did not send, then sets the directories'
    /// metadata, deepest first (creating and removing entries changed
    /// their times). Returns what to read back.
    fn finish(&mut self) -> std::io::Result<Place> {
        self.close_current()?;
        if let Place::Device(dev, _) = &self.place {
            return Ok(Place::Device(dev.clone(), self.volume_len));
        }
        let root = self.root()?.to_path_buf();
        prune(&root, Path::new(""), &self.seen)?;
        for (full, e) in self.dirs.iter().rev() {
            meta(full, e)?;
        }
        Ok(self.place.clone())
    }
}

/// Every directory from the root down to `rel`'s parent is a directory,
/// not a symlink to one.
fn real_dirs_above(root: &Path, rel: &Path) -> std::io::Result<()> {
    let mut at = root.to_path_buf();
    let mut parts: Vec<_> = rel.components().collect();
    parts.pop();
    for part in parts {
        at.push(part);
        let m = std::fs::symlink_metadata(&at)?;
        if !m.is_dir() {
            return Err(std::io::Error::other(format!(
                "{} is not a directory of the volume",
                at.display()
            )));
        }
    }
    Ok(())
}

fn remove(full: &Path) -> std::io::Result<()> {
    let m = std::fs::symlink_metadata(full)?;
    if m.is_dir() {
        std::fs::remove_dir_all(full)
    } else {
        std::fs::remove_file(full)
    }
}

fn prune(root: &Path, rel: &Path, seen: &HashSet<PathBuf>) -> std::io::Result<()> {
    for d in std::fs::read_dir(root.join(rel))? {
        let d = d?;
        let child = rel.join(d.file_name());
        if !seen.contains(&child) {
            remove(&root.join(&child))?;
        } else if d.file_type()?.is_dir() {
            prune(root, &child, seen)?;
        }
    }
    Ok(())
}

/// Owner, mode, xattrs, then times (each of the others changes ctime only,
/// but chown clears set-id bits, so the mode comes after it).
fn meta(full: &Path, e: &Entry) -> std::io::Result<()> {
    std::os::unix::fs::lchown(full, Some(e.uid), Some(e.gid))?;
    let symlink = matches!(e.kind, Kind::Symlink { .. });
    if !symlink {
        std::fs::set_permissions(full, std::fs::Permissions::from_mode(e.mode))?;
        let wanted: HashSet<&str> = e.xattrs.iter().map(|x| x.name.as_str()).collect();
        if let Ok(names) = xattr::list(full) {
            for name in names {
                let keep = name
                    .to_str()
                    .is_some_and(|n| wanted.contains(n) || n == "security.selinux");
                if !keep {
                    xattr::remove(full, &name)?;
                }
            }
        }
        for x in &e.xattrs {
            xattr::set(full, &x.name, &x.value)?;
        }
    }
    let at = TimeSpec::new(e.atime.0, e.atime.1);
    let mt = TimeSpec::new(e.mtime.0, e.mtime.1);
    nix::sys::stat::utimensat(AT_FDCWD, full, &at, &mt, UtimensatFlags::NoFollowSymlink)?;
    Ok(())
}
