//! Every recorded intent has a way out, on real control planes: a
//! ControllerPublishVolume that is refused, or whose host node loses its
//! member mapping or goes away altogether, never leaves a volume that
//! ControllerUnpublishVolume and DeleteVolume cannot clear, and nothing of
//! it stays in the member. Skipped unless RELAY_E2E_* are set (see
//! member_e2e.rs); the last test also needs RELAY_E2E_SIDECARS.

use crate::{common, e2e_support};

use std::time::Duration;

use common::req::snw;
use csi_relay::csi;
use csi_relay::k8s::relay_volume::RelayVolume;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;
use tonic::Code;

use e2e_support::{
    attached_va, client, create_until_ok, delete_until_ok, env, eventually, fake_host_node,
    mapped_clusters, nothing_left_in_member, publish_request, start_member_relay,
    unpublish_until_ok, until_ok,
};

const MEMBER_LABEL: &str = "topology.relay.csi.dev/member";
const MEMBER_NODE_LABEL: &str = "topology.relay.csi.dev/member-node";

async fn relabel(host: &Client, node: &str, labels: serde_json::Value) {
    Api::<Node>::all(host.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": labels}})),
        )
        .await
        .expect("relabel the host node");
}

async fn delete_node(host: &Client, node: &str) {
    let _ = Api::<Node>::all(host.clone())
        .delete(node, &DeleteParams::default())
        .await;
}

/// The relay's member VolumeAttachments of volume `volume_id`.
async fn member_attachments(member: &Client, volume_id: &str) -> Vec<VolumeAttachment> {
    let uuid = volume_id.rsplit('-').next().unwrap_or_default();
    Api::<VolumeAttachment>::all(member.clone())
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/managed-by=csi-relay,relay.csi.dev/volume-uuid={uuid}"
        )))
        .await
        .expect("list member attachments")
        .items
}

// The refusals ControllerPublishVolume answers for a host node it cannot
// place (no member label; another member's) record their intent first:
// unpublishing that node and deleting the volume must succeed, and leave
// nothing in the member. (Before: ControllerUnpublishVolume failed with the
// same FAILED_PRECONDITION for ever, and DeleteVolume with "still in use".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_publish_leaves_the_volume_releasable() {
    let _alone = common::alone();
    let Some(env) = env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let (host, member, _) = mapped_clusters(&env).await;
    let pid = std::process::id();
    let d = start_member_relay(&env, "controller", &["--mode", "controller"]).await;
    let c = d.controller();

    let refusals = [
        (
            "unlabelled",
            json!({}),
            "is not mapped to member cluster e2e",
        ),
        (
            "elsewhere",
            json!({MEMBER_LABEL: "elsewhere"}),
            "runs its pods in member cluster elsewhere",
        ),
    ];
    for (case, labels, why) in refusals {
        let node = format!("refused-{case}-{pid}");
        fake_host_node(&host, &node, labels).await;
        let prefix = format!("refused-{case}-{pid}");
        let vol = create_until_ok(&c, &env, &prefix, 16 << 20).await;
        let err = c
            .clone()
            .controller_publish_volume(publish_request(&vol, &node, snw()))
            .await
            .expect_err("publish to a node the relay cannot place");
        assert_eq!(err.code(), Code::FailedPrecondition, "{case}: {err:?}");
        assert!(err.message().contains(why), "{case}: {err:?}");
        // What the user sees on the volume: the refusal, until it moves on.
        let rv_name = csi_relay::k8s::relay_volume::object_name(&vol.volume_id);
        let relay_volumes: Api<RelayVolume> = Api::all(host.clone());
        let last_error = |relay_volumes: Api<RelayVolume>, rv_name: String| async move {
            relay_volumes
                .get(&rv_name)
                .await
                .ok()
                .and_then(|rv| rv.status?.last_error)
        };
        let shown = last_error(relay_volumes.clone(), rv_name.clone())
            .await
            .unwrap_or_default();
        assert!(
            shown.starts_with("ControllerPublishVolume: FailedPrecondition: ")
                && shown.contains(why),
            "{case}: LAST-ERROR shows the refusal: {shown:?}"
        );

        // The way out, with the cause still there.
        c.clone()
            .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                volume_id: vol.volume_id.clone(),
                node_id: node.clone(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|e| panic!("{case}: unpublish after a refused publish: {e:?}"));
        assert_eq!(
            last_error(relay_volumes.clone(), rv_name.clone()).await,
            None,
            "{case}: the refusal shown goes once the volume moved on"
        );
        delete_until_ok(&c, &vol.volume_id).await;
        nothing_left_in_member(
            &member,
            &env.namespace,
            &prefix,
            Some(std::slice::from_ref(&vol.volume_id)),
        )
        .await;
        delete_node(&host, &node).await;
    }
}

