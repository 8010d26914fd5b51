//! The seed's demo with the member storage people run under Kosmos, on the
//! real member kubelet: openebs dynamic-localpv-provisioner
//! (`openebs-hostpath`: `local` PVs), rancher local-path-provisioner
//! (`local-path`: `hostPath` PVs) and csi-driver-host-path (CSI).
//!
//! `tests/kosmos/env-up.sh` and `demo-up.sh` start Kosmos, member1's real
//! kubelet node member-kl-1 with the three provisioners, a host scheduler
//! and a real host kubelet node demo-kl-1 that stands for member-kl-1. This
//! test runs a csi-relay controller (member backend, virtual-node registrar)
//! with the stock provisioner and attacher under deploy/'s flags, and a
//! csi-relay node plugin on demo-kl-1. For each member class:
//! - **On a Kosmos node**: a host StorageClass WaitForFirstConsumer naming
//!   no member, a Deployment placed on `kosmos-member1` by the stock
//!   scheduler; the pod Running in the member, its token in the member's
//!   directory, `kubectl rollout restart`, the new pod reads the token back;
//!   everything deleted and nothing left in either cluster (the member
//!   directory included, and no PV copied into the host by Kosmos).
//! - **On a host node** (demo-kl-1, mapped to member-kl-1, which this machine
//!   is): the same Deployment runs there on the relay's mount of the
//!   member volume, and keeps its data across a rollout.
//! - **Where the volume cannot be reached** (`local`/`hostPath` only): the
//!   host node is mapped to another member node; a new pod of the
//!   Deployment is refused at ControllerPublishVolume with a message naming
//!   the member node that holds the directory, and its container never
//!   starts; mapped back, the pod runs and reads the token: its data, never
//!   an empty directory.
//!
//! Run by `kosmos_demo_e2e`, in the Kosmos environment it shares with
//! global storage.

use crate::e2e_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_relay::k8s::relay_volume::RelayVolume;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};

use e2e_support::demo_relay::{DemoRelay, Prerequisites};
use e2e_support::{apply, client, eventually, pods, ScriptedEnv};

const DRIVER: &str = "relay.csi.dev";
/// The busybox image the kubelet scripts import on every node.
const IMAGE: &str = "localhost/busybox:1.35";
const WAIT: Duration = Duration::from_secs(180);
const KOSMOS_NODE: &str = "kosmos-member1";
/// tests/kosmos/settings.sh: DEMO_NODE, KL_NODE.
const HOST_NODE: &str = "demo-kl-1";
const MEMBER_NODE: &str = "member-kl-1";
/// member1's fake node (no kubelet): a member node the host node is not.
const OTHER_MEMBER_NODE: &str = "member-node-1";
const MEMBER_NODE_LABEL: &str = "topology.relay.csi.dev/member-node";

/// Where a member class keeps a volume's data on member-kl-1's disk.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// A CSI PV of csi-driver-host-path: its state dir holds one directory
    /// per volume handle.
    Csi,
    /// A `local` PV (openebs).
    Local,
    /// A `hostPath` PV (local-path).
    HostPath,
}

#[derive(Clone, Copy, Debug)]
struct Class {
    member_class: &'static str,
    kind: Kind,
    /// Short, for namespace names.
    tag: &'static str,
}

const CLASSES: [Class; 3] = [
    Class {
        member_class: "openebs-hostpath",
        kind: Kind::Local,
        tag: "openebs",
    },
    Class {
        member_class: "local-path",
        kind: Kind::HostPath,
        tag: "localpath",
    },
    Class {
        member_class: "kl-hostpath-wffc",
        kind: Kind::Csi,
        tag: "hostpath",
    },
];

impl Class {
    fn host_class(&self) -> String {
        format!("demo-{}", self.member_class)
    }
}

struct Ctx {
    host: Client,
    member: Client,
    /// member-kl-1's hostpath state dir.
    hostpath_state: PathBuf,
    tag: String,
}

