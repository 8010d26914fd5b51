//! The Helm charts (`deploy/` for the host, `deploy/member/` for each
//! member) with the real helm, v4 and v3: `helm lint --strict`; with default
//! values they render, object by object, what `kubectl kustomize` renders
//! of the Kustomize base they read; each value changes what it names and
//! nothing else; bad values are refused with the value named. And the
//! newest kustomize (kubectl v1.37.1, kustomize v5.8.1) renders `deploy/`
//! and the member overlays exactly as v1.28's does.
//!
//! Needs in `$E2E_HOME/bin` (default `/opt/csi-relay-e2e`, see
//! tests/e2e-env/README.md): `helm` (v4), `helm3` (v3), `kubectl` (v1.28)
//! and `kubectl-1.37`; says `skipped: …` without them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use csi_relay::app::cli::Cli;
use serde_json::Value;

use crate::common;

pub(crate) fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `$E2E_HOME/bin/<name>`, or why it is not there.
pub(crate) fn tool(name: &str) -> Result<PathBuf, String> {
    let home = std::env::var("E2E_HOME").unwrap_or_else(|_| "/opt/csi-relay-e2e".into());
    let path = Path::new(&home).join("bin").join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "no {} (tests/e2e-env/README.md names it and its source)",
            path.display()
        ))
    }
}

/// The tools, or a skip naming the first missing one.
fn tools<const N: usize>(names: [&str; N]) -> Option<[PathBuf; N]> {
    let mut found = Vec::with_capacity(N);
    for name in names {
        match tool(name) {
            Ok(p) => found.push(p),
            Err(why) => {
                common::skip(&why);
                return None;
            }
        }
    }
    found.try_into().ok()
}

/// Runs `bin args`: its stdout, or its stderr and stdout as the error
/// (`helm lint` says what failed on stdout).
pub(crate) fn run(bin: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(bin)
        .args(args)
        // helm keeps a cache and config; none of the user's is read.
        .env(
            "HELM_CACHE_HOME",
            std::env::temp_dir().join("relay-helm-cache"),
        )
        .env(
            "HELM_CONFIG_HOME",
            std::env::temp_dir().join("relay-helm-config"),
        )
        .env(
            "HELM_DATA_HOME",
            std::env::temp_dir().join("relay-helm-data"),
        )
        .output()
        .map_err(|e| format!("run {}: {e}", bin.display()))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{} {}: {}\n{}{}",
            bin.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ))
    }
}

fn ok(bin: &Path, args: &[&str]) -> String {
    run(bin, args).unwrap_or_else(|e| panic!("{e}"))
}

/// The objects of a multi-document YAML stream, by kind, namespace and name.
pub(crate) fn objects(yaml: &str) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let mut doc = String::new();
    for line in yaml.lines().chain(std::iter::once("---")) {
        if line.trim_end() == "---" {
            if doc
                .lines()
                .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
            {
                let value: Value = serde_saphyr::from_str(&doc)
                    .unwrap_or_else(|e| panic!("unparsable document: {e}\n{doc}"));
                let key = format!(
                    "{}/{}/{}",
                    value["kind"].as_str().unwrap_or("?"),
                    value["metadata"]["namespace"].as_str().unwrap_or(""),
                    value["metadata"]["name"].as_str().unwrap_or("?")
                );
                assert!(out.insert(key.clone(), value).is_none(), "{key} twice");
            }
            doc.clear();
        } else {
            doc.push_str(line);
            doc.push('\n');
        }
    }
    out
}

/// Where `got` and `want` first differ (a JSON path and both values);
/// numbers are compared by value (helm passes crds/ as written, `0.0`;
/// kustomize writes the same number as `0`).
fn difference(path: &str, got: &Value, want: &Value) -> Option<String> {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            let keys: std::collections::BTreeSet<_> = g.keys().chain(w.keys()).collect();
            keys.into_iter().find_map(|k| {
                difference(
                    &format!("{path}.{k}"),
                    g.get(k).unwrap_or(&Value::Null),
                    w.get(k).unwrap_or(&Value::Null),
                )
            })
        }
        (Value::Array(g), Value::Array(w)) if g.len() == w.len() => g
            .iter()
            .zip(w)
            .enumerate()
            .find_map(|(i, (g, w))| difference(&format!("{path}[{i}]"), g, w)),
        (Value::Number(g), Value::Number(w)) if g.as_f64() == w.as_f64() => None,
        (g, w) if g == w => None,
        (g, w) => Some(format!("{path}: got {g}, want {w}")),
    }
}

