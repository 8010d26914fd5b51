//! What the member cluster itself reports about relay volumes: the only
//! source of state for pods that run there (a pod on a virtual node), where
//! no ControllerPublishVolume or node call ever reaches the relay.
//!
//! Per member node that has anything to do with a relay PVC:
//! - NODE_READY: the bound PV is attached there (a VolumeAttachment with
//!   `status.attached`), or a pod using the claim is scheduled there;
//! - VOL_READY: the node's `status.volumesInUse` lists it (kubelet's
//!   global mount is done);
//! - PUBLISHED: a pod using the claim runs there.
//!
//! Reflectors keep the member's PVCs (only the relay's, by label), PVs,
//! VolumeAttachments, Nodes and Pods in memory; a change marks the view
//! dirty and at most once per [`SETTLE`] it is recomputed and what changed
//! is applied to the RelayVolumes' status with this member's own field
//! manager. A write that fails is retried on the next round.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use serde::de::DeserializeOwned;

use crate::member::cluster::Cluster;
use crate::member::naming;
use crate::member::relay_volume::{apply_body, object_name, RelayNodeStatus};
use crate::member::FIELD_MANAGER;
use crate::volume::Phase;

/// How long changes are gathered before one recomputation.
pub const SETTLE: Duration = Duration::from_millis(500);

/// One member node's state for one relay volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberNodeState {
    pub node: String,
    pub phase: Phase,
    /// namespace/name of the member pods using the claim there.
    pub pods: Vec<String>,
}

/// The entry key of a member node in `status.nodes`: `<member>/<node>`,
/// which no host node name can be (a name has no '/').
pub fn entry_key(member: &str, node: &str) -> String {
    format!("{member}/{node}")
}

/// How kubelet names a volume in `status.volumesInUse`.
fn in_use_name(pv: &PersistentVolume) -> Option<String> {
    let spec = pv.spec.as_ref()?;
    if let Some(csi) = &spec.csi {
        return Some(format!(
            "kubernetes.io/csi/{}^{}",
            csi.driver, csi.volume_handle
        ));
    }
    None
}

fn pod_running(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// The member's attachments, nodes and pods, indexed once per round: each
/// claim then costs a few lookups instead of a scan of every object.
#[derive(Default)]
pub struct View {
    /// PV name → member nodes it is attached to.
    attached: HashMap<String, Vec<String>>,
    /// kubelet's in-use volume name → member nodes that list it.
    in_use: HashMap<String, Vec<String>>,
    /// (namespace, claim) → the pods that use it.
    pods: HashMap<(String, String), Vec<Arc<Pod>>>,
}

impl View {
    pub fn new(
        attachments: &[Arc<VolumeAttachment>],
        nodes: &[Arc<Node>],
        pods: &[Arc<Pod>],
    ) -> Self {
        let mut view = View::default();
        for va in attachments {
            let attached = va.status.as_ref().is_some_and(|s| s.attached);
            if let (true, Some(pv)) = (attached, va.spec.source.persistent_volume_name.as_ref()) {
                view.attached
                    .entry(pv.clone())
                    .or_default()
                    .push(va.spec.node_name.clone());
            }
        }
        for node in nodes {
            let Some(name) = node.metadata.name.as_ref() else {
                continue;
            };
            let listed = node.status.as_ref().and_then(|s| s.volumes_in_use.as_ref());
            for volume in listed.into_iter().flatten() {
                view.in_use
                    .entry(volume.clone())
                    .or_default()
                    .push(name.clone());
            }
        }
        for pod in pods {
            let namespace = pod.metadata.namespace.clone().unwrap_or_default();
            let claims = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
            for v in claims.into_iter().flatten() {
                if let Some(c) = &v.persistent_volume_claim {
                    view.pods
                        .entry((namespace.clone(), c.claim_name.clone()))
                        .or_default()
                        .push(pod.clone());
                }
            }
        }
        view
    }
}

/// The member nodes' states for `claim` (bound to `pv`, if known).
pub fn member_nodes(
    claim: &PersistentVolumeClaim,
    pv: Option<&PersistentVolume>,
    view: &View,
) -> Vec<MemberNodeState> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let mut states: BTreeMap<String, (Phase, BTreeSet<String>)> = BTreeMap::new();
    let mut raise = |node: &str, phase: Phase, pod: Option<String>| {
        let entry = states
            .entry(node.to_string())
            .or_insert((phase, BTreeSet::new()));
        entry.0 = entry.0.max(phase);
        entry.1.extend(pod);
    };
    let pv_name = pv.and_then(|p| p.metadata.name.as_ref());
    for node in pv_name
        .and_then(|n| view.attached.get(n))
        .into_iter()
        .flatten()
    {
        raise(node, Phase::NodeReady, None);
    }
    let in_use = pv.and_then(in_use_name);
    for node in in_use
        .and_then(|n| view.in_use.get(&n))
        .into_iter()
        .flatten()
    {
        raise(node, Phase::VolReady, None);
    }
    let users = view.pods.get(&(namespace.clone(), name));
    for pod in users.into_iter().flatten() {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else {
            continue;
        };
        let phase = if pod_running(pod) {
            Phase::Published
        } else {
            Phase::NodeReady
        };
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        raise(node, phase, Some(format!("{namespace}/{pod_name}")));
    }
    states
        .into_iter()
        .map(|(node, (phase, pods))| MemberNodeState {
            node,
            phase,
            pods: pods.into_iter().collect(),
        })
        .collect()
}

