//! End-to-end test against real clusters. Runs when
//! `RELAY_E2E_HOST_KUBECONFIG`, `RELAY_E2E_MEMBER_KUBECONFIG` and
//! `RELAY_E2E_MEMBER_STORAGE_CLASS` are set (optional:
//! `RELAY_E2E_MEMBER_NAMESPACE`, default "default"; `RELAY_E2E_HOST_NODE`, the
//! host node to label and publish to, default the first node); otherwise it
//! prints "skipped: no clusters". See docs/development.md "End-to-end tests".
//!
//! It installs the RelayVolume CRD in the host, maps a host node to a member
//! node with the topology labels, then drives the calls the sidecars make
//! against `csi-relay serve --backend member` and checks the member PVC/PV,
//! the RelayVolume phases, the mount, and that deletion leaves nothing behind.

use crate::{common, e2e_support};

use std::time::Duration;

use common::req::snw;
use csi_relay::csi;
use csi_relay::k8s::relay_volume::RelayVolume;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams, Patch, PatchParams};

use e2e_support::{
    client, env, eventually, map_host_node, member_create, plugins_dir, publish_request,
    start_member_relay, until_ok,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_volume_lifecycle_on_real_clusters() {
    let _alone = common::alone();
    let Some(env) = env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let host = client(&env.host_kubeconfig).await;
    let member = client(&env.member_kubeconfig).await;

    // The CRD, as deploy/crds/relayvolume-crd.yaml carries it.
    e2e_support::install_crd(&host).await;
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Map a host node to a ready member node.
    let member_nodes: Api<Node> = Api::all(member.clone());
    let member_node = member_nodes
        .list(&ListParams::default())
        .await
        .expect("list member nodes")
        .items[0]
        .metadata
        .name
        .clone()
        .expect("member node name");
    let host_nodes: Api<Node> = Api::all(host.clone());
    let host_node = match std::env::var("RELAY_E2E_HOST_NODE") {
        Ok(n) => n,
        Err(_) => host_nodes
            .list(&ListParams::default())
            .await
            .expect("list host nodes")
            .items[0]
            .metadata
            .name
            .clone()
            .expect("host node name"),
    };
    map_host_node(&host, &host_node, Some(&member_node)).await;

    // kubelet's plugins dir as the relay sees it: the member driver's node
    // plugin socket at <dir>/<driver>/csi.sock.
    let plugins = match &env.member_plugin {
        Some((driver, sock)) => plugins_dir(driver, sock),
        None => tempfile::tempdir().expect("plugins dir"),
    };
    let plugins_dir = plugins.path().to_string_lossy().into_owned();
    let mut d = start_member_relay(
        &env,
        &host_node,
        &[
            "--plugins-dir",
            &plugins_dir,
            "--housekeeping-interval",
            "2",
        ],
    )
    .await;

    let mut c = d.controller();
    let req = member_create(&env, &format!("e2e-{}", std::process::id()), 1 << 30);
    let vol = c
        .create_volume(req.clone())
        .await
        .expect("CreateVolume")
        .into_inner()
        .volume
        .unwrap();
    let again = c
        .create_volume(req)
        .await
        .expect("repeat CreateVolume")
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, vol.volume_id, "one member PVC per name");

    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(member.clone(), &env.namespace);
    let pvc_name = vol
        .volume_context
        .get("relay.csi.dev/member-pvc")
        .cloned()
        .expect("volume_context names the member PVC");
    pvcs.get(&pvc_name).await.expect("member PVC exists");

    let relay: Api<RelayVolume> = Api::all(host.clone());
    let rv_name = csi_relay::k8s::relay_volume::object_name(&vol.volume_id);
    // RelayVolumes are mirrored off the RPC path: they follow shortly.
    let wait_phase = |want: &'static str| {
        let relay = relay.clone();
        let rv_name = rv_name.clone();
        async move {
            eventually(
                &format!("RelayVolume phase {want}"),
                Duration::from_secs(30),
                || {
                    let relay = relay.clone();
                    let rv_name = rv_name.clone();
                    async move {
                        let rv = relay.get_opt(&rv_name).await.ok().flatten()?;
                        let p = rv.status.as_ref().and_then(|s| s.phase.clone())?;
                        (p == want).then_some(())
                    }
                },
            )
            .await
        }
    };
    wait_phase("CREATED").await;

    // A Kosmos-style virtual node standing for the whole member cluster
    // (RELAY_E2E_VIRTUAL_NODE, tainted kosmos.io/node=true:NoSchedule):
    // NODE_READY with no relay-made member attachment.
    if let Ok(vnode) = std::env::var("RELAY_E2E_VIRTUAL_NODE") {
        let member_label = serde_json::json!({"metadata": {"labels": {
            "topology.relay.csi.dev/member": "e2e"}}});
        host_nodes
            .patch(
                &vnode,
                &PatchParams::default(),
                &Patch::Merge(&member_label),
            )
            .await
            .expect("label the virtual node");
        let vas: Api<VolumeAttachment> = Api::all(member.clone());
        let before = vas.list(&ListParams::default()).await.unwrap().items.len();
        let reply = c
            .controller_publish_volume(csi::ControllerPublishVolumeRequest {
                volume_id: vol.volume_id.clone(),
                node_id: vnode.clone(),
                volume_capability: Some(snw()),
                volume_context: vol.volume_context.clone(),
                ..Default::default()
            })
            .await
            .expect("ControllerPublishVolume to a virtual node")
            .into_inner();
        assert!(reply.publish_context.is_empty());
        assert_eq!(
            vas.list(&ListParams::default()).await.unwrap().items.len(),
            before,
            "no relay-made member attachment for a whole-cluster virtual node"
        );
        c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            node_id: vnode.clone(),
            ..Default::default()
        })
        .await
        .expect("ControllerUnpublishVolume from the virtual node");
        let unlabel = serde_json::json!({"metadata": {"labels": {
            "topology.relay.csi.dev/member": null}}});
        host_nodes
            .patch(&vnode, &PatchParams::default(), &Patch::Merge(&unlabel))
            .await
            .unwrap();
    }

    // ControllerPublish retries (UNAVAILABLE) until the member PVC binds.
    let published = until_ok(
        "member PVC to bind and ControllerPublish to succeed",
        || {
            let mut c = d.controller();
            let req = publish_request(&vol, &host_node, snw());
            async move { c.controller_publish_volume(req).await }
        },
    )
    .await
    .into_inner();
    let bound = pvcs.get(&pvc_name).await.unwrap();
    assert_eq!(bound.status.and_then(|s| s.phase).as_deref(), Some("Bound"));
    wait_phase("NODE_READY").await;

    let staging = d.path("staging");
    std::fs::create_dir_all(&staging).unwrap();
    let target = d.path("target");
    let mut n = d.node();
    n.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        publish_context: published.publish_context.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        volume_capability: Some(snw()),
        volume_context: vol.volume_context.clone(),
        ..Default::default()
    })
    .await
    .expect("NodeStageVolume mounts the member storage");
    wait_phase("VOL_READY").await;
    n.node_publish_volume(csi::NodePublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        publish_context: published.publish_context.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        target_path: target.to_string_lossy().into(),
        volume_capability: Some(snw()),
        volume_context: vol.volume_context.clone(),
        ..Default::default()
    })
    .await
    .expect("NodePublishVolume");
    std::fs::write(target.join("hello"), b"from the host cluster").expect("the mount is writable");
    wait_phase("PUBLISHED").await;

    // Unwind and delete: nothing left in either cluster.
    n.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        target_path: target.to_string_lossy().into(),
    })
    .await
    .unwrap();
    n.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
    })
    .await
    .unwrap();

    // A member pod on the same member node uses the volume too: the
    // member's attach/detach controller attaches it with its own
    // VolumeAttachment. Unpublishing from the host must not detach it from
    // under that pod; the relay's attachment is collected once the pod is
    // gone.
    let vas: Api<VolumeAttachment> = Api::all(member.clone());
    let ours = |list: &[VolumeAttachment]| {
        list.iter()
            .find(|va| {
                va.metadata.labels.as_ref().is_some_and(|l| {
                    l.get("app.kubernetes.io/managed-by").map(String::as_str) == Some("csi-relay")
                })
            })
            .and_then(|va| va.metadata.name.clone())
    };
    let pv_name = pvcs
        .get(&pvc_name)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.volume_name)
        .expect("bound PV");
    let relay_va = ours(&vas.list(&ListParams::default()).await.unwrap().items)
        .expect("the relay attached the member volume");
    let pods: Api<Pod> = Api::namespaced(member.clone(), &env.namespace);
    let pod_name = format!("e2e-member-pod-{}", std::process::id());
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name},
        "spec": {"nodeName": member_node, "containers": [{"name": "c", "image": "busybox"}],
                 "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": pvc_name}}]}}))
    .unwrap();
    pods.create(&Default::default(), &pod)
        .await
        .expect("member pod");
    let pods_va = eventually(
        "the member's own attachment",
        Duration::from_secs(60),
        || {
            let vas = vas.clone();
            let (pv, relay_va) = (pv_name.clone(), relay_va.clone());
            async move {
                vas.list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .find_map(|va| {
                        let name = va.metadata.name.clone()?;
                        let attached = va.status.as_ref().is_some_and(|s| s.attached);
                        (name != relay_va
                            && attached
                            && va.spec.source.persistent_volume_name.as_deref()
                                == Some(pv.as_str()))
                        .then_some(name)
                    })
            }
        },
    )
    .await;
    c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id: host_node.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    for name in [&relay_va, &pods_va] {
        let va = vas.get(name).await.expect("still there");
        assert!(
            va.metadata.deletion_timestamp.is_none() && va.status.is_some_and(|s| s.attached),
            "{name} must stay attached while the member pod uses the volume"
        );
    }
    // No kubelet here finishes a graceful deletion: force it.
    let now = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    pods.delete(&pod_name, &now).await.unwrap();
    eventually(
        "the relay's attachment to be collected",
        Duration::from_secs(120),
        || {
            let vas = vas.clone();
            let name = relay_va.clone();
            async move { vas.get_opt(&name).await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
    // As the provisioner does: ABORTED (housekeeping is busy with the
    // volume) is retried.
    until_ok("DeleteVolume", || {
        let mut c = d.controller();
        let req = csi::DeleteVolumeRequest {
            volume_id: vol.volume_id.clone(),
            ..Default::default()
        };
        async move { c.delete_volume(req).await }
    })
    .await;
    eventually("member PVC deletion", Duration::from_secs(120), || {
        let pvcs = pvcs.clone();
        let name = pvc_name.clone();
        async move {
            pvcs.get_opt(&name)
                .await
                .ok()
                .flatten()
                .is_none()
                .then_some(())
        }
    })
    .await;
    eventually("RelayVolume removal", Duration::from_secs(30), || {
        let relay = relay.clone();
        let rv_name = rv_name.clone();
        async move { relay.get_opt(&rv_name).await.ok()?.is_none().then_some(()) }
    })
    .await;
    map_host_node(&host, &host_node, None).await;
    d.stop_gracefully().await;
}
