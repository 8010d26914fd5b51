//! Keeps each RelayVolume's PHASE and NODES the furthest state of any
//! node, whoever reported it. Node plugins (split deployment) and member
//! clusters (pods on virtual nodes) write their own `status.nodes` entries;
//! only the controller writes the summary. It watches the objects, and when
//! one's summary lags its entries it re-applies its view of the volume,
//! which folds them in (`relay_volume::summary`).

use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};

use crate::driver::Driver;
use crate::member::naming;
use crate::member::relay_volume::{summary, RelayVolume};

/// Starts watching RelayVolumes through `watch_client`; returns the view
/// the controller's observer reads entries from.
pub fn watch(watch_client: kube::Client) -> (Store<RelayVolume>, impl FnOnce(Driver)) {
    let (reader, writer) = reflector::store();
    let config =
        watcher::Config::default().labels(&format!("{}={}", naming::MANAGED_BY, naming::MANAGER));
    let stream = reflector::reflector(
        writer,
        watcher(Api::<RelayVolume>::all(watch_client), config).default_backoff(),
    );
    let view = reader.clone();
    let waiting = Waiting::default();
    let start = move |driver: Driver| {
        tokio::spawn(async move {
            use tokio_stream::StreamExt;
            let mut stream = Box::pin(stream.applied_objects());
            while let Some(event) = stream.next().await {
                match event {
                    Ok(obj) => {
                        if catch_up(&driver, &obj).await == Turn::Busy {
                            later(&driver, &view, &waiting, &obj.spec.volume_id);
                        }
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "RelayVolume watch interrupted; resuming")
                    }
                }
            }
        });
    };
    (reader, start)
}

#[derive(PartialEq)]
enum Turn {
    Done,
    /// A call holds the volume.
    Busy,
}

/// Pause before a busy volume is looked at again, and how often at most.
const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);
const RETRIES: u32 = 50;

/// Volumes a `later` look is already waiting for: one per volume, however
/// many events a call's own writes raise while it holds the volume.
type Waiting = std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>;

/// Looks at volume `id`'s object again once the call holding it is done:
/// that call's own write may have folded in entries older than the ones
/// that woke this (its view lagged the watch), and no later event comes.
fn later(driver: &Driver, view: &Store<RelayVolume>, waiting: &Waiting, id: &str) {
    if !crate::unpoisoned::lock(waiting).insert(id.to_string()) {
        return;
    }
    let (driver, view, waiting, id) = (
        driver.clone(),
        view.clone(),
        waiting.clone(),
        id.to_string(),
    );
    tokio::spawn(async move {
        for _ in 0..RETRIES {
            tokio::time::sleep(RETRY_PAUSE).await;
            let name = crate::member::relay_volume::object_name(&id);
            let Some(obj) = view.get(&reflector::ObjectRef::new(&name)) else {
                break;
            };
            if catch_up(&driver, &obj).await == Turn::Done {
                break;
            }
        }
        crate::unpoisoned::lock(&waiting).remove(&id);
    });
}

/// Re-applies the controller's view when the object's summary lags.
async fn catch_up(driver: &Driver, obj: &RelayVolume) -> Turn {
    let id = obj.spec.volume_id.clone();
    // Under the volume's guard: a call deleting it meanwhile would
    // otherwise be followed by this (older) state, and the object would
    // come back. A busy volume is looked at again after its call.
    let Ok(_guard) = driver
        .limiter
        .try_acquire(&[crate::limiter::volume_key(&id)])
    else {
        return Turn::Busy;
    };
    let Ok(Some(vol)) = driver.find_volume(&id).await else {
        return Turn::Done;
    };
    let (phase, nodes) = summary(&vol, obj.status.as_ref());
    let current = obj.status.as_ref();
    let lags = current.and_then(|s| s.phase.as_deref()) != Some(phase.as_str())
        || current.and_then(|s| s.node_summary.as_deref()) != Some(nodes.as_str());
    if lags {
        tracing::debug!(volume_id = %id, phase, nodes, "RelayVolume summary catches up with its entries");
        driver.publish_state(&vol).await;
    }
    Turn::Done
}
