//! The call sequences the official csi-sanity suite makes, including its
//! clean-up habits (repeated unpublish/delete of things already gone, node
//! calls for volumes never staged), replayed against the real driver.

use crate::common;

use common::req::{create, snw};
use common::{Driver, NODE};
use csi_relay::csi;
use tonic::Code;

fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(s) => s.code(),
    }
}

/// Sanity's Resources.Cleanup for one volume entry; node errors other than
/// NOT_FOUND and every controller error fail the suite.
async fn cleanup(d: &Driver, vol: &str, node: Option<&str>, target: &str, staging: &str) {
    let r = d
        .node()
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: vol.into(),
            target_path: target.into(),
        })
        .await;
    if let Err(s) = r {
        assert_eq!(s.code(), Code::NotFound, "NodeUnpublish in cleanup: {s:?}");
    }
    let r = d
        .node()
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: vol.into(),
            staging_target_path: staging.into(),
        })
        .await;
    if let Err(s) = r {
        assert_eq!(s.code(), Code::NotFound, "NodeUnstage in cleanup: {s:?}");
    }
    if let Some(node) = node {
        d.controller()
            .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                volume_id: vol.into(),
                node_id: node.into(),
                ..Default::default()
            })
            .await
            .expect("ControllerUnpublish in cleanup");
    }
    d.controller()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: vol.into(),
            ..Default::default()
        })
        .await
        .expect("DeleteVolume in cleanup");
}

#[tokio::test]
async fn controller_cleanup_tolerates_repeats_on_deleted_volumes() {
    let d = Driver::start(&[]).await;
    let staging = d.path("staging");
    std::fs::create_dir(&staging).unwrap();
    let target = d.path("mount").join("target");
    let (staging, target) = (staging.to_str().unwrap(), target.to_str().unwrap());
    let info = d
        .node()
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut req = create("sanity-controller-publish-10", 0, snw());
    req.capacity_range = None;
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![info.accessible_topology.clone().unwrap()],
        preferred: vec![],
    });
    let vol = d
        .controller()
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    for _ in 0..10 {
        d.controller()
            .controller_publish_volume(csi::ControllerPublishVolumeRequest {
                volume_id: vol.volume_id.clone(),
                node_id: info.node_id.clone(),
                volume_capability: Some(snw()),
                volume_context: vol.volume_context.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    // LIFO: ten publish entries, then the create entry.
    for _ in 0..10 {
        cleanup(&d, &vol.volume_id, Some(&info.node_id), target, staging).await;
    }
    cleanup(&d, &vol.volume_id, None, target, staging).await;
}

#[tokio::test]
async fn node_calls_for_unstaged_and_deleted_volumes() {
    let d = Driver::start(&[]).await;
    let vol = d
        .controller()
        .create_volume(create("never-staged", 1 << 20, snw()))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let t = d.path("mount").join("target");
    d.node()
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            target_path: t.to_string_lossy().into(),
        })
        .await
        .expect("unpublish of a never-published volume is OK");
    d.node()
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: vol.volume_id.clone(),
            staging_target_path: d.path("staging").to_string_lossy().into(),
        })
        .await
        .expect("unstage of a never-staged volume is OK");
    d.controller()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: vol.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        code(
            d.node()
                .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                    volume_id: vol.volume_id.clone(),
                    target_path: t.to_string_lossy().into(),
                })
                .await
        ),
        Code::NotFound
    );
}