/// Asserts two renders hold the same objects, naming the first difference.
fn assert_same(what: &str, got: &BTreeMap<String, Value>, want: &BTreeMap<String, Value>) {
    let got_keys: Vec<_> = got.keys().collect();
    let want_keys: Vec<_> = want.keys().collect();
    assert_eq!(got_keys, want_keys, "{what}: not the same objects");
    for (key, value) in want {
        if let Some(d) = difference("", &got[key], value) {
            panic!("{what}: {key} differs at {d}");
        }
    }
}

/// A Kustomize overlay of deploy/member with `components`, in a temp dir.
fn member_overlay(components: &[&str]) -> tempfile::TempDir {
    overlay("deploy/member", components)
}

/// A Kustomize overlay of `base` (a folder of the repository) with
/// `components` (folders of `base`), in a temp dir.
fn overlay(base: &str, components: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("relay-overlay-")
        .tempdir()
        .expect("temp dir");
    // kustomize takes relative paths only: from the overlay up to / and
    // down to the base.
    let up = "../".repeat(dir.path().components().count() - 1);
    let member = PathBuf::from(format!(
        "{up}{}",
        repo(base).display().to_string().trim_start_matches('/')
    ));
    let mut text = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [{}]\n",
        member.display()
    );
    if !components.is_empty() {
        text.push_str("components:\n");
        for c in components {
            text.push_str(&format!("  - {}\n", member.join(c).display()));
        }
    }
    std::fs::write(dir.path().join("kustomization.yaml"), text).expect("overlay");
    dir
}

/// `helm template` into the Kustomize base's namespace, csi-relay (`-n`
/// in `args` wins).
fn helm_template(helm: &Path, chart: &str, args: &[&str]) -> Result<String, String> {
    let chart = repo(chart);
    let mut all = vec![
        "template",
        "relay",
        chart.to_str().expect("utf-8 path"),
        "--include-crds",
        "--skip-tests",
    ];
    if !args.contains(&"-n") {
        all.extend_from_slice(&["-n", "csi-relay"]);
    }
    all.extend_from_slice(args);
    run(helm, &all)
}

/// What `kubectl kustomize` renders of `dir`, less the Namespace csi-relay:
/// there the release's namespace, which helm makes or finds, never the chart.
fn kustomize_less_release_namespace(kubectl: &Path, dir: &Path) -> BTreeMap<String, Value> {
    let mut base = objects(&ok(kubectl, &["kustomize", dir.to_str().unwrap()]));
    assert!(
        base.remove("Namespace//csi-relay").is_some(),
        "{}: no Namespace csi-relay",
        dir.display()
    );
    base
}

#[test]
fn both_charts_pass_helm_lint_strict_with_both_helm_majors() {
    let Some([helm4, helm3]) = tools(["helm", "helm3"]) else {
        return;
    };
    let values = write_values(EVERY_VALUE);
    for helm in [&helm4, &helm3] {
        for chart in ["deploy", "deploy/member"] {
            let out = ok(helm, &["lint", "--strict", repo(chart).to_str().unwrap()]);
            assert!(out.contains("0 chart(s) failed"), "{out}");
        }
        let out = ok(
            helm,
            &[
                "lint",
                "--strict",
                repo("deploy").to_str().unwrap(),
                "-f",
                values.path().to_str().unwrap(),
            ],
        );
        assert!(out.contains("0 chart(s) failed"), "{out}");
    }
}

