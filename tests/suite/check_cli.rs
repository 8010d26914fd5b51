//! `csi-relay check`'s own failure paths (its findings on a real install
//! are tests/deploy-kit/check.sh's and kosmos_e2e's): clusters that do not
//! answer make exit status 2 with a line saying why, and an identity
//! without the rights the matrix gives it is named with each right it
//! lacks.

use std::process::Command;

use serde_json::Value;

use crate::common;
use crate::e2e_support;

/// Runs `csi-relay check --output json ARGS`: its exit status and report.
fn check(args: &[&str]) -> (i32, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_csi-relay"))
        .args(["check", "--output", "json"])
        .args(args)
        .output()
        .expect("run csi-relay check");
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "check's JSON report: {e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), report)
}

fn findings<'a>(report: &'a Value, kind: &str, subject: &str) -> Vec<&'a Value> {
    report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["kind"] == kind && f["subject"] == subject)
        .collect()
}

#[test]
fn clusters_that_do_not_answer_are_exit_2_with_the_reason_on_each_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A port nothing listens on: every request is refused at once.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let kubeconfig = dir.path().join("nowhere");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{closed}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n"
        ),
    )
    .expect("kubeconfig");
    let kc = kubeconfig.display().to_string();
    let missing = dir.path().join("no-such-file").display().to_string();
    let (code, report) = check(&[
        "--host-kubeconfig",
        &kc,
        "--member",
        &format!("east={kc}"),
        "--member",
        &format!("west={missing}"),
    ]);
    assert_eq!(code, 2, "{report}");
    assert!(report["unchecked"].as_u64().unwrap_or(0) >= 5, "{report}");
    for (kind, subject) in [
        ("crd", "relayvolumes.relay.csi.dev"),
        ("access", "host cluster"),
        ("access", "member cluster east"),
        ("class", "host cluster"),
        ("node", "host cluster"),
        ("volume", "host cluster"),
    ] {
        let lines = findings(&report, kind, subject);
        assert!(
            lines.iter().any(|f| f["status"] == "unchecked"
                && f["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("unreachable"))),
            "{kind} {subject}: {lines:?}"
        );
    }
    let west = findings(&report, "access", "member cluster west");
    assert!(
        west.iter().any(|f| f["status"] == "unchecked"
            && f["message"]
                .as_str()
                .is_some_and(|m| m.contains("no-such-file"))),
        "{west:?}"
    );
}

#[tokio::test]
async fn an_identity_without_its_rights_is_named_with_each_right_it_lacks() {
    let _alone = common::alone();
    let Some(env) = e2e_support::env() else {
        return common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
    };
    // The node plugins' member identity holds none of the controller's.
    let Ok(node_identity) = std::env::var("RELAY_E2E_MEMBER_RELAY_NODE_KUBECONFIG") else {
        return common::skip(
            "no RELAY_E2E_MEMBER_RELAY_NODE_KUBECONFIG (tests/e2e-env/env-up.sh makes it)",
        );
    };
    let host = e2e_support::client(&env.host_kubeconfig).await;
    e2e_support::install_crd(&host).await;
    let (code, report) = check(&[
        "--host-kubeconfig",
        &env.host_kubeconfig,
        "--member",
        &format!("e2e={node_identity}"),
    ]);
    assert_eq!(code, 1, "{report}");
    let member = findings(&report, "access", "member cluster e2e");
    let lacks = member
        .iter()
        .find(|f| f["status"] == "problem")
        .and_then(|f| f["message"].as_str())
        .unwrap_or_else(|| panic!("no access problem for the member: {member:?}"));
    assert!(
        lacks.contains("right(s) csi-relay-member needs")
            && lacks.contains("create persistentvolumeclaims.core")
            && lacks.contains("delete volumeattachments.storage.k8s.io"),
        "{lacks}"
    );
    eprintln!("check: {}", &lacks[..lacks.len().min(200)]);
}

/// `kubectl --kubeconfig KC ARGS` with `stdin`; panics with its output on failure.
fn kubectl(kubeconfig: &str, args: &[&str], stdin: &str) {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl");
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes()).expect("kubectl stdin");
    }
    let out = child.wait_with_output().expect("kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn rights_beyond_the_matrix_anywhere_are_named_with_their_binding() {
    let _alone = common::alone();
    let Some(env) = e2e_support::env() else {
        return common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
    };
    let Ok(relay) = std::env::var("RELAY_E2E_MEMBER_RELAY_KUBECONFIG") else {
        return common::skip(
            "no RELAY_E2E_MEMBER_RELAY_KUBECONFIG (tests/e2e-env/env-up.sh makes it)",
        );
    };
    let host = e2e_support::client(&env.host_kubeconfig).await;
    e2e_support::install_crd(&host).await;
    let member_access = |report: &Value| -> Vec<String> {
        findings(report, "access", "member cluster e2e")
            .iter()
            .filter(|f| f["status"] == "problem")
            .map(|f| format!("{} | fix: {}", f["message"], f["fix"]))
            .collect()
    };
    let args = [
        "--host-kubeconfig",
        &env.host_kubeconfig,
        "--member",
        &format!("e2e={relay}"),
    ];
    let (_, report) = check(&args);
    assert_eq!(
        member_access(&report),
        Vec::<String>::new(),
        "the kit's identity as installed"
    );

    // An extra RoleBinding outside csi-relay's namespace, and an extra
    // ClusterRoleBinding: neither is in the matrix.
    let tag = format!("check-extra-{}", std::process::id());
    let extra = format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: {tag}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: secrets, namespace: {tag}}}
rules: [{{apiGroups: [""], resources: [secrets], verbs: [get]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: extra-secrets, namespace: {tag}}}
subjects: [{{kind: ServiceAccount, name: csi-relay-member, namespace: csi-relay}}]
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: secrets}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {{name: {tag}}}
rules: [{{apiGroups: [""], resources: [configmaps], verbs: [list]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {{name: {tag}}}
subjects: [{{kind: ServiceAccount, name: csi-relay-member, namespace: csi-relay}}]
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {tag}}}
"#
    );
    kubectl(&env.member_kubeconfig, &["apply", "-f", "-"], &extra);
    let (code, report) = check(&args);
    kubectl(
        &env.member_kubeconfig,
        &["delete", "--wait=false", "-f", "-"],
        &extra,
    );
    assert_eq!(code, 1, "{report}");
    let problems = member_access(&report);
    assert_eq!(problems.len(), 2, "{problems:#?}");
    let everywhere = problems
        .iter()
        .find(|p| p.contains("in every namespace"))
        .unwrap_or_else(|| panic!("{problems:#?}"));
    assert!(
        everywhere.contains("list configmaps.core")
            && everywhere.contains(&format!("granted by ClusterRoleBinding {tag} (ClusterRole {tag}, binds ServiceAccount csi-relay/csi-relay-member)"))
            && everywhere.contains(&format!("kubectl delete clusterrolebinding {tag}")),
        "{everywhere}"
    );
    let namespaced = problems
        .iter()
        .find(|p| p.contains(&format!("in namespace {tag}")))
        .unwrap_or_else(|| panic!("{problems:#?}"));
    assert!(
        namespaced.contains(&format!("get secrets.core in {tag}"))
            && namespaced.contains(&format!(
                "granted by RoleBinding {tag}/extra-secrets (Role secrets"
            ))
            && !namespaced.contains("configmaps"),
        "{namespaced}"
    );
    eprintln!("check: {everywhere}\ncheck: {namespaced}");
}