/// The relay volume id a member claim belongs to, from its annotation.
fn volume_id_of(claim: &PersistentVolumeClaim) -> Option<&str> {
    crate::member::pvc::annotation(claim, naming::VOLUME_ID_ANNOTATION)
}

struct Caches {
    claims: Store<PersistentVolumeClaim>,
    pvs: Store<PersistentVolume>,
    attachments: Store<VolumeAttachment>,
    nodes: Store<Node>,
    pods: Store<Pod>,
}

fn mirror<K>(api: Api<K>, config: watcher::Config, dirty: Arc<AtomicBool>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config).default_backoff());
    tokio::spawn(async move {
        use tokio_stream::StreamExt;
        let mut stream = Box::pin(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => dirty.store(true, Ordering::Release),
                Err(e) => tracing::debug!(error = %e, "member watch interrupted; resuming"),
            }
        }
    });
    reader
}

/// The last status entries written per volume id.
type Written = HashMap<String, Vec<RelayNodeStatus>>;

/// Watches `member` (through `watch_client`, whose read timeout suits
/// watches) and keeps the RelayVolumes in `host` up to date, until the
/// process ends.
pub fn spawn(member: String, watch_client: kube::Client, host: Cluster) {
    let dirty = Arc::new(AtomicBool::new(true));
    let relay_only =
        watcher::Config::default().labels(&format!("{}={}", naming::MANAGED_BY, naming::MANAGER));
    let caches = Caches {
        claims: mirror(Api::all(watch_client.clone()), relay_only, dirty.clone()),
        pvs: mirror(
            Api::all(watch_client.clone()),
            watcher::Config::default(),
            dirty.clone(),
        ),
        attachments: mirror(
            Api::all(watch_client.clone()),
            watcher::Config::default(),
            dirty.clone(),
        ),
        nodes: mirror(
            Api::all(watch_client.clone()),
            watcher::Config::default(),
            dirty.clone(),
        ),
        pods: mirror(
            Api::all(watch_client),
            watcher::Config::default(),
            dirty.clone(),
        ),
    };
    tokio::spawn(async move {
        let mut written = Written::new();
        let mut tick = tokio::time::interval(SETTLE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if !dirty.swap(false, Ordering::AcqRel) {
                continue;
            }
            if !publish(&member, &caches, &host, &mut written).await {
                // Something was not written: try again next round.
                dirty.store(true, Ordering::Release);
            }
        }
    });
}

