//! What the end-to-end tests against real control planes share: the
//! RELAY_E2E_* environment, clients, waiting, the RelayVolume CRD.
#![allow(dead_code)]

pub mod audit;
pub mod demo_relay;
pub mod fault_proxy;
pub mod frozen_member;
pub mod pods;

use std::time::{Duration, Instant};

use csi_relay::k8s::relay_volume::RelayVolume;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, CustomResourceExt};

#[derive(Clone)]
pub struct Env {
    pub host_kubeconfig: String,
    /// The member's admin: what tests read and plant there.
    pub member_kubeconfig: String,
    /// The relay's own identity in the member (deploy/member's
    /// csi-relay-member, under its admission policy): what relays under
    /// test use. The admin kubeconfig when the environment has none.
    pub relay_member_kubeconfig: String,
    pub storage_class: String,
    pub namespace: String,
    /// The member CSI driver's name and its node plugin socket on this
    /// machine, when its volumes are staged through it.
    pub member_plugin: Option<(String, String)>,
}

pub fn env() -> Option<Env> {
    let member_kubeconfig = std::env::var("RELAY_E2E_MEMBER_KUBECONFIG").ok()?;
    Some(Env {
        host_kubeconfig: std::env::var("RELAY_E2E_HOST_KUBECONFIG").ok()?,
        relay_member_kubeconfig: std::env::var("RELAY_E2E_MEMBER_RELAY_KUBECONFIG")
            .unwrap_or_else(|_| member_kubeconfig.clone()),
        member_kubeconfig,
        storage_class: std::env::var("RELAY_E2E_MEMBER_STORAGE_CLASS").ok()?,
        namespace: std::env::var("RELAY_E2E_MEMBER_NAMESPACE").unwrap_or_else(|_| "default".into()),
        member_plugin: std::env::var("RELAY_E2E_MEMBER_CSI_DRIVER")
            .ok()
            .zip(std::env::var("RELAY_E2E_MEMBER_PLUGIN_SOCK").ok()),
    })
}

pub async fn client(path: &str) -> Client {
    let kubeconfig = Kubeconfig::read_from(path).expect("read kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

pub async fn install_crd(host: &Client) {
    Api::<CustomResourceDefinition>::all(host.clone())
        .patch(
            "relayvolumes.relay.csi.dev",
            &PatchParams::apply("csi-relay-e2e").force(),
            &Patch::Apply(RelayVolume::crd()),
        )
        .await
        .expect("install RelayVolume CRD");
}

/// The host's CSIDriver object for `relay.csi.dev`, as deploy/csidriver.yaml
/// has it (tests/k8s-e2e installs the same spec: its fields are immutable).
pub async fn install_csidriver(host: &Client) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/csidriver.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/csidriver.yaml");
    let csidriver: serde_json::Value = serde_saphyr::from_str(&text).expect("CSIDriver YAML");
    Api::<k8s_openapi::api::storage::v1::CSIDriver>::all(host.clone())
        .patch(
            "relay.csi.dev",
            &PatchParams::apply("csi-relay-e2e").force(),
            &Patch::Apply(&csidriver),
        )
        .await
        .expect("CSIDriver");
}

/// A host Node with no kubelet behind it: attach/detach by the controller,
/// Ready, with `labels`, and the CSINode entry of `relay.csi.dev` that
/// node-driver-registrar would make (node id = the node's name; owned by
/// the Node, so it goes with it). Any earlier node of the name is replaced.
pub async fn fake_host_node(host: &Client, name: &str, labels: serde_json::Value) {
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::storage::v1::CSINode;
    use kube::api::{DeleteParams, PostParams};
    let nodes: Api<Node> = Api::all(host.clone());
    let _ = nodes.delete(name, &DeleteParams::default()).await;
    eventually(
        "an earlier node of the name to go",
        Duration::from_secs(30),
        || {
            let nodes = nodes.clone();
            async move { nodes.get_opt(name).await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
    // What the kubelet and node-driver-registrar make of the node plugin's
    // NodeGetInfo: the node's own topology segment (and its member's, when
    // labelled) as labels and as the CSINode entry's keys. external-provisioner
    // v5+ asks for topology of a driver that has it, and finds none without.
    let mut labels = labels;
    labels["topology.relay.csi.dev/node"] = serde_json::json!(name);
    let mut keys = vec!["topology.relay.csi.dev/node"];
    if labels.get("topology.relay.csi.dev/member").is_some() {
        keys.insert(0, "topology.relay.csi.dev/member");
    }
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"}},
    }))
    .expect("node manifest");
    let node = nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create the host node");
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let ready = serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "True",
        "reason": "KubeletReady", "message": "no kubelet: a test's node",
        "lastHeartbeatTime": now, "lastTransitionTime": now}]}});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&ready))
        .await
        .expect("host node Ready");
    let csinodes: Api<CSINode> = Api::all(host.clone());
    let _ = csinodes.delete(name, &DeleteParams::default()).await;
    let csinode: CSINode = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "ownerReferences": [{"apiVersion": "v1", "kind": "Node",
            "name": name, "uid": node.metadata.uid}]},
        "spec": {"drivers": [{"name": "relay.csi.dev", "nodeID": name, "topologyKeys": keys}]}
    }))
    .expect("CSINode manifest");
    eventually("the node's CSINode", Duration::from_secs(30), || {
        let (csinodes, csinode) = (csinodes.clone(), csinode.clone());
        async move { csinodes.create(&PostParams::default(), &csinode).await.ok() }
    })
    .await;
}

