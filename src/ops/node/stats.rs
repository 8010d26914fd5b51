//! NodeGetVolumeStats: usage of a staged or published volume, and its condition.

use std::path::Path;

use crate::csi::{self, volume_usage::Unit};
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::validate;
use crate::domain::volume::{Backing, Volume};
use crate::ops::driver::Driver;
use crate::ops::node::sources;
use crate::os::dir_usage;
use crate::os::mountinfo;

/// The record of `path` on this node: (is it a staging path, capability).
fn locate<'a>(
    vol: &'a Volume,
    node_id: &str,
    path: &str,
) -> Option<(bool, &'a crate::domain::capability::Capability)> {
    let node = vol.node(node_id)?;
    if let Some(p) = node.targets.get(path) {
        return Some((false, &p.capability));
    }
    node.stage
        .as_ref()
        .filter(|s| s.path == path)
        .map(|s| (true, &s.capability))
}

/// A directory volume's own figure: what its tree holds against the
/// capacity it was given (the filesystem's free space caps what is left).
/// None when the tree is too large to count in time.
fn directory_bytes(
    vol: &Volume,
    root: &Path,
    fs_available: i64,
) -> CsiResult<Option<csi::VolumeUsage>> {
    let counted = dir_usage::measure(root, dir_usage::WALK_BUDGET, dir_usage::WALK_MAX_ENTRIES)
        .map_err(|e| CsiError::io("measure", root, e))?;
    let Some(counted) = counted else {
        tracing::warn!(volume_id = %vol.id, path = %root.display(), "directory volume too large to measure within bounds; its usage is not reported");
        return Ok(None);
    };
    let capacity = vol.capacity_bytes.min(i64::MAX as u64) as i64;
    let used = counted.bytes.min(i64::MAX as u64) as i64;
    Ok(Some(csi::VolumeUsage {
        available: capacity.saturating_sub(used).max(0).min(fs_available),
        total: capacity,
        used,
        unit: Unit::Bytes as i32,
    }))
}

/// Kubelet v1.28 asks about a raw block volume at its own map path
/// (`volumeDevices/<pv>/dev/<pod uid>`, a bind of the published device),
/// which no CSI call named: accepted when it is the very device published
/// at one of the volume's targets on this node.
fn same_device<'a>(
    vol: &'a Volume,
    node_id: &str,
    path: &Path,
) -> Option<(bool, &'a crate::domain::capability::Capability)> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let asked = std::fs::metadata(path).ok()?;
    if !asked.file_type().is_block_device() {
        return None;
    }
    vol.node(node_id)?.targets.iter().find_map(|(target, p)| {
        let known = std::fs::metadata(target).ok()?;
        (p.capability.is_block()
            && known.file_type().is_block_device()
            && known.rdev() == asked.rdev())
        .then_some((false, &p.capability))
    })
}

pub async fn stats(
    d: &Driver,
    req: csi::NodeGetVolumeStatsRequest,
) -> CsiResult<csi::NodeGetVolumeStatsResponse> {
    let id = validate::id(&req.volume_id, "volume_id")?;
    if req.volume_path.is_empty() {
        return Err(CsiError::Missing("volume_path"));
    }
    let vol = d.volume(id).await?;
    let found = locate(&vol, &d.config.node_id, &req.volume_path)
        .or_else(|| same_device(&vol, &d.config.node_id, Path::new(&req.volume_path)));
    let Some((is_staging, cap)) = found else {
        return Err(CsiError::NotFound(format!(
            "volume {id:?} is neither staged nor published at {:?} on this node",
            req.volume_path
        )));
    };
    let path = Path::new(&req.volume_path);
    let node_id = &d.config.node_id;
    let src = sources::of(d, &vol, node_id).ok();
    let staging = vol
        .node(node_id)
        .and_then(|n| n.stage.as_ref())
        .map(|s| Path::new(&s.path));
    // A member CSI volume's own plugin knows its usage best.
    let mut forwarded = None;
    let mut plugin_error = None;
    if let (Some(src), false) = (&src, is_staging) {
        match src.forwarded_stats(path, staging).await {
            Ok(reply) => forwarded = reply,
            // Reported as the volume's condition, with what this node sees.
            Err(e) => plugin_error = Some(e.to_string()),
        }
    }
    let probe = if cap.is_block() && is_staging {
        sources::staged_source(path, cap)
    } else {
        path.to_path_buf()
    };
    let mut health = match src.as_ref().and_then(|s| s.own_health()) {
        Some(h) => h,
        None => d.backend.health(&vol).await,
    };
    if let Some(why) = plugin_error {
        health.abnormal = true;
        health.message = why;
    }
    let mount =
        mountinfo::mounted_at(&probe).map_err(|e| CsiError::io("read mountinfo for", &probe, e))?;
    if !health.abnormal && mount.is_none() {
        health.abnormal = true;
        health.message = format!("{} is recorded but not mounted", probe.display());
    }
    if let Some(mut reply) = forwarded {
        if reply.volume_condition.is_none() {
            reply.volume_condition = Some(crate::ops::controller::wire::condition(&health));
        }
        return Ok(reply);
    }
    let condition = Some(crate::ops::controller::wire::condition(&health));
    if mount.is_none() {
        return Ok(csi::NodeGetVolumeStatsResponse {
            usage: vec![],
            volume_condition: condition,
        });
    }
    let usage = if cap.is_block() {
        let size = src
            .as_ref()
            .and_then(|s| s.block_bytes())
            .unwrap_or(vol.capacity_bytes);
        vec![csi::VolumeUsage {
            available: 0,
            total: size as i64,
            used: 0,
            unit: Unit::Bytes as i32,
        }]
    } else {
        let st = nix::sys::statvfs::statvfs(&probe)
            .map_err(|e| CsiError::io("statvfs", &probe, e.into()))?;
        let frag = st.fragment_size() as i64;
        let fs_bytes = csi::VolumeUsage {
            available: st.blocks_available() as i64 * frag,
            total: st.blocks() as i64 * frag,
            used: (st.blocks() as i64 - st.blocks_free() as i64) * frag,
            unit: Unit::Bytes as i32,
        };
        let bytes = if vol.backing == Backing::Directory {
            directory_bytes(&vol, &probe, fs_bytes.available)?
        } else {
            Some(fs_bytes)
        };
        bytes
            .into_iter()
            .chain(std::iter::once(csi::VolumeUsage {
                available: st.files_available() as i64,
                total: st.files() as i64,
                used: st.files() as i64 - st.files_free() as i64,
                unit: Unit::Inodes as i32,
            }))
            .collect()
    };
    Ok(csi::NodeGetVolumeStatsResponse {
        usage,
        volume_condition: condition,
    })
}