fn seconds(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

/// The pod writes a token into a fresh volume, or copies the token it finds
/// into `seen-<its name>`: the next pod proves it read the first one's data.
fn deployment(node: &str, token: &str) -> Value {
    let script = "if [ -f /data/token ]; then cp /data/token /data/seen-$POD_NAME; \
                  else echo $TOKEN > /data/token; fi; sleep 3600";
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "demo"}},
            "template": {"metadata": {"labels": {"app": "demo"}},
                "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                    "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
                    "tolerations": [{"key": "kosmos.io/node", "operator": "Exists"}],
                    "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", script],
                        "env": [{"name": "TOKEN", "value": token},
                                {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                        "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
                    "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}}}})
}

impl Ctx {
    async fn namespace(&self, name: &str) -> String {
        let ns = format!("{name}-{}", self.tag);
        e2e_support::admitting_namespace(&self.host, &ns).await;
        ns
    }

    async fn claim_and_deployment(&self, ns: &str, class: &Class, node: &str, token: &str) {
        let pvc = json!({"metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class.host_class(),
                     "resources": {"requests": {"storage": "16Mi"}}}});
        Api::<PersistentVolumeClaim>::namespaced(self.host.clone(), ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(pvc).expect("pvc"),
            )
            .await
            .expect("create host PVC");
        Api::<Deployment>::namespaced(self.host.clone(), ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(deployment(node, token)).expect("deployment"),
            )
            .await
            .expect("create Deployment");
    }

    /// A pod of the Deployment Running in `cluster` other than `not`.
    async fn pod_running(&self, cluster: &Client, ns: &str, not: Option<&str>) -> String {
        pods::one_running(cluster, ns, "app=demo", not, WAIT).await
    }

    /// The member claim `ns/data` Bound by the relay: its PV.
    async fn member_pv(&self, ns: &str) -> PersistentVolume {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.member.clone(), ns);
        let pvs: Api<PersistentVolume> = Api::all(self.member.clone());
        eventually(
            &format!("the relay's member claim {ns}/data Bound"),
            WAIT,
            || {
                let (claims, pvs) = (claims.clone(), pvs.clone());
                async move {
                    let claim = claims.get_opt("data").await.ok().flatten()?;
                    claim
                        .metadata
                        .annotations
                        .as_ref()?
                        .get("relay.csi.dev/volume-id")?;
                    let pv = claim.spec?.volume_name?;
                    pvs.get_opt(&pv).await.ok().flatten()
                }
            },
        )
        .await
    }

    /// The directory on member-kl-1's disk that holds the member PV's data.
    fn data_dir(&self, class: &Class, pv: &PersistentVolume) -> PathBuf {
        let spec = pv.spec.as_ref().expect("PV spec");
        let dir = match class.kind {
            Kind::Csi => {
                let handle = &spec.csi.as_ref().expect("a CSI PV").volume_handle;
                self.hostpath_state.join(handle)
            }
            Kind::Local => PathBuf::from(&spec.local.as_ref().expect("a local PV").path),
            Kind::HostPath => PathBuf::from(&spec.host_path.as_ref().expect("a hostPath PV").path),
        };
        assert!(
            dir.is_absolute() && !dir.as_os_str().is_empty(),
            "{class:?}: {}",
            dir.display()
        );
        dir
    }

    async fn file_says(path: &Path, want: &str) {
        pods::file_says(path, want, WAIT).await
    }

    /// `kubectl rollout restart deployment/app`.
    async fn rollout_restart(&self, ns: &str) {
        let at = format!("{:?}", std::time::SystemTime::now());
        Api::<Deployment>::namespaced(self.host.clone(), ns)
            .patch(
                "app",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"template": {"metadata": {"annotations": {
                    "kubectl.kubernetes.io/restartedAt": at}}}}})),
            )
            .await
            .expect("rollout restart");
    }

    async fn scale(&self, ns: &str, replicas: i32) {
        Api::<Deployment>::namespaced(self.host.clone(), ns)
            .patch(
                "app",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await
            .expect("scale the Deployment");
    }

    /// Until no pod of the Deployment is left in `cluster`; pods of a Kosmos
    /// node are left to the host by Kosmos (no kubelet ends them there) and
    /// are removed once their member pod is gone.
    async fn pods_gone(&self, cluster: &Client, ns: &str, force_host: bool) {
        let pods: Api<Pod> = Api::namespaced(cluster.clone(), ns);
        eventually(&format!("no pod of {ns}/app"), WAIT, || {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(&ListParams::default().labels("app=demo"))
                    .await
                    .ok()?;
                list.items.is_empty().then_some(())
            }
        })
        .await;
        if force_host {
            let host_pods: Api<Pod> = Api::namespaced(self.host.clone(), ns);
            let now = DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            };
            let _ = host_pods
                .delete_collection(&now, &ListParams::default().labels("app=demo"))
                .await;
        }
    }

    /// Deletes the Deployment and then the claim; waits until neither
    /// cluster holds anything of them, on disk included.
    async fn delete_and_check_nothing_left(&self, ns: &str, on_kosmos: bool, dir: &Path) {
        Api::<Deployment>::namespaced(self.host.clone(), ns)
            .delete("app", &DeleteParams::foreground())
            .await
            .expect("delete the Deployment");
        if on_kosmos {
            self.pods_gone(&self.member, ns, true).await;
        }
        self.pods_gone(&self.host, ns, false).await;
        let host_claims: Api<PersistentVolumeClaim> = Api::namespaced(self.host.clone(), ns);
        host_claims
            .delete("data", &DeleteParams::default())
            .await
            .expect("delete host PVC");
        let host_pvc = format!("{ns}/data");
        let (host, member) = (self.host.clone(), self.member.clone());
        eventually(&format!("nothing left of {host_pvc}"), WAIT, || {
            let (host, member, host_pvc) = (host.clone(), member.clone(), host_pvc.clone());
            async move {
                let claimed = |pv: &PersistentVolume| {
                    pv.spec
                        .as_ref()
                        .and_then(|s| s.claim_ref.as_ref())
                        .is_some_and(|c| {
                            format!(
                                "{}/{}",
                                c.namespace.as_deref().unwrap_or_default(),
                                c.name.as_deref().unwrap_or_default()
                            ) == host_pvc
                        })
                };
                // A host PV of the claim: the relay's, or a copy of the
                // member's that Kosmos's PV sync made.
                let host_pvs = Api::<PersistentVolume>::all(host.clone())
                    .list(&ListParams::default())
                    .await
                    .ok()?;
                let member_pvs = Api::<PersistentVolume>::all(member.clone())
                    .list(&ListParams::default())
                    .await
                    .ok()?;
                let rvs = Api::<RelayVolume>::all(host.clone())
                    .list(&ListParams::default())
                    .await
                    .ok()?;
                let (ns, name) = host_pvc.split_once('/')?;
                let host_claim = Api::<PersistentVolumeClaim>::namespaced(host, ns)
                    .get_opt(name)
                    .await
                    .ok()?;
                let member_claim = Api::<PersistentVolumeClaim>::namespaced(member, ns)
                    .get_opt(name)
                    .await
                    .ok()?;
                let left = host_claim.is_some()
                    || member_claim.is_some()
                    || host_pvs.items.iter().any(claimed)
                    || member_pvs.items.iter().any(claimed)
                    || rvs
                        .items
                        .iter()
                        .any(|rv| rv.spec.host_pvc.as_deref() == Some(host_pvc.as_str()));
                (!left).then_some(())
            }
        })
        .await;
        eventually(&format!("{} removed", dir.display()), WAIT, || async move {
            (!dir.exists()).then_some(())
        })
        .await;
    }

    /// The seed's demo on the Kosmos node; returns the time to the first
    /// pod Running and to the restarted one.
    async fn on_kosmos(&self, class: Class) -> (Duration, Duration) {
        let ns = self.namespace(&format!("k-{}", class.tag)).await;
        let token = format!("kosmos-{}-{}", class.tag, self.tag);
        let started = Instant::now();
        self.claim_and_deployment(&ns, &class, KOSMOS_NODE, &token)
            .await;
        let first = self.pod_running(&self.member, &ns, None).await;
        let running = started.elapsed();
        let pv = self.member_pv(&ns).await;
        let dir = self.data_dir(&class, &pv);
        Self::file_says(&dir.join("token"), &token).await;
        let restarted = Instant::now();
        self.rollout_restart(&ns).await;
        let second = self.pod_running(&self.member, &ns, Some(&first)).await;
        Self::file_says(&dir.join(format!("seen-{second}")), &token).await;
        let rolled = restarted.elapsed();
        self.delete_and_check_nothing_left(&ns, true, &dir).await;
        let _ = Api::<Namespace>::all(self.host.clone())
            .delete(&ns, &DeleteParams::default())
            .await;
        (running, rolled)
    }

    /// The Deployment on the host node: Running on the relay's mount of
    /// the member volume, across a rollout. Returns the namespace, the
    /// token, the data dir and the time to the first pod Running.
    async fn on_host_node(&self, class: Class) -> (String, String, PathBuf, Duration) {
        let ns = self.namespace(&format!("h-{}", class.tag)).await;
        let token = format!("host-{}-{}", class.tag, self.tag);
        let started = Instant::now();
        self.claim_and_deployment(&ns, &class, HOST_NODE, &token)
            .await;
        let first = self.pod_running(&self.host, &ns, None).await;
        let running = started.elapsed();
        let pv = self.member_pv(&ns).await;
        let dir = self.data_dir(&class, &pv);
        Self::file_says(&dir.join("token"), &token).await;
        self.rollout_restart(&ns).await;
        let second = self.pod_running(&self.host, &ns, Some(&first)).await;
        Self::file_says(&dir.join(format!("seen-{second}")), &token).await;
        (ns, token, dir, running)
    }

    async fn map_host_node(&self, member_node: &str) {
        Api::<Node>::all(self.host.clone())
            .patch(
                HOST_NODE,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {MEMBER_NODE_LABEL: member_node}}})),
            )
            .await
            .expect("map the host node");
    }

    /// Until the host's attach/detach controller has detached `ns/data`
    /// from the host node.
    async fn detached(&self, ns: &str) {
        let pv = pods::host_pv(&self.host, ns, "data").await;
        pods::detached(&self.host, &pv, HOST_NODE, WAIT).await
    }

    /// The attach error of the VolumeAttachment of `ns/data`'s PV on the
    /// host node.
    async fn attach_error(&self, ns: &str) -> String {
        let pv = pods::host_pv(&self.host, ns, "data").await;
        pods::attach_error(&self.host, &pv, HOST_NODE, WAIT).await
    }

    /// No container of the Deployment's pods in `ns` has started.
    async fn no_container_started(&self, ns: &str) {
        let pods = Api::<Pod>::namespaced(self.host.clone(), ns)
            .list(&ListParams::default().labels("app=demo"))
            .await
            .expect("list pods");
        for pod in pods.items {
            let status = pod.status.unwrap_or_default();
            assert_ne!(
                status.phase.as_deref(),
                Some("Running"),
                "{:?}",
                pod.metadata.name
            );
            for c in status.container_statuses.into_iter().flatten() {
                let started = c.state.as_ref().is_some_and(|s| s.running.is_some())
                    || c.last_state
                        .as_ref()
                        .is_some_and(|s| s.terminated.is_some());
                assert!(
                    !started,
                    "container of {:?} started: {c:?}",
                    pod.metadata.name
                );
            }
        }
    }
}

