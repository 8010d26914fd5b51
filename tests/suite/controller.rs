//! Identity, Controller and GroupController services against a real server.

use crate::common;

use common::req::{self, block_cap, create, fs_cap, mount_cap, snw};
use common::{Driver, NODE};
use csi_relay::csi::{self, volume_capability::access_mode::Mode};
use tonic::Code;

const MIB: i64 = 1 << 20;

async fn make(d: &Driver, name: &str) -> csi::Volume {
    d.controller()
        .create_volume(create(name, 8 * MIB, snw()))
        .await
        .expect("create volume")
        .into_inner()
        .volume
        .expect("volume in reply")
}

fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(s) => s.code(),
    }
}

fn publish_req(vol: &str, node: &str, readonly: bool) -> csi::ControllerPublishVolumeRequest {
    csi::ControllerPublishVolumeRequest {
        volume_id: vol.into(),
        node_id: node.into(),
        volume_capability: Some(snw()),
        readonly,
        ..Default::default()
    }
}

#[tokio::test]
async fn identity_reports_name_capabilities_and_readiness() {
    let d = Driver::start(&[]).await;
    let mut id = d.identity();
    let info = id
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "relay.csi.dev");
    assert_eq!(info.vendor_version, env!("CARGO_PKG_VERSION"));
    let caps = id
        .get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    let services: Vec<i32> = caps
        .capabilities
        .iter()
        .filter_map(|c| match &c.r#type {
            Some(csi::plugin_capability::Type::Service(s)) => Some(s.r#type),
            _ => None,
        })
        .collect();
    use csi::plugin_capability::service::Type;
    for t in [
        Type::ControllerService,
        Type::VolumeAccessibilityConstraints,
        Type::GroupControllerService,
    ] {
        assert!(
            services.contains(&(t as i32)),
            "{t:?} missing from {services:?}"
        );
    }
    let probe = id.probe(csi::ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
}

#[tokio::test]
async fn custom_driver_name_and_invalid_one_is_refused() {
    let d = Driver::start(&["--driver-name", "other.example.com"]).await;
    let info = d
        .identity()
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.name, "other.example.com");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_csi-relay"))
        .args([
            "serve",
            "--node-id",
            "n",
            "--driver-name",
            "bad_name1",
            "--endpoint",
        ])
        .arg(format!("unix://{}", d.path("x.sock").display()))
        .arg("--state-dir")
        .arg(d.path("x"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--driver-name"));
}

#[tokio::test]
async fn controller_advertises_exactly_what_it_implements() {
    let d = Driver::start(&[]).await;
    let caps = d
        .controller()
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    use csi::controller_service_capability::{rpc::Type, Type as C};
    let mut got: Vec<i32> = caps
        .capabilities
        .iter()
        .map(|c| match &c.r#type {
            Some(C::Rpc(r)) => r.r#type,
            None => panic!("capability without type"),
        })
        .collect();
    got.sort();
    let mut want: Vec<i32> = [
        Type::CreateDeleteVolume,
        Type::PublishUnpublishVolume,
        Type::ListVolumes,
        Type::GetCapacity,
        Type::CreateDeleteSnapshot,
        Type::ListSnapshots,
        Type::CloneVolume,
        Type::PublishReadonly,
        Type::ExpandVolume,
        Type::ListVolumesPublishedNodes,
        Type::VolumeCondition,
        Type::GetVolume,
        Type::SingleNodeMultiWriter,
        Type::ModifyVolume,
        Type::GetSnapshot,
    ]
    .iter()
    .map(|t| *t as i32)
    .collect();
    want.sort();
    assert_eq!(got, want);
    // For validators that know only v1.10, what v1.12 added is not advertised.
    let old = Driver::start(&["--csi-spec", "1.10"]).await;
    let caps = old
        .controller()
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(caps.capabilities.len(), want.len() - 1);
    assert!(!caps.capabilities.iter().any(|c| matches!(
        &c.r#type,
        Some(C::Rpc(r)) if r.r#type == Type::GetSnapshot as i32
    )));
    let g = d
        .group()
        .group_controller_get_capabilities(csi::GroupControllerGetCapabilitiesRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(g.capabilities.len(), 1);
}

#[tokio::test]
async fn create_volume_is_idempotent_by_name_and_refuses_conflicts() {
    let d = Driver::start(&[]).await;
    let mut c = d.controller();
    let first = make(&d, "pvc-1").await;
    assert!(first.capacity_bytes >= 8 * MIB);
    assert_eq!(
        first.accessible_topology[0]
            .segments
            .get("topology.relay.csi.dev/node")
            .map(String::as_str),
        Some(NODE)
    );
    assert!(
        d.state_dir.join("volumes").join(&first.volume_id).is_dir(),
        "a directory volume is allocated"
    );
    let again = make(&d, "pvc-1").await;
    assert_eq!(again.volume_id, first.volume_id);

    let mut bigger = create("pvc-1", 16 * MIB, snw());
    bigger.capacity_range = Some(csi::CapacityRange {
        required_bytes: 16 * MIB,
        limit_bytes: 16 * MIB,
    });
    let err = c.create_volume(bigger).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert!(err.message().contains("pvc-1"), "{}", err.message());
    assert_eq!(
        code(
            c.create_volume(create("pvc-1", 8 * MIB, block_cap(Mode::SingleNodeWriter)))
                .await
        ),
        Code::AlreadyExists
    );

    let list = c
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        list.entries.len(),
        1,
        "conflicting requests created nothing"
    );
}

