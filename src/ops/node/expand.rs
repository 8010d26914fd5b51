//! NodeExpandVolume: make the node see a volume the controller grew. What
//! that takes is the volume's source's business: a loop device's capacity
//! and its filesystem, a member driver's plugin, or nothing at all.

use std::path::Path;

use crate::csi;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::validate;
use crate::ops::driver::Driver;
use crate::ops::node::sources::{self, Expansion};
use crate::rt::limiter::volume_key;

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
    let src = sources::of(d, &vol, &d.config.node_id)?;
    let capacity_bytes = src
        .expand(Expansion {
            volume_id: &id,
            capacity_bytes: vol.capacity_bytes,
            path: Path::new(&req.volume_path),
            stage: node.and_then(|n| n.stage.as_ref()),
            capacity_range: req.capacity_range,
            capability: req.volume_capability.as_ref(),
        })
        .await?;
    Ok(csi::NodeExpandVolumeResponse { capacity_bytes })
}