#[test]
fn with_default_values_each_chart_renders_the_kustomize_base() {
    let Some([helm4, helm3, kubectl]) = tools(["helm", "helm3", "kubectl"]) else {
        return;
    };
    let base = kustomize_less_release_namespace(&kubectl, &repo("deploy"));
    assert!(base.len() >= 15, "{} objects", base.len());
    let member_cases: [(&[&str], &[&str]); 6] = [
        (&[], &["admission"]),
        (&["--set", "admission=v1beta1"], &["admission-v1beta1"]),
        (&["--set", "admission=none"], &[]),
        (
            &["--set", "nodeSecrets.enabled=true"],
            &["admission", "node-secrets"],
        ),
        (
            &["--set", "sharedStorage.enabled=true"],
            &["admission", "shared-storage"],
        ),
        (
            &["--set", "mobility.enabled=true"],
            &["admission", "mobility"],
        ),
    ];
    for helm in [&helm4, &helm3] {
        let chart = objects(&helm_template(helm, "deploy", &[]).unwrap_or_else(|e| panic!("{e}")));
        assert_same(&format!("{} deploy/", helm.display()), &chart, &base);
        for (set, components) in member_cases {
            let overlay = member_overlay(components);
            let want = kustomize_less_release_namespace(&kubectl, overlay.path());
            let got = objects(
                &helm_template(helm, "deploy/member", set).unwrap_or_else(|e| panic!("{e}")),
            );
            assert_same(
                &format!(
                    "{} deploy/member {set:?} against components {components:?}",
                    helm.display()
                ),
                &got,
                &want,
            );
        }
    }
}

/// Every object's namespace, and every binding subject's, by key.
fn namespaces_of(objs: &BTreeMap<String, Value>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for (key, obj) in objs {
        if let Some(ns) = obj["metadata"]["namespace"].as_str() {
            out.insert(key.clone(), ns.to_string());
        }
        for s in obj["subjects"].as_array().into_iter().flatten() {
            if let Some(ns) = s["namespace"].as_str() {
                out.insert(format!("{key} subject {}", s["name"]), ns.to_string());
            }
        }
    }
    out
}

#[test]
fn the_release_namespace_holds_the_controller_and_node_namespace_the_node_plugin() {
    let Some([helm4, helm3]) = tools(["helm", "helm3"]) else {
        return;
    };
    for helm in [&helm4, &helm3] {
        let h = helm.display();
        let got = objects(&helm_template(helm, "deploy", &["-n", "storage"]).unwrap());
        let namespaces: Vec<&String> = got.keys().filter(|k| k.starts_with("Namespace/")).collect();
        assert_eq!(namespaces, ["Namespace//csi-relay-node"], "{h}");
        assert_eq!(
            got["Namespace//csi-relay-node"]["metadata"]["labels"]
                ["pod-security.kubernetes.io/enforce"],
            "privileged"
        );
        let placed = namespaces_of(&got);
        assert!(placed.len() >= 10, "{h}: {placed:?}");
        for (what, ns) in &placed {
            let node = what.contains("csi-relay-node") && !what.contains("csi-relay-controller");
            let want = if node { "csi-relay-node" } else { "storage" };
            assert_eq!(ns, want, "{h}: {what}");
        }
        assert!(placed.contains_key("DaemonSet/csi-relay-node/csi-relay-node"));
        assert!(placed.contains_key("Deployment/storage/csi-relay-controller"));
        assert!(placed.contains_key("Secret/storage/csi-relay-members"));
        let check = objects(&ok(
            helm,
            &[
                "template",
                "relay",
                repo("deploy").to_str().unwrap(),
                "-n",
                "storage",
                "--show-only",
                "templates/tests/check.yaml",
            ],
        ));
        assert_eq!(
            check.keys().collect::<Vec<_>>(),
            ["Pod/storage/relay-check"]
        );

        // The node plugin in the release's namespace: no namespace made.
        let one = objects(
            &helm_template(
                helm,
                "deploy",
                &["-n", "storage", "--set", "node.namespace=storage"],
            )
            .unwrap(),
        );
        assert!(!one.keys().any(|k| k.starts_with("Namespace/")), "{h}");
        assert!(one.contains_key("DaemonSet/storage/csi-relay-node"), "{h}");
        // A node namespace that exists already.
        let kept = objects(
            &helm_template(helm, "deploy", &["--set", "node.createNamespace=false"]).unwrap(),
        );
        assert!(!kept.keys().any(|k| k.starts_with("Namespace/")), "{h}");
        assert!(
            kept.contains_key("DaemonSet/csi-relay-node/csi-relay-node"),
            "{h}"
        );

        // The member chart: its identity in the release's namespace, and the
        // admission policy holds that identity, whichever API version.
        for admission in ["v1", "v1beta1"] {
            let set = format!(
                "admission={admission},nodeSecrets.enabled=true,sharedStorage.enabled=true,mobility.enabled=true"
            );
            let m = objects(
                &helm_template(
                    helm,
                    "deploy/member",
                    &["-n", "relay-system", "--set", &set],
                )
                .unwrap(),
            );
            assert!(!m.keys().any(|k| k.starts_with("Namespace/")), "{h}");
            for (what, ns) in namespaces_of(&m) {
                let want = if what.starts_with("Role") && !what.contains("subject") {
                    "csi-relay-node-secrets"
                } else {
                    "relay-system"
                };
                assert_eq!(ns, want, "{h} {admission}: {what}");
            }
            assert!(m.contains_key("ServiceAccount/relay-system/csi-relay-member"));
            let policy = m
                .iter()
                .find(|(k, _)| k.starts_with("ValidatingAdmissionPolicy/"))
                .map(|(_, v)| v)
                .expect("the policy");
            let condition = policy["spec"]["matchConditions"][0]["expression"]
                .as_str()
                .unwrap();
            assert_eq!(
                condition,
                "request.userInfo.username == 'system:serviceaccount:relay-system:csi-relay-member'",
                "{h} {admission}"
            );
        }
    }
}

