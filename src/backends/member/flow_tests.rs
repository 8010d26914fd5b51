//! The controller RPCs over the member backend, with the RelayVolume
//! observer: what the CO sees (codes, CREATED without waiting for binding,
//! accessible_topology) and what both clusters are asked, across a failed
//! attempt and its retry.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{json, Value};
use tonic::Code;

use crate::csi;
use crate::domain::settings::Mode;
use crate::domain::topology::{TOPOLOGY_MEMBER_KEY, TOPOLOGY_MEMBER_NODE_KEY};
use crate::grpc::status::CsiCode;
use crate::k8s::naming::VOLUME_ID_ANNOTATION;
use crate::k8s::relay_volume::{RelayVolumeObserver, Role};
use crate::k8s::testing::{self, MockApi};
use crate::ops::controller::{provision, publish};
use crate::ops::driver::Driver;

const RV: &str = "/apis/relay.csi.dev/v1alpha1/relayvolumes";
const PVCS: &str = "/api/v1/namespaces/relay/persistentvolumeclaims";

/// A controller over member "east", its host cluster's writer, and the
/// two clusters' mock API servers.
fn controller(dir: &std::path::Path) -> (Driver, RelayVolumeObserver, MockApi, MockApi) {
    let (d, host, member, host_api) = testing::controller(dir);
    let writer = RelayVolumeObserver::new(host, Role::for_mode(Mode::Controller, "ctrl"));
    (d, writer, member, host_api)
}

/// The controller with its RelayVolumes written as an observer.
fn driver(dir: &std::path::Path) -> (Driver, MockApi, MockApi) {
    let (d, writer, member, host_api) = controller(dir);
    (d.with_observer(Arc::new(writer)), member, host_api)
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
    applied_status(host).await["phase"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Answers the observer's two applies (spec, status); returns the status.
async fn applied_status(host: &mut MockApi) -> Value {
    let spec = host.next().await;
    assert_eq!(spec.method, "PATCH");
    assert!(spec.path.starts_with(RV) && !spec.path.ends_with("/status"));
    let body = spec.body.clone();
    spec.ok(body);
    let status = host.next().await;
    assert!(status.path.ends_with("/status"), "{}", status.path);
    let body = status.body.clone();
    status.ok(body.clone());
    body["status"].clone()
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
            let mut existing = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": post.body["metadata"].clone(),
                "spec": post.body["spec"].clone(),
                "status": {"phase": "Pending"}});
            existing["metadata"]["uid"] = json!("uid-first");
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
    // The record names the claim it found by its uid from now on.
    let crate::domain::volume::Backing::Member { claim_uid, .. } =
        d.volume(&vol.volume_id).await.unwrap().backing
    else {
        panic!("a member volume")
    };
    assert_eq!(claim_uid.as_deref(), Some("uid-first"));
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

    // ControllerPublish before the member binds: retryable; the intent is
    // recorded first (so a member attachment never exists unrecorded).
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
                           "metadata": {"name": pvc, "namespace": "relay", "uid": "uid-first",
                                        "annotations": {VOLUME_ID_ANNOTATION: vol.volume_id}},
                           "status": {"phase": "Pending"}}),
            );
        },
        async {
            // node_known, the intent mirrored, then the resolution at attach time.
            host.expect("GET", "/api/v1/nodes/host-1").await.ok(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "host-1", "labels": {TOPOLOGY_MEMBER_KEY: "east"}}}));
            // Only the intent: NODE_READY is not reached, and PHASE and
            // NODES say so (this attach is then refused).
            let intent = applied_status(&mut host).await;
            assert_eq!(intent["phase"], "CREATED", "{intent}");
            assert_eq!(
                intent["nodeSummary"], "host-1=CREATED(NODE_READY pending)",
                "{intent}"
            );
            assert_eq!(intent["nodes"][0]["attached"], false, "{intent}");
            assert_eq!(intent["nodes"][0]["pending"], "NODE_READY", "{intent}");
            host.expect("GET", "/api/v1/nodes/host-1").await.ok(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "host-1", "labels": {TOPOLOGY_MEMBER_KEY: "east"}}}));
        }
    );
    let err = published.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.to_string().contains("not Bound yet"), "{err}");

    // The CO gives up on the attachment (its VolumeAttachment is deleted):
    // ControllerUnpublish removes the intent; the member holds no
    // attachment of the volume, so nothing else is asked.
    let (unpublished, (), ()) = tokio::join!(
        publish::unpublish(
            &d,
            csi::ControllerUnpublishVolumeRequest {
                volume_id: vol.volume_id.clone(),
                node_id: "host-1".into(),
                ..Default::default()
            }
        ),
        async {
            member
                .expect("GET", "/apis/storage.k8s.io/v1/volumeattachments")
                .await
                .ok(
                    json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachmentList",
                           "metadata": {}, "items": []}),
                );
        },
        async {
            assert_eq!(applied(&mut host).await, "CREATED");
        }
    );
    unpublished.unwrap();

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
            // Gone already (a mirroring system deleted it with the host PVC).
            member
                .expect("GET", &format!("{PVCS}/{pvc}"))
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

