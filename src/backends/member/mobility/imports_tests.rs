//! Global storage against scripted API servers (host, members east and
//! west): the topology a shared volume gets, the import made before
//! ControllerPublishVolume answers, the single-writer refusal across
//! members, and the import's removal.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Value};
use tonic::Code;

use super::super::*;
use crate::domain::capability::{AccessMode, Capability};
use crate::domain::volume::{Attachment, Lifecycle, NodeRecord, Progress};
use crate::grpc::status::CsiCode;
use crate::k8s::testing::{self, MockApi};

const PVCS: &str = "/api/v1/namespaces/relay/persistentvolumeclaims";
const PODS: &str = "/api/v1/namespaces/relay/pods";

struct Clusters {
    b: MemberBackend,
    east: MockApi,
    west: MockApi,
    host: MockApi,
}

fn clusters() -> Clusters {
    let (e, east) = testing::member("east");
    let (w, west) = testing::member("west");
    let (h, host) = testing::host();
    Clusters {
        b: MemberBackend::new(vec![e, w], Some(h), "relay.csi.dev"),
        east,
        west,
        host,
    }
}

fn shared_params(mode_paths: bool) -> BTreeMap<String, String> {
    let mut p: BTreeMap<String, String> = [
        ("memberNamespace", "relay"),
        ("sharedWith", "east,west"),
        ("csi.storage.k8s.io/pvc/name", "data"),
        ("csi.storage.k8s.io/pvc/namespace", "shop"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    if mode_paths {
        p.insert("sharedPaths".into(), "east=/mnt/east,west=/mnt/west".into());
    }
    p
}

fn cap(mode: AccessMode) -> Capability {
    Capability::mount(mode)
}

/// A shared volume as made before gating (`access`): its origin claim
/// under the host claim's name, which these tests cover; gated volumes
/// are `access_tests`'.
fn shared_volume(b: &MemberBackend, mode: AccessMode) -> Volume {
    let mut vol = placed_volume(b, mode);
    if let Backing::Member { pvc, .. } = &mut vol.backing {
        *pvc = "data".into();
    }
    vol
}

pub(super) fn placed_volume(b: &MemberBackend, mode: AccessMode) -> Volume {
    volume_placed_in_east(b, "pvc-77", shared_params(true), mode)
}

/// A volume of `parameters` that CreateVolume placed in east.
pub(super) fn volume_placed_in_east(
    b: &MemberBackend,
    name: &str,
    parameters: BTreeMap<String, String>,
    mode: AccessMode,
) -> Volume {
    let map: HashMap<String, String> = parameters.clone().into_iter().collect();
    let typed: VolumeParams = params::decode(&map, "parameters").unwrap();
    let req = csi::TopologyRequirement {
        requisite: vec![],
        preferred: vec![csi::Topology {
            segments: [(TOPOLOGY_MEMBER_KEY.to_string(), "east".to_string())].into(),
        }],
    };
    let placed = b
        .place(name, &typed, &[cap(mode)], Some(&req), None)
        .unwrap();
    Volume {
        id: placed.id,
        name: name.into(),
        capacity_bytes: 1 << 30,
        backing: placed.backing,
        capabilities: vec![cap(mode)],
        parameters,
        mutable_parameters: BTreeMap::new(),
        source: None,
        topology: placed.topology,
        context: placed.context,
        created_unix: 0,
        lifecycle: Lifecycle::Ready,
        ephemeral: false,
        nodes: BTreeMap::new(),
    }
}

fn on_node(vol: &mut Volume, node: &str, context: BTreeMap<String, String>, progress: Progress) {
    vol.nodes.insert(
        node.into(),
        NodeRecord {
            attachment: Some(Attachment {
                readonly: false,
                capability: vol.capabilities[0].clone(),
                publish_context: context,
                progress,
            }),
            ..Default::default()
        },
    );
}

fn claim_of(vol: &Volume, phase: &str, pv: Option<&str>) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data", "namespace": "relay", "uid": "c-1",
                     "annotations": {naming::VOLUME_ID_ANNOTATION: vol.id}},
        "spec": {"volumeName": pv},
        "status": {"phase": phase}
    })
}

