//! Least privilege, asked of the real API servers (issue #37).
//!
//! - The permission matrix of docs/security.md against the host and the
//!   member with deploy/ and deploy/member/ installed: each identity holds
//!   exactly the matrix's `yes` rows (SelfSubjectRulesReview as that
//!   identity, less what any service account holds), every `yes` row is
//!   allowed and every `no` row denied (SubjectAccessReview).
//! - The member admission policy (deploy/member/admission*, installed by
//!   tests/e2e-env/member-identity.sh): as the relay's member identity, a
//!   user's claim can be neither deleted, changed nor marked, a bound Kosmos
//!   copy is kept, and what the relay really does is allowed.

use std::collections::BTreeSet;
use std::path::Path;

use csi_relay::app::check::access::{self, Entry, Listed, Right};
use k8s_openapi::api::authorization::v1::{
    SelfSubjectRulesReview, SelfSubjectRulesReviewSpec, SubjectAccessReview,
    SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use serde_json::json;

use crate::common;
use crate::e2e_support::{self, client};

const NAMESPACE: &str = "csi-relay";
const NODE_SECRETS_NAMESPACE: &str = "csi-relay-node-secrets";

/// The namespace of an identity's ServiceAccount: the host's node plugin
/// lives apart from the controller (deploy/namespace.yaml).
fn home(identity: &str) -> &'static str {
    if identity == "csi-relay-node" {
        "csi-relay-node"
    } else {
        NAMESPACE
    }
}

fn user(identity: &str) -> String {
    format!("system:serviceaccount:{}:{identity}", home(identity))
}

/// The groups of a service account of namespace `ns`.
fn groups(ns: &str) -> Vec<String> {
    vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{ns}"),
        "system:authenticated".into(),
    ]
}

/// A service account no manifest names, beside `identity`'s: what every
/// service account there holds anyway.
fn bare(identity: &str) -> String {
    format!("{}/csi-relay-nobody", home(identity))
}

/// A client of `kubeconfig` (an admin) acting as the service account
/// `identity` (or `namespace/name`).
async fn impersonating(kubeconfig: &str, identity: &str) -> Client {
    let kc = Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    let (user, groups) = match identity.split_once('/') {
        Some((ns, name)) => (format!("system:serviceaccount:{ns}:{name}"), groups(ns)),
        None => (user(identity), groups(home(identity))),
    };
    config.auth_info.impersonate = Some(user);
    config.auth_info.impersonate_groups = Some(groups);
    Client::try_from(config).expect("client")
}

/// What `identity` may do in `namespace`, as the API server lists it.
async fn rules(kubeconfig: &str, identity: &str, namespace: &str) -> BTreeSet<Listed> {
    let client = impersonating(kubeconfig, identity).await;
    let review = SelfSubjectRulesReview {
        spec: SelfSubjectRulesReviewSpec {
            namespace: Some(namespace.into()),
        },
        ..Default::default()
    };
    let answer = Api::<SelfSubjectRulesReview>::all(client)
        .create(&PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("SelfSubjectRulesReview as {identity} in {namespace}: {e}"));
    let status = answer.status.expect("review status");
    assert!(
        !status.incomplete,
        "rules of {identity} in {namespace} incomplete: {:?}",
        status.evaluation_error
    );
    access::listed(status.resource_rules)
}

async fn allowed(admin: &Client, identity: &str, right: &Right) -> bool {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user(identity)),
            groups: Some(groups(home(identity))),
            resource_attributes: Some(right.attributes()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("SubjectAccessReview")
        .status
        .is_some_and(|s| s.allowed)
}

