//! Freezing a mounted filesystem (`FIFREEZE`) for the time of a snapshot
//! copy: writes in flight are flushed and new ones wait, so the copy is a
//! clean filesystem image rather than a crash-consistent one.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

// FIFREEZE = _IOWR('X', 119, int), FITHAW = _IOWR('X', 120, int).
nix::ioctl_readwrite!(fifreeze, b'X', 119, nix::libc::c_int);
nix::ioctl_readwrite!(fithaw, b'X', 120, nix::libc::c_int);

/// A frozen filesystem; thawed when dropped, whatever happens in between.
pub struct Frozen {
    dir: File,
}

/// Freezes the filesystem mounted at `mount_point` if, and only if, it is
/// the one on block device `device` and not the one holding `protected`
/// (the state dir). A freeze applies to whatever filesystem holds the path:
/// a staging path whose mount is gone (after a reboot, a lost mount) is a
/// plain directory on the root or kubelet filesystem, and freezing that
/// hangs the node, the copy that follows included. The check is made on
/// the open descriptor the freeze is applied to, so a path swapped in
/// between cannot redirect it.
pub fn freeze_device_mount(
    mount_point: &Path,
    device: &Path,
    protected: &Path,
) -> io::Result<Frozen> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let dir = File::open(mount_point)?;
    let held = dir.metadata()?;
    let dev = std::fs::metadata(device)?;
    if !dev.file_type().is_block_device() {
        return Err(io::Error::other(format!(
            "{} is not a block device",
            device.display()
        )));
    }
    if held.dev() != dev.rdev() {
        return Err(io::Error::other(format!(
            "{} is not on {} (not mounted there any more?); not frozen",
            mount_point.display(),
            device.display()
        )));
    }
    if held.dev() == std::fs::metadata(protected)?.dev() {
        return Err(io::Error::other(format!(
            "{} is on the filesystem of {}; not frozen",
            mount_point.display(),
            protected.display()
        )));
    }
    let mut arg = 0;
    // SAFETY: the descriptor is an open directory on the filesystem to
    // freeze; the kernel ignores the int argument.
    unsafe { fifreeze(dir.as_raw_fd(), &mut arg) }?;
    Ok(Frozen { dir })
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let mut arg = 0;
        // SAFETY: as in `freeze_device_mount`, on the same descriptor.
        if let Err(e) = unsafe { fithaw(self.dir.as_raw_fd(), &mut arg) } {
            tracing::error!(error = %e, "cannot thaw a filesystem frozen for a snapshot");
        }
    }
}
