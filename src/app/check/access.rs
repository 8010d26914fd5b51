//! This process's rights in each cluster against the permission matrix of
//! docs/security.md (compiled in): every right the matrix grants the
//! identity is held (SelfSubjectAccessReview), and nothing beyond it
//! (SelfSubjectRulesReview in csi-relay's namespace).

use std::collections::BTreeSet;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, ResourceRule, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    SelfSubjectRulesReview, SelfSubjectRulesReviewSpec,
};
use kube::api::{Api, PostParams};

use super::report::{Clusters, Finding};
use crate::k8s::cluster::Cluster;

const MATRIX: &str = include_str!("../../../docs/security.md");
/// Where the kit's namespaced rights live.
const NAMESPACE: &str = "csi-relay";

/// (apiGroup, resource, verb, name, namespace): one right of the matrix.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Right {
    pub group: String,
    pub resource: String,
    pub verb: String,
    pub name: String,
    pub namespace: String,
}

impl std::fmt::Display for Right {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{} {}.{}", self.verb, self.resource, group)?;
        if self.name != "*" {
            write!(f, " {}", self.name)?;
        }
        if self.namespace != "*" {
            write!(f, " in {}", self.namespace)?;
        }
        Ok(())
    }
}

impl Right {
    /// (apiGroup, resource, verb, name): how a rules review lists it.
    pub fn key(&self) -> Listed {
        (
            self.group.clone(),
            self.resource.clone(),
            self.verb.clone(),
            self.name.clone(),
        )
    }

    /// The attributes an access review of this right asks about.
    pub fn attributes(&self) -> ResourceAttributes {
        let (resource, subresource) = match self.resource.split_once('/') {
            Some((r, s)) => (r.to_string(), Some(s.to_string())),
            None => (self.resource.clone(), None),
        };
        ResourceAttributes {
            group: Some(self.group.clone()),
            resource: Some(resource),
            subresource,
            verb: Some(self.verb.clone()),
            namespace: (self.namespace != "*").then(|| self.namespace.clone()),
            name: (self.name != "*").then(|| self.name.clone()),
            ..Default::default()
        }
    }
}

/// (apiGroup, resource, verb, name).
pub type Listed = (String, String, String, String);

/// One right a row of the matrix names, held (`may`) or not.
#[derive(Debug, Clone)]
pub struct Entry {
    pub identity: String,
    pub cluster: String,
    pub may: bool,
    pub right: Right,
}

/// Every right the matrix of docs/security.md names: an entry per
/// resource and verb of each row. A malformed row is an error naming it.
pub fn matrix() -> Result<Vec<Entry>, String> {
    let begin = MATRIX
        .find("<!-- permission-matrix:begin -->")
        .ok_or("docs/security.md has no permission-matrix:begin marker")?;
    let end = MATRIX
        .find("<!-- permission-matrix:end -->")
        .ok_or("docs/security.md has no permission-matrix:end marker")?;
    let mut out = Vec::new();
    for line in MATRIX[begin..end].lines() {
        if !line.starts_with("| ") || line.starts_with("| identity") {
            continue;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let may = match cells.get(7) {
            Some(&"yes") if cells.len() == 8 => true,
            Some(&"no") if cells.len() == 8 => false,
            _ => {
                return Err(format!(
                    "permission matrix row {line:?}: want 8 cells ending in yes or no"
                ))
            }
        };
        let group = if cells[3] == "core" { "" } else { cells[3] };
        for resource in cells[4].split_whitespace() {
            for verb in cells[5].split_whitespace() {
                out.push(Entry {
                    identity: cells[0].into(),
                    cluster: cells[1].into(),
                    may,
                    right: Right {
                        group: group.into(),
                        resource: resource.into(),
                        verb: verb.into(),
                        name: cells[6].into(),
                        namespace: cells[2].into(),
                    },
                });
            }
        }
    }
    Ok(out)
}

/// The rights the matrix grants `identity` in `cluster` (its `yes` rows).
pub fn granted(identity: &str, cluster: &str) -> Vec<Right> {
    matrix()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.may && e.identity == identity && e.cluster == cluster)
        .map(|e| e.right)
        .collect()
}

/// The rights a rules review lists, one per group, resource, verb and name.
pub fn listed(rules: Vec<ResourceRule>) -> BTreeSet<Listed> {
    let mut out = BTreeSet::new();
    for rule in rules {
        let names = rule
            .resource_names
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| vec!["*".into()]);
        for g in rule.api_groups.unwrap_or_default() {
            for r in rule.resources.clone().unwrap_or_default() {
                for v in &rule.verbs {
                    for n in &names {
                        out.insert((g.clone(), r.clone(), v.clone(), n.clone()));
                    }
                }
            }
        }
    }
    out
}

