//! The driver's StorageClasses: parameters valid, the member they name
//! configured and answering, its `memberStorageClass` there (for classes
//! whose volumes move, `movable`).

use std::collections::HashMap;

use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams};

use super::report::{Clusters, Finding};
use k8s_openapi::api::storage::v1::CSIDriver;

use crate::domain::params::{self, BackingChoice, VolumeParams};
use crate::domain::sharing::Sharing;
use crate::k8s::cluster::Cluster;
use crate::k8s::naming;

/// `mover`: the controller's `--mover-image`, which classes whose volumes
/// move need (`movable`).
pub async fn check(
    clusters: &Clusters,
    driver: &str,
    mover: &Result<Option<String>, String>,
) -> Vec<Finding> {
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
        out.push(check_class(clusters, &subject, &class, mover).await);
    }
    out
}

async fn check_class(
    clusters: &Clusters,
    subject: &str,
    class: &StorageClass,
    mover: &Result<Option<String>, String>,
) -> Finding {
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
    match Sharing::of(&p) {
        Err(why) => {
            return Finding::problem("class", subject, why, "fix sharedWith and sharedPaths")
        }
        Ok(Some(sharing)) if sharing.moves() => {
            return super::movable::check(clusters, subject, &sharing, mover).await
        }
        Ok(Some(sharing)) => {
            if let Some(problem) = check_sharing(clusters, subject, &p, &sharing).await {
                return problem;
            }
        }
        Ok(None) => {}
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

/// A class of storage several members share: every one of them must be
/// able to use a volume of it. The member class where the volume may be
/// provisioned (the `member`, else any sharing member), and in every other
/// the CSI driver that class's provisioner is, when it is one (an import
/// names the same driver and handle). None: nothing missing.
async fn check_sharing(
    clusters: &Clusters,
    subject: &str,
    p: &VolumeParams,
    sharing: &Sharing,
) -> Option<Finding> {
    let mut reachable: Vec<(&str, &Cluster)> = Vec::new();
    for m in sharing.members() {
        if clusters.lost.iter().any(|l| l == m) {
            continue;
        }
        match clusters.member(m) {
            None => {
                return Some(Finding::problem(
                    "class",
                    subject,
                    format!("sharedWith names member {m:?}, which is not configured (--member): CreateVolume refuses the class"),
                    format!("add --member {m}=KUBECONFIG to the controller, or remove {m} from sharedWith"),
                ))
            }
            Some(Err(e)) => return Some(Finding::unchecked("class", subject, e.clone())),
            Some(Ok(c)) => reachable.push((m, c)),
        }
    }
    let wanted = p.member_storage_class.as_deref()?;
    let origins: Vec<&(&str, &Cluster)> = reachable
        .iter()
        .filter(|(m, _)| p.member.as_deref().is_none_or(|o| o == *m))
        .collect();
    let mut provisioner = None;
    for (m, cluster) in &origins {
        let api = Api::<StorageClass>::all(cluster.client());
        match cluster.fetch(&format!("get StorageClass {wanted}"), api.get(wanted)).await {
            Ok(Some(class)) => provisioner = provisioner.or(Some((m.to_string(), class.provisioner))),
            Ok(None) => {
                return Some(Finding::problem(
                    "class",
                    subject,
                    format!("shared storage: member {m} may provision volumes of this class, but has no StorageClass {wanted:?} (parameter memberStorageClass)"),
                    format!("create StorageClass {wanted} in member {m}, or name the provisioning member with the parameter member"),
                ))
            }
            Err(e) => return Some(Finding::unchecked("class", subject, e.to_string())),
        }
    }
    let (origin, driver) = provisioner?;
    // A CSI driver's name is a DNS subdomain; others (`example.com/x`)
    // name in-tree or external provisioners of directories and servers.
    if !naming::is_dns_subdomain(&driver) {
        return None;
    }
    let origin_cluster = reachable.iter().find(|(m, _)| *m == origin)?.1;
    let csi = Api::<CSIDriver>::all(origin_cluster.client());
    match origin_cluster
        .fetch(&format!("get CSIDriver {driver}"), csi.get(&driver))
        .await
    {
        Ok(Some(_)) => {}
        // Not a CSI driver (hostPath, local, NFS provisioners): the
        // import names a directory or a server, no driver.
        Ok(None) => return None,
        Err(e) => return Some(Finding::unchecked("class", subject, e.to_string())),
    }
    for (m, cluster) in reachable.iter().filter(|(m, _)| *m != origin) {
        let api = Api::<CSIDriver>::all(cluster.client());
        match cluster.fetch(&format!("get CSIDriver {driver}"), api.get(&driver)).await {
            Ok(Some(_)) => {}
            Ok(None) => {
                return Some(Finding::problem(
                    "class",
                    subject,
                    format!("shared storage: member {m} has no CSIDriver {driver} (the driver of member {origin}'s StorageClass {wanted}): a volume imported into {m} cannot be mounted there"),
                    format!("install {driver} in member {m}, reaching the same storage, or remove {m} from sharedWith"),
                ))
            }
            Err(e) => return Some(Finding::unchecked("class", subject, e.to_string())),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::report::Status;
    use super::*;
    use crate::k8s::testing;

    fn sharing_params(member_class: Option<&str>) -> (VolumeParams, Sharing) {
        let mut map: HashMap<String, String> = [("sharedWith", "east,west")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if let Some(class) = member_class {
            map.insert("memberStorageClass".into(), class.into());
        }
        let p = params::decode(&map, "parameters").unwrap();
        let sharing = Sharing::of(&p).unwrap().unwrap();
        (p, sharing)
    }

    fn clusters(west: Result<Cluster, String>, east: Cluster) -> Clusters {
        let (host, _host_api) = testing::host();
        Clusters {
            host,
            members: vec![("east".into(), Ok(east)), ("west".into(), west)],
            lost: vec![],
            host_nodes: Ok(vec![]),
        }
    }

    /// A sharing member the check could not connect to leaves the class
    /// unchecked, saying why, and asks nothing of the others.
    #[tokio::test]
    async fn a_sharing_member_not_connected_leaves_the_class_unchecked_saying_why() {
        let (east, east_api) = testing::member("east");
        let clusters = clusters(
            Err("member west: kubeconfig /etc/west: no such file".into()),
            east,
        );
        let (p, sharing) = sharing_params(Some("shared"));
        let finding = check_sharing(&clusters, "StorageClass g", &p, &sharing)
            .await
            .expect("a finding");
        assert_eq!(finding.status, Status::Unchecked, "{finding:?}");
        assert!(finding.message.contains("/etc/west"), "{finding:?}");
        drop(clusters);
        east_api.expect_done().await;
    }

    /// A member that does not answer when its class is looked up leaves the
    /// class unchecked with the call's error, not a problem it cannot know.
    #[tokio::test]
    async fn a_sharing_member_that_does_not_answer_leaves_the_class_unchecked() {
        let (east, mut east_api) = testing::member("east");
        let (west, _west_api) = testing::member("west");
        let clusters = clusters(Ok(west), east);
        let (p, sharing) = sharing_params(Some("shared"));
        let (finding, ()) = tokio::join!(
            check_sharing(&clusters, "StorageClass g", &p, &sharing),
            async {
                east_api
                    .expect("GET", "/apis/storage.k8s.io/v1/storageclasses/shared")
                    .await
                    .refuse();
            }
        );
        let finding = finding.expect("a finding");
        assert_eq!(finding.status, Status::Unchecked, "{finding:?}");
        assert!(
            finding.message.contains("member cluster east"),
            "{finding:?}"
        );
    }
}
