//! csi-relay under a real kubelet, judged by Kubernetes' own storage e2e
//! suite: `tests/k8s-e2e/env-up.sh` adds to the two-cluster environment's host
//! cluster a kubelet node (its own containerd, the e2e images imported) on
//! which this build of csi-relay runs as node plugin and controller (local
//! backend), registered through node-driver-registrar, with the stock
//! provisioner, attacher, resizer and snapshotter. Then:
//! - `run.sh` runs the v1.28 "External Storage" suite (`e2e.test`) for the
//!   local backend (driver file `tests/k8s-e2e/local.yaml`) and the member
//!   backend (`member.yaml`: a `--backend member` relay and its node plugin
//!   on the same kubelet node, over the env's member storage); every spec
//!   that runs must pass.
//!   RELAY_K8S_E2E_MODE picks the selection: `quick` (default: one spec of
//!   each suite), `sharded` or `full` (every spec; about half an hour here),
//!   or `none` (the suite skipped, for work on what follows);
//! - `restarts.sh`: csi-relay and then the kubelet killed with SIGKILL under
//!   running pods and started again; pods keep their volumes, teardown is
//!   clean;
//! - `group-snapshots.sh` (before the restarts): a VolumeGroupSnapshot of two claims through the
//!   stock snapshot-controller and csi-snapshotter, restored and deleted;
//! - `node-partition.sh`: the member relay's node plugin reaches the member
//!   through a fault proxy (`NODE_MEMBER_KUBECONFIG`); pods on the kubelet
//!   node start, write and stop while the proxy black-holes it, and after.
//!
//! Runs when the two-cluster environment is up (RELAY_E2E_*) with the kubelet
//! client flags of `tests/k8s-e2e/apiserver-extra.sh`, and E2E_HOME holds
//! the kubelet, `e2e.test`, the snapshotter and the images; prints
//! "skipped" otherwise.

use crate::{common, e2e_support};

use std::path::{Path, PathBuf};

use e2e_support::fault_proxy::{server_of, FaultProxy};
use e2e_support::ScriptedEnv;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/k8s-e2e")
        .join(name)
}

fn prerequisites() -> Result<PathBuf, String> {
    e2e_support::env().ok_or("no clusters: set RELAY_E2E_*")?;
    let e2e_home = e2e_support::kubelet_node_home(
        &[
            "e2e.test",
            "csi-resizer",
            "csi-snapshotter",
            "snapshot-controller",
        ],
        &[],
    )?;
    for dir in ["images", "snapshot-crds"] {
        if !e2e_home.join(dir).is_dir() {
            return Err(format!("$E2E_HOME/{dir} missing"));
        }
    }
    Ok(e2e_home)
}

#[test]
fn kubernetes_storage_e2e_and_restarts_under_a_real_kubelet() {
    let _alone = common::alone();
    let e2e_home = match prerequisites() {
        Ok(home) => home,
        Err(why) => return common::skip(&why),
    };
    let mode = std::env::var("RELAY_K8S_E2E_MODE").unwrap_or_else(|_| "quick".into());
    // The member relay's node plugin reaches the member through a fault
    // proxy, cut by node-partition.sh's "during" phase.
    let proxies = tokio::runtime::Runtime::new().expect("a runtime for the fault proxy");
    // As the node plugins' own member identity (deploy/member's
    // csi-relay-member-node) when the environment made one.
    let member_kubeconfig = std::env::var("RELAY_E2E_MEMBER_RELAY_NODE_KUBECONFIG")
        .ok()
        .or_else(|| e2e_support::env().map(|e| e.member_kubeconfig))
        .unwrap_or_default();
    let node_member = proxies.block_on(FaultProxy::to(&server_of(&member_kubeconfig)));
    let files = tempfile::tempdir().expect("temp dir");
    let node_member_kubeconfig =
        node_member.kubeconfig(&member_kubeconfig, &files.path().join("node-member"));
    let env = ScriptedEnv::new(
        "k8s-e2e",
        "env-down.sh",
        &e2e_home,
        vec![
            ("RELAY_BIN", env!("CARGO_BIN_EXE_csi-relay").to_string()),
            ("MEMBER", "1".to_string()),
            (
                "NODE_MEMBER_KUBECONFIG",
                node_member_kubeconfig.display().to_string(),
            ),
        ],
    );
    env.run("env-up.sh");

    let drivers: &[&str] = if mode == "none" {
        &[]
    } else {
        &["local", "member"]
    };
    // Both backends at once, each its own e2e.test against its own relay on
    // the one kubelet node (room for both under its attach limit): the specs
    // mostly wait on the kubelet, and one after the other took 19 minutes.
    let runs: Vec<_> = drivers
        .iter()
        .map(|driver| {
            let child = env
                .command("run.sh")
                .arg(script(&format!("{driver}.yaml")))
                .arg(&mode)
                .spawn()
                .expect("run tests/k8s-e2e/run.sh");
            (driver, child)
        })
        .collect();
    // Every run ends before any is judged: none is left running.
    let ended: Vec<_> = runs
        .into_iter()
        .map(|(driver, mut child)| (driver, child.wait()))
        .collect();
    for (driver, suite) in ended {
        let suite = suite.expect("wait for tests/k8s-e2e/run.sh");
        let summary = std::fs::read_to_string(
            env.run
                .path()
                .join(format!("report-{driver}-{mode}"))
                .join("summary.txt"),
        )
        .unwrap_or_default();
        assert!(
            suite.success(),
            "the External Storage suite ({driver}, {mode}) failed:\n{summary}"
        );
        assert!(
            summary.contains("TOTAL"),
            "no results from the suite ({driver}, {mode}):\n{summary}"
        );
    }
    // Before restarts.sh: a sidecar finds the relay it was connected to
    // gone only at its next call, and exits then (the snapshotter makes
    // none in restarts.sh, which restarts the sidecars that exited).
    env.run_with("group-snapshots.sh", &["local"]);
    env.run_with("group-snapshots.sh", &["member"]);
    env.run("restarts.sh");

    // The node plugin under a partition of its member API, on the real
    // kubelet node.
    let phase = |name: &str| {
        let status = env
            .command("node-partition.sh")
            .arg(name)
            .status()
            .expect("run tests/k8s-e2e/node-partition.sh");
        assert!(status.success(), "node-partition.sh {name} failed");
    };
    phase("before");
    node_member.cut();
    let during = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| phase("during")));
    node_member.heal();
    if let Err(failed) = during {
        std::panic::resume_unwind(failed);
    }
    phase("after");
}
