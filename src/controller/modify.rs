//! ControllerModifyVolume: change the admin-allowed mutable parameters.

use crate::controller::provision::check_mutable;
use crate::csi;
use crate::driver::Driver;
use crate::error::{CsiError, CsiResult};
use crate::limiter::volume_key;
use crate::validate;
use crate::volume::Lifecycle;

pub async fn modify_volume(
    d: &Driver,
    req: csi::ControllerModifyVolumeRequest,
) -> CsiResult<csi::ControllerModifyVolumeResponse> {
    let id = validate::id(&req.volume_id, "volume_id")?.to_string();
    validate::secrets(&req.secrets)?;
    let _guard = d.limiter.try_acquire(&[volume_key(&id)])?;
    let mut vol = d.volume(&id).await?;
    if vol.lifecycle != Lifecycle::Ready {
        return Err(CsiError::VolumeNotFound(id));
    }
    let changes = check_mutable(d, &req.mutable_parameters)?;
    let mut next = vol.mutable_parameters.clone();
    next.extend(changes);
    if next != vol.mutable_parameters {
        vol.mutable_parameters = next;
        d.put_volume(&vol).await?;
        tracing::info!(volume_id = %id, parameters = ?vol.mutable_parameters, "volume modified");
    }
    Ok(csi::ControllerModifyVolumeResponse {})
}