/// Host node host-w, asked twice, stands for west's node west-1.
async fn host_w_in_west(host: &mut MockApi) {
    for _ in 0..2 {
        host.expect("GET", "/api/v1/nodes/host-w")
            .await
            .ok(host_node("host-w", "west", "west-1"));
    }
}

/// East, the origin, while west imports: nobody uses the volume there, and
/// its claim and bound PV are read for the import.
async fn east_unused_origin(east: &mut MockApi, vol: &Volume) {
    east.expect("GET", &format!("{PVCS}/data"))
        .await
        .ok(claim_of(vol, "Bound", Some("pvc-e1")));
    east.expect_page(PODS).await.ok(pods(vec![]));
    east.expect("GET", &format!("{PVCS}/data"))
        .await
        .ok(claim_of(vol, "Bound", Some("pvc-e1")));
    east.expect("GET", "/api/v1/persistentvolumes/pvc-e1")
        .await
        .ok(origin_pv());
    east.expect_idle().await;
}

/// West, once its import claim is made: Bound, then read again with its PV
/// for the publish.
async fn west_import_bound(west: &mut MockApi, vol: &Volume, pv: Value, pv_name: &str) {
    west.expect("GET", &format!("{PVCS}/data"))
        .await
        .ok(claim_of(vol, "Bound", Some(pv_name)));
    west.expect("GET", &format!("{PVCS}/data"))
        .await
        .ok(claim_of(vol, "Bound", Some(pv_name)));
    let mut bound = pv;
    bound["metadata"]["name"] = json!(pv_name);
    west.expect("GET", &format!("/api/v1/persistentvolumes/{pv_name}"))
        .await
        .ok(bound);
    west.expect_idle().await;
}

fn origin_pv() -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pvc-e1"},
           "spec": {"hostPath": {"path": "/mnt/east/vols/pvc-e1_relay_data", "type": "DirectoryOrCreate"},
                    "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Delete",
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": ["east-1"]}]}]}}}})
}

fn host_node(name: &str, member: &str, member_node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        TOPOLOGY_MEMBER_KEY: member, TOPOLOGY_MEMBER_NODE_KEY: member_node}}})
}

fn pods(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
}

fn pod_using(name: &str, node: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": "relay"},
           "spec": {"nodeName": node, "containers": [],
                    "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]},
           "status": {"phase": "Running"}})
}

#[tokio::test]
async fn a_shared_volume_is_reachable_from_every_sharing_member() {
    let c = clusters();
    let vol = shared_volume(&c.b, AccessMode::SingleNodeWriter);
    assert!(vol.id.starts_with("m-east-"), "{}", vol.id);
    let members: Vec<&str> = vol
        .topology
        .iter()
        .map(|t| t[TOPOLOGY_MEMBER_KEY].as_str())
        .collect();
    assert_eq!(members, ["east", "west"], "the origin first");
    let typed: VolumeParams =
        params::decode(&shared_params(false).into_iter().collect(), "parameters").unwrap();
    let west = [(TOPOLOGY_MEMBER_KEY.to_string(), "west".to_string())].into();
    assert!(c.b.serves_topology(&typed, &west));
    let mut bad = typed.clone();
    bad.shared_with = Some("east,north".into());
    let err = c.b.check_parameters(&bad).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.to_string().contains("\"north\""), "{err}");
    let mut outside = typed;
    outside.member = Some("north".into());
    outside.shared_with = Some("east,west".into());
    assert_eq!(
        c.b.check_parameters(&outside).unwrap_err().code(),
        Code::InvalidArgument
    );
}

