//! mount(2) and umount2(2) through `nix`.

use std::path::Path;

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};

use crate::os::options::MountOptions;

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("{op} {target}: {errno}")]
    Sys {
        op: &'static str,
        target: String,
        errno: Errno,
    },
    #[error("reading mountinfo: {0}")]
    MountInfo(#[from] std::io::Error),
}

fn sys(op: &'static str, target: &Path, errno: Errno) -> MountError {
    MountError::Sys {
        op,
        target: target.display().to_string(),
        errno,
    }
}

/// Bind-mounts `source` at `target`, then applies the flags (read-only,
/// nosuid, ...) with a remount, since a bind mount ignores them.
pub fn bind(source: &Path, target: &Path, opts: &MountOptions) -> Result<(), MountError> {
    mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| sys("bind mount", target, e))?;
    if opts.needs_remount() {
        let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | opts.flags;
        if let Err(e) = mount(None::<&str>, target, None::<&str>, flags, None::<&str>) {
            // Never leave a writable mount behind when read-only was asked.
            let _ = umount2(target, MntFlags::empty());
            return Err(sys("remount with flags", target, e));
        }
    }
    Ok(())
}

/// Mounts the filesystem on `device` at `target`.
pub fn mount_fs(
    device: &Path,
    target: &Path,
    fs_type: &str,
    opts: &MountOptions,
) -> Result<(), MountError> {
    let data = opts.data_string();
    mount(
        Some(device),
        target,
        Some(fs_type),
        opts.flags,
        data.as_deref(),
    )
    .map_err(|e| sys("mount", target, e))
}

/// Unmounts everything stacked at `target` until it is no longer a mount
/// point. Not mounted is success.
pub fn unmount_all(target: &Path) -> Result<(), MountError> {
    // A bounded loop: a path can hold several stacked mounts, but not endless ones.
    for _ in 0..16 {
        if !super::mount_point::is_mount_point(target)? {
            return Ok(());
        }
        match umount2(target, MntFlags::empty()) {
            Ok(()) | Err(Errno::EINVAL) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(sys("unmount", target, e)),
        }
    }
    Err(sys(
        "unmount (still mounted after 16 attempts)",
        target,
        Errno::EBUSY,
    ))
}

/// A failed mount(2)/umount2(2) reaches the CO as INTERNAL with the
/// operation, the path and the errno.
impl From<MountError> for crate::domain::error::CsiError {
    fn from(e: MountError) -> Self {
        crate::domain::error::CsiError::Internal(e.to_string())
    }
}