// The member answers 404 (its namespace does not exist): NOT_FOUND is the
// spec's answer for a missing content source only, so this is a
// precondition the admin must fix.
#[tokio::test(start_paused = true)]
async fn a_member_404_in_create_volume_is_a_failed_precondition() {
    let tmp = tempfile::tempdir().unwrap();
    let (d, mut member, mut host) = driver(tmp.path());
    let (created, (), ()) = tokio::join!(
        provision::create_volume(&d, create_request()),
        async {
            member.expect("POST", PVCS).await.status(
                404,
                "NotFound",
                "namespaces \"relay\" not found",
            );
        },
        async {
            assert_eq!(applied(&mut host).await, "PROVISIONING");
        }
    );
    let err = created.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(
        err.to_string().contains("namespaces \"relay\" not found"),
        "{err}"
    );
}

// Housekeeping collects the relay's member attachments that no record
// wants, unless a member pod's attachment of the same volume and node
// still exists.
#[tokio::test(start_paused = true)]
async fn housekeeping_collects_unwanted_member_attachments_but_not_under_a_pod() {
    let tmp = tempfile::tempdir().unwrap();
    let (d, mut member, _host) = driver(tmp.path());
    let vas = "/apis/storage.k8s.io/v1/volumeattachments";
    let uuid = "0123456789abcdef0123456789abcdef";
    let va = |name: &str, node: &str, ours: bool| {
        let mut v = json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": name},
            "spec": {"attacher": "disk.csi.example", "nodeName": node,
                     "source": {"persistentVolumeName": "pv-9"}}});
        if ours {
            v["metadata"]["labels"] = json!({"app.kubernetes.io/managed-by": "csi-relay",
                                             "relay.csi.dev/volume-uuid": uuid});
        }
        v
    };
    let list = |items: Vec<Value>| {
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachmentList",
               "metadata": {}, "items": items})
    };
    let ours = format!("relay-{uuid}-1");
    let ours_path = format!("{vas}/{ours}");
    for shared in [true, false] {
        let (report, ()) = tokio::join!(crate::ops::housekeeping::sweep(&d), async {
            // Claims whose host PV is gone: none here.
            member
                .expect("GET", "/api/v1/persistentvolumeclaims")
                .await
                .ok(
                    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaimList",
                           "metadata": {}, "items": []}),
                );
            let listed = member.expect("GET", vas).await;
            assert!(listed.query.contains("labelSelector"), "{}", listed.query);
            listed.ok(list(vec![va(&ours, "worker-1", true)]));
            member
                .expect("GET", &ours_path)
                .await
                .ok(va(&ours, "worker-1", true));
            let mut all = vec![va(&ours, "worker-1", true)];
            if shared {
                all.push(va("csi-made-for-a-member-pod", "worker-1", false));
            }
            member.expect("GET", vas).await.ok(list(all));
            if !shared {
                member
                    .expect("DELETE", &ours_path)
                    .await
                    .ok(va(&ours, "worker-1", true));
                member.expect("GET", &ours_path).await.not_found();
            }
            member.expect_idle().await;
        });
        let report = report.unwrap();
        assert_eq!(
            report.collected_attachments,
            usize::from(!shared),
            "shared={shared}"
        );
    }
}

// A Kosmos-style virtual node that stands for the whole member cluster:
// ControllerPublishVolume is NODE_READY once the member claim exists, even
// unbound (WaitForFirstConsumer) and even for a driver that needs attach,
// with no relay-made attachment: the member's attach/detach controller
// attaches the volume where the member pod lands.
#[tokio::test(start_paused = true)]
async fn a_virtual_node_for_a_whole_member_cluster_needs_no_relay_attachment() {
    virtual_node_publish(json!({TOPOLOGY_MEMBER_KEY: "east"})).await;
}

// The same for a virtual node that stands for one member node: the member
// pod's own attachment is the member's business, not the relay's.
#[tokio::test(start_paused = true)]
async fn a_virtual_node_for_one_member_node_needs_no_relay_attachment_either() {
    virtual_node_publish(json!({TOPOLOGY_MEMBER_KEY: "east", TOPOLOGY_MEMBER_NODE_KEY: "m-1"}))
        .await;
}

