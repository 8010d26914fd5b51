//! RelayVolume: server-side applies per writer, removal, rebuild, the CRD.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{json, Value};

use super::*;
use crate::backends::member::backend::MemberBackend;
use crate::domain::capability::Capability;
use crate::domain::settings::DriverConfig;
use crate::domain::volume::{Attachment, Progress, Publication, Stage};
use crate::grpc::status::CsiCode;
use crate::k8s::testing;
use crate::ops::driver::Driver;
use crate::store::Store;

const RV: &str = "/apis/relay.csi.dev/v1alpha1/relayvolumes";
const VOL_ID: &str = "m-east-0123456789abcdef0123456789abcdef";

fn volume() -> Volume {
    let mut nodes = BTreeMap::new();
    nodes.insert(
        "worker-1".to_string(),
        NodeRecord {
            attachment: Some(Attachment {
                readonly: false,
                capability: Capability::plain_mount(),
                publish_context: [("relay.csi.dev/source-type".into(), "nfs".into())].into(),
                progress: Progress::Done,
            }),
            stage: Some(Stage {
                path: "/var/lib/kubelet/staging/x".into(),
                capability: Capability::plain_mount(),
                device: None,
                progress: Progress::Done,
            }),
            targets: [(
                "/var/lib/kubelet/pods/p/volumes/x".to_string(),
                Publication {
                    readonly: false,
                    capability: Capability::plain_mount(),
                    progress: Progress::Done,
                },
            )]
            .into(),
        },
    );
    Volume {
        id: VOL_ID.into(),
        name: "pvc-0a1b".into(),
        capacity_bytes: 1 << 30,
        backing: Backing::Member {
            member: "east".into(),
            namespace: "relay".into(),
            pvc: "relay-0123456789abcdef0123456789abcdef".into(),
            selected_node: None,
            claim_uid: None,
        },
        capabilities: vec![Capability::plain_mount()],
        parameters: [
            (
                "csi.storage.k8s.io/pvc/name".to_string(),
                "data".to_string(),
            ),
            (
                "csi.storage.k8s.io/pvc/namespace".to_string(),
                "shop".to_string(),
            ),
        ]
        .into(),
        mutable_parameters: BTreeMap::new(),
        source: None,
        topology: vec![],
        context: BTreeMap::new(),
        created_unix: 0,
        lifecycle: Lifecycle::Ready,
        ephemeral: false,
        nodes,
    }
}

fn echo(call: testing::Call) {
    let body = call.body.clone();
    call.ok(body)
}