/// The csi-resizer container's args in a render.
fn resizer_args(objs: &BTreeMap<String, Value>) -> Vec<String> {
    args(container(
        &objs["Deployment/csi-relay/csi-relay-controller"],
        "csi-resizer",
    ))
}

#[test]
fn sidecar_gates_fit_the_clusters_kubernetes_version() {
    let Some([helm4, helm3, kubectl]) = tools(["helm", "helm3", "kubectl"]) else {
        return;
    };
    let older = overlay("deploy", &["kubernetes-1.28-1.31"]);
    let for_older = kustomize_less_release_namespace(&kubectl, older.path());
    let base = kustomize_less_release_namespace(&kubectl, &repo("deploy"));
    let gate = "--feature-gates=RecoverVolumeExpansionFailure=false".to_string();
    assert!(resizer_args(&for_older).contains(&gate));
    assert!(!resizer_args(&base)
        .iter()
        .any(|a| a.contains("RecoverVolumeExpansionFailure")));
    for helm in [&helm4, &helm3] {
        let h = helm.display();
        for version in ["1.28.0", "1.29.3", "1.31.9"] {
            let got =
                objects(&helm_template(helm, "deploy", &["--kube-version", version]).unwrap());
            assert_same(&format!("{h} for Kubernetes {version}"), &got, &for_older);
        }
        for version in ["1.32.0", "1.34.1"] {
            let got =
                objects(&helm_template(helm, "deploy", &["--kube-version", version]).unwrap());
            assert_same(&format!("{h} for Kubernetes {version}"), &got, &base);
        }
        // sidecars.featureGates wins, and joins a sidecar's own gates flag.
        let set = "sidecars.featureGates.csi-resizer.RecoverVolumeExpansionFailure=true,sidecars.featureGates.csi-provisioner.CrossNamespaceVolumeDataSource=false";
        let got = objects(
            &helm_template(helm, "deploy", &["--kube-version", "1.28.0", "--set", set]).unwrap(),
        );
        let a = resizer_args(&got);
        assert!(
            a.contains(&"--feature-gates=RecoverVolumeExpansionFailure=true".to_string()),
            "{h}: {a:?}"
        );
        assert_eq!(
            a.iter()
                .filter(|x| x.starts_with("--feature-gates"))
                .count(),
            1,
            "{h}: {a:?}"
        );
        let p = args(container(
            &got["Deployment/csi-relay/csi-relay-controller"],
            "csi-provisioner",
        ));
        assert!(
            p.contains(
                &"--feature-gates=Topology=true,CrossNamespaceVolumeDataSource=false".to_string()
            ),
            "{h}: {p:?}"
        );
    }
}

