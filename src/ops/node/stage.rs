//! NodeStageVolume / NodeUnstageVolume: VOL_READY on this node.

use std::path::Path;

use crate::csi;
use crate::domain::capability::Capability;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::state::{self, Step};
use crate::domain::validate;
use crate::domain::volume::{Progress, Volume};
use crate::ops::driver::Driver;
use crate::ops::node::sources::{self, Staging};
use crate::ops::node::{node_local, paths};
use crate::rt::limiter::volume_key;

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

/// A node plugin (`--mode node`) that holds no record of a volume may
/// still be asked to unwind it: its node-local member record is dropped
/// once the volume is unstaged, and the CO repeats an unstage or unpublish
/// whose answer it lost. Nothing mounted at `path` means there is nothing
/// left to do. A store shared with a controller keeps NOT_FOUND.
pub fn nothing_to_undo(d: &Driver, path: &str) -> bool {
    !d.config.mode.controller() && !sources::is_mounted(Path::new(path))
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
    paths::check_path(&path, &d.config.state_dir, "staging_target_path")?;
    let node_id = d.config.node_id.clone();

    let _guard = d.limiter.try_acquire(&[volume_key(&id)])?;
    let vol = node_local::record_for_stage(d, &id, &req.publish_context, &req.volume_context, &cap)
        .await?;
    let attach_required = state::stage_needs_attachment(&vol, d.config.mode.controller());
    let next = match state::node_stage(&vol, &node_id, &path, &cap, attach_required)? {
        Step::Unchanged => {
            let src = sources::of(d, &vol, &node_id).ok();
            if src
                .as_ref()
                .is_some_and(|s| s.is_staged(Path::new(&path), &cap))
            {
                return Ok(csi::NodeStageVolumeResponse {});
            }
            if src.as_ref().is_some_and(|s| s.delegates()) {
                // Its plugin may stage without a mount here: ask it again.
                tracing::debug!(volume_id = %id, staging = %path, "repeating the stage through the member plugin");
            } else {
                // Recorded as staged but the mount is gone: stage again.
                tracing::warn!(volume_id = %id, staging = %path, "staged volume lost its mount; restoring");
            }
            vol.clone()
        }
        Step::Next(next) => {
            d.put_intent(&next).await?;
            *next
        }
    };
    let at = Staging {
        path: Path::new(&path),
        cap: &cap,
        readonly: staged_readonly(&next, &node_id, &cap),
    };
    let staged = match sources::of(d, &next, &node_id) {
        Ok(src) => src.stage(at).await,
        Err(e) => Err(e),
    };
    match staged {
        Ok(device) => {
            d.put_outcome(&state::stage_done(&next, &node_id, device))
                .await?;
            tracing::info!(volume_id = %id, staging = %path, "volume VOL_READY");
            Ok(csi::NodeStageVolumeResponse {})
        }
        Err(e) => {
            // Forget the intent: nothing is staged, a retry starts afresh
            // (and a node-local record nothing uses is dropped).
            if next
                .node(&node_id)
                .and_then(|n| n.stage.as_ref())
                .is_some_and(|s| s.progress != Progress::Done)
            {
                node_local::commit(d, &state::stage_removed(&next, &node_id), &node_id).await?;
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
    let vol = match d.find_volume(&id).await? {
        Some(v) => v,
        None if nothing_to_undo(d, &path) => return Ok(csi::NodeUnstageVolumeResponse {}),
        None => return Err(CsiError::VolumeNotFound(id)),
    };
    let Step::Next(next) = state::node_unstage(&vol, &node_id, &path)? else {
        return Ok(csi::NodeUnstageVolumeResponse {});
    };
    d.put_intent(&next).await?;
    let cap = next
        .node(&node_id)
        .and_then(|n| n.stage.as_ref())
        .map(|s| s.capability.clone())
        .ok_or_else(|| CsiError::Internal("stage record vanished".into()))?;
    let src = sources::for_teardown(d, &next, &node_id)?;
    src.unstage(Path::new(&path), &cap).await?;
    node_local::commit(d, &state::stage_removed(&next, &node_id), &node_id).await?;
    tracing::info!(volume_id = %id, staging = %path, "volume unstaged");
    Ok(csi::NodeUnstageVolumeResponse {})
}
