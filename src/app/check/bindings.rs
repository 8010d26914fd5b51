//! The RBAC bindings that name the identity `csi-relay check` runs as.
//!
//! A rules review says what an identity may do in one namespace, never
//! why; only the bindings say where rights come from. They also say where
//! to look: outside its ClusterRoleBindings an identity holds rights only
//! in namespaces with a RoleBinding of it, so those are the namespaces to
//! review, without listing every namespace.

use std::collections::BTreeSet;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding, RoleRef, Subject};
use kube::api::{Api, ListParams, PostParams};
use serde::Deserialize;

use crate::k8s::cluster::Cluster;

/// The kit's own RBAC: its bindings are what the matrix describes.
const KIT_RBAC: [&str; 3] = [
    include_str!("../../../deploy/rbac.yaml"),
    include_str!("../../../deploy/member/rbac.yaml"),
    include_str!("../../../deploy/member/node-secrets/role.yaml"),
];

/// Who the API server takes this identity for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub groups: Vec<String>,
}

/// One binding that names the identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Binding {
    /// `None` for a ClusterRoleBinding.
    pub namespace: Option<String>,
    pub name: String,
    /// `ClusterRole NAME` or `Role NAME`.
    pub role: String,
    /// How it names the identity: `ServiceAccount ns/name`, `User u`, `Group g`.
    pub via: String,
}

impl Binding {
    /// Whether the kit itself ships this binding (deploy/).
    pub fn is_kits(&self) -> bool {
        kit_bindings().contains(&(self.namespace.clone(), self.name.clone()))
    }
}