const EVERY_VALUE: &str = r#"
driverName: relay.example.com
members: [east, west]
membersSecret:
  kubeconfigs: { east: "apiVersion: v1\nkind: Config\n" }
logFormat: json
images: { csi-relay: "registry.example.com/csi-relay:0.2.0", csi-provisioner: "mirror.example.com/csi-provisioner:v6.3.0" }
imagePullSecrets: [{ name: pull }]
imagePullPolicy: Always
healthAddress: 127.0.0.1
controller:
  replicas: 3
  virtualNodeRegistrar: false
  resources: { requests: { cpu: 50m, memory: 64Mi } }
  nodeSelector: { role: control }
  tolerations: [{ key: control, operator: Exists, effect: NoSchedule }]
  extraArgs: ["--lost-member=south"]
  extraEnv: [{ name: HTTPS_PROXY, value: "http://127.0.0.1:3128" }]
node:
  member: ""
  resources: { limits: { memory: 256Mi } }
  tolerations: [{ key: storage, operator: Exists }]
  affinity: { nodeAffinity: { requiredDuringSchedulingIgnoredDuringExecution: { nodeSelectorTerms: [{ matchExpressions: [{ key: storage, operator: Exists }] }] } } }
  kubeletDir: /var/lib/k0s/kubelet/
  stateDir: /srv/csi-relay
  extraEnv: [{ name: TZ, value: UTC }]
  extraVolumes: [{ name: disk, hostPath: { path: /srv/disk, type: Directory } }]
  extraVolumeMounts: [{ name: disk, mountPath: /srv/disk }]
sidecars:
  resources: { requests: { cpu: 10m } }
exampleStorageClasses: false
storageClasses:
  - name: fast-east
    parameters: { member: east, memberStorageClass: fast }
  - name: west-now
    volumeBindingMode: Immediate
    allowVolumeExpansion: false
    parameters: { member: west, memberStorageClass: standard }
monitoring: { enabled: true }
"#;

fn write_values(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::Builder::new()
        .prefix("relay-values-")
        .suffix(".yaml")
        .tempfile()
        .expect("values file");
    std::fs::write(file.path(), text).expect("write values");
    file
}

