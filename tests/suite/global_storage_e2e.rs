//! Global storage on real shared storage and real kubelets: one volume that
//! two members reach, and a stateful pod that moves between them with its
//! data.
//!
//! `tests/kosmos/env-up.sh`, `demo-up.sh` and `shared-up.sh` start Kosmos
//! (virtual nodes kosmos-member1, kosmos-member2), a real kubelet node in
//! each member (member-kl-1, member2-kl-1), a real host kubelet node
//! demo-kl-1, and one GlusterFS volume that member1's nodes mount at
//! RUN/shared/member1 and member2's at RUN/shared/member2, each through a
//! FUSE client of its own (nothing else carries data between the members);
//! member1's class `shared-local-path` (local-path-provisioner with
//! `sharedFileSystemPath`) makes hostPath PVs there. This test runs a
//! csi-relay controller serving both members (virtual-node registrar with
//! `--virtual-node-attach`) with the stock provisioner and attacher, a
//! csi-relay node plugin on demo-kl-1, and a host class sharing the volume
//! between member1 and member2. It checks:
//! - **the seed's demo, moved**: a Deployment on kosmos-member1 writes a
//!   token; its node selector changed to kosmos-member2, the new pod runs in
//!   member2 on an import of the volume and reads the token; moved back, it
//!   reads it again in member1 and member2's import is gone;
//! - **ReadWriteOnce in two members at once** is refused: while a pod of
//!   member1 uses the volume, the Deployment's pod on kosmos-member2 waits
//!   and its VolumeAttachment says which member, pod and node hold it; it
//!   starts once that pod is gone;
//! - **a host kubelet node mapped to member2** (demo-kl-1) uses the volume
//!   member1 made, through member2's mount;
//! - **ReadWriteMany across members**: a pod in each member writes its own
//!   file and reads the other's;
//! - **delete**: nothing left in either member, in the host or in the
//!   storage;
//! - `csi-relay check` names a sharing class a member cannot serve (its
//!   member class, or its CSI driver, missing there);
//! - **member1 lost**: its API server and kubelet stopped and its
//!   containers frozen, the controller restarted with `--lost-member
//!   member1 --fence-member member1=...`, the Deployment moved to
//!   kosmos-member2 runs on member1's data (imported from the host PV's
//!   record); member1 resumed, the fence deletes its pods on the volume
//!   (one of them a pod of member1's own, which only the fence ends) and
//!   their heartbeat stops; member1 taken back, the volume is deleted.
//!
//! The RelayVolume lists each import (`status.imports`) with its state.
//!
//! Run by `kosmos_demo_e2e` after the seed's demo, in the same Kosmos
//! environment, when GlusterFS is installed (Debian's glusterfs-server,
//! glusterfs-client).

use crate::e2e_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use csi_relay::k8s::relay_volume::RelayVolume;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};

use e2e_support::demo_relay::{DemoRelay, Prerequisites};
use e2e_support::frozen_member::FrozenMember;
use e2e_support::{apply, client, eventually, pods, ScriptedEnv};

pub(crate) const DRIVER: &str = "relay.csi.dev";
const IMAGE: &str = "localhost/busybox:1.35";
pub(crate) const WAIT: Duration = Duration::from_secs(180);
pub(crate) const KOSMOS1: &str = "kosmos-member1";
pub(crate) const KOSMOS2: &str = "kosmos-member2";
/// tests/kosmos/settings.sh, shared-up.sh.
pub(crate) const HOST_NODE: &str = "demo-kl-1";
const MEMBER1_NODE: &str = "member-kl-1";
const MEMBER2_NODE: &str = "member2-kl-1";
const MEMBER_CLASS: &str = "shared-local-path";
const MEMBER_KEY: &str = "topology.relay.csi.dev/member";
const MEMBER_NODE_KEY: &str = "topology.relay.csi.dev/member-node";
const IMPORTED_FROM: &str = "relay.csi.dev/imported-from";

/// Runs `tests/kosmos/shared-down.sh RUN` when dropped (before the Kosmos
/// environment's own down script, declared earlier).
struct SharedStorage<'a>(&'a ScriptedEnv);

impl Drop for SharedStorage<'_> {
    fn drop(&mut self) {
        let ok = self
            .0
            .command("shared-down.sh")
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!(
                "tests/kosmos/shared-down.sh did not finish cleanly; see {}",
                self.0.run.path().display()
            );
        }
    }
}

pub(crate) struct Ctx {
    pub(crate) host: Client,
    pub(crate) member1: Client,
    pub(crate) member2: Client,
    pub(crate) tag: String,
}

pub(crate) fn seconds(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

/// A one-pod Deployment (Recreate: a ReadWriteOnce volume is never asked
/// of two pods at once) that writes a token into a fresh volume, or copies
/// the token it finds into `seen-<its name>`.
fn deployment(node: &str, token: &str) -> Value {
    let script = "if [ -f /data/token ]; then cp /data/token /data/seen-$POD_NAME; \
                  else echo $TOKEN > /data/token; fi; sleep 3600";
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app"},
        "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app": "global"}},
            "template": {"metadata": {"labels": {"app": "global"}},
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

/// A pod of the volume's claim on `node` (label app=global) that runs
/// `script` with the volume at /data.
fn pod_on(name: &str, node: &str, script: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "global"}},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
            "automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
            "tolerations": [{"key": "kosmos.io/node", "operator": "Exists"}],
            "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}})
}

/// A pod on `node` that writes `mine` and waits for `theirs`.
fn writer(name: &str, node: &str, mine: &str, theirs: &str) -> Value {
    let script = format!(
        "echo {name} > /data/{mine}; while [ ! -f /data/{theirs} ]; do sleep 0.2; done; \
         cp /data/{theirs} /data/{mine}-read; sleep 3600"
    );
    pod_on(name, node, &script)
}

const APP: &str = "app=global";

pub(crate) async fn file_says(path: &Path, want: &str) {
    pods::file_says(path, want, WAIT).await
}

