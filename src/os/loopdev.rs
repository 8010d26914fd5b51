//! Loop devices for block-file volumes. Lookups read sysfs directly; attach,
//! detach and capacity refresh use losetup(8), which handles the loop-control
//! races for us.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::helper;

/// losetup only talks to the loop driver; longer than this means it hangs.
const LOSETUP_TIMEOUT: Duration = Duration::from_secs(30);

async fn losetup(args: &[&str]) -> io::Result<String> {
    let out = helper::run_ok("losetup", args, LOSETUP_TIMEOUT).await?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// How long a detach may take to really release the device. LOOP_CLR_FD on
/// a device that another process still has open (a concurrent `losetup`
/// scan, `blkid`, a workload holding a raw device) only marks it
/// autoclear and returns success; the kernel detaches it on the last close.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// One attached loop device, as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoopDevice {
    pub device: PathBuf,
    /// The backing file; the kernel appends " (deleted)" once it is unlinked.
    pub backing: PathBuf,
    /// A detach was requested and waits for the last opener to close it.
    pub detaching: bool,
}

fn read_device(name: &str) -> Option<LoopDevice> {
    let dir = Path::new("/sys/block").join(name).join("loop");
    let backing = fs::read_to_string(dir.join("backing_file")).ok()?;
    let detaching = fs::read_to_string(dir.join("autoclear")).is_ok_and(|v| v.trim() == "1");
    Some(LoopDevice {
        device: PathBuf::from("/dev").join(name),
        backing: PathBuf::from(backing.trim_end_matches('\n')),
        detaching,
    })
}

/// Every attached loop device.
pub fn devices() -> io::Result<Vec<LoopDevice>> {
    let entries = match fs::read_dir("/sys/block") {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with("loop") {
            out.extend(read_device(&name));
        }
    }
    Ok(out)
}

/// Every attached loop device and its backing file.
pub fn list() -> io::Result<Vec<(PathBuf, PathBuf)>> {
    Ok(devices()?
        .into_iter()
        .map(|d| (d.device, d.backing))
        .collect())
}

/// Loop devices, not yet being detached, whose backing file under `dir`
/// was unlinked: their data is gone for every reader but the device.
pub fn unlinked_under(dir: &Path) -> io::Result<Vec<LoopDevice>> {
    let dir = kernel_name(dir)?;
    Ok(devices()?
        .into_iter()
        .filter(|d| {
            !d.detaching
                && d.backing.starts_with(&dir)
                && d.backing
                    .as_os_str()
                    .to_string_lossy()
                    .ends_with(" (deleted)")
        })
        .collect())
}

/// Whether `backing` (as sysfs reports it) is `file`, also once unlinked.
fn backs(backing: &Path, file: &Path) -> bool {
    if backing == file {
        return true;
    }
    let mut deleted = file.as_os_str().to_os_string();
    deleted.push(" (deleted)");
    backing.as_os_str() == deleted
}

/// `file` as the kernel names it: absolute and without symlinks. A file
/// that no longer exists keeps its given (absolute) name.
fn kernel_name(file: &Path) -> io::Result<PathBuf> {
    match fs::canonicalize(file) {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => std::path::absolute(file),
        Err(e) => Err(e),
    }
}

fn backed_by(file: &Path) -> io::Result<Vec<LoopDevice>> {
    Ok(devices()?
        .into_iter()
        .filter(|d| backs(&d.backing, file))
        .collect())
}

/// Waits until no loop device is backed by `file` any more.
async fn wait_released(file: &Path) -> io::Result<()> {
    let deadline = Instant::now() + RELEASE_TIMEOUT;
    let mut pause = Duration::from_millis(5);
    loop {
        let held = backed_by(file)?;
        if held.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let names: Vec<String> = held
                .iter()
                .map(|d| d.device.display().to_string())
                .collect();
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!(
                    "loop device(s) {} of {} are still open elsewhere; detach is pending",
                    names.join(", "),
                    file.display()
                ),
            ));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// The loop device already backed by `file`, if any. A device whose detach
/// is pending is not one: it disappears on its last close.
pub fn find(file: &Path) -> io::Result<Option<PathBuf>> {
    let file = fs::canonicalize(file)?;
    Ok(backed_by(&file)?
        .into_iter()
        .find(|d| !d.detaching)
        .map(|d| d.device))
}

/// Attaches `file` (or returns the device already attached to it),
/// read-only when `readonly`.
pub async fn attach(file: &Path, readonly: bool) -> io::Result<PathBuf> {
    let name = fs::canonicalize(file)?;
    let current = backed_by(&name)?;
    if let Some(dev) = current.iter().find(|d| !d.detaching) {
        return Ok(dev.device.clone());
    }
    if !current.is_empty() {
        // `losetup --nooverlap` would hand back the dying device: wait for it.
        wait_released(&name).await?;
    }
    let path = name.to_string_lossy().into_owned();
    let mut args = vec!["--find", "--show", "--nooverlap"];
    if readonly {
        args.push("--read-only");
    }
    args.push(&path);
    Ok(PathBuf::from(losetup(&args).await?))
}

/// Detaches every loop device backed by `file` and waits until the kernel
/// has really released them. None attached is success.
pub async fn detach_file(file: &Path) -> io::Result<()> {
    let file = kernel_name(file)?;
    for dev in backed_by(&file)? {
        if !dev.detaching {
            losetup(&["--detach", &dev.device.to_string_lossy()]).await?;
        }
    }
    wait_released(&file).await
}

/// Detaches `device` (whatever backs it) and waits for its release.
pub async fn detach(device: &Path) -> io::Result<()> {
    let name = device
        .file_name()
        .ok_or_else(|| io::Error::other(format!("{} is not a device path", device.display())))?
        .to_string_lossy()
        .into_owned();
    let Some(dev) = read_device(&name) else {
        return Ok(());
    };
    if !dev.detaching {
        losetup(&["--detach", &device.to_string_lossy()]).await?;
    }
    let deadline = Instant::now() + RELEASE_TIMEOUT;
    while read_device(&name).is_some_and(|d| d.backing == dev.backing) {
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!(
                    "{} is still open elsewhere; detach is pending",
                    device.display()
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Tells the loop driver the backing file grew.
pub async fn refresh_capacity(dev: &Path) -> io::Result<()> {
    losetup(&["--set-capacity", &dev.to_string_lossy()])
        .await
        .map(|_| ())
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
