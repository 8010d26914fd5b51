//! Reconciles against a scripted API server (`tower_test::mock`): each test
//! answers the requests in turn and asserts exactly what was asked.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::runtime::controller::Action;
use serde_json::{json, Value};

use super::controller::error_policy;
use super::reconcile::reconcile;
use super::*;
use crate::k8s::testing::{client, Call, MockApi};

const DRIVER: &str = "relay.csi.dev";
const NODE: &str = "vn-east";
const UID: &str = "0b1c2d3e-uid";
const NODE_PATH: &str = "/api/v1/nodes/vn-east";
const CSINODE_PATH: &str = "/apis/storage.k8s.io/v1/csinodes/vn-east";
const NODE_KEY: &str = "topology.relay.csi.dev/node";
const MEMBER_KEY: &str = "topology.relay.csi.dev/member";
const CLUSTER_LABEL: &str = "kosmos.io/cluster-name";
const APPLY: &str = "application/apply-patch+yaml";
const MERGE: &str = "application/merge-patch+json";

fn config() -> RegistrarConfig {
    RegistrarConfig {
        member_label: Some(CLUSTER_LABEL.into()),
        ..RegistrarConfig::new(DRIVER)
    }
}

fn context(config: RegistrarConfig) -> (Arc<Context>, MockApi) {
    let (client, api) = client();
    (Arc::new(Context::new(client, config)), api)
}

/// The server-side apply and JSON merge patch of ours.
trait OurPatches {
    fn assert_apply(&self);
    fn assert_merge(&self);
}

impl OurPatches for Call {
    /// A server-side apply of ours.
    fn assert_apply(&self) {
        assert_eq!(self.content_type, APPLY);
        assert_eq!(
            self.query_map(),
            BTreeMap::from([
                ("fieldManager".to_string(), FIELD_MANAGER.to_string()),
                ("force".to_string(), "true".to_string()),
            ])
        );
    }

    /// A JSON merge patch of ours.
    fn assert_merge(&self) {
        assert_eq!(self.content_type, MERGE);
        assert_eq!(
            self.query_map(),
            BTreeMap::from([("fieldManager".to_string(), FIELD_MANAGER.to_string())])
        );
    }
}

/// A managedFields entry of ours owning these labels.
fn our_labels(keys: &[&str]) -> Value {
    let labels: serde_json::Map<String, Value> =
        keys.iter().map(|k| (format!("f:{k}"), json!({}))).collect();
    json!({"manager": FIELD_MANAGER, "operation": "Apply", "apiVersion": "v1",
           "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": labels}}})
}

fn kubelet_fields() -> Value {
    json!({"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
           "fieldsType": "FieldsV1",
           "fieldsV1": {"f:metadata": {"f:labels": {"f:topology.relay.csi.dev/node": {}},
                                       "f:annotations": {"f:csi.volume.kubernetes.io/nodeid": {}}}}})
}

struct NodeSpec<'a> {
    virtual_node: bool,
    labels: Value,
    node_id: Option<&'a str>,
    managed: Vec<Value>,
}

impl Default for NodeSpec<'_> {
    fn default() -> Self {
        NodeSpec {
            virtual_node: true,
            labels: json!({}),
            node_id: None,
            managed: vec![],
        }
    }
}

fn node_json(spec: &NodeSpec<'_>, rv: &str) -> Value {
    let mut node = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "uid": UID,
            "resourceVersion": rv,
            "labels": spec.labels,
            "managedFields": spec.managed,
        },
        "spec": {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]},
    });
    if spec.virtual_node {
        node["spec"]["taints"]
            .as_array_mut()
            .expect("taints")
            .push(json!({"key": "kosmos.io/node", "value": "true", "effect": "NoSchedule"}));
    }
    if let Some(id) = spec.node_id {
        node["metadata"]["annotations"] = json!({ NODE_ID_ANNOTATION: id });
    }
    node
}

fn node(spec: NodeSpec<'_>) -> Arc<Node> {
    Arc::new(serde_json::from_value(node_json(&spec, "100")).expect("a Node"))
}

fn csinode_entry(keys: &[&str]) -> Value {
    json!({"name": DRIVER, "nodeID": NODE, "topologyKeys": keys})
}

