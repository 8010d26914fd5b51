//! The bind-mount work every source that mounts on this node shares:
//! idempotent checks against mountinfo before acting, so a retry after a
//! crash finishes the job instead of stacking a second mount.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::domain::capability::Capability;
use crate::domain::error::{CsiError, CsiResult};
use crate::ops::node::paths::guard;
use crate::os::options::MountOptions;
use crate::os::syscalls;

/// Name of the bind-mounted device node inside a raw-block staging path.
pub const BLOCK_DEVICE_FILE: &str = "device";

pub(super) fn stat(path: &Path) -> CsiResult<fs::Metadata> {
    fs::metadata(path).map_err(|e| CsiError::io("stat", path, e))
}

/// Whether the mount at `mount_point` shows `source`: the same directory
/// or file (a bind mount), or the same device node.
pub(super) fn shows(mount_point: &Path, source: &Path) -> CsiResult<bool> {
    let (a, b) = (stat(mount_point)?, stat(source)?);
    if a.file_type().is_block_device() && b.file_type().is_block_device() {
        return Ok(a.rdev() == b.rdev());
    }
    Ok(a.dev() == b.dev() && a.ino() == b.ino())
}

/// A path already mounted with something else: answering OK would hand the
/// workload the wrong data, mounting on top would hide someone's mount.
pub(super) fn foreign(path: &Path, what: &Path) -> CsiError {
    CsiError::FailedPrecondition(format!(
        "{} is already a mount point of something other than {}; it must be unmounted first",
        path.display(),
        what.display()
    ))
}

pub(super) fn mounted(path: &Path) -> CsiResult<bool> {
    crate::os::mount_point::is_mount_point(path)
        .map_err(|e| CsiError::io("check mount point", path, e))
}

/// Whether something is mounted at `path`; an unreadable path counts as
/// not mounted (the callers then redo or skip the work, both idempotent).
pub fn is_mounted(path: &Path) -> bool {
    mounted(path).unwrap_or(false)
}

pub(super) fn ensure_dir(path: &Path) -> CsiResult<()> {
    fs::create_dir_all(path).map_err(|e| CsiError::io("create directory", path, e))
}

pub(super) fn ensure_file(path: &Path) -> CsiResult<()> {
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

/// Stages directory `dir` at `staging` by a bind mount (mount access
/// only); a repeat finds its own mount there.
pub(super) fn stage_dir(
    dir: &Path,
    staging: &Path,
    cap: &Capability,
    readonly: bool,
) -> CsiResult<()> {
    if cap.is_block() {
        return Err(CsiError::invalid(
            "volume_capability",
            "this volume is a directory and cannot be staged for raw block access",
        ));
    }
    let staging = guard(staging, "staging_target_path")?;
    ensure_dir(&staging)?;
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
    Ok(())
}

/// Unmounts what is staged at `staging` (its device node for raw block).
/// Nothing staged is success.
pub(super) fn unstage(staging: &Path, cap: &Capability) -> CsiResult<()> {
    let staging = guard(staging, "staging_target_path")?;
    if cap.is_block() {
        let node = staging.join(BLOCK_DEVICE_FILE);
        syscalls::unmount_all(&node)?;
        remove_path(&node)?;
    } else {
        syscalls::unmount_all(&staging)?;
    }
    Ok(())
}

/// Binds the volume staged at `staging` to `target`. A staging path whose
/// mount is gone is refused: binding it would hand the workload an empty
/// directory on the node's own disk instead of the volume.
pub(super) fn publish_staged(
    volume_id: &str,
    staging: &Path,
    target: &Path,
    cap: &Capability,
    readonly: bool,
) -> CsiResult<()> {
    let from = staged_source(staging, cap);
    if !is_mounted(&from) {
        return Err(CsiError::FailedPrecondition(format!(
            "volume {volume_id:?} is recorded as staged at {} but nothing is mounted at {}; \
             NodeStageVolume must be repeated first",
            staging.display(),
            from.display()
        )));
    }
    publish(&from, target, cap, readonly)
}

/// Bind-mounts `from` (a staging path, its device file, or an ephemeral
/// volume's directory) at `target`, creating the target as the CSI spec asks
/// of the plugin: a directory for mount access, a file for raw block. A
/// reader-only access mode is mounted read-only whatever `readonly` says.
pub(super) fn publish(
    from: &Path,
    target: &Path,
    cap: &Capability,
    readonly: bool,
) -> CsiResult<()> {
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
        let _ = remove_target(&target);
        return Err(e.into());
    }
    Ok(())
}

/// Unmounts and removes the target. Absent is success.
pub(super) fn unpublish(target: &Path) -> CsiResult<()> {
    let target = guard(target, "target_path")?;
    syscalls::unmount_all(&target)?;
    remove_target(&target)
}

/// Removes an unmounted target: a target serves one publication only.
fn remove_target(target: &Path) -> CsiResult<()> {
    remove_path(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::capability::{AccessMode, AccessType};
    use crate::grpc::status::CsiCode;

    #[test]
    fn raw_block_staging_of_a_directory_is_refused_before_anything_is_made() {
        let tmp = tempfile::tempdir().unwrap();
        let staging = tmp.path().join("staging");
        let block = Capability {
            mode: AccessMode::SingleNodeWriter,
            access: AccessType::Block,
        };
        let err = stage_dir(tmp.path(), &staging, &block, false).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.to_string().contains("raw block"), "{err}");
        assert!(
            !staging.exists(),
            "nothing is created for a refused request"
        );
    }
}