/// How a host node stops naming the member node a volume was attached to.
#[derive(Debug, Clone, Copy)]
enum NodeGoes {
    /// Its member labels are removed (or it was never labelled by the
    /// registrar that restarts).
    Unlabelled,
    /// The Node object is deleted (the machine is gone).
    Deleted,
}

// A volume attached in the member for a host node, the controller
// restarted with its state dir lost (its records rebuilt from
// RelayVolumes, which never carry what was attached), then the node
// unlabelled or deleted: unpublishing it removes the member attachment it
// made (found by the host node it names), not nothing (before: a deleted
// node's attachment was left in the member) and not a refusal (before: an
// unlabelled node's unpublish failed for ever).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attachment_is_released_after_its_node_loses_its_mapping_or_goes() {
    let _alone = common::alone();
    let Some(env) = env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let (host, member, _) = mapped_clusters(&env).await;
    let pid = std::process::id();
    let mut d = start_member_relay(&env, "controller", &["--mode", "controller"]).await;

    for goes in [NodeGoes::Unlabelled, NodeGoes::Deleted] {
        let case = format!("{goes:?}").to_lowercase();
        let node = format!("going-{case}-{pid}");
        fake_host_node(
            &host,
            &node,
            json!({MEMBER_LABEL: "e2e", MEMBER_NODE_LABEL: "member-node-1"}),
        )
        .await;
        let prefix = format!("going-{case}-{pid}");
        let c = d.controller();
        let vol = create_until_ok(&c, &env, &prefix, 16 << 20).await;
        until_ok("ControllerPublishVolume", || {
            let mut c = c.clone();
            let req = publish_request(&vol, &node, snw());
            async move { c.controller_publish_volume(req).await }
        })
        .await;
        let made = member_attachments(&member, &vol.volume_id).await;
        assert_eq!(made.len(), 1, "{case}: one member attachment");
        assert_eq!(
            made[0]
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("relay.csi.dev/host-node")),
            Some(&node),
            "{case}: the member attachment names its host node"
        );

        // A controller rescheduled with an emptyDir: records from RelayVolumes.
        d.crash();
        std::fs::remove_dir_all(&d.state_dir).expect("wipe the state dir");
        d.start_again().await;
        match goes {
            NodeGoes::Unlabelled => {
                relabel(
                    &host,
                    &node,
                    json!({MEMBER_LABEL: null, MEMBER_NODE_LABEL: null}),
                )
                .await
            }
            NodeGoes::Deleted => delete_node(&host, &node).await,
        }

        let c = d.controller();
        unpublish_until_ok(&c, &vol.volume_id, &node).await;
        assert!(
            member_attachments(&member, &vol.volume_id).await.is_empty(),
            "{case}: the member attachment is gone once ControllerUnpublishVolume succeeded"
        );
        delete_until_ok(&c, &vol.volume_id).await;
        nothing_left_in_member(
            &member,
            &env.namespace,
            &prefix,
            Some(std::slice::from_ref(&vol.volume_id)),
        )
        .await;
        delete_node(&host, &node).await;
    }
}