/// The seed's demo with every member class, in the Kosmos environment
/// `kosmos` (env-up.sh and demo-up.sh run), which `kosmos_demo_e2e` shares
/// with global storage.
pub(crate) async fn run(pre: &Prerequisites, kosmos: &ScriptedEnv) {
    let demo = kosmos.run.path().join("demo");
    let env = &pre.env;
    let host = client(&env.host_kubeconfig).await;
    let ctx = Ctx {
        host: host.clone(),
        member: client(&env.member_kubeconfig).await,
        hostpath_state: kosmos.run.path().join("lab/csi/hostpath-state"),
        tag: format!("{}", std::process::id()),
    };

    e2e_support::install_crd(&host).await;
    e2e_support::install_csidriver(&host).await;
    let classes: Api<StorageClass> = Api::all(host.clone());
    for class in CLASSES {
        let name = class.host_class();
        apply(
            &classes,
            &name,
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                   "metadata": {"name": name}, "provisioner": DRIVER,
                   "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete",
                   "parameters": {"memberStorageClass": class.member_class,
                                  "createMemberNamespace": "true"}}),
        )
        .await;
    }

    // The controller, as deploy/ runs it (the relay's own member identity),
    // the stock sidecars with deploy/'s flags, and demo-kl-1's node plugin.
    let member1 = format!("member1={}", env.relay_member_kubeconfig);
    let relay = DemoRelay::start(env, &pre.sidecars, &[member1], &[], &demo, "member1").await;
    pods::relay_registered(&host, DRIVER, KOSMOS_NODE, WAIT).await;
    pods::relay_registered(&host, DRIVER, HOST_NODE, WAIT).await;

    // On the Kosmos node, every class at once.
    let kosmos_runs = futures::future::join_all(CLASSES.iter().map(|c| ctx.on_kosmos(*c))).await;
    for (class, (running, rolled)) in CLASSES.iter().zip(&kosmos_runs) {
        println!(
            "figure: demo on {KOSMOS_NODE}, member class {}: pod Running {} s after apply, restarted pod read the data {} s after rollout restart; nothing left after delete",
            class.member_class,
            seconds(*running),
            seconds(*rolled)
        );
    }

    // On the host node that stands for member-kl-1, every class at once.
    let host_runs = futures::future::join_all(CLASSES.iter().map(|c| ctx.on_host_node(*c))).await;
    for (class, (_, _, _, running)) in CLASSES.iter().zip(&host_runs) {
        println!(
            "figure: demo on host node {HOST_NODE}, member class {}: pod Running {} s after apply, data kept across a rollout",
            class.member_class,
            seconds(*running)
        );
    }
    // The CSI class is done here; the directories are off to the refusal.
    let mut pinned = Vec::new();
    for (class, (ns, token, dir, _)) in CLASSES.iter().zip(host_runs) {
        if class.kind == Kind::Csi {
            ctx.delete_and_check_nothing_left(&ns, false, &dir).await;
            let _ = Api::<Namespace>::all(host.clone())
                .delete(&ns, &DeleteParams::default())
                .await;
        } else {
            ctx.scale(&ns, 0).await;
            pinned.push((*class, ns, token, dir));
        }
    }
    for (_, ns, _, _) in &pinned {
        ctx.pods_gone(&host, ns, false).await;
        ctx.detached(ns).await;
    }

    // Mapped to a member node that does not hold the directory: refused,
    // and no container starts on anything.
    ctx.map_host_node(OTHER_MEMBER_NODE).await;
    for (_, ns, _, _) in &pinned {
        ctx.scale(ns, 1).await;
    }
    for (class, ns, _, _) in &pinned {
        let error = ctx.attach_error(ns).await;
        assert!(
            error.contains(&format!(
                "is a directory on the disk of member node {MEMBER_NODE}; this host node stands for member node {OTHER_MEMBER_NODE}, where it is not"
            )) && error.contains(&format!("{MEMBER_NODE_LABEL}={MEMBER_NODE}")),
            "{}: {error}",
            class.member_class
        );
        println!(
            "figure: demo on host node {HOST_NODE} mapped to {OTHER_MEMBER_NODE}, member class {}: ControllerPublishVolume refused: {error}",
            class.member_class
        );
    }
    // The kubelet has had the pods all along: still nothing started.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (_, ns, _, _) in &pinned {
        ctx.no_container_started(ns).await;
    }

    // Mapped back: the pods run on their data.
    let remapped = Instant::now();
    ctx.map_host_node(MEMBER_NODE).await;
    for (class, ns, token, dir) in &pinned {
        let pod = ctx.pod_running(&host, ns, None).await;
        Ctx::file_says(&dir.join(format!("seen-{pod}")), token).await;
        println!(
            "figure: demo on host node {HOST_NODE} mapped back to {MEMBER_NODE}, member class {}: pod Running on its data {} s after",
            class.member_class,
            seconds(remapped.elapsed())
        );
    }
    for (_, ns, _, dir) in &pinned {
        ctx.delete_and_check_nothing_left(ns, false, dir).await;
        let _ = Api::<Namespace>::all(host.clone())
            .delete(ns, &DeleteParams::default())
            .await;
    }
    for class in CLASSES {
        let _ = classes
            .delete(&class.host_class(), &DeleteParams::default())
            .await;
    }
    drop(relay);
}
