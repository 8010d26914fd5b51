//! MemberBackend against a scripted API: the exact requests (method, path,
//! body fields) and the CSI codes each answer produces.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde_json::{json, Value};
use tonic::Code;

use super::*;
use crate::domain::capability::{AccessMode, AccessType, Capability};
use crate::domain::volume::{Attachment, Lifecycle, NodeRecord};
use crate::grpc::status::CsiCode;
use crate::k8s::testing::{self, MockApi};

const PVCS: &str = "/api/v1/namespaces/relay/persistentvolumeclaims";

fn mount(mode: AccessMode) -> Capability {
    Capability {
        mode,
        access: AccessType::Mount {
            fs_type: String::new(),
            mount_flags: vec![],
            volume_mount_group: String::new(),
        },
    }
}

fn block(mode: AccessMode) -> Capability {
    Capability {
        mode,
        access: AccessType::Block,
    }
}

fn topo(pairs: &[(&str, &str)]) -> csi::Topology {
    csi::Topology {
        segments: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

fn params(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A backend with member "east" (and "west" when asked), no host cluster.
fn east() -> (MemberBackend, MockApi) {
    let (cluster, api) = testing::member("east");
    (
        MemberBackend::new(vec![cluster], None, "relay.csi.dev"),
        api,
    )
}

fn with_host() -> (MemberBackend, MockApi, MockApi) {
    let (cluster, api) = testing::member("east");
    let (host, host_api) = testing::host();
    (
        MemberBackend::new(vec![cluster], Some(host), "relay.csi.dev"),
        api,
        host_api,
    )
}

fn volume(
    b: &MemberBackend,
    parameters: BTreeMap<String, String>,
    caps: Vec<Capability>,
    req: Option<&csi::TopologyRequirement>,
) -> Volume {
    volume_named(b, "pvc-0a1b", parameters, caps, req)
}

fn volume_named(
    b: &MemberBackend,
    name: &str,
    parameters: BTreeMap<String, String>,
    caps: Vec<Capability>,
    req: Option<&csi::TopologyRequirement>,
) -> Volume {
    let map: HashMap<String, String> = parameters.clone().into_iter().collect();
    let typed: VolumeParams = params::decode(&map, "parameters").unwrap();
    let placed = b.place(name, &typed, &caps, req, None).unwrap();
    Volume {
        id: placed.id,
        name: name.into(),
        capacity_bytes: 1 << 30,
        backing: placed.backing,
        capabilities: caps,
        parameters,
        mutable_parameters: BTreeMap::new(),
        source: None,
        topology: placed.topology,
        context: placed.context,
        created_unix: 0,
        lifecycle: Lifecycle::Provisioning,
        ephemeral: false,
        nodes: BTreeMap::new(),
    }
}

/// A single-node-writer filesystem volume in member namespace "relay".
fn in_relay(b: &MemberBackend) -> Volume {
    volume(
        b,
        params(&[("memberNamespace", "relay")]),
        vec![mount(AccessMode::SingleNodeWriter)],
        None,
    )
}

fn standard(b: &MemberBackend) -> Volume {
    volume(
        b,
        params(&[
            ("memberStorageClass", "fast"),
            ("memberNamespace", "relay"),
            ("csi.storage.k8s.io/pvc/name", "data"),
            ("csi.storage.k8s.io/pvc/namespace", "shop"),
        ]),
        vec![mount(AccessMode::SingleNodeWriter)],
        None,
    )
}

fn pvc_name(vol: &Volume) -> String {
    MemberVolume::of(vol).unwrap().pvc
}

fn claim(vol: &Volume, phase: &str, pv: Option<&str>) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": pvc_name(vol), "namespace": "relay",
                     "annotations": {naming::VOLUME_ID_ANNOTATION: vol.id}},
        "spec": {"volumeName": pv, "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": phase, "capacity": {"storage": "1Gi"}}
    })
}

fn class(mode: &str) -> Value {
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
           "metadata": {"name": "fast"}, "provisioner": "x", "volumeBindingMode": mode})
}

fn node(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
}

fn nfs_pv() -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-9"},
           "spec": {"nfs": {"server": "10.0.0.5", "path": "/exports/9"}}})
}

fn csi_pv() -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-9"},
           "spec": {"csi": {"driver": "disk.csi.example", "volumeHandle": "h-9", "fsType": "ext4"}}})
}

fn attached_to(vol: &mut Volume, node: &str, context: BTreeMap<String, String>) {
    vol.lifecycle = Lifecycle::Ready;
    vol.nodes.insert(
        node.into(),
        NodeRecord {
            attachment: Some(Attachment {
                readonly: false,
                capability: vol.capabilities[0].clone(),
                publish_context: context,
                progress: crate::domain::volume::Progress::Done,
            }),
            ..Default::default()
        },
    );
}

// ---- placement -------------------------------------------------------------

#[tokio::test]
async fn placement_names_the_member_and_a_deterministic_pvc() {
    let (b, _api) = east();
    let vol = standard(&b);
    assert!(
        vol.id.starts_with("m-east-") && vol.id.len() <= 128,
        "{}",
        vol.id
    );
    let at = MemberVolume::of(&vol).unwrap();
    // Named as the host PVC, so a pod mirrored with its claim name finds it.
    assert_eq!(at.pvc, "data");
    assert_eq!(at.namespace, "relay");
    // The id follows from the CSI name: a retry with no record finds it.
    assert_eq!(standard(&b).id, vol.id);
    assert_ne!(
        volume_named(&b, "pvc-other", BTreeMap::new(), vec![], None).id,
        vol.id
    );
    assert_eq!(
        vol.topology,
        vec![BTreeMap::from([(
            TOPOLOGY_MEMBER_KEY.to_string(),
            "east".to_string()
        )])]
    );
    assert_eq!(vol.context[source::MEMBER_PVC], at.pvc);
    let default_ns = volume(&b, BTreeMap::new(), vec![], None);
    let at = MemberVolume::of(&default_ns).unwrap();
    assert_eq!(at.namespace, "default");
    assert_eq!(
        at.pvc,
        format!("relay-{}", at.uuid),
        "no host PVC name: generated"
    );
}

#[tokio::test]
async fn the_member_claim_follows_the_host_claim_unless_told_otherwise() {
    let (b, _api) = east();
    let host = [
        ("csi.storage.k8s.io/pvc/name", "data-0"),
        ("csi.storage.k8s.io/pvc/namespace", "shop"),
    ];
    let at = |extra: &[(&str, &str)]| {
        let mut all = host.to_vec();
        all.extend_from_slice(extra);
        MemberVolume::of(&volume(&b, params(&all), vec![], None)).unwrap()
    };
    let same = at(&[]);
    assert_eq!(
        (same.namespace.as_str(), same.pvc.as_str()),
        ("shop", "data-0")
    );
    let liqo = at(&[("memberNamespace", "${pvc.namespace}-c0ffee")]);
    assert_eq!(liqo.namespace, "shop-c0ffee");
    let fixed = at(&[("memberNamespace", "relay")]);
    assert_eq!(fixed.namespace, "relay");
    let generated = at(&[("memberClaimName", "generated")]);
    assert_eq!(generated.pvc, format!("relay-{}", generated.uuid));
    assert_eq!(generated.namespace, "shop");

    let place = |pairs: &[(&str, &str)]| {
        let map: HashMap<String, String> = params(pairs).into_iter().collect();
        params::decode::<VolumeParams>(&map, "parameters")
            .and_then(|typed| {
                b.check_parameters(&typed)?;
                b.place("pvc-1", &typed, &[], None, None)
            })
            .err()
            .map(|e| (e.code(), e.to_string()))
    };
    let long = "n".repeat(60);
    for (pairs, needle) in [
        // The template needs the host namespace.
        (
            vec![("memberNamespace", "${pvc.namespace}-x")],
            "--extra-create-metadata",
        ),
        // The result must still be a namespace name.
        (
            vec![
                ("memberNamespace", "${pvc.namespace}-c0ffee"),
                ("csi.storage.k8s.io/pvc/namespace", long.as_str()),
                ("csi.storage.k8s.io/pvc/name", "d"),
            ],
            "not a valid namespace name",
        ),
        (vec![("memberNamespace", "Bad_NS")], "memberNamespace"),
        (
            vec![
                ("csi.storage.k8s.io/pvc/name", "../etc"),
                ("csi.storage.k8s.io/pvc/namespace", "shop"),
            ],
            "csi.storage.k8s.io/pvc/name",
        ),
        (vec![("memberClaimName", "mine")], "memberClaimName"),
        (
            vec![("createMemberNamespace", "yes")],
            "createMemberNamespace",
        ),
    ] {
        let (code, msg) = place(&pairs).unwrap_or((Code::Ok, String::new()));
        assert_eq!(code, Code::InvalidArgument, "{pairs:?}: {msg}");
        assert!(msg.contains(needle), "{pairs:?}: {msg}");
    }
}

#[tokio::test]
async fn a_missing_member_namespace_is_named_or_created_when_asked() {
    let (b, mut api) = east();
    let host = [
        ("csi.storage.k8s.io/pvc/name", "data-0"),
        ("csi.storage.k8s.io/pvc/namespace", "shop"),
    ];
    let vol = volume(&b, params(&host), vec![], None);
    let shop_pvcs = "/api/v1/namespaces/shop/persistentvolumeclaims";
    let (result, ()) = tokio::join!(b.create_volume(&vol, None), async {
        api.expect("POST", shop_pvcs).await.status(
            404,
            "NotFound",
            "namespaces \"shop\" not found",
        );
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(err.to_string().contains("createMemberNamespace"), "{err}");
    assert!(err.to_string().contains("\"shop\""), "{err}");

    let mut all = host.to_vec();
    all.push(("createMemberNamespace", "true"));
    let vol = volume(&b, params(&all), vec![], None);
    let (result, ()) = tokio::join!(b.create_volume(&vol, None), async {
        let ns = api.expect("POST", "/api/v1/namespaces").await;
        assert_eq!(ns.body["metadata"]["name"], "shop");
        ns.already_exists();
        let post = api.expect("POST", shop_pvcs).await;
        assert_eq!(post.body["metadata"]["name"], "data-0");
        post.created();
    });
    result.unwrap();
}

#[tokio::test]
async fn placement_follows_parameters_then_topology() {
    let (east, _a) = testing::member("east");
    let (west, _b) = testing::member("west");
    let b = MemberBackend::new(vec![east, west], None, "relay.csi.dev");
    let req = csi::TopologyRequirement {
        requisite: vec![topo(&[
            (TOPOLOGY_MEMBER_KEY, "west"),
            (TOPOLOGY_MEMBER_NODE_KEY, "w-7"),
        ])],
        preferred: vec![topo(&[
            (TOPOLOGY_MEMBER_KEY, "west"),
            (TOPOLOGY_MEMBER_NODE_KEY, "w-7"),
        ])],
    };
    let by_topology = volume(&b, BTreeMap::new(), vec![], Some(&req));
    let at = MemberVolume::of(&by_topology).unwrap();
    assert_eq!(at.member, "west");
    assert_eq!(at.selected_node.as_deref(), Some("w-7"));

    let typed = |m: &str| VolumeParams {
        member: Some(m.into()),
        ..Default::default()
    };
    // The parameter contradicts the requisite topology.
    let err = b
        .place("v", &typed("east"), &[], Some(&req), None)
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err}");
    // Unknown member by parameter.
    let err = b.place("v", &typed("north"), &[], None, None).unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.to_string().contains("north"), "{err}");
    // Two members and nothing to choose by.
    let err = b
        .place("v", &VolumeParams::default(), &[], None, None)
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.to_string().contains(TOPOLOGY_MEMBER_KEY), "{err}");
    // Topology naming only unconfigured members.
    let other = csi::TopologyRequirement {
        requisite: vec![topo(&[(TOPOLOGY_MEMBER_KEY, "south")])],
        preferred: vec![],
    };
    let err = b
        .place("v", &VolumeParams::default(), &[], Some(&other), None)
        .unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
}

#[tokio::test]
async fn parameters_of_the_local_backend_or_bad_names_are_refused() {
    let (b, _api) = east();
    for bad in [
        VolumeParams {
            backing: BackingChoice::Block,
            ..Default::default()
        },
        VolumeParams {
            member_namespace: Some("Not_A_Namespace".into()),
            ..Default::default()
        },
        VolumeParams {
            member_storage_class: Some("bad/class".into()),
            ..Default::default()
        },
    ] {
        assert_eq!(
            b.check_parameters(&bad).unwrap_err().code(),
            Code::InvalidArgument,
            "{bad:?}"
        );
    }
    let seg: HashMap<String, String> = [(TOPOLOGY_MEMBER_KEY.into(), "west".into())].into();
    assert!(!b.serves_topology(&VolumeParams::default(), &seg));
    let seg: HashMap<String, String> = [(TOPOLOGY_MEMBER_KEY.into(), "east".into())].into();
    assert!(b.serves_topology(&VolumeParams::default(), &seg));
}

