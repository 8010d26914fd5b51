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
    for entry in std::fs::read_dir(&root).unwrap().flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if file.ends_with(".yaml") && file != "kustomization.yaml" {
            assert!(
                k.contains(&format!("- {file}")),
                "{file} is not in kustomization.yaml"
            );
        }
    }
}
