//! GetCapacity from the member's own capacity tracking: the
//! CSIStorageCapacity objects its CSI drivers publish for a StorageClass.

use k8s_openapi::api::storage::v1::CSIStorageCapacity;
use kube::api::{Api, ListParams};

use crate::backends::CapacityReport;
use crate::domain::error::CsiResult;
use crate::domain::quantity::parse_bytes;
use crate::k8s::cluster::Cluster;

/// Sums the published capacity of `storage_class` over the member's
/// topology segments; `None` when the member publishes none for it.
pub async fn of_class(cluster: &Cluster, storage_class: &str) -> CsiResult<Option<CapacityReport>> {
    let list = cluster
        .run(
            "list CSIStorageCapacities",
            Api::<CSIStorageCapacity>::all(cluster.client()).list(&ListParams::default()),
        )
        .await?;
    let mut found = false;
    let mut available: u64 = 0;
    let mut largest: Option<u64> = None;
    for c in list
        .items
        .iter()
        .filter(|c| c.storage_class_name == storage_class)
    {
        found = true;
        let bytes = c
            .capacity
            .as_ref()
            .and_then(|q| parse_bytes(&q.0))
            .unwrap_or(0);
        available = available.saturating_add(bytes);
        let max = c
            .maximum_volume_size
            .as_ref()
            .and_then(|q| parse_bytes(&q.0))
            .unwrap_or(bytes);
        largest = Some(largest.map_or(max, |l| l.max(max)));
    }
    Ok(found.then_some(CapacityReport {
        available,
        maximum_volume_size: largest,
    }))
}