fn our_csinode_fields() -> Value {
    json!({"manager": FIELD_MANAGER, "operation": "Apply", "apiVersion": "storage.k8s.io/v1",
           "fieldsType": "FieldsV1",
           "fieldsV1": {
               "f:metadata": {"f:ownerReferences": {format!("k:{{\"uid\":\"{UID}\"}}"): {}}},
               "f:spec": {"f:drivers": {format!("k:{{\"name\":\"{DRIVER}\"}}"):
                   {".": {}, "f:name": {}, "f:nodeID": {}, "f:topologyKeys": {}}}}}})
}

fn csinode(drivers: Vec<Value>, managed: Vec<Value>) -> Value {
    json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {
            "name": NODE,
            "resourceVersion": "7",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": UID}],
            "managedFields": managed,
        },
        "spec": {"drivers": drivers},
    })
}

fn ebs_entry() -> Value {
    json!({"name": "ebs.csi.aws.com", "nodeID": "i-0abc", "topologyKeys": ["topology.ebs.csi.aws.com/zone"]})
}

fn expected_csinode_apply(keys: &[&str]) -> Value {
    json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {
            "name": NODE,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": UID}],
        },
        "spec": {"drivers": [{"name": DRIVER, "nodeID": NODE, "topologyKeys": keys}]},
    })
}

async fn run_reconcile(
    node: Arc<Node>,
    config: RegistrarConfig,
    script: impl AsyncFnOnce(&mut MockApi),
) -> Result<Action, ReconcileError> {
    let (ctx, mut api) = context(config);
    let (result, ()) = tokio::join!(reconcile(node, ctx.clone()), script(&mut api));
    drop(ctx);
    api.expect_done().await;
    result
}

#[tokio::test]
async fn a_new_virtual_node_gets_labels_then_annotation_then_csinode() {
    let spec = NodeSpec {
        labels: json!({CLUSTER_LABEL: "east", "kubernetes.io/hostname": NODE}),
        ..Default::default()
    };
    let vn = node(spec);
    let result = run_reconcile(vn, config(), async |api| {
        let labels = api.expect("PATCH", NODE_PATH).await;
        labels.assert_apply();
        assert_eq!(
            labels.body,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": NODE,
                "labels": {MEMBER_KEY: "east", NODE_KEY: NODE},
            }})
        );
        // The API server answers with the node as written, at a new version.
        let written = NodeSpec {
            labels: json!({CLUSTER_LABEL: "east", MEMBER_KEY: "east", NODE_KEY: NODE}),
            managed: vec![our_labels(&[MEMBER_KEY, NODE_KEY])],
            ..Default::default()
        };
        labels.ok(node_json(&written, "101"));

        let annotation = api.expect("PATCH", NODE_PATH).await;
        annotation.assert_merge();
        assert_eq!(
            annotation.body,
            json!({"metadata": {
                "resourceVersion": "101",
                "annotations": {NODE_ID_ANNOTATION: r#"{"relay.csi.dev":"vn-east"}"#},
            }})
        );
        annotation.ok(node_json(&written, "102"));

        api.expect("GET", CSINODE_PATH)
            .await
            .status(404, "NotFound", "NotFound");
        let apply = api.expect("PATCH", CSINODE_PATH).await;
        apply.assert_apply();
        assert_eq!(apply.body, expected_csinode_apply(&[MEMBER_KEY, NODE_KEY]));
        apply.echo();
    })
    .await;
    assert_eq!(
        result.expect("reconciled"),
        Action::requeue(RESYNC_INTERVAL)
    );
}

