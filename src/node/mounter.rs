//! The mount work behind stage and publish for each kind of node source.
//! Every function is idempotent: it checks mountinfo and the loop devices
//! before acting, so a retry after a crash finishes the job.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::backend::NodeSource;
use crate::capability::Capability;
use crate::error::{CsiError, CsiResult};
use crate::mount::options::MountOptions;
use crate::mount::{filesystem, loopdev, syscalls, target_path};

/// Name of the bind-mounted device node inside a raw-block staging path.
pub const BLOCK_DEVICE_FILE: &str = "device";

/// Resolves a staging or target path and refuses system paths.
pub fn guard(path: &Path, field: &'static str) -> CsiResult<PathBuf> {
    target_path::check(path).map_err(|e| match e.kind() {
        io::ErrorKind::PermissionDenied => CsiError::invalid(field, e.to_string()),
        _ => CsiError::io("resolve", path, e),
    })
}

/// Checks a staging or target path from a request before anything is
/// recorded or created for it: no system path, nothing in or above the
/// driver's state dir (volume data, the state store). Returns the path
/// resolved through symlinks.
pub fn check_path(path: &str, state_dir: &Path, field: &'static str) -> CsiResult<PathBuf> {
    target_path::check_outside(Path::new(path), state_dir).map_err(|e| match e.kind() {
        io::ErrorKind::PermissionDenied => CsiError::invalid(field, e.to_string()),
        _ => CsiError::io("resolve", path, e),
    })
}

/// A target inside the staging path (or the other way round, or the same
/// path) would bind the staged volume onto itself and wedge unstaging; the
/// check also sees through symlinks (`resolved_target` is what
/// `check_path` returned for the target).
pub fn check_apart(target: &str, resolved_target: &Path, staging: &str) -> CsiResult<()> {
    let overlap = |a: &Path, b: &Path| a.starts_with(b) || b.starts_with(a);
    let (t, s) = (Path::new(target), Path::new(staging));
    let overlaps =
        overlap(t, s) || target_path::resolve(s).is_ok_and(|rs| overlap(resolved_target, &rs));
    if overlaps {
        return Err(CsiError::invalid(
            "target_path",
            format!(
                "target_path {target:?} and staging_target_path {staging:?} overlap; \
                 a volume is published to a path apart from where it is staged"
            ),
        ));
    }
    Ok(())
}

fn stat(path: &Path) -> CsiResult<fs::Metadata> {
    fs::metadata(path).map_err(|e| CsiError::io("stat", path, e))
}

/// Whether the mount at `mount_point` shows `source`: the same directory
/// or file (a bind mount), or the same device node.
fn shows(mount_point: &Path, source: &Path) -> CsiResult<bool> {
    let (a, b) = (stat(mount_point)?, stat(source)?);
    if a.file_type().is_block_device() && b.file_type().is_block_device() {
        return Ok(a.rdev() == b.rdev());
    }
    Ok(a.dev() == b.dev() && a.ino() == b.ino())
}

/// A path already mounted with something else: answering OK would hand the
/// workload the wrong data, mounting on top would hide someone's mount.
fn foreign(path: &Path, what: &Path) -> CsiError {
    CsiError::FailedPrecondition(format!(
        "{} is already a mount point of something other than {}; it must be unmounted first",
        path.display(),
        what.display()
    ))
}

fn mounted(path: &Path) -> CsiResult<bool> {
    crate::mount::mount_point::is_mount_point(path)
        .map_err(|e| CsiError::io("check mount point", path, e))
}

pub fn ensure_dir(path: &Path) -> CsiResult<()> {
    fs::create_dir_all(path).map_err(|e| CsiError::io("create directory", path, e))
}

fn ensure_file(path: &Path) -> CsiResult<()> {
    if let Some(parent) = path.parent() {
        ensure_dir(parent)?;
    }
    match fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) => Err(CsiError::io("create file", path, e)),
    }
}

fn remove_path(path: &Path) -> CsiResult<()> {
    let result = match fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => fs::remove_dir(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    };
    result.map_err(|e| CsiError::io("remove", path, e))
}

/// Where a staged volume can be bind-mounted from.
pub fn staged_source(staging: &Path, cap: &Capability) -> PathBuf {
    if cap.is_block() {
        staging.join(BLOCK_DEVICE_FILE)
    } else {
        staging.to_path_buf()
    }
}

