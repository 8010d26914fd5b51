//! ControllerModifyVolume: change the admin-allowed mutable parameters.

use crate::csi;
use crate::domain::error::CsiResult;
use crate::domain::state::{self, Step};
use crate::domain::validate;
use crate::ops::controller::provision::check_mutable;
use crate::ops::driver::Driver;
use crate::rt::limiter::volume_key;

pub async fn modify_volume(
    d: &Driver,
    req: csi::ControllerModifyVolumeRequest,
) -> CsiResult<csi::ControllerModifyVolumeResponse> {
    let id = validate::id(&req.volume_id, "volume_id")?.to_string();
    validate::secrets(&req.secrets)?;
    let _guard = d.limiter.try_acquire(&[volume_key(&id)])?;
    let vol = d.existing_volume_to_change(&id).await?;
    // A volume that is not one (yet, or any more) is NOT_FOUND before its
    // parameters are looked at.
    state::ready(&vol)?;
    let changes = check_mutable(d, &req.mutable_parameters)?;
    if let Step::Next(next) = state::modify(&vol, changes)? {
        d.put_volume(&next).await?;
        tracing::info!(volume_id = %id, parameters = ?next.mutable_parameters, "volume modified");
    }
    Ok(csi::ControllerModifyVolumeResponse {})
}