// ---- CreateVolume ------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn create_posts_the_member_pvc_with_links_back() {
    let (b, mut api) = east();
    let req = csi::TopologyRequirement {
        requisite: vec![],
        preferred: vec![topo(&[
            (TOPOLOGY_MEMBER_KEY, "east"),
            (TOPOLOGY_MEMBER_NODE_KEY, "worker-1"),
        ])],
    };
    let vol = volume(
        &b,
        params(&[
            ("memberStorageClass", "fast"),
            ("memberNamespace", "relay"),
            ("csi.storage.k8s.io/pvc/name", "data"),
            ("csi.storage.k8s.io/pvc/namespace", "shop"),
            ("csi.storage.k8s.io/pv/name", "pvc-0a1b"),
        ]),
        vec![mount(AccessMode::SingleNodeWriter)],
        Some(&req),
    );
    let name = pvc_name(&vol);
    let uuid = MemberVolume::of(&vol).unwrap().uuid;
    let (result, ()) = tokio::join!(b.create_volume(&vol, None), async {
        api.expect("GET", "/apis/storage.k8s.io/v1/storageclasses/fast")
            .await
            .ok(class("WaitForFirstConsumer"));
        let post = api.expect("POST", PVCS).await;
        let body = &post.body;
        assert_eq!(body["metadata"]["name"], name.as_str());
        assert_eq!(body["metadata"]["namespace"], "relay");
        let labels = &body["metadata"]["labels"];
        assert_eq!(labels["app.kubernetes.io/managed-by"], "csi-relay");
        assert_eq!(labels[naming::VOLUME_UUID_LABEL], uuid.as_str());
        assert_eq!(labels[naming::HOST_PVC_NAME], "data");
        assert_eq!(labels[naming::HOST_PVC_NAMESPACE], "shop");
        let ann = &body["metadata"]["annotations"];
        assert_eq!(ann[naming::VOLUME_ID_ANNOTATION], vol.id.as_str());
        assert_eq!(ann[naming::VOLUME_NAME_ANNOTATION], "pvc-0a1b");
        assert_eq!(ann[naming::HOST_PV_NAME], "pvc-0a1b");
        assert_eq!(ann[naming::SELECTED_NODE_ANNOTATION], "worker-1");
        let spec = &body["spec"];
        assert_eq!(spec["storageClassName"], "fast");
        assert_eq!(spec["accessModes"], json!(["ReadWriteOnce"]));
        assert_eq!(spec["volumeMode"], "Filesystem");
        assert_eq!(spec["resources"]["requests"]["storage"], "1Gi");
        assert!(spec.get("dataSource").is_none());
        post.created();
        api.expect_idle().await;
    });
    result.unwrap();
}

#[tokio::test(start_paused = true)]
async fn create_without_class_or_node_is_one_call() {
    let (b, mut api) = east();
    let vol = volume(
        &b,
        params(&[("memberNamespace", "relay")]),
        vec![block(AccessMode::SingleNodeSingleWriter)],
        None,
    );
    let (result, ()) = tokio::join!(b.create_volume(&vol, None), async {
        let post = api.expect("POST", PVCS).await;
        assert!(post.body["spec"].get("storageClassName").is_none());
        assert_eq!(post.body["spec"]["volumeMode"], "Block");
        assert_eq!(
            post.body["spec"]["accessModes"],
            json!(["ReadWriteOncePod"])
        );
        assert!(post.body["metadata"]["annotations"]
            .get(naming::SELECTED_NODE_ANNOTATION)
            .is_none());
        post.created();
        api.expect_idle().await;
    });
    result.unwrap();
}

#[tokio::test(start_paused = true)]
async fn immediate_classes_get_no_selected_node() {
    let (b, mut api) = east();
    let req = csi::TopologyRequirement {
        requisite: vec![],
        preferred: vec![topo(&[
            (TOPOLOGY_MEMBER_KEY, "east"),
            (TOPOLOGY_MEMBER_NODE_KEY, "worker-1"),
        ])],
    };
    let vol = volume(
        &b,
        params(&[("memberStorageClass", "fast"), ("memberNamespace", "relay")]),
        vec![mount(AccessMode::MultiNodeMultiWriter)],
        Some(&req),
    );
    let (result, ()) = tokio::join!(b.create_volume(&vol, None), async {
        api.expect("GET", "/apis/storage.k8s.io/v1/storageclasses/fast")
            .await
            .ok(class("Immediate"));
        let post = api.expect("POST", PVCS).await;
        assert_eq!(post.body["spec"]["accessModes"], json!(["ReadWriteMany"]));
        assert!(post.body["metadata"]["annotations"]
            .get(naming::SELECTED_NODE_ANNOTATION)
            .is_none());
        post.created();
        // The class binds at once: CreateVolume answers once it has.
        api.expect("GET", &format!("{PVCS}/{}", pvc_name(&vol)))
            .await
            .ok(claim(&vol, "Bound", Some("pv-9")));
        api.expect_idle().await;
    });
    result.unwrap();
}

// A member class that binds at once, whose provisioner fails: the host
// claim must not bind over it. CreateVolume waits its bounded time and
// answers UNAVAILABLE with what the member said of this claim.
#[tokio::test(start_paused = true)]
async fn an_immediate_member_claim_that_does_not_bind_is_unavailable_with_the_members_word() {
    let (b, mut api) = east();
    let vol = volume(
        &b,
        params(&[("memberStorageClass", "fast"), ("memberNamespace", "relay")]),
        vec![mount(AccessMode::SingleNodeWriter)],
        None,
    );
    let path = format!("{PVCS}/{}", pvc_name(&vol));
    let create = async {
        let started = tokio::time::Instant::now();
        let result = b.create_volume(&vol, None).await;
        (result, started.elapsed())
    };
    let ((result, took), ()) = tokio::join!(create, async {
        api.expect("GET", "/apis/storage.k8s.io/v1/storageclasses/fast")
            .await
            .ok(class("Immediate"));
        api.expect("POST", PVCS).await.created();
        let mut pending = claim(&vol, "Pending", None);
        pending["metadata"]["uid"] = "uid-1".into();
        pending["spec"]["storageClassName"] = "fast".into();
        // Polled (no watch: the answer had no resourceVersion) until the
        // wait is over, then the member's events of this claim are read.
        loop {
            let call = api.next().await;
            if call.path == path {
                call.ok(pending.clone());
                continue;
            }
            assert_eq!(
                call.path, "/api/v1/namespaces/relay/events",
                "{}",
                call.path
            );
            let fields = call
                .query_map()
                .get("fieldSelector")
                .cloned()
                .unwrap_or_default()
                .replace("%3D", "=")
                .replace("%2C", ",");
            assert!(
                fields.contains(&format!("involvedObject.name={}", pvc_name(&vol)))
                    && fields.contains("type=Warning"),
                "{fields}"
            );
            call.ok(json!({"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": [
                {"metadata": {"name": "e1", "namespace": "relay"},
                 "involvedObject": {"kind": "PersistentVolumeClaim", "name": pvc_name(&vol)},
                 "reason": "ProvisioningFailed", "type": "Warning",
                 "lastTimestamp": "2026-11-28T02:00:00Z",
                 "message": "error generating accessibility requirements: no available topology found"}]}));
            break;
        }
        api.expect_idle().await;
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("is Pending, not Bound, after 8 s")
            && text.contains("the member says ProvisioningFailed: error generating accessibility requirements: no available topology found")
            && text.contains("(retry)"),
        "{text}"
    );
    assert!(
        took >= Duration::from_secs(7) && took <= Duration::from_secs(9),
        "the wait is bounded: {took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn create_retry_adopts_the_pvc_it_made_before() {
    let (b, mut api) = east();
    let vol = in_relay(&b);
    let name = pvc_name(&vol);
    let (result, ()) = tokio::join!(b.create_volume(&vol, None), async {
        api.expect("POST", PVCS).await.already_exists();
        api.expect("GET", &format!("{PVCS}/{name}"))
            .await
            .ok(claim(&vol, "Pending", None));
        api.expect_idle().await;
    });
    result.unwrap();
}

#[tokio::test(start_paused = true)]
async fn create_refuses_a_pvc_of_another_volume() {
    let (b, mut api) = east();
    let vol = in_relay(&b);
    let name = pvc_name(&vol);
    let (result, ()) = tokio::join!(b.create_volume(&vol, None), async {
        api.expect("POST", PVCS).await.already_exists();
        let mut other = claim(&vol, "Bound", Some("pv-1"));
        other["metadata"]["annotations"][naming::VOLUME_ID_ANNOTATION] = "m-east-other".into();
        api.expect("GET", &format!("{PVCS}/{name}")).await.ok(other);
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err}");
    assert!(err.to_string().contains("did not create"), "{err}");
    assert!(err.to_string().contains(&name), "{err}");
}

/// A claim under the name that carries the relay's marks for this very
/// volume (a Kosmos copy that inherited them from the host claim) but the
/// host's class, and is Bound to data: not adopted as the relay's, and not
/// replaced either, since it holds data.
#[tokio::test(start_paused = true)]
async fn create_refuses_a_bound_copy_that_inherited_the_relays_marks() {
    let (b, mut api) = east();
    let vol = standard(&b);
    let name = pvc_name(&vol);
    let (result, ()) = tokio::join!(b.create_volume(&vol, None), async {
        api.expect("GET", "/apis/storage.k8s.io/v1/storageclasses/fast")
            .await
            .ok(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                       "metadata": {"name": "fast"}, "provisioner": "x",
                       "volumeBindingMode": "Immediate"}),
            );
        api.expect("POST", PVCS).await.already_exists();
        let mut copy = claim(&vol, "Bound", Some("pv-data"));
        copy["metadata"]["annotations"]["kosmos.io/global"] = "true".into();
        copy["spec"]["storageClassName"] = "relay-east".into();
        api.expect("GET", &format!("{PVCS}/{name}")).await.ok(copy);
        api.expect_idle().await;
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err}");
    let msg = err.to_string();
    assert!(msg.contains("carries csi-relay's marks"), "{msg}");
    assert!(
        msg.contains("\"relay-east\"") && msg.contains("\"fast\""),
        "{msg}"
    );
}

/// What Kosmos leaves in the member when it mirrors the pod first: the host
/// claim copied under the same name, marked global, with the host's class.
fn kosmos_copy(vol: &Volume, uid: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": pvc_name(vol), "namespace": "relay", "uid": uid,
                     "annotations": {"kosmos.io/global": "true",
                                     "kosmos-io/cluster-owners": "east",
                                     "volume.kubernetes.io/storage-provisioner": "relay.csi.dev"},
                     "finalizers": ["kubernetes.io/pvc-protection"]},
        "spec": {"storageClassName": "relay-east-immediate",
                 "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Pending"}
    })
}

#[tokio::test(start_paused = true)]
async fn create_replaces_kosmos_unbound_copy_of_the_host_claim() {
    let (b, mut api) = east();
    let vol = in_relay(&b);
    let name = pvc_name(&vol);
    let (result, ()) = tokio::join!(b.create_volume(&vol, None), async {
        api.expect("POST", PVCS).await.already_exists();
        api.expect("GET", &format!("{PVCS}/{name}"))
            .await
            .ok(kosmos_copy(&vol, "u-kosmos"));
        let delete = api.expect("DELETE", &format!("{PVCS}/{name}")).await;
        // Only that claim: a newer one of the same name is not deleted.
        assert_eq!(delete.body["preconditions"]["uid"], "u-kosmos");
        delete.ok(kosmos_copy(&vol, "u-kosmos"));
        // The PVC protection finalizer goes a moment later.
        api.expect("GET", &format!("{PVCS}/{name}"))
            .await
            .ok(kosmos_copy(&vol, "u-kosmos"));
        api.expect("GET", &format!("{PVCS}/{name}"))
            .await
            .not_found();
        let post = api.expect("POST", PVCS).await;
        assert_eq!(
            post.body["metadata"]["annotations"][naming::VOLUME_ID_ANNOTATION],
            json!(vol.id)
        );
        post.created();
        api.expect_idle().await;
    });
    result.unwrap();
}