fn container<'a>(obj: &'a Value, name: &str) -> &'a Value {
    obj["spec"]["template"]["spec"]["containers"]
        .as_array()
        .expect("containers")
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn args(c: &Value) -> Vec<String> {
    c["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("string arg").to_string())
        .collect()
}

/// `csi-relay <args>` as the binary parses them, with $(NODE_NAME) set.
fn parses(args: &[String]) {
    let argv = std::iter::once("csi-relay".to_string()).chain(args.iter().map(|a| {
        a.replace("$(NODE_NAME)", "node-1")
            .replace("$(POD_NAMESPACE)", "ns")
    }));
    if let Err(e) = Cli::try_parse_from(argv) {
        panic!("csi-relay {args:?}: {e}");
    }
}

#[test]
fn each_value_changes_what_it_names_and_the_flags_parse() {
    let Some([helm4, helm3]) = tools(["helm", "helm3"]) else {
        return;
    };
    let values = write_values(EVERY_VALUE);
    let f = values.path().to_str().unwrap();
    for helm in [&helm4, &helm3] {
        let plain = objects(&helm_template(helm, "deploy", &[]).unwrap());
        let all = objects(&helm_template(helm, "deploy", &["-f", f]).unwrap());

        let driver = &all["CSIDriver//relay.example.com"];
        assert_eq!(driver["spec"], plain["CSIDriver//relay.csi.dev"]["spec"]);

        let ctl = &all["Deployment/csi-relay/csi-relay-controller"];
        assert_eq!(ctl["spec"]["replicas"], 3);
        let pod = &ctl["spec"]["template"]["spec"];
        assert_eq!(pod["nodeSelector"]["role"], "control");
        assert_eq!(pod["tolerations"][0]["key"], "control");
        assert_eq!(pod["imagePullSecrets"][0]["name"], "pull");
        let relay = container(ctl, "csi-relay");
        assert_eq!(relay["image"], "registry.example.com/csi-relay:0.2.0");
        assert_eq!(relay["resources"]["requests"]["memory"], "64Mi");
        let a = args(relay);
        assert!(
            a.contains(&"--member=east=/etc/csi-relay/members/east".into()),
            "{a:?}"
        );
        assert!(
            a.contains(&"--member=west=/etc/csi-relay/members/west".into()),
            "{a:?}"
        );
        assert!(!a.iter().any(|x| x.contains("member1")), "{a:?}");
        assert!(!a.contains(&"--virtual-node-registrar".into()), "{a:?}");
        for flag in [
            "--driver-name=relay.example.com",
            "--log-format=json",
            "--lost-member=south",
            "--leader-election",
        ] {
            assert!(a.contains(&flag.to_string()), "{flag} not in {a:?}");
        }
        parses(&a);
        assert_eq!(relay["imagePullPolicy"], "Always");
        assert_eq!(relay["livenessProbe"]["httpGet"]["host"], "127.0.0.1");
        let env = relay["env"].as_array().expect("env");
        assert_eq!(env.last().unwrap()["name"], "HTTPS_PROXY");
        assert_eq!(env.len(), 3, "NODE_NAME, POD_NAMESPACE kept: {env:?}");
        assert_eq!(
            args(container(ctl, "liveness-probe")),
            [
                "--csi-address=/csi/probe.sock",
                "--http-endpoint=127.0.0.1:9808"
            ]
        );
        let prov = container(ctl, "csi-provisioner");
        assert_eq!(prov["image"], "mirror.example.com/csi-provisioner:v6.3.0");
        assert_eq!(prov["resources"]["requests"]["cpu"], "10m");
        assert_eq!(
            prov["args"],
            container(
                &plain["Deployment/csi-relay/csi-relay-controller"],
                "csi-provisioner"
            )["args"]
        );
        assert_eq!(
            container(ctl, "csi-attacher")["image"],
            container(
                &plain["Deployment/csi-relay/csi-relay-controller"],
                "csi-attacher"
            )["image"]
        );

        let ds = &all["DaemonSet/csi-relay-node/csi-relay-node"];
        let node = container(ds, "csi-relay");
        let a = args(node);
        assert!(!a.iter().any(|x| x.starts_with("--node-member")), "{a:?}");
        assert!(a.contains(&"--log-format=json".into()), "{a:?}");
        parses(&a);
        assert_eq!(node["resources"]["limits"]["memory"], "256Mi");
        assert!(
            a.contains(&"--plugins-dir=/var/lib/k0s/kubelet/plugins".into()),
            "{a:?}"
        );
        let reg = args(container(ds, "node-driver-registrar"));
        assert!(
            reg.contains(&"--kubelet-registration-path=/var/lib/k0s/kubelet/plugins/relay.example.com/csi.sock".into()),
            "{reg:?}"
        );
        assert_eq!(
            args(container(ds, "liveness-probe")),
            [
                "--csi-address=/csi/csi.sock",
                "--http-endpoint=127.0.0.1:9809"
            ]
        );
        let pod = &ds["spec"]["template"]["spec"];
        let host_path = |name: &str| {
            pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == name)
                .unwrap_or_else(|| panic!("volume {name}"))["hostPath"]["path"]
                .clone()
        };
        assert_eq!(
            host_path("plugin-dir"),
            "/var/lib/k0s/kubelet/plugins/relay.example.com"
        );
        assert_eq!(
            host_path("registration-dir"),
            "/var/lib/k0s/kubelet/plugins_registry"
        );
        assert_eq!(host_path("kubelet-dir"), "/var/lib/k0s/kubelet");
        assert_eq!(host_path("state"), "/srv/csi-relay");
        assert_eq!(host_path("disk"), "/srv/disk");
        assert_eq!(host_path("dev"), "/dev");
        let mounts = node["volumeMounts"].as_array().unwrap();
        let kubelet = mounts.iter().find(|m| m["name"] == "kubelet-dir").unwrap();
        assert_eq!(kubelet["mountPath"], "/var/lib/k0s/kubelet");
        assert_eq!(kubelet["mountPropagation"], "Bidirectional");
        assert_eq!(mounts.last().unwrap()["mountPath"], "/srv/disk");
        assert_eq!(pod["tolerations"][0]["key"], "storage");
        assert_eq!(
            pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchExpressions"][0]["key"],
            "storage"
        );
        assert_eq!(
            container(ds, "node-driver-registrar")["env"][0]["name"],
            "TZ"
        );

        let secret = &all["Secret/csi-relay/csi-relay-members"];
        assert_eq!(
            secret["data"]["east"],
            "YXBpVmVyc2lvbjogdjEKa2luZDogQ29uZmlnCg=="
        );

        assert!(
            !all.keys().any(|k| k.contains("relay-member1")),
            "example classes left"
        );
        let fast = &all["StorageClass//fast-east"];
        assert_eq!(fast["provisioner"], "relay.example.com");
        assert_eq!(fast["volumeBindingMode"], "WaitForFirstConsumer");
        assert_eq!(fast["allowVolumeExpansion"], true);
        assert_eq!(fast["parameters"]["memberStorageClass"], "fast");
        let now = &all["StorageClass//west-now"];
        assert_eq!(now["volumeBindingMode"], "Immediate");
        assert_eq!(now["allowVolumeExpansion"], false);

        assert!(
            all.keys().any(|k| k.starts_with("PrometheusRule/")),
            "{:?}",
            all.keys()
        );
        assert!(
            all.keys().any(|k| k.starts_with("PodMonitor/")),
            "{:?}",
            all.keys()
        );
        assert!(!plain.keys().any(|k| k.starts_with("PodMonitor/")));

        // Everything else is the base's, untouched.
        for (key, obj) in &plain {
            if [
                "Deployment/",
                "DaemonSet/",
                "CSIDriver/",
                "StorageClass/",
                "Secret/",
            ]
            .iter()
            .any(|k| key.starts_with(k))
            {
                continue;
            }
            assert_eq!(Some(obj), all.get(key), "{key}");
        }

        // The helm test: csi-relay check with the same members and driver.
        let tests = objects(&ok(
            helm,
            &[
                "template",
                "relay",
                repo("deploy").to_str().unwrap(),
                "-f",
                f,
                "--show-only",
                "templates/tests/check.yaml",
            ],
        ));
        let check = tests.values().next().expect("the test pod");
        assert_eq!(check["metadata"]["annotations"]["helm.sh/hook"], "test");
        assert_eq!(check["spec"]["serviceAccountName"], "csi-relay-controller");
        let c = &check["spec"]["containers"][0];
        assert_eq!(c["image"], "registry.example.com/csi-relay:0.2.0");
        let a = args(c);
        assert_eq!(a[0], "check");
        parses(&a);
        assert!(
            a.contains(&"--member=west=/etc/csi-relay/members/west".into()),
            "{a:?}"
        );
    }
}

