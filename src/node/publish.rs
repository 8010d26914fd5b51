//! NodePublishVolume / NodeUnpublishVolume: PUBLISHED at a target path.

use std::path::Path;

use crate::capability::Capability;
use crate::csi;
use crate::driver::Driver;
use crate::error::{CsiError, CsiResult};
use crate::limiter::volume_key;
use crate::node::{ephemeral, mounter, stage};
use crate::state::{self, StagingRule, Step};
use crate::validate;
use crate::volume::Progress;

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
    mounter::check_path(&target, &d.config.state_dir, "target_path")?;
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
            if mounter::is_mounted(Path::new(&target)) {
                return Ok(csi::NodePublishVolumeResponse {});
            }
            tracing::warn!(volume_id = %id, target = %target, "published volume lost its mount; restoring");
            vol.clone()
        }
        Step::Next(next) => {
            d.put_volume(&next).await?;
            *next
        }
    };
    let from = if next.ephemeral {
        ephemeral::data_dir(d, &next)?
    } else {
        mounter::staged_source(Path::new(&staging), &cap)
    };
    // A read-only stage stays read-only in every publication: a bind
    // remount without MS_RDONLY would make the new mount writable again.
    let readonly = req.readonly || stage::staged_readonly(&next, &node_id, &cap);
    // Binding a staging path whose mount is gone would hand the workload an
    // empty directory on the node's own disk instead of the volume.
    let published = if !next.ephemeral && !mounter::is_mounted(&from) {
        Err(CsiError::FailedPrecondition(format!(
            "volume {id:?} is recorded as staged at {staging:?} but nothing is mounted at {}; \
             NodeStageVolume must be repeated first",
            from.display()
        )))
    } else {
        mounter::publish(&from, Path::new(&target), &cap, readonly)
    };
    match published {
        Ok(()) => {
            d.put_volume(&state::publish_done(&next, &node_id, &target))
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
                if rolled_back.ephemeral && rolled_back.nodes.is_empty() {
                    ephemeral::remove(d, &rolled_back).await?;
                } else {
                    d.put_volume(&rolled_back).await?;
                }
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
    let vol = d.volume(&id).await?;
    let Step::Next(next) = state::node_unpublish(&vol, &node_id, &target) else {
        return Ok(csi::NodeUnpublishVolumeResponse {});
    };
    d.put_volume(&next).await?;
    mounter::unpublish(Path::new(&target))?;
    let done = state::publish_removed(&next, &node_id, &target);
    if done.ephemeral && done.nodes.is_empty() {
        ephemeral::remove(d, &done).await?;
    } else {
        d.put_volume(&done).await?;
    }
    tracing::info!(volume_id = %id, target = %target, "volume unpublished");
    Ok(csi::NodeUnpublishVolumeResponse {})
}