// A copy that comes back after each replacement (Kosmos retrying its
// mirror meanwhile) is given up on after a few rounds: ABORTED, the CO
// retries the call later.
#[tokio::test(start_paused = true)]
async fn a_copy_that_keeps_coming_back_is_left_to_the_co_retry() {
    let (b, mut api) = east();
    let vol = in_relay(&b);
    let name = pvc_name(&vol);
    let (result, ()) = tokio::join!(b.create_volume(&vol, None), async {
        for round in 0..3 {
            let uid = format!("u-{round}");
            api.expect("POST", PVCS).await.already_exists();
            api.expect("GET", &format!("{PVCS}/{name}"))
                .await
                .ok(kosmos_copy(&vol, &uid));
            api.expect("DELETE", &format!("{PVCS}/{name}"))
                .await
                .ok(kosmos_copy(&vol, &uid));
            // Gone, and back at once under a new uid.
            api.expect("GET", &format!("{PVCS}/{name}"))
                .await
                .ok(kosmos_copy(&vol, &format!("u-{round}-again")));
        }
        api.expect_idle().await;
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::Aborted, "{err}");
    assert!(err.to_string().contains("3 times"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_kosmos_copy_that_bound_or_will_not_go_is_not_taken_over() {
    let (b, mut api) = east();
    let vol = in_relay(&b);
    let name = pvc_name(&vol);
    // Bound: it may hold data; refused, never deleted.
    let (result, ()) = tokio::join!(b.create_volume(&vol, None), async {
        api.expect("POST", PVCS).await.already_exists();
        let mut bound = kosmos_copy(&vol, "u-bound");
        bound["spec"]["volumeName"] = "pv-9".into();
        bound["status"]["phase"] = "Bound".into();
        api.expect("GET", &format!("{PVCS}/{name}")).await.ok(bound);
        api.expect_idle().await;
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err}");
    assert!(err.to_string().contains("something else made it"), "{err}");
    assert!(!err.to_string().contains("None"), "{err}");
    // Unbound but held by a finalizer past the wait: ABORTED, the CO retries.
    let serve = async {
        api.expect("POST", PVCS).await.already_exists();
        api.expect("GET", &format!("{PVCS}/{name}"))
            .await
            .ok(kosmos_copy(&vol, "u-held"));
        api.expect("DELETE", &format!("{PVCS}/{name}"))
            .await
            .ok(kosmos_copy(&vol, "u-held"));
        loop {
            api.expect("GET", &format!("{PVCS}/{name}"))
                .await
                .ok(kosmos_copy(&vol, "u-held"));
        }
    };
    let err = tokio::select! {
        result = b.create_volume(&vol, None) => result.unwrap_err(),
        () = serve => unreachable!(),
    };
    assert_eq!(err.code(), Code::Aborted, "{err}");
    assert!(err.to_string().contains("still there"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_missing_member_storage_class_is_named() {
    let (b, mut api) = east();
    let vol = standard(&b);
    let (result, ()) = tokio::join!(b.create_volume(&vol, None), async {
        api.expect("GET", "/apis/storage.k8s.io/v1/storageclasses/fast")
            .await
            .not_found();
        api.expect_idle().await;
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.to_string().contains("memberStorageClass"), "{err}");
    assert!(err.to_string().contains("member cluster east"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn unreachable_members_are_unavailable_naming_the_cluster() {
    let (b, mut api) = east();
    let vol = in_relay(&b);
    // Connection refused.
    let (result, ()) = tokio::join!(b.create_volume(&vol, None), async {
        api.expect("POST", PVCS).await.refuse();
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(
        err.to_string()
            .starts_with("member cluster east unreachable"),
        "{err}"
    );
    // No answer at all: the call ends at its deadline, not never.
    let started = tokio::time::Instant::now();
    let (result, _pending) = tokio::join!(b.create_volume(&vol, None), async {
        api.expect("POST", PVCS).await.hang()
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(
        err.to_string().contains("member cluster east unreachable"),
        "{err}"
    );
    assert!(err.to_string().contains("within 10s"), "{err}");
    assert_eq!(started.elapsed(), crate::k8s::CALL_TIMEOUT);
}

#[tokio::test(start_paused = true)]
async fn forbidden_is_failed_precondition_naming_the_permission() {
    let (b, mut api) = east();
    let vol = in_relay(&b);
    let (result, ()) = tokio::join!(b.create_volume(&vol, None), async {
        api.expect("POST", PVCS).await.status(
            403,
            "Forbidden",
            "persistentvolumeclaims is forbidden: User \"relay\" cannot create resource",
        );
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let text = err.to_string();
    assert!(
        text.contains("forbids create PersistentVolumeClaim relay/"),
        "{text}"
    );
    assert!(text.contains("cannot create resource"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn clones_and_restores_use_a_member_data_source() {
    let (b, mut api) = east();
    let mut src = volume_named(
        &b,
        "pvc-source",
        params(&[("memberNamespace", "relay")]),
        vec![mount(AccessMode::SingleNodeWriter)],
        None,
    );
    src.lifecycle = Lifecycle::Ready;
    let vol = in_relay(&b);
    let snap = Snapshot {
        id: "snap-0123".into(),
        name: "s".into(),
        source_volume_id: src.id.clone(),
        size_bytes: 1 << 30,
        backing: src.backing.clone(),
        created_unix: 0,
        created_nanos: 0,
        lifecycle: Lifecycle::Ready,
        parameters: BTreeMap::new(),
        group_snapshot_id: None,
        allocated_bytes: None,
        member_snapshot: None,
    };
    let src_pvc = pvc_name(&src);
    let (result, ()) = tokio::join!(
        b.create_volume(&vol, Some(SourceData::Volume(&src))),
        async {
            source_claim(&mut api, &src).await;
            let post = api.expect("POST", PVCS).await;
            assert_eq!(
                post.body["spec"]["dataSource"],
                json!({"kind": "PersistentVolumeClaim", "name": src_pvc})
            );
            post.created();
        }
    );
    result.unwrap();
    let (result, ()) = tokio::join!(
        b.create_volume(&vol, Some(SourceData::Snapshot(&snap))),
        async {
            let post = api.expect("POST", PVCS).await;
            assert_eq!(
                post.body["spec"]["dataSource"],
                json!({"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "relay-snap-0123"})
            );
            post.created();
        }
    );
    result.unwrap();
    // Another namespace cannot be a data source.
    let elsewhere = volume(
        &b,
        params(&[("memberNamespace", "other")]),
        vec![mount(AccessMode::SingleNodeWriter)],
        None,
    );
    let err = b
        .create_volume(&elsewhere, Some(SourceData::Volume(&src)))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err}");
}

// ---- DeleteVolume ------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn delete_removes_the_pvc_and_absent_is_success() {
    let (b, mut api) = east();
    let vol = standard(&b);
    let path = format!("{PVCS}/{}", pvc_name(&vol));
    let mut ours = claim(&vol, "Bound", Some("pv-1"));
    ours["metadata"]["uid"] = "uid-1".into();
    let (result, ()) = tokio::join!(b.delete_volume(&vol), async {
        api.expect("GET", &path).await.ok(ours.clone());
        let del = api.expect("DELETE", &path).await;
        assert_eq!(del.body["propagationPolicy"], "Background");
        assert_eq!(
            del.body["preconditions"]["uid"], "uid-1",
            "never a replaced claim"
        );
        del.ok(ours.clone());
    });
    result.unwrap();
    let (result, ()) = tokio::join!(b.delete_volume(&vol), async {
        api.expect("GET", &path).await.not_found();
    });
    result.unwrap();
    // Replaced between the read and the delete: the uid precondition fails.
    let (result, ()) = tokio::join!(b.delete_volume(&vol), async {
        api.expect("GET", &path).await.ok(ours.clone());
        api.expect("DELETE", &path).await.status(
            409,
            "Conflict",
            "Precondition failed: UID in precondition: uid-1, UID in object meta: uid-2",
        );
    });
    result.unwrap();
}

// A claim of that name the relay did not make (a mirroring system deleted
// ours and made its own) is never deleted, nor read, resized or mounted.
#[tokio::test]
async fn a_foreign_claim_under_the_volume_name_is_never_touched() {
    let (b, mut api) = east();
    let mut vol = standard(&b);
    let path = format!("{PVCS}/{}", pvc_name(&vol));
    let mut foreign = claim(&vol, "Bound", Some("pv-other"));
    foreign["metadata"]["annotations"] = json!({});
    // Had delete asked anything more, it would wait for an answer for ever.
    let (result, ()) = tokio::join!(b.delete_volume(&vol), async {
        api.expect("GET", &path).await.ok(foreign.clone());
    });
    result.unwrap();
    let (result, ()) = tokio::join!(b.expand_volume(&vol, 2 << 30), async {
        api.expect("GET", &path).await.ok(foreign.clone());
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
    assert!(
        err.to_string().contains("not the one csi-relay created"),
        "{err}"
    );
    vol.lifecycle = Lifecycle::Ready;
    let (result, ()) = tokio::join!(b.attach(&vol, "member-node-1"), async {
        api.expect("GET", "/api/v1/nodes/member-node-1")
            .await
            .ok(node("member-node-1", json!({})));
        api.expect("GET", &path).await.ok(foreign.clone());
    });
    assert_eq!(result.unwrap_err().code(), Code::FailedPrecondition);
    let (health, ()) = tokio::join!(b.health(&vol), async {
        api.expect("GET", &path).await.ok(foreign.clone());
    });
    assert!(health.abnormal, "{}", health.message);
}

async fn source_claim(api: &mut MockApi, vol: &Volume) {
    api.expect("GET", &format!("{PVCS}/{}", pvc_name(vol)))
        .await
        .ok(claim(vol, "Bound", Some("pv-1")));
}

// ---- ControllerPublish / Unpublish ------------------------------------------

#[tokio::test(start_paused = true)]
async fn publish_describes_a_bound_nfs_volume() {
    let (b, mut api, mut host) = with_host();
    let vol = standard(&b);
    let (result, (), ()) = tokio::join!(
        b.attach(&vol, "host-1"),
        async {
            host.expect("GET", "/api/v1/nodes/host-1")
                .await
                .ok(node("host-1", json!({TOPOLOGY_MEMBER_KEY: "east"})));
        },
        async {
            // No member-node label: a member node of the same name?
            api.expect("GET", "/api/v1/nodes/host-1").await.not_found();
            api.expect("GET", &format!("{PVCS}/{}", pvc_name(&vol)))
                .await
                .ok(claim(&vol, "Bound", Some("pv-9")));
            api.expect("GET", "/api/v1/persistentvolumes/pv-9")
                .await
                .ok(nfs_pv());
            api.expect_idle().await;
        }
    );
    let ctx = result.unwrap();
    assert_eq!(ctx[source::SOURCE_TYPE], "nfs");
    assert_eq!(ctx[source::NFS_SERVER], "10.0.0.5");
    assert_eq!(ctx[source::NFS_PATH], "/exports/9");
    assert_eq!(ctx[source::MEMBER], "east");
    assert_eq!(ctx[source::MEMBER_PV], "pv-9");
    assert!(!ctx.contains_key(source::MEMBER_NODE));
}

#[tokio::test(start_paused = true)]
async fn publish_waits_for_binding_and_sends_the_pvc_to_its_node() {
    let (b, mut api, mut host) = with_host();
    let vol = standard(&b);
    let pvc_path = format!("{PVCS}/{}", pvc_name(&vol));
    let (result, (), ()) = tokio::join!(
        b.attach(&vol, "host-1"),
        async {
            host.expect("GET", "/api/v1/nodes/host-1").await.ok(node(
                "host-1",
                json!({TOPOLOGY_MEMBER_KEY: "east", TOPOLOGY_MEMBER_NODE_KEY: "worker-3"}),
            ));
        },
        async {
            api.expect("GET", &pvc_path)
                .await
                .ok(claim(&vol, "Pending", None));
            api.expect("GET", "/apis/storage.k8s.io/v1/storageclasses/fast")
                .await
                .ok(class("WaitForFirstConsumer"));
            let patch = api.expect("PATCH", &pvc_path).await;
            assert_eq!(patch.content_type, "application/merge-patch+json");
            assert_eq!(
                patch.body,
                json!({"metadata": {"annotations": {naming::SELECTED_NODE_ANNOTATION: "worker-3"}}})
            );
            patch.ok(claim(&vol, "Pending", None));
            api.expect_idle().await;
        }
    );
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.to_string().contains("not Bound yet"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn publish_refuses_nodes_of_other_members_and_unknown_nodes() {
    let (b, _api, mut host) = with_host();
    let vol = standard(&b);
    let (result, ()) = tokio::join!(b.attach(&vol, "host-2"), async {
        host.expect("GET", "/api/v1/nodes/host-2")
            .await
            .ok(node("host-2", json!({TOPOLOGY_MEMBER_KEY: "west"})));
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.to_string().contains("member cluster west"), "{err}");
    let (result, ()) = tokio::join!(b.attach(&vol, "ghost"), async {
        host.expect("GET", "/api/v1/nodes/ghost").await.not_found();
    });
    assert_eq!(result.unwrap_err().code(), Code::NotFound);
    let (known, ()) = tokio::join!(b.node_known("ghost"), async {
        host.expect("GET", "/api/v1/nodes/ghost").await.not_found();
    });
    assert!(!known.unwrap());
}

/// The member node is the host node's namesake; the member PV's CSI driver
/// has no CSIDriver object (attach required); the VolumeAttachment attaches
/// on the second look.
#[tokio::test(start_paused = true)]
async fn publish_attaches_csi_volumes_through_a_member_volume_attachment() {
    let (b, mut api) = east();
    let vol = standard(&b);
    let uuid = MemberVolume::of(&vol).unwrap().uuid;
    let va_name = naming::attachment_name(&uuid, "worker-1");
    let va_path = format!("/apis/storage.k8s.io/v1/volumeattachments/{va_name}");
    let (result, ()) = tokio::join!(b.attach(&vol, "worker-1"), async {
        api.expect("GET", "/api/v1/nodes/worker-1")
            .await
            .ok(node("worker-1", json!({})));
        api.expect("GET", &format!("{PVCS}/{}", pvc_name(&vol)))
            .await
            .ok(claim(&vol, "Bound", Some("pv-9")));
        api.expect("GET", "/api/v1/persistentvolumes/pv-9")
            .await
            .ok(csi_pv());
        api.expect("GET", "/apis/storage.k8s.io/v1/csidrivers/disk.csi.example")
            .await
            .not_found();
        let post = api
            .expect("POST", "/apis/storage.k8s.io/v1/volumeattachments")
            .await;
        assert_eq!(post.body["metadata"]["name"], va_name.as_str());
        assert_eq!(
            post.body["metadata"]["labels"][naming::VOLUME_UUID_LABEL],
            uuid.as_str()
        );
        assert_eq!(
            post.body["metadata"]["annotations"][naming::HOST_NODE_ANNOTATION],
            "worker-1"
        );
        assert_eq!(
            post.body["spec"],
            json!({"attacher": "disk.csi.example", "nodeName": "worker-1",
                   "source": {"persistentVolumeName": "pv-9"}})
        );
        post.created();
        let mut done = json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": va_name},
            "spec": {"attacher": "disk.csi.example", "nodeName": "worker-1",
                     "source": {"persistentVolumeName": "pv-9"}}});
        done["status"] =
            json!({"attached": true, "attachmentMetadata": {"devicePath": "/dev/vdb"}});
        api.expect("GET", &va_path).await.ok(done);
        api.expect_idle().await;
    });
    let ctx = result.unwrap();
    assert_eq!(ctx[source::SOURCE_TYPE], "csi");
    assert_eq!(ctx[source::CSI_DRIVER], "disk.csi.example");
    assert_eq!(ctx[source::CSI_VOLUME_HANDLE], "h-9");
    assert_eq!(
        ctx[source::CSI_PUBLISH_CONTEXT],
        r#"{"devicePath":"/dev/vdb"}"#
    );
    assert_eq!(ctx[source::MEMBER_ATTACHMENT], va_name);
    assert_eq!(ctx[source::MEMBER_NODE], "worker-1");

    // A retry after the CO lost the answer: the attachment exists already.
    let (result, ()) = tokio::join!(b.attach(&vol, "worker-1"), async {
        api.expect("GET", "/api/v1/nodes/worker-1")
            .await
            .ok(node("worker-1", json!({})));
        api.expect("GET", &format!("{PVCS}/{}", pvc_name(&vol)))
            .await
            .ok(claim(&vol, "Bound", Some("pv-9")));
        api.expect("GET", "/api/v1/persistentvolumes/pv-9")
            .await
            .ok(csi_pv());
        api.expect("GET", "/apis/storage.k8s.io/v1/csidrivers/disk.csi.example")
            .await
            .not_found();
        api.expect("POST", "/apis/storage.k8s.io/v1/volumeattachments")
            .await
            .already_exists();
        api.expect("GET", &va_path).await.ok(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": va_name},
            "spec": {"attacher": "disk.csi.example", "nodeName": "worker-1",
                     "source": {"persistentVolumeName": "pv-9"}},
            "status": {"attached": true, "attachmentMetadata": {"devicePath": "/dev/vdb"}}}));
        api.expect_idle().await;
    });
    assert_eq!(result.unwrap(), ctx);
}

#[tokio::test(start_paused = true)]
async fn publish_skips_attachment_when_the_member_driver_needs_none() {
    let (b, mut api) = east();
    let vol = standard(&b);
    let (result, ()) = tokio::join!(b.attach(&vol, "worker-1"), async {
        api.expect("GET", "/api/v1/nodes/worker-1")
            .await
            .ok(node("worker-1", json!({})));
        api.expect("GET", &format!("{PVCS}/{}", pvc_name(&vol)))
            .await
            .ok(claim(&vol, "Bound", Some("pv-9")));
        api.expect("GET", "/api/v1/persistentvolumes/pv-9")
            .await
            .ok(csi_pv());
        api.expect("GET", "/apis/storage.k8s.io/v1/csidrivers/disk.csi.example")
            .await
            .ok(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver",
                       "metadata": {"name": "disk.csi.example"},
                       "spec": {"attachRequired": false}}),
            );
        api.expect_idle().await;
    });
    let ctx = result.unwrap();
    assert!(!ctx.contains_key(source::MEMBER_ATTACHMENT));
}

#[tokio::test(start_paused = true)]
async fn an_attachment_that_never_attaches_is_a_bounded_wait() {
    let (b, mut api) = east();
    let b = b.with_wait(Duration::from_secs(1));
    let vol = standard(&b);
    let uuid = MemberVolume::of(&vol).unwrap().uuid;
    let va_name = naming::attachment_name(&uuid, "worker-1");
    let va_path = format!("/apis/storage.k8s.io/v1/volumeattachments/{va_name}");
    let failing = json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
        "metadata": {"name": va_name},
        "spec": {"attacher": "disk.csi.example", "nodeName": "worker-1",
                 "source": {"persistentVolumeName": "pv-9"}},
        "status": {"attached": false, "attachError": {"message": "disk busy"}}});
    let (result, ()) = tokio::join!(b.attach(&vol, "worker-1"), async {
        api.expect("GET", "/api/v1/nodes/worker-1")
            .await
            .ok(node("worker-1", json!({})));
        api.expect("GET", &format!("{PVCS}/{}", pvc_name(&vol)))
            .await
            .ok(claim(&vol, "Bound", Some("pv-9")));
        api.expect("GET", "/api/v1/persistentvolumes/pv-9")
            .await
            .ok(csi_pv());
        api.expect("GET", "/apis/storage.k8s.io/v1/csidrivers/disk.csi.example")
            .await
            .not_found();
        api.expect("POST", "/apis/storage.k8s.io/v1/volumeattachments")
            .await
            .created();
        api.expect("GET", &va_path).await.ok(failing.clone());
        api.expect("GET", &va_path).await.ok(failing.clone());
        api.expect_idle().await;
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.to_string().contains("disk busy"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn unpublish_deletes_the_attachment_and_waits_for_it_to_go() {
    let (b, mut api) = east();
    let mut vol = standard(&b);
    attached_to(
        &mut vol,
        "worker-1",
        [(
            source::MEMBER_ATTACHMENT.to_string(),
            "relay-x-1".to_string(),
        )]
        .into(),
    );
    let path = "/apis/storage.k8s.io/v1/volumeattachments/relay-x-1";
    let (result, ()) = tokio::join!(b.detach(&vol, "worker-1"), async {
        api.expect("GET", path)
            .await
            .ok(va("relay-x-1", "pv-9", "worker-1"));
        api.expect("GET", VAS).await.ok(va_list(vec![
            va("relay-x-1", "pv-9", "worker-1"),
            va("csi-other-node", "pv-9", "worker-2"),
            va("csi-other-pv", "pv-8", "worker-1"),
        ]));
        api.expect("DELETE", path).await.ok(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": "relay-x-1"},
            "spec": {"attacher": "d", "nodeName": "worker-1", "source": {}}}));
        api.expect("GET", path).await.not_found();
        api.expect_idle().await;
    });
    result.unwrap();
    // Already gone, and nothing attached: both succeed.
    let (result, ()) = tokio::join!(b.detach(&vol, "worker-1"), async {
        api.expect("GET", path).await.not_found();
        api.expect("DELETE", path).await.not_found();
        api.expect("GET", path).await.not_found();
    });
    result.unwrap();
    let (result, ()) = tokio::join!(b.detach(&vol, "worker-2"), api.expect_idle());
    result.unwrap();
}

const VAS: &str = "/apis/storage.k8s.io/v1/volumeattachments";

fn va(name: &str, pv: &str, node: &str) -> Value {
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
           "metadata": {"name": name},
           "spec": {"attacher": "disk.csi.example", "nodeName": node,
                    "source": {"persistentVolumeName": pv}},
           "status": {"attached": true}})
}

fn va_list(items: Vec<Value>) -> Value {
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachmentList",
           "metadata": {}, "items": items})
}

// The member's attach/detach controller attached the same PV to the same
// member node for a member pod: the relay's attachment stays, so the
// member driver is never told to detach under that pod.
#[tokio::test(start_paused = true)]
async fn unpublish_never_detaches_under_a_member_pod() {
    let (b, mut api) = east();
    let mut vol = standard(&b);
    attached_to(
        &mut vol,
        "worker-1",
        [(
            source::MEMBER_ATTACHMENT.to_string(),
            "relay-x-1".to_string(),
        )]
        .into(),
    );
    let path = "/apis/storage.k8s.io/v1/volumeattachments/relay-x-1";
    let (result, ()) = tokio::join!(b.detach(&vol, "worker-1"), async {
        api.expect("GET", path)
            .await
            .ok(va("relay-x-1", "pv-9", "worker-1"));
        // By pages: the member's own attachment is on the second.
        let list = api.expect("GET", VAS).await;
        page_of(&list, None);
        let mut first = va_list(vec![
            va("relay-x-1", "pv-9", "worker-1"),
            va("csi-0f3a-other-node", "pv-9", "worker-2"),
        ]);
        first["metadata"]["continue"] = "vas-2".into();
        list.ok(first);
        let list = api.expect_page(VAS).await;
        page_of(&list, Some("vas-2"));
        list.ok(va_list(vec![va("csi-0f3a-adc-made", "pv-9", "worker-1")]));
        api.expect_idle().await;
    });
    result.unwrap();
}

fn annotated_va(name: &str, pv: &str, node: &str, host_node: Option<&str>) -> Value {
    let mut v = va(name, pv, node);
    if let Some(host_node) = host_node {
        v["metadata"]["annotations"] = json!({naming::HOST_NODE_ANNOTATION: host_node});
    }
    v
}

/// The label selector of the relay's attachments of `vol`.
fn ours_of(vol: &Volume) -> String {
    let uuid = naming::parse_volume_id(&vol.id).unwrap().1.to_string();
    format!(
        "{}={},{}={uuid}",
        naming::MANAGED_BY,
        naming::MANAGER,
        naming::VOLUME_UUID_LABEL
    )
}

// ControllerPublishVolume refused for a node that maps to no member node
// (its intent recorded, nothing made in the member): unpublishing asks the
// member which attachments exist and needs neither the node nor its
// mapping, which still refuses.
#[tokio::test(start_paused = true)]
async fn unpublish_after_a_refused_publish_needs_no_node_mapping() {
    let (b, mut api, mut host) = with_host();
    let mut vol = standard(&b);
    let (refused, ()) = tokio::join!(b.attach(&vol, "unlabelled"), async {
        host.expect("GET", "/api/v1/nodes/unlabelled")
            .await
            .ok(node("unlabelled", json!({})));
        api.expect("GET", "/api/v1/nodes/unlabelled")
            .await
            .not_found();
    });
    assert_eq!(refused.unwrap_err().code(), Code::FailedPrecondition);
    attached_to(&mut vol, "unlabelled", BTreeMap::new());
    let (result, ()) = tokio::join!(b.detach(&vol, "unlabelled"), async {
        let list = api.expect("GET", VAS).await;
        assert_eq!(
            list.query_map().get("labelSelector").map(|s| s
                .replace("%3D", "=")
                .replace("%2C", ",")
                .replace("%2F", "/")),
            Some(ours_of(&vol))
        );
        list.ok(va_list(vec![]));
        api.expect_idle().await;
        host.expect_idle().await;
    });
    result.unwrap();
}

// A record rebuilt from its RelayVolume has no publish_context (it is never
// trusted): unpublishing it still removes the relay's member attachment,
// found by the host node it names, even once that node is gone.
#[tokio::test(start_paused = true)]
async fn unpublish_of_a_rebuilt_record_finds_the_attachment_by_its_host_node() {
    let (b, mut api) = east();
    let mut vol = standard(&b);
    attached_to(&mut vol, "host-1", BTreeMap::new());
    let path = "/apis/storage.k8s.io/v1/volumeattachments/relay-x-1";
    let (result, ()) = tokio::join!(b.detach(&vol, "host-1"), async {
        api.expect("GET", VAS).await.ok(va_list(vec![
            annotated_va("relay-x-2", "pv-9", "worker-2", Some("host-2")),
            annotated_va("relay-x-1", "pv-9", "worker-1", Some("host-1")),
        ]));
        api.expect("GET", path).await.ok(annotated_va(
            "relay-x-1",
            "pv-9",
            "worker-1",
            Some("host-1"),
        ));
        api.expect("GET", VAS).await.ok(va_list(vec![
            annotated_va("relay-x-2", "pv-9", "worker-2", Some("host-2")),
            annotated_va("relay-x-1", "pv-9", "worker-1", Some("host-1")),
        ]));
        api.expect("DELETE", path)
            .await
            .ok(va("relay-x-1", "pv-9", "worker-1"));
        api.expect("GET", path).await.not_found();
        api.expect_idle().await;
    });
    result.unwrap();
    // Attachments for other host nodes only, and host-3 maps to no member
    // node that has one (it is gone): nothing of host-3's to detach.
    attached_to(&mut vol, "host-3", BTreeMap::new());
    let (result, ()) = tokio::join!(b.detach(&vol, "host-3"), async {
        api.expect("GET", VAS).await.ok(va_list(vec![annotated_va(
            "relay-x-2",
            "pv-9",
            "worker-2",
            Some("host-2"),
        )]));
        api.expect("GET", "/api/v1/nodes/host-3").await.not_found();
        api.expect_idle().await;
    });
    result.unwrap();
}

// Two host nodes mapped to one member node share one member attachment
// (named for the volume and the member node): unpublishing one of them
// leaves it to the other, whose pod still uses it, and the last one to let
// go removes it. Without a word to the member while another holds it.
#[tokio::test(start_paused = true)]
async fn a_member_attachment_two_host_nodes_share_goes_with_the_last_of_them() {
    let (b, mut api) = east();
    let mut vol = standard(&b);
    let context: BTreeMap<String, String> = [(
        source::MEMBER_ATTACHMENT.to_string(),
        "relay-x-1".to_string(),
    )]
    .into();
    attached_to(&mut vol, "host-a", context.clone());
    attached_to(&mut vol, "host-b", context);
    let (result, ()) = tokio::join!(b.detach(&vol, "host-a"), api.expect_idle());
    result.unwrap();
    vol.nodes.remove("host-a");
    let path = "/apis/storage.k8s.io/v1/volumeattachments/relay-x-1";
    let (result, ()) = tokio::join!(b.detach(&vol, "host-b"), async {
        api.expect("GET", path)
            .await
            .ok(va("relay-x-1", "pv-9", "worker-1"));
        api.expect("GET", VAS)
            .await
            .ok(va_list(vec![va("relay-x-1", "pv-9", "worker-1")]));
        api.expect("DELETE", path)
            .await
            .ok(va("relay-x-1", "pv-9", "worker-1"));
        api.expect("GET", path).await.not_found();
        api.expect_idle().await;
    });
    result.unwrap();
}

// The same after a rebuild from RelayVolumes (no publish_context: the
// attachment's name is not in the records, and it names host-a, which
// made it): host-b's mapping says it holds the attachment too.
#[tokio::test(start_paused = true)]
async fn a_shared_member_attachment_is_kept_and_found_again_in_a_rebuilt_record() {
    let (b, mut api, mut host) = with_host();
    let mut vol = standard(&b);
    attached_to(&mut vol, "host-a", BTreeMap::new());
    attached_to(&mut vol, "host-b", BTreeMap::new());
    let uuid = naming::parse_volume_id(&vol.id).unwrap().1.to_string();
    let name = naming::attachment_name(&uuid, "worker-1");
    let path = format!("/apis/storage.k8s.io/v1/volumeattachments/{name}");
    let mapped = |n: &str| {
        node(
            n,
            json!({TOPOLOGY_MEMBER_KEY: "east", TOPOLOGY_MEMBER_NODE_KEY: "worker-1"}),
        )
    };
    let made = annotated_va(&name, "pv-9", "worker-1", Some("host-a"));
    let (result, ()) = tokio::join!(b.detach(&vol, "host-a"), async {
        api.expect("GET", VAS).await.ok(va_list(vec![made.clone()]));
        host.expect("GET", "/api/v1/nodes/host-b")
            .await
            .ok(mapped("host-b"));
        api.expect_idle().await;
        host.expect_idle().await;
    });
    result.unwrap();
    vol.nodes.remove("host-a");
    let (result, ()) = tokio::join!(b.detach(&vol, "host-b"), async {
        api.expect("GET", VAS).await.ok(va_list(vec![made.clone()]));
        host.expect("GET", "/api/v1/nodes/host-b")
            .await
            .ok(mapped("host-b"));
        api.expect("GET", &path).await.ok(made.clone());
        api.expect("GET", VAS).await.ok(va_list(vec![made.clone()]));
        api.expect("DELETE", &path).await.ok(made.clone());
        api.expect("GET", &path).await.not_found();
        api.expect_idle().await;
        host.expect_idle().await;
    });
    result.unwrap();
}

// An attachment made by a build that did not name its host node: found by
// the deterministic name the node's mapping gives, as before.
#[tokio::test(start_paused = true)]
async fn unpublish_of_an_older_attachment_uses_the_node_mapping() {
    let (b, mut api) = east();
    let mut vol = standard(&b);
    attached_to(&mut vol, "worker-1", BTreeMap::new());
    let uuid = naming::parse_volume_id(&vol.id).unwrap().1.to_string();
    let name = naming::attachment_name(&uuid, "worker-1");
    let path = format!("/apis/storage.k8s.io/v1/volumeattachments/{name}");
    let (result, ()) = tokio::join!(b.detach(&vol, "worker-1"), async {
        api.expect("GET", VAS)
            .await
            .ok(va_list(vec![annotated_va(&name, "pv-9", "worker-1", None)]));
        api.expect("GET", "/api/v1/nodes/worker-1")
            .await
            .ok(node("worker-1", json!({})));
        api.expect("GET", &path).await.not_found();
        api.expect("DELETE", &path).await.not_found();
        api.expect("GET", &path).await.not_found();
        api.expect_idle().await;
    });
    result.unwrap();
}

// ---- Expansion ---------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn expansion_patches_the_request_and_reports_the_member_answer() {
    let (b, mut api) = east();
    let vol = standard(&b);
    let path = format!("{PVCS}/{}", pvc_name(&vol));
    let mut resizing = claim(&vol, "Bound", Some("pv-9"));
    resizing["spec"]["resources"]["requests"]["storage"] = "2Gi".into();
    let mut grown = resizing.clone();
    grown["status"]["capacity"]["storage"] = "2Gi".into();

    // The member has not grown it yet: retryable.
    let (result, ()) = tokio::join!(b.expand_volume(&vol, 2 << 30), async {
        api.expect("GET", &path)
            .await
            .ok(claim(&vol, "Bound", Some("pv-9")));
        let patch = api.expect("PATCH", &path).await;
        assert_eq!(patch.content_type, "application/merge-patch+json");
        assert_eq!(
            patch.body,
            json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}})
        );
        patch.ok(resizing.clone());
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    // The retry does not patch again, and completes once grown.
    let (result, ()) = tokio::join!(b.expand_volume(&vol, 2 << 30), async {
        api.expect("GET", &path).await.ok(grown.clone());
        api.expect_idle().await;
    });
    assert!(
        !result.unwrap(),
        "grown by the member: nothing for the node"
    );
    // Node-side resize pending counts as done for the controller. Unused
    // (or used only on virtual nodes) the member's kubelet grows the
    // filesystem where a member pod mounts it: no host kubelet would call
    // NodeExpandVolume, and the host claim would stay resizing.
    let mut fs_pending = resizing.clone();
    fs_pending["status"]["conditions"] =
        json!([{"type": "FileSystemResizePending", "status": "True"}]);
    let (result, ()) = tokio::join!(b.expand_volume(&vol, 2 << 30), async {
        api.expect("GET", &path).await.ok(fs_pending.clone());
    });
    assert!(!result.unwrap(), "the member's kubelet finishes it");
    // Published to a host node with a kubelet: the relay's node plugin does.
    let mut used = vol.clone();
    attached_to(&mut used, "worker-1", BTreeMap::new());
    let (result, ()) = tokio::join!(b.expand_volume(&used, 2 << 30), async {
        api.expect("GET", &path).await.ok(fs_pending);
    });
    assert!(
        result.unwrap(),
        "the filesystem is grown where it is mounted"
    );
}

// A host node the registrar treats as virtual does not count: its pods run
// in the member, whose kubelet grows the filesystem.
#[tokio::test(start_paused = true)]
async fn a_growth_used_only_on_a_virtual_node_is_finished_by_the_member() {
    let (cluster, mut api) = testing::member("east");
    let (host, mut host_api) = testing::host();
    let b = MemberBackend::new(vec![cluster], Some(host), "relay.csi.dev")
        .with_virtual_nodes(crate::k8s::registrar::NodeSelector::default());
    let mut vol = standard(&b);
    attached_to(&mut vol, "kosmos-east", BTreeMap::new());
    let path = format!("{PVCS}/{}", pvc_name(&vol));
    let mut pending = claim(&vol, "Bound", Some("pv-9"));
    pending["spec"]["resources"]["requests"]["storage"] = "2Gi".into();
    pending["status"]["allocatedResourceStatuses"] = json!({"storage": "NodeResizePending"});
    let (result, (), ()) = tokio::join!(
        b.expand_volume(&vol, 2 << 30),
        async {
            api.expect("GET", &path).await.ok(pending);
        },
        async {
            let mut kosmos = node("kosmos-east", json!({}));
            kosmos["spec"] = json!({"taints": [{"key": "kosmos.io/node", "value": "true", "effect": "NoSchedule"}]});
            host_api
                .expect("GET", "/api/v1/nodes/kosmos-east")
                .await
                .ok(kosmos);
        }
    );
    assert!(!result.unwrap());
}

#[tokio::test(start_paused = true)]
async fn expansion_refusals_come_from_the_member() {
    let (b, mut api) = east();
    let vol = standard(&b);
    let path = format!("{PVCS}/{}", pvc_name(&vol));
    let (result, ()) = tokio::join!(b.expand_volume(&vol, 2 << 30), async {
        api.expect("GET", &path)
            .await
            .ok(claim(&vol, "Bound", Some("pv-9")));
        api.expect("PATCH", &path).await.status(
            403,
            "Forbidden",
            "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize",
        );
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.to_string().contains("must support resize"), "{err}");
    let (result, ()) = tokio::join!(b.expand_volume(&vol, 2 << 30), async {
        api.expect("GET", &path)
            .await
            .ok(claim(&vol, "Pending", None));
    });
    assert_eq!(result.unwrap_err().code(), Code::Unavailable);
}

// ---- Snapshots ---------------------------------------------------------------

fn snapshot_of(vol: &Volume, parameters: BTreeMap<String, String>) -> Snapshot {
    Snapshot {
        id: "snap-00ff".into(),
        name: "snapshot-1".into(),
        source_volume_id: vol.id.clone(),
        size_bytes: vol.capacity_bytes,
        backing: vol.backing.clone(),
        created_unix: 0,
        created_nanos: 0,
        lifecycle: Lifecycle::Provisioning,
        parameters,
        group_snapshot_id: None,
        allocated_bytes: None,
        member_snapshot: None,
    }
}

const SNAPS: &str = "/apis/snapshot.storage.k8s.io/v1/namespaces/relay/volumesnapshots";

#[tokio::test(start_paused = true)]
async fn snapshots_are_member_volume_snapshots() {
    let (b, mut api) = east();
    let vol = standard(&b);
    let snap = snapshot_of(&vol, params(&[("memberSnapshotClass", "csi-snap")]));
    let (result, ()) = tokio::join!(b.create_snapshot(&snap, &vol), async {
        source_claim(&mut api, &vol).await;
        let post = api.expect("POST", SNAPS).await;
        assert_eq!(post.body["apiVersion"], "snapshot.storage.k8s.io/v1");
        assert_eq!(post.body["kind"], "VolumeSnapshot");
        assert_eq!(post.body["metadata"]["name"], "relay-snap-00ff");
        assert_eq!(
            post.body["metadata"]["annotations"][naming::SNAPSHOT_ID_ANNOTATION],
            "snap-00ff"
        );
        assert_eq!(
            post.body["spec"],
            json!({"source": {"persistentVolumeClaimName": pvc_name(&vol)},
                   "volumeSnapshotClassName": "csi-snap"})
        );
        let mut ready = post.body.clone();
        ready["status"] = json!({"readyToUse": true});
        post.reply(201, ready);
        api.expect_idle().await;
    });
    result.unwrap();
    // Retry: exists already and is ours.
    let (result, ()) = tokio::join!(b.create_snapshot(&snap, &vol), async {
        source_claim(&mut api, &vol).await;
        api.expect("POST", SNAPS).await.already_exists();
        api.expect("GET", &format!("{SNAPS}/relay-snap-00ff"))
            .await
            .ok(
                json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                       "metadata": {"name": "relay-snap-00ff", "namespace": "relay",
                                    "annotations": {naming::SNAPSHOT_ID_ANNOTATION: "snap-00ff"}},
                       "status": {"readyToUse": true}}),
            );
        api.expect_idle().await;
    });
    result.unwrap();
    let (result, ()) = tokio::join!(b.delete_snapshot(&snap), async {
        api.expect("DELETE", &format!("{SNAPS}/relay-snap-00ff"))
            .await
            .not_found();
    });
    result.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_member_without_the_snapshot_api_is_failed_precondition() {
    let (b, mut api) = east();
    let vol = standard(&b);
    let snap = snapshot_of(&vol, BTreeMap::new());
    let (result, ()) = tokio::join!(b.create_snapshot(&snap, &vol), async {
        source_claim(&mut api, &vol).await;
        let post = api.expect("POST", SNAPS).await;
        assert!(post.body["spec"].get("volumeSnapshotClassName").is_none());
        post.status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        api.expect("GET", "/apis/snapshot.storage.k8s.io/v1")
            .await
            .not_found();
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.to_string().contains("no VolumeSnapshot API"), "{err}");
    assert!(err.to_string().contains("member cluster east"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn a_snapshot_not_ready_in_time_is_retryable() {
    let (b, mut api) = east();
    let b = b.with_wait(Duration::from_millis(400));
    let vol = standard(&b);
    let snap = snapshot_of(&vol, BTreeMap::new());
    let (result, ()) = tokio::join!(b.create_snapshot(&snap, &vol), async {
        source_claim(&mut api, &vol).await;
        api.expect("POST", SNAPS).await.created();
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.to_string().contains("not ready to use yet"), "{err}");
}

// ---- State: health, capacity, node source -----------------------------------

#[tokio::test(start_paused = true)]
async fn health_reads_the_member_pvc_and_remembers_an_outage() {
    let (b, mut api) = east();
    let vol = standard(&b);
    let path = format!("{PVCS}/{}", pvc_name(&vol));
    let (h, ()) = tokio::join!(b.health(&vol), async {
        api.expect("GET", &path)
            .await
            .ok(claim(&vol, "Bound", Some("pv-9")));
    });
    assert!(!h.abnormal && h.message.contains("Bound"), "{h:?}");
    let (h, ()) = tokio::join!(b.health(&vol), async {
        api.expect("GET", &path).await.ok(claim(&vol, "Lost", None));
    });
    assert!(h.abnormal && h.message.contains("Lost"), "{h:?}");
    let (h, ()) = tokio::join!(b.health(&vol), async {
        api.expect("GET", &path).await.not_found();
    });
    assert!(h.abnormal && h.message.contains("missing"), "{h:?}");
    let (h, ()) = tokio::join!(b.health(&vol), async {
        api.expect("GET", &path).await.refuse();
    });
    assert!(h.abnormal && h.message.contains("unreachable"), "{h:?}");
    // Answered from memory: no request.
    let (h, ()) = tokio::join!(b.health(&vol), api.expect_idle());
    assert!(h.abnormal && h.message.contains("unreachable"), "{h:?}");
}

#[tokio::test(start_paused = true)]
async fn capacity_sums_the_member_storage_capacities_of_the_class() {
    let (b, mut api) = east();
    let typed = VolumeParams {
        member_storage_class: Some("fast".into()),
        ..Default::default()
    };
    let (report, ()) = tokio::join!(b.capacity_for(&typed, None), async {
        api.expect("GET", "/apis/storage.k8s.io/v1/storageclasses/fast")
            .await
            .ok(class("WaitForFirstConsumer"));
        api.expect("GET", "/apis/storage.k8s.io/v1/csistoragecapacities")
            .await
            .ok(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSIStorageCapacityList",
                "metadata": {}, "items": [
                {"metadata": {"name": "a", "namespace": "x"}, "storageClassName": "fast",
                 "capacity": "10Gi", "maximumVolumeSize": "4Gi"},
                {"metadata": {"name": "b", "namespace": "x"}, "storageClassName": "fast",
                 "capacity": "6Gi"},
                {"metadata": {"name": "c", "namespace": "x"}, "storageClassName": "slow",
                 "capacity": "100Gi"}]}),
            );
    });
    assert_eq!(
        report.unwrap(),
        Some(CapacityReport {
            available: 16 << 30,
            maximum_volume_size: Some(6 << 30),
        })
    );
    // Without a named class: the member's default class.
    let none = VolumeParams::default();
    let (report, ()) = tokio::join!(b.capacity_for(&none, None), async {
        api.expect("GET", "/apis/storage.k8s.io/v1/storageclasses")
            .await
            .ok(
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClassList",
                "metadata": {}, "items": []}),
            );
    });
    assert_eq!(report.unwrap(), None);
}

#[tokio::test]
async fn node_source_comes_from_the_publish_context() {
    let (b, _api) = east();
    let mut vol = standard(&b);
    assert_eq!(
        b.node_source(&vol).unwrap_err().code(),
        Code::FailedPrecondition
    );
    let pv: k8s_openapi::api::core::v1::PersistentVolume =
        serde_json::from_value(nfs_pv()).unwrap();
    let described = MemberSource::from_pv("east", &pv, None).unwrap();
    attached_to(&mut vol, "host-1", described.to_context().unwrap());
    assert_eq!(
        b.node_source(&vol).unwrap(),
        NodeSource::Member(Box::new(described))
    );
}

/// A page of a listing: `limit` set, continuing from `token`.
fn page_of(call: &testing::Call, token: Option<&str>) {
    let q = call.query_map();
    assert_eq!(
        q.get("limit").map(String::as_str),
        Some("500"),
        "{}",
        call.query
    );
    assert_eq!(
        q.get("continue").map(String::as_str),
        token,
        "{}",
        call.query
    );
}

/// `page_of`, of a metadata-only listing.
fn metadata_page(call: &testing::Call, token: Option<&str>) {
    page_of(call, token);
    assert!(
        call.accept.contains("as=PartialObjectMetadataList"),
        "{}",
        call.accept
    );
}

/// A metadata-only listing's answer: the objects' metadata, and `next` to
/// continue from.
fn metadata_list(items: &[serde_json::Value], next: Option<&str>) -> serde_json::Value {
    let items: Vec<_> = items
        .iter()
        .map(|o| {
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                        "metadata": o["metadata"]})
        })
        .collect();
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
           "metadata": {"continue": next.unwrap_or_default()}, "items": items})
}

// Housekeeping's view of the relay's own member attachments: each one's
// name and volume, from its labels; one without the volume label is not
// listed (nothing to tie it to).
#[tokio::test]
async fn own_attachments_come_by_pages_of_metadata() {
    let (b, mut api) = east();
    let va = |name: &str, uuid: Option<&str>| {
        let mut labels = json!({naming::MANAGED_BY: naming::MANAGER});
        if let Some(uuid) = uuid {
            labels[naming::VOLUME_UUID_LABEL] = uuid.into();
        }
        json!({"metadata": {"name": name, "labels": labels}})
    };
    let (a, c) = (
        "0123456789abcdef0123456789abcdef",
        "fedcba9876543210fedcba9876543210",
    );
    let (found, ()) = tokio::join!(b.own_attachments(), async {
        let path = "/apis/storage.k8s.io/v1/volumeattachments";
        let list = api.expect("GET", path).await;
        assert!(list.query.contains("labelSelector"), "{}", list.query);
        metadata_page(&list, None);
        list.ok(metadata_list(
            &[va("relay-a", Some(a)), va("unlabelled", None)],
            Some("vas-2"),
        ));
        let list = api.expect_page(path).await;
        metadata_page(&list, Some("vas-2"));
        list.ok(metadata_list(&[va("relay-c", Some(c))], None));
    });
    let own = |name: &str, uuid: &str| OwnAttachment {
        volume_id: format!("m-east-{uuid}"),
        name: name.into(),
        place: "east".into(),
    };
    assert_eq!(found.unwrap(), vec![own("relay-a", a), own("relay-c", c)]);
}

// Housekeeping's view of member claims: only the relay's own, with a host
// PV name, whose host PV is gone; removal goes through the ownership check.
#[tokio::test]
async fn claims_whose_host_volume_is_gone_are_listed_for_collection() {
    let (b, mut member, mut host) = with_host();
    let claim = |name: &str, id: &str, pv: Option<&str>, driver: &str| {
        let mut annotations = json!({
            naming::VOLUME_ID_ANNOTATION: id,
            naming::DRIVER_ANNOTATION: driver,
        });
        if let Some(pv) = pv {
            annotations[naming::HOST_PV_NAME] = pv.into();
        }
        json!({"metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                            "labels": {naming::MANAGED_BY: naming::MANAGER},
                            "annotations": annotations}})
    };
    let gone_id = "m-east-0123456789abcdef0123456789abcdef";
    let items = [
        claim(
            "kept",
            "m-east-11111111111111111111111111111111",
            Some("pv-present"),
            "relay.csi.dev",
        ),
        claim("gone", gone_id, Some("pv-gone"), "relay.csi.dev"),
        claim(
            "no-host-pv",
            "m-east-22222222222222222222222222222222",
            None,
            "relay.csi.dev",
        ),
        claim(
            "other-driver",
            "m-east-33333333333333333333333333333333",
            Some("pv-x"),
            "other.csi.dev",
        ),
        claim(
            "other-member",
            "m-west-44444444444444444444444444444444",
            Some("pv-y"),
            "relay.csi.dev",
        ),
    ];
    // Both listings go by pages, metadata only: the gone claim comes on the
    // claims' second page, the present PV on the PVs' second.
    let (found, (), ()) = tokio::join!(
        b.stored_data(),
        async {
            let list = member.expect("GET", "/api/v1/persistentvolumeclaims").await;
            assert!(list.query.contains("labelSelector"), "{}", list.query);
            metadata_page(&list, None);
            list.ok(metadata_list(&items[..1], Some("claims-2")));
            let list = member.expect_page("/api/v1/persistentvolumeclaims").await;
            metadata_page(&list, Some("claims-2"));
            list.ok(metadata_list(&items[1..], None));
        },
        async {
            // One listing of the host's PVs, not a read per claim.
            let pv = |name: &str| json!({"metadata": {"name": name}});
            let list = host.expect("GET", "/api/v1/persistentvolumes").await;
            metadata_page(&list, None);
            list.ok(metadata_list(&[pv("pv-other")], Some("pvs-2")));
            let list = host.expect_page("/api/v1/persistentvolumes").await;
            metadata_page(&list, Some("pvs-2"));
            list.ok(metadata_list(&[pv("pv-present")], None));
        }
    );
    let found = found.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].id, gone_id);
    let (removed, ()) = tokio::join!(b.remove_data(&found[0]), async {
        let path = "/api/v1/namespaces/shop/persistentvolumeclaims/gone";
        member.expect("GET", path).await.ok(claim(
            "gone",
            gone_id,
            Some("pv-gone"),
            "relay.csi.dev",
        ));
        let del = member.expect("DELETE", path).await;
        assert_eq!(del.body["preconditions"]["uid"], "uid-gone");
        del.ok(claim("gone", gone_id, Some("pv-gone"), "relay.csi.dev"));
    });
    removed.unwrap();
    // An entry that names no member claim is refused, not guessed at.
    let mut junk = found[0].clone();
    junk.path = "no-slashes".into();
    assert_eq!(
        b.remove_data(&junk).await.unwrap_err().code(),
        Code::Internal
    );
}

// A member driver's node Secret, read by a node plugin with a member
// client: values pass through; missing ones and binary values are named,
// never shown.
#[tokio::test]
async fn node_secrets_are_read_from_the_member() {
    let (b, mut api) = east();
    let path = "/api/v1/namespaces/ceph/secrets/ceph-node";
    let (got, ()) = tokio::join!(b.node_secret("east", "ceph/ceph-node"), async {
        api.expect("GET", path).await.ok(json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ceph-node"},
            "data": {"userID": "YWRtaW4=", "userKey": "czNjcjN0"}}));
    });
    let got = got.unwrap();
    assert_eq!(got["userID"], "admin");
    assert_eq!(got["userKey"], "s3cr3t");
    let (missing, ()) = tokio::join!(b.node_secret("east", "ceph/ceph-node"), async {
        api.expect("GET", path).await.not_found();
    });
    let err = missing.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.to_string().contains("ceph/ceph-node"), "{err}");
    let (binary, ()) = tokio::join!(b.node_secret("east", "ceph/ceph-node"), async {
        api.expect("GET", path).await.ok(json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ceph-node"},
            "data": {"key": "/w=="}}));
    });
    let err = binary.unwrap_err().to_string();
    assert!(err.contains("\"key\"") && !err.contains("/w=="), "{err}");
    // No client for that member on this node: the flag to set is named.
    let err = b.node_secret("west", "ceph/x").await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.to_string().contains("--member west="), "{err}");
}

// A controller that lost its store gets its snapshots back from the member
// VolumeSnapshots' own records, taken only where they agree with the object.
#[tokio::test]
async fn snapshots_are_recovered_from_member_volume_snapshots() {
    let (b, mut api) = east();
    let vol = standard(&b);
    let snap = snapshot_of(&vol, BTreeMap::new());
    let mut posted = Value::Null;
    let (result, ()) = tokio::join!(b.create_snapshot(&snap, &vol), async {
        source_claim(&mut api, &vol).await;
        let post = api.expect("POST", SNAPS).await;
        posted = post.body.clone();
        let mut ready = post.body.clone();
        ready["status"] = json!({"readyToUse": true});
        post.reply(201, ready);
    });
    result.unwrap();
    let mut ready = posted.clone();
    ready["metadata"]["namespace"] = "relay".into();
    ready["status"] = json!({"readyToUse": true});
    // The same record on an object in another namespace: refused.
    let mut moved = ready.clone();
    moved["metadata"]["name"] = "relay-snap-moved".into();
    moved["metadata"]["namespace"] = "elsewhere".into();
    // No record at all: refused.
    let mut bare = ready.clone();
    bare["metadata"]["name"] = "relay-snap-bare".into();
    bare["metadata"]["annotations"]
        .as_object_mut()
        .map(|a| a.remove(naming::SNAPSHOT_RECORD_ANNOTATION));
    // Made under another driver name: not ours to recover.
    let mut foreign = ready.clone();
    foreign["metadata"]["name"] = "relay-snap-foreign".into();
    foreign["metadata"]["annotations"][naming::DRIVER_ANNOTATION] = "other.csi.dev".into();
    let (found, ()) = tokio::join!(b.recover_snapshots(), async {
        let list = api
            .expect("GET", "/apis/snapshot.storage.k8s.io/v1/volumesnapshots")
            .await;
        assert!(list.query.contains("labelSelector"), "{}", list.query);
        page_of(&list, None);
        list.ok(
            json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotList",
                       "metadata": {"continue": "snaps-2"}, "items": [moved, bare]}),
        );
        // The recovered one comes on the second page.
        let list = api
            .expect_page("/apis/snapshot.storage.k8s.io/v1/volumesnapshots")
            .await;
        page_of(&list, Some("snaps-2"));
        list.ok(
            json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotList",
                       "metadata": {}, "items": [ready]}),
        );
    });
    let found = found.unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let mut want = snap.clone();
    want.lifecycle = Lifecycle::Ready;
    assert_eq!(found[0], want);
}