impl Ctx {
    pub(crate) async fn running_pods(cluster: &Client, ns: &str) -> Vec<String> {
        pods::running(cluster, ns, APP).await
    }

    pub(crate) async fn pod_running(
        &self,
        cluster: &Client,
        ns: &str,
        not: Option<&str>,
    ) -> String {
        pods::one_running(cluster, ns, APP, not, WAIT).await
    }

    pub(crate) async fn pods_gone(cluster: &Client, ns: &str) {
        pods::none_left(cluster, ns, APP, WAIT).await
    }

    /// What the host tells of host pod `pod` failing to attach its volume
    /// (the attach/detach controller's Multi-Attach refusal, or the
    /// relay's answer): the first such event whose message `says`. Others
    /// may come first (ABORTED while another call on the volume runs).
    pub(crate) async fn attach_refusal(
        &self,
        ns: &str,
        pod: &str,
        says: impl Fn(&str) -> bool,
    ) -> String {
        let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(self.host.clone(), ns);
        eventually(&format!("{ns}: why {pod} waits"), WAIT, || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find_map(|e| {
                (e.involved_object.name.as_deref() == Some(pod)
                    && e.reason.as_deref() == Some("FailedAttachVolume"))
                .then_some(e.message)
                .flatten()
                .filter(|m| says(m))
            })
        })
        .await
    }

    pub(crate) async fn detached(&self, ns: &str, node: &str) {
        let pv = pods::host_pv(&self.host, ns, "data").await;
        pods::detached(&self.host, &pv, node, WAIT).await
    }

    pub(crate) async fn namespace(&self, name: &str) -> String {
        let ns = format!("{name}-{}", self.tag);
        e2e_support::admitting_namespace(&self.host, &ns).await;
        ns
    }

    pub(crate) async fn claim(&self, ns: &str, class: &str, mode: &str) {
        let pvc = json!({"metadata": {"name": "data"},
            "spec": {"accessModes": [mode], "storageClassName": class,
                     "resources": {"requests": {"storage": "16Mi"}}}});
        Api::<PersistentVolumeClaim>::namespaced(self.host.clone(), ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(pvc).expect("pvc"),
            )
            .await
            .expect("create host PVC");
    }

    /// The directory of the volume, from a PV of member1 (the origin)
    /// bound to one of the volume's claims there: the data claim of a
    /// single-writer volume (`relay-<uuid>`, which no pod uses) or its
    /// access claim, or a ReadWriteMany volume's claim under the host
    /// claim's name; all name the same directory.
    pub(crate) async fn origin_dir(&self, ns: &str) -> PathBuf {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(self.member1.clone(), ns);
        let pvs: Api<PersistentVolume> = Api::all(self.member1.clone());
        let pv = eventually(&format!("member1's claim of {ns}/data Bound"), WAIT, || {
            let (claims, pvs) = (claims.clone(), pvs.clone());
            async move {
                for claim in claims.list(&ListParams::default()).await.ok()?.items {
                    let ours = claim
                        .metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key("relay.csi.dev/volume-id"));
                    let Some(pv) = claim.spec.and_then(|s| s.volume_name).filter(|_| ours) else {
                        continue;
                    };
                    if let Some(pv) = pvs.get_opt(&pv).await.ok().flatten() {
                        return Some(pv);
                    }
                }
                None
            }
        })
        .await;
        let path = &pv
            .spec
            .and_then(|s| s.host_path)
            .expect("a hostPath PV")
            .path;
        PathBuf::from(path)
    }

    /// `deployment(node, token)` in `ns`.
    pub(crate) async fn deploy(&self, ns: &str, node: &str, token: &str) {
        Api::<Deployment>::namespaced(self.host.clone(), ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(deployment(node, token)).expect("deployment"),
            )
            .await
            .expect("create Deployment");
    }

    pub(crate) async fn move_to(&self, ns: &str, node: &str) {
        Api::<Deployment>::namespaced(self.host.clone(), ns)
            .patch(
                "app",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"template": {"spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node}}}}})),
            )
            .await
            .expect("move the Deployment");
    }

    pub(crate) async fn scale(&self, ns: &str, replicas: i32) {
        Api::<Deployment>::namespaced(self.host.clone(), ns)
            .patch(
                "app",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await
            .expect("scale the Deployment");
    }

    /// Kosmos leaves a virtual node's host pods to the host (no kubelet
    /// ends them): once their member pod is gone they are removed here.
    pub(crate) async fn host_pods_gone(&self, ns: &str) {
        let host_pods: Api<Pod> = Api::namespaced(self.host.clone(), ns);
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        let _ = host_pods
            .delete_collection(&now, &ListParams::default().labels("app=global"))
            .await;
        Self::pods_gone(&self.host, ns).await;
    }

    /// After a move off a Kosmos node: once the old pod's member pod is
    /// gone, its host pod (left Terminating: no kubelet ends it) is removed,
    /// so the Recreate strategy starts the new one.
    pub(crate) async fn old_pod_released(&self, ns: &str, from: &Client) {
        Self::pods_gone(from, ns).await;
        let host_pods: Api<Pod> = Api::namespaced(self.host.clone(), ns);
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        let list = host_pods
            .list(&ListParams::default().labels("app=global"))
            .await
            .expect("list host pods");
        for pod in list.items {
            if pod.metadata.deletion_timestamp.is_some() {
                let name = pod.metadata.name.unwrap_or_default();
                let _ = host_pods.delete(&name, &now).await;
            }
        }
    }

    /// The runbook's step for a lost member's virtual node: its pods,
    /// which no kubelet will confirm, deleted without grace.
    pub(crate) async fn force_delete_host_pods_on(&self, ns: &str, node: &str) {
        let host_pods: Api<Pod> = Api::namespaced(self.host.clone(), ns);
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        let list = host_pods
            .list(&ListParams::default().labels(APP))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        for pod in list {
            if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node) {
                let name = pod.metadata.name.unwrap_or_default();
                let _ = host_pods.delete(&name, &now).await;
            }
        }
    }

    /// The volume's import in member2: (PV, claim) as far as they exist.
    pub(crate) async fn import_in_member2(&self, ns: &str) -> (Option<PersistentVolume>, bool) {
        let pvs = Api::<PersistentVolume>::all(self.member2.clone())
            .list(&ListParams::default().labels(IMPORTED_FROM))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let pv = pvs.into_iter().find(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .is_some_and(|c| c.namespace.as_deref() == Some(ns))
        });
        let claim = Api::<PersistentVolumeClaim>::namespaced(self.member2.clone(), ns)
            .get_opt("data")
            .await
            .ok()
            .flatten()
            .is_some_and(|c| {
                // What the relay made: bound by name to its import PV (a
                // copy may carry every label of it, never this binding).
                let bound_to_import = c
                    .spec
                    .as_ref()
                    .and_then(|s| s.volume_name.as_deref())
                    .is_some_and(|v| v.starts_with("relay-") && v.ends_with("-import"));
                bound_to_import
                    && c.metadata.labels.is_some_and(|l| {
                        l.get(IMPORTED_FROM).map(String::as_str) == Some("member1")
                    })
            });
        (pv, claim)
    }

    /// A claim in member2 as Kosmos copies the host claim (its mark
    /// `kosmos.io/global`, the host's class, the host PV's name), carrying
    /// every label and annotation of the relay's claim in member1.
    pub(crate) async fn plant_marked_copy(&self, ns: &str) {
        let theirs = Api::<PersistentVolumeClaim>::namespaced(self.member1.clone(), ns)
            .get("data")
            .await
            .expect("member1's claim of the volume");
        let host_pv = pods::host_pv(&self.host, ns, "data").await;
        let _ = Api::<Namespace>::all(self.member2.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace"),
            )
            .await;
        let mut annotations = theirs.metadata.annotations.unwrap_or_default();
        annotations.insert("kosmos.io/global".into(), "true".into());
        let copy = json!({"metadata": {"name": "data", "labels": theirs.metadata.labels,
                                       "annotations": annotations},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "global",
                     "volumeName": host_pv, "resources": {"requests": {"storage": "16Mi"}}}});
        Api::<PersistentVolumeClaim>::namespaced(self.member2.clone(), ns)
            .create(
                &PostParams::default(),
                &serde_json::from_value(copy).expect("pvc"),
            )
            .await
            .expect("plant the marked copy in member2");
    }

    /// Until the RelayVolume of `host_pvc` lists exactly these imports,
    /// each as `MEMBER STATE [NODES]`.
    pub(crate) async fn relay_imports_are(&self, host_pvc: &str, want: &[&str]) {
        eventually(
            &format!("the RelayVolume of {host_pvc} lists imports {want:?}"),
            WAIT,
            || async {
                let rvs = Api::<RelayVolume>::all(self.host.clone())
                    .list(&ListParams::default())
                    .await
                    .ok()?;
                let rv = rvs
                    .items
                    .into_iter()
                    .find(|rv| rv.spec.host_pvc.as_deref() == Some(host_pvc))?;
                let shown: Vec<String> = rv
                    .status?
                    .imports
                    .unwrap_or_default()
                    .iter()
                    .map(|i| format!("{} {} [{}]", i.member, i.state, i.nodes.join(",")))
                    .collect();
                (shown == want).then_some(())
            },
        )
        .await;
    }

    pub(crate) async fn import_gone(&self, ns: &str) {
        eventually(
            &format!("member2's import of {ns}/data gone"),
            WAIT,
            || async {
                let (pv, claim) = self.import_in_member2(ns).await;
                (pv.is_none() && !claim).then_some(())
            },
        )
        .await;
    }

    /// Deletes what runs in `ns` and the claim; waits until no cluster
    /// holds anything of it and the directory is gone from the storage,
    /// seen through both members' mounts.
    pub(crate) async fn delete_and_check_nothing_left(&self, ns: &str, dirs: [PathBuf; 2]) {
        let _ = Api::<Deployment>::namespaced(self.host.clone(), ns)
            .delete("app", &DeleteParams::foreground())
            .await;
        let _ = Api::<Pod>::namespaced(self.host.clone(), ns)
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels("app=global"),
            )
            .await;
        Self::pods_gone(&self.member1, ns).await;
        Self::pods_gone(&self.member2, ns).await;
        self.host_pods_gone(ns).await;
        Api::<PersistentVolumeClaim>::namespaced(self.host.clone(), ns)
            .delete("data", &DeleteParams::default())
            .await
            .expect("delete host PVC");
        let host_pvc = format!("{ns}/data");
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let mut left = Vec::new();
            let clusters = [
                ("host", &self.host),
                ("member1", &self.member1),
                ("member2", &self.member2),
            ];
            for (name, cluster) in clusters {
                let pvs = Api::<PersistentVolume>::all(cluster.clone())
                    .list(&ListParams::default())
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default();
                for pv in pvs {
                    let claimed = pv
                        .spec
                        .as_ref()
                        .and_then(|s| s.claim_ref.as_ref())
                        .is_some_and(|c| c.namespace.as_deref() == Some(ns));
                    if claimed {
                        let phase = pv.status.and_then(|s| s.phase).unwrap_or_default();
                        let name_ = pv.metadata.name.unwrap_or_default();
                        left.push(format!("{name}: PersistentVolume {name_} ({phase})"));
                    }
                }
                if let Ok(Some(_)) = Api::<PersistentVolumeClaim>::namespaced(cluster.clone(), ns)
                    .get_opt("data")
                    .await
                {
                    left.push(format!("{name}: PersistentVolumeClaim {ns}/data"));
                }
            }
            if left.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for nothing left of {host_pvc}: {}",
                left.join("; ")
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        for dir in dirs {
            eventually(&format!("{} removed", dir.display()), WAIT, || async {
                (!dir.exists()).then_some(())
            })
            .await;
        }
        let _ = Api::<Namespace>::all(self.host.clone())
            .delete(ns, &DeleteParams::default())
            .await;
    }
}