/// Values `values.schema.json` refuses: `--set` text, and the value's path
/// as helm v4 and v3 name it in their refusal.
const REFUSED: &[(&str, &str, &str, &str)] = &[
    (
        "deploy",
        "driverName=Bad_Driver",
        "'/driverName'",
        "driverName:",
    ),
    (
        "deploy",
        "driverName=relay.csi.dev.",
        "'/driverName'",
        "driverName:",
    ),
    (
        "deploy",
        "controller.replicas=-1",
        "'/controller/replicas'",
        "controller.replicas:",
    ),
    (
        "deploy",
        "controller.replicas=two",
        "'/controller/replicas'",
        "controller.replicas:",
    ),
    (
        "deploy",
        "node.kubeletDir=relative/path",
        "'/node/kubeletDir'",
        "node.kubeletDir:",
    ),
    (
        "deploy",
        "node.stateDir=/var/lib/../../etc",
        "'/node/stateDir'",
        "node.stateDir:",
    ),
    (
        "deploy",
        "members={member1,../etc}",
        "'/members/1'",
        "members.1:",
    ),
    ("deploy", "members={a,a}", "'/members'", "members:"),
    (
        "deploy",
        "node.member=Bad_Name",
        "'/node/member'",
        "node.member:",
    ),
    (
        "deploy",
        "node.namespace=Node_NS",
        "'/node/namespace'",
        "node.namespace:",
    ),
    ("deploy", "logFormat=xml", "'/logFormat'", "logFormat:"),
    (
        "deploy",
        "images.csi-relay=Registry/Relay:1",
        "'/images/csi-relay'",
        "images.csi-relay:",
    ),
    // helm v4 names the property, not always where it is.
    ("deploy", "images.relay=x:1", "'relay'", "images:"),
    (
        "deploy",
        "imagePullPolicy=Sometimes",
        "'/imagePullPolicy'",
        "imagePullPolicy:",
    ),
    (
        "deploy",
        "controller.resources.requests.cpu=lots",
        "'/controller/resources/requests/cpu'",
        "controller.resources.requests.cpu:",
    ),
    (
        "deploy",
        "controller.extraArgs={-v}",
        "'/controller/extraArgs/0'",
        "controller.extraArgs.0:",
    ),
    (
        "deploy",
        "sidecars.featureGates.csi-resizer.RecoverVolumeExpansionFailure=maybe",
        "'/sidecars/featureGates/csi-resizer/RecoverVolumeExpansionFailure'",
        "sidecars.featureGates.csi-resizer.RecoverVolumeExpansionFailure:",
    ),
    (
        "deploy",
        "storageClasses[0].name=c,storageClasses[0].parameters.createMemberNamespace=true",
        "'/storageClasses/0/parameters/createMemberNamespace'",
        "storageClasses.0.parameters.createMemberNamespace:",
    ),
    // A misspelt value would otherwise be ignored without a word.
    ("deploy", "controler.replicas=3", "'controler'", "controler"),
    (
        "deploy/member",
        "admission=v2",
        "'/admission'",
        "admission:",
    ),
    (
        "deploy/member",
        "nodeSecrets.namespace=Secrets_NS",
        "'/nodeSecrets/namespace'",
        "nodeSecrets.namespace:",
    ),
    (
        "deploy/member",
        "sharedStorage=true",
        "'/sharedStorage'",
        "sharedStorage:",
    ),
];