async fn virtual_node_publish(labels: Value) {
    let tmp = tempfile::tempdir().unwrap();
    let (d, mut member, mut host) = driver(tmp.path());
    let (created, (), ()) = tokio::join!(
        provision::create_volume(&d, create_request()),
        async {
            member.expect("POST", PVCS).await.created();
        },
        async {
            assert_eq!(applied(&mut host).await, "PROVISIONING");
            assert_eq!(applied(&mut host).await, "CREATED");
        }
    );
    let vol = created.unwrap().volume.unwrap();
    let pvc = vol.volume_context["relay.csi.dev/member-pvc"].clone();
    let vnode = || {
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "vnode-east", "labels": labels.clone()},
               "spec": {"taints": [{"key": "kosmos.io/node", "value": "true", "effect": "NoSchedule"}]}})
    };
    let (published, (), ()) = tokio::join!(
        publish::publish(
            &d,
            csi::ControllerPublishVolumeRequest {
                volume_id: vol.volume_id.clone(),
                node_id: "vnode-east".into(),
                volume_capability: Some(capability()),
                ..Default::default()
            }
        ),
        async {
            // A whole-cluster virtual node is looked up as a member node name.
            if labels.get(TOPOLOGY_MEMBER_NODE_KEY).is_none() {
                member
                    .expect("GET", "/api/v1/nodes/vnode-east")
                    .await
                    .not_found();
            }
            member.expect("GET", &format!("{PVCS}/{pvc}")).await.ok(
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                       "metadata": {"name": pvc, "namespace": "relay",
                                    "annotations": {VOLUME_ID_ANNOTATION: vol.volume_id}},
                       "status": {"phase": "Pending"}}),
            );
            member.expect_idle().await;
        },
        async {
            host.expect("GET", "/api/v1/nodes/vnode-east")
                .await
                .ok(vnode());
            // The intent, then NODE_READY once the attach answered.
            assert_eq!(applied(&mut host).await, "CREATED");
            host.expect("GET", "/api/v1/nodes/vnode-east")
                .await
                .ok(vnode());
            assert_eq!(applied(&mut host).await, "NODE_READY");
        }
    );
    let published = published.unwrap();
    assert!(published.publish_context.is_empty(), "{published:?}");
}

/// Answers the controller's two applies as the API server does (the whole
/// object, whose spec the status apply's answer carries too); returns the
/// phase.
async fn mirrored(host: &mut MockApi) -> String {
    let spec = host.next().await;
    assert!(spec.method == "PATCH" && spec.path.starts_with(RV) && !spec.path.ends_with("/status"));
    let object = spec.body.clone();
    spec.ok(object.clone());
    let status = host.next().await;
    assert!(status.path.ends_with("/status"), "{}", status.path);
    let phase = status.body["status"]["phase"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut whole = object;
    whole["status"] = status.body["status"].clone();
    status.ok(whole);
    phase
}

fn mirrored_driver(dir: &std::path::Path) -> (Driver, MockApi, MockApi) {
    let (d, writer, member, host_api) = controller(dir);
    let mirror = crate::k8s::mirror::RelayMirror::new(writer, crate::grpc::status::code_name);
    (d.with_mirror(Arc::new(mirror)), member, host_api)
}

// A controller that loses its state dir rebuilds from RelayVolumes: a call
// whose RelayVolume cannot be written fails before the member is asked for
// anything, and the next call on the volume writes it before going on. A
// removal that did not reach the host is made by the retry of DeleteVolume,
// although the store no longer holds the volume.
#[tokio::test(start_paused = true)]
async fn nothing_is_acknowledged_or_made_in_the_member_before_its_relayvolume_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let (d, mut member, mut host) = mirrored_driver(tmp.path());

    let (first, (), ()) = tokio::join!(
        provision::create_volume(&d, create_request()),
        async {
            let apply = host.next().await;
            assert!(
                apply.method == "PATCH" && apply.path.starts_with(RV),
                "{}",
                apply.path
            );
            apply.refuse();
        },
        member.expect_idle()
    );
    let err = first.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(
        err.to_string().contains("RelayVolume could not be written"),
        "{err}"
    );

    // The retry: the PROVISIONING record is written first, then the member
    // claim is made, then CREATED.
    let (second, (), ()) = tokio::join!(
        provision::create_volume(&d, create_request()),
        async {
            member.expect("POST", PVCS).await.created();
            member.expect_idle().await;
        },
        async {
            assert_eq!(mirrored(&mut host).await, "PROVISIONING");
            assert_eq!(mirrored(&mut host).await, "CREATED");
        }
    );
    let vol = second.unwrap().volume.unwrap();

    // A repeat is answered from the store: the copy is known to be current.
    let (third, (), ()) = tokio::join!(
        provision::create_volume(&d, create_request()),
        member.expect_idle(),
        host.expect_idle()
    );
    assert_eq!(third.unwrap().volume.unwrap().volume_id, vol.volume_id);

    let delete = || {
        provision::delete_volume(
            &d,
            csi::DeleteVolumeRequest {
                volume_id: vol.volume_id.clone(),
                ..Default::default()
            },
        )
    };
    let rv = format!("{RV}/{}", vol.volume_id);
    let (deleted, (), ()) = tokio::join!(
        delete(),
        async {
            let pvc = vol.volume_context["relay.csi.dev/member-pvc"].clone();
            member
                .expect("GET", &format!("{PVCS}/{pvc}"))
                .await
                .not_found();
        },
        async {
            assert_eq!(mirrored(&mut host).await, "DELETING");
            host.expect("DELETE", &rv).await.refuse();
        }
    );
    assert_eq!(deleted.unwrap_err().code(), Code::Unavailable);
    let (again, (), ()) = tokio::join!(delete(), member.expect_idle(), async {
        host.expect("DELETE", &rv)
            .await
            .ok(json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}));
    });
    again.unwrap();
    let (last, (), ()) = tokio::join!(delete(), member.expect_idle(), host.expect_idle());
    last.unwrap();
}

