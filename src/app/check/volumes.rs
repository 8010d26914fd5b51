//! RelayVolumes that are stuck: PROVISIONING too long, a LAST-ERROR, a
//! member claim that is gone or not the relay's, an attachment to a host
//! node whose member VolumeAttachment is missing. One line each.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::{CSIDriver, VolumeAttachment};
use kube::api::{Api, ListParams};

use super::report::{Clusters, Finding};
use crate::domain::topology::TOPOLOGY_MEMBER_NODE_KEY;
use crate::k8s::cluster::Cluster;
use crate::k8s::naming;
use crate::k8s::relay_volume::{RelayVolume, RELEASED};

const RUNBOOK: &str = "docs/operations.md, \"When things go wrong\"";

pub async fn check(clusters: &Clusters, stuck_after: u64) -> Vec<Finding> {
    let host = &clusters.host;
    let list = match host
        .fetch(
            "list RelayVolumes",
            Api::<RelayVolume>::all(host.client()).list(&ListParams::default()),
        )
        .await
    {
        Ok(Some(l)) => l.items,
        Ok(None) => return Vec::new(), // no CRD: crd's line says so
        Err(e) => return vec![Finding::unchecked("volume", "host cluster", e.to_string())],
    };
    let nodes: HashMap<&str, &Node> = match &clusters.host_nodes {
        Ok(list) => list
            .iter()
            .filter_map(|n| Some((n.metadata.name.as_deref()?, n)))
            .collect(),
        Err(e) => return vec![Finding::unchecked("volume", "host cluster", e.clone())],
    };
    // Whether a member's CSI driver needs attaching: read once per driver.
    let mut attaches: HashMap<(String, String), bool> = HashMap::new();
    let now = k8s_openapi::jiff::Timestamp::now();
    let mut out = Vec::new();
    let mut released = 0;
    for rv in &list {
        let id = rv.spec.volume_id.clone();
        let subject = format!("volume {id}");
        let status = rv.status.clone().unwrap_or_default();
        if status.phase.as_deref() == Some(RELEASED) || crate::k8s::relay_volume::is_released(rv) {
            released += 1;
            continue;
        }
        if status.phase.as_deref() == Some("PROVISIONING") {
            let age = rv
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| now.duration_since(t.0).as_secs())
                .unwrap_or(0);
            if age >= stuck_after as i64 {
                out.push(Finding::problem(
                    "volume",
                    &subject,
                    format!("PROVISIONING for {age} s (claim {})", rv.spec.host_pvc.as_deref().unwrap_or("?")),
                    format!("see its LAST-ERROR (kubectl get relayvolumes); housekeeping rolls it back once its claim is deleted ({RUNBOOK})"),
                ));
            }
        }
        if let Some(err) = &status.last_error {
            out.push(Finding::problem(
                "volume",
                &subject,
                format!("LAST-ERROR: {err}"),
                format!("what the message names; the CO retries the call ({RUNBOOK})"),
            ));
        }
        let (Some(member), Some(pvc)) = (&rv.spec.member, &rv.spec.member_pvc) else {
            continue;
        };
        let cluster = match clusters.member(member) {
            Some(Ok(c)) => c,
            Some(Err(e)) => {
                out.push(Finding::unchecked("volume", &subject, e.clone()));
                continue;
            }
            None if clusters.lost.contains(member) => continue,
            None => {
                out.push(Finding::problem(
                    "volume",
                    &subject,
                    format!("lives in member {member}, which is not configured (--member)"),
                    format!("add --member {member}=KUBECONFIG, or --lost-member {member} if it is gone for good (runbook)"),
                ));
                continue;
            }
        };
        match member_side(cluster, rv, pvc, &status, &nodes, &mut attaches).await {
            Ok(found) => out.extend(
                found
                    .into_iter()
                    .map(|(message, fix)| Finding::problem("volume", &subject, message, fix)),
            ),
            Err(e) => out.push(Finding::unchecked("volume", &subject, e)),
        }
    }
    let problems = out.len();
    out.push(Finding::ok(
        "volume",
        "RelayVolumes",
        format!("{} listed, {released} released (records of a lost member's volumes), {problems} line(s) above", list.len()),
    ));
    out
}