fn kubectl(kubeconfig: &str, args: &[&str]) -> Result<(), String> {
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .map_err(|e| format!("kubectl: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn repo(path: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(path)
        .display()
        .to_string()
}

/// Whether deploy/member is installed in the member (env-up.sh does it).
async fn member_kit_installed(member: &Client) -> bool {
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(member.clone(), NAMESPACE)
        .get_opt("csi-relay-member")
        .await
        .ok()
        .flatten()
        .is_some()
}

#[tokio::test]
async fn each_identity_holds_exactly_the_rights_of_the_permission_matrix() {
    let _alone = common::alone();
    let Some(env) = e2e_support::env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    if kubectl(&env.host_kubeconfig, &["version", "--client"]).is_err() {
        common::skip("no kubectl on PATH (E2E_HOME/bin has it)");
        return;
    }
    let host = client(&env.host_kubeconfig).await;
    let member = client(&env.member_kubeconfig).await;
    if !member_kit_installed(&member).await {
        common::skip(
            "deploy/member is not installed in the member (tests/e2e-env/env-up.sh installs it)",
        );
        return;
    }
    // The host kit's identities, and the member's node-secrets component.
    kubectl(
        &env.host_kubeconfig,
        &["apply", "-f", &repo("deploy/namespace.yaml")],
    )
    .unwrap();
    kubectl(
        &env.host_kubeconfig,
        &["apply", "-f", &repo("deploy/rbac.yaml")],
    )
    .unwrap();
    let namespaces: Api<Namespace> = Api::all(member.clone());
    let _ = namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NODE_SECRETS_NAMESPACE}})).unwrap(),
        )
        .await;
    kubectl(
        &env.member_kubeconfig,
        &["apply", "-f", &repo("deploy/member/node-secrets/role.yaml")],
    )
    .unwrap();

    let entries = access::matrix().expect("docs/security.md's matrix");
    let mut failures = Vec::new();
    for (cluster, kubeconfig, admin) in [
        ("host", &env.host_kubeconfig, &host),
        ("member", &env.member_kubeconfig, &member),
    ] {
        let here: Vec<&Entry> = entries.iter().filter(|e| e.cluster == cluster).collect();
        let identities: BTreeSet<&str> = here.iter().map(|e| e.identity.as_str()).collect();
        let mut spaces: BTreeSet<&str> = here
            .iter()
            .map(|e| e.right.namespace.as_str())
            .filter(|n| *n != "*")
            .collect();
        spaces.insert("default");
        spaces.insert(NAMESPACE);
        for namespace in &spaces {
            for identity in &identities {
                let baseline = rules(kubeconfig, &bare(identity), namespace).await;
                let holds: BTreeSet<Listed> = rules(kubeconfig, identity, namespace)
                    .await
                    .difference(&baseline)
                    .cloned()
                    .collect();
                let want: BTreeSet<Listed> = here
                    .iter()
                    .filter(|e| e.identity == *identity && e.may)
                    .filter(|e| e.right.namespace == "*" || e.right.namespace == *namespace)
                    .map(|e| e.right.key())
                    .collect();
                for extra in holds.difference(&want) {
                    failures.push(format!(
                        "{cluster}: {identity} holds {extra:?} in namespace {namespace}, which the matrix does not grant"
                    ));
                }
                for missing in want.difference(&holds) {
                    failures.push(format!(
                        "{cluster}: the matrix grants {identity} {missing:?} in namespace {namespace}, which the manifests do not"
                    ));
                }
            }
        }
        for e in &here {
            let is = allowed(admin, &e.identity, &e.right).await;
            if is != e.may {
                failures.push(format!(
                    "{cluster}: {} {}: allowed={is}, the matrix says {}",
                    e.identity, e.right, e.may
                ));
            }
        }
    }
    eprintln!(
        "permission matrix: {} rights ({} denied), an access review each, rules compared for 4 identities",
        entries.len(),
        entries.iter().filter(|e| !e.may).count()
    );
    let _ = namespaces
        .delete(NODE_SECRETS_NAMESPACE, &DeleteParams::default())
        .await;
    let _ = kubectl(
        &env.host_kubeconfig,
        &["delete", "-f", &repo("deploy/rbac.yaml")],
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn claim(
    name: &str,
    labels: serde_json::Value,
    annotations: serde_json::Value,
) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "no-such-class",
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .expect("claim manifest")
}

/// A hostPath PV (on a path that holds nothing) pre-bound to `ns/claim`.
fn pv(
    name: &str,
    ns: &str,
    claim: &str,
    labels: serde_json::Value,
    reclaim: &str,
) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "no-such-class",
                 "capacity": {"storage": "1Gi"}, "persistentVolumeReclaimPolicy": reclaim,
                 "hostPath": {"path": "/nonexistent/least-privilege", "type": "Directory"},
                 "claimRef": {"namespace": ns, "name": claim}}
    }))
    .expect("PV manifest")
}

fn marked() -> serde_json::Value {
    json!({"app.kubernetes.io/managed-by": "csi-relay"})
}

/// The refusal of the member's admission policy (not of RBAC).
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) {
    match r {
        Err(kube::Error::Api(s))
            if s.code == 403
                && s.message
                    .contains("ValidatingAdmissionPolicy 'csi-relay-member'") => {}
        other => panic!("{what}: want the admission policy's 403, got {other:?}"),
    }
}