/// Answers a status apply with a whole object, as the API server does.
fn answer_whole(call: testing::Call) {
    let mut whole = call.body.clone();
    whole["spec"] = json!({"volumeId": "v", "volumeName": "n", "capacityBytes": 1, "record": "{}"});
    call.ok(whole);
}

// A create the member refuses shows why on its RelayVolume (a field
// manager of its own, so the controller's status applies keep it), the
// retry that succeeds takes it away, and a create whose host claim is
// deleted meanwhile is rolled back by the next check, not an hour later.
#[tokio::test(start_paused = true)]
async fn a_refused_create_shows_why_and_goes_with_its_claim() {
    let tmp = tempfile::tempdir().unwrap();
    let (d, mut member, mut host) = mirrored_driver(tmp.path());
    let (first, (), ()) = tokio::join!(
        provision::create_volume(&d, create_request()),
        async {
            member.expect("POST", PVCS).await.already_exists();
            let mut foreign = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data", "namespace": "relay", "uid": "u-1"},
                "status": {"phase": "Bound"}});
            foreign["spec"] = json!({"volumeName": "pv-other"});
            member
                .expect("GET", &format!("{PVCS}/data"))
                .await
                .ok(foreign);
        },
        async {
            assert_eq!(mirrored(&mut host).await, "PROVISIONING");
            let note = host.next().await;
            assert!(note.path.ends_with("/status"), "{}", note.path);
            assert_eq!(note.query_map()["fieldManager"], "csi-relay-errors");
            let text = note.body["status"]["lastError"]
                .as_str()
                .unwrap_or_default();
            assert!(
                text.starts_with("CreateVolume: AlreadyExists: member cluster east"),
                "{text}"
            );
            assert!(text.contains("relay/data"), "{text}");
            assert!(note.body["status"]["lastErrorTime"].is_string());
            assert!(note.body["status"].get("phase").is_none());
            answer_whole(note);
        }
    );
    assert_eq!(first.unwrap_err().code(), Code::AlreadyExists);

    // The retry succeeds: CREATED, and the failure is cleared by applying
    // nothing under its manager.
    let (second, (), ()) = tokio::join!(
        provision::create_volume(&d, create_request()),
        async {
            member.expect("POST", PVCS).await.created();
        },
        async {
            assert_eq!(mirrored(&mut host).await, "CREATED");
            let clear = host.next().await;
            assert_eq!(clear.query_map()["fieldManager"], "csi-relay-errors");
            assert_eq!(clear.body["status"], json!({}));
            answer_whole(clear);
            host.expect_idle().await;
        }
    );
    second.unwrap();

    // Another claim's create is refused, and its claim is then deleted.
    let mut other = create_request();
    other.name = "pvc-9f8e".into();
    other
        .parameters
        .insert("csi.storage.k8s.io/pvc/name".into(), "cache".into());
    let (refused, (), ()) = tokio::join!(
        provision::create_volume(&d, other.clone()),
        async {
            member
                .expect("POST", PVCS)
                .await
                .status(403, "Forbidden", "quota exceeded");
        },
        async {
            assert_eq!(mirrored(&mut host).await, "PROVISIONING");
            answer_whole(host.next().await);
        }
    );
    assert!(refused.is_err());
    let mut report = crate::ops::housekeeping::Report::default();
    let (swept, (), ()) = tokio::join!(
        crate::ops::housekeeping::sweep_abandoned(&d, &mut report),
        async {
            // Rolled back: the member claim (never made) and the record.
            member
                .expect("GET", &format!("{PVCS}/cache"))
                .await
                .not_found();
        },
        async {
            // The host claim "cache" is gone (the Ready volume's claim is
            // not even looked at).
            host.expect(
                "GET",
                "/api/v1/namespaces/shop/persistentvolumeclaims/cache",
            )
            .await
            .not_found();
            // Its RelayVolume goes with it.
            let gone = host.next().await;
            assert!(
                gone.method == "DELETE" && gone.path.starts_with(RV),
                "{}",
                gone.path
            );
            gone.ok(json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}));
            host.expect_idle().await;
        }
    );
    swept.unwrap();
    assert_eq!(report.abandoned_volumes, 1, "{report:?}");
}

