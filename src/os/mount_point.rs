//! Whether a path is a mount point, in one `statx` instead of a read and
//! parse of the whole mount table: on a busy node `/proc/self/mountinfo`
//! has hundreds of lines, and reading it took a tenth of the driver's CPU.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::libc;

/// `STATX_ATTR_MOUNT_ROOT` (Linux 5.8): the path is the root of a mount.
const STATX_ATTR_MOUNT_ROOT: u64 = 0x2000;

/// Whether `path` (symlinks followed) is the root of a mount. A missing
/// path is not. Kernels without the attribute fall back to mountinfo.
pub fn is_mount_point(path: &Path) -> io::Result<bool> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path with a NUL byte"))?;
    // SAFETY: statx fills the zeroed struct; the path is NUL-terminated.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            0,
            libc::STATX_BASIC_STATS,
            &mut stx,
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return match e.kind() {
            io::ErrorKind::NotFound => Ok(false),
            _ if e.raw_os_error() == Some(libc::ENOTDIR) => Ok(false),
            _ => Err(e),
        };
    }
    if stx.stx_attributes_mask & STATX_ATTR_MOUNT_ROOT != 0 {
        return Ok(stx.stx_attributes & STATX_ATTR_MOUNT_ROOT != 0);
    }
    Ok(super::mountinfo::mounted_at(path)?.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_the_mount_table() {
        for p in ["/", "/proc", "/proc/self", "/nonexistent/x"] {
            let p = Path::new(p);
            let expected = super::super::mountinfo::mounted_at(p).unwrap().is_some();
            assert_eq!(is_mount_point(p).unwrap(), expected, "{}", p.display());
        }
    }
}
