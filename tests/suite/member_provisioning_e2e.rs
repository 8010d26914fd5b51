//! A member that cannot provision the relay's claim, on the real control
//! planes (the member's csi-driver-host-path refuses a size over its
//! maximum, as a provisioner with no topology or no capacity refuses, with
//! a `ProvisioningFailed` Warning on the claim):
//! - a class that binds at once: CreateVolume does not answer success
//!   (the host claim would bind over a member claim that never binds); it
//!   answers UNAVAILABLE with the member's own words, within its bound;
//! - a class that waits for a consumer: CreateVolume answers (the member
//!   provisions once a node is chosen, here at once: the relay names it),
//!   and the member's failure reaches LAST-ERROR and a Warning event on the
//!   host claim within seconds.
//!
//! Skipped unless RELAY_E2E_* are set (see member_e2e.rs).

use crate::{common, e2e_support};

use std::time::{Duration, Instant};

use csi_relay::k8s::relay_volume::{object_name, RelayVolume};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use tonic::Code;

use e2e_support::{eventually, member_create, start_member_relay, until_ok};

/// Over csi-driver-host-path's default maximum volume size (1 TiB).
const TOO_BIG: i64 = 2 << 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_cannot_provision_is_heard_in_the_host() {
    let _alone = common::alone();
    let Some(env) = e2e_support::env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let (host, member, _host_node) = e2e_support::mapped_clusters(&env).await;
    let mut d = start_member_relay(&env, "controller", &["--mode", "controller"]).await;
    let run = std::process::id();

    // Binds at once: refused until the member binds, with its reason.
    let name = format!("unprovisionable-{run}-now");
    let started = Instant::now();
    let refused = d
        .controller()
        .create_volume(member_create(&env, &name, TOO_BIG))
        .await
        .expect_err("a host claim must not bind over a member claim that does not");
    let took = started.elapsed();
    assert_eq!(refused.code(), Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("not Bound, after 8 s")
            && refused
                .message()
                .contains("the member says ProvisioningFailed"),
        "{}",
        refused.message()
    );
    assert!(took < Duration::from_secs(20), "bounded: {took:?}");
    eprintln!(
        "CreateVolume, class binds at once: {:?} after {took:?}: {}",
        refused.code(),
        refused.message()
    );

    // Waits for a consumer: answered, and the member's word comes after.
    let wffc = format!("{}-wffc", env.storage_class);
    let host_claim = format!("unprovisionable-{run}-later");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(host.clone(), "default");
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": host_claim},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "no-such-class",
                 "resources": {"requests": {"storage": "2Ti"}}}
    }))
    .expect("a claim");
    claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("the host claim the events are about");
    let mut req = member_create(&env, &host_claim, TOO_BIG);
    req.parameters
        .insert("memberStorageClass".into(), wffc.clone());
    req.parameters
        .insert("csi.storage.k8s.io/pvc/name".into(), host_claim.clone());
    req.parameters
        .insert("csi.storage.k8s.io/pvc/namespace".into(), "default".into());
    req.accessibility_requirements = Some(csi_relay::csi::TopologyRequirement {
        requisite: vec![],
        preferred: vec![csi_relay::csi::Topology {
            segments: [
                (
                    "topology.relay.csi.dev/member".to_string(),
                    "e2e".to_string(),
                ),
                (
                    "topology.relay.csi.dev/member-node".to_string(),
                    "member-node-1".to_string(),
                ),
            ]
            .into(),
        }],
    });
    let answered = Instant::now();
    let vol = until_ok("CreateVolume, class waits for a consumer", || {
        let mut c = d.controller();
        let req = req.clone();
        async move { c.create_volume(req).await }
    })
    .await
    .into_inner()
    .volume
    .expect("a volume");
    let rvs: Api<RelayVolume> = Api::all(host.clone());
    let rv = object_name(&vol.volume_id);
    let shown = eventually(
        "LAST-ERROR from the member",
        Duration::from_secs(30),
        || {
            let (rvs, rv) = (rvs.clone(), rv.clone());
            async move {
                rvs.get(&rv)
                    .await
                    .ok()?
                    .status?
                    .last_error
                    .filter(|e| e.starts_with("member e2e: PersistentVolumeClaim"))
            }
        },
    )
    .await;
    let heard = answered.elapsed();
    assert!(
        shown.contains("is not provisioned: ProvisioningFailed"),
        "{shown}"
    );
    let events: Api<Event> = Api::namespaced(host.clone(), "default");
    let event = eventually(
        "the event on the host claim",
        Duration::from_secs(30),
        || {
            let events = events.clone();
            let host_claim = host_claim.clone();
            async move {
                events
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .find(|e| {
                        e.reason.as_deref() == Some("MemberProvisioningFailed")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                                == Some(host_claim.as_str())
                    })
            }
        },
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    eprintln!(
        "class waits for a consumer: LAST-ERROR {heard:?} after CreateVolume answered: {shown}"
    );

    // Nothing left: the volume deleted, the member claim with it.
    e2e_support::delete_until_ok(&d.controller(), &vol.volume_id).await;
    let _ = claims.delete(&host_claim, &DeleteParams::default()).await;
    let prefix = format!("unprovisionable-{run}-");
    // The refused create's volume: the CO deletes what it never got.
    let mut c = d.controller();
    let _ = c
        .delete_volume(csi_relay::csi::DeleteVolumeRequest {
            volume_id: refused_volume_id(&member, &env.namespace, &name).await,
            ..Default::default()
        })
        .await;
    e2e_support::nothing_left_in_member(&member, &env.namespace, &prefix, Some(&[])).await;
    d.stop_gracefully().await;
}

/// The volume id of the member claim the relay made for CO volume `name`.
async fn refused_volume_id(member: &kube::Client, namespace: &str, name: &str) -> String {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(member.clone(), namespace);
    claims
        .list(&ListParams::default())
        .await
        .expect("list member claims")
        .items
        .into_iter()
        .find(|c| e2e_support::volume_name_of(c) == Some(name))
        .and_then(|c| {
            c.metadata
                .annotations?
                .remove(csi_relay::k8s::naming::VOLUME_ID_ANNOTATION)
        })
        .unwrap_or_default()
}
