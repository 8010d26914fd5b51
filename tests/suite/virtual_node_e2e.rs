//! The main scenario end to end, on real control planes: a host PVC and a
//! pod on a Kosmos-style virtual node (no kubelet; it stands for the whole
//! member cluster), with the stock host sidecars (external-provisioner,
//! external-attacher) and the host's attach/detach controller driving a
//! `--mode controller` csi-relay with its virtual-node registrar.
//!
//! Checked: the host PV binds and the member PVC carries the host claim's
//! namespace and name (one PVC, no second); the host VolumeAttachment
//! attaches with no relay-made member attachment; a member pod with the
//! host pod's claim name uses the relay's PVC; the RelayVolume walks
//! NODE_READY → VOL_READY → PUBLISHED as the member reports it (this test
//! plays the member kubelet: it sets the node's volumesInUse and the pod's
//! phase); deleting the host pod detaches nothing under the member pod; and
//! at the end nothing is left in either cluster.
//!
//! Runs when RELAY_E2E_* (see member_e2e.rs) and RELAY_E2E_SIDECARS (the
//! directory holding csi-provisioner and csi-attacher) are set; otherwise
//! prints "skipped".

use crate::{common, e2e_support};

use std::path::PathBuf;
use std::time::Duration;

use csi_relay::k8s::relay_volume::RelayVolume;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

use e2e_support::{attached_va, client, eventually, phase as rv_phase, relay_made, Sidecar};

const DRIVER: &str = "relay.csi.dev";

/// The two-cluster environment, and what only this test needs: a virtual node
/// and the host sidecars' binaries.
struct Env {
    shared: e2e_support::Env,
    virtual_node: String,
    sidecars: PathBuf,
}

impl std::ops::Deref for Env {
    type Target = e2e_support::Env;
    fn deref(&self) -> &e2e_support::Env {
        &self.shared
    }
}