// A host node that goes away with a volume published there, as Kubernetes
// lives it: the host's attach/detach controller attached it for a pod
// (external-attacher → ControllerPublishVolume → a member attachment),
// then the Node is deleted with its kubelet gone and the pod removed. The
// host detaches (ControllerUnpublishVolume), the claim is deleted
// (DeleteVolume), and nothing is left in either cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_node_that_goes_away_leaves_nothing() {
    let _alone = common::alone();
    let (Some(env), Ok(sidecars)) = (env(), std::env::var("RELAY_E2E_SIDECARS")) else {
        common::skip("no clusters or no sidecars: set RELAY_E2E_* and RELAY_E2E_SIDECARS");
        return;
    };
    let sidecars = std::path::PathBuf::from(sidecars);
    let host = client(&env.host_kubeconfig).await;
    let member = client(&env.member_kubeconfig).await;
    e2e_support::install_crd(&host).await;
    e2e_support::install_csidriver(&host).await;
    let pid = std::process::id();
    let node = format!("gone-{pid}");
    fake_host_node(
        &host,
        &node,
        json!({MEMBER_LABEL: "e2e", MEMBER_NODE_LABEL: "member-node-1"}),
    )
    .await;

    let mut d = start_member_relay(&env, "controller", &["--mode", "controller"]).await;
    let running = e2e_support::host_sidecars(&d, &env.host_kubeconfig, &sidecars);

    let ns = format!("gone-{pid}");
    let class = format!("relay-gone-{pid}");
    e2e_support::host_namespace_and_class(
        &host,
        &ns,
        &class,
        json!({"member": "e2e", "memberStorageClass": env.storage_class,
               "memberNamespace": env.namespace}),
    )
    .await;
    let classes: Api<StorageClass> = Api::all(host.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(host.clone(), &ns);
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                         "resources": {"requests": {"storage": "16Mi"}}}
            }))
            .expect("claim"),
        )
        .await
        .expect("host PVC");
    let host_pv = eventually("the host PVC to bind", Duration::from_secs(90), || {
        let claims = claims.clone();
        async move {
            let pvc = claims.get("data").await.ok()?;
            (pvc.status.as_ref()?.phase.as_deref() == Some("Bound"))
                .then(|| pvc.spec?.volume_name)
                .flatten()
        }
    })
    .await;
    let volume_id = Api::<PersistentVolume>::all(host.clone())
        .get(&host_pv)
        .await
        .expect("host PV")
        .spec
        .and_then(|s| s.csi)
        .map(|c| c.volume_handle)
        .expect("a CSI PV");

    let pods: Api<Pod> = Api::namespaced(host.clone(), &ns);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "app"},
            "spec": {"nodeName": node,
                     "containers": [{"name": "c", "image": "busybox"}],
                     "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}
        }))
        .expect("pod"),
    )
    .await
    .expect("host pod");
    let host_vas: Api<VolumeAttachment> = Api::all(host.clone());
    attached_va("the host attachment", &host_vas, &host_pv).await;
    assert_eq!(
        member_attachments(&member, &volume_id).await.len(),
        1,
        "the volume is attached in the member for the host node"
    );

    // The machine goes while the controller is being rescheduled (its
    // state dir lost: the records come back from RelayVolumes, which never
    // say what was attached). Kubernetes' way for a node that will not come
    // back: the out-of-service taint, the pod force-deleted, and the host
    // detaches at once (without the taint it waits 6 minutes for an unmount
    // no kubelet will confirm); the Node object is deleted before the
    // controller is back to answer the detach.
    drop(running);
    d.crash();
    std::fs::remove_dir_all(&d.state_dir).expect("wipe the state dir");
    let taint = json!({"spec": {"taints": [{"key": "node.kubernetes.io/out-of-service",
        "value": "nodeshutdown", "effect": "NoExecute"}]}});
    Api::<Node>::all(host.clone())
        .patch(&node, &PatchParams::default(), &Patch::Merge(&taint))
        .await
        .expect("taint the node out of service");
    pods.delete("app", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete the pod");
    eventually(
        "the host to start detaching the volume",
        Duration::from_secs(60),
        || {
            let (host_vas, host_pv) = (host_vas.clone(), host_pv.clone());
            async move {
                let vas = host_vas.list(&ListParams::default()).await.ok()?.items;
                vas.iter()
                    .any(|va| {
                        va.spec.source.persistent_volume_name.as_deref() == Some(host_pv.as_str())
                            && va.metadata.deletion_timestamp.is_some()
                    })
                    .then_some(())
            }
        },
    )
    .await;
    delete_node(&host, &node).await;
    d.start_again().await;
    let _running = e2e_support::host_sidecars(&d, &env.host_kubeconfig, &sidecars);
    eventually(
        "the host to detach the volume from the gone node",
        Duration::from_secs(120),
        || {
            let (host_vas, host_pv) = (host_vas.clone(), host_pv.clone());
            async move {
                let left = host_vas.list(&ListParams::default()).await.ok()?.items;
                (!left.iter().any(|va| {
                    va.spec.source.persistent_volume_name.as_deref() == Some(host_pv.as_str())
                }))
                .then_some(())
            }
        },
    )
    .await;
    assert!(
        member_attachments(&member, &volume_id).await.is_empty(),
        "the member attachment went with the host's"
    );

    claims
        .delete("data", &DeleteParams::default())
        .await
        .expect("delete the claim");
    let pvs: Api<PersistentVolume> = Api::all(host.clone());
    eventually("the host PV to go", Duration::from_secs(90), || {
        let (pvs, host_pv) = (pvs.clone(), host_pv.clone());
        async move { pvs.get_opt(&host_pv).await.ok()?.is_none().then_some(()) }
    })
    .await;
    nothing_left_in_member(
        &member,
        &env.namespace,
        &host_pv,
        Some(std::slice::from_ref(&volume_id)),
    )
    .await;
    let _ = classes.delete(&class, &DeleteParams::default()).await;
    let _ = Api::<Namespace>::all(host.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
}
