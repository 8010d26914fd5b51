//! NodeExpandVolume: make the node see a volume the controller grew (loop
//! device capacity, then the filesystem, online).

use std::path::Path;

use crate::capability::Capability;
use crate::csi;
use crate::driver::Driver;
use crate::error::{CsiError, CsiResult};
use crate::limiter::volume_key;
use crate::mount::{filesystem, loopdev};
use crate::node::{member, source};
use crate::validate;
use crate::volume::{Backing, Volume};

pub async fn expand(
    d: &Driver,
    req: csi::NodeExpandVolumeRequest,
) -> CsiResult<csi::NodeExpandVolumeResponse> {
    let id = validate::id(&req.volume_id, "volume_id")?.to_string();
    if req.volume_path.is_empty() {
        return Err(CsiError::Missing("volume_path"));
    }
    let _guard = d.limiter.try_acquire(&[volume_key(&id)])?;
    let vol = d.volume(&id).await?;
    let node = vol.node(&d.config.node_id);
    let known = node.is_some_and(|n| {
        n.targets.contains_key(&req.volume_path)
            || n.stage.as_ref().is_some_and(|s| s.path == req.volume_path)
    });
    if !known {
        return Err(CsiError::NotFound(format!(
            "volume {id:?} is neither staged nor published at {:?} on this node",
            req.volume_path
        )));
    }
    if let Backing::Member { .. } = &vol.backing {
        return expand_member(d, &vol, &req).await;
    }
    let Backing::BlockFile { fs_type } = &vol.backing else {
        // A directory volume has no device or filesystem of its own to grow.
        return Ok(csi::NodeExpandVolumeResponse {
            capacity_bytes: vol.capacity_bytes as i64,
        });
    };
    let stage = node.and_then(|n| n.stage.as_ref()).ok_or_else(|| {
        CsiError::FailedPrecondition(format!("volume {id:?} is not staged on this node"))
    })?;
    let file = d.backend_path(&vol)?;
    let dev = loopdev::find(&file)
        .map_err(|e| CsiError::io("find loop device of", &file, e))?
        .ok_or_else(|| {
            CsiError::FailedPrecondition(format!("volume {id:?} has no loop device attached"))
        })?;
    loopdev::refresh_capacity(&dev)
        .await
        .map_err(|e| CsiError::io("refresh capacity of", &dev, e))?;
    if !stage.capability.is_block() {
        let fs = stage.capability.fs_type().unwrap_or(fs_type);
        filesystem::grow(&dev, Path::new(&stage.path), fs)
            .await
            .map_err(|e| CsiError::io("grow filesystem on", &dev, e))?;
    }
    let size = loopdev::size_bytes(&dev).map_err(|e| CsiError::io("size of", &dev, e))?;
    tracing::info!(volume_id = %id, bytes = size, "volume expanded on node");
    Ok(csi::NodeExpandVolumeResponse {
        capacity_bytes: size as i64,
    })
}

/// A member volume grows in the member cluster; on this node only a member
/// CSI volume's own plugin may have work to do (a filesystem to grow).
async fn expand_member(
    d: &Driver,
    vol: &Volume,
    req: &csi::NodeExpandVolumeRequest,
) -> CsiResult<csi::NodeExpandVolumeResponse> {
    let node_id = &d.config.node_id;
    let requested = req
        .capacity_range
        .as_ref()
        .map_or(0, |r| r.required_bytes.max(0));
    let unchanged = csi::NodeExpandVolumeResponse {
        capacity_bytes: requested.max(vol.capacity_bytes.min(i64::MAX as u64) as i64),
    };
    let src = source::of(d, vol, node_id)?;
    let Some(v) = source::proxied(&src) else {
        return Ok(unchanged);
    };
    let node = vol.node(node_id);
    let stage = node.and_then(|n| n.stage.as_ref());
    let cap = match req.volume_capability.as_ref() {
        Some(c) => Some(Capability::from_wire(c, "volume_capability")?),
        None => stage.map(|s| s.capability.clone()),
    };
    let staging = stage.map(|s| Path::new(&s.path));
    let grown = member::expand_proxied(
        d,
        &v,
        Path::new(&req.volume_path),
        staging,
        req.capacity_range,
        cap.as_ref(),
    )
    .await?;
    Ok(match grown {
        Some(bytes) => csi::NodeExpandVolumeResponse {
            capacity_bytes: bytes,
        },
        None => unchanged,
    })
}
