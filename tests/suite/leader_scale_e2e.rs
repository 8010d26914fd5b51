//! A new leader's time from election to its first served call, with many
//! volumes, on the real control planes: a benchmark that prints figures.
//!
//! One volume is made through the relay; its RelayVolume is copied
//! RELAY_LEADER_VOLUMES times (default 1000; 10000 for the figure in
//! docs/operations.md) under fresh volume ids, as records the new leader
//! must rebuild its store from. A leader and a standby run; the leader
//! stops (SIGTERM: it gives the Lease up, which the standby sees at once);
//! the figure is the time from the stop to the standby's first answered
//! controller call, and its split into taking the Lease and rebuilding.
//! The copies are deleted at the end. Runs when RELAY_E2E_* are set (see
//! member_e2e.rs), otherwise prints "skipped".

use crate::{common, e2e_support};

use std::time::{Duration, Instant};

use csi_relay::csi;
use csi_relay::csi::controller_client::ControllerClient;
use csi_relay::k8s::relay_volume::RelayVolume;
use futures::{stream, StreamExt};
use kube::api::{Api, DeleteParams, ListParams, PostParams};

const DRIVER: &str = "leader-scale.e2e.relay.csi.dev";
const COPY_LABEL: &str = "e2e.relay.csi.dev/leader-scale";

async fn start(env: &e2e_support::Env, name: &str) -> common::Driver {
    e2e_support::start_elected_relay(env, name, &env.host_kubeconfig, DRIVER).await
}

/// `rv` under volume id `id`: every mention of the original id replaced
/// (spec, record, labels), the server's fields dropped.
fn copy_of(rv: &RelayVolume, id: &str, label: &str) -> Option<RelayVolume> {
    let original = rv.spec.volume_id.clone();
    let mut value = serde_json::to_value(rv).ok()?;
    if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        for field in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
            "generation",
            "finalizers",
        ] {
            meta.remove(field);
        }
    }
    if let Some(obj) = value.as_object_mut() {
        obj.remove("status");
    }
    let text = serde_json::to_string(&value).ok()?.replace(&original, id);
    let mut copy: RelayVolume = serde_json::from_str(&text).ok()?;
    copy.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(COPY_LABEL.into(), label.into());
    Some(copy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_leader_serves_soon_after_election_with_many_volumes() {
    let _alone = common::alone();
    let Some(env) = e2e_support::env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let n: usize = std::env::var("RELAY_LEADER_VOLUMES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let host = e2e_support::client(&env.host_kubeconfig).await;
    e2e_support::install_crd(&host).await;
    let mut first = start(&env, "first").await;
    let c1 = ControllerClient::new(first.serving().await);
    let name = format!("leader-scale-{}", std::process::id());
    let made = e2e_support::create_until_ok(&c1, &env, &name, 16 << 20).await;
    let api: Api<RelayVolume> = Api::all(host.clone());
    let original = api
        .list(&ListParams::default())
        .await
        .expect("list RelayVolumes")
        .items
        .into_iter()
        .find(|rv| rv.spec.volume_id == made.volume_id)
        .expect("the volume's RelayVolume");
    let label = std::process::id().to_string();
    let made_at = Instant::now();
    let copies: Vec<RelayVolume> = (0..n)
        .filter_map(|i| {
            let id = format!(
                "m-e2e-{:032x}",
                (u128::from(std::process::id()) << 64) | i as u128
            );
            copy_of(&original, &id, &label)
        })
        .collect();
    assert_eq!(copies.len(), n, "a copy could not be made");
    stream::iter(copies)
        .for_each_concurrent(32, |rv| {
            let api = api.clone();
            async move {
                for attempt in 0.. {
                    match api.create(&PostParams::default(), &rv).await {
                        Ok(_) => return,
                        Err(kube::Error::Api(e)) if e.code == 409 => return,
                        Err(e) if attempt < 10 => {
                            eprintln!("create a RelayVolume copy: {e}; again");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                        }
                        Err(e) => panic!("create a RelayVolume copy: {e}"),
                    }
                }
            }
        })
        .await;
    eprintln!("{n} RelayVolume copies made in {:.1?}", made_at.elapsed());
    let second = start(&env, "second").await;
    // The standby has read the Lease (it watches it) before the stop.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stopped = Instant::now();
    first.stop_gracefully().await;
    let channel = tokio::time::timeout(Duration::from_secs(600), second.serving())
        .await
        .expect("the standby serves within 10 minutes");
    let mut c2 = ControllerClient::new(channel);
    let got = c2
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: made.volume_id.clone(),
        })
        .await;
    let served = stopped.elapsed();
    assert!(
        got.is_ok(),
        "the new leader does not know the volume: {got:?}"
    );
    let log = std::fs::read_to_string(second.path("driver.log")).unwrap_or_default();
    let restored = log
        .lines()
        .find(|l| l.contains("volume records rebuilt from RelayVolumes"))
        .and_then(|l| l.split("restored=").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or("?")
        .to_string();
    eprintln!(
        "FIGURE leader-election-to-first-call volumes={} restored={restored} stop_to_first_served_call={:.2}s",
        n + 1,
        served.as_secs_f64()
    );
    // The copies have no member claim: gone before the volume itself.
    let dp = DeleteParams::default();
    let _ = api
        .delete_collection(
            &dp,
            &ListParams::default().labels(&format!("{COPY_LABEL}={label}")),
        )
        .await;
    e2e_support::delete_until_ok(&c2, &made.volume_id).await;
    e2e_support::eventually("the copies gone", Duration::from_secs(120), || {
        let api = api.clone();
        let label = label.clone();
        async move {
            let left = api
                .list(&ListParams::default().labels(&format!("{COPY_LABEL}={label}")))
                .await
                .map(|l| l.items.len())
                .unwrap_or(1);
            (left == 0).then_some(())
        }
    })
    .await;
}
