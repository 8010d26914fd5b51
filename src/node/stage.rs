//! NodeStageVolume / NodeUnstageVolume: VOL_READY on this node.

use std::path::Path;

use crate::capability::Capability;
use crate::csi;
use crate::driver::Driver;
use crate::error::CsiResult;
use crate::limiter::volume_key;
use crate::node::mounter;
use crate::state::{self, Step};
use crate::validate;
use crate::volume::{Backing, Progress, Volume};

pub fn default_fs(vol: &Volume) -> &str {
    match &vol.backing {
        Backing::BlockFile { fs_type } if !fs_type.is_empty() => fs_type,
        _ => "ext4",
    }
}

/// Whether the volume is staged read-only on `node_id`: a reader-only access
/// mode, or an attachment ControllerPublishVolume made read-only ("the SP
/// MUST publish the volume in readonly mode").
pub fn staged_readonly(vol: &Volume, node_id: &str, cap: &Capability) -> bool {
    cap.mode.read_only()
        || vol
            .node(node_id)
            .and_then(|n| n.attachment.as_ref())
            .is_some_and(|a| a.readonly)
}

pub async fn stage(
    d: &Driver,
    req: csi::NodeStageVolumeRequest,
) -> CsiResult<csi::NodeStageVolumeResponse> {
    let id = validate::id(&req.volume_id, "volume_id")?.to_string();
    let path = validate::path(&req.staging_target_path, "staging_target_path")?;
    let cap = Capability::required(req.volume_capability.as_ref(), "volume_capability")?;
    validate::map(&req.publish_context, "publish_context")?;
    validate::map(&req.volume_context, "volume_context")?;
    validate::secrets(&req.secrets)?;
    mounter::check_path(&path, &d.config.state_dir, "staging_target_path")?;
    let node_id = d.config.node_id.clone();

    let _guard = d.limiter.try_acquire(&[volume_key(&id)])?;
    let vol = d.volume(&id).await?;
    // Attachment is recorded by this process's controller only when both
    // services share the store (standalone `--mode all`).
    let attach_required = d.config.mode.controller();
    let next = match state::node_stage(&vol, &node_id, &path, &cap, attach_required)? {
        Step::Unchanged => {
            if mounter::is_mounted(&mounter::staged_source(Path::new(&path), &cap)) {
                return Ok(csi::NodeStageVolumeResponse {});
            }
            // Recorded as staged but the mount is gone: stage again.
            tracing::warn!(volume_id = %id, staging = %path, "staged volume lost its mount; restoring");
            vol.clone()
        }
        Step::Next(next) => {
            d.put_volume(&next).await?;
            *next
        }
    };
    let source = d.backend.node_source(&next)?;
    let readonly = staged_readonly(&next, &node_id, &cap);
    match mounter::stage(&source, Path::new(&path), &cap, default_fs(&next), readonly).await {
        Ok(device) => {
            d.put_volume(&state::stage_done(&next, &node_id, device))
                .await?;
            tracing::info!(volume_id = %id, staging = %path, "volume VOL_READY");
            Ok(csi::NodeStageVolumeResponse {})
        }
        Err(e) => {
            // Forget the intent: nothing is staged, a retry starts afresh.
            if next
                .node(&node_id)
                .and_then(|n| n.stage.as_ref())
                .is_some_and(|s| s.progress != Progress::Done)
            {
                d.put_volume(&state::stage_removed(&next, &node_id)).await?;
            }
            Err(e)
        }
    }
}

pub async fn unstage(
    d: &Driver,
    req: csi::NodeUnstageVolumeRequest,
) -> CsiResult<csi::NodeUnstageVolumeResponse> {
    let id = validate::id(&req.volume_id, "volume_id")?.to_string();
    let path = validate::path(&req.staging_target_path, "staging_target_path")?;
    let node_id = d.config.node_id.clone();

    let _guard = d.limiter.try_acquire(&[volume_key(&id)])?;
    let vol = d.volume(&id).await?;
    let Step::Next(next) = state::node_unstage(&vol, &node_id, &path)? else {
        return Ok(csi::NodeUnstageVolumeResponse {});
    };
    d.put_volume(&next).await?;
    let cap = next
        .node(&node_id)
        .and_then(|n| n.stage.as_ref())
        .map(|s| s.capability.clone())
        .ok_or_else(|| crate::error::CsiError::Internal("stage record vanished".into()))?;
    let source = d.backend.node_source(&next)?;
    mounter::unstage(&source, Path::new(&path), &cap).await?;
    d.put_volume(&state::stage_removed(&next, &node_id)).await?;
    tracing::info!(volume_id = %id, staging = %path, "volume unstaged");
    Ok(csi::NodeUnstageVolumeResponse {})
}
