//! The charts installed the way Helm users type it, with helm v4.3.1 and
//! v3.18.0, against a real v1.28 API server of the test's own
//! (`tests/e2e-env/cluster-up.sh helm-suite 21443`; no node runs a pod, so
//! every install is judged by the objects the API server holds):
//! - `helm install NAME deploy/` (the release in `default`), a second
//!   release in another namespace with another driver name refused before
//!   anything is applied, `helm upgrade` and `helm rollback` of a value,
//!   `helm uninstall` leaving the CRD only;
//! - `helm install NAME deploy/ -n X --create-namespace`: everything
//!   namespaced in X, the node plugin in its own privileged namespace;
//! - bad values refused by the schema on install, with no release and
//!   nothing applied;
//! - the member chart with `-n X --create-namespace`, its admission policy
//!   holding that namespace's identity, a second member release refused;
//! - a release of chart 0.1.0 (commit e065d19, from git): its upgrade is
//!   refused, and the move docs/operations.md gives works.
//!
//! Needs in `$E2E_HOME/bin`: kube-apiserver, kube-controller-manager,
//! kubectl, helm, helm3; etcd on PATH. Says `skipped: …` otherwise.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::common;
use crate::helm_chart::{objects, repo, run, tool};

const CLUSTER: &str = "helm-suite";
const PORT: &str = "21443";
/// The last commit whose charts are chart 0.1.0's.
const CHART_0_1_0: &str = "e065d19";

/// The test's control plane, stopped and wiped when dropped.
struct ControlPlane {
    home: PathBuf,
    kubeconfig: String,
}