const LOST_ID: &str = "m-west-0123456789abcdef0123456789abcdef";

/// A controller mirroring its RelayVolumes, member "west" declared lost, and
/// west's volume `LOST_ID` (claim shop/data) attached to host-1 in its store
/// (`with_attachment`: block, single-node writer).
async fn with_lost_west_volume(dir: &std::path::Path) -> (Driver, MockApi, MockApi) {
    use crate::domain::volume::{sample, with_attachment, Backing};
    let (d, host, member, host_api) = testing::controller_losing(dir, &["west"]);
    let writer = RelayVolumeObserver::new(host, Role::for_mode(Mode::Controller, "ctrl"));
    let d = d.with_mirror(Arc::new(crate::k8s::mirror::RelayMirror::new(
        writer,
        crate::grpc::status::code_name,
    )));
    let mut vol = with_attachment(sample(LOST_ID, "pvc-w"), "host-1");
    vol.backing = Backing::Member {
        member: "west".into(),
        namespace: "shop".into(),
        pvc: "data".into(),
        selected_node: None,
        claim_uid: None,
    };
    d.db(move |s| s.put_volume(&vol)).await.unwrap();
    (d, member, host_api)
}

/// The whole RelayVolume of `LOST_ID` the API server answers a status
/// apply of `body` with.
fn lost_whole(body: &Value) -> Value {
    let mut whole = body.clone();
    whole["spec"] = json!({"volumeId": LOST_ID, "volumeName": "pvc-w",
                           "capacityBytes": 100, "record": "{}"});
    whole
}

/// ControllerPublishVolume of `id` to `node`, as attached by
/// `with_attachment` (block, single-node writer).
fn block_publish(id: &str, node: &str) -> csi::ControllerPublishVolumeRequest {
    use csi::volume_capability::{access_mode::Mode as M, AccessMode, AccessType, BlockVolume};
    csi::ControllerPublishVolumeRequest {
        volume_id: id.into(),
        node_id: node.into(),
        volume_capability: Some(csi::VolumeCapability {
            access_mode: Some(AccessMode {
                mode: M::SingleNodeWriter as i32,
            }),
            access_type: Some(AccessType::Block(BlockVolume {})),
        }),
        ..Default::default()
    }
}

// A member declared lost for good (`--lost-member west`): its volume's
// attachment and the volume itself are released without a word to any
// member, every other call on it is refused naming the flag, and its
// RelayVolume stays as the record of what was left there: phase RELEASED,
// the member claim named, the label that finds it.
#[tokio::test(start_paused = true)]
async fn a_lost_members_volume_is_released_and_its_relayvolume_kept_as_the_record() {
    let tmp = tempfile::tempdir().unwrap();
    let (d, member, mut host) = with_lost_west_volume(tmp.path()).await;
    let id = LOST_ID;

    let (refused, ()) = tokio::join!(publish::publish(&d, block_publish(id, "host-1")), async {
        host.expect("GET", "/api/v1/nodes/host-1").await.ok(json!({
                "apiVersion": "v1", "kind": "Node", "metadata": {"name": "host-1"}}));
        // The refusal, shown where users look (LAST-ERROR).
        let noted = host.next().await;
        assert!(noted.path.ends_with("/status"), "{}", noted.path);
        let last = noted.body["status"]["lastError"]
            .as_str()
            .unwrap_or_default();
        assert!(
            last.starts_with("ControllerPublishVolume: FailedPrecondition: ")
                && last.contains("--lost-member west"),
            "{last}"
        );
        let whole = lost_whole(&noted.body);
        noted.ok(whole);
    });
    let err = refused.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.to_string().contains("--lost-member west"), "{err}");

    let (unpublished, ()) = tokio::join!(
        publish::unpublish(
            &d,
            csi::ControllerUnpublishVolumeRequest {
                volume_id: id.into(),
                node_id: "host-1".into(),
                ..Default::default()
            }
        ),
        async {
            assert_eq!(mirrored(&mut host).await, "CREATED");
            // The volume moved on: the refusal shown is cleared.
            let cleared = host.next().await;
            assert!(cleared.path.ends_with("/status"), "{}", cleared.path);
            assert!(cleared.body["status"].get("lastError").is_none());
            let whole = lost_whole(&cleared.body);
            cleared.ok(whole);
        }
    );
    unpublished.unwrap();

    let (deleted, ()) = tokio::join!(
        provision::delete_volume(
            &d,
            csi::DeleteVolumeRequest {
                volume_id: id.into(),
                ..Default::default()
            }
        ),
        async {
            assert_eq!(mirrored(&mut host).await, "DELETING");
            let status = host.next().await;
            assert!(status.path.ends_with("/status"), "{}", status.path);
            assert_eq!(status.body["status"]["phase"], "RELEASED");
            let why = status.body["status"]["released"]
                .as_str()
                .unwrap_or_default();
            assert!(
                why.contains("member cluster west") && why.contains("shop/data"),
                "{why}"
            );
            // The API server answers with the whole object.
            let mut whole = lost_whole(&status.body);
            status.ok(whole.clone());
            let label = host.next().await;
            assert!(!label.path.ends_with("/status"), "{}", label.path);
            assert_eq!(
                label.body["metadata"]["labels"]["relay.csi.dev/released-from"],
                "west"
            );
            whole["metadata"] = label.body["metadata"].clone();
            label.ok(whole);
        }
    );
    deleted.unwrap();
    assert!(d.find_volume(id).await.unwrap().is_none());
    drop(d);
    member.expect_done().await;
    host.expect_done().await;
}

