//! A member cluster lost for good, on real control planes, and the
//! runbook's way out (docs/operations.md "When things go wrong"). A spare member
//! (`tests/e2e-env/spare-member-up.sh`) holds 10 bound volumes of host
//! claims, 2 of them attached for pods; then its control plane and storage
//! are deleted. While the relay is not told, a deleted claim's volume stays:
//! an unreachable member is never taken for a lost one. Then the procedure:
//! the controller restarted with `--lost-member` instead of `--member`, the
//! pods and claims deleted. Checked: every host PV, claim and attachment
//! goes; each volume's RelayVolume stays as the record of what was left in
//! the member (phase RELEASED, label relay.csi.dev/released-from), and
//! deleting those records leaves the host clean. Skipped unless RELAY_E2E_*,
//! RELAY_E2E_SIDECARS and E2E_HOME are set.

use crate::{common, e2e_support};

use std::path::PathBuf;
use std::time::Duration;

use csi_relay::k8s::relay_volume::RelayVolume;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{StorageClass, VolumeAttachment};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use e2e_support::{attached_va, client, eventually, ScriptedEnv};

const MEMBER: &str = "lost";
const PORT: &str = "20443";
const CLAIMS: usize = 10;
const IN_USE: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_lost_for_good_is_released_by_the_runbook_alone() {
    let _alone = common::alone();
    let (Some(env), Ok(bin), Ok(home)) = (
        e2e_support::env(),
        std::env::var("RELAY_E2E_SIDECARS"),
        std::env::var("E2E_HOME"),
    ) else {
        common::skip("no clusters: set RELAY_E2E_*, RELAY_E2E_SIDECARS and E2E_HOME");
        return;
    };
    let bin = PathBuf::from(bin);
    let spare = ScriptedEnv::new(
        "e2e-env",
        "spare-member-down.sh",
        std::path::Path::new(&home),
        vec![("SPARE_MEMBER", MEMBER.into()), ("SPARE_PORT", PORT.into())],
    );
    spare.run("spare-member-up.sh");
    // The relay's own identity there (spare-member-up.sh installs deploy/member).
    let lost_kubeconfig = format!("{home}/run/{MEMBER}-relay.kubeconfig");

    let host = client(&env.host_kubeconfig).await;
    e2e_support::install_crd(&host).await;
    e2e_support::install_csidriver(&host).await;
    let pid = std::process::id();
    let node = format!("on-lost-{pid}");
    e2e_support::fake_host_node(
        &host,
        &node,
        json!({"topology.relay.csi.dev/member": MEMBER}),
    )
    .await;
    let nodes: Api<Node> = Api::all(host.clone());

    let member_arg = format!("{MEMBER}={lost_kubeconfig}");
    let mut relay = e2e_support::start_member_relay(
        &env,
        "controller",
        &["--mode", "controller", "--member", &member_arg],
    )
    .await;
    let running = e2e_support::host_sidecars(&relay, &env.host_kubeconfig, &bin);

    let ns = format!("lost-{pid}");
    let class = format!("relay-lost-{pid}");
    e2e_support::host_namespace_and_class(
        &host,
        &ns,
        &class,
        json!({"member": MEMBER, "memberStorageClass": format!("{MEMBER}-hostpath"),
               "memberNamespace": "default"}),
    )
    .await;
    let classes: Api<StorageClass> = Api::all(host.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(host.clone(), &ns);
    for i in 0..CLAIMS {
        claims
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": format!("data-{i}")},
                    "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                             "resources": {"requests": {"storage": "16Mi"}}}
                }))
                .expect("claim"),
            )
            .await
            .expect("host PVC");
    }
    let bound: Vec<String> = eventually("all claims bound", Duration::from_secs(180), || {
        let claims = claims.clone();
        async move {
            let list = claims.list(&ListParams::default()).await.ok()?.items;
            let pvs: Vec<String> = list
                .iter()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
                .filter_map(|c| c.spec.as_ref()?.volume_name.clone())
                .collect();
            (pvs.len() == CLAIMS).then_some(pvs)
        }
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(host.clone(), &ns);
    let host_vas: Api<VolumeAttachment> = Api::all(host.clone());
    for i in 0..IN_USE {
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": format!("app-{i}")},
                "spec": {"nodeName": node,
                         "containers": [{"name": "c", "image": "busybox"}],
                         "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": format!("data-{i}")}}]}
            }))
            .expect("pod"),
        )
        .await
        .expect("host pod");
    }
    for i in 0..IN_USE {
        let pv = claims
            .get(&format!("data-{i}"))
            .await
            .expect("claim")
            .spec
            .and_then(|s| s.volume_name)
            .expect("bound");
        attached_va("a pod's volume attached", &host_vas, &pv).await;
    }

    // The member is deleted: control plane, etcd, storage.
    let status = spare
        .command("spare-member-down.sh")
        .status()
        .expect("run spare-member-down.sh");
    assert!(status.success(), "the member went down cleanly");

    // Merely unreachable for the relay (it was not told): a claim deleted
    // now keeps its volume, and nothing is released.
    claims
        .delete("data-9", &DeleteParams::default())
        .await
        .expect("delete a claim while the member is unreachable");
    tokio::time::sleep(Duration::from_secs(20)).await;
    let pvs: Api<PersistentVolume> = Api::all(host.clone());
    let relay_volumes: Api<RelayVolume> = Api::all(host.clone());
    let released_selector = format!("relay.csi.dev/released-from={MEMBER}");
    let released = |api: Api<RelayVolume>, selector: String| async move {
        api.list(&ListParams::default().labels(&selector))
            .await
            .expect("list released RelayVolumes")
            .items
    };
    let unreachable_pv = pvs
        .list(&ListParams::default())
        .await
        .expect("list PVs")
        .items
        .into_iter()
        .find(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .is_some_and(|r| r.name.as_deref() == Some("data-9"))
        });
    assert!(
        unreachable_pv.is_some(),
        "an unreachable member's volume is not deleted"
    );
    assert!(
        released(relay_volumes.clone(), released_selector.clone())
            .await
            .is_empty(),
        "nothing is released while the member is only unreachable"
    );

    // The runbook: declare the member lost (the controller restarted with
    // --lost-member instead of --member), then delete the pods and claims.
    drop(running);
    relay.stop_gracefully().await;
    let at = relay
        .extra_args
        .iter()
        .position(|a| a == &member_arg)
        .expect("the member's flag");
    relay.extra_args.splice(
        at - 1..=at,
        ["--lost-member".to_string(), MEMBER.to_string()],
    );
    relay.start_again().await;
    let _running = e2e_support::host_sidecars(&relay, &env.host_kubeconfig, &bin);
    for i in 0..IN_USE {
        pods.delete(
            &format!("app-{i}"),
            &DeleteParams::default().grace_period(0),
        )
        .await
        .expect("delete a pod");
    }
    claims
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("delete the claims");
    eventually(
        "every host PV, claim and attachment of the lost member to go",
        Duration::from_secs(240),
        || {
            let (pvs, claims, host_vas, bound) =
                (pvs.clone(), claims.clone(), host_vas.clone(), bound.clone());
            async move {
                let pv_left = pvs
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .iter()
                    .filter_map(|p| p.metadata.name.clone())
                    .any(|n| bound.contains(&n));
                let claims_left = !claims
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .is_empty();
                let vas_left = host_vas
                    .list(&ListParams::default())
                    .await
                    .ok()?
                    .items
                    .iter()
                    .any(|va| {
                        va.spec
                            .source
                            .persistent_volume_name
                            .as_ref()
                            .is_some_and(|p| bound.contains(p))
                    });
                (!pv_left && !claims_left && !vas_left).then_some(())
            }
        },
    )
    .await;

    // What is recorded of the data left behind: one RELEASED RelayVolume per
    // volume, naming its member claim.
    let records = released(relay_volumes.clone(), released_selector.clone()).await;
    assert_eq!(records.len(), CLAIMS, "one record per released volume");
    for rv in &records {
        let status = rv.status.clone().unwrap_or_default();
        assert_eq!(status.phase.as_deref(), Some("RELEASED"));
        let why = status.released.unwrap_or_default();
        let member_pvc = rv.spec.member_pvc.clone().unwrap_or_default();
        assert!(
            why.contains("member cluster lost") && why.contains(&member_pvc),
            "the record names the member claim left behind: {why:?}"
        );
    }
    // A controller that restarts keeps them as records, not volumes.
    relay.restart().await;
    let mut c = relay.controller();
    let listed = c
        .list_volumes(csi_relay::csi::ListVolumesRequest::default())
        .await
        .expect("ListVolumes")
        .into_inner()
        .entries;
    assert!(
        !listed.iter().any(|e| e
            .volume
            .as_ref()
            .is_some_and(|v| v.volume_id.starts_with(&format!("m-{MEMBER}-")))),
        "released volumes are not restored as volumes"
    );

    // The operator's last step: the records go once read.
    relay_volumes
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&released_selector),
        )
        .await
        .expect("delete the released records");
    eventually(
        "no RelayVolume of the lost member",
        Duration::from_secs(30),
        || {
            let relay_volumes = relay_volumes.clone();
            async move {
                let left = relay_volumes.list(&ListParams::default()).await.ok()?.items;
                (!left
                    .iter()
                    .any(|rv| rv.spec.member.as_deref() == Some(MEMBER)))
                .then_some(())
            }
        },
    )
    .await;
    let _ = nodes.delete(&node, &DeleteParams::default()).await;
    let _ = classes.delete(&class, &DeleteParams::default()).await;
    let _ = Api::<Namespace>::all(host.clone())
        .delete(&ns, &DeleteParams::default())
        .await;
}
