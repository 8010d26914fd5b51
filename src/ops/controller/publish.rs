//! ControllerPublishVolume / ControllerUnpublishVolume: NODE_READY on a node.

use crate::csi;
use crate::domain::capability::Capability;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::state::{self, AttachLimit, Step};
use crate::domain::validate;
use crate::domain::volume::Progress;
use crate::ops::driver::Driver;
use crate::rt::limiter::volume_key;
use crate::store::Limits;

pub async fn publish(
    d: &Driver,
    req: csi::ControllerPublishVolumeRequest,
) -> CsiResult<csi::ControllerPublishVolumeResponse> {
    let id = validate::id(&req.volume_id, "volume_id")?.to_string();
    let node_id = validate::id(&req.node_id, "node_id")?.to_string();
    let cap = Capability::required(req.volume_capability.as_ref(), "volume_capability")?;
    validate::secrets(&req.secrets)?;
    validate::map(&req.volume_context, "volume_context")?;

    let _guard = d.limiter.try_acquire(&[volume_key(&id)])?;
    let vol = d.existing_volume_to_change(&id).await?;
    if !d.backend.node_known(&node_id).await? {
        return Err(CsiError::NodeNotFound(node_id));
    }
    let limit = match d.config.max_volumes_per_node {
        0 => None,
        max => {
            let attached_on_node = d.store.attached_count(&node_id)?;
            Some(AttachLimit {
                attached_on_node,
                max,
            })
        }
    };
    let (attached, new) =
        match state::controller_publish(&vol, &node_id, req.readonly, &cap, limit)? {
            Step::Unchanged => (vol, false),
            Step::Next(next) => {
                // The intent first, so no member attachment can exist that no
                // record knows of (a cancelled call or a crash after creating it
                // would leak it); the attach limit is enforced in this commit.
                let max = d.config.max_volumes_per_node;
                let limits = Limits {
                    attach: (max > 0).then(|| (node_id.clone(), max)),
                    capacity: None,
                };
                d.put_volume_limited(&next, limits).await?;
                (*next, true)
            }
        };
    // A volume that moves with its pod changes home first: the move's
    // outcome is recorded before the new member's access claim is made.
    let attached = match d.backend.moved_home(&attached, &node_id).await {
        Ok(None) => attached,
        Ok(Some(backing)) => {
            let mut moved = attached.clone();
            moved.backing = backing;
            d.put_volume(&moved).await?;
            tracing::info!(volume_id = %id, node_id = %node_id, backing = ?moved.backing, "volume moved: its new member holds it now");
            moved
        }
        Err(e) => {
            d.note_failure(&attached, "ControllerPublishVolume", &e)
                .await;
            return Err(e);
        }
    };
    let attachment = attached.node(&node_id).and_then(|n| n.attachment.as_ref());
    let mut context = attachment
        .map(|a| a.publish_context.clone())
        .unwrap_or_default();
    let done = attachment.is_some_and(|a| a.progress == Progress::Done);
    if context.is_empty() || !done {
        // Attach (again): a new attachment, one whose attach failed or was
        // cut short, or a record rebuilt from an untrusted copy. The
        // backend's attach is idempotent.
        context = match d.backend.attach(&attached, &node_id).await {
            Ok(context) => context,
            Err(e) => {
                d.note_failure(&attached, "ControllerPublishVolume", &e)
                    .await;
                return Err(e);
            }
        };
        // NODE_READY is reached only now: until then the record held the
        // intent, which PHASE does not count. An outcome: durable for a
        // member volume; for a local one (whose attach does nothing) with
        // no sync of its own, since a crash that loses it only shows the
        // attachment pending until its next ControllerPublishVolume.
        let reached = state::attached(&attached, &node_id, context.clone());
        if reached != attached {
            d.put_outcome(&reached).await?;
        }
    }
    if new {
        tracing::info!(volume_id = %id, node_id = %node_id, readonly = req.readonly, "volume NODE_READY");
    }
    Ok(csi::ControllerPublishVolumeResponse {
        publish_context: context.into_iter().collect(),
    })
}

pub async fn unpublish(
    d: &Driver,
    req: csi::ControllerUnpublishVolumeRequest,
) -> CsiResult<csi::ControllerUnpublishVolumeResponse> {
    let id = validate::id(&req.volume_id, "volume_id")?.to_string();
    if !req.node_id.is_empty() {
        validate::id(&req.node_id, "node_id")?;
    }
    validate::secrets(&req.secrets)?;
    let _guard = d.limiter.try_acquire(&[volume_key(&id)])?;
    let Some(vol) = d.volume_to_change(&id).await? else {
        // A volume that no longer exists is unpublished from every node.
        return Ok(csi::ControllerUnpublishVolumeResponse {});
    };
    // An empty node_id means "from every node".
    let nodes: Vec<String> = if req.node_id.is_empty() {
        vol.attached_nodes().map(str::to_string).collect()
    } else {
        vec![req.node_id.clone()]
    };
    let mut current = vol;
    for node_id in nodes {
        if let Step::Next(next) = state::controller_unpublish(&current, &node_id) {
            if let Err(e) = d.backend.detach(&current, &node_id).await {
                d.note_failure(&current, "ControllerUnpublishVolume", &e)
                    .await;
                return Err(e);
            }
            d.put_volume(&next).await?;
            tracing::info!(volume_id = %id, node_id = %node_id, "volume detached from node");
            current = *next;
        }
    }
    Ok(csi::ControllerUnpublishVolumeResponse {})
}
