//! The deploy kit installed for real: `tests/deploy-kit/up.sh` starts a host
//! control plane with a real kubelet node and a member control plane,
//! builds the csi-relay image from this build's binary with buildah (no
//! registry), imports the sidecar images and runs `kubectl apply -k` of
//! deploy/ (through the test overlay); `check.sh` runs a user's claim and
//! pod through the installed controller and node plugin, checks the
//! livenessprobes, kills the node plugin's container (the kubelet restarts
//! it) and checks the mounted volume and a new one, then deletes it all
//! through CSI; `snapshot.sh` takes a snapshot and restores it under
//! deploy/'s RBAC (a member CSI driver that snapshots); `ha.sh` fails the controller's two replicas over (the
//! leader's pod killed, a rollout restart, the leader's node frozen) under
//! load, with figures; `down.sh` undoes everything. The second test installs the same kit with
//! helm (`KIT_INSTALL=helm`) and runs `helm.sh`: the chart's install, test, upgrade, rollback,
//! uninstall and reinstall with helm v4 and v3.
//!
//! Runs when E2E_HOME holds the control-plane and kubelet binaries and the
//! sidecar images (`images/images.txt`), and buildah and containerd are
//! installed; prints "skipped" otherwise.

use crate::{common, e2e_support};

use std::path::PathBuf;

use e2e_support::ScriptedEnv;

fn prerequisites() -> Result<PathBuf, String> {
    let e2e_home = e2e_support::kubelet_node_home(
        &["kube-apiserver", "kubectl"],
        &["buildah", "curl", "ss", "iptables", "nsenter"],
    )?;
    let images = std::fs::read_to_string(e2e_home.join("images/images.txt"))
        .map_err(|_| "no sidecar images: $E2E_HOME/images/images.txt missing")?;
    if !images.contains("csi-node-driver-registrar") || !images.contains("csi-provisioner") {
        return Err("no sidecar images under deploy/'s names in $E2E_HOME/images".into());
    }
    Ok(e2e_home)
}

/// The kit's scripts with this build's binary and `env`; down.sh runs when
/// it is dropped.
fn kit(e2e_home: &std::path::Path, env: &[(&'static str, &str)]) -> ScriptedEnv {
    let mut vars = vec![("CSI_RELAY_BIN", env!("CARGO_BIN_EXE_csi-relay").to_string())];
    vars.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
    ScriptedEnv::new("deploy-kit", "down.sh", e2e_home, vars)
}

#[test]
fn the_deploy_kit_runs_a_users_pod_on_a_real_kubelet() {
    let _alone = common::alone();
    let e2e_home = match prerequisites() {
        Ok(home) => home,
        Err(why) => return common::skip(&why),
    };
    let kit = kit(&e2e_home, &[]);
    kit.run("up.sh");
    kit.run("check.sh");
    kit.run("snapshot.sh");
    kit.run("ha.sh");
}

/// The same kit installed with `helm install` of the chart (`KIT_INSTALL=helm up.sh`), then
/// `helm.sh`: helm test, an upgrade under load, a rollback, an uninstall that keeps the CRD and
/// the RelayVolumes, and a reinstall that serves the kept volume, with helm v4 and then v3.
#[test]
fn the_helm_chart_installs_upgrades_rolls_back_and_uninstalls_on_real_kubelets() {
    let _alone = common::alone();
    let e2e_home = match prerequisites() {
        Ok(home) => home,
        Err(why) => return common::skip(&why),
    };
    for helm in ["helm", "helm3"] {
        if !e2e_home.join("bin").join(helm).is_file() {
            return common::skip(&format!(
                "no {helm} in $E2E_HOME/bin (tests/e2e-env/README.md)"
            ));
        }
    }
    let kit = kit(&e2e_home, &[("KIT_INSTALL", "helm")]);
    kit.run("up.sh");
    kit.run("helm.sh");
}
