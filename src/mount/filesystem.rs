//! Filesystems on block devices: detect, create, grow. These tools have no
//! syscall equivalent, so they are run as commands.

use std::io;
use std::path::Path;

use tokio::process::Command;

async fn run(program: &str, args: &[&str]) -> io::Result<std::process::Output> {
    Command::new(program)
        .args(args)
        .output()
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("{program}: {e}")))
}

fn failed(program: &str, out: &std::process::Output) -> io::Error {
    io::Error::other(format!(
        "{program} exited with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// The filesystem type already on `device`, or None for a blank device.
pub async fn probe(device: &Path) -> io::Result<Option<String>> {
    let dev = device.to_string_lossy();
    let out = run("blkid", &["-p", "-o", "value", "-s", "TYPE", &dev]).await?;
    match out.status.code() {
        Some(0) => {
            let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
            Ok((!t.is_empty()).then_some(t))
        }
        // blkid exits 2 when it finds nothing it recognises.
        Some(2) => Ok(None),
        _ => Err(failed("blkid", &out)),
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
    let out = run(&program, &args).await?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed(&program, &out))
    }
}

/// Grows the filesystem on `device` (mounted at `mount_point`) to fill it.
pub async fn grow(device: &Path, mount_point: &Path, fs_type: &str) -> io::Result<()> {
    let (program, target) = match fs_type {
        "xfs" => ("xfs_growfs", mount_point.to_string_lossy()),
        _ => ("resize2fs", device.to_string_lossy()),
    };
    let out = run(program, &[&target]).await?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed(program, &out))
    }
}