#[tokio::test(start_paused = true)]
async fn the_controller_applies_spec_and_status_as_csi_relay() {
    let (host, mut api) = testing::host();
    let observer = RelayVolumeObserver::new(
        host,
        Role::Controller {
            with_node_state: false,
        },
    );
    let vol = volume();
    let (_, ()) = tokio::join!(observer.changed(&vol), async {
        let spec = api.expect("PATCH", &format!("{RV}/{VOL_ID}")).await;
        assert_eq!(spec.content_type, "application/apply-patch+yaml");
        assert!(
            spec.query.contains("fieldManager=csi-relay"),
            "{}",
            spec.query
        );
        assert!(spec.query.contains("force=true"), "{}", spec.query);
        let body = &spec.body;
        assert_eq!(body["apiVersion"], "relay.csi.dev/v1alpha1");
        assert_eq!(body["kind"], "RelayVolume");
        assert_eq!(
            body["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "csi-relay"
        );
        assert_eq!(body["spec"]["volumeId"], VOL_ID);
        assert_eq!(body["spec"]["member"], "east");
        assert_eq!(
            body["spec"]["memberPvc"],
            "relay/relay-0123456789abcdef0123456789abcdef"
        );
        assert_eq!(body["spec"]["hostPvc"], "shop/data");
        assert_eq!(body["spec"]["capacityBytes"], 1 << 30);
        // The record keeps the attachment, not the node-side mount state.
        // One JSON string, applied whole (never merged field by field).
        let record: Value =
            serde_json::from_str(body["spec"]["record"].as_str().unwrap_or_default())
                .unwrap_or_default();
        let node = &record["nodes"]["worker-1"];
        assert!(node["attachment"].is_object(), "{node}");
        assert!(node["stage"].is_null(), "{node}");
        assert_eq!(node["targets"], json!({}));
        assert!(body.get("status").is_none());
        echo(spec);

        let status = api.expect("PATCH", &format!("{RV}/{VOL_ID}/status")).await;
        assert!(
            status.query.contains("fieldManager=csi-relay"),
            "{}",
            status.query
        );
        assert_eq!(
            status.body["status"],
            json!({"phase": "PUBLISHED", "nodeSummary": "worker-1=PUBLISHED",
                   "nodes": [{"node": "worker-1", "attached": true, "readonly": false}]})
        );
        assert!(status.body.get("spec").is_none());
        echo(status);
        api.expect_idle().await;
    });

    let (_, ()) = tokio::join!(observer.removed(&vol), async {
        api.expect("DELETE", &format!("{RV}/{VOL_ID}"))
            .await
            .not_found();
    });
}

#[tokio::test(start_paused = true)]
async fn a_node_plugin_applies_only_its_own_entry() {
    let (host, mut api) = testing::host();
    let observer = RelayVolumeObserver::new(
        host,
        Role::Node {
            node_id: "worker-1".into(),
        },
    );
    let vol = volume();
    let (_, ()) = tokio::join!(observer.changed(&vol), async {
        let status = api.expect("PATCH", &format!("{RV}/{VOL_ID}/status")).await;
        assert!(
            status
                .query
                .contains("fieldManager=csi-relay-node-worker-1"),
            "{}",
            status.query
        );
        assert_eq!(
            status.body["status"],
            json!({"nodes": [{"node": "worker-1", "phase": "PUBLISHED",
                              "stagingPath": "/var/lib/kubelet/staging/x",
                              "targets": ["/var/lib/kubelet/pods/p/volumes/x"]}]})
        );
        // Not created by the controller yet: tolerated.
        status.not_found();
        api.expect_idle().await;
    });
    // Its entry goes when the node forgets the volume.
    let (_, ()) = tokio::join!(observer.removed(&vol), async {
        let status = api.expect("PATCH", &format!("{RV}/{VOL_ID}/status")).await;
        assert_eq!(status.body["status"], json!({"nodes": []}));
        echo(status);
    });
}

#[tokio::test(start_paused = true)]
async fn standalone_writes_node_state_too_and_an_unreachable_host_costs_a_bounded_wait() {
    let (host, mut api) = testing::host();
    let observer = RelayVolumeObserver::new(
        host,
        Role::for_mode(crate::domain::settings::Mode::All, "worker-1"),
    );
    let vol = volume();
    let status = status_of(
        &vol,
        &Role::for_mode(crate::domain::settings::Mode::All, "x"),
        None,
    );
    let nodes = status.nodes.unwrap_or_default();
    assert_eq!(nodes[0].phase.as_deref(), Some("PUBLISHED"));
    assert_eq!(nodes[0].attached, Some(true));
    let started = tokio::time::Instant::now();
    let (_, _pending) = tokio::join!(observer.changed(&vol), async {
        api.expect("PATCH", &format!("{RV}/{VOL_ID}")).await.hang()
    });
    assert_eq!(started.elapsed(), OBSERVER_TIMEOUT);
}

/// The RelayVolume this build writes for `vol`, as a listing returns it.
fn item(vol: &Volume) -> Value {
    json!({"apiVersion": "relay.csi.dev/v1alpha1", "kind": "RelayVolume",
           "metadata": {"name": vol.id},
           "spec": serde_json::to_value(spec_of(vol).unwrap()).unwrap()})
}

#[tokio::test(start_paused = true)]
async fn a_controller_without_its_store_rebuilds_it_from_relay_volumes() {
    let tmp = tempfile::tempdir().unwrap();
    let (driver, host, _member_api, mut api) = testing::controller(tmp.path());
    let known = {
        let mut v = volume();
        v.id = "m-east-ffffffffffffffffffffffffffffffff".into();
        v.name = "pvc-known".into();
        v
    };
    driver.put_volume(&known).await.unwrap();
    // In the store and in no RelayVolume: a controller stopped between the
    // two writes.
    let unlisted = {
        let mut v = volume();
        v.id = "m-east-eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee".into();
        v.name = "pvc-unlisted".into();
        v
    };
    driver.put_volume(&unlisted).await.unwrap();

    let lost = volume();
    // Records of volumes deleted while their member was declared lost: by
    // their phase, or by their label alone.
    let released = |id: &str, by_phase: bool| -> Value {
        let mut v = volume();
        v.id = id.into();
        v.name = format!("pvc-{id}");
        let mut rv = item(&v);
        if by_phase {
            rv["status"] = json!({"phase": "RELEASED", "released": "left there"});
        } else {
            rv["metadata"]["labels"] = json!({"relay.csi.dev/released-from": "east"});
        }
        rv
    };
    let released_ids = [
        "m-east-dddddddddddddddddddddddddddddddd",
        "m-east-cccccccccccccccccccccccccccccccc",
    ];
    let (restored, ()) = tokio::join!(rebuild(&host, &driver.store), async {
        api.expect("GET", RV).await.ok(json!({
            "apiVersion": "relay.csi.dev/v1alpha1", "kind": "RelayVolumeList", "metadata": {},
            "items": [item(&known), item(&lost),
                      released(released_ids[0], true), released(released_ids[1], false),
                      {"apiVersion": "relay.csi.dev/v1alpha1", "kind": "RelayVolume",
                       "metadata": {"name": "junk"},
                       "spec": {"volumeId": "junk", "volumeName": "x", "capacityBytes": 0,
                                "record": {"not": "a record"}}}]}));
        api.expect_idle().await;
    });
    let rebuilt = restored.unwrap();
    assert_eq!(rebuilt.restored, 1);
    for id in released_ids {
        assert!(
            driver.find_volume(id).await.unwrap().is_none(),
            "a released volume's record is kept for the operator, never restored as a volume"
        );
    }
    assert!(rebuilt.lagging.contains(&unlisted.id), "{rebuilt:?}");
    assert!(!rebuilt.lagging.contains(&known.id), "{rebuilt:?}");
    let back = driver.volume(VOL_ID).await.unwrap();
    assert_eq!(back.name, "pvc-0a1b");
    assert_eq!(back.backing, lost.backing);
    let node = &back.nodes["worker-1"];
    assert!(node.attachment.is_some() && node.stage.is_none() && node.targets.is_empty());
    assert!(
        node.attachment.as_ref().unwrap().publish_context.is_empty(),
        "what nodes mount is derived from the member again, never taken from the RelayVolume"
    );
    let by_name = driver
        .db(|s| s.volume_by_name("pvc-0a1b"))
        .await
        .unwrap()
        .expect("indexed by name too, so CreateVolume retries find it");
    assert_eq!(by_name.id, VOL_ID);
}

#[tokio::test(start_paused = true)]
async fn a_host_without_the_crd_is_told_how_to_install_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (east, _member_api) = testing::member("east");
    let (host, mut api) = testing::host();
    let backend = MemberBackend::new(vec![east], None, "relay.csi.dev");
    let config = DriverConfig::for_tests(tmp.path(), "ctrl", u64::MAX);
    let driver = Driver::new(config, Store::open(tmp.path()).unwrap(), Arc::new(backend));
    let (result, ()) = tokio::join!(rebuild(&host, &driver.store), async {
        api.expect("GET", RV).await.status(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.to_string().contains("csi-relay crd"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn relay_volumes_of_a_newer_format_stop_the_rebuild_before_anything_is_written() {
    let tmp = tempfile::tempdir().unwrap();
    let (driver, host, _member_api, mut api) = testing::controller(tmp.path());
    let vol = volume();
    let mut newer = item(&vol);
    newer["spec"]["formatVersion"] = json!(FORMAT + 1);
    // Listed by pages; a page before the newer object's is not restored.
    let first = {
        let mut v = volume();
        v.id = "m-east-ffffffffffffffffffffffffffffffff".into();
        v.name = "pvc-first".into();
        v
    };
    let (result, ()) = tokio::join!(rebuild(&host, &driver.store), async {
        let call = api.expect("GET", RV).await;
        assert_eq!(
            call.query_map().get("limit").map(String::as_str),
            Some("500")
        );
        call.ok(json!({
            "apiVersion": "relay.csi.dev/v1alpha1", "kind": "RelayVolumeList",
            "metadata": {"continue": "page-2"}, "items": [item(&first)]}));
        let call = api.expect_page(RV).await;
        assert_eq!(
            call.query_map().get("continue").map(String::as_str),
            Some("page-2")
        );
        call.ok(json!({
            "apiVersion": "relay.csi.dev/v1alpha1", "kind": "RelayVolumeList", "metadata": {},
            "items": [newer]}));
        // Nothing is written: no request follows the listing.
        api.expect_idle().await;
    });
    let err = result.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("format {}", FORMAT + 1))
            && msg.contains(&format!("the format {FORMAT} this build")),
        "{msg}"
    );
    assert!(driver.find_volume(&vol.id).await.unwrap().is_none());
    assert!(driver.find_volume(&first.id).await.unwrap().is_none());
    // What earlier builds wrote (no formatVersion) is format 1.
    let mut old = item(&vol);
    old["spec"].as_object_mut().unwrap().remove("formatVersion");
    let parsed: RelayVolume = serde_json::from_value(old).unwrap();
    assert_eq!(parsed.spec.format_version, 1);
}

#[test]
fn the_crd_renders_with_its_printer_columns() {
    let yaml = crd_yaml().unwrap();
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_saphyr::from_str(&yaml).unwrap();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("relayvolumes.relay.csi.dev")
    );
    assert_eq!(crd.spec.scope, "Cluster");
    let version = &crd.spec.versions[0];
    let columns: Vec<&str> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        [
            "PHASE",
            "MEMBER",
            "MEMBER-PVC",
            "IMPORTS",
            "MOVE",
            "NODES",
            "AGE",
            "LAST-ERROR"
        ]
    );
    assert!(version
        .subresources
        .as_ref()
        .is_some_and(|s| s.status.is_some()));
    assert!(yaml.contains("x-kubernetes-list-type: map"), "{yaml}");
}

#[test]
fn object_names_are_valid_for_any_id() {
    assert_eq!(object_name(VOL_ID), VOL_ID);
    assert_eq!(object_name("vol-abc"), "vol-abc");
    let odd = object_name("Inline_Vol");
    assert!(naming::is_dns_subdomain(&odd), "{odd}");
    assert_eq!(odd, object_name("Inline_Vol"));
    let long = "n".repeat(200);
    assert!(Role::Node { node_id: long }.field_manager().len() <= 128);
}

#[test]
fn an_edited_relay_volume_cannot_point_nodes_elsewhere() {
    let mut v = volume();
    v.nodes
        .get_mut("worker-1")
        .and_then(|n| n.attachment.as_mut())
        .unwrap()
        .publish_context
        .insert("type".into(), "hostPath".into());
    let kept = untrusted(v.clone()).unwrap();
    assert!(kept.nodes["worker-1"]
        .attachment
        .as_ref()
        .unwrap()
        .publish_context
        .is_empty());
    let with_backing = |f: &dyn Fn(&mut Backing)| {
        let mut w = v.clone();
        f(&mut w.backing);
        untrusted(w)
    };
    // Any claim name passes here (it may be the host PVC's); the backend
    // then acts only on a claim carrying this volume's id.
    let err = with_backing(&|b| {
        if let Backing::Member { pvc, .. } = b {
            *pvc = "../Someone_Else".into()
        }
    })
    .unwrap_err();
    assert!(err.contains("../Someone_Else"), "{err}");
    let err = with_backing(&|b| {
        if let Backing::Member { member, .. } = b {
            *member = "west".into()
        }
    })
    .unwrap_err();
    assert!(err.contains("west"), "{err}");
    assert!(with_backing(&|b| *b = Backing::Directory).is_err());
    let mut odd = v.clone();
    odd.id = "vol-local".into();
    assert!(untrusted(odd).is_err());
}

// Split deployment and virtual nodes: the controller's record only knows
// attachments; PHASE and NODES fold in every other writer's entries.
#[test]
fn the_summary_is_the_furthest_state_any_writer_reported() {
    let mut vol = volume();
    let controller_view = controller_record(&vol);
    vol.nodes = controller_view.nodes;
    let ctrl = Role::for_mode(crate::domain::settings::Mode::Controller, "c");
    let own = status_of(&vol, &ctrl, None);
    assert_eq!(own.phase.as_deref(), Some("NODE_READY"));
    let seen = RelayVolumeStatus {
        nodes: Some(vec![
            RelayNodeStatus {
                node: "worker-1".into(),
                attached: Some(true),
                phase: Some("PUBLISHED".into()),
                ..Default::default()
            },
            RelayNodeStatus {
                node: "east/member-node-1".into(),
                member: Some("east".into()),
                phase: Some("VOL_READY".into()),
                pods: Some(vec!["shop/web-0".into()]),
                ..Default::default()
            },
            // Garbage from an editor is ignored, not trusted.
            RelayNodeStatus {
                node: "x".into(),
                phase: Some("EXPLODED".into()),
                ..Default::default()
            },
        ]),
        ..Default::default()
    };
    let folded = status_of(&vol, &ctrl, Some(&seen));
    assert_eq!(folded.phase.as_deref(), Some("PUBLISHED"));
    assert_eq!(
        folded.node_summary.as_deref(),
        Some("east/member-node-1=VOL_READY,worker-1=PUBLISHED")
    );
    // The controller writes only its own entry fields.
    let entries = folded.nodes.unwrap_or_default();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].phase, None);
    // A virtual-node volume: nothing but the member reports.
    vol.nodes.clear();
    let only_member = RelayVolumeStatus {
        nodes: Some(vec![RelayNodeStatus {
            node: "east/member-node-1".into(),
            phase: Some("PUBLISHED".into()),
            ..Default::default()
        }]),
        ..Default::default()
    };
    assert_eq!(summary(&vol, Some(&only_member)).0, "PUBLISHED");
    vol.lifecycle = Lifecycle::Deleting;
    assert_eq!(summary(&vol, Some(&only_member)).0, "DELETING");
}

