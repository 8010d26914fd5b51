//! The host-node flow with controller and node plugins in separate
//! processes, as deploy/ runs them (`--mode controller`, `--mode node`), on
//! real control planes: `kubectl get relayvolumes` must walk CREATED →
//! NODE_READY → VOL_READY → PUBLISHED and back, although each process only
//! knows its half. Skipped unless RELAY_E2E_* are set (see member_e2e.rs).

use crate::{common, e2e_support};

use std::time::Duration;

use common::req::snw;
use csi_relay::csi;
use csi_relay::k8s::relay_volume::object_name;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

use e2e_support::{
    client, env, eventually, map_host_node, member_create, plugins_dir, publish_request,
    start_member_relay, until_ok, wait_phase,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_controller_and_node_walk_every_phase_and_back() {
    let _alone = common::alone();
    let Some(env) = env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let Some((member_driver, member_sock)) = env.member_plugin.clone() else {
        common::skip("no member node plugin: set RELAY_E2E_MEMBER_CSI_DRIVER and RELAY_E2E_MEMBER_PLUGIN_SOCK");
        return;
    };
    let host = client(&env.host_kubeconfig).await;
    let member = client(&env.member_kubeconfig).await;
    e2e_support::install_crd(&host).await;

    let member_node = Api::<Node>::all(member.clone())
        .list(&ListParams::default())
        .await
        .expect("list member nodes")
        .items[0]
        .metadata
        .name
        .clone()
        .expect("member node name");
    let host_node = std::env::var("RELAY_E2E_HOST_NODE").unwrap_or_else(|_| "host-node-1".into());
    map_host_node(&host, &host_node, Some(&member_node)).await;

    let controller = start_member_relay(&env, "controller", &["--mode", "controller"]).await;
    // The node plugin: no member kubeconfig, only the host (RelayVolumes)
    // and the member driver's node plugin socket in kubelet's plugins dir.
    let plugins = plugins_dir(&member_driver, &member_sock);
    let plugins_dir = plugins.path().to_string_lossy().into_owned();
    let node = common::Driver::start_as(
        &host_node,
        &[
            "--mode",
            "node",
            "--backend",
            "member",
            "--host-kubeconfig",
            &env.host_kubeconfig,
            "--plugins-dir",
            &plugins_dir,
            "--node-member",
            "e2e",
        ],
    )
    .await;

    let mut c = controller.controller();
    let req = member_create(&env, &format!("split-{}", std::process::id()), 1 << 24);
    let vol = c
        .create_volume(req)
        .await
        .expect("CreateVolume")
        .into_inner()
        .volume
        .unwrap();
    let rv = object_name(&vol.volume_id);
    wait_phase(&host, &rv, "CREATED").await;

    // UNAVAILABLE until the member PVC binds; the attacher retries.
    let published = until_ok("ControllerPublishVolume", || {
        let mut c = controller.controller();
        let req = publish_request(&vol, &host_node, snw());
        async move { c.controller_publish_volume(req).await }
    })
    .await
    .into_inner();
    wait_phase(&host, &rv, "NODE_READY").await;

    let staging = node.path("staging");
    std::fs::create_dir_all(&staging).unwrap();
    let target = node.path("target");
    let mut n = node.node();
    n.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        publish_context: published.publish_context.clone(),
        staging_target_path: staging.to_string_lossy().into(),
        volume_capability: Some(snw()),
        volume_context: vol.volume_context.clone(),
        ..Default::default()
    })
    .await
    .expect("NodeStageVolume in the node process");
    wait_phase(&host, &rv, "VOL_READY").await;
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
    std::fs::write(target.join("hello"), b"split").expect("the mount is writable");
    wait_phase(&host, &rv, "PUBLISHED").await;

    // And back.
    n.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        target_path: target.to_string_lossy().into(),
    })
    .await
    .expect("NodeUnpublishVolume");
    wait_phase(&host, &rv, "VOL_READY").await;
    n.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: vol.volume_id.clone(),
        staging_target_path: staging.to_string_lossy().into(),
    })
    .await
    .expect("NodeUnstageVolume");
    wait_phase(&host, &rv, "NODE_READY").await;
    c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id: host_node.clone(),
        ..Default::default()
    })
    .await
    .expect("ControllerUnpublishVolume");
    wait_phase(&host, &rv, "CREATED").await;
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: vol.volume_id.clone(),
        ..Default::default()
    })
    .await
    .expect("DeleteVolume");
    let relay: Api<csi_relay::k8s::relay_volume::RelayVolume> = Api::all(host.clone());
    eventually("RelayVolume removal", Duration::from_secs(30), || {
        let (relay, rv) = (relay.clone(), rv.clone());
        async move { relay.get_opt(&rv).await.ok()?.is_none().then_some(()) }
    })
    .await;
    map_host_node(&host, &host_node, None).await;
}
