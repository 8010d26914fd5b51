//! The driver's StorageClasses: parameters valid, the member they name
//! configured and answering, its `memberStorageClass` there.

use std::collections::HashMap;

use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams};

use super::report::{Clusters, Finding};
use crate::domain::params::{self, BackingChoice, VolumeParams};
use crate::k8s::naming;

pub async fn check(clusters: &Clusters, driver: &str) -> Vec<Finding> {
    let host = &clusters.host;
    let list = match host
        .run(
            "list StorageClasses",
            Api::<StorageClass>::all(host.client()).list(&ListParams::default()),
        )
        .await
    {
        Ok(l) => l,
        Err(e) => return vec![Finding::unchecked("class", "host cluster", e.to_string())],
    };
    let mut out = Vec::new();
    let ours: Vec<StorageClass> = list
        .items
        .into_iter()
        .filter(|c| c.provisioner == driver)
        .collect();
    if ours.is_empty() {
        out.push(Finding::info(
            "class",
            "host cluster",
            format!("no StorageClass has provisioner {driver}: nothing can provision through it"),
        ));
    }
    for class in ours {
        let name = class.metadata.name.clone().unwrap_or_default();
        let subject = format!("StorageClass {name}");
        out.push(check_class(clusters, &subject, &class).await);
    }
    out
}

async fn check_class(clusters: &Clusters, subject: &str, class: &StorageClass) -> Finding {
    let map: HashMap<String, String> = class
        .parameters
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect();
    let p: VolumeParams = match params::decode(&map, "parameters") {
        Ok(p) => p,
        Err(e) => {
            return Finding::problem(
                "class",
                subject,
                format!("CreateVolume refuses its parameters: {e}"),
                "fix the parameters (StorageClasses are immutable: delete and create it again)",
            )
        }
    };
    if p.backing != BackingChoice::Auto {
        return Finding::problem(
            "class",
            subject,
            "parameter backing configures the local backend; a member controller refuses it",
            "remove backing (the member's memberStorageClass decides the storage)",
        );
    }
    if let Some(t) = &p.member_namespace {
        if let Err(why) = naming::check_namespace_template(t) {
            return Finding::problem("class", subject, why, "fix memberNamespace");
        }
    }
    if let Some(list) = &p.allowed_member_namespaces {
        if let Err(why) = naming::check_allowed_namespaces(list) {
            return Finding::problem("class", subject, why, "fix allowedMemberNamespaces");
        }
    }
    let member = match (&p.member, clusters.members.as_slice()) {
        (Some(m), _) => m.clone(),
        (None, [(only, _)]) => only.clone(),
        (None, _) => {
            return Finding::ok(
                "class",
                subject,
                "no member parameter: the member of the node each pod lands on (topology)",
            )
        }
    };
    if clusters.lost.contains(&member) {
        return Finding::problem(
            "class",
            subject,
            format!("names member {member}, declared lost (--lost-member): every CreateVolume is refused"),
            "point the class at a member that serves, or delete it",
        );
    }
    let cluster = match clusters.member(&member) {
        None => {
            return Finding::problem(
                "class",
                subject,
                format!("names member {member:?}, which is not configured (--member)"),
                format!("add --member {member}=KUBECONFIG to the controller, or fix the class's member parameter"),
            )
        }
        Some(Err(e)) => return Finding::unchecked("class", subject, e.clone()),
        Some(Ok(c)) => c,
    };
    let Some(wanted) = &p.member_storage_class else {
        return Finding::ok(
            "class",
            subject,
            format!("member {member}, its default StorageClass"),
        );
    };
    let api = Api::<StorageClass>::all(cluster.client());
    match cluster.fetch(&format!("get StorageClass {wanted}"), api.get(wanted)).await {
        Ok(Some(_)) => Finding::ok(
            "class",
            subject,
            format!("member {member} answers and has StorageClass {wanted}"),
        ),
        Ok(None) => Finding::problem(
            "class",
            subject,
            format!("member {member} has no StorageClass {wanted:?} (parameter memberStorageClass): every CreateVolume fails"),
            format!("create StorageClass {wanted} in member {member}, or fix memberStorageClass"),
        ),
        Err(e) if e.is_unreachable() => Finding::problem(
            "class",
            subject,
            format!("member {member} does not answer: {e}"),
            format!("check member {member}'s API server and its kubeconfig (Secret csi-relay-members)"),
        ),
        Err(e) => Finding::unchecked("class", subject, e.to_string()),
    }
}
