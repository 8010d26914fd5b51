//! End-to-end test against real clusters. Runs when
//! `RELAY_E2E_HOST_KUBECONFIG`, `RELAY_E2E_MEMBER_KUBECONFIG` and
//! `RELAY_E2E_MEMBER_STORAGE_CLASS` are set (optional:
//! `RELAY_E2E_MEMBER_NAMESPACE`, default "default"; `RELAY_E2E_HOST_NODE`, the
//! host node to label and publish to, default the first node); otherwise it
//! prints "skipped: no clusters". See README "End-to-end tests".
//!
//! It installs the RelayVolume CRD in the host, maps a host node to a member
//! node with the topology labels, then drives the calls the sidecars make
//! against `csi-relay serve --backend member` and checks the member PVC/PV,
//! the RelayVolume phases, the mount, and that deletion leaves nothing behind.

mod common;

use std::time::{Duration, Instant};

use common::req::snw;
use csi_relay::csi;
use csi_relay::member::relay_volume::RelayVolume;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, CustomResourceExt};
use tonic::Code;

struct Env {
    host_kubeconfig: String,
    member_kubeconfig: String,
    storage_class: String,
    namespace: String,
}

fn env() -> Option<Env> {
    Some(Env {
        host_kubeconfig: std::env::var("RELAY_E2E_HOST_KUBECONFIG").ok()?,
        member_kubeconfig: std::env::var("RELAY_E2E_MEMBER_KUBECONFIG").ok()?,
        storage_class: std::env::var("RELAY_E2E_MEMBER_STORAGE_CLASS").ok()?,
        namespace: std::env::var("RELAY_E2E_MEMBER_NAMESPACE").unwrap_or_else(|_| "default".into()),
    })
}

async fn client(path: &str) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_volume_lifecycle_on_real_clusters() {
    let Some(env) = env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let host = client(&env.host_kubeconfig).await;
    let member = client(&env.member_kubeconfig).await;

    // The CRD, as deploy/relayvolume-crd.yaml carries it.
    let crds: Api<CustomResourceDefinition> = Api::all(host.clone());
    crds.patch(
        "relayvolumes.relay.csi.dev",
        &PatchParams::apply("csi-relay-e2e").force(),
        &Patch::Apply(RelayVolume::crd()),
    )
    .await
    .expect("install RelayVolume CRD");
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
    let labels = serde_json::json!({"metadata": {"labels": {
        "topology.relay.csi.dev/member": "e2e",
        "topology.relay.csi.dev/member-node": member_node,
    }}});
    host_nodes
        .patch(&host_node, &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .expect("label host node");

    let mut d = common::Driver::start_as(
        &host_node,
        &[
            "--backend",
            "member",
            "--member",
            &format!("e2e={}", env.member_kubeconfig),
            "--host-kubeconfig",
            &env.host_kubeconfig,
        ],
    )
    .await;

    let mut c = d.controller();
    let mut req = common::req::create(&format!("e2e-{}", std::process::id()), 1 << 30, snw());
    req.parameters = [
        ("member".to_string(), "e2e".to_string()),
        ("memberStorageClass".to_string(), env.storage_class.clone()),
        ("memberNamespace".to_string(), env.namespace.clone()),
    ]
    .into();
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
    let rv_name = csi_relay::member::relay_volume::object_name(&vol.volume_id);
    let phase = |rv: &RelayVolume| {
        rv.status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default()
    };
    assert_eq!(
        phase(&relay.get(&rv_name).await.expect("RelayVolume exists")),
        "CREATED"
    );

    // ControllerPublish retries (UNAVAILABLE) until the member PVC binds.
    let published = eventually(
        "member PVC to bind and ControllerPublish to succeed",
        Duration::from_secs(300),
        || {
            let mut c = d.controller();
            let req = csi::ControllerPublishVolumeRequest {
                volume_id: vol.volume_id.clone(),
                node_id: host_node.clone(),
                volume_capability: Some(snw()),
                volume_context: vol.volume_context.clone(),
                ..Default::default()
            };
            async move {
                match c.controller_publish_volume(req).await {
                    Ok(r) => Some(r.into_inner()),
                    Err(s) if s.code() == Code::Unavailable || s.code() == Code::Aborted => None,
                    Err(s) => panic!("ControllerPublishVolume: {s:?}"),
                }
            }
        },
    )
    .await;
    let bound = pvcs.get(&pvc_name).await.unwrap();
    assert_eq!(bound.status.and_then(|s| s.phase).as_deref(), Some("Bound"));
    assert_eq!(phase(&relay.get(&rv_name).await.unwrap()), "NODE_READY");

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
    assert_eq!(phase(&relay.get(&rv_name).await.unwrap()), "VOL_READY");
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
    assert_eq!(phase(&relay.get(&rv_name).await.unwrap()), "PUBLISHED");

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
    c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id: host_node.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: vol.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
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
    assert!(
        relay.get_opt(&rv_name).await.unwrap().is_none(),
        "RelayVolume removed"
    );
    let unlabel = serde_json::json!({"metadata": {"labels": {
        "topology.relay.csi.dev/member": null,
        "topology.relay.csi.dev/member-node": null,
    }}});
    host_nodes
        .patch(&host_node, &PatchParams::default(), &Patch::Merge(&unlabel))
        .await
        .unwrap();
    d.stop_gracefully().await;
}
