//! The relay as the seed's demo runs it (`tests/kosmos/demo-up.sh`): a
//! `--mode controller` csi-relay (member backend, virtual-node registrar)
//! with the stock provisioner and attacher under deploy/'s flags, and a
//! csi-relay node plugin registered with the host kubelet node demo-kl-1.

use std::path::{Path, PathBuf};

use crate::common;

use super::{sidecar_args, Env, Sidecar};

/// What the seed's demo needs on this machine: the two-cluster
/// environment, the sidecars, and in E2E_HOME Kosmos, kubelets and both
/// provisioners; `tools`: more commands it needs installed.
pub struct Prerequisites {
    pub env: Env,
    pub e2e_home: PathBuf,
    pub sidecars: PathBuf,
}

impl Prerequisites {
    pub fn of(tools: &[&str]) -> Result<Prerequisites, String> {
        let env = super::env().ok_or("no clusters: set RELAY_E2E_*")?;
        let sidecars = PathBuf::from(
            std::env::var("RELAY_E2E_SIDECARS")
                .map_err(|_| "no sidecars: set RELAY_E2E_SIDECARS")?,
        );
        let e2e_home = super::kubelet_node_home(
            &[
                "clustertree-cluster-manager",
                "provisioner-localpv",
                "local-path-provisioner",
                "csi-node-driver-registrar",
            ],
            tools,
        )?;
        if !e2e_home.join("kosmos-crds").is_dir() {
            return Err("no Kosmos CRDs ($E2E_HOME/kosmos-crds)".into());
        }
        Ok(Prerequisites {
            env,
            e2e_home,
            sidecars,
        })
    }
}

/// Everything started, stopped when dropped: the node side first, the
/// controller last (fields drop in this order).
pub struct DemoRelay {
    _registrar: Sidecar,
    pub node_plugin: common::Driver,
    _attacher: Sidecar,
    _provisioner: Sidecar,
    pub controller: common::Driver,
    /// How the provisioner and the attacher were started: they exit when
    /// the controller does, and are started again after a crash (as the
    /// kubelet restarts a pod's containers).
    host_sidecars: [(PathBuf, Vec<String>); 2],
    restarts: usize,
}

impl DemoRelay {
    /// `members`: `NAME=KUBECONFIG` each; `extra`: more controller flags;
    /// `demo`: demo-up.sh's directory; `node_member`: the member the node
    /// plugin reports (`--node-member`).
    pub async fn start(
        env: &Env,
        sidecars: &Path,
        members: &[String],
        extra: &[&str],
        demo: &Path,
        node_member: &str,
    ) -> DemoRelay {
        let mut args = vec![
            "--mode",
            "controller",
            "--backend",
            "member",
            "--host-kubeconfig",
            &env.host_kubeconfig,
            "--virtual-node-registrar",
            "--housekeeping-interval",
            "5",
        ];
        for m in members {
            args.extend(["--member", m.as_str()]);
        }
        args.extend(extra);
        let controller = common::Driver::start_as("controller", &args).await;
        let sidecar =
            |extra: &[&str]| sidecar_args(&controller.socket, &env.host_kubeconfig, extra);
        let host_sidecars = [
            (
                sidecars.join("csi-provisioner"),
                sidecar(&[
                    "--extra-create-metadata",
                    "--feature-gates=Topology=true",
                    "--strict-topology",
                ]),
            ),
            (sidecars.join("csi-attacher"), sidecar(&[])),
        ];
        let [provisioner, attacher] = host_sidecars
            .clone()
            .map(|(bin, args)| start_sidecar(&controller, &bin, &args, 0));
        let mut node_args = vec![
            "--mode".to_string(),
            "node".into(),
            "--backend".into(),
            "member".into(),
            "--node-member".into(),
            node_member.into(),
            "--host-kubeconfig".into(),
            env.host_kubeconfig.clone(),
            "--plugins-dir".into(),
            demo.join("member-plugins").display().to_string(),
        ];
        if let Ok(kubeconfig) = std::env::var("RELAY_E2E_MEMBER_RELAY_NODE_KUBECONFIG") {
            node_args.extend(["--member".into(), format!("member1={kubeconfig}")]);
        }
        let node_args: Vec<&str> = node_args.iter().map(String::as_str).collect();
        let node_plugin = common::Driver::start_as("demo-kl-1", &node_args).await;
        let registrar = Sidecar::start(
            &sidecars.join("csi-node-driver-registrar"),
            &[
                format!("--csi-address={}", node_plugin.socket.display()),
                format!(
                    "--kubelet-registration-path={}",
                    node_plugin.socket.display()
                ),
                format!(
                    "--plugin-registration-path={}",
                    demo.join("lab/kubelet/plugins_registry").display()
                ),
                "-v=3".into(),
            ],
            &node_plugin.path("registrar.log"),
        );
        DemoRelay {
            _registrar: registrar,
            node_plugin,
            _attacher: attacher,
            _provisioner: provisioner,
            controller,
            host_sidecars,
            restarts: 0,
        }
    }

    /// SIGKILL of the controller, then the controller started again on
    /// its state dir, and the provisioner and attacher with it (they
    /// exit when it goes).
    pub async fn crash_controller(&mut self) {
        self.controller.crash();
        self.controller.start_again().await;
        self.restarts += 1;
        let [(p, p_args), (a, a_args)] = &self.host_sidecars;
        self._provisioner = start_sidecar(&self.controller, p, p_args, self.restarts);
        self._attacher = start_sidecar(&self.controller, a, a_args, self.restarts);
    }
}

/// A host sidecar of the controller, its log beside the controller's
/// (numbered after a restart).
fn start_sidecar(
    controller: &common::Driver,
    bin: &Path,
    args: &[String],
    restart: usize,
) -> Sidecar {
    let name = bin
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let log = match restart {
        0 => format!("{name}.log"),
        n => format!("{name}.{n}.log"),
    };
    Sidecar::start(bin, args, &controller.path(&log))
}
