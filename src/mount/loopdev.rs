//! Loop devices for block-file volumes. Lookups read sysfs directly; attach,
//! detach and capacity refresh use losetup(8), which handles the loop-control
//! races for us.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use tokio::process::Command;

async fn losetup(args: &[&str]) -> io::Result<String> {
    let out = Command::new("losetup").args(args).output().await?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "losetup {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Every attached loop device and its backing file.
pub fn list() -> io::Result<Vec<(PathBuf, PathBuf)>> {
    let mut out = Vec::new();
    let entries = match fs::read_dir("/sys/block") {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        if let Ok(backing) = fs::read_to_string(entry.path().join("loop/backing_file")) {
            out.push((PathBuf::from("/dev").join(&name), PathBuf::from(backing.trim())));
        }
    }
    Ok(out)
}

/// The loop device already backed by `file`, if any.
pub fn find(file: &Path) -> io::Result<Option<PathBuf>> {
    let file = fs::canonicalize(file)?;
    Ok(list()?.into_iter().find(|(_, b)| *b == file).map(|(d, _)| d))
}

/// Attaches `file` (or returns the device already attached to it).
pub async fn attach(file: &Path) -> io::Result<PathBuf> {
    if let Some(dev) = find(file)? {
        return Ok(dev);
    }
    let path = file.to_string_lossy().into_owned();
    Ok(PathBuf::from(losetup(&["--find", "--show", "--nooverlap", &path]).await?))
}

/// Detaches every loop device backed by `file`. None attached is success.
pub async fn detach_file(file: &Path) -> io::Result<()> {
    let file = match fs::canonicalize(file) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for (dev, backing) in list()? {
        if backing == file {
            losetup(&["--detach", &dev.to_string_lossy()]).await?;
        }
    }
    Ok(())
}

/// Tells the loop driver the backing file grew.
pub async fn refresh_capacity(dev: &Path) -> io::Result<()> {
    losetup(&["--set-capacity", &dev.to_string_lossy()]).await.map(|_| ())
}

/// Size of a block device in bytes, from sysfs.
pub fn size_bytes(dev: &Path) -> io::Result<u64> {
    let name = dev
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} is not a device path", dev.display())))?;
    let sectors = fs::read_to_string(Path::new("/sys/class/block").join(name).join("size"))?;
    sectors
        .trim()
        .parse::<u64>()
        .map(|s| s * 512)
        .map_err(|e| io::Error::other(format!("size of {}: {e}", dev.display())))
}
