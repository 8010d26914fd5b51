//! Host nodes: which member each maps to. A node where the driver's node
//! plugin registered but that maps to no member is where published volumes
//! get stuck; for virtual nodes, what Kosmos wrote and what the registrar
//! made of it.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Api, ListParams};

use super::args::CheckArgs;
use super::report::{Clusters, Finding};
use crate::domain::topology::{TOPOLOGY_MEMBER_KEY, TOPOLOGY_MEMBER_NODE_KEY};

pub async fn check(clusters: &Clusters, args: &CheckArgs) -> Vec<Finding> {
    let host = &clusters.host;
    let csinodes = host
        .run(
            "list CSINodes",
            Api::<CSINode>::all(host.client()).list(&ListParams::default()),
        )
        .await;
    let (nodes, csinodes) = match (&clusters.host_nodes, csinodes) {
        (Ok(n), Ok(c)) => (n, c.items),
        (Err(e), _) => return vec![Finding::unchecked("node", "host cluster", e.clone())],
        (_, Err(e)) => return vec![Finding::unchecked("node", "host cluster", e.to_string())],
    };
    // Nodes whose CSINode lists the driver: its node plugin (or the
    // registrar, for a virtual node) registered there.
    let registered: HashMap<String, bool> = csinodes
        .iter()
        .map(|c| {
            let has = c.spec.drivers.iter().any(|d| d.name == args.driver_name);
            (c.metadata.name.clone().unwrap_or_default(), has)
        })
        .collect();
    let mut out = Vec::new();
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let labels = node.metadata.labels.clone().unwrap_or_default();
        let has_driver = registered.get(&name).copied().unwrap_or(false);
        let member = labels.get(TOPOLOGY_MEMBER_KEY).cloned();
        if args.virtual_node_selector.matches(node) {
            out.push(virtual_node(
                clusters, args, node, &name, has_driver, member,
            ));
            continue;
        }
        let subject = format!("node {name}");
        match member {
            None if has_driver && !clusters.members.is_empty() => out.push(Finding::problem(
                "node",
                subject,
                format!("the {} node plugin runs here, but the node maps to no member cluster: ControllerPublishVolume of a member volume to it is refused, and its pods wait", args.driver_name),
                format!("kubectl label node {name} {TOPOLOGY_MEMBER_KEY}=<member> [{TOPOLOGY_MEMBER_NODE_KEY}=<member node>], or run its node plugin with --node-member <member>"),
            )),
            None => {}
            Some(m) if !clusters.is_configured(&m) => out.push(Finding::problem(
                "node",
                subject,
                format!("label {TOPOLOGY_MEMBER_KEY}={m} names a member that is not configured (--member)"),
                format!("add --member {m}=KUBECONFIG to the controller, or relabel the node"),
            )),
            Some(m) => out.push(mapped_node(clusters, &subject, &m, labels.get(TOPOLOGY_MEMBER_NODE_KEY), has_driver, &args.driver_name).await),
        }
    }
    out
}

fn virtual_node(
    clusters: &Clusters,
    args: &CheckArgs,
    node: &Node,
    name: &str,
    has_driver: bool,
    label: Option<String>,
) -> Finding {
    let subject = format!("virtual node {name}");
    let written = node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&args.virtual_node_member_annotation))
        .cloned();
    let said = match &written {
        Some(m) => format!("{} says member {m}", args.virtual_node_member_annotation),
        None => format!("no {} annotation", args.virtual_node_member_annotation),
    };
    let member = written.clone().or(label.clone());
    match member {
        Some(m) if !clusters.is_configured(&m) => Finding::problem(
            "node",
            subject,
            format!("{said}, a member that is not configured (--member): its pods' volumes cannot be provisioned"),
            format!("add --member {m}=KUBECONFIG to the controller (the name must be Kosmos's Cluster name)"),
        ),
        _ if !has_driver => Finding::problem(
            "node",
            subject,
            format!("{said}, but its CSINode has no {} entry: the attacher refuses volumes for its pods", args.driver_name),
            "run the controller with --virtual-node-registrar (deploy/ does), and check its log for the node",
        ),
        Some(m) if label.as_deref() != Some(m.as_str()) => Finding::problem(
            "node",
            subject,
            format!("{said}, but its topology label {TOPOLOGY_MEMBER_KEY} is {label:?}: volumes provisioned for its pods land elsewhere"),
            "let the registrar relabel it (restart the controller), or fix the label by hand",
        ),
        Some(m) => Finding::ok(
            "node",
            subject,
            format!("{said}; the registrar made its CSINode entry and topology {TOPOLOGY_MEMBER_KEY}={m}"),
        ),
        None => Finding::problem(
            "node",
            subject,
            format!("{said} and no {TOPOLOGY_MEMBER_KEY} label: which member runs its pods is unknown"),
            format!("label it {TOPOLOGY_MEMBER_KEY}=<member>, or set --virtual-node-member-annotation to where the platform names it"),
        ),
    }
}

async fn mapped_node(
    clusters: &Clusters,
    subject: &str,
    member: &str,
    member_node: Option<&String>,
    has_driver: bool,
    driver: &str,
) -> Finding {
    let plugin = if has_driver {
        format!("{driver} node plugin registered")
    } else {
        format!("no {driver} node plugin registered yet")
    };
    let Some(member_node) = member_node else {
        return Finding::ok(
            "node",
            subject,
            format!("maps to member {member} (the whole cluster); {plugin}"),
        );
    };
    let cluster = match clusters.member(member) {
        Some(Ok(c)) => c,
        Some(Err(e)) => return Finding::unchecked("node", subject, e.clone()),
        // A lost member: nothing to look up.
        None => {
            return Finding::info(
                "node",
                subject,
                format!("maps to member {member}, declared lost"),
            )
        }
    };
    let api = Api::<Node>::all(cluster.client());
    match cluster.fetch(&format!("get Node {member_node}"), api.get(member_node)).await {
        Ok(Some(_)) => Finding::ok(
            "node",
            subject,
            format!("maps to member {member}, node {member_node}; {plugin}"),
        ),
        Ok(None) => Finding::problem(
            "node",
            subject,
            format!("label {TOPOLOGY_MEMBER_NODE_KEY}={member_node} names a node member {member} does not have: attachments to it fail"),
            format!("relabel the node with a node of member {member}"),
        ),
        Err(e) => Finding::unchecked("node", subject, e.to_string()),
    }
}
