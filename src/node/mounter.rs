//! The mount work behind stage and publish for each kind of node source.
//! Every function is idempotent: it checks mountinfo and the loop devices
//! before acting, so a retry after a crash finishes the job.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::backend::NodeSource;
use crate::capability::Capability;
use crate::error::{CsiError, CsiResult};
use crate::mount::options::MountOptions;
use crate::mount::{filesystem, loopdev, mountinfo, syscalls, target_path};

/// Name of the bind-mounted device node inside a raw-block staging path.
pub const BLOCK_DEVICE_FILE: &str = "device";

fn guard(path: &Path, field: &'static str) -> CsiResult<PathBuf> {
    target_path::check(path).map_err(|e| match e.kind() {
        io::ErrorKind::PermissionDenied => CsiError::invalid(field, e.to_string()),
        _ => CsiError::io("resolve", path, e),
    })
}

fn mounted(path: &Path) -> CsiResult<bool> {
    Ok(mountinfo::mounted_at(path)
        .map_err(|e| CsiError::io("read mountinfo for", path, e))?
        .is_some())
}

fn ensure_dir(path: &Path) -> CsiResult<()> {
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
pub async fn stage(
    source: &NodeSource,
    staging: &Path,
    cap: &Capability,
    default_fs: &str,
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
            if !mounted(&staging)? {
                syscalls::bind(
                    dir,
                    &staging,
                    &MountOptions::parse(cap.mount_flags(), false),
                )?;
            }
            Ok(None)
        }
        NodeSource::BlockFile(file) => {
            let dev = loopdev::attach(file)
                .await
                .map_err(|e| CsiError::io("attach loop device for", file, e))?;
            let staged = stage_block_file(&dev, &staging, cap, default_fs).await;
            if staged.is_err() {
                // Leave nothing attached behind a failed stage.
                let _ = syscalls::unmount_all(&staged_source(&staging, cap));
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
) -> CsiResult<()> {
    if cap.is_block() {
        let node = staging.join(BLOCK_DEVICE_FILE);
        ensure_file(&node)?;
        if !mounted(&node)? {
            syscalls::bind(dev, &node, &MountOptions::default())?;
        }
        return Ok(());
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
    if !mounted(staging)? {
        syscalls::mount_fs(
            dev,
            staging,
            &fs_type,
            &MountOptions::parse(cap.mount_flags(), false),
        )?;
    }
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
/// of the plugin: a directory for mount access, a file for raw block.
pub fn publish(from: &Path, target: &Path, cap: &Capability, readonly: bool) -> CsiResult<()> {
    let target = guard(target, "target_path")?;
    if cap.is_block() {
        ensure_file(&target)?;
    } else {
        ensure_dir(&target)?;
    }
    if !mounted(&target)? {
        if let Err(e) = syscalls::bind(
            from,
            &target,
            &MountOptions::parse(cap.mount_flags(), readonly),
        ) {
            let _ = remove_path(&target);
            return Err(e.into());
        }
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
