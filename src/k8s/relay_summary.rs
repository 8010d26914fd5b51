//! Keeps each RelayVolume's PHASE and NODES the furthest state of any
//! node, whoever reported it. Node plugins (split deployment) and member
//! clusters (pods on virtual nodes) write their own `status.nodes` entries;
//! only the controller writes the summary. It watches the objects, and when
//! one's summary lags its entries it re-applies its view of the volume,
//! which folds them in (`relay_volume::summary`).

use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};

use crate::k8s::naming;
use crate::k8s::relay_volume::{summary, RelayVolume, RelayVolumeObserver};

/// Starts watching RelayVolumes through `watch_client`; returns the view
/// the controller's writer reads entries from, and what starts the
/// catching up with that writer.
pub fn watch(
    watch_client: kube::Client,
) -> (
    Store<RelayVolume>,
    impl FnOnce(crate::store::Store, RelayVolumeObserver),
) {
    let (reader, writer) = reflector::store();
    let config =
        watcher::Config::default().labels(&format!("{}={}", naming::MANAGED_BY, naming::MANAGER));
    // Only the status is read from the view (the writers' entries); the
    // record and every writer's managedFields would otherwise stay in
    // memory, per volume, for nothing.
    let stream = reflector::reflector(
        writer,
        watcher(Api::<RelayVolume>::all(watch_client), config)
            .default_backoff()
            .modify(|rv| {
                rv.metadata.managed_fields = None;
                rv.spec.record = String::new();
            }),
    );
    let start = move |store: crate::store::Store, relay: RelayVolumeObserver| {
        tokio::spawn(async move {
            use tokio_stream::StreamExt;
            let mut stream = Box::pin(stream.applied_objects());
            while let Some(event) = stream.next().await {
                match event {
                    Ok(obj) => catch_up(&store, &relay, &obj).await,
                    Err(e) => {
                        tracing::debug!(error = %e, "RelayVolume watch interrupted; resuming")
                    }
                }
            }
        });
    };
    (reader, start)
}

/// Re-applies the controller's status of the volume when the object's
/// summary lags its entries. Status only, and so without the volume's
/// guard: a status apply never creates the object, so a call deleting the
/// volume meanwhile cannot see it come back; a status computed from a
/// record a call has since replaced lags again, and the event its own
/// write raises catches it up. (Under the guard, a call arriving meanwhile
/// was refused ABORTED, and an event met while a call held the guard was
/// lost.)
async fn catch_up(store: &crate::store::Store, relay: &RelayVolumeObserver, obj: &RelayVolume) {
    let id = &obj.spec.volume_id;
    let Ok(Some(vol)) = store.volume(id) else {
        return;
    };
    let (phase, nodes) = summary(&vol, obj.status.as_ref());
    let current = obj.status.as_ref();
    let lags = current.and_then(|s| s.phase.as_deref()) != Some(phase.as_str())
        || current.and_then(|s| s.node_summary.as_deref()) != Some(nodes.as_str());
    if lags {
        tracing::debug!(volume_id = %id, phase, nodes, "RelayVolume summary catches up with its entries");
        // Onto the version the event showed: the record read from the store
        // may have been removed since (a volume released, whose object stays
        // as its record), and an object that changed meanwhile raises an
        // event of its own.
        let version = obj.metadata.resource_version.as_deref();
        if let Err(e) = relay.apply_status_onto(&vol, version).await {
            tracing::debug!(volume_id = %id, error = %e, "RelayVolume summary not caught up; the next event retries");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::domain::settings::Mode;
    use crate::k8s::relay_volume::{spec_of, Role};
    use crate::k8s::testing;

    // The summary catches up although a call holds the volume (it was
    // dropped then, and the object kept a stale phase), and only by a
    // status apply, which a deleted object answers 404 instead of coming
    // back.
    #[tokio::test(start_paused = true)]
    async fn a_lagging_summary_is_caught_up_by_status_alone_even_while_a_call_holds_the_volume() {
        let tmp = tempfile::tempdir().unwrap();
        let (driver, host, _member_api, mut api) = testing::controller(tmp.path());
        let mut vol =
            crate::domain::volume::sample("m-east-0123456789abcdef0123456789abcdef", "pvc-a");
        vol.backing = crate::domain::volume::Backing::Member {
            member: "east".into(),
            namespace: "relay".into(),
            pvc: "relay-0123456789abcdef0123456789abcdef".into(),
            selected_node: None,
        };
        driver.put_volume(&vol).await.unwrap();
        let relay = RelayVolumeObserver::new(host, Role::for_mode(Mode::Controller, "ctrl"));
        let mut obj = RelayVolume::new(&vol.id, spec_of(&vol).unwrap());
        obj.metadata.resource_version = Some("41".into());
        obj.status = Some(crate::k8s::relay_volume::RelayVolumeStatus {
            phase: Some("PUBLISHED".into()),
            ..Default::default()
        });
        let _held = driver
            .limiter
            .try_acquire(&[crate::rt::limiter::volume_key(&vol.id)])
            .unwrap();
        let ((), ()) = tokio::join!(catch_up(&driver.store, &relay, &obj), async {
            let call = api.next().await;
            assert_eq!(call.method, "PATCH");
            assert!(call.path.ends_with("/status"), "status only: {}", call.path);
            assert_eq!(call.body["status"]["phase"], "CREATED");
            assert_eq!(
                call.body["metadata"]["resourceVersion"], "41",
                "onto the version the event showed"
            );
            call.not_found();
            api.expect_idle().await;
        });
    }
}