// A host that takes the call's failure note and never answers: the call
// still answers its own refusal, after the note's 2 s bound, not the host
// client's 10 s one.
#[tokio::test(start_paused = true)]
async fn a_failure_note_the_host_does_not_answer_delays_the_answer_by_2_s_at_most() {
    let tmp = tempfile::tempdir().unwrap();
    let (d, _member, mut host) = with_lost_west_volume(tmp.path()).await;
    let id = LOST_ID;
    let started = tokio::time::Instant::now();
    let (refused, _held) = tokio::join!(publish::publish(&d, block_publish(id, "host-1")), async {
        host.expect("GET", "/api/v1/nodes/host-1").await.ok(json!({
                "apiVersion": "v1", "kind": "Node", "metadata": {"name": "host-1"}}));
        let noted = host.next().await;
        assert!(noted.path.ends_with("/status"), "{}", noted.path);
        noted.hang()
    });
    assert_eq!(refused.unwrap_err().code(), Code::FailedPrecondition);
    let took = started.elapsed();
    assert!(
        took >= std::time::Duration::from_secs(2) && took < std::time::Duration::from_secs(3),
        "{took:?}"
    );
}

/// A member cluster as a test plays it for an upgraded controller: the
/// claims and attachments it holds, answered as an API server would.
struct PlayedMember {
    claims: HashMap<String, Value>,
    attachments: HashMap<String, Value>,
}

impl PlayedMember {
    fn answer(&mut self, call: testing::Call) {
        const PVC_PREFIX: &str = "/api/v1/namespaces/";
        const VAS: &str = "/apis/storage.k8s.io/v1/volumeattachments";
        let path = call.path.clone();
        if let Some(rest) = path.strip_prefix(PVC_PREFIX) {
            let parts: Vec<&str> = rest.split('/').collect();
            if let [ns, "persistentvolumeclaims", name] = parts.as_slice() {
                let key = format!("{ns}/{name}");
                match call.method.as_str() {
                    "DELETE" => match self.claims.remove(&key) {
                        Some(obj) => call.ok(obj),
                        None => call.not_found(),
                    },
                    _ => match self.claims.get(&key) {
                        Some(obj) => call.ok(obj.clone()),
                        None => call.not_found(),
                    },
                }
                return;
            }
        }
        if path == VAS {
            let selector = call
                .query_map()
                .get("labelSelector")
                .map(|s| {
                    s.replace("%2F", "/")
                        .replace("%3D", "=")
                        .replace("%2C", ",")
                })
                .unwrap_or_default();
            let items: Vec<Value> = self
                .attachments
                .values()
                .filter(|va| {
                    selector.split(',').filter(|s| !s.is_empty()).all(|pair| {
                        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
                        va["metadata"]["labels"][k] == v
                    })
                })
                .cloned()
                .collect();
            call.ok(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachmentList",
                           "metadata": {}, "items": items}),
            );
            return;
        }
        if let Some(name) = path.strip_prefix(&format!("{VAS}/")) {
            match call.method.as_str() {
                "DELETE" => match self.attachments.remove(name) {
                    Some(obj) => call.ok(obj),
                    None => call.not_found(),
                },
                _ => match self.attachments.get(name) {
                    Some(obj) => call.ok(obj.clone()),
                    None => call.not_found(),
                },
            }
            return;
        }
        call.not_found();
    }
}