#[test]
fn bad_values_are_refused_naming_the_value() {
    let Some([helm4, helm3]) = tools(["helm", "helm3"]) else {
        return;
    };
    for (helm, major) in [(&helm4, 4), (&helm3, 3)] {
        for (chart, set, at4, at3) in REFUSED {
            let says = if major == 4 { at4 } else { at3 };
            for verb in ["template", "lint"] {
                let out = if verb == "template" {
                    helm_template(helm, chart, &["--set", set])
                } else {
                    run(helm, &["lint", repo(chart).to_str().unwrap(), "--set", set])
                };
                match out {
                    Ok(out) => panic!("helm {major} {verb} {chart} --set {set} passed:\n{out}"),
                    Err(e) => {
                        assert!(
                            e.contains("schema"),
                            "helm {major} {verb} {chart} --set {set}: {e}"
                        );
                        assert!(
                            e.contains(says),
                            "helm {major} {verb} {chart} --set {set}: {e}"
                        );
                    }
                }
            }
        }
        let unnamed = write_values("storageClasses: [{ parameters: { member: a } }]\n");
        let e = helm_template(helm, "deploy", &["-f", unnamed.path().to_str().unwrap()])
            .expect_err("a class without a name");
        assert!(e.contains("every class needs a name"), "{e}");
    }
}

#[test]
fn the_newest_kustomize_renders_what_kubectl_1_28_renders() {
    let Some([old, new]) = tools(["kubectl", "kubectl-1.37"]) else {
        return;
    };
    let version = ok(&new, &["version", "--client"]);
    assert!(version.contains("Kustomize Version: v5.8.1"), "{version}");
    let overlays = [
        member_overlay(&["admission"]),
        member_overlay(&["admission-v1beta1", "node-secrets"]),
    ];
    let mut dirs: Vec<String> = ["deploy", "deploy/member", "deploy/monitoring"]
        .iter()
        .map(|d| repo(d).display().to_string())
        .collect();
    dirs.extend(overlays.iter().map(|o| o.path().display().to_string()));
    for dir in &dirs {
        let want = objects(&ok(&old, &["kustomize", dir]));
        assert!(!want.is_empty(), "{dir}");
        let got = objects(&ok(&new, &["kustomize", dir]));
        assert_same(&format!("kustomize v5.8.1 of {dir}"), &got, &want);
    }
}