/// What every authenticated identity may do anyway.
fn baseline(group: &str, resource: &str) -> bool {
    matches!(
        (group, resource),
        ("authorization.k8s.io", "selfsubjectaccessreviews")
            | ("authorization.k8s.io", "selfsubjectrulesreviews")
            | ("authentication.k8s.io", "selfsubjectreviews")
    )
}

async fn holds(cluster: &Cluster, right: &Right) -> Result<bool, String> {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(right.attributes()),
            ..Default::default()
        },
        ..Default::default()
    };
    let api = Api::<SelfSubjectAccessReview>::all(cluster.client());
    cluster
        .run(
            "create SelfSubjectAccessReview",
            api.create(&PostParams::default(), &review),
        )
        .await
        .map(|r| r.status.is_some_and(|s| s.allowed))
        .map_err(|e| e.to_string())
}

async fn rules(cluster: &Cluster) -> Result<BTreeSet<Listed>, String> {
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec {
            namespace: Some(NAMESPACE.into()),
        },
        ..Default::default()
    };
    let api = Api::<SelfSubjectRulesReview>::all(cluster.client());
    let answer = cluster
        .run(
            "create SelfSubjectRulesReview",
            api.create(&PostParams::default(), &review),
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(listed(
        answer.status.map(|s| s.resource_rules).unwrap_or_default(),
    ))
}

/// One cluster as one identity of the matrix.
async fn check_one(cluster: &Cluster, subject: &str, identity: &str, which: &str) -> Vec<Finding> {
    let wanted = granted(identity, which);
    let mut missing = Vec::new();
    for right in &wanted {
        match holds(cluster, right).await {
            Ok(true) => {}
            Ok(false) => missing.push(right.to_string()),
            Err(e) => return vec![Finding::unchecked("access", subject, e)],
        }
    }
    let mut out = Vec::new();
    if missing.is_empty() {
        out.push(Finding::ok(
            "access",
            subject,
            format!(
                "holds every right docs/security.md gives {identity} ({} checked)",
                wanted.len()
            ),
        ));
    } else {
        out.push(Finding::problem(
            "access",
            subject,
            format!("lacks {} right(s) {identity} needs: {}", missing.len(), missing.join(", ")),
            format!(
                "apply the kit's RBAC for {identity} ({}), and run check with the relay's own credentials",
                if which == "host" { "deploy/rbac.yaml" } else { "deploy/member/" }
            ),
        ));
    }
    let allowed: BTreeSet<Listed> = wanted
        .iter()
        .filter(|r| r.namespace == "*" || r.namespace == NAMESPACE)
        .map(Right::key)
        .collect();
    match rules(cluster).await {
        Ok(held) => {
            let beyond: Vec<String> = held
                .difference(&allowed)
                .filter(|(g, r, _, _)| !baseline(g, r))
                .map(|(g, r, v, n)| {
                    Right {
                        group: g.clone(),
                        resource: r.clone(),
                        verb: v.clone(),
                        name: n.clone(),
                        namespace: NAMESPACE.into(),
                    }
                    .to_string()
                })
                .collect();
            if !beyond.is_empty() {
                let shown: Vec<&String> = beyond.iter().take(12).collect();
                out.push(Finding::problem(
                    "access",
                    subject,
                    format!(
                        "holds {} right(s) beyond what docs/security.md gives {identity}: {shown:?}{}",
                        beyond.len(),
                        if beyond.len() > shown.len() { " ..." } else { "" }
                    ),
                    "remove the extra bindings of this identity (kubectl get clusterrolebindings,rolebindings -A -o wide), or run check with the relay's own credentials, not an admin's",
                ));
            }
        }
        Err(e) => out.push(Finding::unchecked("access", subject, e)),
    }
    out
}

pub async fn check(clusters: &Clusters) -> Vec<Finding> {
    let mut out = check_one(
        &clusters.host,
        "host cluster",
        "csi-relay-controller",
        "host",
    )
    .await;
    for (name, member) in &clusters.members {
        let subject = format!("member cluster {name}");
        match member {
            Ok(c) => out.extend(check_one(c, &subject, "csi-relay-member", "member").await),
            Err(e) => out.push(Finding::unchecked("access", subject, e.clone())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_compiled_in_matrix_gives_each_identity_its_rights() {
        let all = matrix().expect("every row well formed");
        assert!(
            all.iter().any(|e| !e.may),
            "rows the identities may not hold"
        );
        let host = granted("csi-relay-controller", "host");
        assert!(host.len() > 50, "{}", host.len());
        assert!(host
            .iter()
            .any(|r| r.resource == "leases" && r.namespace == "csi-relay"));
        let member = granted("csi-relay-member", "member");
        assert!(member
            .iter()
            .any(|r| r.resource == "persistentvolumeclaims" && r.verb == "delete"));
        assert!(
            !member.iter().any(|r| r.resource == "secrets"),
            "only `yes` rows"
        );
        assert_eq!(
            granted("csi-relay-member-node", "member")[0].to_string(),
            "get secrets.core node-stage-secret in csi-relay-node-secrets"
        );
    }
}