/// The member claim and the member attachments of `rv`: (message, fix)
/// for each that is missing.
async fn member_side(
    cluster: &Cluster,
    rv: &RelayVolume,
    pvc: &str,
    status: &crate::k8s::relay_volume::RelayVolumeStatus,
    nodes: &HashMap<&str, &Node>,
    attaches: &mut HashMap<(String, String), bool>,
) -> Result<Vec<(String, String)>, String> {
    let member = cluster.name();
    let (namespace, name) = pvc.split_once('/').unwrap_or(("default", pvc));
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(cluster.client(), namespace);
    let claim = cluster
        .fetch(
            &format!("get PersistentVolumeClaim {pvc}"),
            claims.get(name),
        )
        .await
        .map_err(|e| e.to_string())?;
    let Some(claim) = claim else {
        if status.phase.as_deref() == Some("PROVISIONING")
            || status.phase.as_deref() == Some("DELETING")
        {
            return Ok(Vec::new());
        }
        return Ok(vec![(
            format!("its member claim {pvc} is gone from member {member}: the data is not reachable through the relay"),
            "find what deleted it (the member's audit log); delete the host claim to release the volume".into(),
        )]);
    };
    let id = claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(naming::VOLUME_ID_ANNOTATION));
    if id != Some(&rv.spec.volume_id) {
        return Ok(vec![(
            format!("member claim {pvc} in member {member} is not this volume's (annotation {} is {id:?})", naming::VOLUME_ID_ANNOTATION),
            "a claim of that name was made by someone else: the relay leaves it alone; delete the host claim and create it again".into(),
        )]);
    }
    let Some(uuid) = naming::parse_volume_id(&rv.spec.volume_id).map(|(_, u)| u.to_string()) else {
        return Ok(Vec::new());
    };
    // The host nodes it is attached to that stand for one member node: the
    // relay made a member attachment for each (a virtual node's comes from
    // the member itself).
    let expected: Vec<(&str, String)> = status
        .nodes
        .iter()
        .flatten()
        .filter(|e| e.attached == Some(true) && !e.node.contains('/'))
        .filter_map(|e| {
            let labels = nodes.get(e.node.as_str())?.metadata.labels.as_ref()?;
            Some((
                e.node.as_str(),
                labels.get(TOPOLOGY_MEMBER_NODE_KEY)?.clone(),
            ))
        })
        .collect();
    let pv_name = claim.spec.as_ref().and_then(|s| s.volume_name.clone());
    let (false, Some(pv_name)) = (expected.is_empty(), pv_name) else {
        return Ok(Vec::new());
    };
    // Only if the member PV's driver needs attaching at all.
    let pvs: Api<PersistentVolume> = Api::all(cluster.client());
    let driver = cluster
        .fetch(
            &format!("get PersistentVolume {pv_name}"),
            pvs.get(&pv_name),
        )
        .await
        .map_err(|e| e.to_string())?
        .and_then(|pv| pv.spec?.csi.map(|c| c.driver));
    let Some(driver) = driver else {
        return Ok(Vec::new());
    };
    let key = (member.to_string(), driver.clone());
    let needs = match attaches.get(&key) {
        Some(known) => *known,
        None => {
            let drivers: Api<CSIDriver> = Api::all(cluster.client());
            let needs = cluster
                .fetch(&format!("get CSIDriver {driver}"), drivers.get(&driver))
                .await
                .map_err(|e| e.to_string())?
                .and_then(|d| d.spec.attach_required)
                .unwrap_or(true);
            attaches.insert(key, needs);
            needs
        }
    };
    if !needs {
        return Ok(Vec::new());
    }
    let vas: Api<VolumeAttachment> = Api::all(cluster.client());
    let mut out = Vec::new();
    for (host_node, member_node) in expected {
        let va = naming::attachment_name(&uuid, &member_node);
        let found = cluster
            .fetch(&format!("get VolumeAttachment {va}"), vas.get(&va))
            .await
            .map_err(|e| e.to_string())?;
        if found.is_none() {
            out.push((
                format!("attached to host node {host_node} but member {member} has no VolumeAttachment {va} to its node {member_node}: the node cannot stage it"),
                "the attacher's next ControllerPublishVolume makes it again; if the pod is gone, delete the host VolumeAttachment".into(),
            ));
        }
    }
    Ok(out)
}
