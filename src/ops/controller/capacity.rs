//! GetCapacity: what is left for new volumes, for the asked topology.

use crate::csi;
use crate::domain::capability::Capability;
use crate::domain::error::CsiResult;
use crate::domain::params::{self, VolumeParams};
use crate::ops::driver::Driver;

pub async fn get_capacity(
    d: &Driver,
    req: csi::GetCapacityRequest,
) -> CsiResult<csi::GetCapacityResponse> {
    for cap in &req.volume_capabilities {
        Capability::check_access_type(cap, "volume_capabilities")?;
    }
    crate::domain::validate::map(&req.parameters, "parameters")?;
    let typed: VolumeParams = params::decode(&req.parameters, "parameters")?;
    d.backend.check_parameters(&typed)?;
    let max = d.config.max_volume_size as i64;
    let segments = req.accessible_topology.as_ref().map(|t| &t.segments);
    if let Some(segments) = segments {
        if !d.backend.serves_topology(&typed, segments) {
            return Ok(csi::GetCapacityResponse {
                available_capacity: 0,
                maximum_volume_size: Some(0),
                minimum_volume_size: None,
            });
        }
    }
    if let Some(report) = d.backend.capacity_for(&typed, segments).await? {
        let available = report.available.min(i64::MAX as u64) as i64;
        let largest = report
            .maximum_volume_size
            .map_or(available, |m| m.min(i64::MAX as u64) as i64);
        return Ok(csi::GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(max.min(largest)),
            minimum_volume_size: None,
        });
    }
    let total = d.backend.total_capacity().await?;
    let used = d.db(|s| s.allocated_bytes()).await?;
    let mut available = total.saturating_sub(used);
    // Others may fill the filesystem too: never offer what is not there.
    if let Some(free) = d.backend.free_bytes().await? {
        available = available.min(free);
    }
    let available = available.min(i64::MAX as u64) as i64;
    Ok(csi::GetCapacityResponse {
        available_capacity: available,
        maximum_volume_size: Some(max.min(available)),
        minimum_volume_size: None,
    })
}
