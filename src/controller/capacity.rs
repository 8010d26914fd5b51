//! GetCapacity: what is left for new volumes, for the asked topology.

use crate::capability::Capability;
use crate::csi;
use crate::driver::Driver;
use crate::error::CsiResult;
use crate::params::{self, VolumeParams};

pub async fn get_capacity(
    d: &Driver,
    req: csi::GetCapacityRequest,
) -> CsiResult<csi::GetCapacityResponse> {
    for cap in &req.volume_capabilities {
        Capability::from_wire(cap, "volume_capabilities")?;
    }
    crate::validate::map(&req.parameters, "parameters")?;
    let _: VolumeParams = params::decode(&req.parameters, "parameters")?;
    let max = d.config.max_volume_size as i64;
    if let Some(topology) = &req.accessible_topology {
        let offered = d.backend.volume_topology();
        let reachable = offered
            .iter()
            .any(|o| topology.segments.iter().all(|(k, v)| o.get(k) == Some(v)));
        if !reachable {
            return Ok(csi::GetCapacityResponse {
                available_capacity: 0,
                maximum_volume_size: Some(0),
                minimum_volume_size: None,
            });
        }
    }
    let total = d.backend.total_capacity().await?;
    let used = d.db(|s| s.allocated_bytes()).await?;
    let available = total.saturating_sub(used) as i64;
    Ok(csi::GetCapacityResponse {
        available_capacity: available,
        maximum_volume_size: Some(max.min(available)),
        minimum_volume_size: None,
    })
}
