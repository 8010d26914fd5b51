//! A file on this node attached through a loop device (the local
//! backend's block-file volumes): a filesystem on it for mount access, the
//! device itself for raw block. Expansion refreshes the loop device's
//! capacity and grows the filesystem online.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::bind::{self, ensure_dir, ensure_file, foreign, mounted, shows, stat};
use super::{Expansion, Source, Staging, BLOCK_DEVICE_FILE};
use crate::domain::capability::Capability;
use crate::domain::error::{CsiError, CsiResult};
use crate::ops::node::paths::guard;
use crate::os::options::MountOptions;
use crate::os::{filesystem, loopdev, syscalls};

#[derive(Debug, Clone)]
pub struct BlockFile {
    file: PathBuf,
    /// The filesystem the volume was created for; empty: the default.
    fs_type: String,
}

impl BlockFile {
    pub fn new(file: PathBuf, fs_type: String) -> Self {
        BlockFile { file, fs_type }
    }

    /// The filesystem made on a blank device when the capability names none.
    fn default_fs(&self) -> &str {
        if self.fs_type.is_empty() {
            "ext4"
        } else {
            &self.fs_type
        }
    }
}

#[async_trait::async_trait]
impl Source for BlockFile {
    async fn stage(&self, at: Staging<'_>) -> CsiResult<Option<String>> {
        let staging = guard(at.path, "staging_target_path")?;
        ensure_dir(&staging)?;
        let file = &self.file;
        let attached_before =
            loopdev::find(file).map_err(|e| CsiError::io("find loop device of", file, e))?;
        // A raw device cannot be made read-only by its mount: the loop
        // device itself is (a filesystem needs a writable device for mkfs
        // and journal replay; its mount is read-only instead).
        let dev = loopdev::attach(file, at.readonly && at.cap.is_block())
            .await
            .map_err(|e| CsiError::io("attach loop device for", file, e))?;
        let staged = stage_device(&dev, &staging, at.cap, self.default_fs(), at.readonly).await;
        if staged.is_err() && attached_before.is_none() {
            // Leave no loop device behind a failed stage. Every step
            // before mounting only reads, and the mount is the last step:
            // nothing was mounted by this call.
            let _ = loopdev::detach_file(file).await;
        }
        staged.map(|_| Some(dev.to_string_lossy().into_owned()))
    }

    async fn unstage(&self, staging: &Path, cap: &Capability) -> CsiResult<()> {
        bind::unstage(staging, cap)?;
        loopdev::detach_file(&self.file)
            .await
            .map_err(|e| CsiError::io("detach loop device of", &self.file, e))
    }

    fn staged_device(&self) -> Option<String> {
        loopdev::find(&self.file)
            .ok()
            .flatten()
            .map(|p| p.display().to_string())
    }

    fn block_bytes(&self) -> Option<u64> {
        std::fs::metadata(&self.file).ok().map(|m| m.len())
    }

    async fn expand(&self, e: Expansion<'_>) -> CsiResult<i64> {
        let id = e.volume_id;
        let stage = e.stage.ok_or_else(|| {
            CsiError::FailedPrecondition(format!("volume {id:?} is not staged on this node"))
        })?;
        let file = &self.file;
        let dev = loopdev::find(file)
            .map_err(|e| CsiError::io("find loop device of", file, e))?
            .ok_or_else(|| {
                CsiError::FailedPrecondition(format!("volume {id:?} has no loop device attached"))
            })?;
        loopdev::refresh_capacity(&dev)
            .await
            .map_err(|e| CsiError::io("refresh capacity of", &dev, e))?;
        if !stage.capability.is_block() {
            // What the device really holds (a stage may have found one).
            let found = filesystem::probe(&dev)
                .await
                .map_err(|e| CsiError::io("probe filesystem on", &dev, e))?;
            let fs = found.as_deref().unwrap_or(self.default_fs());
            // Already filling the device (grown at stage): nothing to do,
            // and no online growth to fail for want of CAP_SYS_RESOURCE.
            let bytes = loopdev::size_bytes(&dev).map_err(|e| CsiError::io("size of", &dev, e))?;
            let filled = fs.starts_with("ext")
                && !filesystem::ext_smaller_than(&dev, bytes)
                    .await
                    .map_err(|e| CsiError::io("read the filesystem size on", &dev, e))?;
            if !filled {
                filesystem::grow(&dev, Path::new(&stage.path), fs)
                    .await
                    .map_err(|e| CsiError::io("grow filesystem on", &dev, e))?;
            }
        }
        let size = loopdev::size_bytes(&dev).map_err(|e| CsiError::io("size of", &dev, e))?;
        tracing::info!(volume_id = %id, bytes = size, "volume expanded on node");
        Ok(size as i64)
    }
}