/// A host node of west uses a volume east made: the import (PV with the
/// same directory under west's mount, Retain, pre-bound; its claim named
/// as the origin's) exists and is Bound before the call answers, and the
/// node is sent west's path.
#[tokio::test(start_paused = true)]
async fn publish_in_another_member_imports_the_volume_first() {
    let Clusters {
        b,
        mut east,
        mut west,
        mut host,
    } = clusters();
    let mut vol = shared_volume(&b, AccessMode::SingleNodeWriter);
    on_node(&mut vol, "host-w", BTreeMap::new(), Progress::Applying);
    let pv_name = import::pv_name(&MemberVolume::of(&vol).unwrap().uuid);
    let (result, (), (), ()) = tokio::join!(
        b.attach(&vol, "host-w"),
        host_w_in_west(&mut host),
        // Single writer: nobody in east uses it.
        east_unused_origin(&mut east, &vol),
        async {
            let made = west.expect("POST", "/api/v1/persistentvolumes").await;
            let spec = &made.body["spec"];
            assert_eq!(
                spec["hostPath"],
                json!({"path": "/mnt/west/vols/pvc-e1_relay_data", "type": "Directory"})
            );
            assert_eq!(spec["persistentVolumeReclaimPolicy"], "Retain");
            assert_eq!(spec["storageClassName"], "");
            assert_eq!(spec["claimRef"]["name"], "data");
            assert_eq!(spec["claimRef"]["namespace"], "relay");
            assert!(spec.get("nodeAffinity").is_none(), "{spec}");
            assert_eq!(
                made.body["metadata"]["labels"][import::IMPORTED_FROM_LABEL],
                "east"
            );
            let pv = made.body.clone();
            made.created();
            let claim = west.expect("POST", PVCS).await;
            assert_eq!(claim.body["spec"]["volumeName"], pv_name);
            assert_eq!(claim.body["spec"]["storageClassName"], "");
            assert_eq!(
                claim.body["metadata"]["annotations"][naming::VOLUME_ID_ANNOTATION],
                vol.id
            );
            assert_eq!(
                claim.body["metadata"]["labels"][import::IMPORTED_FROM_LABEL],
                "east"
            );
            claim.created();
            // Bound, then the publish as for any member volume, in west.
            west_import_bound(&mut west, &vol, pv, &pv_name).await;
        }
    );
    let ctx = result.unwrap();
    assert_eq!(ctx[source::MEMBER], "west");
    assert_eq!(ctx[source::HOST_PATH], "/mnt/west/vols/pvc-e1_relay_data");
    assert_eq!(ctx[source::MEMBER_NODE], "west-1");
}

#[tokio::test(start_paused = true)]
async fn a_single_writer_is_refused_while_another_member_uses_the_volume() {
    let Clusters {
        b,
        mut east,
        west: _west,
        mut host,
    } = clusters();
    let mut vol = shared_volume(&b, AccessMode::SingleNodeWriter);
    on_node(&mut vol, "host-w", BTreeMap::new(), Progress::Applying);
    let (result, (), ()) = tokio::join!(
        b.attach(&vol, "host-w"),
        async {
            host.expect("GET", "/api/v1/nodes/host-w")
                .await
                .ok(host_node("host-w", "west", "west-1"));
        },
        async {
            east.expect("GET", &format!("{PVCS}/data"))
                .await
                .ok(claim_of(&vol, "Bound", Some("pvc-e1")));
            // A pod no node took yet mounts nothing; the other does.
            let mut waiting = pod_using("waits", "x");
            waiting["spec"]["nodeName"] = Value::Null;
            east.expect_page(PODS)
                .await
                .ok(pods(vec![waiting, pod_using("app-0", "east-1")]));
            east.expect_idle().await;
        }
    );
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("member cluster east by pod relay/app-0 on node east-1"),
        "{msg}"
    );
    assert!(!msg.contains("waits"), "{msg}");

    // Many writers: nobody is asked.
    let mut rwx = shared_volume(&b, AccessMode::MultiNodeMultiWriter);
    on_node(&mut rwx, "host-e", BTreeMap::new(), Progress::Applying);
    assert!(!writes_alone(&rwx, "host-e"));
    assert!(writes_alone(&vol, "host-w"));
}