// An unfinished create is given up only when the host claim it was for is
// gone or its name now belongs to another claim (the provisioner names a
// volume `pvc-<claim uid>`); without the claim's name it cannot tell.
#[tokio::test(start_paused = true)]
async fn an_unfinished_create_is_abandoned_once_its_host_claim_is_gone() {
    let (b, _member, mut host) = with_host();
    let claim = "/api/v1/namespaces/shop/persistentvolumeclaims/data";
    let meta = |uid: &str| {
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": "data", "namespace": "shop", "uid": uid}})
    };
    let vol = volume_named(
        &b,
        "pvc-0a1b",
        params(&[
            ("memberNamespace", "relay"),
            ("csi.storage.k8s.io/pvc/name", "data"),
            ("csi.storage.k8s.io/pvc/namespace", "shop"),
        ]),
        vec![mount(AccessMode::SingleNodeWriter)],
        None,
    );
    for (answer, want) in [(Some("0a1b"), false), (Some("ffff"), true), (None, true)] {
        let (result, ()) = tokio::join!(b.abandoned(&vol), async {
            let get = host.expect("GET", claim).await;
            match answer {
                Some(uid) => get.ok(meta(uid)),
                None => get.not_found(),
            }
        });
        assert_eq!(result.unwrap(), want, "{answer:?}");
    }
    // An unreachable host is no reason to roll back.
    let (result, ()) = tokio::join!(b.abandoned(&vol), async {
        host.expect("GET", claim).await.refuse();
    });
    assert!(result.is_err());
    // No claim name in the request: nothing to look at.
    let blind = in_relay(&b);
    let (result, ()) = tokio::join!(b.abandoned(&blind), host.expect_idle());
    assert!(!result.unwrap());
}