// RelayVolumes written by the build of 2026-11-25 (3dbdfe7;
// tests/fixtures/relayvolumes-3dbdfe7.json, made by
// upgrade_fixtures::generate_relay_volumes on the real control planes): a
// controller of this build whose state directory is gone rebuilds its
// records from them, serves them (the attachment the old build made, which
// names no host node, is found through the node's mapping and detached)
// and deletes them, leaving nothing in the member.
#[tokio::test(start_paused = true)]
async fn relay_volumes_of_the_released_build_are_rebuilt_served_and_torn_down() {
    let fixture: Vec<Value> = serde_json::from_str(include_str!(
        "../../../tests/fixtures/relayvolumes-3dbdfe7.json"
    ))
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let (d, host, mut member_api, mut host_api) = testing::controller(tmp.path());
    let (rebuilt, ()) = tokio::join!(crate::k8s::relay_volume::rebuild(&host, &d.store), async {
        host_api.expect("GET", RV).await.ok(json!({
            "apiVersion": "relay.csi.dev/v1alpha1", "kind": "RelayVolumeList",
            "metadata": {}, "items": fixture}));
    });
    assert_eq!(rebuilt.unwrap().restored, fixture.len());

    // The member as the old build left it: a claim per volume, and the
    // attachment of the published one to member-node-1.
    let mut member = PlayedMember {
        claims: HashMap::new(),
        attachments: HashMap::new(),
    };
    let mut published = None;
    for rv in &fixture {
        let id = rv["spec"]["volumeId"].as_str().unwrap().to_string();
        let vol = d.find_volume(&id).await.unwrap().expect("restored");
        assert_eq!(
            vol.capacity_bytes as i64,
            rv["spec"]["capacityBytes"].as_i64().unwrap()
        );
        let (ns, name) = rv["spec"]["memberPvc"]
            .as_str()
            .unwrap()
            .split_once('/')
            .unwrap();
        let uuid = crate::k8s::naming::parse_volume_id(&id)
            .unwrap()
            .1
            .to_string();
        member.claims.insert(
            format!("{ns}/{name}"),
            json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": ns, "uid": format!("uid-{uuid}"),
                         "labels": {"app.kubernetes.io/managed-by": "csi-relay",
                                    "relay.csi.dev/volume-uuid": uuid},
                         "annotations": {VOLUME_ID_ANNOTATION: id}},
            "spec": {"volumeName": format!("pv-{uuid}")},
            "status": {"phase": "Bound"}}),
        );
        if let Some(node) = vol.nodes.keys().next() {
            assert!(
                vol.nodes[node]
                    .attachment
                    .as_ref()
                    .is_some_and(|a| a.publish_context.is_empty()),
                "what nodes mount is never taken from a RelayVolume"
            );
            let va = crate::k8s::naming::attachment_name(&uuid, "member-node-1");
            member.attachments.insert(
                va.clone(),
                json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
                "metadata": {"name": va, "labels": {"app.kubernetes.io/managed-by": "csi-relay",
                                                    "relay.csi.dev/volume-uuid": uuid}},
                "spec": {"attacher": "hostpath.csi.k8s.io", "nodeName": "member-node-1",
                         "source": {"persistentVolumeName": format!("pv-{uuid}")}},
                "status": {"attached": true}}),
            );
            published = Some((id.clone(), node.clone()));
        }
    }
    let (id, node) = published.expect("the fixture has a published volume");
    let member = Arc::new(std::sync::Mutex::new(member));
    let played = member.clone();
    let _member = tokio::spawn(async move {
        loop {
            let call = member_api.next().await;
            played.lock().unwrap().answer(call);
        }
    });
    let host_node = node.clone();
    let _host = tokio::spawn(async move {
        loop {
            let call = host_api.next().await;
            if call.method == "GET" && call.path == format!("/api/v1/nodes/{host_node}") {
                call.ok(json!({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": host_node, "labels": {
                        TOPOLOGY_MEMBER_KEY: "east", TOPOLOGY_MEMBER_NODE_KEY: "member-node-1"}}}));
            } else {
                call.not_found();
            }
        }
    });

    tokio::time::timeout(
        std::time::Duration::from_secs(120),
        publish::unpublish(
            &d,
            csi::ControllerUnpublishVolumeRequest {
                volume_id: id.clone(),
                node_id: node,
                ..Default::default()
            },
        ),
    )
    .await
    .expect("unpublish in time")
    .expect("unpublish what the old build published");
    for rv in &fixture {
        provision::delete_volume(
            &d,
            csi::DeleteVolumeRequest {
                volume_id: rv["spec"]["volumeId"].as_str().unwrap().into(),
                ..Default::default()
            },
        )
        .await
        .expect("delete what the old build made");
    }
    {
        let left = member.lock().unwrap();
        assert!(
            left.claims.is_empty() && left.attachments.is_empty(),
            "left in the member: {:?} {:?}",
            left.claims.keys(),
            left.attachments.keys()
        );
    }
    for rv in &fixture {
        let id = rv["spec"]["volumeId"].as_str().unwrap();
        assert!(d.find_volume(id).await.unwrap().is_none());
    }
}