impl std::fmt::Display for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "RoleBinding {ns}/{}", self.name)?,
            None => write!(f, "ClusterRoleBinding {}", self.name)?,
        }
        write!(f, " ({}, binds {})", self.role, self.via)
    }
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Doc {
    kind: String,
    metadata: Meta,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct Meta {
    name: String,
    namespace: Option<String>,
}

/// (namespace, name) of every binding deploy/ ships; namespace `None` for
/// a ClusterRoleBinding.
pub fn kit_bindings() -> BTreeSet<(Option<String>, String)> {
    let mut out = BTreeSet::new();
    for text in KIT_RBAC {
        for doc in serde_saphyr::from_multiple::<Doc>(text).unwrap_or_default() {
            match doc.kind.as_str() {
                "ClusterRoleBinding" => {
                    out.insert((None, doc.metadata.name));
                }
                "RoleBinding" => {
                    out.insert((doc.metadata.namespace, doc.metadata.name));
                }
                _ => {}
            }
        }
    }
    out
}

/// The identity of this process in `cluster` (SelfSubjectReview).
pub async fn whoami(cluster: &Cluster) -> Result<Identity, String> {
    let api = Api::<SelfSubjectReview>::all(cluster.client());
    let review = cluster
        .run(
            "create SelfSubjectReview",
            api.create(&PostParams::default(), &SelfSubjectReview::default()),
        )
        .await
        .map_err(|e| e.to_string())?;
    let info = review
        .status
        .and_then(|s| s.user_info)
        .ok_or("the API server's SelfSubjectReview names no user")?;
    Ok(Identity {
        user: info.username.unwrap_or_default(),
        groups: info.groups.unwrap_or_default(),
    })
}

/// How `subject` names `who`, if it does.
fn names(subject: &Subject, binding_ns: Option<&str>, who: &Identity) -> Option<String> {
    match subject.kind.as_str() {
        "ServiceAccount" => {
            // A ServiceAccount subject without a namespace means the
            // RoleBinding's own.
            let ns = subject.namespace.as_deref().or(binding_ns)?;
            let user = format!("system:serviceaccount:{ns}:{}", subject.name);
            (user == who.user).then(|| format!("ServiceAccount {ns}/{}", subject.name))
        }
        "User" => (subject.name == who.user).then(|| format!("User {}", subject.name)),
        "Group" => who
            .groups
            .contains(&subject.name)
            .then(|| format!("Group {}", subject.name)),
        _ => None,
    }
}

fn role(r: &RoleRef) -> String {
    format!("{} {}", r.kind, r.name)
}

/// The bindings among these that name `who`.
pub fn naming(
    who: &Identity,
    cluster_bindings: &[ClusterRoleBinding],
    role_bindings: &[RoleBinding],
) -> Vec<Binding> {
    let mut out = Vec::new();
    for b in cluster_bindings {
        for s in b.subjects.iter().flatten() {
            if let Some(via) = names(s, None, who) {
                out.push(Binding {
                    namespace: None,
                    name: b.metadata.name.clone().unwrap_or_default(),
                    role: role(&b.role_ref),
                    via,
                });
            }
        }
    }
    for b in role_bindings {
        let ns = b.metadata.namespace.as_deref();
        for s in b.subjects.iter().flatten() {
            if let Some(via) = names(s, ns, who) {
                out.push(Binding {
                    namespace: ns.map(str::to_string),
                    name: b.metadata.name.clone().unwrap_or_default(),
                    role: role(&b.role_ref),
                    via,
                });
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Every binding of the cluster that names `who`: needs `list` on
/// clusterrolebindings and rolebindings, which the kit grants for this.
pub async fn of(cluster: &Cluster, who: &Identity) -> Result<Vec<Binding>, String> {
    let cluster_bindings: Vec<ClusterRoleBinding> =
        all(cluster, "list ClusterRoleBindings").await?;
    let role_bindings: Vec<RoleBinding> = all(cluster, "list RoleBindings").await?;
    Ok(naming(who, &cluster_bindings, &role_bindings))
}

/// Every object of kind `K` in the cluster, by pages.
async fn all<K>(cluster: &Cluster, what: &str) -> Result<Vec<K>, String>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut found = Vec::new();
    cluster
        .list_pages(
            what,
            &Api::<K>::all(cluster.client()),
            ListParams::default(),
            |page| {
                found.extend(page);
                Ok::<_, crate::k8s::error::KubeError>(())
            },
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn sa(ns: Option<&str>, name: &str) -> Subject {
        Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: ns.map(str::to_string),
            ..Default::default()
        }
    }

    fn role_ref(kind: &str, name: &str) -> RoleRef {
        RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: kind.into(),
            name: name.into(),
        }
    }

    #[test]
    fn the_kit_ships_its_bindings_and_only_those() {
        let kit = kit_bindings();
        assert!(kit.contains(&(None, "csi-relay-controller".into())));
        assert!(kit.contains(&(None, "csi-relay-member".into())));
        assert!(kit.contains(&(
            Some("csi-relay".into()),
            "csi-relay-controller-leases".into()
        )));
        assert!(kit.contains(&(
            Some("csi-relay-node-secrets".into()),
            "csi-relay-member-node-secrets".into()
        )));
        assert!(!kit.contains(&(None, "cluster-admin".into())));
    }

    #[test]
    fn a_binding_names_the_identity_by_service_account_user_or_group() {
        let who = Identity {
            user: "system:serviceaccount:csi-relay:csi-relay-member".into(),
            groups: vec![
                "system:serviceaccounts".into(),
                "system:authenticated".into(),
            ],
        };
        let crb = |name: &str, subjects: Vec<Subject>| ClusterRoleBinding {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            role_ref: role_ref("ClusterRole", "view"),
            subjects: Some(subjects),
        };
        let rb = |ns: &str, name: &str, subjects: Vec<Subject>| RoleBinding {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                ..Default::default()
            },
            role_ref: role_ref("Role", "secrets"),
            subjects: Some(subjects),
        };
        let found = naming(
            &who,
            &[
                crb("mine", vec![sa(Some("csi-relay"), "csi-relay-member")]),
                crb("another-sa", vec![sa(Some("csi-relay"), "csi-relay-node")]),
                crb(
                    "all-sas",
                    vec![Subject {
                        kind: "Group".into(),
                        name: "system:serviceaccounts".into(),
                        ..Default::default()
                    }],
                ),
            ],
            &[
                // No namespace on the subject: the binding's own.
                rb("csi-relay", "implicit", vec![sa(None, "csi-relay-member")]),
                rb(
                    "apps",
                    "implicit-elsewhere",
                    vec![sa(None, "csi-relay-member")],
                ),
                rb(
                    "apps",
                    "explicit",
                    vec![sa(Some("csi-relay"), "csi-relay-member")],
                ),
            ],
        );
        let shown: Vec<String> = found.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "ClusterRoleBinding all-sas (ClusterRole view, binds Group system:serviceaccounts)",
                "ClusterRoleBinding mine (ClusterRole view, binds ServiceAccount csi-relay/csi-relay-member)",
                "RoleBinding apps/explicit (Role secrets, binds ServiceAccount csi-relay/csi-relay-member)",
                "RoleBinding csi-relay/implicit (Role secrets, binds ServiceAccount csi-relay/csi-relay-member)",
            ]
        );
    }
}