// ---- Group snapshots ---------------------------------------------------------

const GROUPS: &str =
    "/apis/groupsnapshot.storage.k8s.io/v1beta2/namespaces/relay/volumegroupsnapshots";

fn group_of(parameters: BTreeMap<String, String>) -> GroupSnapshot {
    GroupSnapshot {
        id: "group-00aa".into(),
        name: "g1".into(),
        source_volume_ids: Vec::new(),
        snapshot_ids: Vec::new(),
        created_unix: 0,
        created_nanos: 0,
        lifecycle: Lifecycle::Provisioning,
        parameters,
    }
}

/// Two volumes in namespace "relay" of "east", each with its snapshot record.
fn group_members(b: &MemberBackend) -> Vec<(Snapshot, Volume)> {
    ["pvc-a", "pvc-b"]
        .iter()
        .map(|name| {
            let vol = volume_named(
                b,
                name,
                params(&[("memberStorageClass", "fast"), ("memberNamespace", "relay")]),
                vec![mount(AccessMode::SingleNodeWriter)],
                None,
            );
            let mut snap = snapshot_of(&vol, BTreeMap::new());
            snap.id = format!("snap-{name}");
            snap.group_snapshot_id = Some("group-00aa".into());
            (snap, vol)
        })
        .collect()
}