/// `path` under member1's mount, seen under member2's.
fn through_member2(path: &Path, shared: &Path) -> PathBuf {
    let rest = path
        .strip_prefix(shared.join("member1"))
        .expect("the volume's directory is under member1's mount");
    shared.join("member2").join(rest)
}

/// What global storage needs besides the seed's demo: GlusterFS and ctr.
pub(crate) const TOOLS: [&str; 4] = ["glusterd", "glusterfs", "gluster", "ctr"];

/// Global storage in the Kosmos environment `kosmos` (env-up.sh and
/// demo-up.sh run), which `kosmos_demo_e2e` shares with the seed's demo;
/// shared-up.sh here, shared-down.sh on the way out.
pub(crate) async fn run(pre: &Prerequisites, kosmos: &ScriptedEnv) {
    let _shared_down = SharedStorage(kosmos);
    let started = Instant::now();
    kosmos.run("shared-up.sh");
    println!(
        "figure: shared storage up (GlusterFS, a client per member, member2's kubelet node) in {} s",
        seconds(started.elapsed())
    );
    let run = kosmos.run.path();
    let shared = run.join("shared");
    let demo = run.join("demo");
    let env = &pre.env;
    let host = client(&env.host_kubeconfig).await;
    let member2_kubeconfig = pre.e2e_home.join("run/member2.kubeconfig");
    let member2_relay = pre.e2e_home.join("run/member2-relay.kubeconfig");
    let ctx = Ctx {
        host: host.clone(),
        member1: client(&env.member_kubeconfig).await,
        member2: client(&member2_kubeconfig.display().to_string()).await,
        tag: format!("{}", std::process::id()),
    };
    // No node lifecycle controller lifts a new node's not-ready taint here.
    for node in [KOSMOS1, KOSMOS2] {
        let nodes: Api<Node> = Api::all(host.clone());
        if let Ok(n) = nodes.get(node).await {
            let taints: Vec<Value> = n
                .spec
                .and_then(|s| s.taints)
                .unwrap_or_default()
                .into_iter()
                .filter(|t| t.key != "node.kubernetes.io/not-ready")
                .map(|t| serde_json::to_value(t).expect("taint"))
                .collect();
            let _ = nodes
                .patch(
                    node,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"taints": taints}})),
                )
                .await;
        }
    }

    e2e_support::install_crd(&host).await;
    e2e_support::install_csidriver(&host).await;
    if crate::kosmos_demo_e2e::only_mobility() {
        crate::mobility_e2e::run(pre, kosmos, &ctx).await;
        return;
    }
    let classes: Api<StorageClass> = Api::all(host.clone());
    // StorageClass parameters are immutable: a class a failed run left
    // (another run dir in sharedPaths) is made anew.
    for name in ["global", "global-no-class", "global-no-driver"] {
        let _ = classes.delete(name, &DeleteParams::default()).await;
    }
    let shared_paths = format!(
        "member1={},member2={}",
        shared.join("member1").display(),
        shared.join("member2").display()
    );
    apply(
        &classes,
        "global",
        json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
               "metadata": {"name": "global"}, "provisioner": DRIVER,
               "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": "Delete",
               "parameters": {"member": "member1", "memberStorageClass": MEMBER_CLASS,
                              "sharedWith": "member1,member2", "sharedPaths": shared_paths,
                              "createMemberNamespace": "true"}}),
    )
    .await;

    let member1 = format!("member1={}", env.relay_member_kubeconfig);
    let member2 = format!("member2={}", member2_relay.display());

    // `csi-relay check` names a sharing class a member cannot serve: one
    // that any member may provision, whose member class only member1 has;
    // one of a CSI driver (member1's hostpath) that member2 lacks.
    for (name, params) in [
        (
            "global-no-class",
            json!({"memberStorageClass": MEMBER_CLASS, "sharedWith": "member1,member2"}),
        ),
        (
            "global-no-driver",
            json!({"member": "member1", "memberStorageClass": "kl-hostpath",
                                    "sharedWith": "member1,member2"}),
        ),
    ] {
        apply(
            &classes,
            name,
            json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                   "metadata": {"name": name}, "provisioner": DRIVER, "parameters": params}),
        )
        .await;
    }
    let report = std::process::Command::new(env!("CARGO_BIN_EXE_csi-relay"))
        .args([
            "check",
            "--output",
            "json",
            "--host-kubeconfig",
            &env.host_kubeconfig,
        ])
        .args(["--member", &member1, "--member", &member2])
        .output()
        .expect("run csi-relay check");
    let report: Value = serde_json::from_slice(&report.stdout).expect("check's JSON report");
    for (name, says) in [
        ("global-no-class", format!("member member2 may provision volumes of this class, but has no StorageClass \"{MEMBER_CLASS}\"")),
        ("global-no-driver", "member member2 has no CSIDriver hostpath.kl.csi.k8s.io".to_string()),
        ("global", "member member1 answers and has StorageClass".to_string()),
    ] {
        let finding = report["findings"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|f| f["subject"] == format!("StorageClass {name}"))
            .unwrap_or_else(|| panic!("no finding for {name}: {report}"));
        let message = finding["message"].as_str().unwrap_or_default();
        assert!(message.contains(&says), "{name}: {finding}");
        let want = if name == "global" { "ok" } else { "problem" };
        assert_eq!(finding["status"], want, "{finding}");
        println!("figure: check: StorageClass {name}: {message} ({})", finding["fix"]);
    }
    for name in ["global-no-class", "global-no-driver"] {
        let _ = classes.delete(name, &DeleteParams::default()).await;
    }
    let mut relay = DemoRelay::start(
        env,
        &pre.sidecars,
        &[member1.clone(), member2.clone()],
        &["--virtual-node-attach"],
        &demo,
        "member1",
    )
    .await;
    for node in [KOSMOS1, KOSMOS2, HOST_NODE] {
        pods::relay_registered(&host, DRIVER, node, WAIT).await;
    }

    // ---- The seed's demo, moved to member2 and back.
    let ns = ctx.namespace("moved").await;
    let token = format!("moved-{}", ctx.tag);
    let t = Instant::now();
    ctx.claim(&ns, "global", "ReadWriteOnce").await;
    ctx.deploy(&ns, KOSMOS1, &token).await;
    let first = ctx.pod_running(&ctx.member1, &ns, None).await;
    let dir = ctx.origin_dir(&ns).await;
    let dir2 = through_member2(&dir, &shared);
    file_says(&dir.join("token"), &token).await;
    // The host PV keeps where the data lies, for imports made while
    // member1 is lost.
    let host_pv = Api::<PersistentVolume>::all(host.clone())
        .get(&pods::host_pv(&host, &ns, "data").await)
        .await
        .expect("the host PV");
    let recorded = host_pv
        .spec
        .and_then(|s| s.csi)
        .and_then(|c| c.volume_attributes)
        .and_then(|a| a.get("relay.csi.dev/shared-source").cloned())
        .expect("the shared source in the host PV's attributes");
    assert!(recorded.contains(&dir.display().to_string()), "{recorded}");
    println!(
        "figure: demo on {KOSMOS1}: pod Running in member1 {} s after apply",
        seconds(t.elapsed())
    );

    // What Kosmos made in one run: a copy of the host claim in member2
    // (the host's class, the host PV's name) that carries every mark of
    // the relay's claim in member1. The relay must replace it as any copy.
    ctx.plant_marked_copy(&ns).await;
    let t = Instant::now();
    ctx.move_to(&ns, KOSMOS2).await;
    ctx.old_pod_released(&ns, &ctx.member1).await;
    let in_member2 = ctx.pod_running(&ctx.member2, &ns, None).await;
    let moved = t.elapsed();
    // Written in member2 through member2's own mount, read through member1's.
    file_says(&dir.join(format!("seen-{in_member2}")), &token).await;
    file_says(&dir2.join("token"), &token).await;
    let (pv, claim) = ctx.import_in_member2(&ns).await;
    let pv = pv.expect("member2's import PV");
    let spec = pv.spec.expect("import PV spec");
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    assert_eq!(
        spec.host_path.as_ref().map(|h| PathBuf::from(&h.path)),
        Some(dir2.clone()),
        "the import names the same directory under member2's mount"
    );
    assert!(claim, "member2's claim is the relay's import");
    println!(
        "figure: demo moved {KOSMOS1} -> {KOSMOS2}: the new pod Running in member2 on the import, token read, {} s after the edit",
        seconds(moved)
    );
    // The RelayVolume: made in member1, used in member2 (its observer
    // reads the import's claim as the volume's).
    let host_pvc = format!("{ns}/data");
    let seen = eventually("the RelayVolume shows member2's pod", WAIT, || async {
        let rvs = Api::<RelayVolume>::all(host.clone())
            .list(&ListParams::default())
            .await
            .ok()?;
        let rv = rvs
            .items
            .into_iter()
            .find(|rv| rv.spec.host_pvc.as_deref() == Some(host_pvc.as_str()))?;
        let entry = rv
            .status?
            .nodes?
            .into_iter()
            .find(|n| n.node == format!("member2/{MEMBER2_NODE}"))?;
        (entry.phase.as_deref() == Some("PUBLISHED")).then_some(())?;
        Some((rv.spec.member?, entry.pods.unwrap_or_default()))
    })
    .await;
    assert_eq!(seen.0, "member1", "the member that made it");
    assert_eq!(seen.1, [format!("{ns}/{in_member2}")]);
    let import = format!("member2 IMPORTED [{KOSMOS2}]");
    ctx.relay_imports_are(&host_pvc, &[import.as_str()]).await;

    let t = Instant::now();
    ctx.move_to(&ns, KOSMOS1).await;
    ctx.old_pod_released(&ns, &ctx.member2).await;
    let back = ctx.pod_running(&ctx.member1, &ns, Some(&first)).await;
    let moved_back = t.elapsed();
    file_says(&dir.join(format!("seen-{back}")), &token).await;
    ctx.import_gone(&ns).await;
    ctx.relay_imports_are(&host_pvc, &[]).await;
    println!(
        "figure: demo moved back {KOSMOS2} -> {KOSMOS1}: Running in member1, token read, {} s after the edit; member2's import gone after {} s",
        seconds(moved_back),
        seconds(t.elapsed())
    );

    // ---- ReadWriteOnce: a pod made in member1 by hand, with no host
    // attachment, never reaches the volume: member1 has no claim of it
    // while no host node of member1 is attached (its data claim is under
    // a name no pod looks for). The Deployment moved to member2 runs.
    ctx.scale(&ns, 0).await;
    Ctx::pods_gone(&ctx.member1, &ns).await;
    ctx.host_pods_gone(&ns).await;
    ctx.detached(&ns, KOSMOS1).await;
    let holder = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "holder"},
        "spec": {"nodeName": MEMBER1_NODE, "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", "echo holder >> /data/holder-wrote; sleep 3600"],
                "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}});
    let member1_pods: Api<Pod> = Api::namespaced(ctx.member1.clone(), &ns);
    member1_pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(holder).expect("pod"),
        )
        .await
        .expect("a member1 pod on the volume");
    let t = Instant::now();
    ctx.move_to(&ns, KOSMOS2).await;
    ctx.scale(&ns, 1).await;
    let second = ctx.pod_running(&ctx.member2, &ns, None).await;
    file_says(&dir.join(format!("seen-{second}")), &token).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let phase = member1_pods
        .get("holder")
        .await
        .ok()
        .and_then(|p| p.status?.phase);
    assert_ne!(
        phase.as_deref(),
        Some("Running"),
        "member1's own pod never runs"
    );
    assert!(
        !dir.join("holder-wrote").exists(),
        "member1's own pod never wrote"
    );
    println!(
        "figure: ReadWriteOnce: a pod made in member1 with no host attachment stays {} (no claim of the volume there); the Deployment on {KOSMOS2} Running {} s after",
        phase.as_deref().unwrap_or("?"),
        seconds(t.elapsed())
    );
    member1_pods
        .delete("holder", &DeleteParams::default())
        .await
        .expect("delete the holder");

    // ---- A host kubelet node mapped to member2 uses the volume member1 made.
    ctx.scale(&ns, 0).await;
    Ctx::pods_gone(&ctx.member2, &ns).await;
    ctx.host_pods_gone(&ns).await;
    ctx.detached(&ns, KOSMOS2).await;
    ctx.import_gone(&ns).await;
    let nodes: Api<Node> = Api::all(host.clone());
    nodes
        .patch(
            HOST_NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                MEMBER_KEY: "member2", MEMBER_NODE_KEY: MEMBER2_NODE}}})),
        )
        .await
        .expect("map the host node to member2");
    let t = Instant::now();
    ctx.move_to(&ns, HOST_NODE).await;
    ctx.scale(&ns, 1).await;
    let on_host = ctx.pod_running(&host, &ns, None).await;
    file_says(&dir.join(format!("seen-{on_host}")), &token).await;
    assert!(
        ctx.import_in_member2(&ns).await.1,
        "member2 holds the import the host node uses"
    );
    println!(
        "figure: host node {HOST_NODE} mapped to member2/{MEMBER2_NODE}: pod Running on member1's volume through member2's mount {} s after",
        seconds(t.elapsed())
    );
    ctx.scale(&ns, 0).await;
    Ctx::pods_gone(&host, &ns).await;
    ctx.detached(&ns, HOST_NODE).await;
    ctx.import_gone(&ns).await;
    nodes
        .patch(
            HOST_NODE,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                MEMBER_KEY: "member1", MEMBER_NODE_KEY: MEMBER1_NODE}}})),
        )
        .await
        .expect("map the host node back");
    ctx.delete_and_check_nothing_left(&ns, [dir.clone(), dir2.clone()])
        .await;

    // ---- ReadWriteMany: a pod in each member, each reads the other's file.
    let ns = ctx.namespace("rwx").await;
    ctx.claim(&ns, "global", "ReadWriteMany").await;
    let pods: Api<Pod> = Api::namespaced(host.clone(), &ns);
    for (name, node, mine, theirs) in [
        ("one", KOSMOS1, "from-member1", "from-member2"),
        ("two", KOSMOS2, "from-member2", "from-member1"),
    ] {
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(writer(name, node, mine, theirs)).expect("pod"),
        )
        .await
        .expect("create writer");
    }
    let t = Instant::now();
    let dir = ctx.origin_dir(&ns).await;
    let dir2 = through_member2(&dir, &shared);
    file_says(&dir.join("from-member1-read"), "two").await;
    file_says(&dir.join("from-member2-read"), "one").await;
    file_says(&dir2.join("from-member1-read"), "two").await;
    println!(
        "figure: ReadWriteMany: a pod in member1 and one in member2 each read the other's write {} s after create",
        seconds(t.elapsed())
    );
    ctx.delete_and_check_nothing_left(&ns, [dir, dir2]).await;

    // ---- Races: two pods of one ReadWriteOnce claim, one per member,
    // in both orders, all rounds at once; judged by what each wrote.
    race_rounds(&ctx, &shared, &mut relay).await;

    // ---- Member1 lost: stopped, declared lost, the Deployment moved to
    // member2 runs on its data; member1 back, its pods are fenced.
    let ns = ctx.namespace("lost").await;
    let token = format!("lost-{}", ctx.tag);
    ctx.claim(&ns, "global", "ReadWriteOnce").await;
    ctx.deploy(&ns, KOSMOS1, &token).await;
    let doomed = ctx.pod_running(&ctx.member1, &ns, None).await;
    let dir = ctx.origin_dir(&ns).await;
    let dir2 = through_member2(&dir, &shared);
    file_says(&dir.join("token"), &token).await;
    // A pod of member1's own (no Kosmos behind it, so only the fence can
    // end it) that keeps writing a heartbeat.
    let member1_pods: Api<Pod> = Api::namespaced(ctx.member1.clone(), &ns);
    member1_pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(straggler()).expect("pod"),
        )
        .await
        .expect("member1's straggler");
    let beat = dir.join("beat-straggler");
    eventually("the straggler's heartbeat", WAIT, || async {
        heartbeat(&beat).filter(|n| *n > 2)
    })
    .await;

    let kubelet_lab = run.join("lab");
    let mut member1_stopped = FrozenMember::freeze(
        &pre.e2e_home.join("run/member/pids/kube-apiserver.pid"),
        &kubelet_lab.join("pids/kubelet.pid"),
        &containerd_socket(&kubelet_lab),
    );
    let frozen_at = heartbeat(&beat).expect("a heartbeat");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        heartbeat(&beat),
        Some(frozen_at),
        "nothing in member1 writes while stopped"
    );
    // The runbook: declared lost, with the fence for its return.
    drop(relay);
    let t = Instant::now();
    let fence = format!("member1={}", env.relay_member_kubeconfig);
    relay = DemoRelay::start(
        env,
        &pre.sidecars,
        std::slice::from_ref(&member2),
        &[
            "--virtual-node-attach",
            "--lost-member",
            "member1",
            "--fence-member",
            &fence,
        ],
        &demo,
        "member1",
    )
    .await;
    let serving = t.elapsed();
    ctx.move_to(&ns, KOSMOS2).await;
    // Where the time goes: the host pod placed, its volume attached (the
    // import made), the member pod Running.
    let pv_name = pods::host_pv(&host, &ns, "data").await;
    let steps = std::sync::Mutex::new([None::<Duration>; 2]);
    let in_member2 = eventually("the Deployment's pod Running in member2", WAIT, || async {
        ctx.force_delete_host_pods_on(&ns, KOSMOS1).await;
        let placed = Api::<Pod>::namespaced(host.clone(), &ns)
            .list(&ListParams::default().labels(APP))
            .await
            .is_ok_and(|l| {
                l.items
                    .iter()
                    .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(KOSMOS2))
            });
        let attached = Api::<VolumeAttachment>::all(host.clone())
            .list(&ListParams::default())
            .await
            .is_ok_and(|l| {
                l.items.iter().any(|va| {
                    va.spec.node_name == KOSMOS2
                        && va.spec.source.persistent_volume_name.as_deref()
                            == Some(pv_name.as_str())
                        && va.status.as_ref().is_some_and(|s| s.attached)
                })
            });
        if let Ok(mut seen) = steps.lock() {
            for (i, now) in [placed, attached].into_iter().enumerate() {
                if now && seen[i].is_none() {
                    seen[i] = Some(t.elapsed());
                }
            }
        }
        Ctx::running_pods(&ctx.member2, &ns)
            .await
            .into_iter()
            .next()
    })
    .await;
    let lost_move = t.elapsed();
    let [placed, attached] = steps.lock().map(|s| *s).unwrap_or_default();
    let at = |d: Option<Duration>| d.map(seconds).unwrap_or_else(|| "?".into());
    println!(
        "figure: member1 lost, after the declaration: controller serving {} s, host pod on {KOSMOS2} {} s, attached (import made) {} s, member2 pod Running {} s",
        seconds(serving),
        at(placed),
        at(attached),
        seconds(lost_move)
    );
    file_says(&dir2.join(format!("seen-{in_member2}")), &token).await;
    assert!(
        ctx.import_in_member2(&ns).await.1,
        "member2 imported it from the host PV's record"
    );
    let import = format!("member2 IMPORTED [{KOSMOS2}]");
    ctx.relay_imports_are(&format!("{ns}/data"), &[import.as_str()])
        .await;
    println!(
        "figure: member1 stopped and declared lost: the pod moved to {KOSMOS2} Running on member1's data {} s after the declaration (controller restarted)",
        seconds(lost_move)
    );

    let t = Instant::now();
    member1_stopped.resume();
    for pod in ["straggler", doomed.as_str()] {
        eventually(&format!("member1's pod {pod} fenced"), WAIT, || async {
            member1_pods
                .get_opt(pod)
                .await
                .ok()?
                .is_none()
                .then_some(())
        })
        .await;
    }
    let fenced = t.elapsed();
    let last = eventually("the straggler's heartbeat stops", WAIT, || async {
        let before = heartbeat(&beat);
        tokio::time::sleep(Duration::from_secs(5)).await;
        (heartbeat(&beat) == before).then_some(before)
    })
    .await
    .unwrap_or(frozen_at);
    let log = relay.controller.log();
    assert!(
        log.contains("fenced") && log.contains(&format!("{ns}/straggler")),
        "the relay fenced member1's own pod"
    );
    assert_eq!(
        Ctx::running_pods(&ctx.member2, &ns).await,
        std::slice::from_ref(&in_member2),
        "member2's pod runs on"
    );
    println!(
        "figure: member1 back while declared lost: its pods on the volume deleted by the fence {} s after it answered; its straggler wrote {} heartbeats (0.5 s apart) after it came back, then none",
        seconds(fenced),
        last.saturating_sub(frozen_at)
    );
    // Taken back: the member given again as --member.
    drop(relay);
    relay = DemoRelay::start(
        env,
        &pre.sidecars,
        &[member1.clone(), member2.clone()],
        &["--virtual-node-attach"],
        &demo,
        "member1",
    )
    .await;
    ctx.delete_and_check_nothing_left(&ns, [dir, dir2]).await;

    let _ = classes.delete("global", &DeleteParams::default()).await;
    drop(relay);

    // Volumes that move between members' own storage, in the same
    // environment (member2's own class is shared-up.sh's too).
    crate::mobility_e2e::run(pre, kosmos, &ctx).await;
}

