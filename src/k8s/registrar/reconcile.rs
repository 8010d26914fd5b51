//! One pass over one Node: register the driver on it when it is selected,
//! take our registration away when it no longer is.
//!
//! What is written, and how:
//! - Node labels `<prefix>node` (and `<prefix>member`) by server-side apply:
//!   the API server then records them as ours, which is what tells a node we
//!   registered from one kubelet labelled the same way (see [`super::fields`]).
//! - The `csi.volume.kubernetes.io/nodeid` annotation by JSON merge patch
//!   with the node's `resourceVersion`: it is shared with other drivers and
//!   rewritten from the value read, so a concurrent writer makes the patch
//!   fail (409, retried) instead of being overwritten; kubelet does the same.
//! - The CSINode's entry for our driver by server-side apply: `drivers` is a
//!   list map keyed by `name`, so other drivers' entries are left alone.
//!
//! Order makes a failure at any step safe to retry: registering writes the
//! labels (our "registered" record) first and the CSINode last; unregistering
//! undoes the CSINode first and the labels last.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use serde_json::{json, Map, Value};

use super::fields::{self, FIELD_MANAGER};
use super::nodeid::{self, NODE_ID_ANNOTATION};
use super::selector::check_value;
use super::{Context, ReconcileError, CALL_TIMEOUT, RESYNC_INTERVAL};

const LABELS: &[&str] = &["f:metadata", "f:labels"];
const ANNOTATIONS: &[&str] = &["f:metadata", "f:annotations"];
/// Kubelet's mark of a node whose volumes the attach/detach controller
/// attaches (`--virtual-node-attach`).
pub const ATTACH_MANAGED_ANNOTATION: &str =
    "volumes.kubernetes.io/controller-managed-attach-detach";
const DRIVERS: &[&str] = &["f:spec", "f:drivers"];
const OWNERS: &[&str] = &["f:metadata", "f:ownerReferences"];

pub async fn reconcile(node: Arc<Node>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let name = node
        .metadata
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| ReconcileError::InvalidNode("a Node without a name".into()))?;
    let action = if ctx.config.selector.matches(&node) {
        register(&node, name, &ctx).await?;
        Action::requeue(RESYNC_INTERVAL)
    } else {
        unregister(&node, name, &ctx).await?;
        Action::await_change()
    };
    ctx.succeeded(name);
    Ok(action)
}

fn labels(node: &Node) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    node.metadata.labels.as_ref().unwrap_or(&EMPTY)
}

fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The labels our manager applied to the node.
fn owned_labels(node: &Node) -> BTreeSet<String> {
    fields::map_keys(
        &fields::ours(node.metadata.managed_fields.as_deref()),
        LABELS,
    )
}

/// The annotations our manager applied to the node (not the node-id one,
/// which is merge-patched).
fn owned_annotations(node: &Node) -> BTreeSet<String> {
    fields::map_keys(
        &fields::ours(node.metadata.managed_fields.as_deref()),
        ANNOTATIONS,
    )
}

/// What a selected node should carry.
#[derive(Debug, PartialEq, Eq)]
pub struct Registration {
    pub uid: String,
    /// The labels we own on the node.
    pub labels: BTreeMap<String, String>,
    /// The annotations we own on the node (the attach/detach mark).
    pub annotations: BTreeMap<String, String>,
    /// Sorted, as kubelet writes them.
    pub topology_keys: Vec<String>,
}

pub fn registration(
    node: &Node,
    name: &str,
    ctx: &Context,
) -> Result<Registration, ReconcileError> {
    let config = &ctx.config;
    let uid = node
        .metadata
        .uid
        .clone()
        .filter(|u| !u.is_empty())
        .ok_or_else(|| ReconcileError::InvalidNode(format!("node {name} has no uid")))?;
    let node_key = config.node_key();
    let member_key = config.member_key();
    check_value(name).map_err(|reason| {
        ReconcileError::InvalidNode(format!(
            "node {name}: its name cannot be the value of label {node_key}: it {reason}"
        ))
    })?;
    let current = labels(node);
    let mut wanted = BTreeMap::from([(node_key.clone(), name.to_string())]);
    let labelled_member = config
        .member_label
        .as_ref()
        .and_then(|key| current.get(key))
        .filter(|v| !v.is_empty());
    // Read only where no label names the member: a label wins.
    let annotation = config
        .member_annotation
        .as_ref()
        .filter(|_| labelled_member.is_none())
        .and_then(|key| {
            node.metadata
                .annotations
                .as_ref()?
                .get(key)
                .map(|v| (key, v))
        })
        .filter(|(_, v)| !v.is_empty());
    let annotated_member = match annotation {
        None => None,
        // Any string may sit in an annotation; it becomes a label value.
        Some((key, value)) => Some(check_value(value).map(|()| value).map_err(|reason| {
            ReconcileError::InvalidNode(format!(
                "node {name}: annotation {key}={value:?} cannot name its member cluster in label {member_key}: it {reason}"
            ))
        })?),
    };
    if let Some(value) = labelled_member
        .or(annotated_member)
        .or(config.default_member.as_ref())
    {
        wanted.insert(member_key.clone(), value.clone());
    }
    // A member label an admin set (not ours) still makes the key a topology
    // key of the node; one we set from a member label now gone does not.
    let admin_member = current.get(&member_key).is_some_and(|v| !v.is_empty())
        && !owned_labels(node).contains(&member_key);
    let mut keys = BTreeSet::from([node_key]);
    if wanted.contains_key(&member_key) || admin_member {
        keys.insert(member_key);
    }
    let annotations = if config.attach_managed {
        BTreeMap::from([(ATTACH_MANAGED_ANNOTATION.to_string(), "true".to_string())])
    } else {
        BTreeMap::new()
    };
    Ok(Registration {
        uid,
        labels: wanted,
        annotations,
        topology_keys: keys.into_iter().collect(),
    })
}

