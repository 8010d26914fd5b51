//! Upgrades guarded: a state directory written by a released build is read,
//! served and torn down by this one.
//!
//! `tests/fixtures/state-3dbdfe7/` is the state directory (store and log)
//! that the build of 2026-11-25, 3dbdfe7, left after these calls, then a
//! SIGKILL (so its log still holds records the store has not applied):
//! - `fx-dir`: 4 MiB, mount access (a directory), staged and published, a
//!   file `hello` written, unpublished and unstaged;
//! - `fx-blk`: 16 MiB (the smallest block file), block access, grown to
//!   17 MiB, `block-data` written at
//!   its start through a published block device;
//! - `fx-snap`: a snapshot of `fx-dir`.
//!
//! `generate` (ignored) makes it again: `RELAY_TEST_BINARY=<3dbdfe7's
//! csi-relay> RELAY_FIXTURE_OUT=<dir> cargo test --test suite
//! upgrade_fixtures::generate -- --ignored`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use csi_relay::csi::{self, volume_capability::access_mode::Mode};

use crate::common::{self, req, Driver, NODE};
use crate::node_support::{self, s, Vol, MIB};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/state-3dbdfe7")
}

fn vol(id: &str, cap: csi::VolumeCapability, staging: PathBuf) -> Vol {
    Vol {
        id: id.into(),
        cap,
        staging,
        context: HashMap::new(),
        publish_context: HashMap::new(),
    }
}

/// Stages and publishes `v` at `target` (a directory, or a file for block).
async fn use_volume(d: &Driver, v: &mut Vol, target: &Path, block: bool) {
    node_support::controller_publish(d, v, false).await;
    node_support::stage(d, v).await;
    if block {
        std::fs::write(target, b"").expect("block target file");
    } else {
        std::fs::create_dir_all(target).expect("target dir");
    }
    node_support::try_publish(d, node_support::publish_req(v, target, false))
        .await
        .unwrap_or_else(|e| panic!("NodePublishVolume {}: {e:?}", v.id));
}

async fn stop_using(d: &Driver, v: &Vol, target: &Path) {
    d.node()
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: v.id.clone(),
            target_path: s(target),
        })
        .await
        .unwrap_or_else(|e| panic!("NodeUnpublishVolume {}: {e:?}", v.id));
    node_support::unstage(d, v).await;
    node_support::controller_unpublish(d, v).await;
}