/// Rounds of the race, all at once (each in a namespace of its own).
const RACE_ROUNDS: usize = 10;

/// A pod on `node` that appends the current second to `w-<name>` twice a
/// second: two writers show as seconds both files hold.
fn racer(name: &str, node: &str) -> Value {
    let script = format!("while true; do date +%s >> /data/w-{name}; sleep 0.5; done");
    pod_on(name, node, &script)
}

fn seconds_written(file: &Path) -> std::collections::BTreeSet<u64> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

struct RaceRound {
    listed_first: &'static str,
    winner: &'static str,
    loser_after: Duration,
}

/// One round, as measured in the issue: a ReadWriteOnce claim first used
/// by a pod on kosmos-member1, that pod gone and its attachment released;
/// then two pods of the claim made back to back, one per member, member2's
/// first in even rounds and member1's in odd ones. Whatever wins, only one
/// member's pod runs and writes; once the winner is deleted the other runs,
/// and no second holds writes of both.
async fn race(ctx: &Ctx, shared: &Path, round: usize) -> RaceRound {
    let ns = ctx.namespace(&format!("race{round}")).await;
    ctx.claim(&ns, "global", "ReadWriteOnce").await;
    let host_pods: Api<Pod> = Api::namespaced(ctx.host.clone(), &ns);
    let make = |name: &str, node: &str| {
        let pod = serde_json::from_value(racer(name, node)).expect("pod");
        let host_pods = host_pods.clone();
        async move {
            host_pods
                .create(&PostParams::default(), &pod)
                .await
                .expect("create a racer");
        }
    };
    make("first", KOSMOS1).await;
    ctx.pod_running(&ctx.member1, &ns, None).await;
    let dir = ctx.origin_dir(&ns).await;
    let _ = host_pods.delete("first", &DeleteParams::default()).await;
    Ctx::pods_gone(&ctx.member1, &ns).await;
    ctx.host_pods_gone(&ns).await;
    ctx.detached(&ns, KOSMOS1).await;

    let (listed_first, order) = if round.is_multiple_of(2) {
        ("member2", [("a", KOSMOS2), ("b", KOSMOS1)])
    } else {
        ("member1", [("b", KOSMOS1), ("a", KOSMOS2)])
    };
    for (name, node) in order {
        make(name, node).await;
    }
    let members = [
        ("member1", &ctx.member1, "b"),
        ("member2", &ctx.member2, "a"),
    ];
    let (winner, winner_pod) = eventually(&format!("{ns}: a racer Running"), WAIT, || async {
        for (member, cluster, pod) in members {
            if Ctx::running_pods(cluster, &ns)
                .await
                .iter()
                .any(|p| p == pod)
            {
                return Some((member, pod));
            }
        }
        None
    })
    .await;
    // Watch for 10 s: never a pod running in each member.
    for _ in 0..20 {
        let one = Ctx::running_pods(&ctx.member1, &ns).await;
        let two = Ctx::running_pods(&ctx.member2, &ns).await;
        assert!(
            one.is_empty() || two.is_empty(),
            "{ns}: pods Running in both members: {one:?} and {two:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let loser_name = if winner_pod == "a" { "b" } else { "a" };
    // The loser is told who holds the volume: the host's Multi-Attach
    // refusal names the winner's pod, the relay's the winner's member.
    let names_the_winner = |m: &str| {
        m.contains(&format!("used by pod(s) {winner_pod}"))
            || m.contains(&format!("member cluster {winner}"))
    };
    let why = ctx.attach_refusal(&ns, loser_name, names_the_winner).await;
    assert!(names_the_winner(&why), "{ns}: {why}");
    if round == 0 {
        println!("figure: race: the loser's host pod is told: {why}");
    }
    let (_, winner_cluster, _) = members
        .into_iter()
        .find(|(m, _, _)| *m == winner)
        .expect("the winner's member");
    let (_, loser_cluster, loser_pod) = members
        .into_iter()
        .find(|(m, _, _)| *m != winner)
        .expect("the loser's member");
    let t = Instant::now();
    let _ = host_pods.delete(winner_pod, &DeleteParams::default()).await;
    ctx.old_pod_released(&ns, winner_cluster).await;
    eventually(
        &format!("{ns}: the loser {loser_pod} Running"),
        WAIT,
        || async {
            Ctx::running_pods(loser_cluster, &ns)
                .await
                .iter()
                .any(|p| p == loser_pod)
                .then_some(())
        },
    )
    .await;
    let loser_after = t.elapsed();
    // The loser writes for a while, then the data is judged.
    eventually(&format!("{ns}: the loser writes"), WAIT, || async {
        (seconds_written(&dir.join(format!("w-{loser_pod}"))).len() >= 3).then_some(())
    })
    .await;
    let won = seconds_written(&dir.join(format!("w-{winner_pod}")));
    let lost = seconds_written(&dir.join(format!("w-{loser_pod}")));
    assert!(
        won.len() >= 10,
        "{ns}: the winner wrote for the 10 s watched: {won:?}"
    );
    let both: Vec<&u64> = won.intersection(&lost).collect();
    assert!(
        both.is_empty(),
        "{ns}: seconds in which both members' pods wrote: {both:?}"
    );
    assert!(
        won.last() < lost.first(),
        "{ns}: the loser wrote before the winner stopped: {won:?} / {lost:?}"
    );
    ctx.delete_and_check_nothing_left(&ns, [dir.clone(), through_member2(&dir, shared)])
        .await;
    RaceRound {
        listed_first,
        winner,
        loser_after,
    }
}

/// Seconds into the rounds at which the controller is SIGKILLed and
/// started again on its state dir, with the sidecars that exit with it:
/// while claims are made and first bound, while the first
/// pods let go, while the racers are attached (imports and releases in
/// flight at whatever step they are).
const RACE_CRASHES: [u64; 3] = [8, 20, 35];

async fn race_rounds(ctx: &Ctx, shared: &Path, relay: &mut DemoRelay) {
    let t = Instant::now();
    let crashes = async {
        for at in RACE_CRASHES {
            tokio::time::sleep_until((t + Duration::from_secs(at)).into()).await;
            relay.crash_controller().await;
        }
    };
    let (rounds, ()) = tokio::join!(
        futures::future::join_all((0..RACE_ROUNDS).map(|r| race(ctx, shared, r))),
        crashes
    );
    let mut waits: Vec<f64> = rounds.iter().map(|r| r.loser_after.as_secs_f64()).collect();
    waits.sort_by(f64::total_cmp);
    let listed_won = rounds.iter().filter(|r| r.listed_first == r.winner).count();
    for (i, r) in rounds.iter().enumerate() {
        println!(
            "figure: race {i}: {} listed first, {} won, the other Running {} s after the winner's pod was deleted",
            r.listed_first,
            r.winner,
            seconds(r.loser_after)
        );
    }
    println!(
        "figure: races: {RACE_ROUNDS} rounds (both orders), the controller SIGKILLed and restarted {} times meanwhile (at {RACE_CRASHES:?} s), two writers in none (judged by the seconds each pod wrote); the pod listed first won {listed_won}; the loser Running {:.1}/{:.1}/{:.1} s (min/median/max) after the winner's pod was deleted; all rounds {} s",
        RACE_CRASHES.len(),
        waits[0],
        waits[waits.len() / 2],
        waits[waits.len() - 1],
        seconds(t.elapsed())
    );
}

/// A pod of member1's own on the volume's claim, writing a count into
/// `beat-straggler` twice a second.
fn straggler() -> Value {
    let script = "i=0; while true; do i=$((i+1)); echo $i > /data/beat-straggler; sleep 0.5; done";
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "straggler", "labels": {"app": "straggler"}},
        "spec": {"nodeName": MEMBER1_NODE, "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": IMAGE, "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "data"}}]}})
}

fn heartbeat(file: &Path) -> Option<u64> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// The containerd socket of the kubelet node in `lab` (its node.env).
pub(crate) fn containerd_socket(lab: &Path) -> PathBuf {
    let env = std::fs::read_to_string(lab.join("node.env")).expect("the kubelet node's node.env");
    env.lines()
        .find_map(|l| l.strip_prefix("export KL_CONTAINERD_SOCK="))
        .map(PathBuf::from)
        .expect("KL_CONTAINERD_SOCK in node.env")
}
