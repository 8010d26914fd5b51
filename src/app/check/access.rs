//! This process's rights in each cluster against the permission matrix of
//! docs/security.md (compiled in): every right the matrix grants the
//! identity is held (SelfSubjectAccessReview), and nothing beyond it
//! (SelfSubjectRulesReview cluster-wide and in every namespace where a
//! binding names it), each extra named with the binding that grants it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, ResourceRule, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    SelfSubjectRulesReview, SelfSubjectRulesReviewSpec,
};
use kube::api::{Api, PostParams};

use super::bindings::{self, Binding};
use super::report::{Clusters, Finding};
use crate::k8s::cluster::Cluster;

const MATRIX: &str = include_str!("../../../docs/security.md");
/// Where the matrix puts the kit's namespaced rights: the namespace it is
/// installed in, the controller's (`--namespace`, the pod's own) in the host.
const MATRIX_NAMESPACE: &str = "csi-relay";

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

/// The rights the matrix grants `identity` in `cluster`, with the kit's
/// namespace where the matrix says csi-relay: a release installed in
/// another namespace holds them there.
pub fn granted_in(identity: &str, cluster: &str, namespace: &str) -> Vec<Right> {
    let mut rights = granted(identity, cluster);
    for r in &mut rights {
        if r.namespace == MATRIX_NAMESPACE {
            r.namespace = namespace.to_string();
        }
    }
    rights
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

pub(super) async fn holds(cluster: &Cluster, right: &Right) -> Result<bool, String> {
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

async fn rules(cluster: &Cluster, namespace: &str) -> Result<BTreeSet<Listed>, String> {
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec {
            namespace: Some(namespace.into()),
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

/// Rights held beyond the matrix in one scope, and the bindings that can
/// grant them there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Beyond {
    /// `None`: in every namespace (a ClusterRoleBinding's).
    pub namespace: Option<String>,
    pub rights: Vec<String>,
    pub from: Vec<Binding>,
}

/// What the reviews found beyond `wanted`. `everywhere` is a review in a
/// namespace no RoleBinding names, so it holds only what ClusterRoleBindings
/// grant; `per_namespace` the reviews of other namespaces, whose extras are
/// counted beyond that. Each scope's extras are laid at the door of the
/// bindings that reach there and that the kit does not ship, or, if the
/// kit's own are all there is, of those (a role of the kit edited).
pub fn beyond(
    wanted: &[Right],
    everywhere: &BTreeSet<Listed>,
    per_namespace: &BTreeMap<String, BTreeSet<Listed>>,
    bindings: &[Binding],
) -> Vec<Beyond> {
    let allowed = |ns: Option<&str>| -> BTreeSet<Listed> {
        wanted
            .iter()
            .filter(|r| r.namespace == "*" || Some(r.namespace.as_str()) == ns)
            .map(Right::key)
            .collect()
    };
    let extras = |held: &BTreeSet<Listed>, allowed: &BTreeSet<Listed>, ns: Option<&str>| {
        held.iter()
            .filter(|l| !allowed.contains(*l) && !everywhere_counted(l, ns, everywhere))
            .filter(|(g, r, _, _)| !baseline(g, r))
            .map(|(g, r, v, n)| {
                Right {
                    group: g.clone(),
                    resource: r.clone(),
                    verb: v.clone(),
                    name: n.clone(),
                    namespace: ns.unwrap_or("*").into(),
                }
                .to_string()
            })
            .collect::<Vec<_>>()
    };
    let culprits = |ns: Option<&str>| {
        let reach: Vec<Binding> = bindings
            .iter()
            .filter(|b| b.namespace.as_deref() == ns)
            .cloned()
            .collect();
        let foreign: Vec<Binding> = reach.iter().filter(|b| !b.is_kits()).cloned().collect();
        if foreign.is_empty() {
            reach
        } else {
            foreign
        }
    };
    let mut out = Vec::new();
    let rights = extras(everywhere, &allowed(None), None);
    if !rights.is_empty() {
        out.push(Beyond {
            namespace: None,
            rights,
            from: culprits(None),
        });
    }
    for (ns, held) in per_namespace {
        let rights = extras(held, &allowed(Some(ns)), Some(ns));
        if !rights.is_empty() {
            out.push(Beyond {
                namespace: Some(ns.clone()),
                rights,
                from: culprits(Some(ns)),
            });
        }
    }
    out
}

/// Whether a right listed in namespace `ns` is one every namespace has
/// (reported once, as a ClusterRoleBinding's).
fn everywhere_counted(l: &Listed, ns: Option<&str>, everywhere: &BTreeSet<Listed>) -> bool {
    ns.is_some() && everywhere.contains(l)
}

/// A namespace name that no binding of the identity names: a rules review
/// there sees only cluster-wide grants. It need not exist.
fn unbound_namespace(bindings: &[Binding]) -> String {
    let mut name = String::from("csi-relay-check-unbound");
    while bindings
        .iter()
        .any(|b| b.namespace.as_deref() == Some(name.as_str()))
    {
        name.push('x');
    }
    name
}

/// The namespaces to review: the kit's, the matrix's, and every one where
/// a RoleBinding names the identity.
fn namespaces(kit: &str, wanted: &[Right], bindings: &[Binding]) -> BTreeSet<String> {
    let mut out: BTreeSet<String> = [kit.to_string()].into();
    out.extend(
        wanted
            .iter()
            .filter(|r| r.namespace != "*")
            .map(|r| r.namespace.clone()),
    );
    out.extend(bindings.iter().filter_map(|b| b.namespace.clone()));
    out
}

/// Rights held beyond the matrix, each scope a finding naming what grants it.
async fn extra_rights(
    cluster: &Cluster,
    subject: &str,
    identity: &str,
    kit: &str,
    wanted: &[Right],
) -> Vec<Finding> {
    let mut out = Vec::new();
    let found = match bindings::whoami(cluster).await {
        Ok(who) => bindings::of(cluster, &who).await,
        Err(e) => Err(e),
    };
    let found = match found {
        Ok(b) => b,
        Err(e) => {
            // Without the bindings, the namespaces to look in are unknown:
            // the kit's and cluster-wide only, as the rules review shows them.
            out.push(Finding::info(
                "access",
                subject,
                format!("rights beyond the matrix are looked for in namespace {kit} and cluster-wide only: cannot read the bindings that name this identity: {e}"),
            ));
            Vec::new()
        }
    };
    let everywhere = match rules(cluster, &unbound_namespace(&found)).await {
        Ok(r) => r,
        Err(e) => return vec![Finding::unchecked("access", subject, e)],
    };
    let mut per_namespace = BTreeMap::new();
    for ns in namespaces(kit, wanted, &found) {
        match rules(cluster, &ns).await {
            Ok(r) => {
                per_namespace.insert(ns, r);
            }
            Err(e) => return vec![Finding::unchecked("access", subject, e)],
        }
    }
    for b in beyond(wanted, &everywhere, &per_namespace, &found) {
        let shown: Vec<&String> = b.rights.iter().take(12).collect();
        let scope = match &b.namespace {
            Some(ns) => format!("in namespace {ns}"),
            None => "in every namespace".into(),
        };
        let from: Vec<String> = b.from.iter().map(ToString::to_string).collect();
        let granted = if from.is_empty() {
            String::new()
        } else {
            format!("; granted by {}", from.join(", "))
        };
        let fix = match b.from.iter().find(|b| !b.is_kits()) {
            Some(Binding { namespace: Some(ns), name, .. }) => format!(
                "kubectl -n {ns} delete rolebinding {name} (or take this identity out of its subjects), or run check with the relay's own credentials, not an admin's"
            ),
            Some(Binding { namespace: None, name, .. }) => format!(
                "kubectl delete clusterrolebinding {name} (or take this identity out of its subjects), or run check with the relay's own credentials, not an admin's"
            ),
            None => "re-apply the kit's RBAC (a role of the kit holds more than it ships), or remove the extra bindings of this identity (kubectl get clusterrolebindings,rolebindings -A -o wide)".into(),
        };
        out.push(Finding::problem(
            "access",
            subject,
            format!(
                "holds {} right(s) {scope} beyond what docs/security.md gives {identity}: {shown:?}{}{granted}",
                b.rights.len(),
                if b.rights.len() > shown.len() { " ..." } else { "" }
            ),
            fix,
        ));
    }
    out
}

/// One cluster as one identity of the matrix, its kit installed in
/// namespace `kit`.
async fn check_one(
    cluster: &Cluster,
    subject: &str,
    identity: &str,
    which: &str,
    kit: &str,
) -> Vec<Finding> {
    let wanted = granted_in(identity, which, kit);
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
    out.extend(extra_rights(cluster, subject, identity, kit, &wanted).await);
    out
}

/// `namespace`: the controller's in the host. A member's kit holds no
/// namespaced right; its namespace is the matrix's.
pub async fn check(clusters: &Clusters, namespace: &str) -> Vec<Finding> {
    let mut out = check_one(
        &clusters.host,
        "host cluster",
        "csi-relay-controller",
        "host",
        namespace,
    )
    .await;
    for (name, member) in &clusters.members {
        let subject = format!("member cluster {name}");
        match member {
            Ok(c) => out.extend(
                check_one(c, &subject, "csi-relay-member", "member", MATRIX_NAMESPACE).await,
            ),
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
        // Secrets: create and delete (the movers' key), never read.
        assert!(
            !member
                .iter()
                .any(|r| r.resource == "secrets" && matches!(r.verb.as_str(), "get" | "list")),
            "only `yes` rows"
        );
        assert!(member
            .iter()
            .any(|r| r.resource == "secrets" && r.verb == "create"));
        assert_eq!(
            granted("csi-relay-member-node", "member")[0].to_string(),
            "get secrets.core node-stage-secret in csi-relay-node-secrets"
        );
    }

    fn l(g: &str, r: &str, v: &str) -> Listed {
        (g.into(), r.into(), v.into(), "*".into())
    }

    fn binding(ns: Option<&str>, name: &str) -> Binding {
        Binding {
            namespace: ns.map(str::to_string),
            name: name.into(),
            role: "ClusterRole view".into(),
            via: "ServiceAccount csi-relay/csi-relay-member".into(),
        }
    }

    #[test]
    fn rights_beyond_the_matrix_are_found_in_any_namespace_and_laid_at_their_binding() {
        let wanted = granted("csi-relay-member", "member");
        let kit: BTreeSet<Listed> = wanted.iter().map(Right::key).collect();
        // What the kit grants, and a ClusterRoleBinding's view on top.
        let mut everywhere = kit.clone();
        everywhere.insert(l("apps", "deployments", "list"));
        everywhere.insert(l(
            "authorization.k8s.io",
            "selfsubjectrulesreviews",
            "create",
        ));
        let mut in_csi_relay = everywhere.clone();
        in_csi_relay.extend(kit.iter().cloned());
        // A RoleBinding in another namespace: secrets there.
        let mut in_apps = everywhere.clone();
        in_apps.insert(l("", "secrets", "get"));
        let per_namespace = BTreeMap::from([
            ("csi-relay".to_string(), in_csi_relay),
            ("apps".to_string(), in_apps),
        ]);
        let bindings = [
            binding(None, "csi-relay-member"),
            binding(None, "extra-view"),
            binding(Some("apps"), "extra-secrets"),
        ];
        let found = beyond(&wanted, &everywhere, &per_namespace, &bindings);
        assert_eq!(
            found,
            [
                Beyond {
                    namespace: None,
                    rights: vec!["list deployments.apps".into()],
                    from: vec![binding(None, "extra-view")],
                },
                Beyond {
                    namespace: Some("apps".into()),
                    rights: vec!["get secrets.core in apps".into()],
                    from: vec![binding(Some("apps"), "extra-secrets")],
                },
            ]
        );
        // Only the kit's own bindings: the kit's role holds the extra.
        let found = beyond(&wanted, &everywhere, &BTreeMap::new(), &bindings[..1]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].from, [binding(None, "csi-relay-member")]);
        // Exactly the matrix: nothing.
        assert!(beyond(&wanted, &kit, &BTreeMap::new(), &bindings).is_empty());
    }

    #[test]
    fn a_kit_in_another_namespace_holds_its_namespaced_rights_there() {
        let moved = granted_in("csi-relay-controller", "host", "storage");
        let leases: Vec<&Right> = moved.iter().filter(|r| r.resource == "leases").collect();
        assert!(!leases.is_empty());
        assert!(
            leases.iter().all(|r| r.namespace == "storage"),
            "{leases:?}"
        );
        // Cluster-wide rights stay cluster-wide.
        let wide = |rights: &[Right]| rights.iter().filter(|r| r.namespace == "*").count();
        assert_eq!(wide(&moved), wide(&granted("csi-relay-controller", "host")));
        assert_eq!(
            granted_in("csi-relay-controller", "host", MATRIX_NAMESPACE),
            granted("csi-relay-controller", "host")
        );
    }

    #[test]
    fn the_namespaces_reviewed_are_the_kits_and_every_bound_one() {
        let wanted = granted("csi-relay-member-node", "member");
        let found = namespaces(
            MATRIX_NAMESPACE,
            &wanted,
            &[binding(Some("apps"), "x"), binding(None, "y")],
        );
        assert_eq!(
            found.into_iter().collect::<Vec<_>>(),
            ["apps", "csi-relay", "csi-relay-node-secrets"]
        );
        let found = namespaces("storage", &wanted, &[]);
        assert_eq!(
            found.into_iter().collect::<Vec<_>>(),
            ["csi-relay-node-secrets", "storage"]
        );
        let unbound = unbound_namespace(&[binding(Some("csi-relay-check-unbound"), "z")]);
        assert_eq!(unbound, "csi-relay-check-unboundx");
    }
}