#[tokio::test]
async fn a_state_directory_of_the_released_build_is_read_served_and_torn_down() {
    let _shared = common::shared();
    if let Err(why) = common::can_mount() {
        return common::skip(&why);
    }
    let d = Driver::start_from_state(&fixture(), &[]).await;
    let listed = d.volumes().await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    let by_size = |bytes: i64| {
        listed
            .iter()
            .find(|v| v.capacity_bytes == bytes)
            .unwrap_or_else(|| panic!("no volume of {bytes} bytes in {listed:?}"))
            .volume_id
            .clone()
    };
    let (dir_id, blk_id) = (by_size(4 * MIB), by_size(17 * MIB));
    let snapshots = d
        .controller()
        .list_snapshots(csi::ListSnapshotsRequest::default())
        .await
        .expect("ListSnapshots")
        .into_inner()
        .entries;
    assert_eq!(snapshots.len(), 1, "{snapshots:?}");
    let snap = snapshots[0].snapshot.clone().expect("snapshot");
    assert_eq!(snap.source_volume_id, dir_id);
    assert!(snap.ready_to_use);

    // Served: the data the old build wrote, through this build's mounts.
    let mut dir = vol(&dir_id, req::snw(), d.path("staging-dir"));
    let dir_target = d.path("pod-dir");
    use_volume(&d, &mut dir, &dir_target, false).await;
    assert_eq!(
        std::fs::read_to_string(dir_target.join("hello")).expect("hello"),
        "written by 3dbdfe7"
    );
    let mut blk = vol(
        &blk_id,
        req::block_cap(Mode::SingleNodeWriter),
        d.path("staging-blk"),
    );
    let blk_target = d.path("pod-blk");
    use_volume(&d, &mut blk, &blk_target, true).await;
    let device = std::fs::read(&blk_target).expect("read the block device");
    assert_eq!(device.len() as i64, 17 * MIB, "the grown size");
    assert!(device.starts_with(b"block-data"));
    let restored = d
        .controller()
        .create_volume(csi::CreateVolumeRequest {
            volume_content_source: Some(csi::VolumeContentSource {
                r#type: Some(csi::volume_content_source::Type::Snapshot(
                    csi::volume_content_source::SnapshotSource {
                        snapshot_id: snap.snapshot_id.clone(),
                    },
                )),
            }),
            ..req::create("fx-restored", 4 * MIB, req::snw())
        })
        .await
        .expect("a volume from the old build's snapshot")
        .into_inner()
        .volume
        .expect("volume");
    let mut from_snap = vol(&restored.volume_id, req::snw(), d.path("staging-restored"));
    let snap_target = d.path("pod-restored");
    use_volume(&d, &mut from_snap, &snap_target, false).await;
    assert_eq!(
        std::fs::read_to_string(snap_target.join("hello")).expect("hello in the restored volume"),
        "written by 3dbdfe7"
    );

    // Torn down: nothing of it left, in the driver or on the machine.
    stop_using(&d, &dir, &dir_target).await;
    stop_using(&d, &blk, &blk_target).await;
    stop_using(&d, &from_snap, &snap_target).await;
    d.controller()
        .delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .expect("DeleteSnapshot");
    for id in [&dir_id, &blk_id, &restored.volume_id] {
        node_support::delete_volume(&d, id).await;
    }
    assert!(d.volumes().await.is_empty());
    let left = node_support::leftovers(d.dir.path());
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Makes `tests/fixtures/state-3dbdfe7` again with the build named by
/// RELAY_TEST_BINARY (see the module doc).
#[tokio::test]
#[ignore]
async fn generate() {
    let out = PathBuf::from(std::env::var("RELAY_FIXTURE_OUT").expect("RELAY_FIXTURE_OUT"));
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let socket = dir.path().join("csi.sock");
    let binary = std::env::var("RELAY_TEST_BINARY").expect("RELAY_TEST_BINARY: the released build");
    let mut child = std::process::Command::new(binary)
        .args(["serve", "--node-id", NODE, "--endpoint"])
        .arg(format!("unix://{}", socket.display()))
        .arg("--state-dir")
        .arg(&state)
        .spawn()
        .expect("start the released build");
    let channel = common::connect(&socket).await;
    let d = Driver::attach(dir, state.clone(), socket, channel);
    let create = |name: &str, bytes: i64, cap: csi::VolumeCapability| {
        let d = &d;
        let name = name.to_string();
        async move { node_support::create_volume(d, &name, bytes, cap).await }
    };
    let mut dir_vol = create("fx-dir", 4 * MIB, req::snw()).await;
    let dir_target = d.path("pod-dir");
    use_volume(&d, &mut dir_vol, &dir_target, false).await;
    std::fs::write(dir_target.join("hello"), "written by 3dbdfe7").expect("write hello");
    stop_using(&d, &dir_vol, &dir_target).await;
    let mut blk = create("fx-blk", 16 * MIB, req::block_cap(Mode::SingleNodeWriter)).await;
    d.controller()
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: blk.id.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 17 * MIB,
                limit_bytes: 0,
            }),
            volume_capability: Some(blk.cap.clone()),
            ..Default::default()
        })
        .await
        .expect("ControllerExpandVolume");
    let blk_target = d.path("pod-blk");
    use_volume(&d, &mut blk, &blk_target, true).await;
    {
        use std::io::Write;
        let mut dev = std::fs::OpenOptions::new()
            .write(true)
            .open(&blk_target)
            .expect("open the block device");
        dev.write_all(b"block-data").expect("write");
        dev.sync_all().expect("sync");
    }
    stop_using(&d, &blk, &blk_target).await;
    d.controller()
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: dir_vol.id.clone(),
            name: "fx-snap".into(),
            ..Default::default()
        })
        .await
        .expect("CreateSnapshot");
    // SIGKILL: the log keeps what the store has not applied yet.
    let _ = child.kill();
    let _ = child.wait();
    assert!(node_support::leftovers(d.dir.path()).is_empty());
    let status = std::process::Command::new("cp")
        .arg("-a")
        .arg(&state)
        .arg(&out)
        .status()
        .expect("cp");
    assert!(status.success());
    eprintln!("fixture written to {}", out.display());
}

