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

/// Freezes the filesystem mounted at `mount_point`.
pub fn freeze(mount_point: &Path) -> io::Result<Frozen> {
    let dir = File::open(mount_point)?;
    let mut arg = 0;
    // SAFETY: the descriptor is an open directory on the filesystem to
    // freeze; the kernel ignores the int argument.
    unsafe { fifreeze(dir.as_raw_fd(), &mut arg) }?;
    Ok(Frozen { dir })
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let mut arg = 0;
        // SAFETY: as in `freeze`, on the same descriptor.
        if let Err(e) = unsafe { fithaw(self.dir.as_raw_fd(), &mut arg) } {
            tracing::error!(error = %e, "cannot thaw a filesystem frozen for a snapshot");
        }
    }
}
