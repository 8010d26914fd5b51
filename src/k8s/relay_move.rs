//! The RelayVolume's `status.move`: what a move between members is doing,
//! written by the controller's move task under a field manager of its own
//! (server-side apply keeps the rest of the status, which other writers
//! own), with the leader term of every controller status write.

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};

use crate::k8s::cluster::Cluster;
use crate::k8s::relay_volume::{controller_status_body, object_name, RelayMoveStatus, RelayVolume};

const MANAGER: &str = "csi-relay-move";

/// Applies the move's status of volume `volume_id`; a failure is logged
/// (the next report carries the news again).
pub async fn report(host: &Cluster, volume_id: &str, status: &RelayMoveStatus) {
    let name = object_name(volume_id);
    let Ok(value) = serde_json::to_value(status) else {
        return;
    };
    let body = controller_status_body(
        &name,
        serde_json::json!({ "move": value }),
        crate::rt::fence::fence().term(),
    );
    let api =
        Api::<DynamicObject>::all_with(host.client(), &ApiResource::erase::<RelayVolume>(&()));
    let params = PatchParams::apply(MANAGER).force();
    if let Err(e) = host
        .fetch(
            &format!("apply RelayVolume {name} move status"),
            api.patch_status(&name, &params, &Patch::Apply(&body)),
        )
        .await
    {
        tracing::warn!(volume_id, error = %e, "move status not reported; the next one carries it");
    }
}

/// RFC 3339 of now, for `lastSync`.
pub fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}
