//! Filesystems on block devices: detect, create, grow. These tools have no
//! syscall equivalent, so they are run as commands.

use std::io;
use std::path::Path;

use std::time::Duration;

use super::helper;

/// mkfs with lazy init and the grow tools touch metadata only; past this
/// the device is stuck and the caller gets an error it can retry.
const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// The filesystem type already on `device`, or None for a blank device.
pub async fn probe(device: &Path) -> io::Result<Option<String>> {
    let dev = device.to_string_lossy();
    let args = ["-p", "-o", "value", "-s", "TYPE", &dev];
    let out = helper::run("blkid", &args, TOOL_TIMEOUT).await?;
    match out.status.code() {
        Some(0) => {
            let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
            Ok((!t.is_empty()).then_some(t))
        }
        // blkid exits 2 when it finds nothing it recognises.
        Some(2) => Ok(None),
        _ => Err(helper::failed("blkid", &args, &out)),
    }
}

pub fn mkfs_available(fs_type: &str) -> bool {
    ["/sbin", "/usr/sbin", "/bin", "/usr/bin"]
        .iter()
        .any(|d| Path::new(d).join(format!("mkfs.{fs_type}")).exists())
}

pub async fn make(device: &Path, fs_type: &str) -> io::Result<()> {
    let dev = device.to_string_lossy();
    let program = format!("mkfs.{fs_type}");
    let args: Vec<&str> = match fs_type {
        "xfs" => vec!["-q", "-f", &dev],
        _ => vec![
            "-q",
            "-F",
            "-E",
            "lazy_itable_init=1,lazy_journal_init=1",
            &dev,
        ],
    };
    helper::run_ok(&program, &args, TOOL_TIMEOUT)
        .await
        .map(|_| ())
}

/// Grows the filesystem on `device` (mounted at `mount_point`) to fill it.
pub async fn grow(device: &Path, mount_point: &Path, fs_type: &str) -> io::Result<()> {
    let (program, target) = match fs_type {
        "xfs" => ("xfs_growfs", mount_point.to_string_lossy()),
        _ => ("resize2fs", device.to_string_lossy()),
    };
    helper::run_ok(program, &[&target], TOOL_TIMEOUT)
        .await
        .map(|_| ())
}