#[tokio::test]
async fn argument_checks_come_before_lookups() {
    let d = Driver::start(&[]).await;
    let fake = "fake-vol-id-2f293426-7".to_string();
    let mut n = d.node();
    let mut c = d.controller();
    let staging = d.path("staging").to_string_lossy().into_owned();
    let publish_ctx: std::collections::HashMap<String, String> =
        [("device".to_string(), "/dev/mock".to_string())].into();
    assert_eq!(
        code(
            n.node_stage_volume(csi::NodeStageVolumeRequest {
                staging_target_path: staging.clone(),
                volume_capability: Some(snw()),
                publish_context: publish_ctx.clone(),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            n.node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: fake.clone(),
                volume_capability: Some(snw()),
                publish_context: publish_ctx.clone(),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    let real = c
        .create_volume(create("nocaps", 1 << 20, snw()))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(
        code(
            n.node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: real.volume_id.clone(),
                staging_target_path: staging.clone(),
                publish_context: publish_ctx,
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            n.node_publish_volume(csi::NodePublishVolumeRequest::default())
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            n.node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: fake.clone(),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            n.node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: fake.clone(),
                target_path: d.path("t").to_string_lossy().into(),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            n.node_unpublish_volume(csi::NodeUnpublishVolumeRequest::default())
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            n.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
                volume_id: fake.clone(),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            n.node_unstage_volume(csi::NodeUnstageVolumeRequest {
                staging_target_path: staging.clone(),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            n.node_unstage_volume(csi::NodeUnstageVolumeRequest {
                volume_id: fake.clone(),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            n.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_path: "some/path".into(),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            n.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: fake.clone(),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            n.node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                volume_id: fake.clone(),
                volume_path: "some/path".into(),
                ..Default::default()
            })
            .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            n.node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_path: d.path("").to_string_lossy().into(),
                volume_capability: Some(snw()),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            n.node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: real.volume_id.clone(),
                volume_capability: Some(snw()),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            n.node_expand_volume(csi::NodeExpandVolumeRequest {
                volume_id: fake.clone(),
                volume_path: "some/path".into(),
                ..Default::default()
            })
            .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
                volume_id: fake.clone(),
                node_id: "fake-node-id-1".into(),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.create_snapshot(csi::CreateSnapshotRequest {
                source_volume_id: "testId".into(),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.controller_modify_volume(csi::ControllerModifyVolumeRequest {
                volume_id: "non-existing-volume-id".into(),
                ..Default::default()
            })
            .await
        ),
        Code::NotFound,
        "no mutable parameters still looks the volume up"
    );
}

#[tokio::test]
async fn node_full_flow_as_sanity_runs_it() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let staging_dir = d.path("csi-staging");
    let mount_dir = d.path("csi-mount");
    std::fs::create_dir(&staging_dir).unwrap();
    std::fs::create_dir(&mount_dir).unwrap();
    let staging = staging_dir.to_string_lossy().into_owned();
    let target = mount_dir.join("target").to_string_lossy().into_owned();

    let info = d
        .node()
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.node_id, NODE);
    let mut req = create("sanity-node-full-1", 64 << 20, snw());
    req.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![info.accessible_topology.clone().unwrap()],
        preferred: vec![],
    });
    let vol = d
        .controller()
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let published = d
        .controller()
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            node_id: info.node_id.clone(),
            volume_capability: Some(snw()),
            volume_context: vol.volume_context.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    for _ in 0..10 {
        d.node()
            .node_stage_volume(csi::NodeStageVolumeRequest {
                volume_id: vol.volume_id.clone(),
                publish_context: published.publish_context.clone(),
                staging_target_path: staging.clone(),
                volume_capability: Some(snw()),
                volume_context: vol.volume_context.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    for _ in 0..10 {
        d.node()
            .node_publish_volume(csi::NodePublishVolumeRequest {
                volume_id: vol.volume_id.clone(),
                publish_context: published.publish_context.clone(),
                staging_target_path: staging.clone(),
                target_path: target.clone(),
                volume_capability: Some(snw()),
                volume_context: vol.volume_context.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
    }
    assert!(
        std::path::Path::new(&target).is_dir(),
        "the driver creates the target"
    );
    let stats = d
        .node()
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: vol.volume_id.clone(),
            volume_path: target.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!stats.usage.is_empty());
    assert_eq!(
        code(
            d.node()
                .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
                    volume_id: vol.volume_id.clone(),
                    volume_path: "some/path".into(),
                    ..Default::default()
                })
                .await
        ),
        Code::NotFound
    );
    d.node()
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: vol.volume_id.clone(),
            volume_path: target.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 128 << 20,
                limit_bytes: 0,
            }),
            ..Default::default()
        })
        .await
        .expect("node expand with only the target path");
    cleanup(&d, &vol.volume_id, Some(&info.node_id), &target, &staging).await;
    assert!(
        !std::path::Path::new(&target).exists(),
        "the driver removes the target"
    );
    // Sanity's teardown: non-recursive removal of the dirs it created.
    std::fs::remove_dir(&staging_dir).expect("staging dir left empty");
    std::fs::remove_dir(&mount_dir).expect("mount dir left empty");
    cleanup(&d, &vol.volume_id, None, &target, &staging).await;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(d.dir.path().to_str().unwrap()),
        "nothing left mounted"
    );
}