#[tokio::test]
async fn the_member_admission_policy_keeps_the_relay_to_its_own_objects() {
    let _alone = common::alone();
    let Some(env) = e2e_support::env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let admin = client(&env.member_kubeconfig).await;
    if !member_kit_installed(&admin).await {
        common::skip(
            "deploy/member is not installed in the member (tests/e2e-env/env-up.sh installs it)",
        );
        return;
    }
    let relay = impersonating(&env.member_kubeconfig, "csi-relay-member").await;
    let ns = format!("least-privilege-{}", std::process::id());
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .expect("test namespace");
    let as_admin: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), &ns);
    let as_relay: Api<PersistentVolumeClaim> = Api::namespaced(relay.clone(), &ns);
    let pp = PostParams::default();
    let kosmos = json!({"kosmos.io/global": "true"});
    as_admin
        .create(&pp, &claim("users-own", json!({}), json!({})))
        .await
        .expect("a user's claim");
    as_admin
        .create(&pp, &claim("kosmos-copy", json!({}), kosmos.clone()))
        .await
        .expect("Kosmos's unbound copy");
    // A copy bound to a user's volume (a copy naming a PV the member does
    // not have is Lost: it holds nothing, and the relay may replace it).
    let users_pv = format!("{ns}-users-pv");
    let pvs_admin: Api<PersistentVolume> = Api::all(admin.clone());
    pvs_admin
        .create(
            &pp,
            &pv(&users_pv, &ns, "kosmos-copy-bound", json!({}), "Retain"),
        )
        .await
        .expect("a user's PV");
    let mut bound = claim("kosmos-copy-bound", json!({}), kosmos.clone());
    if let Some(spec) = bound.spec.as_mut() {
        spec.volume_name = Some(users_pv.clone());
    }
    as_admin
        .create(&pp, &bound)
        .await
        .expect("a bound Kosmos copy");
    e2e_support::eventually(
        "the Kosmos copy Bound",
        std::time::Duration::from_secs(60),
        || async {
            let c = as_admin.get("kosmos-copy-bound").await.ok()?;
            (c.status?.phase.as_deref() == Some("Bound")).then_some(())
        },
    )
    .await;

    let dp = DeleteParams::default();
    refused(
        "delete a user's claim",
        as_relay.delete("users-own", &dp).await,
    );
    refused(
        "mark a user's claim as the relay's",
        as_relay
            .patch(
                "users-own",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": marked()}})),
            )
            .await,
    );
    refused(
        "change a user's claim (what select_node does to the relay's)",
        as_relay
            .patch(
                "users-own",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "member-node-1"}}})),
            )
            .await,
    );
    refused(
        "delete a Kosmos copy bound to a volume",
        as_relay.delete("kosmos-copy-bound", &dp).await,
    );
    refused(
        "create a claim without the relay's mark",
        as_relay
            .create(&pp, &claim("unmarked", json!({}), json!({})))
            .await,
    );
    refused(
        "create a namespace without the relay's mark",
        Api::<Namespace>::all(relay.clone())
            .create(
                &pp,
                &serde_json::from_value(json!({"metadata": {"name": format!("{ns}-unmarked")}}))
                    .unwrap(),
            )
            .await,
    );
    // PersistentVolumes (shared-storage/): only marked, kept (Retain) and
    // pre-bound to one claim; never a user's.
    let pvs_relay: Api<PersistentVolume> = Api::all(relay.clone());
    refused(
        "create a PV without the relay's mark",
        pvs_relay
            .create(
                &pp,
                &pv(&format!("{ns}-unmarked-pv"), &ns, "x", json!({}), "Retain"),
            )
            .await,
    );
    refused(
        "create a marked PV whose release deletes the data",
        pvs_relay
            .create(
                &pp,
                &pv(&format!("{ns}-delete-pv"), &ns, "x", marked(), "Delete"),
            )
            .await,
    );
    let mut unbound = pv(&format!("{ns}-free-pv"), &ns, "x", marked(), "Retain");
    if let Some(spec) = unbound.spec.as_mut() {
        spec.claim_ref = None;
    }
    refused(
        "create a marked PV any claim could bind",
        pvs_relay.create(&pp, &unbound).await,
    );
    refused("delete a user's PV", pvs_relay.delete(&users_pv, &dp).await);
    let import = format!("{ns}-import-pv");
    pvs_relay
        .create(&pp, &pv(&import, &ns, "imported", marked(), "Retain"))
        .await
        .expect("the relay creates an import PV");
    refused(
        "make the relay's PV delete its data",
        pvs_relay
            .patch(
                &import,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"persistentVolumeReclaimPolicy": "Delete"}})),
            )
            .await,
    );
    pvs_relay
        .delete(&import, &dp)
        .await
        .expect("the relay deletes its import PV");

    let foreign_va: VolumeAttachment = serde_json::from_value(json!({
        "metadata": {"name": format!("{ns}-users-va")},
        "spec": {"attacher": "users.example.com", "nodeName": "member-node-1",
                 "source": {"persistentVolumeName": "a-users-pv"}}
    }))
    .unwrap();
    let vas_admin: Api<VolumeAttachment> = Api::all(admin.clone());
    vas_admin
        .create(&pp, &foreign_va)
        .await
        .expect("a user's VolumeAttachment");
    refused(
        "delete a user's VolumeAttachment",
        Api::<VolumeAttachment>::all(relay.clone())
            .delete(&format!("{ns}-users-va"), &dp)
            .await,
    );

    // What the relay does is allowed.
    as_relay
        .delete("kosmos-copy", &dp)
        .await
        .expect("the relay deletes Kosmos's unbound copy");
    as_relay
        .create(&pp, &claim("relays", marked(), json!({})))
        .await
        .expect("the relay creates its marked claim");
    as_relay
        .patch(
            "relays",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "member-node-1"}}})),
        )
        .await
        .expect("the relay changes its claim");
    refused(
        "take the relay's mark off its claim",
        as_relay
            .patch(
                "relays",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": null}}}),
                ),
            )
            .await,
    );
    as_relay
        .delete("relays", &dp)
        .await
        .expect("the relay deletes its claim");
    let made = format!("{ns}-made");
    Api::<Namespace>::all(relay.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": made, "labels": marked()}}))
                .unwrap(),
        )
        .await
        .expect("the relay creates a marked namespace (createMemberNamespace)");

    movers_are_held_to_their_shape(&admin, &relay, &ns).await;

    // The user's objects are all there.
    for name in ["users-own", "kosmos-copy-bound"] {
        assert!(
            as_admin.get_opt(name).await.expect("get").is_some(),
            "{name} is gone"
        );
    }
    assert!(
        pvs_admin.get_opt(&users_pv).await.expect("get").is_some(),
        "the user's PV is gone"
    );
    let _ = vas_admin.delete(&format!("{ns}-users-va"), &dp).await;
    let _ = as_admin.delete("kosmos-copy-bound", &dp).await;
    let _ = pvs_admin.delete(&users_pv, &dp).await;
    let _ = namespaces.delete(&made, &dp).await;
    let _ = namespaces.delete(&ns, &dp).await;
}

