//! NodePublishVolume / NodeUnpublishVolume: PUBLISHED at a target path.

use std::path::Path;

use crate::csi;
use crate::domain::capability::Capability;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::state::{self, StagingRule, Step};
use crate::domain::validate;
use crate::domain::volume::Progress;
use crate::ops::driver::Driver;
use crate::ops::node::sources::{self, Publishing};
use crate::ops::node::{ephemeral, node_local, paths, stage};
use crate::rt::limiter::volume_key;

pub async fn publish(
    d: &Driver,
    req: csi::NodePublishVolumeRequest,
) -> CsiResult<csi::NodePublishVolumeResponse> {
    let id = validate::id(&req.volume_id, "volume_id")?.to_string();
    let target = validate::path(&req.target_path, "target_path")?;
    let cap = Capability::required(req.volume_capability.as_ref(), "volume_capability")?;
    validate::map(&req.publish_context, "publish_context")?;
    validate::map(&req.volume_context, "volume_context")?;
    validate::secrets(&req.secrets)?;
    let is_ephemeral = ephemeral::requested(&req.volume_context);
    let staging = if is_ephemeral {
        String::new()
    } else {
        validate::path(&req.staging_target_path, "staging_target_path")?
    };
    // Before anything is recorded or created (an inline volume included).
    let resolved_target = paths::check_path(&target, &d.config.state_dir, "target_path")?;
    if !is_ephemeral {
        paths::check_apart(&target, &resolved_target, &staging)?;
    }
    let node_id = d.config.node_id.clone();

    let _guard = d.limiter.try_acquire(&[volume_key(&id)])?;
    let vol = if is_ephemeral {
        ephemeral::ensure(d, &id, &req.volume_context, &cap).await?
    } else {
        d.volume(&id).await?
    };
    let rule = if vol.ephemeral {
        StagingRule::NotUsed
    } else {
        StagingRule::Required
    };
    let next = match state::node_publish(
        &vol,
        &node_id,
        &target,
        &staging,
        req.readonly,
        &cap,
        rule,
    )? {
        Step::Unchanged => {
            if sources::is_mounted(Path::new(&target)) {
                return Ok(csi::NodePublishVolumeResponse {});
            }
            tracing::warn!(volume_id = %id, target = %target, "published volume lost its mount; restoring");
            vol.clone()
        }
        Step::Next(next) => {
            d.put_intent(&next).await?;
            *next
        }
    };
    let p = Publishing {
        volume_id: &id,
        staging: (!next.ephemeral).then(|| Path::new(&staging)),
        target: Path::new(&target),
        cap: &cap,
        // A read-only stage stays read-only in every publication: a bind
        // remount without MS_RDONLY would make the new mount writable again.
        readonly: req.readonly || stage::staged_readonly(&next, &node_id, &cap),
    };
    let published = match sources::of(d, &next, &node_id) {
        Ok(src) => src.publish(p).await,
        Err(e) => Err(e),
    };
    match published {
        Ok(()) => {
            d.put_outcome(&state::publish_done(&next, &node_id, &target))
                .await?;
            tracing::info!(volume_id = %id, target = %target, readonly = req.readonly, "volume PUBLISHED");
            Ok(csi::NodePublishVolumeResponse {})
        }
        Err(e) => {
            let pending = next
                .node(&node_id)
                .and_then(|n| n.targets.get(&target))
                .is_some_and(|p| p.progress != Progress::Done);
            if pending {
                let rolled_back = state::publish_removed(&next, &node_id, &target);
                node_local::commit(d, &rolled_back, &node_id).await?;
            }
            Err(e)
        }
    }
}

pub async fn unpublish(
    d: &Driver,
    req: csi::NodeUnpublishVolumeRequest,
) -> CsiResult<csi::NodeUnpublishVolumeResponse> {
    let id = validate::id(&req.volume_id, "volume_id")?.to_string();
    let target = validate::path(&req.target_path, "target_path")?;
    let node_id = d.config.node_id.clone();

    let _guard = d.limiter.try_acquire(&[volume_key(&id)])?;
    let vol = match d.find_volume(&id).await? {
        Some(v) => v,
        None if stage::nothing_to_undo(d, &target) => {
            return Ok(csi::NodeUnpublishVolumeResponse {})
        }
        None => return Err(CsiError::VolumeNotFound(id)),
    };
    let Step::Next(next) = state::node_unpublish(&vol, &node_id, &target) else {
        return Ok(csi::NodeUnpublishVolumeResponse {});
    };
    d.put_intent(&next).await?;
    let src = sources::for_teardown(d, &next, &node_id)?;
    src.unpublish(Path::new(&target)).await?;
    node_local::commit(
        d,
        &state::publish_removed(&next, &node_id, &target),
        &node_id,
    )
    .await?;
    tracing::info!(volume_id = %id, target = %target, "volume unpublished");
    Ok(csi::NodeUnpublishVolumeResponse {})
}