/// Stages `source` at `staging` for `cap`; returns the loop device used.
/// `readonly` makes the staged volume read-only for every publication.
pub async fn stage(
    source: &NodeSource,
    staging: &Path,
    cap: &Capability,
    default_fs: &str,
    readonly: bool,
) -> CsiResult<Option<String>> {
    let staging = guard(staging, "staging_target_path")?;
    ensure_dir(&staging)?;
    match source {
        NodeSource::Directory(dir) => {
            if cap.is_block() {
                return Err(CsiError::invalid(
                    "volume_capability",
                    "this volume is a directory and cannot be staged for raw block access",
                ));
            }
            if mounted(&staging)? {
                if !shows(&staging, dir)? {
                    return Err(foreign(&staging, dir));
                }
            } else {
                syscalls::bind(
                    dir,
                    &staging,
                    &MountOptions::parse(cap.mount_flags(), readonly),
                )?;
            }
            Ok(None)
        }
        // Member sources need the driver's settings: `node::source` routes
        // them to `node::member`.
        NodeSource::Member(m) => Err(CsiError::Internal(format!(
            "member {} source of PersistentVolume {} reached the local mounter",
            m.kind.name(),
            m.pv
        ))),
        NodeSource::BlockFile(file) => {
            let attached_before =
                loopdev::find(file).map_err(|e| CsiError::io("find loop device of", file, e))?;
            // A raw device cannot be made read-only by its mount: the loop
            // device itself is (a filesystem needs a writable device for mkfs
            // and journal replay; its mount is read-only instead).
            let dev = loopdev::attach(file, readonly && cap.is_block())
                .await
                .map_err(|e| CsiError::io("attach loop device for", file, e))?;
            let staged = stage_block_file(&dev, &staging, cap, default_fs, readonly).await;
            if staged.is_err() && attached_before.is_none() {
                // Leave no loop device behind a failed stage. Every step
                // before mounting only reads, and the mount is the last step:
                // nothing was mounted by this call.
                let _ = loopdev::detach_file(file).await;
            }
            staged.map(|_| Some(dev.to_string_lossy().into_owned()))
        }
    }
}

async fn stage_block_file(
    dev: &Path,
    staging: &Path,
    cap: &Capability,
    default_fs: &str,
    readonly: bool,
) -> CsiResult<()> {
    if cap.is_block() {
        let node = staging.join(BLOCK_DEVICE_FILE);
        if mounted(&node)? {
            return if shows(&node, dev)? {
                Ok(())
            } else {
                Err(foreign(&node, dev))
            };
        }
        ensure_file(&node)?;
        syscalls::bind(dev, &node, &MountOptions::parse(&[], readonly))?;
        return Ok(());
    }
    if mounted(staging)? {
        // Ours when it is a filesystem on this very device.
        let same = stat(staging)?.dev() == stat(dev)?.rdev();
        return if same {
            Ok(())
        } else {
            Err(foreign(staging, dev))
        };
    }
    let wanted = cap.fs_type().unwrap_or(default_fs).to_string();
    let existing = filesystem::probe(dev)
        .await
        .map_err(|e| CsiError::io("probe filesystem on", dev, e))?;
    let fs_type = match existing {
        Some(found) if cap.fs_type().is_some_and(|w| w != found) => {
            return Err(CsiError::FailedPrecondition(format!(
                "the volume already holds a {found} filesystem; it cannot be staged as {wanted}"
            )))
        }
        Some(found) => found,
        None => {
            if !filesystem::mkfs_available(&wanted) {
                return Err(CsiError::FailedPrecondition(format!(
                    "mkfs.{wanted} is not installed on this node"
                )));
            }
            filesystem::make(dev, &wanted)
                .await
                .map_err(|e| CsiError::io("make filesystem on", dev, e))?;
            wanted
        }
    };
    syscalls::mount_fs(
        dev,
        staging,
        &fs_type,
        &MountOptions::parse(cap.mount_flags(), readonly),
    )?;
    Ok(())
}

/// Reverses `stage`. Nothing staged is success.
pub async fn unstage(source: &NodeSource, staging: &Path, cap: &Capability) -> CsiResult<()> {
    let staging = guard(staging, "staging_target_path")?;
    if cap.is_block() {
        let node = staging.join(BLOCK_DEVICE_FILE);
        syscalls::unmount_all(&node)?;
        remove_path(&node)?;
    } else {
        syscalls::unmount_all(&staging)?;
    }
    if let NodeSource::BlockFile(file) = source {
        loopdev::detach_file(file)
            .await
            .map_err(|e| CsiError::io("detach loop device of", file, e))?;
    }
    Ok(())
}

/// Bind-mounts `from` (a staging path, its device file, or an ephemeral
/// volume's directory) at `target`, creating the target as the CSI spec asks
/// of the plugin: a directory for mount access, a file for raw block. A
/// reader-only access mode is mounted read-only whatever `readonly` says.
pub fn publish(from: &Path, target: &Path, cap: &Capability, readonly: bool) -> CsiResult<()> {
    let target = guard(target, "target_path")?;
    let readonly = readonly || cap.mode.read_only();
    if mounted(&target)? {
        return if shows(&target, from)? {
            Ok(())
        } else {
            Err(foreign(&target, from))
        };
    }
    if cap.is_block() {
        ensure_file(&target)?;
    } else {
        ensure_dir(&target)?;
    }
    if let Err(e) = syscalls::bind(
        from,
        &target,
        &MountOptions::parse(cap.mount_flags(), readonly),
    ) {
        let _ = remove_path(&target);
        return Err(e.into());
    }
    Ok(())
}

/// Reverses `publish`: unmounts and removes the target. Absent is success.
pub fn unpublish(target: &Path) -> CsiResult<()> {
    let target = guard(target, "target_path")?;
    syscalls::unmount_all(&target)?;
    remove_path(&target)
}

pub fn is_mounted(path: &Path) -> bool {
    mounted(path).unwrap_or(false)
}
