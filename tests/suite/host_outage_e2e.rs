//! The host API cut for the controller only (the member API fine), then the
//! controller killed with SIGKILL and its state dir lost, as a rescheduled
//! Deployment pod with an emptyDir: every call it answered must be known to
//! the next controller (which rebuilds from RelayVolumes), every other call
//! must have failed so that the CO retries it; and once the flows are
//! unwound no member PVC and no relay-made member VolumeAttachment is left.
//! The controller reaches the host API through a fault proxy on 127.0.0.1
//! (`e2e_support::fault_proxy`), which black-holes it (hung calls, not
//! refusals) and heals it. Skipped unless RELAY_E2E_* are set
//! (see member_e2e.rs).

use crate::{common, e2e_support};

use common::req::snw;
use csi_relay::csi;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams};
use tonic::Code;

use e2e_support::fault_proxy::{server_of, FaultProxy};
use e2e_support::{
    map_host_node, member_create, publish_request, relay_made_for, start_member_relay, until_ok,
};

const ROUNDS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_answered_during_a_host_outage_survive_a_controller_that_loses_its_state() {
    let _alone = common::alone();
    let Some(mut env) = e2e_support::env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let (host, member, host_node) = e2e_support::mapped_clusters(&env).await;

    let files = tempfile::tempdir().expect("temp dir");
    let relay = FaultProxy::to(&server_of(&env.host_kubeconfig)).await;
    let kubeconfig = relay.kubeconfig(&env.host_kubeconfig, &files.path().join("host"));
    env.host_kubeconfig = kubeconfig.display().to_string();

    let mut d = start_member_relay(&env, "controller", &["--mode", "controller"]).await;
    let run = std::process::id();
    let mut ids = Vec::new();
    let mut refused = 0;
    // Only this test's attachments count: the controller's housekeeping
    // collects other volumes' leftovers whenever it sweeps (2 s after each
    // start, in the middle of a round), and an earlier test that failed may
    // have left some the rebuilt records still want.
    let vas: Api<VolumeAttachment> = Api::all(member.clone());
    let relay_vas_of = |id: String| {
        let vas = vas.clone();
        async move {
            relay_made_for(
                &vas.list(&ListParams::default())
                    .await
                    .expect("list member VolumeAttachments")
                    .items,
                &id,
            )
        }
    };
    let mut refused_publishes = 0;
    for round in 0..ROUNDS {
        let name = format!("outage-{run}-{round}");
        // Every other round the volume was made before the outage, and
        // the outage meets its ControllerPublishVolume.
        let made_before = if round % 2 == 1 {
            Some(e2e_support::create_until_ok(&d.controller(), &env, &name, 1 << 24).await)
        } else {
            None
        };
        relay.cut();
        let mut c = d.controller();
        // What the sidecars send during the outage, and what they are told.
        let created = match &made_before {
            Some(vol) => Ok(tonic::Response::new(csi::CreateVolumeResponse {
                volume: Some(vol.clone()),
            })),
            None => c.create_volume(member_create(&env, &name, 1 << 24)).await,
        };
        let mut answered: Option<csi::Volume> = None;
        let mut published = false;
        match created {
            Ok(r) => {
                let vol = r.into_inner().volume.expect("a volume");
                let p = c
                    .controller_publish_volume(publish_request(&vol, &host_node, snw()))
                    .await;
                published = p.is_ok();
                if let Err(s) = &p {
                    assert!(
                        matches!(s.code(), Code::Unavailable | Code::Aborted),
                        "round {round}: publish during the outage: {s:?}"
                    );
                    refused_publishes += 1;
                    // Never published before this round: no attachment of
                    // it may exist.
                    assert_eq!(
                        relay_vas_of(vol.volume_id.clone()).await,
                        Vec::<String>::new(),
                        "round {round}: a refused publish made a member attachment"
                    );
                }
                answered = Some(vol);
            }
            Err(s) => {
                assert_eq!(s.code(), Code::Unavailable, "round {round}: {s:?}");
                assert!(s.message().contains("RelayVolume"), "{}", s.message());
                refused += 1;
            }
        }
        d.crash();
        std::fs::remove_dir_all(&d.state_dir).expect("wipe the state dir");
        relay.heal();
        d.start_again().await;

        let c = d.controller();
        if let Some(vol) = &answered {
            // Known to the new controller: a publish of it is no NOT_FOUND.
            let req = publish_request(vol, &host_node, snw());
            let mut again = c.clone();
            let answer = again.controller_publish_volume(req).await;
            assert!(
                !matches!(&answer, Err(s) if s.code() == Code::NotFound),
                "round {round}: an acknowledged volume (published: {published}) was forgotten: {answer:?}"
            );
        }
        // The CO retries what failed, and repeats what it was told.
        let vol = e2e_support::create_until_ok(&c, &env, &name, 1 << 24).await;
        if let Some(first) = &answered {
            assert_eq!(first.volume_id, vol.volume_id, "the same volume");
        }
        until_ok("ControllerPublishVolume retry", || {
            let mut c = c.clone();
            let req = publish_request(&vol, &host_node, snw());
            async move { c.controller_publish_volume(req).await }
        })
        .await;
        ids.push(vol.volume_id);
    }
    eprintln!("during the outage: {refused} creates and {refused_publishes} publishes refused (UNAVAILABLE), every answered call known to the next controller");
    assert_eq!(
        refused + refused_publishes,
        ROUNDS,
        "each round met the outage with a call that failed"
    );

    e2e_support::unwind(&d.controller(), &ids, &host_node).await;
    let prefix = format!("outage-{run}-");
    e2e_support::nothing_left_in_member(&member, &env.namespace, &prefix, Some(&ids)).await;
    map_host_node(&host, &host_node, None).await;
    d.stop_gracefully().await;
}
