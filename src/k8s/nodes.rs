//! Which member cluster (and which member node) a host node stands for.
//!
//! The host Node's labels say it: `topology.relay.csi.dev/member` (reported
//! by the node plugin's topology or set by the admin; a member volume's PV
//! node affinity requires it anyway) and optionally
//! `topology.relay.csi.dev/member-node`. Without the latter, a member node
//! of the same name as the host node is the one (one-to-one mapping, as
//! Kosmos' leaf nodes do).

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use crate::domain::error::{CsiError, CsiResult};
use crate::domain::topology::{TOPOLOGY_MEMBER_KEY, TOPOLOGY_MEMBER_NODE_KEY};
use crate::k8s::cluster::Cluster;
use crate::k8s::error::KubeResult;
use crate::k8s::registrar::NodeSelector;

/// Where a host node runs its pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePlace {
    /// The member node it stands for, if it maps to a single one.
    pub member_node: Option<String>,
    /// A virtual node (no kubelet): its pods run in the member cluster.
    pub virtual_node: bool,
}

pub async fn host_node(host: &Cluster, node_id: &str) -> KubeResult<Option<Node>> {
    host.fetch(
        &format!("get Node {node_id}"),
        Api::<Node>::all(host.client()).get(node_id),
    )
    .await
}

async fn member_has_node(member: &Cluster, name: &str) -> CsiResult<bool> {
    Ok(member
        .fetch(
            &format!("get Node {name}"),
            Api::<Node>::all(member.client()).get(name),
        )
        .await?
        .is_some())
}

/// Resolves host node `node_id` against `member`, the cluster the volume
/// lives in: NOT_FOUND for an unknown host node, FAILED_PRECONDITION for a
/// node of another member or of none.
/// Without the host cluster (`host` None) only the one-to-one mapping works.
/// `virtual_nodes` tells virtual nodes apart.
pub async fn resolve(
    host: Option<&Cluster>,
    member: &Cluster,
    node_id: &str,
    virtual_nodes: Option<&NodeSelector>,
) -> CsiResult<NodePlace> {
    let (labels, virtual_node) = match host {
        Some(host) => {
            let node = host_node(host, node_id)
                .await?
                .ok_or_else(|| CsiError::NodeNotFound(node_id.to_string()))?;
            let virtual_node = virtual_nodes.is_some_and(|s| s.matches(&node));
            (node.metadata.labels.unwrap_or_default(), virtual_node)
        }
        None => (Default::default(), false),
    };
    let node_member = labels.get(TOPOLOGY_MEMBER_KEY);
    if let Some(other) = node_member.filter(|m| m.as_str() != member.name()) {
        return Err(CsiError::FailedPrecondition(format!(
            "host node {node_id} runs its pods in member cluster {other} ({TOPOLOGY_MEMBER_KEY}), but the volume lives in member cluster {}",
            member.name()
        )));
    }
    if let Some(member_node) = labels.get(TOPOLOGY_MEMBER_NODE_KEY) {
        return Ok(NodePlace {
            member_node: Some(member_node.clone()),
            virtual_node,
        });
    }
    if member_has_node(member, node_id).await? {
        return Ok(NodePlace {
            member_node: Some(node_id.to_string()),
            virtual_node,
        });
    }
    if node_member.is_some() {
        // The whole member cluster behind one host node (cluster mode).
        return Ok(NodePlace {
            member_node: None,
            virtual_node,
        });
    }
    Err(CsiError::FailedPrecondition(format!(
        "host node {node_id} is not mapped to member cluster {m}: label it {TOPOLOGY_MEMBER_KEY}={m} (and {TOPOLOGY_MEMBER_NODE_KEY}=<member node> when it stands for one member node)",
        m = member.name()
    )))
}