async fn call<T>(
    node: &str,
    action: &str,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, ReconcileError> {
    match tokio::time::timeout(CALL_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(ReconcileError::Api {
            node: node.to_string(),
            action: action.to_string(),
            source: Box::new(source),
        }),
        Err(_) => Err(ReconcileError::Timeout {
            node: node.to_string(),
            action: action.to_string(),
        }),
    }
}

fn apply() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// Server-side applies exactly `labels` and `annotations` as ours on the
/// node: any other we own and no one else does is removed by the API
/// server. Returns the node as written.
async fn apply_labels(
    ctx: &Context,
    name: &str,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Result<Node, ReconcileError> {
    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(name));
    if !labels.is_empty() {
        metadata.insert("labels".into(), json!(labels));
    }
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), json!(annotations));
    }
    let body = json!({"apiVersion": "v1", "kind": "Node", "metadata": metadata});
    let nodes = Api::<Node>::all(ctx.client.clone());
    call(
        name,
        "apply node labels",
        nodes.patch(name, &apply(), &Patch::Apply(body)),
    )
    .await
}

/// Sets (or with `None` removes) the node-id annotation, provided the node
/// is still at the version the new value was computed from.
async fn patch_node_id(
    ctx: &Context,
    node: &Node,
    name: &str,
    value: Option<String>,
) -> Result<(), ReconcileError> {
    let mut metadata = Map::new();
    if let Some(rv) = node.metadata.resource_version.as_ref() {
        metadata.insert("resourceVersion".into(), json!(rv));
    }
    metadata.insert("annotations".into(), json!({ NODE_ID_ANNOTATION: value }));
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let nodes = Api::<Node>::all(ctx.client.clone());
    call(
        name,
        "patch node annotation",
        nodes.patch(
            name,
            &params,
            &Patch::Merge(json!({ "metadata": metadata })),
        ),
    )
    .await?;
    Ok(())
}

fn owner_reference(name: &str, uid: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid})
}

fn csinode_in_sync(csinode: &CSINode, ctx: &Context, name: &str, reg: &Registration) -> bool {
    let driver = ctx.config.driver_name.as_str();
    let entry = csinode.spec.drivers.iter().any(|d| {
        d.name == driver
            && d.node_id == name
            && d.topology_keys.as_deref().unwrap_or_default() == reg.topology_keys.as_slice()
    });
    let owner = csinode
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|o| o.api_version == "v1" && o.kind == "Node" && o.name == name && o.uid == reg.uid);
    let ours = fields::ours(csinode.metadata.managed_fields.as_deref());
    entry
        && owner
        && fields::list_keys(&ours, DRIVERS, "name") == BTreeSet::from([driver.to_string()])
        && fields::list_keys(&ours, OWNERS, "uid") == BTreeSet::from([reg.uid.clone()])
}

