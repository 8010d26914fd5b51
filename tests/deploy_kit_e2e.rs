//! The deploy kit installed for real: `tests/deploy-kit/up.sh` starts a host
//! control plane with a real kubelet node and a member control plane,
//! builds the csi-relay image from this build's binary with buildah (no
//! registry), imports the sidecar images and runs `kubectl apply -k` of
//! deploy/ (through the test overlay); `check.sh` runs a user's claim and
//! pod through the installed controller and node plugin, checks the
//! livenessprobes, kills the node plugin's container (the kubelet restarts
//! it) and checks the mounted volume and a new one, then deletes it all
//! through CSI; `down.sh` undoes everything.
//!
//! Runs when E2E_HOME holds the control-plane and kubelet binaries and the
//! sidecar images (`images/images.txt`), and buildah and containerd are
//! installed; prints "skipped" otherwise.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/deploy-kit")
        .join(name)
}

fn prerequisites() -> Result<PathBuf, String> {
    let e2e_home = PathBuf::from(std::env::var("E2E_HOME").map_err(|_| "no E2E_HOME")?);
    for bin in [
        "kube-apiserver",
        "kubelet",
        "kube-scheduler",
        "pause",
        "kubectl",
    ] {
        if !e2e_home.join("bin").join(bin).is_file() {
            return Err(format!("no kubelet node: {bin} missing in $E2E_HOME/bin"));
        }
    }
    let images = std::fs::read_to_string(e2e_home.join("images/images.txt"))
        .map_err(|_| "no sidecar images: $E2E_HOME/images/images.txt missing")?;
    if !images.contains("csi-node-driver-registrar") || !images.contains("csi-provisioner") {
        return Err("no sidecar images under deploy/'s names in $E2E_HOME/images".into());
    }
    for tool in ["buildah", "containerd", "curl", "ss"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            return Err(format!("{tool} is not installed"));
        }
    }
    if !nix::unistd::Uid::effective().is_root() {
        return Err("a kubelet node needs root".into());
    }
    Ok(e2e_home)
}

/// The kit's run dir; down.sh runs when dropped, also after a failure.
struct Kit {
    run: tempfile::TempDir,
    e2e_home: PathBuf,
}

impl Kit {
    fn command(&self, name: &str) -> Command {
        let mut c = Command::new(script(name));
        c.arg(self.run.path())
            .env("E2E_HOME", &self.e2e_home)
            .env("CSI_RELAY_BIN", env!("CARGO_BIN_EXE_csi-relay"));
        c
    }
}

impl Drop for Kit {
    fn drop(&mut self) {
        let status = self.command("down.sh").status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!(
                "tests/deploy-kit/down.sh did not finish cleanly; see {}",
                self.run.path().display()
            );
        }
    }
}

#[test]
fn the_deploy_kit_runs_a_users_pod_on_a_real_kubelet() {
    let e2e_home = match prerequisites() {
        Ok(home) => home,
        Err(why) => return common::skip(&why),
    };
    let kit = Kit {
        run: tempfile::Builder::new()
            .prefix("relay-deploy-kit-")
            .tempdir()
            .expect("run dir"),
        e2e_home,
    };
    let up = kit.command("up.sh").status().expect("run up.sh");
    assert!(up.success(), "tests/deploy-kit/up.sh failed: {up}");
    let check = kit.command("check.sh").status().expect("run check.sh");
    assert!(check.success(), "tests/deploy-kit/check.sh failed: {check}");
}