/// Creates the host namespace `ns` and waits until its pods are admitted
/// (its default ServiceAccount exists).
pub async fn admitting_namespace(host: &Client, ns: &str) {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    use kube::api::PostParams;
    Api::<Namespace>::all(host.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))
                .expect("namespace"),
        )
        .await
        .expect("create namespace");
    let sas: Api<ServiceAccount> = Api::namespaced(host.clone(), ns);
    eventually(
        "the namespace's default ServiceAccount",
        Duration::from_secs(180),
        || {
            let sas = sas.clone();
            async move { sas.get_opt("default").await.ok().flatten() }
        },
    )
    .await;
}

/// Server-side apply of `object` as object `name`, taking every field.
pub async fn apply<K>(api: &Api<K>, name: &str, object: serde_json::Value)
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply("csi-relay-e2e").force(),
        &Patch::Apply(&object),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {name}: {e}"));
}

/// A host namespace `ns` and an Immediate, Delete StorageClass `class` of
/// `relay.csi.dev` with `parameters`, as a test's claims use them.
pub async fn host_namespace_and_class(
    host: &Client,
    ns: &str,
    class: &str,
    parameters: serde_json::Value,
) {
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::api::storage::v1::StorageClass;
    use kube::api::PostParams;
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).expect("namespace");
    Api::<Namespace>::all(host.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("host namespace");
    let sc: StorageClass = serde_json::from_value(serde_json::json!({
        "metadata": {"name": class},
        "provisioner": "relay.csi.dev",
        "volumeBindingMode": "Immediate",
        "reclaimPolicy": "Delete",
        "parameters": parameters
    }))
    .expect("class");
    Api::<StorageClass>::all(host.clone())
        .create(&PostParams::default(), &sc)
        .await
        .expect("host StorageClass");
}

/// The RelayVolume's PHASE column.
pub fn phase(rv: &RelayVolume) -> Option<String> {
    rv.status.as_ref().and_then(|s| s.phase.clone())
}

/// Waits until the RelayVolume `name` shows `want` as its phase.
pub async fn wait_phase(host: &Client, name: &str, want: &str) {
    let relay: Api<RelayVolume> = Api::all(host.clone());
    eventually(
        &format!("RelayVolume {name} phase {want}"),
        Duration::from_secs(30),
        || {
            let (relay, name) = (relay.clone(), name.to_string());
            async move {
                let rv = relay.get_opt(&name).await.ok()??;
                (phase(&rv).as_deref() == Some(want)).then_some(())
            }
        },
    )
    .await
}