/// A device grown while its ext filesystem was not mounted (expanded while
/// unstaged, or a NodeExpandVolume whose online growth failed) holds a
/// filesystem smaller than itself: it is grown before mounting, offline.
/// Read-only stages leave the device as it is.
async fn grow_if_outgrown(dev: &Path, fs_type: &str, readonly: bool) -> CsiResult<()> {
    if readonly || !fs_type.starts_with("ext") {
        return Ok(());
    }
    let bytes = loopdev::size_bytes(dev).map_err(|e| CsiError::io("size of", dev, e))?;
    let smaller = filesystem::ext_smaller_than(dev, bytes)
        .await
        .map_err(|e| CsiError::io("read the filesystem size on", dev, e))?;
    if smaller {
        filesystem::grow_ext_offline(dev)
            .await
            .map_err(|e| CsiError::io("grow the filesystem (offline) on", dev, e))?;
        tracing::info!(device = %dev.display(), bytes, "filesystem grown to its device before mounting");
    }
    Ok(())
}

/// Puts the attached device `dev` at `staging`: bound as a device node for
/// raw block, else mounted with its filesystem (made when the device is
/// blank).
async fn stage_device(
    dev: &Path,
    staging: &Path,
    cap: &Capability,
    default_fs: &str,
    readonly: bool,
) -> CsiResult<()> {
    if cap.is_block() {
        let node = staging.join(BLOCK_DEVICE_FILE);
        if mounted(&node)? {
            return if shows(&node, dev)? {
                Ok(())
            } else {
                Err(foreign(&node, dev))
            };
        }
        ensure_file(&node)?;
        syscalls::bind(dev, &node, &MountOptions::parse(&[], readonly))?;
        return Ok(());
    }
    if mounted(staging)? {
        // Ours when it is a filesystem on this very device.
        let same = stat(staging)?.dev() == stat(dev)?.rdev();
        return if same {
            Ok(())
        } else {
            Err(foreign(staging, dev))
        };
    }
    let wanted = cap.fs_type().unwrap_or(default_fs).to_string();
    let existing = filesystem::probe(dev)
        .await
        .map_err(|e| CsiError::io("probe filesystem on", dev, e))?;
    let fs_type = match existing {
        Some(found) if cap.fs_type().is_some_and(|w| w != found) => {
            return Err(CsiError::FailedPrecondition(format!(
                "the volume already holds a {found} filesystem; it cannot be staged as {wanted}"
            )))
        }
        Some(found) => {
            grow_if_outgrown(dev, &found, readonly).await?;
            found
        }
        None => {
            if !filesystem::mkfs_available(&wanted) {
                return Err(CsiError::FailedPrecondition(format!(
                    "mkfs.{wanted} is not installed on this node"
                )));
            }
            filesystem::make(dev, &wanted)
                .await
                .map_err(|e| CsiError::io("make filesystem on", dev, e))?;
            wanted
        }
    };
    let mut opts = MountOptions::parse(cap.mount_flags(), readonly);
    // A clone or a restored snapshot carries its source's XFS UUID, and XFS
    // refuses to mount a second filesystem with a UUID already mounted
    // (EINVAL, "duplicate UUID"): the copies of one volume are staged beside
    // each other all the time.
    if fs_type == "xfs" && !opts.data.iter().any(|o| o == "nouuid") {
        opts.data.push("nouuid".to_string());
    }
    syscalls::mount_fs(dev, staging, &fs_type, &opts)?;
    Ok(())
}