#[tokio::test]
async fn create_volume_checks_every_field() {
    let d = Driver::start(&[
        "--max-volume-size",
        "1073741824",
        "--capacity",
        "2147483648",
    ])
    .await;
    let mut c = d.controller();
    let e = c.create_volume(create("", MIB, snw())).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("name"), "{}", e.message());
    let mut nocaps = create("x", MIB, snw());
    nocaps.volume_capabilities.clear();
    let e = c.create_volume(nocaps).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(
        e.message().contains("volume_capabilities"),
        "{}",
        e.message()
    );
    let mut nomode = create("x", MIB, snw());
    nomode.volume_capabilities[0].access_mode = None;
    assert_eq!(code(c.create_volume(nomode).await), Code::InvalidArgument);
    assert!(
        c.create_volume(create(&"n".repeat(128), MIB, snw()))
            .await
            .is_ok(),
        "128-byte names are valid"
    );
    assert_eq!(
        code(c.create_volume(create(&"n".repeat(129), MIB, snw())).await),
        Code::InvalidArgument
    );
    let mut bad_range = create("x", 10 * MIB, snw());
    bad_range.capacity_range = Some(csi::CapacityRange {
        required_bytes: 10 * MIB,
        limit_bytes: MIB,
    });
    assert_eq!(
        code(c.create_volume(bad_range).await),
        Code::InvalidArgument
    );
    let e = c
        .create_volume(create("huge", 2 << 30, snw()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::OutOfRange);
    assert!(e.message().contains("maximum"), "{}", e.message());
    let mut params = create("p", MIB, snw());
    params.parameters = [("bogus".to_string(), "1".to_string())].into();
    let e = c.create_volume(params).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("bogus"), "{}", e.message());
    let mut flags = create("f", MIB, fs_cap(Mode::SingleNodeWriter, "", &["ro,exec"]));
    flags.parameters.clear();
    assert_eq!(code(c.create_volume(flags).await), Code::InvalidArgument);
    let mut huge_params = create("hp", MIB, snw());
    huge_params.parameters = [("backing".to_string(), "x".repeat(5000))].into();
    assert_eq!(
        code(c.create_volume(huge_params).await),
        Code::InvalidArgument
    );
    let mut topo = create("t", MIB, snw());
    topo.accessibility_requirements = Some(csi::TopologyRequirement {
        requisite: vec![csi::Topology {
            segments: [(
                "topology.relay.csi.dev/node".to_string(),
                "elsewhere".to_string(),
            )]
            .into(),
        }],
        preferred: vec![],
    });
    assert_eq!(code(c.create_volume(topo).await), Code::ResourceExhausted);
    // Capacity: 2 GiB total, 1 GiB max each; the third 1 GiB volume does not fit.
    c.create_volume(create("g1", 1 << 30, snw())).await.unwrap();
    let e = c
        .create_volume(create("g2", 1 << 30, snw()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
}

// Without --capacity the local backend offers what its filesystem has
// free, not the filesystem's size (which counts what others hold).
#[tokio::test]
async fn default_capacity_is_what_the_filesystem_has_free() {
    let d = Driver::start(&[]).await;
    let st = nix::sys::statvfs::statvfs(&d.state_dir).unwrap();
    let free = st.blocks_available() as i64 * st.fragment_size() as i64;
    let size = st.blocks() as i64 * st.fragment_size() as i64;
    let available = available(&d).await;
    // Tests beside this one write and delete: a margin of 1 GiB.
    let margin = 1 << 30;
    assert!(
        available <= free + margin && available >= free - margin,
        "available {available}, free {free}, filesystem size {size}"
    );
}

#[tokio::test]
async fn block_backed_volumes_are_sparse_files() {
    let d = Driver::start(&[]).await;
    let mut c = d.controller();
    let v = c
        .create_volume(create("blk", 64 * MIB, block_cap(Mode::SingleNodeWriter)))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let img = d
        .state_dir
        .join("volumes")
        .join(format!("{}.img", v.volume_id));
    let meta = std::fs::metadata(&img).unwrap();
    assert_eq!(meta.len(), 64 << 20);
    use std::os::unix::fs::MetadataExt;
    assert!(meta.blocks() * 512 < meta.len(), "the file is sparse");
    let mut forced = create("forced", 32 * MIB, snw());
    forced.parameters = [("backing".to_string(), "block".to_string())].into();
    let v = c
        .create_volume(forced)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(d
        .state_dir
        .join("volumes")
        .join(format!("{}.img", v.volume_id))
        .is_file());
    let mut dir_block = create("db", MIB, block_cap(Mode::SingleNodeWriter));
    dir_block.parameters = [("backing".to_string(), "directory".to_string())].into();
    assert_eq!(
        code(c.create_volume(dir_block).await),
        Code::InvalidArgument
    );
}

/// GetCapacity's answer for no particular capabilities or topology.
async fn available(d: &Driver) -> i64 {
    d.controller()
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .expect("GetCapacity")
        .into_inner()
        .available_capacity
}

#[tokio::test]
async fn delete_volume_is_idempotent_and_frees_storage() {
    // A set capacity: the default follows the filesystem's free space,
    // which the tests running beside this one change.
    let d = Driver::start(&["--capacity", &(4u64 << 30).to_string()]).await;
    let mut c = d.controller();
    let v = make(&d, "gone").await;
    let path = d.state_dir.join("volumes").join(&v.volume_id);
    assert!(path.exists());
    let before = available(&d).await;
    for _ in 0..2 {
        c.delete_volume(csi::DeleteVolumeRequest {
            volume_id: v.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    assert!(!path.exists());
    let after = available(&d).await;
    assert_eq!(after - before, v.capacity_bytes, "capacity is given back");
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: "never-existed".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(
        code(c.delete_volume(csi::DeleteVolumeRequest::default()).await),
        Code::InvalidArgument
    );
    // The name is free again and yields a new volume.
    assert_ne!(make(&d, "gone").await.volume_id, v.volume_id);
}

#[tokio::test]
async fn controller_publish_tracks_nodes_and_enforces_rules() {
    let d = Driver::start(&["--peer-node", "node-b", "--max-volumes-per-node", "2"]).await;
    let mut c = d.controller();
    let v = make(&d, "att").await;
    let id = v.volume_id.clone();
    c.controller_publish_volume(publish_req(&id, NODE, false))
        .await
        .unwrap();
    c.controller_publish_volume(publish_req(&id, NODE, false))
        .await
        .expect("repeat is idempotent");
    assert_eq!(
        code(
            c.controller_publish_volume(publish_req(&id, NODE, true))
                .await
        ),
        Code::AlreadyExists
    );
    let e = c
        .controller_publish_volume(publish_req(&id, "node-b", false))
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        Code::FailedPrecondition,
        "single-node volume on a second node: {}",
        e.message()
    );
    assert_eq!(
        code(
            c.controller_publish_volume(publish_req(&id, "nowhere", false))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            c.controller_publish_volume(publish_req("no-such-vol", NODE, false))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            c.controller_publish_volume(publish_req("", NODE, false))
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.controller_publish_volume(publish_req("fake", "", false))
                .await
        ),
        Code::InvalidArgument
    );
    let mut nocap = publish_req("fake", "fake-node", false);
    nocap.volume_capability = None;
    assert_eq!(
        code(c.controller_publish_volume(nocap).await),
        Code::InvalidArgument
    );

    let got = c
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        got.status.unwrap().published_node_ids,
        vec![NODE.to_string()]
    );

    // A multi-node volume may go to both nodes.
    let mut multi = create("multi", MIB, mount_cap(Mode::MultiNodeMultiWriter));
    multi.volume_capabilities = vec![mount_cap(Mode::MultiNodeMultiWriter)];
    let m = c
        .create_volume(multi)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    for node in [NODE, "node-b"] {
        let mut r = publish_req(&m.volume_id, node, false);
        r.volume_capability = Some(mount_cap(Mode::MultiNodeMultiWriter));
        c.controller_publish_volume(r).await.unwrap();
    }
    // Attach limit 2: node-a holds "att" and "multi"; a third is refused.
    let third = make(&d, "third").await;
    let e = c
        .controller_publish_volume(publish_req(&third.volume_id, NODE, false))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());

    // DeleteVolume refuses a published volume.
    assert_eq!(
        code(
            c.delete_volume(csi::DeleteVolumeRequest {
                volume_id: id.clone(),
                ..Default::default()
            })
            .await
        ),
        Code::FailedPrecondition
    );
    for _ in 0..2 {
        c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: id.clone(),
            node_id: NODE.into(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    // Now "third" fits under the limit.
    c.controller_publish_volume(publish_req(&third.volume_id, NODE, false))
        .await
        .unwrap();
    // Unpublish from every node at once (empty node id).
    c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: m.volume_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let got = c
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: m.volume_id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(got.status.unwrap().published_node_ids.is_empty());
    c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: "deleted-long-ago".into(),
        node_id: NODE.into(),
        ..Default::default()
    })
    .await
    .expect("unpublishing an unknown volume is success");
    assert_eq!(
        code(
            c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest::default())
                .await
        ),
        Code::InvalidArgument
    );
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: id,
        ..Default::default()
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn validate_volume_capabilities_confirms_only_what_fits() {
    let d = Driver::start(&[]).await;
    let mut c = d.controller();
    let v = make(&d, "val").await;
    let ok = c
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: v.volume_id.clone(),
            volume_capabilities: vec![snw()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ok.confirmed.unwrap().volume_capabilities.len(), 1);
    let no = c
        .validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
            volume_id: v.volume_id.clone(),
            volume_capabilities: vec![block_cap(Mode::SingleNodeWriter)],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(no.confirmed.is_none());
    assert!(!no.message.is_empty());
    assert_eq!(
        code(
            c.validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
                volume_id: v.volume_id.clone(),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest {
                volume_id: "missing".into(),
                volume_capabilities: vec![snw()],
                ..Default::default()
            })
            .await
        ),
        Code::NotFound
    );
}

