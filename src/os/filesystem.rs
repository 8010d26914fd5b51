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

/// Whether an ext2/3/4 filesystem on `device` spans less than `device_bytes`
/// (by more than one of its blocks, which resize2fs cannot use). `false`
/// for any other filesystem.
pub async fn ext_smaller_than(device: &Path, device_bytes: u64) -> io::Result<bool> {
    let dev = device.to_string_lossy();
    let args = ["-h", &dev];
    let out = helper::run_ok("dumpe2fs", &args, TOOL_TIMEOUT).await?;
    let header = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> Option<u64> {
        header
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    let (Some(blocks), Some(block_size)) = (field("Block count:"), field("Block size:")) else {
        return Err(io::Error::other(format!(
            "dumpe2fs -h {dev}: no block count or block size in its answer"
        )));
    };
    Ok(blocks.saturating_add(1).saturating_mul(block_size) <= device_bytes)
}

/// Grows the unmounted ext2/3/4 filesystem on `device` to fill it. Offline
/// growth needs no privilege beyond writing the device (online growth
/// needs CAP_SYS_RESOURCE); resize2fs wants a freshly checked filesystem.
pub async fn grow_ext_offline(device: &Path) -> io::Result<()> {
    let dev = device.to_string_lossy();
    let args = ["-f", "-p", &dev];
    let out = helper::run("e2fsck", &args, TOOL_TIMEOUT).await?;
    // 0: clean; 1: errors fixed. Anything else needs a person.
    if !matches!(out.status.code(), Some(0) | Some(1)) {
        return Err(helper::failed("e2fsck", &args, &out));
    }
    helper::run_ok("resize2fs", &[&dev], TOOL_TIMEOUT)
        .await
        .map(|_| ())
}
