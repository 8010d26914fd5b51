//! SIGKILL at random points of a concurrent full-lifecycle load, many
//! times. After each restart: every volume the CO was told exists exists,
//! every publication the CO was told about is mounted, and the CO's
//! retries of everything (as kubelet and the sidecars would) succeed; at
//! the end nothing is mounted, no loop device or data is left.

use crate::{common, node_support};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::req::{create, fs_cap, snw};
use common::{Driver, NODE};
use csi_relay::csi::{self, volume_capability::access_mode::Mode};
use tonic::transport::Channel;

use node_support::*;

/// What the CO was told about one volume.
#[derive(Debug, Default, Clone)]
struct Known {
    id: Option<String>,
    cap: Option<csi::VolumeCapability>,
    published: bool,
    staging: PathBuf,
    target: PathBuf,
}

async fn lifecycle(
    channel: Channel,
    name: String,
    root: PathBuf,
    cap: csi::VolumeCapability,
    k: &mut Known,
) -> bool {
    use csi_relay::csi::{controller_client::ControllerClient, node_client::NodeClient};
    let mut c = ControllerClient::new(channel.clone());
    let mut n = NodeClient::new(channel);
    k.cap = Some(cap.clone());
    k.staging = root.join(&name).join("staging");
    k.target = root.join(&name).join("target");
    if std::fs::create_dir_all(&k.staging).is_err() {
        return false;
    }
    let Ok(v) = c.create_volume(create(&name, 16 * MIB, cap.clone())).await else {
        return false;
    };
    let id = v
        .into_inner()
        .volume
        .map(|v| v.volume_id)
        .unwrap_or_default();
    k.id = Some(id.clone());
    let publish = csi::ControllerPublishVolumeRequest {
        volume_id: id.clone(),
        node_id: NODE.into(),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    let Ok(ctx) = c.controller_publish_volume(publish).await else {
        return false;
    };
    let ctx = ctx.into_inner().publish_context;
    let stage = csi::NodeStageVolumeRequest {
        volume_id: id.clone(),
        publish_context: ctx.clone(),
        staging_target_path: s(&k.staging),
        volume_capability: Some(cap.clone()),
        ..Default::default()
    };
    if n.node_stage_volume(stage).await.is_err() {
        return false;
    }
    let publish = csi::NodePublishVolumeRequest {
        volume_id: id.clone(),
        publish_context: ctx,
        staging_target_path: s(&k.staging),
        target_path: s(&k.target),
        volume_capability: Some(cap),
        ..Default::default()
    };
    if n.node_publish_volume(publish).await.is_err() {
        return false;
    }
    k.published = true;
    true
}

/// The CO's retries after a restart: the create (idempotent by name), then
/// the whole way back down. Every call must succeed.
async fn unwind(d: &Driver, name: &str, k: &Known) {
    let cap = k.cap.clone().unwrap_or_else(snw);
    let id = d
        .controller()
        .create_volume(create(name, 16 * MIB, cap))
        .await
        .unwrap_or_else(|e| panic!("retried CreateVolume {name}: {e:?}"))
        .into_inner()
        .volume
        .unwrap()
        .volume_id;
    if let Some(known) = &k.id {
        assert_eq!(&id, known, "{name}: a retry finds the same volume");
    }
    try_unpublish(d, &id, &k.target)
        .await
        .unwrap_or_else(|e| panic!("NodeUnpublishVolume {name}: {e:?}"));
    try_unstage(d, &id, &k.staging)
        .await
        .unwrap_or_else(|e| panic!("NodeUnstageVolume {name}: {e:?}"));
    d.controller()
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: id.clone(),
            node_id: NODE.into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("ControllerUnpublishVolume {name}: {e:?}"));
    d.controller()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: id,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("DeleteVolume {name}: {e:?}"));
    let _ = std::fs::remove_dir(&k.staging);
    let _ = std::fs::remove_dir(k.target.parent().unwrap_or(&k.target));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_a_concurrent_lifecycle_load_loses_and_leaks_nothing() {
    require_mounts!();
    const ROUNDS: u64 = 15;
    const CLIENTS: usize = 4;
    let mut d = Driver::start(&["--stale-provisioning-after", "3600"]).await;
    let _scrub = Scrub::new(&d);
    let root = d.path("pods");
    for round in 0..ROUNDS {
        let stop = Instant::now() + Duration::from_millis(30 + (round * 53) % 170);
        let mut clients = Vec::new();
        for c in 0..CLIENTS {
            let channel = d.channel.clone();
            let root = root.clone();
            clients.push(tokio::spawn(async move {
                let mut known: BTreeMap<String, Known> = BTreeMap::new();
                let mut i = 0;
                while Instant::now() < stop {
                    let name = format!("r{round}-c{c}-{i}");
                    i += 1;
                    // One in four is an ext4 volume on a loop device.
                    let cap = if i % 4 == 0 {
                        fs_cap(Mode::SingleNodeWriter, "ext4", &[])
                    } else {
                        snw()
                    };
                    let k = known.entry(name.clone()).or_default();
                    if !lifecycle(channel.clone(), name, root.clone(), cap, k).await {
                        break;
                    }
                }
                known
            }));
        }
        tokio::time::sleep(stop.saturating_duration_since(Instant::now())).await;
        d.crash();
        let mut known = BTreeMap::new();
        for c in clients {
            known.extend(c.await.unwrap());
        }
        d.start_again().await;
        for (name, k) in &known {
            if let Some(id) = &k.id {
                d.controller()
                    .controller_get_volume(csi::ControllerGetVolumeRequest {
                        volume_id: id.clone(),
                    })
                    .await
                    .unwrap_or_else(|e| {
                        panic!("round {round}: volume {name} ({id}) the CO was told exists: {e:?}")
                    });
            }
            if k.published {
                assert!(
                    is_mounted(&k.target),
                    "round {round}: {name} was published at {} and must still be",
                    k.target.display()
                );
            }
        }
        for (name, k) in &known {
            unwind(&d, name, k).await;
        }
    }
    // Everything was unwound: nothing mounted, no loop device, no data.
    let leftover_mounts: Vec<_> = mounts()
        .into_iter()
        .filter(|m| m.mount_point.starts_with(d.dir.path()))
        .collect();
    assert!(leftover_mounts.is_empty(), "{leftover_mounts:?}");
    assert!(loops_of(&d).is_empty(), "{:?}", loops_of(&d));
    let volumes = d.state_dir.join("volumes");
    wait_for("the data directory to be empty", || {
        std::fs::read_dir(&volumes).map_or(true, |mut rd| rd.next().is_none())
    })
    .await;
    assert_clean(&d);
}
