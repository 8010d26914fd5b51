//! The controller RPCs over the member backend, with the RelayVolume
//! observer: what the CO sees (codes, CREATED without waiting for binding,
//! accessible_topology) and what both clusters are asked, across a failed
//! attempt and its retry.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::json;
use tonic::Code;

use crate::config::{DriverConfig, Mode, TOPOLOGY_MEMBER_KEY};
use crate::controller::{provision, publish};
use crate::csi;
use crate::driver::Driver;
use crate::member::backend::MemberBackend;
use crate::member::relay_volume::{RelayVolumeObserver, Role};
use crate::member::testing::{self, MockApi};
use crate::store::Store;

const RV: &str = "/apis/relay.csi.dev/v1alpha1/relayvolumes";
const PVCS: &str = "/api/v1/namespaces/relay/persistentvolumeclaims";

fn driver(dir: &std::path::Path) -> (Driver, MockApi, MockApi) {
    let (east, member) = testing::member("east");
    let (host, host_api) = testing::host();
    let backend = MemberBackend::new(vec![east], Some(host.clone()), "relay.csi.dev");
    let config = DriverConfig {
        driver_name: "relay.csi.dev".into(),
        node_id: "ctrl".into(),
        mode: Mode::Controller,
        max_volumes_per_node: 0,
        capacity: i64::MAX as u64,
        max_volume_size: i64::MAX as u64,
        mutable_parameters: Default::default(),
        state_dir: dir.to_path_buf(),
        node_member: None,
    };
    let d =
        Driver::new(config, Store::open(dir).unwrap(), Arc::new(backend)).with_observer(Arc::new(
            RelayVolumeObserver::new(host, Role::for_mode(Mode::Controller, "ctrl")),
        ));
    (d, member, host_api)
}

fn capability() -> csi::VolumeCapability {
    use csi::volume_capability::{access_mode::Mode as M, AccessMode, AccessType, MountVolume};
    csi::VolumeCapability {
        access_mode: Some(AccessMode {
            mode: M::SingleNodeWriter as i32,
        }),
        access_type: Some(AccessType::Mount(MountVolume::default())),
    }
}

fn create_request() -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: "pvc-0a1b".into(),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 1 << 30,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability()],
        parameters: HashMap::from([
            ("memberNamespace".to_string(), "relay".to_string()),
            (
                "csi.storage.k8s.io/pvc/name".to_string(),
                "data".to_string(),
            ),
            (
                "csi.storage.k8s.io/pvc/namespace".to_string(),
                "shop".to_string(),
            ),
        ]),
        accessibility_requirements: Some(csi::TopologyRequirement {
            requisite: vec![csi::Topology {
                segments: HashMap::from([(TOPOLOGY_MEMBER_KEY.to_string(), "east".to_string())]),
            }],
            preferred: vec![],
        }),
        ..Default::default()
    }
}

/// Answers the observer's two applies (spec, status); returns the phase.
async fn applied(host: &mut MockApi) -> String {
    let spec = host.next().await;
    assert_eq!(spec.method, "PATCH");
    assert!(spec.path.starts_with(RV) && !spec.path.ends_with("/status"));
    let body = spec.body.clone();
    spec.ok(body);
    let status = host.next().await;
    assert!(status.path.ends_with("/status"), "{}", status.path);
    let phase = status.body["status"]["phase"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let body = status.body.clone();
    status.ok(body);
    phase
}

#[tokio::test(start_paused = true)]
async fn create_after_a_failed_attempt_makes_one_member_pvc() {
    let tmp = tempfile::tempdir().unwrap();
    let (d, mut member, mut host) = driver(tmp.path());

    // First attempt: the record is committed (and mirrored), the member is
    // unreachable.
    let (first, first_pvc, ()) = tokio::join!(
        provision::create_volume(&d, create_request()),
        async {
            let post = member.expect("POST", PVCS).await;
            let name = post.body["metadata"]["name"].clone();
            post.refuse();
            name
        },
        async {
            assert_eq!(applied(&mut host).await, "PROVISIONING");
        }
    );
    let err = first.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.to_string().contains("member cluster east"), "{err}");

    // The CO retries with the same name: same volume, same PVC name; the
    // member already has it (the refused call went through after all).
    let (second, (), ()) = tokio::join!(
        provision::create_volume(&d, create_request()),
        async {
            let post = member.expect("POST", PVCS).await;
            assert_eq!(post.body["metadata"]["name"], first_pvc);
            let existing = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": post.body["metadata"].clone(),
                "spec": post.body["spec"].clone(),
                "status": {"phase": "Pending"}});
            post.already_exists();
            let name = existing["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            member
                .expect("GET", &format!("{PVCS}/{name}"))
                .await
                .ok(existing);
            member.expect_idle().await;
        },
        async {
            assert_eq!(applied(&mut host).await, "CREATED");
        }
    );
    let vol = second.unwrap().volume.unwrap();
    assert!(vol.volume_id.starts_with("m-east-"), "{}", vol.volume_id);
    assert_eq!(vol.capacity_bytes, 1 << 30);
    assert_eq!(
        vol.accessible_topology[0].segments[TOPOLOGY_MEMBER_KEY],
        "east"
    );
    assert_eq!(
        vol.volume_context["relay.csi.dev/member-pvc"],
        first_pvc.as_str().unwrap_or_default()
    );

    // A third call answers from the store: nothing is asked of anyone.
    let (third, (), ()) = tokio::join!(
        provision::create_volume(&d, create_request()),
        member.expect_idle(),
        host.expect_idle()
    );
    assert_eq!(third.unwrap().volume.unwrap().volume_id, vol.volume_id);

    // ControllerPublish before the member binds: retryable, nothing recorded.
    let (published, (), ()) = tokio::join!(
        publish::publish(
            &d,
            csi::ControllerPublishVolumeRequest {
                volume_id: vol.volume_id.clone(),
                node_id: "host-1".into(),
                volume_capability: Some(capability()),
                ..Default::default()
            }
        ),
        async {
            let pvc = first_pvc.as_str().unwrap_or_default();
            member
                .expect("GET", "/api/v1/nodes/host-1")
                .await
                .not_found();
            member.expect("GET", &format!("{PVCS}/{pvc}")).await.ok(
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                           "metadata": {"name": pvc, "namespace": "relay"},
                           "status": {"phase": "Pending"}}),
            );
        },
        async {
            // node_known, then the resolution at attach time.
            for _ in 0..2 {
                host.expect("GET", "/api/v1/nodes/host-1").await.ok(json!({
                    "apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": "host-1", "labels": {TOPOLOGY_MEMBER_KEY: "east"}}}));
            }
        }
    );
    let err = published.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.to_string().contains("not Bound yet"), "{err}");

    // DeleteVolume: the member PVC goes, then the RelayVolume.
    let (deleted, (), ()) = tokio::join!(
        provision::delete_volume(
            &d,
            csi::DeleteVolumeRequest {
                volume_id: vol.volume_id.clone(),
                ..Default::default()
            }
        ),
        async {
            let pvc = first_pvc.as_str().unwrap_or_default();
            member
                .expect("DELETE", &format!("{PVCS}/{pvc}"))
                .await
                .not_found();
        },
        async {
            assert_eq!(applied(&mut host).await, "DELETING");
            host.expect("DELETE", &format!("{RV}/{}", vol.volume_id))
                .await
                .ok(json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}));
        }
    );
    deleted.unwrap();
}