#[test]
fn deploy_carries_the_crd_the_code_renders() {
    let shipped = include_str!("../../deploy/crds/relayvolume-crd.yaml");
    let body: String = shipped
        .lines()
        .skip_while(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    let rendered = crd_yaml().unwrap();
    assert_eq!(
        body.trim_end(),
        rendered.trim_end(),
        "deploy/crds/relayvolume-crd.yaml is stale: regenerate it with `csi-relay crd`"
    );
}

// A record survives a server-side apply round trip whole: it is a string,
// and records stored as objects by earlier versions are still read.
#[test]
fn records_are_one_string_and_old_objects_are_read() {
    let spec = spec_of(&volume()).unwrap();
    let json = serde_json::to_value(&spec).unwrap();
    assert!(json["record"].is_string(), "{}", json["record"]);
    let mut old = json.clone();
    old["record"] = serde_json::from_str(json["record"].as_str().unwrap()).unwrap();
    let back: RelayVolumeSpec = serde_json::from_value(old).unwrap();
    let vol: Volume = serde_json::from_str(&back.record).unwrap();
    assert_eq!(vol.id, VOL_ID);
}

// Every controller status write carries the term it writes under, beside
// the fields it sets; without an election there is no term to send.
#[test]
fn controller_status_writes_carry_the_leader_term() {
    let body = controller_status_body("v", serde_json::json!({"lastError": "x"}), Some(7));
    assert_eq!(body["status"]["leaderTerm"], 7);
    assert_eq!(body["status"]["lastError"], "x");
    assert_eq!(body["metadata"]["name"], "v");
    let none = controller_status_body("v", serde_json::json!({}), None);
    assert_eq!(none["status"], serde_json::json!({}));
}

// The CRD holds status.leaderTerm to never going back, as spec.leaderTerm.
#[test]
fn the_crd_refuses_a_status_term_that_goes_back() {
    let crd = serde_json::to_value(RelayVolume::crd()).unwrap();
    let field = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        ["properties"]["leaderTerm"];
    let rules = field["x-kubernetes-validations"].as_array().expect("rules");
    assert_eq!(rules.len(), 1, "{field}");
    assert_eq!(rules[0]["rule"], "self >= oldSelf");
    assert!(rules[0]["message"]
        .as_str()
        .unwrap()
        .contains("no longer leads"));
}

// A member's word on its claim is told apart from a call's failure: a call
// that succeeds clears only the latter.
#[test]
fn a_members_word_is_not_a_calls_failure() {
    let word = member_word(
        "east",
        "shop",
        "data",
        "ProvisioningFailed: rpc error: code = OutOfRange",
    );
    assert!(is_member_word(&word), "{word}");
    assert!(!is_member_word(
        "CreateVolume: UNAVAILABLE: member cluster east: PersistentVolumeClaim shop/data is Pending"
    ));
    assert!(!is_member_word("member east: something else"));
}

// The highest term recorded, spec or status, over every page; none when
// no object records one or the CRD is not served.
#[tokio::test]
async fn the_highest_term_is_read_from_every_page() {
    let (host, mut api) = testing::host();
    const PATH: &str = "/apis/relay.csi.dev/v1alpha1/relayvolumes";
    let object = |name: &str, spec: Option<i64>, status: Option<i64>| {
        let mut rv = RelayVolume::new(name, spec_of(&volume()).unwrap());
        rv.spec.leader_term = spec;
        rv.status = Some(RelayVolumeStatus {
            leader_term: status,
            ..Default::default()
        });
        serde_json::to_value(rv).unwrap()
    };
    let list = |items: Vec<Value>, next: &str| {
        json!({"apiVersion": "relay.csi.dev/v1alpha1", "kind": "RelayVolumeList",
               "metadata": {"continue": next}, "items": items})
    };
    let (found, ()) = tokio::join!(highest_term(&host), async {
        api.expect_page(PATH).await.ok(list(
            vec![object("a", Some(3), None), object("b", None, None)],
            "more",
        ));
        api.expect_page(PATH)
            .await
            .ok(list(vec![object("c", Some(4), Some(7))], ""));
    });
    assert_eq!(found.unwrap(), Some(7));
    let (found, ()) = tokio::join!(highest_term(&host), async {
        api.expect_page(PATH)
            .await
            .ok(list(vec![object("b", None, None)], ""));
    });
    assert_eq!(found.unwrap(), None);
    let (found, ()) = tokio::join!(highest_term(&host), async {
        api.expect_page(PATH).await.reply(
            404,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound"}),
        );
    });
    assert_eq!(found.unwrap(), None, "no CRD: nothing recorded");
}

// What a call's success clears: a call's failure shown, never the member's
// word on its claim (member_problems clears that once the claim binds).
#[tokio::test]
async fn a_calls_success_clears_a_calls_failure_not_the_members_word() {
    let (host, _api) = testing::host();
    let (reader, mut writer) = crate::k8s::relay_volume::new_view();
    let observer = RelayVolumeObserver::new(
        host,
        Role::Controller {
            with_node_state: false,
        },
    )
    .with_view(reader);
    let id = VOL_ID;
    let shown = |text: &str| {
        let mut rv = RelayVolume::new(&object_name(id), spec_of(&volume()).unwrap());
        rv.status = Some(RelayVolumeStatus {
            last_error: Some(text.to_string()),
            ..Default::default()
        });
        crate::k8s::relay_volume::applied(rv)
    };
    writer.apply_watcher_event(&shown(&member_word(
        "east",
        "shop",
        "data",
        "ProvisioningFailed: no",
    )));
    assert!(!observer.shows_failure(id));
    assert!(observer.shows_member_word(id));
    writer.apply_watcher_event(&shown("ControllerPublishVolume: Unavailable: no"));
    assert!(observer.shows_failure(id));
    assert!(!observer.shows_member_word(id));
}

#[test]
fn the_controller_shows_each_import_of_a_shared_volume_with_its_state() {
    let mut vol = volume();
    let attached_in = |member: &str, progress: Progress| NodeRecord {
        attachment: Some(Attachment {
            readonly: false,
            capability: Capability::plain_mount(),
            publish_context: [(member_source::MEMBER.to_string(), member.to_string())].into(),
            progress,
        }),
        ..Default::default()
    };
    let controller = Role::Controller {
        with_node_state: false,
    };
    // Used in its own member only: no import.
    vol.nodes
        .insert("east-host".into(), attached_in("east", Progress::Done));
    assert_eq!(status_of(&vol, &controller, None).imports, None);
    for (node, member, progress) in [
        ("west-a", "west", Progress::Done),
        ("west-b", "west", Progress::Removing),
        ("north-a", "north", Progress::Removing),
        ("south-a", "south", Progress::Applying),
        ("south-b", "south", Progress::Removing),
    ] {
        vol.nodes.insert(node.into(), attached_in(member, progress));
    }
    let imports = status_of(&vol, &controller, None).imports.unwrap();
    let shown: Vec<(&str, &str, Vec<&str>)> = imports
        .iter()
        .map(|i| {
            (
                i.member.as_str(),
                i.state.as_str(),
                i.nodes.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("north", "RELEASING", vec!["north-a"]),
            ("south", "IMPORTING", vec!["south-a", "south-b"]),
            ("west", "IMPORTED", vec!["west-a", "west-b"]),
        ]
    );
    // A node plugin writes no imports: they are the controller's.
    let node = Role::Node {
        node_id: "west-a".into(),
    };
    assert_eq!(status_of(&vol, &node, None).imports, None);
    // The JSON the API server gets: the field, and its absence once none is
    // left (server-side apply then removes what this manager set).
    let json = serde_json::to_value(status_of(&vol, &controller, None)).unwrap();
    assert_eq!(json["imports"][2]["state"], "IMPORTED", "{json}");
    vol.nodes.retain(|n, _| n == "east-host");
    let json = serde_json::to_value(status_of(&vol, &controller, None)).unwrap();
    assert!(json.get("imports").is_none(), "{json}");
}