/// Computes every relay volume's member nodes and applies those that
/// changed. Returns whether everything landed.
async fn publish(member: &str, caches: &Caches, host: &Cluster, written: &mut Written) -> bool {
    let view = View::new(
        &caches.attachments.state(),
        &caches.nodes.state(),
        &caches.pods.state(),
    );
    let mut now: Written = HashMap::new();
    for claim in caches.claims.state() {
        let Some(id) = volume_id_of(&claim) else {
            continue;
        };
        let pv = crate::member::pvc::bound_pv(&claim).and_then(|name| {
            caches
                .pvs
                .get(&reflector::ObjectRef::new(name))
                .filter(|pv| {
                    // Only a PV that really is bound to this claim.
                    pv.spec
                        .as_ref()
                        .and_then(|s| s.claim_ref.as_ref())
                        .is_some_and(|r| {
                            r.name.as_deref() == claim.metadata.name.as_deref()
                                && r.namespace.as_deref() == claim.metadata.namespace.as_deref()
                        })
                })
        });
        let entries = member_nodes(&claim, pv.as_deref(), &view)
            .into_iter()
            .map(|s| RelayNodeStatus {
                node: entry_key(member, &s.node),
                member: Some(member.to_string()),
                phase: Some(s.phase.as_str().to_string()),
                pods: Some(s.pods),
                ..Default::default()
            })
            .collect();
        now.insert(id.to_string(), entries);
    }
    // Volumes whose claim went away get their entries cleared once.
    for (id, old) in written.iter() {
        if !old.is_empty() && !now.contains_key(id) {
            now.insert(id.clone(), Vec::new());
        }
    }
    // Member names are at most 40 characters: well within the API's 128.
    let manager = format!("{FIELD_MANAGER}-member-{member}");
    let mut all_landed = true;
    for (id, entries) in now {
        if written.get(&id) == Some(&entries) {
            continue;
        }
        let name = object_name(&id);
        let body = apply_body(&name, "status", serde_json::json!({ "nodes": entries }));
        let api = Api::<crate::member::relay_volume::RelayVolume>::all(host.client());
        let params = PatchParams::apply(&manager).force();
        let result = host
            .fetch(
                &format!("apply RelayVolume {name} member status"),
                api.patch_status(&name, &params, &Patch::Apply(&body)),
            )
            .await;
        match result {
            Ok(Some(_)) => {
                tracing::debug!(volume_id = %id, member, "member-side state reported");
                if entries.is_empty() {
                    written.remove(&id);
                } else {
                    written.insert(id, entries);
                }
            }
            // No RelayVolume (yet): the controller's first apply comes.
            Ok(None) => all_landed = false,
            Err(e) => {
                tracing::warn!(volume_id = %id, member, error = %e, "member-side state not reported; will retry");
                all_landed = false;
            }
        }
    }
    all_landed
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn arc<T: DeserializeOwned>(v: serde_json::Value) -> Arc<T> {
        Arc::new(serde_json::from_value(v).unwrap())
    }

    #[test]
    fn member_nodes_walk_from_attached_to_published() {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "pvc3", "namespace": "shop"},
            "spec": {"volumeName": "pv-1"}
        }))
        .unwrap();
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pv-1"},
            "spec": {"csi": {"driver": "hostpath.csi.k8s.io", "volumeHandle": "h1"}}
        }))
        .unwrap();
        let va = |node: &str, attached: bool| {
            arc::<VolumeAttachment>(json!({
                "metadata": {"name": format!("va-{node}")},
                "spec": {"attacher": "hostpath.csi.k8s.io", "nodeName": node,
                         "source": {"persistentVolumeName": "pv-1"}},
                "status": {"attached": attached}
            }))
        };
        let node = |name: &str, in_use: &[&str]| {
            arc::<Node>(json!({"metadata": {"name": name}, "status": {"volumesInUse": in_use}}))
        };
        let pod = |name: &str, ns: &str, node: &str, claim: &str, phase: &str| {
            arc::<Pod>(json!({
                "metadata": {"name": name, "namespace": ns},
                "spec": {"nodeName": node, "containers": [],
                         "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]},
                "status": {"phase": phase}
            }))
        };
        let state = |vas: &[Arc<VolumeAttachment>], nodes: &[Arc<Node>], pods: &[Arc<Pod>]| {
            member_nodes(&claim, Some(&pv), &View::new(vas, nodes, pods))
                .into_iter()
                .map(|s| (s.node, s.phase, s.pods))
                .collect::<Vec<_>>()
        };
        // Nothing yet; an attachment still attaching is nothing either.
        assert!(state(&[va("n1", false)], &[node("n1", &[])], &[]).is_empty());
        assert_eq!(
            state(&[va("n1", true)], &[node("n1", &[])], &[]),
            [("n1".into(), Phase::NodeReady, vec![])]
        );
        let in_use = "kubernetes.io/csi/hostpath.csi.k8s.io^h1";
        let pending = pod("web-0", "shop", "n1", "pvc3", "Pending");
        assert_eq!(
            state(
                &[va("n1", true)],
                &[node("n1", &[in_use])],
                std::slice::from_ref(&pending)
            ),
            [("n1".into(), Phase::VolReady, vec!["shop/web-0".to_string()])]
        );
        let running = pod("web-0", "shop", "n1", "pvc3", "Running");
        // Pods of other claims or namespaces do not count.
        let others = [
            pod("x", "shop", "n2", "other", "Running"),
            pod("y", "elsewhere", "n2", "pvc3", "Running"),
        ];
        let mut pods = vec![running];
        pods.extend(others);
        assert_eq!(
            state(&[va("n1", true)], &[node("n1", &[in_use])], &pods),
            [(
                "n1".into(),
                Phase::Published,
                vec!["shop/web-0".to_string()]
            )]
        );
        // Another PV's attachment is not this volume's.
        let mut foreign = (*va("n3", true)).clone();
        foreign.spec.source.persistent_volume_name = Some("pv-2".into());
        assert!(state(&[Arc::new(foreign)], &[], &[]).is_empty());
    }

    #[test]
    fn entry_keys_cannot_collide_with_host_nodes() {
        assert_eq!(entry_key("east", "n1"), "east/n1");
        assert!(!naming::is_dns_subdomain(&entry_key("east", "n1")));
    }
}