/// The last node of west lets go: the import's claim, then its PV go
/// (conditional on their uids); a pod of west still using it keeps it.
#[tokio::test(start_paused = true)]
async fn unpublish_removes_the_import_once_no_pod_uses_it() {
    let Clusters {
        b,
        east: _east,
        mut west,
        host: _host,
    } = clusters();
    let mut vol = shared_volume(&b, AccessMode::SingleNodeWriter);
    let ctx: BTreeMap<String, String> = [(source::MEMBER.to_string(), "west".to_string())].into();
    on_node(&mut vol, "host-w", ctx, Progress::Done);
    let pv_name = import::pv_name(&MemberVolume::of(&vol).unwrap().uuid);
    let import_pv = json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": pv_name, "uid": "p-1", "labels": {
            naming::VOLUME_UUID_LABEL: MemberVolume::of(&vol).unwrap().uuid,
            import::IMPORTED_FROM_LABEL: "east"}}});
    let mut imported = claim_of(&vol, "Bound", Some(&pv_name));
    imported["metadata"]["labels"] = json!({import::IMPORTED_FROM_LABEL: "east"});
    let (result, ()) = tokio::join!(b.detach(&vol, "host-w"), async {
        west.expect("GET", &format!("{PVCS}/data"))
            .await
            .ok(imported.clone());
        west.expect_page(PODS)
            .await
            .ok(pods(vec![pod_using("app-0", "west-1")]));
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(
        err.to_string().contains("pod relay/app-0 on node west-1"),
        "{err}"
    );

    let (result, ()) = tokio::join!(b.detach(&vol, "host-w"), async {
        west.expect("GET", &format!("{PVCS}/data"))
            .await
            .ok(imported.clone());
        west.expect_page(PODS).await.ok(pods(vec![]));
        let del = west.expect("DELETE", &format!("{PVCS}/data")).await;
        assert_eq!(del.body["preconditions"]["uid"], "c-1");
        del.ok(imported);
        west.expect("GET", &format!("/api/v1/persistentvolumes/{pv_name}"))
            .await
            .ok(import_pv.clone());
        let del = west
            .expect("DELETE", &format!("/api/v1/persistentvolumes/{pv_name}"))
            .await;
        assert_eq!(del.body["preconditions"]["uid"], "p-1");
        del.ok(import_pv.clone());
        west.expect_idle().await;
    });
    result.unwrap();

    // Another node still uses it in west: kept, nothing asked.
    let ctx: BTreeMap<String, String> = [(source::MEMBER.to_string(), "west".to_string())].into();
    on_node(&mut vol, "host-w2", ctx, Progress::Done);
    let (result, ()) = tokio::join!(b.detach(&vol, "host-w"), west.expect_idle());
    result.unwrap();
}

/// DeleteVolume: imports first (a claim of another owner under the name
/// is left alone), then the origin's claim.
#[tokio::test(start_paused = true)]
async fn delete_removes_imports_before_the_data() {
    let Clusters {
        b,
        mut east,
        mut west,
        mut host,
    } = clusters();
    let vol = shared_volume(&b, AccessMode::MultiNodeMultiWriter);
    let pv_name = import::pv_name(&MemberVolume::of(&vol).unwrap().uuid);
    let west_done = std::sync::atomic::AtomicBool::new(false);
    let (result, (), (), ()) = tokio::join!(
        b.delete_volume(&vol),
        async {
            let mut foreign = claim_of(&vol, "Bound", Some("theirs"));
            foreign["metadata"]["annotations"] = json!({});
            west.expect("GET", &format!("{PVCS}/data"))
                .await
                .ok(foreign.clone());
            west.expect("GET", &format!("/api/v1/persistentvolumes/{pv_name}"))
                .await
                .not_found();
            // Kosmos's empty copy of the host claim is looked for; a
            // claim that is not one is left.
            west.expect("GET", &format!("{PVCS}/data"))
                .await
                .ok(foreign);
            west_done.store(true, std::sync::atomic::Ordering::SeqCst);
            west.expect_idle().await;
        },
        async {
            // Kosmos's copy of the import PV in the host, if it outlived it.
            host.expect("GET", &format!("/api/v1/persistentvolumes/{pv_name}"))
                .await
                .not_found();
            host.expect_idle().await;
        },
        async {
            let get = east.expect("GET", &format!("{PVCS}/data")).await;
            assert!(
                west_done.load(std::sync::atomic::Ordering::SeqCst),
                "the origin's claim is looked at only once the import is gone"
            );
            get.ok(claim_of(&vol, "Bound", Some("pvc-e1")));
            east.expect("DELETE", &format!("{PVCS}/data"))
                .await
                .ok(claim_of(&vol, "Bound", Some("pvc-e1")));
            east.expect_idle().await;
        }
    );
    result.unwrap();
}

/// A first consumer in another sharing member: the volume is still made
/// where the class says, since the consumer's member reaches it; a member
/// outside the sharing is still refused.
#[tokio::test]
async fn a_requisite_of_another_sharing_member_is_served() {
    let c = clusters();
    let typed: VolumeParams = params::decode(
        &[
            ("member", "east"),
            ("sharedWith", "east,west"),
            ("memberNamespace", "relay"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        "parameters",
    )
    .unwrap();
    let only = |m: &str| csi::TopologyRequirement {
        requisite: vec![csi::Topology {
            segments: [(TOPOLOGY_MEMBER_KEY.to_string(), m.to_string())].into(),
        }],
        preferred: vec![],
    };
    let caps = [cap(AccessMode::SingleNodeWriter)];
    let placed =
        c.b.place("pvc-1", &typed, &caps, Some(&only("west")), None)
            .unwrap();
    assert!(placed.id.starts_with("m-east-"), "{}", placed.id);
    let mut alone = typed.clone();
    alone.shared_with = None;
    let err =
        c.b.place("pvc-1", &alone, &caps, Some(&only("west")), None)
            .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
}

/// CreateVolume of a shared volume records where its data lies, once
/// bound; a volume of one member records nothing.
#[tokio::test(start_paused = true)]
async fn a_bound_shared_volume_records_its_source_in_its_context() {
    let Clusters { b, mut east, .. } = clusters();
    let vol = shared_volume(&b, AccessMode::SingleNodeWriter);
    let (got, ()) = tokio::join!(b.created_context(&vol), async {
        east.expect("GET", &format!("{PVCS}/data"))
            .await
            .ok(claim_of(&vol, "Bound", Some("pvc-e1")));
        east.expect("GET", "/api/v1/persistentvolumes/pvc-e1")
            .await
            .ok(origin_pv());
    });
    let got = got.unwrap();
    let pv = import::from_recorded(&got[import::SHARED_SOURCE_KEY]).unwrap();
    let spec = pv.spec.unwrap();
    assert_eq!(
        spec.host_path.unwrap().path,
        "/mnt/east/vols/pvc-e1_relay_data"
    );
    assert!(spec.node_affinity.is_none() && spec.claim_ref.is_none());
    let (got, ()) = tokio::join!(b.created_context(&vol), async {
        east.expect("GET", &format!("{PVCS}/data"))
            .await
            .ok(claim_of(&vol, "Pending", None));
    });
    assert!(
        got.unwrap().is_empty(),
        "a claim that binds later: nothing yet"
    );
    let mut single = vol.clone();
    single.parameters.remove("sharedWith");
    single.parameters.remove("sharedPaths");
    assert!(b.created_context(&single).await.unwrap().is_empty());
}

/// With the member that made it declared lost, the import is made from
/// what the host PV recorded; the lost member is never asked.
#[tokio::test(start_paused = true)]
async fn a_lost_origin_is_imported_from_the_host_pvs_record() {
    let (e, _east) = testing::member("east");
    let (w, mut west) = testing::member("west");
    let (h, mut host) = testing::host();
    let b = MemberBackend::new(vec![e, w], Some(h), "relay.csi.dev")
        .with_lost_members(["east".to_string()]);
    let mut vol = shared_volume(&b, AccessMode::SingleNodeWriter);
    on_node(&mut vol, "host-w", BTreeMap::new(), Progress::Applying);
    let recorded = import::recorded(&serde_json::from_value(origin_pv()).unwrap()).unwrap();
    let host_pv = |attributes: Value| {
        json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pvc-77"},
               "spec": {"csi": {"driver": "relay.csi.dev", "volumeHandle": vol.id,
                                "volumeAttributes": attributes}}})
    };
    // Nothing recorded: refused, saying why.
    let (result, ()) = tokio::join!(b.attach(&vol, "host-w"), async {
        host.expect("GET", "/api/v1/nodes/host-w")
            .await
            .ok(host_node("host-w", "west", "west-1"));
        host.expect("GET", "/api/v1/persistentvolumes/pvc-77")
            .await
            .ok(host_pv(json!({})));
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(
        err.to_string().contains("records no shared source"),
        "{err}"
    );

    let pv_name = import::pv_name(&MemberVolume::of(&vol).unwrap().uuid);
    let (result, (), ()) = tokio::join!(
        b.attach(&vol, "host-w"),
        async {
            host.expect("GET", "/api/v1/nodes/host-w")
                .await
                .ok(host_node("host-w", "west", "west-1"));
            host.expect("GET", "/api/v1/persistentvolumes/pvc-77")
                .await
                .ok(host_pv(json!({import::SHARED_SOURCE_KEY: recorded})));
            host.expect("GET", "/api/v1/nodes/host-w")
                .await
                .ok(host_node("host-w", "west", "west-1"));
        },
        async {
            let made = west.expect("POST", "/api/v1/persistentvolumes").await;
            assert_eq!(
                made.body["spec"]["hostPath"]["path"],
                "/mnt/west/vols/pvc-e1_relay_data"
            );
            let pv = made.body.clone();
            made.created();
            west.expect("POST", PVCS).await.created();
            west.expect("GET", &format!("{PVCS}/data"))
                .await
                .ok(claim_of(&vol, "Bound", Some(&pv_name)));
            west.expect("GET", &format!("{PVCS}/data"))
                .await
                .ok(claim_of(&vol, "Bound", Some(&pv_name)));
            west.expect("GET", &format!("/api/v1/persistentvolumes/{pv_name}"))
                .await
                .ok(pv);
            west.expect_idle().await;
        }
    );
    assert_eq!(result.unwrap()[source::MEMBER], "west");
}

/// A PV of the import's name that is not the relay's import of this
/// volume is never adopted: ALREADY_EXISTS, and no claim is made.
#[tokio::test(start_paused = true)]
async fn a_foreign_pv_under_the_imports_name_is_refused() {
    let (w, mut west) = testing::member("west");
    let (vol, at, pv, claim) = west_import();
    let (result, ()) = tokio::join!(
        import::ensure(
            &w,
            &at,
            &pv,
            &claim,
            &vol.id,
            std::time::Duration::from_secs(8)
        ),
        async {
            west.expect("POST", "/api/v1/persistentvolumes")
                .await
                .already_exists();
            let mut theirs = pv.clone();
            theirs.metadata.labels = None;
            west.expect(
                "GET",
                &format!("/api/v1/persistentvolumes/{}", import::pv_name(&at.uuid)),
            )
            .await
            .ok(serde_json::to_value(&theirs).unwrap());
            west.expect_idle().await;
        }
    );
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err}");
    assert!(err.to_string().contains("never adopts"), "{err}");
}

/// The manifests of west's import of a volume east made.
fn west_import() -> (
    Volume,
    MemberVolume,
    k8s_openapi::api::core::v1::PersistentVolume,
    k8s_openapi::api::core::v1::PersistentVolumeClaim,
) {
    let vol = shared_volume(&clusters().b, AccessMode::SingleNodeWriter);
    let at = MemberVolume::of(&vol).unwrap();
    let sharing = Sharing::of(
        &params::decode(&vol.parameters.clone().into_iter().collect(), "parameters").unwrap(),
    )
    .unwrap()
    .unwrap();
    let pv = import::pv_manifest(
        &vol,
        &at,
        &serde_json::from_value(origin_pv()).unwrap(),
        &sharing,
        "west",
        "relay.csi.dev",
    )
    .unwrap();
    let claim = import::claim_manifest(&at, &pv, Default::default());
    (vol, at, pv, claim)
}

/// An import PV left from an earlier import (its claim deleted, a crash
/// before the PV went) still names the old claim's uid: the member's PV
/// controller would never bind it to the new claim, so the relay clears
/// that uid, on that PV only (its own uid a precondition).
#[tokio::test(start_paused = true)]
async fn an_import_pv_kept_from_an_earlier_claim_is_released_for_the_new_one() {
    let (w, mut west) = testing::member("west");
    let (vol, at, pv, claim) = west_import();
    let pv_path = format!("/api/v1/persistentvolumes/{}", import::pv_name(&at.uuid));
    let (result, ()) = tokio::join!(
        import::ensure(
            &w,
            &at,
            &pv,
            &claim,
            &vol.id,
            std::time::Duration::from_secs(30)
        ),
        async {
            let made = west.expect("POST", "/api/v1/persistentvolumes").await;
            let mut kept = made.body.clone();
            kept["metadata"]["uid"] = json!("pv-uid");
            kept["spec"]["claimRef"]["uid"] = json!("old-claim");
            made.already_exists();
            west.expect("GET", &pv_path).await.ok(kept.clone());
            let made = west.expect("POST", PVCS).await;
            let mut created = made.body.clone();
            created["metadata"]["uid"] = json!("new-claim");
            made.reply(201, created.clone());
            let patch = west.expect("PATCH", &pv_path).await;
            assert_eq!(patch.body["metadata"]["uid"], "pv-uid", "{}", patch.body);
            let claim_ref = &patch.body["spec"]["claimRef"];
            assert!(
                claim_ref.get("uid").is_some_and(Value::is_null),
                "{}",
                patch.body
            );
            kept["spec"]["claimRef"]["uid"] = Value::Null;
            patch.ok(kept);
            let mut bound = created;
            bound["status"] = json!({"phase": "Bound"});
            west.expect("GET", &format!("{PVCS}/data")).await.ok(bound);
            west.expect_idle().await;
        }
    );
    result.unwrap();
}

/// An import claim the member does not bind in time is UNAVAILABLE naming
/// the claim, its phase and the PV, for the CO to retry; nothing is undone
/// (the attachment's intent is recorded, and unpublish removes both).
#[tokio::test(start_paused = true)]
async fn an_import_claim_not_bound_in_time_is_unavailable_naming_it() {
    let (w, mut west) = testing::member("west");
    let (vol, at, pv, claim) = west_import();
    let ensure = import::ensure(
        &w,
        &at,
        &pv,
        &claim,
        &vol.id,
        std::time::Duration::from_secs(8),
    );
    tokio::pin!(ensure);
    let mut reads = 0;
    let mut nudges = 0;
    let mut pending = serde_json::to_value(&claim).unwrap();
    pending["metadata"]["uid"] = json!("c-9");
    pending["status"] = json!({"phase": "Pending"});
    let result = loop {
        tokio::select! {
            r = &mut ensure => break r,
            call = west.next() => match (call.method.as_str(), call.path.as_str()) {
                ("POST", path) if path.ends_with("/persistentvolumeclaims") => {
                    call.reply(201, pending.clone())
                }
                ("POST", _) => call.created(),
                ("GET", path) if path.ends_with("/persistentvolumeclaims/data") => {
                    reads += 1;
                    call.ok(pending.clone())
                }
                // The PV side is done (it names the claim's uid): the
                // claim is nudged, once.
                ("GET", path) if path.contains("/persistentvolumes/") => {
                    let mut bound = serde_json::to_value(&pv).unwrap();
                    bound["spec"]["claimRef"]["uid"] = json!("c-9");
                    call.ok(bound)
                }
                ("PATCH", path) if path.ends_with("/persistentvolumeclaims/data") => {
                    nudges += 1;
                    assert_eq!(call.body["metadata"]["uid"], "c-9", "{}", call.body);
                    assert!(call.body["metadata"]["annotations"]["relay.csi.dev/bind-nudged"].is_string());
                    call.ok(pending.clone())
                }
                (m, p) => panic!("unexpected {m} {p}"),
            },
        }
    };
    assert_eq!(nudges, 1);
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    let pv_name = import::pv_name(&at.uuid);
    assert!(
        err.to_string().contains(&format!(
            "import claim relay/data is Pending, not yet Bound to PersistentVolume {pv_name}, after 8 s"
        )),
        "{err}"
    );
    assert!(
        reads >= 2,
        "the claim was read again while waiting ({reads})"
    );
}

/// The shared source a volume's context keeps is bounded both ways: a PV
/// whose description is too long is refused when recorded (the call says
/// which PV and how long), and a record too long is refused when read.
#[test]
fn the_recorded_shared_source_is_bounded() {
    let mut pv: k8s_openapi::api::core::v1::PersistentVolume =
        serde_json::from_value(origin_pv()).unwrap();
    let text = import::recorded(&pv).unwrap();
    assert!(import::from_recorded(&text).is_ok());
    pv.spec.as_mut().unwrap().mount_options = Some(vec!["x".repeat(1024); 17]);
    let err = import::recorded(&pv).unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.to_string().contains("PersistentVolume pvc-e1"), "{err}");
    let long = format!("{{\"x\": \"{}\"}}", "y".repeat(17 * 1024));
    assert!(import::from_recorded(&long)
        .unwrap_err()
        .contains("more than"));
}

/// Issue 61's stuck import: in west, a Kosmos copy of the host claim holds
/// the name. It inherited the relay's marks (Kosmos copies a member claim's
/// labels and annotations onto the host claim, and its copies carry them),
/// but it names the host's class and PV and is Lost. The relay replaces it
/// (uid precondition) with its import claim, instead of waiting on it.
#[tokio::test(start_paused = true)]
async fn an_import_replaces_a_kosmos_copy_that_inherited_the_relays_marks() {
    let Clusters {
        b,
        mut east,
        mut west,
        mut host,
    } = clusters();
    let mut vol = shared_volume(&b, AccessMode::SingleNodeWriter);
    on_node(&mut vol, "host-w", BTreeMap::new(), Progress::Applying);
    let uuid = MemberVolume::of(&vol).unwrap().uuid;
    let pv_name = import::pv_name(&uuid);
    let mut copy = claim_of(&vol, "Lost", Some("pvc-host-1"));
    copy["metadata"]["uid"] = json!("u-kosmos");
    copy["metadata"]["annotations"]["kosmos.io/global"] = json!("true");
    copy["metadata"]["labels"] = json!({
        naming::VOLUME_UUID_LABEL: uuid,
        import::IMPORTED_FROM_LABEL: "east",
        "app.kubernetes.io/managed-by": "csi-relay",
    });
    copy["spec"]["storageClassName"] = json!("relay-shared");
    let (result, (), (), ()) = tokio::join!(
        b.attach(&vol, "host-w"),
        host_w_in_west(&mut host),
        east_unused_origin(&mut east, &vol),
        async {
            let made = west.expect("POST", "/api/v1/persistentvolumes").await;
            let pv = made.body.clone();
            made.created();
            // The copy holds the name.
            west.expect("POST", PVCS).await.already_exists();
            west.expect("GET", &format!("{PVCS}/data"))
                .await
                .ok(copy.clone());
            let del = west.expect("DELETE", &format!("{PVCS}/data")).await;
            assert_eq!(del.body["preconditions"]["uid"], "u-kosmos");
            del.ok(copy.clone());
            west.expect("GET", &format!("{PVCS}/data"))
                .await
                .not_found();
            let claim = west.expect("POST", PVCS).await;
            assert_eq!(claim.body["spec"]["volumeName"], pv_name);
            claim.created();
            west_import_bound(&mut west, &vol, pv, &pv_name).await;
        }
    );
    let ctx = result.unwrap();
    assert_eq!(ctx[source::MEMBER], "west");
}

#[path = "access_tests.rs"]
mod gated;

#[path = "home_tests.rs"]
mod moves;

#[path = "imports_crash_tests.rs"]
mod crash;