#[tokio::test]
async fn list_volumes_pages_with_opaque_tokens() {
    let d = Driver::start(&[]).await;
    let mut c = d.controller();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(make(&d, &format!("page-{i}")).await.volume_id);
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .list_volumes(csi::ListVolumesRequest {
                max_entries: 2,
                starting_token: token.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(page.entries.len() <= 2);
        seen.extend(
            page.entries
                .iter()
                .map(|e| e.volume.as_ref().unwrap().volume_id.clone()),
        );
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    seen.sort();
    ids.sort();
    assert_eq!(seen, ids, "every volume exactly once");
    assert_eq!(
        code(
            c.list_volumes(csi::ListVolumesRequest {
                max_entries: 0,
                starting_token: "invalid-token".into()
            })
            .await
        ),
        Code::Aborted
    );
    assert_eq!(
        code(
            c.list_volumes(csi::ListVolumesRequest {
                max_entries: -1,
                starting_token: String::new()
            })
            .await
        ),
        Code::InvalidArgument
    );
    // A token stays valid when the volume it points after is deleted.
    let first = c
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 1,
            starting_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let gone = first.entries[0].volume.as_ref().unwrap().volume_id.clone();
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: gone.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let rest = c
        .list_volumes(csi::ListVolumesRequest {
            max_entries: 0,
            starting_token: first.next_token,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rest.entries.len(), 4);
    assert!(rest
        .entries
        .iter()
        .all(|e| e.volume.as_ref().unwrap().volume_id != gone));
}

#[tokio::test]
async fn get_capacity_follows_allocations_and_topology() {
    let d = Driver::start(&["--capacity", "1073741824"]).await;
    let mut c = d.controller();
    let cap0 = c
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cap0.available_capacity, 1 << 30);
    make(&d, "cap").await;
    let cap1 = c
        .get_capacity(csi::GetCapacityRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(cap1.available_capacity, (1 << 30) - 8 * MIB);
    let elsewhere = c
        .get_capacity(csi::GetCapacityRequest {
            accessible_topology: Some(csi::Topology {
                segments: [(
                    "topology.relay.csi.dev/node".to_string(),
                    "other".to_string(),
                )]
                .into(),
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(elsewhere.available_capacity, 0);
    // What external-provisioner's capacity tracking sends: a mount
    // capability whose access mode is UNKNOWN, because the spec wants one.
    let mut any_mode = mount_cap(Mode::SingleNodeWriter);
    any_mode.access_mode = Some(csi::volume_capability::AccessMode {
        mode: Mode::Unknown as i32,
    });
    let tracked = c
        .get_capacity(csi::GetCapacityRequest {
            volume_capabilities: vec![any_mode],
            ..Default::default()
        })
        .await
        .expect("GetCapacity as external-provisioner asks it")
        .into_inner();
    assert_eq!(tracked.available_capacity, cap1.available_capacity);
    // Still refused: a capability with no access type.
    let broken = c
        .get_capacity(csi::GetCapacityRequest {
            volume_capabilities: vec![csi::VolumeCapability {
                access_type: None,
                access_mode: Some(csi::volume_capability::AccessMode {
                    mode: Mode::Unknown as i32,
                }),
            }],
            ..Default::default()
        })
        .await;
    assert_eq!(code(broken), Code::InvalidArgument);
}

#[tokio::test]
async fn controller_get_volume_reports_condition() {
    let d = Driver::start(&[]).await;
    let mut c = d.controller();
    let v = make(&d, "cond").await;
    let req = csi::ControllerGetVolumeRequest {
        volume_id: v.volume_id.clone(),
    };
    let got = c
        .controller_get_volume(req.clone())
        .await
        .unwrap()
        .into_inner();
    assert!(!got.status.unwrap().volume_condition.unwrap().abnormal);
    std::fs::remove_dir_all(d.state_dir.join("volumes").join(&v.volume_id)).unwrap();
    let got = c.controller_get_volume(req).await.unwrap().into_inner();
    let cond = got.status.unwrap().volume_condition.unwrap();
    assert!(cond.abnormal);
    assert!(cond.message.contains(&v.volume_id), "{}", cond.message);
    assert_eq!(
        code(
            c.controller_get_volume(csi::ControllerGetVolumeRequest {
                volume_id: "nope".into()
            })
            .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            c.controller_get_volume(csi::ControllerGetVolumeRequest::default())
                .await
        ),
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn controller_expand_volume_grows_to_the_exact_size() {
    let d = Driver::start(&["--max-volume-size", "1073741824"]).await;
    let mut c = d.controller();
    let dir = make(&d, "grow-dir").await;
    let blk = c
        .create_volume(create(
            "grow-blk",
            32 * MIB,
            fs_cap(Mode::SingleNodeWriter, "ext4", &[]),
        ))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let expand = |id: &str, bytes: i64| csi::ControllerExpandVolumeRequest {
        volume_id: id.into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        ..Default::default()
    };
    let r = c
        .controller_expand_volume(expand(&dir.volume_id, 11 * MIB + 5))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 11 * MIB + 5, "exactly what was asked");
    assert!(
        !r.node_expansion_required,
        "a directory has nothing to grow on the node"
    );
    let r = c
        .controller_expand_volume(expand(&blk.volume_id, 64 * MIB))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 64 * MIB);
    assert!(r.node_expansion_required);
    let img = d
        .state_dir
        .join("volumes")
        .join(format!("{}.img", blk.volume_id));
    assert_eq!(std::fs::metadata(img).unwrap().len(), 64 << 20);
    let r = c
        .controller_expand_volume(expand(&blk.volume_id, 16 * MIB))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.capacity_bytes, 64 * MIB, "volumes never shrink");
    assert_eq!(
        code(
            c.controller_expand_volume(expand(&blk.volume_id, 2 << 30))
                .await
        ),
        Code::OutOfRange
    );
    assert_eq!(
        code(c.controller_expand_volume(expand("missing", MIB)).await),
        Code::NotFound
    );
    assert_eq!(
        code(c.controller_expand_volume(expand("", MIB)).await),
        Code::InvalidArgument
    );
    let mut no_range = expand(&blk.volume_id, MIB);
    no_range.capacity_range = None;
    assert_eq!(
        code(c.controller_expand_volume(no_range).await),
        Code::InvalidArgument
    );
    let listed = c
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    let cap = listed
        .entries
        .iter()
        .find(|e| e.volume.as_ref().unwrap().volume_id == blk.volume_id)
        .unwrap()
        .volume
        .as_ref()
        .unwrap()
        .capacity_bytes;
    assert_eq!(cap, 64 * MIB, "the new size is recorded");
}

#[tokio::test]
async fn modify_volume_accepts_only_configured_parameters() {
    let d = Driver::start(&["--mutable-parameters", "iops,tier"]).await;
    let mut c = d.controller();
    let mut with_vac = create("vac", MIB, snw());
    with_vac.mutable_parameters = [("iops".to_string(), "100".to_string())].into();
    let v = c
        .create_volume(with_vac)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let mut bad_vac = create("bad-vac", MIB, snw());
    bad_vac.mutable_parameters = [("XXX_FakeKey".to_string(), "x".to_string())].into();
    assert_eq!(code(c.create_volume(bad_vac).await), Code::InvalidArgument);
    let modify = |id: &str, params: &[(&str, &str)]| csi::ControllerModifyVolumeRequest {
        volume_id: id.into(),
        mutable_parameters: params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    c.controller_modify_volume(modify(&v.volume_id, &[("tier", "gold")]))
        .await
        .unwrap();
    c.controller_modify_volume(modify(&v.volume_id, &[]))
        .await
        .expect("nothing to change is fine");
    let e = c
        .controller_modify_volume(modify(&v.volume_id, &[("XXX_FakeKey", "1")]))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("XXX_FakeKey"), "{}", e.message());
    assert_eq!(
        code(
            c.controller_modify_volume(modify("non-existing-volume-id", &[("tier", "x")]))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(c.controller_modify_volume(modify("", &[])).await),
        Code::InvalidArgument
    );
}

async fn snap(d: &Driver, name: &str, vol: &str) -> csi::Snapshot {
    d.controller()
        .create_snapshot(csi::CreateSnapshotRequest {
            name: name.into(),
            source_volume_id: vol.into(),
            ..Default::default()
        })
        .await
        .expect("create snapshot")
        .into_inner()
        .snapshot
        .unwrap()
}

#[tokio::test]
async fn snapshots_copy_data_and_restore_into_new_volumes() {
    let d = Driver::start(&[]).await;
    let mut c = d.controller();
    let v = make(&d, "src").await;
    let data = d.state_dir.join("volumes").join(&v.volume_id);
    std::fs::create_dir_all(data.join("sub")).unwrap();
    std::fs::write(data.join("sub/file"), b"before snapshot").unwrap();
    let s = snap(&d, "snap-1", &v.volume_id).await;
    assert!(s.ready_to_use);
    assert_eq!(s.source_volume_id, v.volume_id);
    assert!(s.creation_time.is_some());
    assert_eq!(s.size_bytes, v.capacity_bytes);
    assert_eq!(
        snap(&d, "snap-1", &v.volume_id).await.snapshot_id,
        s.snapshot_id,
        "idempotent by name"
    );
    std::fs::write(data.join("sub/file"), b"after snapshot").unwrap();

    let other = make(&d, "other").await;
    assert_eq!(
        code(
            c.create_snapshot(csi::CreateSnapshotRequest {
                name: "snap-1".into(),
                source_volume_id: other.volume_id.clone(),
                ..Default::default()
            })
            .await
        ),
        Code::AlreadyExists
    );
    assert_eq!(
        code(
            c.create_snapshot(csi::CreateSnapshotRequest {
                name: "x".into(),
                source_volume_id: "missing".into(),
                ..Default::default()
            })
            .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            c.create_snapshot(csi::CreateSnapshotRequest {
                name: "".into(),
                source_volume_id: v.volume_id.clone(),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.create_snapshot(csi::CreateSnapshotRequest {
                name: "x".into(),
                ..Default::default()
            })
            .await
        ),
        Code::InvalidArgument
    );

    let source = |t| Some(csi::VolumeContentSource { r#type: Some(t) });
    use csi::volume_content_source::{SnapshotSource, Type, VolumeSource};
    let mut from_snap = create("restored", 8 * MIB, snw());
    from_snap.volume_content_source = source(Type::Snapshot(SnapshotSource {
        snapshot_id: s.snapshot_id.clone(),
    }));
    let restored = c
        .create_volume(from_snap.clone())
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert!(
        restored.content_source.is_some(),
        "the source is echoed back"
    );
    let restored_file = d
        .state_dir
        .join("volumes")
        .join(&restored.volume_id)
        .join("sub/file");
    assert_eq!(std::fs::read(restored_file).unwrap(), b"before snapshot");
    assert_eq!(
        c.create_volume(from_snap)
            .await
            .unwrap()
            .into_inner()
            .volume
            .unwrap()
            .volume_id,
        restored.volume_id
    );

    let mut clone = create("clone", 8 * MIB, snw());
    clone.volume_content_source = source(Type::Volume(VolumeSource {
        volume_id: v.volume_id.clone(),
    }));
    let cloned = c
        .create_volume(clone)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let cloned_file = d
        .state_dir
        .join("volumes")
        .join(&cloned.volume_id)
        .join("sub/file");
    assert_eq!(std::fs::read(cloned_file).unwrap(), b"after snapshot");

    let mut missing_snap = create("m1", MIB, snw());
    missing_snap.volume_content_source = source(Type::Snapshot(SnapshotSource {
        snapshot_id: "non-existing-snapshot-id".into(),
    }));
    assert_eq!(code(c.create_volume(missing_snap).await), Code::NotFound);
    let mut missing_vol = create("m2", MIB, snw());
    missing_vol.volume_content_source = source(Type::Volume(VolumeSource {
        volume_id: "fake-vol-id-1234".into(),
    }));
    assert_eq!(code(c.create_volume(missing_vol).await), Code::NotFound);
    let mut too_small = create("m3", MIB, snw());
    too_small.capacity_range = Some(csi::CapacityRange {
        required_bytes: MIB,
        limit_bytes: MIB,
    });
    too_small.volume_content_source = source(Type::Snapshot(SnapshotSource {
        snapshot_id: s.snapshot_id.clone(),
    }));
    assert_eq!(code(c.create_volume(too_small).await), Code::OutOfRange);

    for _ in 0..2 {
        c.delete_snapshot(csi::DeleteSnapshotRequest {
            snapshot_id: s.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    assert!(!d.state_dir.join("snapshots").join(&s.snapshot_id).exists());
    c.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: "reallyfakesnapshotid".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(
        code(
            c.delete_snapshot(csi::DeleteSnapshotRequest::default())
                .await
        ),
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn list_snapshots_filters_and_pages() {
    let d = Driver::start(&[]).await;
    let mut c = d.controller();
    let a = make(&d, "a").await;
    let b = make(&d, "b").await;
    let mut mine = Vec::new();
    for i in 0..3 {
        mine.push(snap(&d, &format!("a-{i}"), &a.volume_id).await.snapshot_id);
    }
    let theirs = snap(&d, "b-0", &b.volume_id).await;
    let by_id = c
        .list_snapshots(csi::ListSnapshotsRequest {
            snapshot_id: theirs.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_id.entries.len(), 1);
    let none = c
        .list_snapshots(csi::ListSnapshotsRequest {
            snapshot_id: "none-exist-id".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(none.entries.is_empty());
    let none = c
        .list_snapshots(csi::ListSnapshotsRequest {
            source_volume_id: "fake-vol".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(none.entries.is_empty());
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = c
            .list_snapshots(csi::ListSnapshotsRequest {
                source_volume_id: a.volume_id.clone(),
                max_entries: 2,
                starting_token: token.clone(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        seen.extend(
            page.entries
                .iter()
                .map(|e| e.snapshot.as_ref().unwrap().snapshot_id.clone()),
        );
        if page.next_token.is_empty() {
            break;
        }
        token = page.next_token;
    }
    seen.sort();
    mine.sort();
    assert_eq!(seen, mine);
    let all = c
        .list_snapshots(csi::ListSnapshotsRequest {
            max_entries: 3,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(all.entries.len(), 3);
    assert!(!all.next_token.is_empty());
    let rest = c
        .list_snapshots(csi::ListSnapshotsRequest {
            starting_token: all.next_token,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rest.entries.len(), 1);
    assert_eq!(
        code(
            c.list_snapshots(csi::ListSnapshotsRequest {
                starting_token: "junk".into(),
                ..Default::default()
            })
            .await
        ),
        Code::Aborted
    );
}

#[tokio::test]
async fn group_snapshots_cover_every_volume() {
    let d = Driver::start(&[]).await;
    let mut g = d.group();
    let mut c = d.controller();
    let a = make(&d, "ga").await;
    let b = make(&d, "gb").await;
    let req = csi::CreateVolumeGroupSnapshotRequest {
        name: "group-1".into(),
        source_volume_ids: vec![a.volume_id.clone(), b.volume_id.clone()],
        ..Default::default()
    };
    let group = g
        .create_volume_group_snapshot(req.clone())
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(group.snapshots.len(), 2);
    assert!(group.ready_to_use);
    assert!(group
        .snapshots
        .iter()
        .all(|s| s.group_snapshot_id == group.group_snapshot_id));
    let again = g
        .create_volume_group_snapshot(req)
        .await
        .unwrap()
        .into_inner()
        .group_snapshot
        .unwrap();
    assert_eq!(again.group_snapshot_id, group.group_snapshot_id);
    let conflict = csi::CreateVolumeGroupSnapshotRequest {
        name: "group-1".into(),
        source_volume_ids: vec![a.volume_id.clone()],
        ..Default::default()
    };
    assert_eq!(
        code(g.create_volume_group_snapshot(conflict).await),
        Code::AlreadyExists
    );
    let missing = csi::CreateVolumeGroupSnapshotRequest {
        name: "group-2".into(),
        source_volume_ids: vec!["nope".into()],
        ..Default::default()
    };
    assert_eq!(
        code(g.create_volume_group_snapshot(missing).await),
        Code::NotFound
    );
    assert_eq!(
        code(
            g.create_volume_group_snapshot(csi::CreateVolumeGroupSnapshotRequest::default())
                .await
        ),
        Code::InvalidArgument
    );

    let got = g
        .get_volume_group_snapshot(csi::GetVolumeGroupSnapshotRequest {
            group_snapshot_id: group.group_snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.group_snapshot.unwrap().snapshots.len(), 2);
    assert_eq!(
        code(
            g.get_volume_group_snapshot(csi::GetVolumeGroupSnapshotRequest {
                group_snapshot_id: "fake-vol-id".into(),
                ..Default::default()
            })
            .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            g.get_volume_group_snapshot(csi::GetVolumeGroupSnapshotRequest::default())
                .await
        ),
        Code::InvalidArgument
    );
    let member = group.snapshots[0].snapshot_id.clone();
    assert_eq!(
        code(
            c.delete_snapshot(csi::DeleteSnapshotRequest {
                snapshot_id: member.clone(),
                ..Default::default()
            })
            .await
        ),
        Code::FailedPrecondition
    );
    g.delete_volume_group_snapshot(csi::DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: group.group_snapshot_id.clone(),
        snapshot_ids: group
            .snapshots
            .iter()
            .map(|s| s.snapshot_id.clone())
            .collect(),
        ..Default::default()
    })
    .await
    .unwrap();
    let listed = c
        .list_snapshots(csi::ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(
        listed.entries.is_empty(),
        "member snapshots go with the group"
    );
    g.delete_volume_group_snapshot(csi::DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: "fake-vol-id".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(
        code(
            g.delete_volume_group_snapshot(csi::DeleteVolumeGroupSnapshotRequest::default())
                .await
        ),
        Code::InvalidArgument
    );
}

#[tokio::test]
async fn state_survives_restart_and_crash() {
    let mut d = Driver::start(&["--max-volumes-per-node", "3"]).await;
    let v = make(&d, "durable").await;
    let s = snap(&d, "durable-snap", &v.volume_id).await;
    d.controller()
        .controller_publish_volume(publish_req(&v.volume_id, NODE, false))
        .await
        .unwrap();
    for restart in ["SIGTERM", "SIGKILL"] {
        if restart == "SIGTERM" {
            d.restart().await;
        } else {
            d.crash();
            d.start_again().await;
        }
        let mut c = d.controller();
        let vols = c
            .list_volumes(csi::ListVolumesRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(vols.entries.len(), 1, "after {restart}");
        let entry = &vols.entries[0];
        assert_eq!(entry.volume.as_ref().unwrap().volume_id, v.volume_id);
        assert_eq!(
            entry.status.as_ref().unwrap().published_node_ids,
            vec![NODE.to_string()]
        );
        let snaps = c
            .list_snapshots(csi::ListSnapshotsRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            snaps.entries[0].snapshot.as_ref().unwrap().snapshot_id,
            s.snapshot_id
        );
        assert_eq!(
            make(&d, "durable").await.volume_id,
            v.volume_id,
            "the name index survives"
        );
        c.controller_publish_volume(publish_req(&v.volume_id, NODE, false))
            .await
            .expect("attachment survives");
        assert_eq!(
            code(
                c.controller_publish_volume(publish_req(&v.volume_id, NODE, true))
                    .await
            ),
            Code::AlreadyExists
        );
    }
}

#[tokio::test]
async fn parallel_creates_of_one_name_make_one_volume() {
    let d = Driver::start(&[]).await;
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let mut c = d.controller();
        tasks.push(tokio::spawn(async move {
            c.create_volume(create("contended", 4 * MIB, snw())).await
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            Ok(r) => ids.push(r.into_inner().volume.unwrap().volume_id),
            Err(s) => assert_eq!(s.code(), Code::Aborted, "losers are told to retry: {s:?}"),
        }
    }
    assert!(!ids.is_empty());
    ids.dedup();
    assert_eq!(ids.len(), 1, "one volume id for one name");
    let vols = d
        .controller()
        .list_volumes(csi::ListVolumesRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(vols.entries.len(), 1);
    let dirs = std::fs::read_dir(d.state_dir.join("volumes"))
        .unwrap()
        .count();
    assert_eq!(dirs, 1, "one allocation on disk");

    // Different names proceed in parallel, none refused.
    let mut tasks = Vec::new();
    for i in 0..16 {
        let mut c = d.controller();
        tasks.push(tokio::spawn(async move {
            c.create_volume(create(&format!("par-{i}"), MIB, snw()))
                .await
        }));
    }
    for t in tasks {
        t.await
            .unwrap()
            .expect("independent volumes never abort each other");
    }
}

#[tokio::test]
async fn secrets_never_reach_the_log() {
    let d = Driver::start(&[]).await;
    let mut c = d.controller();
    let mut r = create("secretive", MIB, snw());
    r.secrets = req::secrets();
    let v = c
        .create_volume(r)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let mut bad = create("", MIB, snw());
    bad.secrets = req::secrets();
    let _ = c.create_volume(bad).await;
    let mut p = publish_req(&v.volume_id, "nowhere", false);
    p.secrets = req::secrets();
    let _ = c.controller_publish_volume(p).await;
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: v.volume_id,
        secrets: req::secrets(),
    })
    .await
    .unwrap();
    let log = d.log();
    assert!(log.contains("volume created"), "the log is captured: {log}");
    assert!(
        !log.contains("hunter2"),
        "a secret leaked into the log:\n{log}"
    );
}

#[tokio::test]
async fn socket_is_replaced_on_start_and_removed_on_stop() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("csi.sock");
    std::fs::write(&sock, b"stale").unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_csi-relay"))
        .args(["serve", "--node-id", "n1"])
        .arg("--endpoint")
        .arg(format!("unix://{}", sock.display()))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let channel = common::connect(&sock).await;
    let mut id = csi::identity_client::IdentityClient::new(channel);
    id.probe(csi::ProbeRequest {}).await.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "clean exit on SIGTERM: {status:?}");
    assert!(!sock.exists(), "socket removed on shutdown");
}

#[tokio::test]
async fn metrics_endpoint_counts_rpcs_by_method_and_code() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let d = Driver::start(&["--metrics-address", &addr]).await;
    make(&d, "counted").await;
    let _ = d.controller().create_volume(create("", MIB, snw())).await;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("metrics listener");
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    conn.read_to_string(&mut body).await.unwrap();
    assert!(
        body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"),
        "{body}"
    );
    assert!(
        body.contains(r#"csi_relay_rpc_total{code="Ok",method="CreateVolume"} 1"#),
        "{body}"
    );
    assert!(
        body.contains(r#"csi_relay_rpc_total{code="InvalidArgument",method="CreateVolume"} 1"#),
        "{body}"
    );
    assert!(
        body.contains("csi_relay_rpc_duration_seconds_bucket"),
        "{body}"
    );
}

#[tokio::test]
async fn probe_fails_precondition_when_the_backend_is_gone() {
    let d = Driver::start(&[]).await;
    let mut id = d.identity();
    assert_eq!(
        id.probe(csi::ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready,
        Some(true)
    );
    std::fs::remove_dir_all(d.state_dir.join("volumes")).unwrap();
    let e = id.probe(csi::ProbeRequest {}).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message().contains("volumes"),
        "the message names what is missing: {}",
        e.message()
    );
    std::fs::create_dir(d.state_dir.join("volumes")).unwrap();
    assert_eq!(
        id.probe(csi::ProbeRequest {})
            .await
            .unwrap()
            .into_inner()
            .ready,
        Some(true),
        "recovers"
    );
}

// Concurrent publishes of different volumes to one node: the attach limit
// holds however the calls interleave (the count is taken inside the commit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attach_limit_holds_under_concurrent_publishes() {
    const LIMIT: usize = 2;
    const VOLUMES: usize = 24;
    let d = Driver::start(&["--max-volumes-per-node", &LIMIT.to_string()]).await;
    let mut ids = Vec::new();
    for i in 0..VOLUMES {
        ids.push(make(&d, &format!("race-{i}")).await.volume_id);
    }
    for round in 0..3 {
        let calls = ids.iter().map(|id| {
            let mut c = d.controller();
            let r = publish_req(id, NODE, false);
            async move { c.controller_publish_volume(r).await }
        });
        let results = futures::future::join_all(calls).await;
        let ok = results.iter().filter(|r| r.is_ok()).count();
        for r in &results {
            if let Err(e) = r {
                assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
            }
        }
        assert_eq!(
            ok, LIMIT,
            "round {round}: {ok} publishes passed a limit of {LIMIT}"
        );
        for id in &ids {
            d.controller()
                .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                    volume_id: id.clone(),
                    node_id: NODE.into(),
                    ..Default::default()
                })
                .await
                .unwrap();
        }
    }
}

#[tokio::test]
async fn get_snapshot_follows_the_spec() {
    let d = Driver::start(&[]).await;
    let mut c = d.controller();
    let v = make(&d, "gs-src").await;
    let snap = c
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: v.volume_id.clone(),
            name: "gs-snap".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let got = c
        .get_snapshot(csi::GetSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(got.snapshot_id, snap.snapshot_id);
    assert_eq!(got.source_volume_id, v.volume_id);
    assert_eq!(got.size_bytes, snap.size_bytes);
    assert!(got.ready_to_use && got.creation_time.is_some());
    let missing = c
        .get_snapshot(csi::GetSnapshotRequest {
            snapshot_id: "snap-does-not-exist".into(),
            ..Default::default()
        })
        .await;
    assert_eq!(code(missing), Code::NotFound);
    let empty = c.get_snapshot(csi::GetSnapshotRequest::default()).await;
    assert_eq!(code(empty), Code::InvalidArgument);
    c.delete_snapshot(csi::DeleteSnapshotRequest {
        snapshot_id: snap.snapshot_id.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    let gone = c
        .get_snapshot(csi::GetSnapshotRequest {
            snapshot_id: snap.snapshot_id,
            ..Default::default()
        })
        .await;
    assert_eq!(code(gone), Code::NotFound);
}

// Creates of different names run at once: together they never take more
// than --capacity (measured before the check moved into the store's write:
// 7 of 24 creates of 40 MiB succeeded against 90 MiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creates_never_pass_the_capacity() {
    let d = Driver::start(&["--capacity", &(90 * MIB).to_string()]).await;
    let creates = (0..24).map(|i| {
        let mut c = d.controller();
        async move {
            c.create_volume(create(&format!("cap-{i}"), 40 * MIB, snw()))
                .await
        }
    });
    let results = futures::future::join_all(creates).await;
    let created = results.iter().filter(|r| r.is_ok()).count();
    for r in &results {
        if let Err(e) = r {
            assert_eq!(e.code(), Code::ResourceExhausted, "{}", e.message());
            assert!(e.message().contains("bytes are free"), "{}", e.message());
        }
    }
    assert_eq!(created, 2, "two 40 MiB volumes fit in 90 MiB");
    let left = available(&d).await;
    assert_eq!(left, 10 * MIB);
}
