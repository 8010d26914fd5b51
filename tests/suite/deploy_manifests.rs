//! The deploy kit: every manifest parses, and the csi-relay containers pass
//! only flags (and values) the binary accepts.

use std::path::Path;

use clap::Parser;
use csi_relay::app::cli::Cli;
use serde_json::Value;

fn documents(dir: &Path) -> Vec<(String, Value)> {
    let mut docs = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("deploy dir")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        // The Helm chart's own files (deploy/ is also the chart) are no
        // Kubernetes objects.
        .filter(|p| !p.ends_with("Chart.yaml") && !p.ends_with("values.yaml"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read manifest");
        for (i, doc) in text.split("\n---\n").enumerate() {
            if doc
                .lines()
                .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'))
            {
                continue;
            }
            let value: Value = serde_saphyr::from_str(doc)
                .unwrap_or_else(|e| panic!("{} document {i}: {e}", file.display()));
            docs.push((format!("{} #{i}", file.display()), value));
        }
    }
    docs
}

#[test]
fn manifests_parse_and_pass_only_flags_the_binary_accepts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let mut docs = documents(&root);
    docs.extend(documents(&root.join("member")));
    docs.extend(documents(&root.join("crds")));
    assert!(docs.len() >= 10, "{} documents", docs.len());
    let mut relay_containers = 0;
    for (name, doc) in &docs {
        assert!(
            doc["apiVersion"].is_string() && doc["kind"].is_string(),
            "{name}"
        );
        let containers = doc["spec"]["template"]["spec"]["containers"].as_array();
        for c in containers.into_iter().flatten() {
            let image = c["image"].as_str().unwrap_or_default();
            assert!(!image.ends_with(":latest"), "{name}: pin {image}");
            if !image.starts_with("csi-relay") {
                continue;
            }
            relay_containers += 1;
            let args: Vec<String> = c["args"]
                .as_array()
                .expect("args")
                .iter()
                .map(|a| {
                    a.as_str()
                        .unwrap_or_default()
                        .replace("$(NODE_NAME)", "node-1")
                })
                .collect();
            let argv = std::iter::once("csi-relay".to_string()).chain(args.clone());
            if let Err(e) = Cli::try_parse_from(argv) {
                panic!("{name}: csi-relay {args:?}: {e}");
            }
        }
    }
    assert_eq!(relay_containers, 2, "the controller and the node plugin");
}

#[test]
fn the_kustomization_lists_every_host_manifest() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    let k = std::fs::read_to_string(root.join("kustomization.yaml")).unwrap();
    let files = std::fs::read_dir(&root)
        .unwrap()
        .chain(std::fs::read_dir(root.join("crds")).unwrap())
        .flatten()
        .map(|e| e.path());
    for path in files {
        let file = path
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        // The chart's own files are not manifests (deploy/ is also the chart).
        if file.ends_with(".yaml")
            && !["kustomization.yaml", "Chart.yaml", "values.yaml"].contains(&file.as_str())
        {
            assert!(
                k.contains(&format!("- {file}")),
                "{file} is not in kustomization.yaml"
            );
        }
    }
}

fn kit(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(path)
}

#[test]
fn the_member_components_parse_and_the_policy_is_one_for_both_api_versions() {
    for dir in [
        "member/node-secrets",
        "member/shared-storage",
        "member/mobility",
        "member/admission",
        "member/admission-v1beta1",
    ] {
        let docs = documents(&kit(dir));
        assert!(!docs.is_empty(), "{dir}");
        let k = std::fs::read_to_string(kit(dir).join("kustomization.yaml")).unwrap();
        assert!(
            k.contains("kind: Component"),
            "{dir} is a kustomize Component"
        );
    }
    let v1 = std::fs::read_to_string(kit("member/admission/policy.yaml")).unwrap();
    let beta = std::fs::read_to_string(kit("member/admission-v1beta1/policy.yaml")).unwrap();
    let beta: String = beta
        .lines()
        .skip_while(|l| l.starts_with("# Generated from"))
        .map(|l| {
            l.replace(
                "admissionregistration.k8s.io/v1beta1",
                "admissionregistration.k8s.io/v1",
            )
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        v1.trim_end(),
        beta.trim_end(),
        "admission-v1beta1/policy.yaml differs from admission/policy.yaml beyond apiVersion"
    );
    // The identity the policy holds is the one deploy/member makes.
    let rbac = std::fs::read_to_string(kit("member/rbac.yaml")).unwrap();
    assert!(rbac.contains("name: csi-relay-member\n  namespace: csi-relay\n"));
    assert!(v1.contains("'system:serviceaccount:csi-relay:csi-relay-member'"));
    // No member identity may read every Secret.
    for (name, doc) in documents(&kit("member")) {
        for rule in doc["rules"].as_array().into_iter().flatten() {
            assert!(
                !rule["resources"].to_string().contains("secrets"),
                "{name}: a rule on secrets"
            );
        }
    }
}

/// The Pod Security Standard "restricted" for the controller Deployment,
/// field by field, and the namespaces that enforce it.
#[test]
fn the_controller_keeps_the_restricted_pod_security_standard() {
    let docs = documents(&kit(""));
    let controller = docs
        .iter()
        .find(|(_, d)| d["kind"] == "Deployment")
        .map(|(_, d)| d.clone())
        .expect("the controller Deployment");
    let spec = &controller["spec"]["template"]["spec"];
    let pod = &spec["securityContext"];
    assert_eq!(pod["runAsNonRoot"], true);
    assert_eq!(pod["seccompProfile"]["type"], "RuntimeDefault");
    assert!(spec["hostNetwork"].is_null() && spec["hostPID"].is_null());
    for c in spec["containers"].as_array().unwrap() {
        let sc = &c["securityContext"];
        let name = c["name"].as_str().unwrap_or_default();
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{name}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}");
        assert_eq!(
            sc["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{name}"
        );
        assert!(
            sc["capabilities"]["add"].is_null() && sc["privileged"].is_null(),
            "{name}"
        );
    }
    for v in spec["volumes"].as_array().unwrap() {
        assert!(
            v["hostPath"].is_null(),
            "restricted allows no hostPath: {v}"
        );
    }
    let namespaces: Vec<&Value> = docs
        .iter()
        .filter(|(_, d)| d["kind"] == "Namespace")
        .map(|(_, d)| d)
        .collect();
    let enforce = |name: &str| {
        namespaces
            .iter()
            .find(|n| n["metadata"]["name"] == name)
            .map(|n| n["metadata"]["labels"]["pod-security.kubernetes.io/enforce"].clone())
    };
    assert_eq!(enforce("csi-relay"), Some(Value::from("restricted")));
    assert_eq!(enforce("csi-relay-node"), Some(Value::from("privileged")));
    assert_eq!(controller["metadata"]["namespace"], "csi-relay");
    let node = docs
        .iter()
        .find(|(_, d)| d["kind"] == "DaemonSet")
        .map(|(_, d)| d)
        .expect("the node DaemonSet");
    assert_eq!(node["metadata"]["namespace"], "csi-relay-node");
}