fn env() -> Option<Env> {
    Some(Env {
        shared: e2e_support::env()?,
        virtual_node: std::env::var("RELAY_E2E_VIRTUAL_NODE").ok()?,
        sidecars: PathBuf::from(std::env::var("RELAY_E2E_SIDECARS").ok()?),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_on_a_virtual_node_gets_the_relay_volume_in_the_member() {
    let _alone = common::alone();
    let Some(env) = env() else {
        common::skip("no clusters or no sidecars: set RELAY_E2E_* and RELAY_E2E_SIDECARS");
        return;
    };
    let host = client(&env.host_kubeconfig).await;
    let member = client(&env.member_kubeconfig).await;

    // Host: the RelayVolume CRD and CSIDriver, as deploy/ installs them.
    e2e_support::install_crd(&host).await;
    e2e_support::install_csidriver(&host).await;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The relay controller (split deployment: --mode controller) with its
    // virtual-node registrar.
    let d = e2e_support::start_member_relay(
        &env.shared,
        "controller",
        &[
            "--mode",
            "controller",
            "--virtual-node-registrar",
            "--housekeeping-interval",
            "5",
        ],
    )
    .await;
    let common_args =
        |extra: &[&str]| e2e_support::sidecar_args(&d.socket, &env.host_kubeconfig, extra);
    let _provisioner = Sidecar::start(
        &env.sidecars.join("csi-provisioner"),
        &common_args(&["--extra-create-metadata", "--feature-gates=Topology=true"]),
        &d.path("csi-provisioner.log"),
    );
    let _attacher = Sidecar::start(
        &env.sidecars.join("csi-attacher"),
        &common_args(&[]),
        &d.path("csi-attacher.log"),
    );

    // Whole-cluster mode, then one-member-node mode, under Kosmos's
    // scheduler (Immediate); then whole-cluster mode under the default
    // scheduler (WaitForFirstConsumer, selected-node = the virtual node).
    let whole = json!({"topology.relay.csi.dev/member": "e2e"});
    let one_node = json!({"topology.relay.csi.dev/member": "e2e",
                          "topology.relay.csi.dev/member-node": "member-node-1"});
    flow(&env, &host, &member, "cluster", whole.clone(), false).await;
    flow(&env, &host, &member, "node", one_node, false).await;
    flow(&env, &host, &member, "wffc", whole, true).await;
}

async fn flow(
    env: &Env,
    host: &Client,
    member: &Client,
    mode: &str,
    labels: serde_json::Value,
    wait_for_consumer: bool,
) {
    let ns = format!("vn-{}-{mode}", std::process::id());
    let claim = "data";
    // The virtual node gets the member label after the registrar started;
    // its CSINode follows.
    let host_nodes: Api<Node> = Api::all(host.clone());
    let label = json!({"metadata": {"labels": labels}});
    host_nodes
        .patch(
            &env.virtual_node,
            &PatchParams::default(),
            &Patch::Merge(&label),
        )
        .await
        .expect("label the virtual node");
    let csinodes: Api<CSINode> = Api::all(host.clone());
    let vnode = env.virtual_node.clone();
    eventually(
        "the virtual node's CSINode entry",
        Duration::from_secs(30),
        || {
            let (csinodes, vnode) = (csinodes.clone(), vnode.clone());
            async move {
                let n = csinodes.get_opt(&vnode).await.ok()??;
                n.spec
                    .drivers
                    .iter()
                    .any(|d| {
                        d.name == DRIVER
                            && d.topology_keys.as_ref().is_some_and(|k| {
                                k.iter().any(|k| k == "topology.relay.csi.dev/member")
                            })
                    })
                    .then_some(())
            }
        },
    )
    .await;

    // Host: namespace, Immediate class restricted to the member (Kosmos's
    // scheduler), the claim.
    let namespaces: Api<Namespace> = Api::all(host.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .expect("host namespace");
    let class_name = format!("relay-e2e-{}-{mode}", std::process::id());
    let mut class = json!({
        "metadata": {"name": class_name},
        "provisioner": DRIVER,
        "volumeBindingMode": "Immediate",
        "reclaimPolicy": "Delete",
        "allowedTopologies": [{"matchLabelExpressions": [
            {"key": "topology.relay.csi.dev/member", "values": ["e2e"]}]}],
        "parameters": {"member": "e2e", "memberStorageClass": env.storage_class,
                       "createMemberNamespace": "true"}
    });
    if wait_for_consumer {
        class["volumeBindingMode"] = "WaitForFirstConsumer".into();
        class.as_object_mut().map(|c| c.remove("allowedTopologies"));
    }
    let class: StorageClass = serde_json::from_value(class).unwrap();
    let classes: Api<StorageClass> = Api::all(host.clone());
    classes
        .create(&PostParams::default(), &class)
        .await
        .expect("host StorageClass");
    let host_pvcs: Api<PersistentVolumeClaim> = Api::namespaced(host.clone(), &ns);
    host_pvcs
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": claim},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class_name,
                         "resources": {"requests": {"storage": "16Mi"}}}
            }))
            .unwrap(),
        )
        .await
        .expect("host PVC");
    if wait_for_consumer {
        // What kube-scheduler does once it places the pod on the node.
        let selected = json!({"metadata": {"annotations": {
            "volume.kubernetes.io/selected-node": env.virtual_node}}});
        host_pvcs
            .patch(claim, &PatchParams::default(), &Patch::Merge(&selected))
            .await
            .expect("select the virtual node");
    }
    let host_pv = eventually("the host PVC to bind", Duration::from_secs(60), || {
        let host_pvcs = host_pvcs.clone();
        async move {
            let pvc = host_pvcs.get(claim).await.ok()?;
            (pvc.status.as_ref()?.phase.as_deref() == Some("Bound"))
                .then(|| pvc.spec?.volume_name)
                .flatten()
        }
    })
    .await;
    let pv = Api::<PersistentVolume>::all(host.clone())
        .get(&host_pv)
        .await
        .expect("host PV");
    let volume_id = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| c.volume_handle.clone())
        .expect("a CSI PV");

    // Member: the claim under the host claim's namespace and name, ours,
    // and the only one there.
    let member_pvcs: Api<PersistentVolumeClaim> = Api::namespaced(member.clone(), &ns);
    let mine = member_pvcs
        .get(claim)
        .await
        .expect("member PVC named as the host's");
    assert_eq!(
        mine.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("relay.csi.dev/volume-id")),
        Some(&volume_id)
    );
    assert_eq!(
        member_pvcs
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1,
        "no second member PVC"
    );

    // Host pod on the virtual node: the host attach/detach controller makes
    // a VolumeAttachment; external-attacher → ControllerPublishVolume.
    let host_pods: Api<Pod> = Api::namespaced(host.clone(), &ns);
    let pod_spec = |node: &str| {
        json!({
            "metadata": {"name": "web-0"},
            "spec": {"nodeName": node,
                     "tolerations": [{"key": "kosmos.io/node", "operator": "Exists"}],
                     "containers": [{"name": "c", "image": "busybox"}],
                     "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]}
        })
    };
    host_pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(pod_spec(&env.virtual_node)).unwrap(),
        )
        .await
        .expect("host pod");
    let host_vas: Api<VolumeAttachment> = Api::all(host.clone());
    let host_va = attached_va("the host VolumeAttachment to attach", &host_vas, &host_pv).await;
    let member_vas: Api<VolumeAttachment> = Api::all(member.clone());
    assert_eq!(
        relay_made(&member_vas.list(&ListParams::default()).await.unwrap().items).len(),
        0,
        "no relay-made member attachment for a whole-cluster virtual node"
    );

    let relay: Api<RelayVolume> = Api::all(host.clone());
    let rv_name = csi_relay::k8s::relay_volume::object_name(&volume_id);
    let wait_rv = |what: &'static str, check: Box<dyn Fn(&RelayVolume) -> bool + Send + Sync>| {
        let (relay, rv_name) = (relay.clone(), rv_name.clone());
        let check = std::sync::Arc::new(check);
        async move {
            eventually(what, Duration::from_secs(60), || {
                let (relay, rv_name, check) = (relay.clone(), rv_name.clone(), check.clone());
                async move {
                    let rv = relay.get_opt(&rv_name).await.ok()??;
                    check(&rv).then_some(rv)
                }
            })
            .await
        }
    };
    wait_rv(
        "RelayVolume NODE_READY",
        Box::new(|rv| rv_phase(rv).as_deref() == Some("NODE_READY")),
    )
    .await;

    // The mirrored pod in the member: same namespace, same claim name.
    let member_node = "member-node-1";
    let member_pods: Api<Pod> = Api::namespaced(member.clone(), &ns);
    member_pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(pod_spec(member_node)).unwrap(),
        )
        .await
        .expect("member pod");
    let member_pv = eventually("the member PVC to bind", Duration::from_secs(60), || {
        let member_pvcs = member_pvcs.clone();
        async move { member_pvcs.get(claim).await.ok()?.spec?.volume_name }
    })
    .await;
    let handle = Api::<PersistentVolume>::all(member.clone())
        .get(&member_pv)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.csi)
        .map(|c| (c.driver, c.volume_handle))
        .expect("member CSI PV");
    let member_va = attached_va("the member's own attachment", &member_vas, &member_pv).await;
    let entry = format!("e2e/{member_node}");
    let has_entry = |want: &'static str| {
        let entry = entry.clone();
        Box::new(move |rv: &RelayVolume| {
            rv.status
                .as_ref()
                .and_then(|s| s.nodes.as_ref())
                .is_some_and(|n| {
                    n.iter()
                        .any(|e| e.node == entry && e.phase.as_deref() == Some(want))
                })
        }) as Box<dyn Fn(&RelayVolume) -> bool + Send + Sync>
    };
    wait_rv("the member node NODE_READY", has_entry("NODE_READY")).await;

    // Playing the member kubelet: the global mount, then the pod running.
    let member_nodes: Api<Node> = Api::all(member.clone());
    let in_use = format!("kubernetes.io/csi/{}^{}", handle.0, handle.1);
    let set_in_use = |list: Vec<String>| {
        let member_nodes = member_nodes.clone();
        async move {
            member_nodes
                .patch_status(
                    member_node,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {"volumesInUse": list}})),
                )
                .await
                .expect("member node volumesInUse")
        }
    };
    set_in_use(vec![in_use.clone()]).await;
    wait_rv("the member node VOL_READY", has_entry("VOL_READY")).await;
    // The summary follows the entries (the controller catches up).
    wait_rv(
        "RelayVolume VOL_READY",
        Box::new(|rv| rv_phase(rv).as_deref() == Some("VOL_READY")),
    )
    .await;
    member_pods
        .patch_status(
            "web-0",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .expect("member pod Running");
    let rv = wait_rv(
        "RelayVolume PUBLISHED",
        Box::new(|rv| rv_phase(rv).as_deref() == Some("PUBLISHED")),
    )
    .await;
    let pods = rv
        .status
        .as_ref()
        .and_then(|s| s.nodes.as_ref())
        .and_then(|n| n.iter().find(|e| e.node == entry))
        .and_then(|e| e.pods.clone());
    assert_eq!(pods, Some(vec![format!("{ns}/web-0")]));

    // The host pod goes: the host detaches; nothing is detached in the
    // member under its running pod.
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    host_pods
        .delete("web-0", &now)
        .await
        .expect("delete host pod");
    eventually(
        "the host VolumeAttachment to go",
        Duration::from_secs(120),
        || {
            let (host_vas, name) = (host_vas.clone(), host_va.clone());
            async move { host_vas.get_opt(&name).await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
    let va = member_vas
        .get(&member_va)
        .await
        .expect("member attachment stays");
    assert!(
        va.metadata.deletion_timestamp.is_none() && va.status.is_some_and(|s| s.attached),
        "the member pod's attachment must stay"
    );

    // The member pod goes, then the claim: nothing left anywhere.
    set_in_use(vec![]).await;
    member_pods
        .delete("web-0", &now)
        .await
        .expect("delete member pod");
    eventually(
        "the member attachment to go",
        Duration::from_secs(120),
        || {
            let (vas, name) = (member_vas.clone(), member_va.clone());
            async move { vas.get_opt(&name).await.ok()?.is_none().then_some(()) }
        },
    )
    .await;
    wait_rv(
        "RelayVolume back to CREATED",
        Box::new(|rv| rv_phase(rv).as_deref() == Some("CREATED")),
    )
    .await;
    host_pvcs
        .delete(claim, &DeleteParams::default())
        .await
        .expect("delete host PVC");
    eventually("the member PVC to go", Duration::from_secs(120), || {
        let member_pvcs = member_pvcs.clone();
        async move {
            member_pvcs
                .get_opt(claim)
                .await
                .ok()?
                .is_none()
                .then_some(())
        }
    })
    .await;
    eventually(
        "the host PV and RelayVolume to go",
        Duration::from_secs(60),
        || {
            let (relay, rv_name) = (relay.clone(), rv_name.clone());
            let pvs = Api::<PersistentVolume>::all(host.clone());
            let host_pv = host_pv.clone();
            async move {
                let rv_gone = relay.get_opt(&rv_name).await.ok()?.is_none();
                let pv_gone = pvs.get_opt(&host_pv).await.ok()?.is_none();
                (rv_gone && pv_gone).then_some(())
            }
        },
    )
    .await;
    eventually("the member PV to go", Duration::from_secs(60), || {
        let pvs = Api::<PersistentVolume>::all(member.clone());
        let name = member_pv.clone();
        async move { pvs.get_opt(&name).await.ok()?.is_none().then_some(()) }
    })
    .await;

    // Clean up what the test made.
    let _ = classes.delete(&class_name, &DeleteParams::default()).await;
    let _ = namespaces.delete(&ns, &DeleteParams::default()).await;
    let _ = Api::<Namespace>::all(member.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
    let unlabel = json!({"metadata": {"labels": {"topology.relay.csi.dev/member": null,
                                                 "topology.relay.csi.dev/member-node": null}}});
    let _ = host_nodes
        .patch(
            &env.virtual_node,
            &PatchParams::default(),
            &Patch::Merge(&unlabel),
        )
        .await;
}
