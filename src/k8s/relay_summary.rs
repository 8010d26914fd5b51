//! Keeps each RelayVolume's PHASE and NODES the furthest state of any
//! node, whoever reported it. Node plugins (split deployment) and member
//! clusters (pods on virtual nodes) write their own `status.nodes` entries;
//! only the controller writes the summary. It watches the objects, and when
//! one's summary lags its entries it re-applies its view of the volume,
//! which folds them in (`relay_volume::summary`).

use futures::TryStreamExt;
use kube::api::Api;
use kube::runtime::reflector;
use kube::runtime::{watcher, WatchStreamExt};

use crate::k8s::naming;
use crate::k8s::relay_volume::{
    new_view, object_name, seen_event, summary, RelayVolume, RelayVolumeObserver, Seen, View,
};

/// Starts watching RelayVolumes through `watch_client`; returns the view
/// the controller's writer reads entries from, and what starts the
/// catching up with that writer.
pub fn watch(
    watch_client: kube::Client,
) -> (View, impl FnOnce(crate::store::Store, RelayVolumeObserver)) {
    let (reader, writer) = new_view();
    let config =
        watcher::Config::default().labels(&format!("{}={}", naming::MANAGED_BY, naming::MANAGER));
    let stream = reflector::reflector(
        writer,
        watcher(Api::<RelayVolume>::all(watch_client), config)
            .default_backoff()
            .map_ok(seen_event),
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
async fn catch_up(store: &crate::store::Store, relay: &RelayVolumeObserver, obj: &Seen) {
    let id = &obj.volume_id;
    let mut seen = std::borrow::Cow::Borrowed(obj);
    // A failed write is tried once more onto a newer version the view may
    // hold: its event may have been passed over while the write was
    // thought to be on its way.
    for _ in 0..2 {
        let Ok(Some(vol)) = store.volume(id) else {
            return;
        };
        let (phase, nodes) = summary(&vol, seen.status.as_ref());
        let current = seen.status.as_ref();
        let lags = current.and_then(|s| s.phase.as_deref()) != Some(phase.as_str())
            || current.and_then(|s| s.node_summary.as_deref()) != Some(nodes.as_str());
        // What this controller already sent is on its way (the event is of
        // an earlier write) or on the object (and its own event follows).
        if !lags || relay.has_sent(id, &phase, &nodes) {
            return;
        }
        tracing::debug!(volume_id = %id, phase, nodes, "RelayVolume summary catches up with its entries");
        // Onto the version the event showed: the record read from the store
        // may have been removed since (a volume released, whose object stays
        // as its record), and an object that changed meanwhile raises an
        // event of its own.
        let version = seen.resource_version.clone();
        match relay.apply_status_onto(&vol, version.as_deref()).await {
            Ok(_) => return,
            Err(e) => {
                tracing::debug!(volume_id = %id, error = %e, "RelayVolume summary not caught up; the next event retries");
                match relay.watched(&object_name(id)) {
                    Some(newer) if newer.resource_version != version => {
                        seen = std::borrow::Cow::Owned((*newer).clone());
                    }
                    _ => return,
                }
            }
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
            claim_uid: None,
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
        let seen = Seen::from(obj.clone());
        let ((), ()) = tokio::join!(catch_up(&driver.store, &relay, &seen), async {
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

    fn member_volume() -> crate::domain::volume::Volume {
        let mut vol =
            crate::domain::volume::sample("m-east-0123456789abcdef0123456789abcdef", "pvc-a");
        vol.backing = crate::domain::volume::Backing::Member {
            member: "east".into(),
            namespace: "relay".into(),
            pvc: "relay-0123456789abcdef0123456789abcdef".into(),
            selected_node: None,
            claim_uid: None,
        };
        vol
    }

    /// A controller whose store holds `member_volume()`, its host API,
    /// and its RelayVolume writer reading the view `writer` fills.
    async fn watching(
        dir: &std::path::Path,
    ) -> (
        crate::ops::driver::Driver,
        testing::MockApi,
        RelayVolumeObserver,
        reflector::store::Writer<Seen>,
        crate::domain::volume::Volume,
    ) {
        let (driver, host, _member_api, api) = testing::controller(dir);
        let vol = member_volume();
        driver.put_volume(&vol).await.unwrap();
        let (reader, writer) = crate::k8s::relay_volume::new_view();
        let relay = RelayVolumeObserver::new(host, Role::for_mode(Mode::Controller, "ctrl"))
            .with_view(reader);
        (driver, api, relay, writer, vol)
    }

    fn watched(vol: &crate::domain::volume::Volume, version: &str, phase: &str) -> RelayVolume {
        let mut obj = RelayVolume::new(&object_name(&vol.id), spec_of(vol).unwrap());
        obj.metadata.resource_version = Some(version.into());
        obj.status = Some(crate::k8s::relay_volume::RelayVolumeStatus {
            phase: Some(phase.into()),
            node_summary: Some(String::new()),
            ..Default::default()
        });
        obj
    }

    fn member_entry(phase: &str) -> crate::k8s::relay_volume::RelayNodeStatus {
        crate::k8s::relay_volume::RelayNodeStatus {
            node: "east/n1".into(),
            member: Some("east".into()),
            phase: Some(phase.into()),
            ..Default::default()
        }
    }

    // The events of the controller's own earlier writes (PROVISIONING, then
    // the record's CREATED on its way) are not written again: each was one
    // status patch more per volume. An entry of another writer still is.
    #[tokio::test(start_paused = true)]
    async fn the_event_of_its_own_earlier_write_is_not_caught_up() {
        let tmp = tempfile::tempdir().unwrap();
        let (driver, mut api, relay, mut writer, vol) = watching(tmp.path()).await;
        let (landed, ()) = tokio::join!(relay.apply_status(&vol), async {
            let call = api.next().await;
            assert_eq!(call.body["status"]["phase"], "CREATED");
            call.ok(serde_json::to_value(watched(&vol, "50", "CREATED")).unwrap());
        });
        assert!(landed.unwrap());
        let mut obj = watched(&vol, "40", "PROVISIONING");
        writer.apply_watcher_event(&crate::k8s::relay_volume::applied(obj.clone()));
        catch_up(&driver.store, &relay, &Seen::from(obj.clone())).await;
        api.expect_idle().await;

        obj.status.as_mut().unwrap().nodes = Some(vec![member_entry("NODE_READY")]);
        obj.metadata.resource_version = Some("45".into());
        writer.apply_watcher_event(&crate::k8s::relay_volume::applied(obj.clone()));
        let seen = Seen::from(obj.clone());
        let ((), ()) = tokio::join!(catch_up(&driver.store, &relay, &seen), async {
            let call = api.next().await;
            assert_eq!(call.body["status"]["phase"], "NODE_READY");
            call.ok(serde_json::to_value(watched(&vol, "50", "CREATED")).unwrap());
        });
        api.expect_idle().await;
    }

    // A catch-up refused for a changed object is tried once more onto the
    // newer version the view holds: that version's event was passed over
    // while the first write was on its way with the same summary.
    #[tokio::test(start_paused = true)]
    async fn a_refused_catch_up_is_tried_again_onto_the_newer_object() {
        let tmp = tempfile::tempdir().unwrap();
        let (driver, mut api, relay, mut writer, vol) = watching(tmp.path()).await;
        let mut older = watched(&vol, "41", "CREATED");
        older.status.as_mut().unwrap().nodes = Some(vec![member_entry("NODE_READY")]);
        let mut newer = older.clone();
        newer.metadata.resource_version = Some("42".into());
        let seen = Seen::from(older.clone());
        let ((), ()) = tokio::join!(catch_up(&driver.store, &relay, &seen), async {
            let call = api.next().await;
            assert_eq!(call.body["metadata"]["resourceVersion"], "41");
            writer.apply_watcher_event(&crate::k8s::relay_volume::applied(newer.clone()));
            call.status(409, "Conflict", "the object has been modified");
            let call = tokio::time::timeout(std::time::Duration::from_secs(5), api.next())
                .await
                .expect("a second write, onto the newer version");
            assert_eq!(call.body["metadata"]["resourceVersion"], "42");
            assert_eq!(call.body["status"]["phase"], "NODE_READY");
            call.ok(serde_json::to_value(watched(&vol, "50", "CREATED")).unwrap());
        });
        api.expect_idle().await;
    }
}
