//! A controller killed with SIGKILL at random points of CreateVolume and
//! ControllerPublishVolume, 20 times, on real control planes; restarted
//! with the same state dir and (every other round) an empty one, as a
//! rescheduled Deployment pod with an emptyDir would be. The CO's retries
//! must find exactly one member PVC per volume, and once every flow is
//! unwound no member PVC and no relay-made member VolumeAttachment is left.
//! Skipped unless RELAY_E2E_* are set (see member_e2e.rs).

use crate::{common, e2e_support};

use std::time::Duration;

use common::req::snw;
use csi_relay::csi;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ListParams};
use tonic::Code;

use e2e_support::{map_host_node, member_create, publish_request, start_member_relay, until_ok};

const ROUNDS: u64 = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_in_create_and_publish_leaves_one_claim_per_volume_and_nothing_after() {
    let _alone = common::alone();
    let Some(env) = e2e_support::env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let (host, member, host_node) = e2e_support::mapped_clusters(&env).await;
    let mut d = start_member_relay(
        &env,
        "controller",
        &["--mode", "controller", "--housekeeping-interval", "3"],
    )
    .await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(member.clone(), &env.namespace);
    let run = std::process::id();
    let mut ids = Vec::new();
    for round in 0..ROUNDS {
        let name = format!("crash-{run}-{round}");
        // The flow the sidecars drive, cut short by a SIGKILL.
        let channel = d.channel.clone();
        let req = member_create(&env, &name, 1 << 24);
        let node = host_node.clone();
        let flow = tokio::spawn(async move {
            let mut c = csi::controller_client::ControllerClient::new(channel);
            let Ok(v) = c.create_volume(req).await else {
                return;
            };
            let Some(vol) = v.into_inner().volume else {
                return;
            };
            for _ in 0..50 {
                let publish = publish_request(&vol, &node, snw());
                match c.controller_publish_volume(publish).await {
                    Ok(_) => return,
                    Err(s) if s.code() == Code::Unavailable => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    Err(_) => return,
                }
            }
        });
        // Anywhere from before the create to after the attachment.
        let at = Duration::from_millis(20 + (round * 137) % 900);
        tokio::time::sleep(at).await;
        d.crash();
        flow.abort();
        let empty = round % 2 == 1;
        if empty {
            std::fs::remove_dir_all(&d.state_dir).expect("wipe the state dir");
        }
        d.start_again().await;

        // The CO retries the create (same name) and the publish.
        let c = d.controller();
        let vol = e2e_support::create_until_ok(&c, &env, &name, 1 << 24).await;
        let mine: Vec<PersistentVolumeClaim> = pvcs
            .list(&ListParams::default().labels("app.kubernetes.io/managed-by=csi-relay"))
            .await
            .expect("list member PVCs")
            .items
            .into_iter()
            .filter(|p| e2e_support::volume_name_of(p) == Some(name.as_str()))
            .collect();
        assert_eq!(
            mine.len(),
            1,
            "round {round} (killed after {at:?}, empty state dir: {empty}): one member PVC per volume"
        );
        until_ok("ControllerPublishVolume retry", || {
            let mut c = c.clone();
            let req = publish_request(&vol, &host_node, snw());
            async move { c.controller_publish_volume(req).await }
        })
        .await;
        ids.push(vol.volume_id);
    }

    // Unwind every flow as the CO would.
    e2e_support::unwind(&d.controller(), &ids, &host_node).await;
    let prefix = format!("crash-{run}-");
    // For a post-mortem: the driver's log outlives its temp dir.
    if let Ok(path) = std::env::var("RELAY_E2E_KEEP_LOG") {
        let _ = std::fs::write(&path, format!("ids: {ids:?}\n{}", d.log()));
    }
    e2e_support::nothing_left_in_member(&member, &env.namespace, &prefix, Some(&ids)).await;
    map_host_node(&host, &host_node, None).await;
    d.stop_gracefully().await;
}
