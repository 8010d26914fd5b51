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

/// A step of a move as an Event on the host claim (`kubectl describe pvc`
/// shows where the copy is and why it waits). Best effort, as the status:
/// `status.move` holds the same.
pub async fn tell(host: &Cluster, claim: &(String, String), step: &Step, note: &str) {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    use kube::Resource;

    let (namespace, name) = claim;
    let api = Api::<PersistentVolumeClaim>::namespaced(host.client(), namespace);
    // The claim's uid goes into the Event: `kubectl describe` finds a
    // claim's events by it.
    let found = match host
        .fetch(
            &format!("get PersistentVolumeClaim {namespace}/{name}"),
            api.get(name),
        )
        .await
    {
        Ok(Some(found)) => found,
        Ok(None) => return,
        Err(e) => {
            tracing::warn!(claim = %format!("{namespace}/{name}"), error = %e, "host claim not read for the move's event");
            return;
        }
    };
    let recorder = Recorder::new(
        host.client(),
        Reporter {
            controller: "csi-relay".into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let event = Event {
        type_: if step.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: step.reason.into(),
        note: Some(crate::k8s::shortened(note.to_string(), 1024)),
        action: "MoveVolume".into(),
        secondary: None,
    };
    let published = tokio::time::timeout(
        crate::k8s::CALL_TIMEOUT,
        recorder.publish(&event, &found.object_ref(&())),
    )
    .await;
    // A move goes on without its Event, but the operator should hear why
    // `kubectl describe pvc` shows none.
    match published {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(claim = %format!("{namespace}/{name}"), reason = step.reason, error = %e, "move event on the host claim not published")
        }
        Err(_) => {
            tracing::warn!(claim = %format!("{namespace}/{name}"), reason = step.reason, "move event on the host claim not published: no answer in time")
        }
    }
}

/// The steps of a move shown as Events.
pub struct Step {
    pub reason: &'static str,
    pub warning: bool,
}

/// The movers run and the copy began (or began again after a failure).
pub const COPYING: Step = Step {
    reason: "MoveCopying",
    warning: false,
};
/// An attempt failed; it is retried with a back-off.
pub const RETRYING: Step = Step {
    reason: "MoveRetrying",
    warning: true,
};
/// A pass verified the whole copy while nothing could write the source.
pub const VERIFIED: Step = Step {
    reason: "MoveVerified",
    warning: false,
};
/// The volume's home is its new member.
pub const MOVED: Step = Step {
    reason: "Moved",
    warning: false,
};
/// A pod of the volume runs in its own member again: the move it had
/// asked for stopped, the volume never left.
pub const STOPPED: Step = Step {
    reason: "MoveStopped",
    warning: false,
};

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::k8s::testing;

    #[tokio::test(start_paused = true)]
    async fn a_step_is_an_event_on_the_host_claim_found_by_its_uid() {
        let (host, mut api) = testing::host();
        let claim = ("shop".to_string(), "data".to_string());
        let ((), ()) = tokio::join!(
            tell(
                &host,
                &claim,
                &RETRYING,
                "moving to member cluster west: no space"
            ),
            async {
                api.expect("GET", "/api/v1/namespaces/shop/persistentvolumeclaims/data")
                    .await
                    .ok(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                               "metadata": {"name": "data", "namespace": "shop", "uid": "host-uid"}}));
                let event = api
                    .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
                    .await;
                assert_eq!(event.body["type"], "Warning");
                assert_eq!(event.body["reason"], "MoveRetrying");
                assert_eq!(event.body["action"], "MoveVolume");
                assert_eq!(
                    event.body["note"],
                    "moving to member cluster west: no space"
                );
                assert_eq!(event.body["regarding"]["uid"], "host-uid");
                event.created();
            }
        );
        // A claim gone: nothing to tell, nothing posted.
        let ((), ()) = tokio::join!(tell(&host, &claim, &MOVED, "moved"), async {
            api.expect("GET", "/api/v1/namespaces/shop/persistentvolumeclaims/data")
                .await
                .not_found();
            api.expect_idle().await;
        });
    }
}
