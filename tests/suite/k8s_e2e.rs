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
//!   each suite), `sharded` or `full` (every spec; about half an hour here);
//! - `restarts.sh`: csi-relay and then the kubelet killed with SIGKILL under
//!   running pods and started again; pods keep their volumes, teardown is
//!   clean.
//!
//! Runs when the two-cluster environment is up (RELAY_E2E_*) with the kubelet
//! client flags of `tests/k8s-e2e/apiserver-extra.sh`, and E2E_HOME holds
//! the kubelet, `e2e.test`, the snapshotter and the images; prints
//! "skipped" otherwise.

use crate::{common, e2e_support};

use std::path::{Path, PathBuf};

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
    let env = ScriptedEnv::new(
        "k8s-e2e",
        "env-down.sh",
        &e2e_home,
        vec![
            ("RELAY_BIN", env!("CARGO_BIN_EXE_csi-relay").to_string()),
            ("MEMBER", "1".to_string()),
        ],
    );
    env.run("env-up.sh");

    for driver in ["local", "member"] {
        let suite = env
            .command("run.sh")
            .arg(script(&format!("{driver}.yaml")))
            .arg(&mode)
            .status()
            .expect("run tests/k8s-e2e/run.sh");
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
    env.run("restarts.sh");
}