// With a single member cluster configured, a virtual node without the
// member label still gets the member topology (the PVs of member volumes
// require it of the node they are used on).
#[tokio::test]
async fn with_one_member_every_virtual_node_gets_its_topology() {
    let spec = NodeSpec {
        labels: json!({"kubernetes.io/hostname": NODE}),
        node_id: Some(r#"{"relay.csi.dev":"vn-east"}"#),
        ..Default::default()
    };
    let mut single = config();
    single.default_member = Some("solo".into());
    let result = run_reconcile(node(spec), single, async |api| {
        let labels = api.expect("PATCH", NODE_PATH).await;
        assert_eq!(
            labels.body["metadata"]["labels"],
            json!({MEMBER_KEY: "solo", NODE_KEY: NODE})
        );
        let written = NodeSpec {
            labels: json!({MEMBER_KEY: "solo", NODE_KEY: NODE}),
            managed: vec![our_labels(&[MEMBER_KEY, NODE_KEY])],
            node_id: Some(r#"{"relay.csi.dev":"vn-east"}"#),
            ..Default::default()
        };
        labels.ok(node_json(&written, "101"));
        api.expect("GET", CSINODE_PATH)
            .await
            .status(404, "NotFound", "NotFound");
        let apply = api.expect("PATCH", CSINODE_PATH).await;
        assert_eq!(apply.body, expected_csinode_apply(&[MEMBER_KEY, NODE_KEY]));
        apply.echo();
    })
    .await;
    assert!(result.is_ok());
}

#[tokio::test]
async fn other_drivers_keep_their_annotation_pair_and_csinode_entry() {
    let spec = NodeSpec {
        labels: json!({NODE_KEY: NODE}),
        managed: vec![our_labels(&[NODE_KEY])],
        node_id: Some(r#"{"ebs.csi.aws.com":"i-0abc"}"#),
        ..Default::default()
    };
    // No member label configured: only the node key.
    let config = RegistrarConfig::new(DRIVER);
    let result = run_reconcile(node(spec), config, async |api| {
        // The labels are ours already: no label write.
        let annotation = api.expect("PATCH", NODE_PATH).await;
        annotation.assert_merge();
        assert_eq!(
            annotation.body,
            json!({"metadata": {
                "resourceVersion": "100",
                "annotations": {NODE_ID_ANNOTATION:
                    r#"{"ebs.csi.aws.com":"i-0abc","relay.csi.dev":"vn-east"}"#},
            }})
        );
        annotation.ok(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));

        let kubelets = json!({"manager": "kubelet", "operation": "Update",
                              "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:drivers": {}}}});
        api.expect("GET", CSINODE_PATH)
            .await
            .ok(csinode(vec![ebs_entry()], vec![kubelets]));
        let apply = api.expect("PATCH", CSINODE_PATH).await;
        apply.assert_apply();
        // Only our entry: the list map keyed by name keeps the other one.
        assert_eq!(apply.body, expected_csinode_apply(&[NODE_KEY]));
        apply.echo();
    })
    .await;
    assert_eq!(
        result.expect("reconciled"),
        Action::requeue(RESYNC_INTERVAL)
    );
}

#[tokio::test]
async fn a_malformed_annotation_is_replaced_with_ours() {
    let spec = NodeSpec {
        labels: json!({NODE_KEY: NODE}),
        managed: vec![our_labels(&[NODE_KEY])],
        node_id: Some("relay.csi.dev=vn-east"),
        ..Default::default()
    };
    let result = run_reconcile(node(spec), RegistrarConfig::new(DRIVER), async |api| {
        let annotation = api.expect("PATCH", NODE_PATH).await;
        assert_eq!(
            annotation.body["metadata"]["annotations"],
            json!({NODE_ID_ANNOTATION: r#"{"relay.csi.dev":"vn-east"}"#})
        );
        annotation.ok(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
        api.expect("GET", CSINODE_PATH).await.ok(csinode(
            vec![csinode_entry(&[NODE_KEY])],
            vec![our_csinode_fields()],
        ));
    })
    .await;
    assert_eq!(
        result.expect("reconciled"),
        Action::requeue(RESYNC_INTERVAL)
    );
}

#[tokio::test]
async fn a_registered_node_costs_one_get() {
    let spec = NodeSpec {
        labels: json!({CLUSTER_LABEL: "east", MEMBER_KEY: "east", NODE_KEY: NODE}),
        managed: vec![kubelet_fields(), our_labels(&[MEMBER_KEY, NODE_KEY])],
        node_id: Some(r#"{"ebs.csi.aws.com":"i-0abc","relay.csi.dev":"vn-east"}"#),
        ..Default::default()
    };
    let result = run_reconcile(node(spec), config(), async |api| {
        api.expect("GET", CSINODE_PATH).await.ok(csinode(
            vec![ebs_entry(), csinode_entry(&[MEMBER_KEY, NODE_KEY])],
            vec![our_csinode_fields()],
        ));
    })
    .await;
    assert_eq!(
        result.expect("reconciled"),
        Action::requeue(RESYNC_INTERVAL)
    );
}

#[tokio::test]
async fn a_csinode_entry_that_is_stale_or_not_ours_is_applied_again() {
    let spec = || NodeSpec {
        labels: json!({CLUSTER_LABEL: "east", MEMBER_KEY: "east", NODE_KEY: NODE}),
        managed: vec![our_labels(&[MEMBER_KEY, NODE_KEY])],
        node_id: Some(r#"{"relay.csi.dev":"vn-east"}"#),
        ..Default::default()
    };
    let stale = csinode(vec![csinode_entry(&[NODE_KEY])], vec![our_csinode_fields()]);
    let not_ours = csinode(vec![csinode_entry(&[MEMBER_KEY, NODE_KEY])], vec![]);
    let mut wrong_owner = csinode(
        vec![csinode_entry(&[MEMBER_KEY, NODE_KEY])],
        vec![our_csinode_fields()],
    );
    wrong_owner["metadata"]["ownerReferences"][0]["uid"] = json!("an-older-node");
    for (live, keys_changed) in [(stale, true), (not_ours, false), (wrong_owner, false)] {
        let result = run_reconcile(node(spec()), config(), async |api| {
            api.expect("GET", CSINODE_PATH).await.ok(live.clone());
            if keys_changed {
                // Topology keys are immutable in place: the entry goes first
                // (our apply without it), then comes back with the new keys.
                let drop = api.expect("PATCH", CSINODE_PATH).await;
                assert_eq!(
                    drop.body,
                    json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode",
                           "metadata": {"name": NODE, "ownerReferences": [
                               {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": UID}]}})
                );
                drop.echo();
            }
            let apply = api.expect("PATCH", CSINODE_PATH).await;
            assert_eq!(apply.body, expected_csinode_apply(&[MEMBER_KEY, NODE_KEY]));
            apply.echo();
        })
        .await;
        assert!(result.is_ok(), "{live}");
    }
}

/// A Kosmos node as Kosmos makes it: the member cluster only in the
/// `kosmos-io/owned-by-cluster` annotation, no label naming it.
fn kosmos_node(owner: &str, labels: Value) -> Arc<Node> {
    let spec = NodeSpec {
        labels,
        node_id: Some(r#"{"relay.csi.dev":"vn-east"}"#),
        ..Default::default()
    };
    let mut json = node_json(&spec, "100");
    json["metadata"]["annotations"][KOSMOS_MEMBER_ANNOTATION] = owner.into();
    Arc::new(serde_json::from_value(json).expect("a Node"))
}

// With two members there is no default: the annotation Kosmos writes is
// what names the node's member, and a member label, where set, wins.
#[tokio::test]
async fn kosmos_owner_annotation_names_the_member_when_no_label_does() {
    let two_members = RegistrarConfig {
        member_annotation: Some(KOSMOS_MEMBER_ANNOTATION.into()),
        ..config()
    };
    // A label wins, even over an annotation that could not be a label.
    for (owner, labels, want) in [
        ("west", json!({}), "west"),
        ("west", json!({CLUSTER_LABEL: "east"}), "east"),
        ("west/../x", json!({CLUSTER_LABEL: "east"}), "east"),
    ] {
        let vn = kosmos_node(owner, labels);
        let result = run_reconcile(vn, two_members.clone(), async |api| {
            let labels = api.expect("PATCH", NODE_PATH).await;
            assert_eq!(
                labels.body["metadata"]["labels"],
                json!({MEMBER_KEY: want, NODE_KEY: NODE})
            );
            let written = NodeSpec {
                labels: json!({MEMBER_KEY: want, NODE_KEY: NODE}),
                managed: vec![our_labels(&[MEMBER_KEY, NODE_KEY])],
                node_id: Some(r#"{"relay.csi.dev":"vn-east"}"#),
                ..Default::default()
            };
            labels.ok(node_json(&written, "101"));
            api.expect("GET", CSINODE_PATH)
                .await
                .status(404, "NotFound", "NotFound");
            let apply = api.expect("PATCH", CSINODE_PATH).await;
            assert_eq!(apply.body, expected_csinode_apply(&[MEMBER_KEY, NODE_KEY]));
            apply.echo();
        })
        .await;
        assert!(result.is_ok(), "{want}");
    }
    // Any string may sit in an annotation: one that cannot be a label value
    // is refused, naming the node, the annotation and why.
    let bad = kosmos_node("west/../x", json!({}));
    let result = run_reconcile(bad, two_members, async |_| {}).await;
    let err = result.expect_err("refused").to_string();
    assert!(err.contains(KOSMOS_MEMBER_ANNOTATION), "{err}");
    assert!(err.contains("west/../x"), "{err}");
}

#[tokio::test]
async fn a_member_label_we_set_goes_when_its_source_goes_and_an_admins_stays() {
    // Ours, from kosmos.io/cluster-name, which is now gone.
    let ours = NodeSpec {
        labels: json!({MEMBER_KEY: "east", NODE_KEY: NODE}),
        managed: vec![our_labels(&[MEMBER_KEY, NODE_KEY])],
        node_id: Some(r#"{"relay.csi.dev":"vn-east"}"#),
        ..Default::default()
    };
    let result = run_reconcile(node(ours), config(), async |api| {
        let labels = api.expect("PATCH", NODE_PATH).await;
        assert_eq!(
            labels.body["metadata"]["labels"],
            json!({NODE_KEY: NODE}),
            "the member label is left out, so the API server removes it"
        );
        let written = NodeSpec {
            labels: json!({NODE_KEY: NODE}),
            managed: vec![our_labels(&[NODE_KEY])],
            node_id: Some(r#"{"relay.csi.dev":"vn-east"}"#),
            ..Default::default()
        };
        labels.ok(node_json(&written, "101"));
        api.expect("GET", CSINODE_PATH).await.ok(csinode(
            vec![csinode_entry(&[MEMBER_KEY, NODE_KEY])],
            vec![our_csinode_fields()],
        ));
        // The keys shrink: the entry is removed, then written anew.
        let drop = api.expect("PATCH", CSINODE_PATH).await;
        assert!(drop.body.get("spec").is_none(), "{}", drop.body);
        drop.echo();
        let apply = api.expect("PATCH", CSINODE_PATH).await;
        assert_eq!(apply.body, expected_csinode_apply(&[NODE_KEY]));
        apply.echo();
    })
    .await;
    assert!(result.is_ok());

    // Set by an admin: not ours to write or remove, but a topology key.
    let admins = NodeSpec {
        labels: json!({MEMBER_KEY: "west", NODE_KEY: NODE}),
        managed: vec![our_labels(&[NODE_KEY])],
        node_id: Some(r#"{"relay.csi.dev":"vn-east"}"#),
        ..Default::default()
    };
    let result = run_reconcile(node(admins), config(), async |api| {
        api.expect("GET", CSINODE_PATH)
            .await
            .status(404, "NotFound", "NotFound");
        let apply = api.expect("PATCH", CSINODE_PATH).await;
        assert_eq!(apply.body, expected_csinode_apply(&[MEMBER_KEY, NODE_KEY]));
        apply.echo();
    })
    .await;
    assert!(result.is_ok());
}

#[tokio::test]
async fn a_node_we_never_registered_costs_nothing() {
    // A real node where kubelet registered the driver (same labels, same
    // annotation): none of it is ours.
    let real = NodeSpec {
        virtual_node: false,
        labels: json!({NODE_KEY: NODE}),
        managed: vec![kubelet_fields()],
        node_id: Some(r#"{"relay.csi.dev":"vn-east"}"#),
    };
    let result = run_reconcile(node(real), config(), async |_| {}).await;
    assert_eq!(result.expect("reconciled"), Action::await_change());

    let bare = Arc::new(Node {
        metadata: kube::api::ObjectMeta {
            name: Some(NODE.into()),
            ..Default::default()
        },
        ..Default::default()
    });
    let result = run_reconcile(bare, config(), async |_| {}).await;
    assert_eq!(result.expect("reconciled"), Action::await_change());
}

#[tokio::test]
async fn a_node_no_longer_selected_loses_exactly_what_we_added() {
    let spec = NodeSpec {
        virtual_node: false,
        labels: json!({CLUSTER_LABEL: "east", MEMBER_KEY: "east", NODE_KEY: NODE}),
        managed: vec![our_labels(&[MEMBER_KEY, NODE_KEY])],
        node_id: Some(r#"{"ebs.csi.aws.com":"i-0abc","relay.csi.dev":"vn-east"}"#),
    };
    let result = run_reconcile(node(spec), config(), async |api| {
        api.expect("GET", CSINODE_PATH).await.ok(csinode(
            vec![ebs_entry(), csinode_entry(&[MEMBER_KEY, NODE_KEY])],
            vec![our_csinode_fields()],
        ));
        let apply = api.expect("PATCH", CSINODE_PATH).await;
        apply.assert_apply();
        // No drivers of ours: the API server drops our entry, keeps ebs'.
        assert_eq!(
            apply.body,
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": {
                "name": NODE,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": UID}],
            }})
        );
        apply.echo();

        let annotation = api.expect("PATCH", NODE_PATH).await;
        annotation.assert_merge();
        assert_eq!(
            annotation.body,
            json!({"metadata": {
                "resourceVersion": "100",
                "annotations": {NODE_ID_ANNOTATION: r#"{"ebs.csi.aws.com":"i-0abc"}"#},
            }})
        );
        annotation.ok(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));

        let labels = api.expect("PATCH", NODE_PATH).await;
        labels.assert_apply();
        assert_eq!(
            labels.body,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        );
        labels.ok(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    })
    .await;
    assert_eq!(result.expect("reconciled"), Action::await_change());
}

#[tokio::test]
async fn cleanup_drops_an_emptied_annotation_and_skips_a_missing_csinode() {
    let spec = NodeSpec {
        virtual_node: false,
        labels: json!({NODE_KEY: NODE}),
        managed: vec![our_labels(&[NODE_KEY])],
        node_id: Some(r#"{"relay.csi.dev":"vn-east"}"#),
    };
    let result = run_reconcile(node(spec), config(), async |api| {
        api.expect("GET", CSINODE_PATH).await.status(404, "NotFound", "NotFound");
        let annotation = api.expect("PATCH", NODE_PATH).await;
        assert_eq!(
            annotation.body,
            json!({"metadata": {"resourceVersion": "100", "annotations": {NODE_ID_ANNOTATION: null}}})
        );
        annotation.ok(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
        let labels = api.expect("PATCH", NODE_PATH).await;
        assert_eq!(
            labels.body,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        );
        labels.ok(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    })
    .await;
    assert!(result.is_ok());
}

#[tokio::test]
async fn cleanup_leaves_a_csinode_entry_that_is_not_ours_and_a_malformed_annotation() {
    let spec = NodeSpec {
        virtual_node: false,
        labels: json!({NODE_KEY: NODE}),
        managed: vec![our_labels(&[NODE_KEY])],
        node_id: Some("garbage"),
    };
    let result = run_reconcile(node(spec), config(), async |api| {
        api.expect("GET", CSINODE_PATH)
            .await
            .ok(csinode(vec![csinode_entry(&[NODE_KEY])], vec![]));
        let labels = api.expect("PATCH", NODE_PATH).await;
        labels.assert_apply();
        labels.ok(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}}));
    })
    .await;
    assert!(result.is_ok());
}

#[tokio::test]
async fn a_concurrent_write_is_a_conflict_retried_with_backoff() {
    let spec = || NodeSpec {
        labels: json!({NODE_KEY: NODE}),
        managed: vec![our_labels(&[NODE_KEY])],
        ..Default::default()
    };
    let (ctx, mut api) = context(RegistrarConfig::new(DRIVER));
    let vn = node(spec());
    let (result, ()) = tokio::join!(reconcile(vn.clone(), ctx.clone()), async {
        api.expect("PATCH", NODE_PATH)
            .await
            .status(409, "Conflict", "Conflict");
    });
    let err = result.expect_err("a conflict");
    assert!(err.is_conflict(), "{err}");
    assert!(
        err.to_string()
            .contains("node vn-east: patch node annotation"),
        "{err}"
    );
    assert_eq!(
        error_policy(vn.clone(), &err, ctx.clone()),
        Action::requeue(backoff(1))
    );
    assert_eq!(
        error_policy(vn.clone(), &err, ctx.clone()),
        Action::requeue(backoff(2))
    );

    // A success resets the count.
    let done = NodeSpec {
        node_id: Some(r#"{"relay.csi.dev":"vn-east"}"#),
        ..spec()
    };
    let (result, ()) = tokio::join!(reconcile(node(done), ctx.clone()), async {
        api.expect("GET", CSINODE_PATH).await.ok(csinode(
            vec![csinode_entry(&[NODE_KEY])],
            vec![our_csinode_fields()],
        ));
    });
    assert!(result.is_ok());
    let refused = ReconcileError::Timeout {
        node: NODE.into(),
        action: "get CSINode".into(),
    };
    assert!(!refused.is_conflict());
    assert_eq!(
        error_policy(vn, &refused, ctx.clone()),
        Action::requeue(backoff(1))
    );
    drop(ctx);
    api.expect_done().await;
}

#[tokio::test]
async fn nodes_that_cannot_be_registered_are_rejected_without_requests() {
    let mut no_uid = node_json(&NodeSpec::default(), "100");
    no_uid["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("uid");
    let mut long_name = node_json(&NodeSpec::default(), "100");
    long_name["metadata"]["name"] = json!(format!("vn-{}", "a".repeat(61)));
    let mut no_name = node_json(&NodeSpec::default(), "100");
    no_name["metadata"]["name"] = json!("");
    for (bad, why) in [
        (no_uid, "has no uid"),
        (
            long_name,
            "cannot be the value of label topology.relay.csi.dev/node",
        ),
        (no_name, "without a name"),
    ] {
        let bad: Arc<Node> = Arc::new(serde_json::from_value(bad).expect("a Node"));
        let (ctx, api) = context(config());
        let err = reconcile(bad.clone(), ctx.clone()).await.expect_err(why);
        assert!(
            matches!(&err, ReconcileError::InvalidNode(m) if m.contains(why)),
            "{err}"
        );
        assert_eq!(error_policy(bad, &err, ctx.clone()), Action::await_change());
        drop(ctx);
        api.expect_done().await;
    }
}

#[test]
fn backoff_doubles_up_to_five_minutes() {
    let secs: Vec<u64> = [0, 1, 2, 3, 9, 10, 40, u32::MAX]
        .into_iter()
        .map(|n| backoff(n).as_secs())
        .collect();
    assert_eq!(secs, [1, 1, 2, 4, 256, 300, 300, 300]);
}

#[test]
fn invalid_configurations_are_refused_with_the_reason() {
    assert!(config().validate().is_ok());
    assert!(RegistrarConfig::new(DRIVER).validate().is_ok());
    let cases = [
        (RegistrarConfig::new(""), "driver name \"\" is empty"),
        (
            RegistrarConfig::new("relay csi"),
            "driver name \"relay csi\"",
        ),
        (
            RegistrarConfig {
                topology_key_prefix: "topology.relay.csi.dev".into(),
                ..config()
            },
            "must end with '/'",
        ),
        (
            RegistrarConfig {
                topology_key_prefix: "Topology/".into(),
                ..config()
            },
            "topology key prefix \"Topology/\"",
        ),
        (
            RegistrarConfig {
                member_label: Some("kosmos.io/".into()),
                ..config()
            },
            "member label \"kosmos.io/\"",
        ),
    ];
    for (config, want) in cases {
        let err = config.validate().expect_err(want).to_string();
        assert!(err.contains(want), "{err}");
    }
}

#[tokio::test]
async fn run_refuses_an_invalid_configuration_before_any_request() {
    let (client, api) = client();
    let err = run(client, RegistrarConfig::new(""))
        .await
        .expect_err("an empty driver name");
    assert!(matches!(err, RegistrarError::Config { .. }), "{err}");
    api.expect_done().await;
}

/// Answers the initial list of Nodes and of CSINodes (in either order).
async fn answer_lists(api: &mut MockApi) {
    let mut paths = Vec::new();
    for _ in 0..2 {
        let call = api.next().await;
        assert_eq!(call.method, "GET");
        let path = call.path.clone();
        let kind = if path.contains("csinodes") {
            "CSINodeList"
        } else {
            "NodeList"
        };
        call.ok(json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": []}));
        paths.push(path);
    }
    paths.sort();
    assert_eq!(paths, ["/api/v1/nodes", "/apis/storage.k8s.io/v1/csinodes"]);
}

#[tokio::test]
async fn run_until_watches_nodes_and_csinodes_and_stops_on_shutdown() {
    let (client, mut api) = client();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn(run_until(client.clone(), client, config(), async move {
        let _ = stopped.await;
    }));
    answer_lists(&mut api).await;
    // Then both watch, from the lists' version; the watches stay open.
    let mut watches = Vec::new();
    for _ in 0..2 {
        let call = api.next().await;
        let query = call.query.clone();
        assert!(query.contains("watch=true"), "{query}");
        assert!(query.contains("resourceVersion=1"), "{query}");
        watches.push(call.hang());
    }
    let _ = stop.send(());
    let result = tokio::time::timeout(std::time::Duration::from_secs(5), runner)
        .await
        .expect("the registrar stops at once on shutdown")
        .expect("no panic");
    assert!(result.is_ok());
}

#[tokio::test(start_paused = true)]
async fn run_until_stops_even_before_the_first_list_arrived() {
    let (client, mut api) = client();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let runner = tokio::spawn(run_until(client.clone(), client, config(), async move {
        let _ = stopped.await;
    }));
    // The API server never answers.
    let _pending = api.next().await.hang();
    let started = tokio::time::Instant::now();
    let _ = stop.send(());
    let result = runner.await.expect("no panic");
    assert!(result.is_ok());
    assert_eq!(started.elapsed(), SHUTDOWN_GRACE);
}

/// `--virtual-node-attach`: the attach/detach mark is applied with our
/// labels (so it is ours to take away, as they are), once.
#[tokio::test]
async fn the_attach_detach_mark_is_applied_with_the_labels_when_asked() {
    use super::reconcile::ATTACH_MANAGED_ANNOTATION;
    let attach = RegistrarConfig {
        attach_managed: true,
        ..config()
    };
    let node_id = r#"{"relay.csi.dev":"vn-east"}"#;
    let spec = NodeSpec {
        labels: json!({CLUSTER_LABEL: "east", MEMBER_KEY: "east", NODE_KEY: NODE}),
        managed: vec![our_labels(&[MEMBER_KEY, NODE_KEY])],
        node_id: Some(node_id),
        ..Default::default()
    };
    let result = run_reconcile(node(spec), attach.clone(), async |api| {
        let labels = api.expect("PATCH", NODE_PATH).await;
        labels.assert_apply();
        assert_eq!(
            labels.body,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": NODE,
                "labels": {MEMBER_KEY: "east", NODE_KEY: NODE},
                "annotations": {ATTACH_MANAGED_ANNOTATION: "true"},
            }})
        );
        let mut written = labels.body.clone();
        written["metadata"]["uid"] = json!(UID);
        written["metadata"]["annotations"][NODE_ID_ANNOTATION] = json!(node_id);
        labels.ok(written);
        api.expect("GET", CSINODE_PATH).await.ok(csinode(
            vec![csinode_entry(&[MEMBER_KEY, NODE_KEY])],
            vec![our_csinode_fields()],
        ));
    })
    .await;
    assert_eq!(
        result.expect("reconciled"),
        Action::requeue(RESYNC_INTERVAL)
    );

    // Applied and owned: nothing to write.
    let mut owned = our_labels(&[MEMBER_KEY, NODE_KEY]);
    owned["fieldsV1"]["f:metadata"]["f:annotations"] =
        json!({format!("f:{ATTACH_MANAGED_ANNOTATION}"): {}});
    let mut marked = node_json(
        &NodeSpec {
            labels: json!({CLUSTER_LABEL: "east", MEMBER_KEY: "east", NODE_KEY: NODE}),
            managed: vec![owned],
            node_id: Some(node_id),
            ..Default::default()
        },
        "100",
    );
    marked["metadata"]["annotations"][ATTACH_MANAGED_ANNOTATION] = json!("true");
    let marked: Arc<Node> = Arc::new(serde_json::from_value(marked).unwrap());
    let result = run_reconcile(marked.clone(), attach, async |api| {
        api.expect("GET", CSINODE_PATH).await.ok(csinode(
            vec![csinode_entry(&[MEMBER_KEY, NODE_KEY])],
            vec![our_csinode_fields()],
        ));
    })
    .await;
    result.expect("reconciled");

    // Without the flag, the mark we applied goes with the next apply.
    let result = run_reconcile(marked, config(), async |api| {
        let labels = api.expect("PATCH", NODE_PATH).await;
        assert!(
            labels.body["metadata"].get("annotations").is_none(),
            "{}",
            labels.body
        );
        labels.ok(node_json(
            &NodeSpec {
                labels: json!({CLUSTER_LABEL: "east", MEMBER_KEY: "east", NODE_KEY: NODE}),
                managed: vec![our_labels(&[MEMBER_KEY, NODE_KEY])],
                node_id: Some(node_id),
                ..Default::default()
            },
            "101",
        ));
        api.expect("GET", CSINODE_PATH).await.ok(csinode(
            vec![csinode_entry(&[MEMBER_KEY, NODE_KEY])],
            vec![our_csinode_fields()],
        ));
    })
    .await;
    result.expect("reconciled");
}
