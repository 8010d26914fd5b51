//! Read-only controller calls: ListVolumes, ControllerGetVolume,
//! ValidateVolumeCapabilities.

use crate::csi;
use crate::domain::capability::Capability;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::page_token;
use crate::domain::validate;
use crate::domain::volume::{Lifecycle, Volume};
use crate::ops::controller::wire;
use crate::ops::driver::Driver;

async fn status(d: &Driver, vol: &Volume) -> (Vec<String>, csi::VolumeCondition) {
    let nodes = vol.attached_nodes().map(str::to_string).collect();
    (nodes, wire::condition(&d.backend.health(vol).await))
}

pub async fn list_volumes(
    d: &Driver,
    req: csi::ListVolumesRequest,
) -> CsiResult<csi::ListVolumesResponse> {
    let limit = page_token::page_size(req.max_entries)?;
    let after = page_token::decode(&req.starting_token)?;
    let page = d
        .db(move |s| s.list_volumes(after.as_deref(), limit))
        .await?;
    let mut entries = Vec::with_capacity(page.items.len());
    for vol in &page.items {
        let (published_node_ids, condition) = status(d, vol).await;
        entries.push(csi::list_volumes_response::Entry {
            volume: Some(wire::volume(vol)),
            status: Some(csi::list_volumes_response::VolumeStatus {
                published_node_ids,
                volume_condition: Some(condition),
            }),
        });
    }
    Ok(csi::ListVolumesResponse {
        entries,
        next_token: page
            .next
            .as_deref()
            .map(page_token::encode)
            .unwrap_or_default(),
    })
}

pub async fn get_volume(
    d: &Driver,
    req: csi::ControllerGetVolumeRequest,
) -> CsiResult<csi::ControllerGetVolumeResponse> {
    let id = validate::id(&req.volume_id, "volume_id")?;
    let vol = d.volume(id).await?;
    if vol.lifecycle != Lifecycle::Ready {
        return Err(CsiError::VolumeNotFound(vol.id));
    }
    let (published_node_ids, condition) = status(d, &vol).await;
    Ok(csi::ControllerGetVolumeResponse {
        volume: Some(wire::volume(&vol)),
        status: Some(csi::controller_get_volume_response::VolumeStatus {
            published_node_ids,
            volume_condition: Some(condition),
        }),
    })
}

pub async fn validate_capabilities(
    d: &Driver,
    req: csi::ValidateVolumeCapabilitiesRequest,
) -> CsiResult<csi::ValidateVolumeCapabilitiesResponse> {
    let id = validate::id(&req.volume_id, "volume_id")?;
    let caps = Capability::list_from_wire(&req.volume_capabilities, "volume_capabilities")?;
    validate::map(&req.parameters, "parameters")?;
    validate::map(&req.volume_context, "volume_context")?;
    validate::secrets(&req.secrets)?;
    let vol = d.volume(id).await?;
    if vol.lifecycle != Lifecycle::Ready {
        return Err(CsiError::VolumeNotFound(vol.id));
    }
    let unsupported: Vec<&Capability> = caps
        .iter()
        .filter(|c| {
            !vol.capabilities
                .iter()
                .any(|v| v.same_access(c) && v.mode == c.mode)
        })
        .collect();
    if !unsupported.is_empty() {
        return Ok(csi::ValidateVolumeCapabilitiesResponse {
            confirmed: None,
            message: format!(
                "volume {:?} was created for {:?}; it cannot serve {:?}",
                vol.id, vol.capabilities, unsupported
            ),
        });
    }
    let params: std::collections::HashMap<String, String> =
        vol.parameters.clone().into_iter().collect();
    if !req.parameters.is_empty() && req.parameters != params {
        return Ok(csi::ValidateVolumeCapabilitiesResponse {
            confirmed: None,
            message: format!("volume {:?} was created with different parameters", vol.id),
        });
    }
    Ok(csi::ValidateVolumeCapabilitiesResponse {
        confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
            volume_context: req.volume_context,
            volume_capabilities: req.volume_capabilities,
            parameters: req.parameters,
            mutable_parameters: req.mutable_parameters,
        }),
        message: String::new(),
    })
}
