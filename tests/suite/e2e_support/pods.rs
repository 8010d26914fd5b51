//! What the suites that run real pods through the relay wait for: a pod of
//! a label Running, none left, a file's content, the relay registered on a
//! node, a host claim's VolumeAttachment on a node (attached or its error).

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, VolumeAttachment};
use kube::api::{Api, ListParams};
use kube::Client;

use super::eventually;

/// The names of the pods of `selector` Running (not being deleted) in `ns`.
pub async fn running(cluster: &Client, ns: &str, selector: &str) -> Vec<String> {
    let pods: Api<Pod> = Api::namespaced(cluster.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    list.into_iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .filter_map(|p| p.metadata.name)
        .collect()
}

/// A pod of `selector` Running in `ns` other than `not`.
pub async fn one_running(
    cluster: &Client,
    ns: &str,
    selector: &str,
    not: Option<&str>,
    wait: Duration,
) -> String {
    eventually(
        &format!("a pod of {ns} ({selector}) Running"),
        wait,
        || async move {
            running(cluster, ns, selector)
                .await
                .into_iter()
                .find(|p| Some(p.as_str()) != not)
        },
    )
    .await
}

/// Until no pod of `selector` is left in `ns`.
pub async fn none_left(cluster: &Client, ns: &str, selector: &str, wait: Duration) {
    let pods: Api<Pod> = Api::namespaced(cluster.clone(), ns);
    eventually(&format!("no pod of {ns} ({selector})"), wait, || {
        let pods = pods.clone();
        async move {
            let list = pods
                .list(&ListParams::default().labels(selector))
                .await
                .ok()?;
            list.items.is_empty().then_some(())
        }
    })
    .await;
}

/// Until `path` holds `want` (trimmed).
pub async fn file_says(path: &Path, want: &str, wait: Duration) {
    eventually(
        &format!("{} says {want}", path.display()),
        wait,
        || async move {
            let text = std::fs::read_to_string(path).ok()?;
            (text.trim() == want).then_some(())
        },
    )
    .await;
}

/// Until `node`'s CSINode lists `driver` with the member topology key.
pub async fn relay_registered(host: &Client, driver: &str, node: &str, wait: Duration) {
    let csinodes: Api<CSINode> = Api::all(host.clone());
    eventually(&format!("{driver} registered on {node}"), wait, || {
        let csinodes = csinodes.clone();
        async move {
            let entry = csinodes
                .get(node)
                .await
                .ok()?
                .spec
                .drivers
                .into_iter()
                .find(|d| d.name == driver)?;
            entry
                .topology_keys?
                .iter()
                .any(|k| k == "topology.relay.csi.dev/member")
                .then_some(())
        }
    })
    .await;
}

/// The host PV of claim `ns/name`.
pub async fn host_pv(host: &Client, ns: &str, name: &str) -> String {
    Api::<PersistentVolumeClaim>::namespaced(host.clone(), ns)
        .get(name)
        .await
        .ok()
        .and_then(|c| c.spec?.volume_name)
        .expect("the host claim's PV")
}

/// The attach error of the VolumeAttachment of `pv` on host node `node`.
pub async fn attach_error(host: &Client, pv: &str, node: &str, wait: Duration) -> String {
    let vas: Api<VolumeAttachment> = Api::all(host.clone());
    eventually(&format!("the attach error of {pv} on {node}"), wait, || {
        let vas = vas.clone();
        async move {
            let list = vas.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find_map(|va| {
                let ours = va.spec.node_name == node
                    && va.spec.source.persistent_volume_name.as_deref() == Some(pv);
                let status = va.status.filter(|_| ours)?;
                (!status.attached).then_some(())?;
                status.attach_error?.message
            })
        }
    })
    .await
}

/// Until the host's attach/detach controller has detached `pv` from host
/// node `node` (its VolumeAttachment gone): a pod started before would
/// reuse the attachment and never ask the relay again.
pub async fn detached(host: &Client, pv: &str, node: &str, wait: Duration) {
    let vas: Api<VolumeAttachment> = Api::all(host.clone());
    eventually(&format!("{pv} detached from {node}"), wait, || {
        let vas = vas.clone();
        async move {
            let list = vas.list(&ListParams::default()).await.ok()?;
            (!list.items.iter().any(|va| {
                va.spec.node_name == node
                    && va.spec.source.persistent_volume_name.as_deref() == Some(pv)
            }))
            .then_some(())
        }
    })
    .await;
}