impl ControlPlane {
    fn start(home: &Path) -> Result<ControlPlane, String> {
        let script = repo("tests/e2e-env/cluster-up.sh");
        let cp = ControlPlane {
            home: home.to_path_buf(),
            kubeconfig: home
                .join(format!("run/{CLUSTER}.kubeconfig"))
                .display()
                .to_string(),
        };
        let out = std::process::Command::new(script)
            .args([CLUSTER, PORT])
            .env("E2E_HOME", home)
            .env("KCM_CONTROLLERS", "*,-nodelifecycle")
            .output()
            .map_err(|e| format!("cluster-up.sh: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cluster-up.sh {CLUSTER} {PORT}: {}\n{}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(cp)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let _ = std::process::Command::new(repo("tests/e2e-env/cluster-down.sh"))
            .args([CLUSTER, "--wipe"])
            .env("E2E_HOME", &self.home)
            .output();
    }
}

struct Tools {
    kubectl: PathBuf,
    kubeconfig: String,
}

impl Tools {
    fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["--kubeconfig", self.kubeconfig.as_str()];
        all.extend_from_slice(args);
        run(&self.kubectl, &all)
    }

    fn kubectl_ok(&self, args: &[&str]) -> String {
        self.kubectl(args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The object, or None when the API server has none.
    fn get(&self, kind: &str, ns: Option<&str>, name: &str) -> Option<Value> {
        let mut args = vec!["get", kind, name, "-o", "json"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        match self.kubectl(&args) {
            Ok(text) => Some(serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))),
            Err(e) if e.contains("NotFound") => None,
            Err(e) => panic!("{e}"),
        }
    }

    /// Waits until the object is gone (a namespace's deletion takes the
    /// namespace controller a moment).
    fn gone(&self, kind: &str, ns: Option<&str>, name: &str) {
        let start = Instant::now();
        while self.get(kind, ns, name).is_some() {
            assert!(
                start.elapsed() < Duration::from_secs(90),
                "{kind} {name} still there after 90 s"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    fn helm(&self, helm: &Path, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["--kubeconfig", self.kubeconfig.as_str()];
        all.extend_from_slice(args);
        run(helm, &all)
    }

    fn helm_ok(&self, helm: &Path, args: &[&str]) -> String {
        self.helm(helm, args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Every release, in every namespace, as NAME/NAMESPACE.
    fn releases(&self, helm: &Path) -> Vec<String> {
        // helm 3 lists failed and pending releases only with --all; helm 4
        // lists every status and has no --all.
        let text = self
            .helm(helm, &["list", "-A", "--all", "-o", "json"])
            .or_else(|_| self.helm(helm, &["list", "-A", "-o", "json"]))
            .unwrap_or_else(|e| panic!("{e}"));
        let list: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        let mut out: Vec<String> = list
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                format!(
                    "{}/{}",
                    r["name"].as_str().unwrap_or("?"),
                    r["namespace"].as_str().unwrap_or("?")
                )
            })
            .collect();
        out.sort();
        out
    }

    fn relay_args(&self, ns: &str) -> Vec<String> {
        let d = self
            .get("deployment", Some(ns), "csi-relay-controller")
            .unwrap_or_else(|| panic!("no Deployment {ns}/csi-relay-controller"));
        container_args(&d, "csi-relay")
    }
}

fn container_args(workload: &Value, name: &str) -> Vec<String> {
    workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))["args"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect()
}

#[test]
fn both_helm_majors_install_as_users_type_it_on_a_real_api_server() {
    let _alone = common::alone();
    let mut found = Vec::new();
    for name in [
        "kube-apiserver",
        "kube-controller-manager",
        "kubectl",
        "helm",
        "helm3",
    ] {
        match tool(name) {
            Ok(p) => found.push(p),
            Err(why) => {
                common::skip(&why);
                return;
            }
        }
    }
    if which("etcd").is_none() {
        common::skip("no etcd on PATH (Debian's etcd-server)");
        return;
    }
    let home = found[0]
        .parent()
        .and_then(Path::parent)
        .expect("E2E_HOME")
        .to_path_buf();
    let cp = match ControlPlane::start(&home) {
        Ok(cp) => cp,
        Err(e) => panic!("{e}"),
    };
    let t = Tools {
        kubectl: found[2].clone(),
        kubeconfig: cp.kubeconfig.clone(),
    };
    let old_chart = chart_0_1_0();
    for (helm, major) in [(&found[3], "4"), (&found[4], "3")] {
        let start = Instant::now();
        plain_install_second_release_upgrade_rollback_uninstall(&t, helm, major);
        create_namespace_install(&t, helm, major);
        bad_values_apply_nothing(&t, helm, major);
        member_chart(&t, helm, major);
        match &old_chart {
            Ok(dir) => move_from_chart_0_1_0(&t, helm, major, &dir.path().join("deploy")),
            Err(why) => common::skip(&format!("helm {major}, from chart 0.1.0: {why}")),
        }
        kustomize_install_refuses_helm(&t, helm, major);
        // What the chart leaves by design: the CRD (`delete -k` above took it already).
        t.kubectl_ok(&[
            "delete",
            "crd",
            "relayvolumes.relay.csi.dev",
            "--ignore-not-found",
            "--wait=true",
        ]);
        eprintln!(
            "helm {major}: every invocation above on a real v1.28 API server in {:.1} s",
            start.elapsed().as_secs_f64()
        );
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Chart 0.1.0 (deploy/ at CHART_0_1_0), from this repository's history.
fn chart_0_1_0() -> Result<tempfile::TempDir, String> {
    let dir = tempfile::Builder::new()
        .prefix("relay-chart-0.1.0-")
        .tempdir()
        .map_err(|e| e.to_string())?;
    let archive = std::process::Command::new("git")
        .current_dir(repo("."))
        .args(["archive", "--format=tar", CHART_0_1_0, "deploy"])
        .output()
        .map_err(|e| format!("git archive: {e}"))?;
    if !archive.status.success() {
        return Err(format!(
            "commit {CHART_0_1_0} is not in this clone ({})",
            String::from_utf8_lossy(&archive.stderr).trim()
        ));
    }
    let mut tar = std::process::Command::new("tar")
        .current_dir(dir.path())
        .args(["-x", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("tar: {e}"))?;
    use std::io::Write;
    tar.stdin
        .take()
        .ok_or("tar's stdin")?
        .write_all(&archive.stdout)
        .map_err(|e| e.to_string())?;
    let status = tar.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("tar: {status}"));
    }
    Ok(dir)
}

fn chart(dir: &str) -> String {
    repo(dir).display().to_string()
}

/// `helm install NAME deploy/`, a second release, upgrade, rollback and
/// uninstall.
fn plain_install_second_release_upgrade_rollback_uninstall(t: &Tools, helm: &Path, major: &str) {
    let h = format!("helm {major}");
    let deploy = chart("deploy");
    t.helm_ok(helm, &["install", "relay", &deploy]);
    assert_eq!(t.releases(helm), ["relay/default"], "{h}");
    let args = t.relay_args("default");
    assert!(
        args.contains(&"--leader-election".to_string()),
        "{h}: {args:?}"
    );
    let ds = t
        .get("daemonset", Some("csi-relay-node"), "csi-relay-node")
        .unwrap_or_else(|| panic!("{h}: no node DaemonSet"));
    assert_eq!(ds["metadata"]["namespace"], "csi-relay-node");
    let node_ns = t
        .get("namespace", None, "csi-relay-node")
        .expect("node namespace");
    assert_eq!(
        node_ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "privileged"
    );
    assert!(
        t.get("secret", Some("default"), "csi-relay-members")
            .is_some(),
        "{h}"
    );
    let binding = t
        .get("clusterrolebinding", None, "csi-relay-controller")
        .expect("binding");
    assert_eq!(binding["subjects"][0]["namespace"], "default", "{h}");
    // The API server is v1.28: the resizer runs without the gate that needs 1.32.
    let controller = t
        .get("deployment", Some("default"), "csi-relay-controller")
        .expect("controller");
    let resizer = container_args(&controller, "csi-resizer");
    assert!(
        resizer.contains(&"--feature-gates=RecoverVolumeExpansionFailure=false".to_string()),
        "{h}: {resizer:?}"
    );

    // A second release, in another namespace, for another driver name.
    let e = t
        .helm(
            helm,
            &[
                "install",
                "other",
                &deploy,
                "-n",
                "other",
                "--create-namespace",
                "--set",
                "driverName=other.example.com",
            ],
        )
        .expect_err("a second release");
    assert!(
        e.contains("installed in this cluster already, by release relay in namespace default"),
        "{h}: {e}"
    );
    assert_eq!(t.releases(helm), ["relay/default"], "{h}");
    assert!(
        t.get("csidriver", None, "other.example.com").is_none(),
        "{h}"
    );
    assert!(
        t.get("namespace", None, "other").is_none(),
        "{h}: namespace other made"
    );

    t.helm_ok(
        helm,
        &["upgrade", "relay", &deploy, "--set", "logFormat=json"],
    );
    assert!(
        t.relay_args("default")
            .contains(&"--log-format=json".to_string()),
        "{h}"
    );
    t.helm_ok(helm, &["rollback", "relay", "1"]);
    assert!(
        !t.relay_args("default")
            .iter()
            .any(|a| a.starts_with("--log-format")),
        "{h}"
    );

    t.helm_ok(helm, &["uninstall", "relay", "--wait"]);
    assert!(t.releases(helm).is_empty(), "{h}");
    for (kind, ns, name) in [
        ("deployment", Some("default"), "csi-relay-controller"),
        ("secret", Some("default"), "csi-relay-members"),
        ("clusterrole", None, "csi-relay-controller"),
        ("csidriver", None, "relay.csi.dev"),
        ("storageclass", None, "relay-member1"),
    ] {
        assert!(t.get(kind, ns, name).is_none(), "{h}: {kind} {name} left");
    }
    t.gone("namespace", None, "csi-relay-node");
    assert!(
        t.get("crd", None, "relayvolumes.relay.csi.dev").is_some(),
        "{h}: the CRD stays"
    );
}

/// `helm install NAME deploy/ -n X --create-namespace`.
fn create_namespace_install(t: &Tools, helm: &Path, major: &str) {
    let h = format!("helm {major}");
    let ns = format!("storage-{major}");
    t.helm_ok(
        helm,
        &[
            "install",
            "relay",
            &chart("deploy"),
            "-n",
            &ns,
            "--create-namespace",
        ],
    );
    assert_eq!(t.releases(helm), [format!("relay/{ns}")], "{h}");
    let rendered = objects(&t.helm_ok(helm, &["get", "manifest", "relay", "-n", &ns]));
    let mut namespaced = 0;
    for (key, obj) in &rendered {
        let Some(in_ns) = obj["metadata"]["namespace"].as_str() else {
            continue;
        };
        namespaced += 1;
        let want = if key.contains("/csi-relay-node/") {
            "csi-relay-node"
        } else {
            ns.as_str()
        };
        assert_eq!(in_ns, want, "{h}: {key}");
        let kind = obj["kind"].as_str().unwrap_or("?").to_lowercase();
        let name = obj["metadata"]["name"].as_str().unwrap_or("?");
        assert!(
            t.get(&kind, Some(in_ns), name).is_some(),
            "{h}: {key} not on the API server"
        );
    }
    assert!(namespaced >= 8, "{h}: {namespaced} namespaced objects");
    assert!(
        t.get("role", Some(&ns), "csi-relay-controller-leases")
            .is_some(),
        "{h}"
    );
    t.helm_ok(helm, &["uninstall", "relay", "-n", &ns, "--wait"]);
    t.gone("namespace", None, "csi-relay-node");
    // The release's namespace is helm's, not the chart's: it stays.
    assert!(t.get("namespace", None, &ns).is_some(), "{h}");
    t.kubectl_ok(&["delete", "namespace", &ns, "--wait=false"]);
}

/// Values the schema refuses, on install against the API server: no
/// release, no namespace, no object.
fn bad_values_apply_nothing(t: &Tools, helm: &Path, major: &str) {
    let h = format!("helm {major}");
    for (set, names) in [
        ("driverName=Bad_Driver", "driverName"),
        ("controller.replicas=-1", "replicas"),
        ("node.kubeletDir=relative/path", "kubeletDir"),
    ] {
        let e = t
            .helm(
                helm,
                &[
                    "install",
                    "bad",
                    &chart("deploy"),
                    "-n",
                    "bad",
                    "--create-namespace",
                    "--set",
                    set,
                ],
            )
            .expect_err(set);
        assert!(
            e.contains("schema") && e.contains(names),
            "{h} --set {set}: {e}"
        );
        assert!(t.releases(helm).is_empty(), "{h} --set {set}");
        assert!(
            t.get("namespace", None, "bad").is_none(),
            "{h} --set {set}: namespace made"
        );
        assert!(
            t.get("clusterrole", None, "csi-relay-controller").is_none(),
            "{h} --set {set}"
        );
    }
}

/// The member chart in a namespace of its own.
fn member_chart(t: &Tools, helm: &Path, major: &str) {
    let h = format!("helm {major}");
    let ns = format!("relay-member-{major}");
    let member = chart("deploy/member");
    t.helm_ok(
        helm,
        &[
            "install",
            "relay-member",
            &member,
            "-n",
            &ns,
            "--create-namespace",
            "--set",
            "admission=v1beta1,sharedStorage.enabled=true",
        ],
    );
    assert!(
        t.get("serviceaccount", Some(&ns), "csi-relay-member")
            .is_some(),
        "{h}"
    );
    let binding = t
        .get("clusterrolebinding", None, "csi-relay-member")
        .expect("binding");
    assert_eq!(binding["subjects"][0]["namespace"], ns.as_str(), "{h}");
    let policy = t
        .get(
            "validatingadmissionpolicies.v1beta1.admissionregistration.k8s.io",
            None,
            "csi-relay-member",
        )
        .expect("the admission policy");
    assert_eq!(
        policy["spec"]["matchConditions"][0]["expression"],
        format!("request.userInfo.username == 'system:serviceaccount:{ns}:csi-relay-member'"),
        "{h}"
    );
    let e = t
        .helm(
            helm,
            &[
                "install",
                "member-two",
                &member,
                "-n",
                "default",
                "--set",
                "admission=v1beta1",
            ],
        )
        .expect_err("a second member release");
    assert!(
        e.contains(&format!("by release relay-member in namespace {ns}")),
        "{h}: {e}"
    );
    t.helm_ok(helm, &["uninstall", "relay-member", "-n", &ns, "--wait"]);
    assert!(
        t.get("clusterrole", None, "csi-relay-member").is_none(),
        "{h}"
    );
    t.kubectl_ok(&["delete", "namespace", &ns, "--wait=false"]);
}

/// A release of chart 0.1.0: the upgrade is refused with nothing changed,
/// and the move docs/operations.md gives works.
fn move_from_chart_0_1_0(t: &Tools, helm: &Path, major: &str, old: &Path) {
    let h = format!("helm {major}");
    t.helm_ok(helm, &["install", "relay", old.to_str().expect("path")]);
    assert!(
        t.get("deployment", Some("csi-relay"), "csi-relay-controller")
            .is_some(),
        "{h}"
    );
    let e = t
        .helm(helm, &["upgrade", "relay", &chart("deploy")])
        .expect_err("an upgrade from chart 0.1.0");
    assert!(e.contains("was made by chart 0.1.0"), "{h}: {e}");
    assert!(
        e.contains("helm uninstall relay -n default --wait"),
        "{h}: {e}"
    );
    assert!(t.get("namespace", None, "csi-relay").is_some(), "{h}");
    assert!(
        t.get("deployment", Some("csi-relay"), "csi-relay-controller")
            .is_some(),
        "{h}"
    );
    let history = t.helm_ok(helm, &["history", "relay", "-o", "json"]);
    let revisions: Value = serde_json::from_str(&history).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        revisions.as_array().map(Vec::len),
        Some(1),
        "{h}: {history}"
    );
    // The move the refusal names.
    t.helm_ok(helm, &["uninstall", "relay", "--wait"]);
    t.gone("namespace", None, "csi-relay");
    t.gone("namespace", None, "csi-relay-node");
    t.helm_ok(
        helm,
        &[
            "install",
            "relay",
            &chart("deploy"),
            "-n",
            "csi-relay",
            "--create-namespace",
        ],
    );
    assert_eq!(t.releases(helm), ["relay/csi-relay"], "{h}");
    assert!(
        t.relay_args("csi-relay")
            .contains(&"--leader-election".to_string()),
        "{h}"
    );
    t.helm_ok(helm, &["uninstall", "relay", "-n", "csi-relay", "--wait"]);
    t.gone("namespace", None, "csi-relay-node");
    t.kubectl_ok(&["delete", "namespace", "csi-relay", "--wait=false"]);
    t.gone("namespace", None, "csi-relay");

    // The member chart of 0.1.0 owned namespace csi-relay too.
    let old_member = old.join("member");
    let old_member = old_member.to_str().expect("path");
    let v1beta1 = ["--set", "admission=v1beta1"];
    let mut install = vec!["install", "relay-member", old_member];
    install.extend(v1beta1);
    t.helm_ok(helm, &install);
    let member = chart("deploy/member");
    let mut upgrade = vec!["upgrade", "relay-member", member.as_str()];
    upgrade.extend(v1beta1);
    let e = t
        .helm(helm, &upgrade)
        .expect_err("a member upgrade from chart 0.1.0");
    assert!(e.contains("was made by chart 0.1.0"), "{h}: {e}");
    assert!(
        t.get("serviceaccount", Some("csi-relay"), "csi-relay-member")
            .is_some(),
        "{h}: the refused upgrade changed the member identity"
    );
    t.helm_ok(helm, &["uninstall", "relay-member", "--wait"]);
    t.gone("namespace", None, "csi-relay");
}

/// An install made with `kubectl apply -k deploy/` holds the cluster: a helm
/// release is refused, naming it, and nothing of the release is made.
fn kustomize_install_refuses_helm(t: &Tools, helm: &Path, major: &str) {
    let h = format!("helm {major}");
    let base = chart("deploy");
    t.kubectl_ok(&["apply", "-k", &base]);
    let e = t
        .helm(
            helm,
            &[
                "install",
                "relay",
                &base,
                "-n",
                "other",
                "--create-namespace",
            ],
        )
        .expect_err("a release beside a kubectl apply -k install");
    assert!(e.contains("not by helm"), "{h}: {e}");
    assert!(t.releases(helm).is_empty(), "{h}");
    assert!(
        t.get("namespace", None, "other").is_none(),
        "{h}: namespace other made"
    );
    t.kubectl_ok(&["delete", "-k", &base, "--wait=true"]);
    t.gone("namespace", None, "csi-relay");
    t.gone("namespace", None, "csi-relay-node");
}