/// The mobility component's pods and Secrets (deploy/member/mobility/): the
/// relay's own mover manifests are allowed; anything else a stolen
/// credential would make (another claim mounted, a host path, privilege,
/// a pod without the mover's mark, a Secret of someone else's) is refused.
async fn movers_are_held_to_their_shape(admin: &Client, relay: &Client, ns: &str) {
    use csi_relay::backends::member::mobility::mover::Role;
    use csi_relay::backends::member::mobility::mover_pod::{self, PodPlan};
    use k8s_openapi::api::core::v1::{Pod, Secret};
    let pp = PostParams::default();
    let dp = DeleteParams::default();
    let pods: Api<Pod> = Api::namespaced(relay.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(relay.clone(), ns);
    let uuid = "0123456789abcdef0123456789abcdef";
    let plan = PodPlan {
        uuid,
        move_id: "least-privilege",
        namespace: ns,
        claim: &format!("relay-{uuid}"),
        role: Role::Target,
        image: "csi-relay:least-privilege",
        block: false,
        node: None,
        pod_network: true,
    };
    let mover = mover_pod::pod_manifest(&plan);
    let with = |f: &dyn Fn(&mut serde_json::Value)| -> Pod {
        let mut v = serde_json::to_value(&mover).expect("pod json");
        f(&mut v);
        serde_json::from_value(v).expect("pod")
    };
    let cases: [(&str, Pod); 7] = [
        (
            "create a pod without the mover's label",
            with(&|v| {
                v["metadata"]["labels"]
                    .as_object_mut()
                    .map(|l| l.remove("relay.csi.dev/mover"));
            }),
        ),
        (
            "create a mover that mounts a user's claim",
            with(&|v| {
                v["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] = json!("users-own")
            }),
        ),
        (
            "create a mover that mounts a host path",
            with(&|v| v["spec"]["volumes"][0] = json!({"name": "data", "hostPath": {"path": "/"}})),
        ),
        (
            "create a privileged mover",
            with(&|v| {
                let sc = &mut v["spec"]["containers"][0]["securityContext"];
                sc["privileged"] = json!(true);
                sc["allowPrivilegeEscalation"] = json!(true);
            }),
        ),
        (
            "create a mover with CAP_SYS_ADMIN",
            with(&|v| {
                v["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] =
                    json!(["SYS_ADMIN"])
            }),
        ),
        (
            "create a mover in the host's network",
            with(&|v| v["spec"]["hostNetwork"] = json!(true)),
        ),
        (
            "create a mover holding a service account token",
            with(&|v| v["spec"]["automountServiceAccountToken"] = json!(true)),
        ),
    ];
    for (what, pod) in cases {
        refused(what, pods.create(&pp, &pod).await);
    }
    let key = [7u8; 32];
    let mut unmarked = mover_pod::secret_manifest(uuid, ns, &key);
    unmarked.metadata.labels = None;
    refused(
        "create a Secret without the relay's mark",
        secrets.create(&pp, &unmarked).await,
    );
    let users: Api<Secret> = Api::namespaced(admin.clone(), ns);
    users
        .create(
            &pp,
            &serde_json::from_value(
                json!({"metadata": {"name": "users-secret"}, "stringData": {"a": "b"}}),
            )
            .expect("secret"),
        )
        .await
        .expect("a user's Secret");
    refused(
        "delete a user's Secret",
        secrets.delete("users-secret", &dp).await,
    );
    match secrets.get("users-secret").await {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("read a user's Secret: want RBAC's 403, got {other:?}"),
    }
    // What the relay really makes, and deletes.
    secrets
        .create(&pp, &mover_pod::secret_manifest(uuid, ns, &key))
        .await
        .expect("the relay creates its mover's Secret");
    for role in [Role::Source, Role::Target] {
        let pod = mover_pod::pod_manifest(&PodPlan {
            role,
            ..plan.clone()
        });
        pods.create(&pp, &pod)
            .await
            .unwrap_or_else(|e| panic!("the relay creates its {} mover: {e}", role.as_str()));
        pods.delete(&mover_pod::pod_name(uuid, role), &dp)
            .await
            .expect("the relay deletes its mover");
    }
    secrets
        .delete(&mover_pod::secret_name(uuid), &dp)
        .await
        .expect("the relay deletes its mover's Secret");
    assert!(
        users.get_opt("users-secret").await.expect("get").is_some(),
        "the user's Secret is gone"
    );
}

/// `allowedMemberNamespaces`: a claim whose member namespace the class does
/// not list is refused before anything is made in the member; a listed one
/// is served.
#[tokio::test]
async fn a_class_lets_claims_land_only_in_the_member_namespaces_it_lists() {
    let _alone = common::alone();
    let Some(env) = e2e_support::env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let host = client(&env.host_kubeconfig).await;
    let member = client(&env.member_kubeconfig).await;
    e2e_support::install_crd(&host).await;
    let d = e2e_support::start_member_relay(&env, "controller", &["--mode", "controller"]).await;
    let c = d.controller();
    let pid = std::process::id();
    let claim_in = |host_ns: &str, name: &str| {
        let mut req = e2e_support::member_create(&env, name, 16 << 20);
        req.parameters.remove("memberNamespace");
        req.parameters.extend([
            (
                "csi.storage.k8s.io/pvc/namespace".to_string(),
                host_ns.to_string(),
            ),
            ("csi.storage.k8s.io/pvc/name".to_string(), name.to_string()),
            (
                "allowedMemberNamespaces".to_string(),
                format!("{}, tenant-*", env.namespace),
            ),
        ]);
        req
    };
    let name = format!("elsewhere-{pid}");
    let err = c
        .clone()
        .create_volume(claim_in("kube-system", &name))
        .await
        .expect_err("a claim of host namespace kube-system");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("\"kube-system\"")
            && err.message().contains("allowedMemberNamespaces"),
        "{err:?}"
    );
    let kube_system: Api<PersistentVolumeClaim> = Api::namespaced(member.clone(), "kube-system");
    assert!(
        kube_system.get_opt(&name).await.expect("get").is_none(),
        "a member claim was made in kube-system"
    );

    let name = format!("listed-{pid}");
    let vol = c
        .clone()
        .create_volume(claim_in(&env.namespace, &name))
        .await
        .expect("a claim of a listed namespace")
        .into_inner()
        .volume
        .expect("volume");
    let listed: Api<PersistentVolumeClaim> = Api::namespaced(member.clone(), &env.namespace);
    assert!(listed.get_opt(&name).await.expect("get").is_some());
    e2e_support::delete_until_ok(&c, &vol.volume_id).await;
}