async fn register(node: &Node, name: &str, ctx: &Context) -> Result<(), ReconcileError> {
    let reg = registration(node, name, ctx)?;
    let driver = ctx.config.driver_name.as_str();

    let current = labels(node);
    let labels_in_sync = owned_labels(node) == reg.labels.keys().cloned().collect()
        && reg.labels.iter().all(|(k, v)| current.get(k) == Some(v))
        && owned_annotations(node) == reg.annotations.keys().cloned().collect()
        && reg
            .annotations
            .iter()
            .all(|(k, v)| annotation(node, k) == Some(v.as_str()));
    let labelled;
    // The annotation is rewritten from the node as last written (and at its
    // resourceVersion).
    let node = if labels_in_sync {
        node
    } else {
        tracing::info!(node = name, labels = ?reg.labels, "labelling virtual node");
        labelled = apply_labels(ctx, name, &reg.labels, &reg.annotations).await?;
        &labelled
    };

    let existing = nodeid::parse(annotation(node, NODE_ID_ANNOTATION));
    let registered = matches!(&existing, nodeid::Existing::Drivers(d)
        if d.get(driver).map(String::as_str) == Some(name));
    if !registered {
        if let nodeid::Existing::Malformed { value, error } = &existing {
            tracing::warn!(
                node = name,
                value = value.as_str(),
                error = error.as_str(),
                "replacing the unreadable {NODE_ID_ANNOTATION} annotation"
            );
        }
        let value = nodeid::with_driver(&existing, driver, name);
        tracing::info!(
            node = name,
            value = value.as_str(),
            "setting {NODE_ID_ANNOTATION}"
        );
        patch_node_id(ctx, node, name, Some(value)).await?;
    }

    let csinodes = Api::<CSINode>::all(ctx.client.clone());
    let live = call(name, "get CSINode", csinodes.get_opt(name)).await?;
    if live
        .as_ref()
        .is_some_and(|c| csinode_in_sync(c, ctx, name, &reg))
    {
        return Ok(());
    }
    // A driver entry's node id and topology keys are immutable: an entry
    // whose keys changed (a member label added or removed) is removed
    // first and then written anew.
    if let Some(csinode) = &live {
        let stale = csinode.spec.drivers.iter().any(|d| {
            d.name == driver
                && (d.node_id != name
                    || d.topology_keys.as_deref().unwrap_or_default()
                        != reg.topology_keys.as_slice())
        });
        if stale {
            tracing::info!(
                node = name,
                driver,
                "topology keys changed: replacing the CSINode entry"
            );
            drop_entry(csinode, name, ctx).await?;
        }
    }
    tracing::info!(node = name, driver, topology_keys = ?reg.topology_keys, "applying CSINode entry");
    let body = json!({
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {
            "name": name,
            "ownerReferences": [owner_reference(name, &reg.uid)],
        },
        "spec": {"drivers": [{
            "name": driver,
            "nodeID": name,
            "topologyKeys": reg.topology_keys,
        }]},
    });
    call(
        name,
        "apply CSINode",
        csinodes.patch(name, &apply(), &Patch::Apply(body)),
    )
    .await?;
    Ok(())
}

/// Removes our driver entry from `csinode` (server-side apply without it),
/// keeping our owner references: an emptied CSINode is harmless (kubelet
/// keeps one on every node) and is still garbage collected with its node.
async fn drop_entry(csinode: &CSINode, name: &str, ctx: &Context) -> Result<(), ReconcileError> {
    let csinodes = Api::<CSINode>::all(ctx.client.clone());
    let ours = fields::ours(csinode.metadata.managed_fields.as_deref());
    let owners: Vec<Value> = csinode
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default()
        .iter()
        .filter(|o| fields::list_keys(&ours, OWNERS, "uid").contains(&o.uid))
        .map(|o| json!({"apiVersion": o.api_version, "kind": o.kind, "name": o.name, "uid": o.uid}))
        .collect();
    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(name));
    if !owners.is_empty() {
        metadata.insert("ownerReferences".into(), Value::Array(owners));
    }
    let body = json!({"apiVersion": "storage.k8s.io/v1", "kind": "CSINode", "metadata": metadata});
    call(
        name,
        "apply CSINode",
        csinodes.patch(name, &apply(), &Patch::Apply(body)),
    )
    .await?;
    Ok(())
}

async fn unregister(node: &Node, name: &str, ctx: &Context) -> Result<(), ReconcileError> {
    // No label of ours: we never registered this node (or are done with it).
    // The common case, real nodes included, costs no request.
    if owned_labels(node).is_empty() {
        return Ok(());
    }
    let driver = ctx.config.driver_name.as_str();

    let csinodes = Api::<CSINode>::all(ctx.client.clone());
    if let Some(csinode) = call(name, "get CSINode", csinodes.get_opt(name)).await? {
        let ours = fields::ours(csinode.metadata.managed_fields.as_deref());
        if !fields::list_keys(&ours, DRIVERS, "name").is_empty() {
            tracing::info!(node = name, driver, "removing CSINode entry");
            drop_entry(&csinode, name, ctx).await?;
        }
    }

    let existing = nodeid::parse(annotation(node, NODE_ID_ANNOTATION));
    if matches!(&existing, nodeid::Existing::Drivers(d) if d.contains_key(driver)) {
        let value = nodeid::without_driver(&existing, driver);
        tracing::info!(node = name, value = ?value, "removing {driver} from {NODE_ID_ANNOTATION}");
        patch_node_id(ctx, node, name, value).await?;
    }

    tracing::info!(
        node = name,
        "removing topology labels of a node no longer selected"
    );
    apply_labels(ctx, name, &BTreeMap::new(), &BTreeMap::new()).await?;
    Ok(())
}