/// Makes `tests/fixtures/relayvolumes-3dbdfe7.json` again: the RelayVolume
/// objects the build named by RELAY_TEST_BINARY writes in the e2e
/// environment's host for two member volumes, one published to a host
/// node mapped to the member node (read by
/// `k8s::relay_volume_tests`). `RELAY_TEST_BINARY=<3dbdfe7's csi-relay>
/// RELAY_FIXTURE_OUT=<file> cargo test --test suite
/// upgrade_fixtures::generate_relay_volumes -- --ignored`, with RELAY_E2E_*.
#[tokio::test]
#[ignore]
async fn generate_relay_volumes() {
    use csi_relay::k8s::relay_volume::RelayVolume;
    use kube::api::Api;
    let out = PathBuf::from(std::env::var("RELAY_FIXTURE_OUT").expect("RELAY_FIXTURE_OUT"));
    let env = crate::e2e_support::env().expect("RELAY_E2E_*");
    let host = crate::e2e_support::client(&env.host_kubeconfig).await;
    crate::e2e_support::install_crd(&host).await;
    let host_node = "fx-node".to_string();
    crate::e2e_support::fake_host_node(
        &host,
        &host_node,
        serde_json::json!({"topology.relay.csi.dev/member": "east",
                           "topology.relay.csi.dev/member-node": "member-node-1"}),
    )
    .await;
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("csi.sock");
    let binary = std::env::var("RELAY_TEST_BINARY").expect("RELAY_TEST_BINARY: the released build");
    let mut child = std::process::Command::new(binary)
        .args([
            "serve",
            "--mode",
            "controller",
            "--node-id",
            "controller",
            "--backend",
            "member",
        ])
        .arg("--member")
        // Named as the unit tests' mock member is.
        .arg(format!("east={}", env.relay_member_kubeconfig))
        .arg("--host-kubeconfig")
        .arg(&env.host_kubeconfig)
        .arg("--endpoint")
        .arg(format!("unix://{}", socket.display()))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .spawn()
        .expect("start the released build");
    let channel = common::connect(&socket).await;
    let mut c = csi::controller_client::ControllerClient::new(channel);
    let mut ids = Vec::new();
    for (name, bytes) in [("fx-rv-plain", 16 * MIB), ("fx-rv-published", 32 * MIB)] {
        let vol = crate::e2e_support::until_ok("CreateVolume", || {
            let mut c = c.clone();
            let mut req = crate::e2e_support::member_create(&env, name, bytes);
            req.parameters.insert("member".into(), "east".into());
            req.parameters.extend([
                ("csi.storage.k8s.io/pvc/name".to_string(), name.to_string()),
                (
                    "csi.storage.k8s.io/pvc/namespace".to_string(),
                    env.namespace.clone(),
                ),
            ]);
            async move { c.create_volume(req).await }
        })
        .await
        .into_inner()
        .volume
        .expect("a volume");
        ids.push(vol.volume_id);
    }
    crate::e2e_support::until_ok("ControllerPublishVolume", || {
        let mut c = c.clone();
        let (id, node) = (ids[1].clone(), host_node.clone());
        async move {
            c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
                volume_id: id,
                node_id: node,
                volume_capability: Some(req::snw()),
                ..Default::default()
            })
            .await
        }
    })
    .await;
    let rvs: Api<RelayVolume> = Api::all(host.clone());
    let mut objects = Vec::new();
    for id in &ids {
        let name = csi_relay::k8s::relay_volume::object_name(id);
        let rv = crate::e2e_support::eventually(
            "the RelayVolume",
            std::time::Duration::from_secs(30),
            || {
                let (rvs, name) = (rvs.clone(), name.clone());
                async move { rvs.get(&name).await.ok() }
            },
        )
        .await;
        let mut value = serde_json::to_value(&rv).expect("json");
        if let Some(meta) = value["metadata"].as_object_mut() {
            for volatile in [
                "managedFields",
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "generation",
            ] {
                meta.remove(volatile);
            }
        }
        // What the build wrote: this host's CRD (this build's) fills in
        // the default of a field it did not know.
        if let Some(spec) = value["spec"].as_object_mut() {
            spec.remove("formatVersion");
        }
        objects.push(value);
    }
    std::fs::write(
        &out,
        serde_json::to_string_pretty(&objects).expect("json") + "\n",
    )
    .expect("write");
    // Unwound with the released build, as it made them.
    let _ = c
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: ids[1].clone(),
            node_id: host_node.clone(),
            ..Default::default()
        })
        .await;
    for id in &ids {
        crate::e2e_support::delete_until_ok(&c, id).await;
    }
    let _ = child.kill();
    let _ = child.wait();
    let _ = Api::<k8s_openapi::api::core::v1::Node>::all(host.clone())
        .delete(&host_node, &Default::default())
        .await;
    eprintln!("fixture written to {}", out.display());
}