/// The rest of a sweep over a member with no claims or attachments of the
/// relay's.
async fn sweep_finds_nothing_else(member: &mut MockApi) {
    member
        .expect("GET", "/api/v1/persistentvolumeclaims")
        .await
        .ok(
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaimList",
                   "metadata": {}, "items": []}),
        );
    member
        .expect("GET", "/apis/storage.k8s.io/v1/volumeattachments")
        .await
        .ok(
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachmentList",
                   "metadata": {}, "items": []}),
        );
    member.expect_idle().await;
}

// A group snapshot whose create never finished (the member refused it, or
// the CO gave up): the CO never got its id, so housekeeping rolls it back,
// member VolumeGroupSnapshot included, and its records go.
#[tokio::test(start_paused = true)]
async fn housekeeping_rolls_back_a_group_snapshot_never_finished() {
    use crate::domain::volume::{Backing, GroupSnapshot, Lifecycle, Snapshot};
    let tmp = tempfile::tempdir().unwrap();
    let (d, mut member, _host) = driver(tmp.path());
    let snap = Snapshot {
        id: "snap-1".into(),
        name: "group-1/m-east-0123456789abcdef0123456789abcdef".into(),
        source_volume_id: "m-east-0123456789abcdef0123456789abcdef".into(),
        size_bytes: 1 << 30,
        backing: Backing::Member {
            member: "east".into(),
            namespace: "relay".into(),
            pvc: "relay-0123456789abcdef0123456789abcdef".into(),
            selected_node: None,
            claim_uid: None,
        },
        created_unix: 0,
        created_nanos: 0,
        lifecycle: Lifecycle::Provisioning,
        parameters: Default::default(),
        group_snapshot_id: Some("group-1".into()),
        allocated_bytes: None,
        member_snapshot: Some("snapshot-abc".into()),
    };
    let group = GroupSnapshot {
        id: "group-1".into(),
        name: "g1".into(),
        source_volume_ids: vec![snap.source_volume_id.clone()],
        snapshot_ids: vec![snap.id.clone()],
        created_unix: 0,
        created_nanos: 0,
        lifecycle: Lifecycle::Provisioning,
        parameters: Default::default(),
    };
    let (s, g) = (snap.clone(), group.clone());
    d.db(move |st| {
        st.put_group(&g)?;
        st.put_snapshot(&s)
    })
    .await
    .unwrap();
    let (report, ()) = tokio::join!(crate::ops::housekeeping::sweep(&d), async {
        member.expect("GET", "/apis").await.ok(json!({
            "kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": "groupsnapshot.storage.k8s.io",
                 "versions": [{"groupVersion": "groupsnapshot.storage.k8s.io/v1beta1", "version": "v1beta1"}],
                 "preferredVersion": {"groupVersion": "groupsnapshot.storage.k8s.io/v1beta1", "version": "v1beta1"}}]}));
        member
            .expect(
                "DELETE",
                "/apis/groupsnapshot.storage.k8s.io/v1beta1/namespaces/relay/volumegroupsnapshots/relay-group-1",
            )
            .await
            .ok(json!({"kind": "Status", "apiVersion": "v1", "status": "Success"}));
        sweep_finds_nothing_else(&mut member).await;
    });
    let report = report.unwrap();
    assert_eq!(report.expired_group_snapshots, 1, "{report:?}");
    assert_eq!(d.db(|st| st.group("group-1")).await.unwrap(), None);
    assert_eq!(d.db(|st| st.snapshot("snap-1")).await.unwrap(), None);
    // A group being cut now (not stale) is left to its call.
    let mut fresh = group.clone();
    fresh.created_unix = crate::ops::driver::now().0;
    d.db(move |st| st.put_group(&fresh)).await.unwrap();
    let (report, ()) = tokio::join!(crate::ops::housekeeping::sweep(&d), async {
        sweep_finds_nothing_else(&mut member).await;
    });
    assert_eq!(report.unwrap().expired_group_snapshots, 0);
    assert!(d.db(|st| st.group("group-1")).await.unwrap().is_some());
}