fn api_groups(versions: &[&str]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("groupsnapshot.storage.k8s.io/{v}"), "version": v}))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
        {"name": "snapshot.storage.k8s.io",
         "versions": [{"groupVersion": "snapshot.storage.k8s.io/v1", "version": "v1"}],
         "preferredVersion": {"groupVersion": "snapshot.storage.k8s.io/v1", "version": "v1"}},
        {"name": "groupsnapshot.storage.k8s.io", "versions": versions,
         "preferredVersion": versions.first().cloned().unwrap_or(json!(null))}]})
}

fn driver_pv(name: &str, driver: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
           "spec": {"csi": {"driver": driver, "volumeHandle": format!("h-{name}")}}})
}

/// The member's claims and PVs of `members` (PVs of `drivers`, in turn).
async fn group_claims(api: &mut MockApi, members: &[(Snapshot, Volume)], drivers: &[&str]) {
    for ((_, vol), driver) in members.iter().zip(drivers) {
        let pv = format!("pv-{}", pvc_name(vol));
        api.expect("GET", &format!("{PVCS}/{}", pvc_name(vol)))
            .await
            .ok(claim(vol, "Bound", Some(&pv)));
        api.expect("GET", &format!("/api/v1/persistentvolumes/{pv}"))
            .await
            .ok(driver_pv(&pv, driver));
    }
}