/// What the CO does until it gets an answer: retry what is retryable
/// (UNAVAILABLE, ABORTED, DEADLINE_EXCEEDED); anything else fails the test.
pub async fn until_ok<T, F, Fut>(what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    use tonic::Code;
    eventually(what, Duration::from_secs(300), || {
        let attempt = call();
        async move {
            match attempt.await {
                Ok(v) => Some(v),
                Err(s)
                    if matches!(
                        s.code(),
                        Code::Unavailable | Code::Aborted | Code::DeadlineExceeded
                    ) =>
                {
                    None
                }
                Err(s) => panic!("{what}: {s:?}"),
            }
        }
    })
    .await
}

/// Maps host node `node` to `member_node` of member "e2e" (the labels the
/// registrar or an admin would set); `None` removes the mapping.
pub async fn map_host_node(host: &Client, node: &str, member_node: Option<&str>) {
    let (member, member_node) = match member_node {
        Some(n) => (Some("e2e"), Some(n)),
        None => (None, None),
    };
    let labels = serde_json::json!({"metadata": {"labels": {
        "topology.relay.csi.dev/member": member,
        "topology.relay.csi.dev/member-node": member_node,
    }}});
    Api::<k8s_openapi::api::core::v1::Node>::all(host.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .expect("label the host node");
}

/// The ControllerPublishVolume request the attacher sends for `vol`.
pub fn publish_request(
    vol: &csi_relay::csi::Volume,
    node: &str,
    cap: csi_relay::csi::VolumeCapability,
) -> csi_relay::csi::ControllerPublishVolumeRequest {
    csi_relay::csi::ControllerPublishVolumeRequest {
        volume_id: vol.volume_id.clone(),
        node_id: node.to_string(),
        volume_capability: Some(cap),
        volume_context: vol.volume_context.clone(),
        ..Default::default()
    }
}

/// Names of the VolumeAttachments in `vas` that csi-relay made.
pub fn relay_made(vas: &[k8s_openapi::api::storage::v1::VolumeAttachment]) -> Vec<String> {
    vas.iter()
        .filter(|va| {
            va.metadata.labels.as_ref().is_some_and(|l| {
                l.get("app.kubernetes.io/managed-by").map(String::as_str) == Some("csi-relay")
            })
        })
        .filter_map(|va| va.metadata.name.clone())
        .collect()
}

/// The names of the attachments the relay made for volume `id` (labelled
/// with its uuid), among `vas`.
pub fn relay_made_for(
    vas: &[k8s_openapi::api::storage::v1::VolumeAttachment],
    id: &str,
) -> Vec<String> {
    let uuid = id.rsplit('-').next().unwrap_or_default();
    vas.iter()
        .filter(|va| {
            va.metadata.labels.as_ref().is_some_and(|l| {
                l.get("app.kubernetes.io/managed-by").map(String::as_str) == Some("csi-relay")
                    && l.get(csi_relay::k8s::naming::VOLUME_UUID_LABEL)
                        .map(String::as_str)
                        == Some(uuid)
            })
        })
        .filter_map(|va| va.metadata.name.clone())
        .collect()
}

/// Waits until a VolumeAttachment of PV `pv` is attached; returns its name.
pub async fn attached_va(
    what: &str,
    api: &Api<k8s_openapi::api::storage::v1::VolumeAttachment>,
    pv: &str,
) -> String {
    eventually(what, Duration::from_secs(90), || {
        let (api, pv) = (api.clone(), pv.to_string());
        async move {
            api.list(&kube::api::ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|va| {
                    va.spec.source.persistent_volume_name.as_deref() == Some(pv.as_str())
                        && va.status.as_ref().is_some_and(|s| s.attached)
                })
                .and_then(|va| va.metadata.name)
        }
    })
    .await
}

/// A CreateVolume for a member volume of `bytes` in the environment's
/// member class and namespace, single-node-writer mount access.
pub fn member_create(env: &Env, name: &str, bytes: i64) -> csi_relay::csi::CreateVolumeRequest {
    let mut req = crate::common::req::create(name, bytes, crate::common::req::snw());
    req.parameters = [
        ("member".to_string(), "e2e".to_string()),
        ("memberStorageClass".to_string(), env.storage_class.clone()),
        ("memberNamespace".to_string(), env.namespace.clone()),
    ]
    .into();
    req
}

/// Starts a relay serving from the environment's member cluster (named
/// `e2e`), its RelayVolumes in the host, with `extra` flags.
pub async fn start_member_relay(env: &Env, node_id: &str, extra: &[&str]) -> crate::common::Driver {
    let member_arg = format!("e2e={}", env.relay_member_kubeconfig);
    let mut args = vec![
        "--backend",
        "member",
        "--member",
        member_arg.as_str(),
        "--host-kubeconfig",
        env.host_kubeconfig.as_str(),
    ];
    args.extend_from_slice(extra);
    crate::common::Driver::start_as(node_id, &args).await
}

/// A controller with `--leader-election` (Leases in `default`) as driver
/// `driver`, its host reached through `host_kubeconfig`; it may stand by
/// (see `Driver::start_standby`).
pub async fn start_elected_relay(
    env: &Env,
    node_id: &str,
    host_kubeconfig: &str,
    driver: &str,
) -> crate::common::Driver {
    let member_arg = format!("e2e={}", env.relay_member_kubeconfig);
    crate::common::Driver::start_standby(
        node_id,
        &[
            "--mode",
            "controller",
            "--backend",
            "member",
            "--member",
            &member_arg,
            "--host-kubeconfig",
            host_kubeconfig,
            "--leader-election",
            "--leader-election-namespace",
            "default",
            "--leader-election-lease-seconds",
            "10",
            "--driver-name",
            driver,
        ],
    )
    .await
}

/// kubelet's plugins dir as the relay sees it: `driver`'s node plugin
/// socket at `<dir>/<driver>/csi.sock`.
pub fn plugins_dir(driver: &str, sock: &str) -> tempfile::TempDir {
    let plugins = tempfile::tempdir().expect("plugins dir");
    std::fs::create_dir_all(plugins.path().join(driver)).expect("plugin dir");
    std::os::unix::fs::symlink(sock, plugins.path().join(driver).join("csi.sock"))
        .expect("plugin socket link");
    plugins
}

/// Unwinds volumes as the CO would: ControllerUnpublishVolume from `node`,
/// then DeleteVolume, each retried until it succeeds.
pub async fn unwind(
    controller: &csi_relay::csi::controller_client::ControllerClient<tonic::transport::Channel>,
    ids: &[String],
    node: &str,
) {
    for id in ids {
        unpublish_until_ok(controller, id, node).await;
        delete_until_ok(controller, id).await;
    }
}

/// ControllerUnpublishVolume of `id` from `node`, retried as the CO does
/// until it succeeds.
pub async fn unpublish_until_ok(
    controller: &csi_relay::csi::controller_client::ControllerClient<tonic::transport::Channel>,
    id: &str,
    node: &str,
) {
    until_ok("ControllerUnpublishVolume", || {
        let mut c = controller.clone();
        let req = csi_relay::csi::ControllerUnpublishVolumeRequest {
            volume_id: id.to_string(),
            node_id: node.to_string(),
            ..Default::default()
        };
        async move { c.controller_unpublish_volume(req).await }
    })
    .await;
}

/// DeleteVolume of `id`, retried as the CO does until it succeeds.
pub async fn delete_until_ok(
    controller: &csi_relay::csi::controller_client::ControllerClient<tonic::transport::Channel>,
    id: &str,
) {
    until_ok("DeleteVolume", || {
        let mut c = controller.clone();
        let req = csi_relay::csi::DeleteVolumeRequest {
            volume_id: id.to_string(),
            ..Default::default()
        };
        async move { c.delete_volume(req).await }
    })
    .await;
}

/// The CO's volume name a relay-made member PVC carries.
pub fn volume_name_of(pvc: &k8s_openapi::api::core::v1::PersistentVolumeClaim) -> Option<&str> {
    pvc.metadata
        .annotations
        .as_ref()?
        .get("relay.csi.dev/volume-name")
        .map(String::as_str)
}

/// The host and member clients, the CRD installed, and the host node
/// (RELAY_E2E_HOST_NODE, default "host-node-1") mapped to the
/// environment's member node "member-node-1".
pub async fn mapped_clusters(env: &Env) -> (Client, Client, String) {
    let host = client(&env.host_kubeconfig).await;
    let member = client(&env.member_kubeconfig).await;
    install_crd(&host).await;
    let host_node = std::env::var("RELAY_E2E_HOST_NODE").unwrap_or_else(|_| "host-node-1".into());
    map_host_node(&host, &host_node, Some("member-node-1")).await;
    (host, member, host_node)
}

/// Waits until the member holds no PVC whose volume name starts with
/// `prefix` and no attachment the relay made: of the volumes `only` names,
/// or (`None`) of any volume, for a test that cannot name its own (an
/// earlier test's leftovers then count too).
pub async fn nothing_left_in_member(
    member: &Client,
    namespace: &str,
    prefix: &str,
    only: Option<&[String]>,
) {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use kube::api::ListParams;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(member.clone(), namespace);
    let vas: Api<VolumeAttachment> = Api::all(member.clone());
    eventually(
        "no member PVC and no relay-made member attachment",
        Duration::from_secs(120),
        || {
            let (pvcs, vas, prefix) = (pvcs.clone(), vas.clone(), prefix.to_string());
            async move {
                let left_pvcs = pvcs
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .filter(|p| volume_name_of(p).is_some_and(|n| n.starts_with(&prefix)))
                    .count();
                let all = vas.list(&ListParams::default()).await.ok()?.items;
                let left_vas = match only {
                    Some(ids) => ids.iter().map(|id| relay_made_for(&all, id).len()).sum(),
                    None => relay_made(&all).len(),
                };
                (left_pvcs == 0 && left_vas == 0).then_some(())
            }
        },
    )
    .await;
}

/// CreateVolume of `name` on the environment's member, retried as the CO
/// does until it succeeds.
pub async fn create_until_ok(
    controller: &csi_relay::csi::controller_client::ControllerClient<tonic::transport::Channel>,
    env: &Env,
    name: &str,
    bytes: i64,
) -> csi_relay::csi::Volume {
    until_ok("CreateVolume", || {
        let mut c = controller.clone();
        let req = member_create(env, name, bytes);
        async move { c.create_volume(req).await }
    })
    .await
    .into_inner()
    .volume
    .expect("a volume")
}

/// A sidecar (or any helper process), stopped (by PID) when dropped.
pub struct Sidecar(std::process::Child);

impl Sidecar {
    pub fn start(binary: &std::path::Path, args: &[String], log: &std::path::Path) -> Sidecar {
        let log = std::fs::File::create(log).expect("sidecar log");
        let child = std::process::Command::new(binary)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        Sidecar(child)
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The host's external-provisioner (with --extra-create-metadata) and
/// external-attacher from `bin`, against `relay`; stopped when dropped.
/// They exit when the relay does: start them again after a restart.
pub fn host_sidecars(
    relay: &crate::common::Driver,
    host_kubeconfig: &str,
    bin: &std::path::Path,
) -> [Sidecar; 2] {
    let args = |extra: &[&str]| sidecar_args(&relay.socket, host_kubeconfig, extra);
    [
        Sidecar::start(
            &bin.join("csi-provisioner"),
            &args(&["--extra-create-metadata"]),
            &relay.path("csi-provisioner.log"),
        ),
        Sidecar::start(
            &bin.join("csi-attacher"),
            &args(&[]),
            &relay.path("csi-attacher.log"),
        ),
    ]
}

/// A stock sidecar's flags against the relay at `socket`, on the host
/// cluster of `kubeconfig`, with `extra` flags.
pub fn sidecar_args(socket: &std::path::Path, kubeconfig: &str, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        format!("--csi-address={}", socket.display()),
        format!("--kubeconfig={kubeconfig}"),
        "--leader-election=false".to_string(),
        "--timeout=60s".to_string(),
        "-v=3".to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// The args deploy/ adds to sidecar `container` on the environments'
/// Kubernetes (v1.28): those of its component deploy/kubernetes-1.28-1.31,
/// so a sidecar run here as a process runs as deploy/ runs it there.
pub fn deploy_gates_for_1_28(container: &str) -> Vec<String> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/kubernetes-1.28-1.31/kustomization.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let component: serde_json::Value =
        serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = Vec::new();
    for patch in component["patches"].as_array().into_iter().flatten() {
        let ops: serde_json::Value = serde_saphyr::from_str(patch["patch"].as_str().unwrap_or(""))
            .unwrap_or_else(|e| panic!("{}: a patch: {e}", path.display()));
        let mut named = None;
        for op in ops.as_array().into_iter().flatten() {
            match (op["op"].as_str(), op["value"].as_str()) {
                (Some("test"), Some(name)) => named = Some(name.to_string()),
                (Some("add"), Some(arg)) if named.as_deref() == Some(container) => {
                    out.push(arg.to_string())
                }
                _ => {}
            }
        }
    }
    out
}

/// What a real kubelet node (`tests/e2e-env/kubelet`) needs on this machine,
/// plus `bins` in `$E2E_HOME/bin` and `tools` on PATH: `$E2E_HOME`, or why
/// the test cannot run here.
pub fn kubelet_node_home(bins: &[&str], tools: &[&str]) -> Result<std::path::PathBuf, String> {
    let home = std::path::PathBuf::from(std::env::var("E2E_HOME").map_err(|_| "no E2E_HOME")?);
    for bin in ["kubelet", "kube-scheduler", "pause"].iter().chain(bins) {
        if !home.join("bin").join(bin).is_file() {
            return Err(format!("{bin} missing in $E2E_HOME/bin"));
        }
    }
    for tool in ["containerd"].iter().chain(tools) {
        let found = std::process::Command::new("sh")
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
    Ok(home)
}

/// An environment a project script under `tests/<dir>/` adds on a machine
/// (`<script> RUN_DIR`, with E2E_HOME): its run dir, and its down script,
/// which runs when this is dropped, also after a failed assertion.
pub struct ScriptedEnv {
    pub run: tempfile::TempDir,
    e2e_home: std::path::PathBuf,
    dir: &'static str,
    down: &'static str,
    env: Vec<(&'static str, String)>,
}

impl ScriptedEnv {
    /// A fresh run dir for the scripts of `tests/<dir>/`; `env` is given to
    /// every script.
    pub fn new(
        dir: &'static str,
        down: &'static str,
        e2e_home: &std::path::Path,
        env: Vec<(&'static str, String)>,
    ) -> ScriptedEnv {
        let run = tempfile::Builder::new()
            .prefix(&format!("relay-{dir}-"))
            .tempdir()
            .expect("run dir");
        ScriptedEnv {
            run,
            e2e_home: e2e_home.to_path_buf(),
            dir,
            down,
            env,
        }
    }

    /// `tests/<dir>/<name> RUN_DIR`, ready to run.
    pub fn command(&self, name: &str) -> std::process::Command {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests")
            .join(self.dir)
            .join(name);
        let mut c = std::process::Command::new(script);
        c.arg(self.run.path()).env("E2E_HOME", &self.e2e_home);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    /// Runs `tests/<dir>/<name> RUN_DIR` and asserts that it succeeded.
    pub fn run(&self, name: &str) {
        self.run_with(name, &[]);
    }

    /// Runs `tests/<dir>/<name> RUN_DIR ARGS...` and asserts that it succeeded.
    pub fn run_with(&self, name: &str, args: &[&str]) {
        let status = self
            .command(name)
            .args(args)
            .status()
            .unwrap_or_else(|e| panic!("run tests/{}/{name}: {e}", self.dir));
        assert!(
            status.success(),
            "tests/{}/{name} failed: {status}",
            self.dir
        );
    }
}

impl Drop for ScriptedEnv {
    fn drop(&mut self) {
        let status = self.command(self.down).status();
        if !status.is_ok_and(|s| s.success()) {
            eprintln!(
                "tests/{}/{} did not finish cleanly; see {}",
                self.dir,
                self.down,
                self.run.path().display()
            );
        }
    }
}