fn group_class(name: &str, driver: &str, default: bool) -> Value {
    let annotations = if default {
        json!({"groupsnapshot.storage.kubernetes.io/is-default-class": "true"})
    } else {
        json!({})
    };
    json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1beta2", "kind": "VolumeGroupSnapshotClass",
           "metadata": {"name": name, "annotations": annotations},
           "driver": driver, "deletionPolicy": "Delete"})
}

fn list_of(kind: &str, items: Vec<Value>) -> Value {
    json!({"kind": format!("{kind}List"), "apiVersion": "v1", "metadata": {}, "items": items})
}

#[tokio::test(start_paused = true)]
async fn a_group_is_one_member_volume_group_snapshot_mapped_back_by_claim() {
    let (b, mut api) = east();
    let members = group_members(&b);
    let group = group_of(BTreeMap::new());
    let claims: Vec<String> = members.iter().map(|(_, v)| pvc_name(v)).collect();
    let uuids: Vec<String> = members
        .iter()
        .map(|(_, v)| MemberVolume::of(v).unwrap().uuid)
        .collect();
    // As the member's snapshot-controller names them: longer than a DNS label.
    let first = format!("snapshot-{}", "62".repeat(32));
    let (result, ()) = tokio::join!(b.create_group_snapshot(&group, &members), async {
        api.expect("GET", "/apis")
            .await
            .ok(api_groups(&["v1beta2", "v1beta1"]));
        group_claims(&mut api, &members, &["hostpath.csi.k8s.io"; 2]).await;
        api.expect_page("/apis/groupsnapshot.storage.k8s.io/v1beta2/volumegroupsnapshotclasses")
            .await
            .ok(list_of(
                "VolumeGroupSnapshotClass",
                vec![
                    group_class("other-default", "other.csi", true),
                    group_class("plain", "hostpath.csi.k8s.io", false),
                    group_class("hp-group", "hostpath.csi.k8s.io", true),
                ],
            ));
        let post = api.expect("POST", GROUPS).await;
        assert_eq!(post.body["kind"], "VolumeGroupSnapshot");
        assert_eq!(post.body["metadata"]["name"], "relay-group-00aa");
        assert_eq!(
            post.body["metadata"]["labels"][naming::MANAGED_BY],
            naming::MANAGER
        );
        assert_eq!(
            post.body["metadata"]["annotations"]["relay.csi.dev/group-snapshot-id"],
            "group-00aa"
        );
        assert_eq!(
            post.body["spec"],
            json!({"volumeGroupSnapshotClassName": "hp-group",
                   "source": {"selector": {"matchExpressions": [
                       {"key": naming::VOLUME_UUID_LABEL, "operator": "In", "values": uuids}]}}})
        );
        let mut ready = post.body.clone();
        ready["metadata"]["uid"] = json!("uid-g");
        ready["status"] = json!({"readyToUse": true});
        post.reply(201, ready);
        let snap = |name: &str, claim: &str, owner: &str, ready: bool| {
            json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                   "metadata": {"name": name, "namespace": "relay", "ownerReferences": [
                       {"apiVersion": "groupsnapshot.storage.k8s.io/v1beta2", "kind": "VolumeGroupSnapshot",
                        "name": "relay-group-00aa", "uid": owner}]},
                   "spec": {"source": {"persistentVolumeClaimName": claim}},
                   "status": {"readyToUse": ready}})
        };
        // The group is ready before the member marks its VolumeSnapshots so:
        // the cut waits for them; another group's snapshot is no answer.
        api.expect_page(SNAPS).await.ok(list_of(
            "VolumeSnapshot",
            vec![
                snap(&first, &claims[0], "uid-g", true),
                snap("snapshot-2", &claims[1], "uid-g", false),
                snap("snapshot-x", &claims[1], "uid-other", true),
            ],
        ));
        let mut again = json!({"apiVersion": "groupsnapshot.storage.k8s.io/v1beta2",
            "kind": "VolumeGroupSnapshot",
            "metadata": {"name": "relay-group-00aa", "namespace": "relay", "uid": "uid-g"},
            "status": {"readyToUse": true}});
        api.expect("GET", &format!("{GROUPS}/relay-group-00aa"))
            .await
            .ok(again.take());
        api.expect_page(SNAPS).await.ok(list_of(
            "VolumeSnapshot",
            vec![
                snap(&first, &claims[0], "uid-g", true),
                snap("snapshot-2", &claims[1], "uid-g", true),
            ],
        ));
        api.expect_idle().await;
    });
    let GroupCut::Whole(snaps) = result.unwrap() else {
        panic!("a member with group snapshots cuts the group as one");
    };
    let names: Vec<_> = snaps.iter().map(|s| s.member_snapshot.clone()).collect();
    assert_eq!(names, vec![Some(first.clone()), Some("snapshot-2".into())]);
    assert_eq!(snaps[0].id, "snap-pvc-a");
    // A restore is a claim from the member's VolumeSnapshot; deleting the
    // snapshot alone asks nothing of the member (its group owns it).
    assert_eq!(naming::member_snapshot_of(&snaps[1]), "snapshot-2");
    let (result, ()) = tokio::join!(b.delete_snapshot(&snaps[0]), api.expect_idle());
    result.unwrap();
    let (result, ()) = tokio::join!(b.delete_group_snapshot(&group, &snaps), async {
        api.expect("GET", "/apis")
            .await
            .ok(api_groups(&["v1beta2", "v1beta1"]));
        api.expect("DELETE", &format!("{GROUPS}/relay-group-00aa"))
            .await
            .not_found();
    });
    result.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_member_that_cannot_cut_a_group_is_refused_unless_the_class_takes_one_by_one() {
    let (b, mut api) = east();
    let members = group_members(&b);
    let plain = group_of(BTreeMap::new());
    // No group snapshot API.
    let (result, ()) = tokio::join!(b.create_group_snapshot(&plain, &members), async {
        api.expect("GET", "/apis").await.ok(api_groups(&[]));
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    let text = err.to_string();
    assert!(
        text.contains("member cluster east serves no VolumeGroupSnapshot API"),
        "{text}"
    );
    assert!(text.contains("perVolumeSnapshots"), "{text}");
    // The API, but no class of the claims' driver.
    let (result, ()) = tokio::join!(b.create_group_snapshot(&plain, &members), async {
        api.expect("GET", "/apis")
            .await
            .ok(api_groups(&["v1beta2"]));
        group_claims(&mut api, &members, &["hostpath.csi.k8s.io"; 2]).await;
        api.expect_page("/apis/groupsnapshot.storage.k8s.io/v1beta2/volumegroupsnapshotclasses")
            .await
            .ok(list_of(
                "VolumeGroupSnapshotClass",
                vec![group_class("other", "other.csi", true)],
            ));
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.to_string()
            .contains("no VolumeGroupSnapshotClass of driver \"hostpath.csi.k8s.io\""),
        "{err}"
    );
    // Claims of two drivers.
    let (result, ()) = tokio::join!(b.create_group_snapshot(&plain, &members), async {
        api.expect("GET", "/apis")
            .await
            .ok(api_groups(&["v1beta1"]));
        group_claims(&mut api, &members, &["a.csi", "b.csi"]).await;
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.to_string().contains("two CSI drivers"), "{err}");
    // The class opts in to one by one: the member is not even asked.
    let per_volume = group_of(params(&[("perVolumeSnapshots", "true")]));
    let (result, ()) = tokio::join!(
        b.create_group_snapshot(&per_volume, &members),
        api.expect_idle()
    );
    assert!(matches!(result.unwrap(), GroupCut::OneByOne));
    // Its delete finds no member VolumeGroupSnapshot, and that is success;
    // as it is for a group whose cut failed before recording anything.
    let snaps: Vec<Snapshot> = members.iter().map(|(s, _)| s.clone()).collect();
    let (result, ()) = tokio::join!(b.delete_group_snapshot(&per_volume, &snaps), async {
        api.expect("GET", "/apis")
            .await
            .ok(api_groups(&["v1beta2"]));
        api.expect("DELETE", &format!("{GROUPS}/relay-group-00aa"))
            .await
            .not_found();
        api.expect_idle().await;
    });
    result.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_group_across_namespaces_is_refused_and_parameters_are_checked() {
    let (b, mut api) = east();
    let mut members = group_members(&b);
    let other = volume_named(
        &b,
        "pvc-c",
        params(&[("memberStorageClass", "fast"), ("memberNamespace", "other")]),
        vec![mount(AccessMode::SingleNodeWriter)],
        None,
    );
    members[1].1 = other;
    let plain = group_of(BTreeMap::new());
    let (result, ()) = tokio::join!(b.create_group_snapshot(&plain, &members), api.expect_idle());
    let err = result.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.to_string().contains("east/relay and east/other"),
        "{err}"
    );

    let check = |pairs: &[(&str, &str)]| {
        let map: HashMap<String, String> = params(pairs).into_iter().collect();
        let typed: GroupSnapshotParams = params::decode(&map, "parameters")?;
        b.check_group_snapshot_parameters(&typed)
    };
    check(&[("memberGroupSnapshotClass", "hp-group")]).unwrap();
    check(&[
        ("perVolumeSnapshots", "true"),
        ("memberSnapshotClass", "snap"),
    ])
    .unwrap();
    for bad in [
        &[("memberGroupSnapshotClass", "Not/A/Name")][..],
        &[
            ("perVolumeSnapshots", "true"),
            ("memberGroupSnapshotClass", "hp-group"),
        ],
        &[("memberSnapshotClass", "snap")],
        &[("perVolumeSnapshots", "yes")],
        &[("groupClass", "x")],
    ] {
        assert_eq!(
            check(bad).unwrap_err().code(),
            Code::InvalidArgument,
            "{bad:?}"
        );
    }
}

// A new controller recovers a group from the member VolumeGroupSnapshot's
// record, taken only where it agrees with the object, and ready only when
// the member shows it and a VolumeSnapshot of each claim ready.
#[tokio::test(start_paused = true)]
async fn groups_are_recovered_from_member_volume_group_snapshots() {
    let (b, mut api) = east();
    let members = group_members(&b);
    let mut group = group_of(BTreeMap::new());
    group.source_volume_ids = members.iter().map(|(_, v)| v.id.clone()).collect();
    group.snapshot_ids = members.iter().map(|(s, _)| s.id.clone()).collect();
    let claims: Vec<String> = members.iter().map(|(_, v)| pvc_name(v)).collect();
    let record = group_snapshot::GroupRecord {
        group: group.clone(),
        snapshots: members.iter().map(|(s, _)| s.clone()).collect(),
    };
    let object = |namespace: &str, ready: bool| {
        let mut obj = group_snapshot::manifest(&group_snapshot::GroupPlan {
            version: "v1beta2",
            name: "relay-group-00aa",
            namespace,
            class: "hp-group",
            group_id: "group-00aa",
            driver_name: "relay.csi.dev",
            uuids: vec![],
            record: serde_json::to_string(&record).unwrap(),
        });
        obj.metadata.uid = Some(format!("uid-{namespace}"));
        obj.data["status"] = json!({"readyToUse": ready});
        serde_json::to_value(&obj).unwrap()
    };
    let snaps = |owner: &str| {
        let items: Vec<Value> = claims
            .iter()
            .enumerate()
            .map(|(i, claim)| {
                json!({"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                   "metadata": {"name": format!("snapshot-{i}"), "namespace": "relay",
                                "ownerReferences": [{"apiVersion": "groupsnapshot.storage.k8s.io/v1beta2",
                                    "kind": "VolumeGroupSnapshot", "name": "relay-group-00aa", "uid": owner}]},
                   "spec": {"source": {"persistentVolumeClaimName": claim}},
                   "status": {"readyToUse": true}})
            })
            .collect();
        list_of("VolumeSnapshot", items)
    };
    let groups_path = "/apis/groupsnapshot.storage.k8s.io/v1beta2/volumegroupsnapshots";
    for ready in [true, false] {
        let (found, ()) = tokio::join!(b.recover_groups(), async {
            api.expect("GET", "/apis")
                .await
                .ok(api_groups(&["v1beta2"]));
            let list = api.expect_page(groups_path).await;
            assert!(list.query.contains("labelSelector"), "{}", list.query);
            // The same record on an object in another namespace: refused,
            // and nothing more is read for it; the namespace's snapshots are
            // read once for its groups.
            list.ok(list_of(
                "VolumeGroupSnapshot",
                vec![object("relay", ready), object("elsewhere", true)],
            ));
            api.expect_page(SNAPS).await.ok(snaps("uid-relay"));
            api.expect_idle().await;
        });
        let found = found.unwrap();
        assert_eq!(found.len(), 1, "{found:?}");
        let (g, s) = &found[0];
        assert_eq!(g.id, "group-00aa");
        assert_eq!(g.snapshot_ids, group.snapshot_ids);
        if ready {
            assert_eq!(g.lifecycle, Lifecycle::Ready);
            let names: Vec<_> = s.iter().map(|s| s.member_snapshot.as_deref()).collect();
            assert_eq!(names, vec![Some("snapshot-0"), Some("snapshot-1")]);
            assert!(s.iter().all(|s| s.lifecycle == Lifecycle::Ready));
        } else {
            // Not cut (yet): unfinished, for housekeeping to roll back.
            assert_eq!(g.lifecycle, Lifecycle::Provisioning);
            assert!(s.iter().all(|s| s.member_snapshot.is_none()));
        }
    }
}

// Which member class cuts a group, and each way the choice is refused; a
// VolumeGroupSnapshot of the relay's name cut for another group is not taken.
#[tokio::test(start_paused = true)]
async fn the_member_group_class_is_chosen_or_refused_saying_why() {
    let (cluster, mut api) = testing::member("east");
    let classes = "/apis/groupsnapshot.storage.k8s.io/v1beta2/volumegroupsnapshotclasses";
    /// A class named (or none), the member's classes, the choice or the refusal's words.
    type Case<'a> = (Option<&'a str>, Vec<Value>, Result<&'a str, &'a str>);
    let cases: Vec<Case> = vec![
        (
            Some("hp"),
            vec![group_class("hp", "hostpath", false)],
            Ok("hp"),
        ),
        (
            Some("gone"),
            vec![group_class("hp", "hostpath", true)],
            Err("has no VolumeGroupSnapshotClass gone"),
        ),
        (
            Some("other"),
            vec![group_class("other", "other.csi", true)],
            Err("is of driver \"other.csi\""),
        ),
        (
            None,
            vec![
                group_class("a", "hostpath", false),
                group_class("b", "hostpath", false),
            ],
            Err("none of the VolumeGroupSnapshotClasses"),
        ),
        (
            None,
            vec![
                group_class("a", "hostpath", true),
                group_class("b", "hostpath", true),
            ],
            Err("several default"),
        ),
    ];
    for (named, items, want) in cases {
        let (got, ()) = tokio::join!(
            group_snapshot::class_for(&cluster, "v1beta2", "hostpath", named),
            async {
                api.expect_page(classes)
                    .await
                    .ok(list_of("VolumeGroupSnapshotClass", items));
            }
        );
        match want {
            Ok(class) => assert_eq!(got.unwrap(), class),
            Err(text) => {
                let err = got.unwrap_err();
                assert_eq!(err.code(), Code::FailedPrecondition, "{err}");
                assert!(err.to_string().contains(text), "{err}");
            }
        }
    }
    let plan = group_snapshot::GroupPlan {
        version: "v1beta2",
        name: "relay-group-00aa",
        namespace: "relay",
        class: "hp",
        group_id: "group-00aa",
        driver_name: "relay.csi.dev",
        uuids: vec![],
        record: "{}".into(),
    };
    let obj = group_snapshot::manifest(&plan);
    let (got, ()) = tokio::join!(
        group_snapshot::ensure_ready(&cluster, &obj, &plan, &[], Duration::from_secs(1)),
        async {
            api.expect("POST", GROUPS).await.already_exists();
            api.expect("GET", &format!("{GROUPS}/relay-group-00aa"))
                .await
                .ok(json!({
                "apiVersion": "groupsnapshot.storage.k8s.io/v1beta2", "kind": "VolumeGroupSnapshot",
                "metadata": {"name": "relay-group-00aa", "namespace": "relay",
                             "annotations": {"relay.csi.dev/group-snapshot-id": "group-other"}}}));
        }
    );
    let err = got.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(
        err.to_string()
            .contains("was not cut for group snapshot group-00aa"),
        "{err}"
    );
}

#[path = "claim_uid_tests.rs"]
mod claim_uid;
