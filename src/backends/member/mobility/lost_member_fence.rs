//! The fence on a member declared lost that answers again.
//!
//! Declaring a member lost (`--lost-member`) is the operator's word that
//! nothing runs there any more, as the out-of-service taint is for a node:
//! its shared volumes are then imported and written from other members. A
//! member that was switched off, or cut off, can come back, and its kubelets
//! start again the pods they had, writing into data that another member now
//! writes. With `--fence-member NAME=KUBECONFIG` the leading controller asks
//! that member every [`PERIOD`] for as long as it stays declared lost, and
//! deletes, without grace, every pod there that a node took and that uses
//! the member's claim of a shared volume (sharedWith names the member); the
//! member's kubelet then stops their containers, and a pod made there later
//! goes the same way. Only pods are deleted: the member's claims and PVs
//! stay, so the fence never deletes data, and taking the member back is
//! dropping `--lost-member` (docs/operations.md).
//!
//! The relay cannot stop writes in a cluster it cannot reach: while the
//! member does not answer, nothing is fenced. That is why only an operator
//! declares a member lost, once it is stopped. Its asks stay out of the
//! reachability metrics (`Cluster::unmetered`): a lost member that stays
//! away is expected, and pages no one.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Preconditions};

use crate::backends::member::mobility::{access, import};
use crate::backends::member::pvc;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::params;
use crate::domain::sharing::Sharing;
use crate::domain::volume::{Backing, Volume};
use crate::k8s::cluster::Cluster;
use crate::k8s::naming::MemberVolume;
use crate::store::Store;

/// How often a fenced member is asked: a kubelet that comes back restarts
/// its pods within seconds, and each ask is one list per shared volume.
pub const PERIOD: Duration = Duration::from_secs(3);
/// A round that has not finished by then (a member that accepts
/// connections and never answers) is given up, and the next one starts.
const ROUND_BUDGET: Duration = Duration::from_secs(20);

/// Whether `vol` is a shared volume that `member` reaches.
fn shared_with(vol: &Volume, member: &str) -> bool {
    if !matches!(vol.backing, Backing::Member { .. }) {
        return false;
    }
    let map = vol.parameters.clone().into_iter().collect();
    let Ok(typed) = params::decode(&map, "parameters") else {
        return false;
    };
    matches!(Sharing::of(&typed), Ok(Some(s)) if s.includes(member))
}

/// One round over `volumes` in the lost member `cluster`: deletes the pods
/// there that use one of their claims (the relay's own claim, never one it
/// did not make), and names each as `pod ns/name on node N (volume V)`.
/// A member that does not answer ends the round at once; any other failure
/// (a volume's claim or pods that cannot be read, a pod that cannot be
/// deleted) is the round's error once every other volume had its turn.
pub async fn round(cluster: &Cluster, volumes: &[Volume]) -> CsiResult<Vec<String>> {
    let mut fenced = Vec::new();
    let mut failed = None;
    for vol in volumes.iter().filter(|v| shared_with(v, cluster.name())) {
        match fence_volume(cluster, vol, &mut fenced).await {
            Ok(()) => {}
            Err(e @ CsiError::Unavailable(_)) => return Err(e),
            Err(e) => {
                tracing::warn!(member = cluster.name(), volume_id = %vol.id, error = %e, "fence: volume not fenced this round");
                failed.get_or_insert(e);
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(fenced),
    }
}

/// Fences one volume's claim in the lost member; what it deleted goes into
/// `fenced`.
async fn fence_volume(cluster: &Cluster, vol: &Volume, fenced: &mut Vec<String>) -> CsiResult<()> {
    let origin = MemberVolume::of(vol)?;
    let map = vol.parameters.clone().into_iter().collect();
    let typed = params::decode(&map, "parameters")?;
    // A gated volume's pods use its access claim, in every member.
    let gate = access::claim_of(&typed, &origin);
    let at = gate.clone().unwrap_or(origin);
    let ours = pvc::get(cluster, &at.namespace, &at.pvc)
        .await?
        .is_some_and(|c| match gate {
            Some(_) => import::is_access_claim(&c, &at, &vol.id),
            // The origin's claim is the one of the recorded uid; another
            // member's is an import, fenced by its marks (erring toward
            // fencing).
            None if cluster.name() == at.member => {
                pvc::is_recorded(&c, &at, &vol.id) && !pvc::copies_the_host_claim(&c)
            }
            None => pvc::belongs_to(&c, &vol.id) && !pvc::copies_the_host_claim(&c),
        });
    if !ours {
        return Ok(());
    }
    for pod in import::pods_using(cluster, &at).await? {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        // No grace: the pod's containers must stop now, and its kubelet
        // stops them once the pod is gone from the API. The uid keeps a
        // pod made anew under the name for the next round to judge.
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions {
                uid: pod.metadata.uid.clone(),
                resource_version: None,
            }),
            ..Default::default()
        };
        let pods = Api::<Pod>::namespaced(cluster.client(), &at.namespace);
        let gone = cluster
            .fetch(
                &format!("delete Pod {}/{name}", at.namespace),
                pods.delete(&name, &now),
            )
            .await;
        match gone {
            // 409: the uid changed, the pod was made anew: next round.
            Err(e) if e.status() == Some(409) => continue,
            Err(e) => return Err(e.into()),
            Ok(_) => {}
        }
        let what = format!(
            "pod {}/{name} on node {node} (volume {})",
            at.namespace, vol.id
        );
        tracing::warn!(
            member = cluster.name(),
            pod = %format!("{}/{name}", at.namespace),
            node = %node,
            volume_id = %vol.id,
            "fenced: deleted a pod of a member declared lost that uses a shared volume"
        );
        crate::rt::metrics::fenced_pod(cluster.name());
        fenced.push(what);
    }
    Ok(())
}

/// Fences `cluster` (a member declared lost) every [`PERIOD`] until the
/// process ends. Leader work: a replica that stops leading exits.
pub fn spawn(cluster: Cluster, store: Store) {
    tokio::spawn(async move {
        tracing::info!(
            member = cluster.name(),
            period_seconds = PERIOD.as_secs(),
            "fencing member declared lost: its pods on shared volumes are deleted whenever it answers"
        );
        let mut answered = None;
        loop {
            let outcome = match store.all_volumes().await {
                Ok(vols) => tokio::time::timeout(ROUND_BUDGET, round(&cluster, &vols))
                    .await
                    .unwrap_or_else(|_| {
                        Err(CsiError::Unavailable(format!(
                            "{} did not answer within {} s",
                            cluster.label(),
                            ROUND_BUDGET.as_secs()
                        )))
                    }),
                Err(e) => Err(e.into()),
            };
            // Said once per change: a member that stays away would
            // otherwise fill the log.
            let now = outcome.is_ok();
            if answered != Some(now) {
                match &outcome {
                    Ok(_) => tracing::warn!(
                        member = cluster.name(),
                        "member declared lost answers: fencing its pods on shared volumes"
                    ),
                    Err(e) => {
                        tracing::info!(member = cluster.name(), error = %e, "member declared lost does not answer; fenced when it does")
                    }
                }
                answered = Some(now);
            }
            tokio::time::sleep(PERIOD).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::k8s::naming;
    use crate::k8s::testing;

    const ID: &str = "m-east-0123456789abcdef0123456789abcdef";
    const CLAIM: &str = "/api/v1/namespaces/shop/persistentvolumeclaims/data";
    const PODS: &str = "/api/v1/namespaces/shop/pods";

    fn volume(shared_with: Option<&str>) -> Volume {
        let mut vol = crate::domain::volume::sample(ID, "pvc-1");
        vol.backing = Backing::Member {
            member: "east".into(),
            namespace: "shop".into(),
            pvc: "data".into(),
            selected_node: None,
            claim_uid: None,
        };
        if let Some(list) = shared_with {
            vol.parameters.insert("sharedWith".into(), list.into());
        }
        vol
    }

    fn claim(volume_id: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
               "metadata": {"name": "data", "namespace": "shop",
                            "annotations": {naming::VOLUME_ID_ANNOTATION: volume_id}},
               "spec": {}, "status": {"phase": "Bound"}})
    }

    fn pod(name: &str, node: Option<&str>, phase: &str, claim: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "shop", "uid": format!("u-{name}")},
               "spec": {"nodeName": node, "containers": [],
                        "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]},
               "status": {"phase": phase}})
    }

    fn pods(items: Vec<Value>) -> Value {
        json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": items})
    }

    #[tokio::test]
    async fn deletes_without_grace_the_running_pods_on_the_relays_claim_only() {
        let (east, mut api) = testing::member("east");
        let vols = [volume(Some("east,west"))];
        let run = tokio::spawn(async move { round(&east, &vols).await });
        api.expect("GET", CLAIM).await.ok(claim(ID));
        api.expect_page(PODS).await.ok(pods(vec![
            pod("writer", Some("east-1"), "Running", "data"),
            pod("done", Some("east-1"), "Succeeded", "data"),
            pod("waiting", None, "Pending", "data"),
            pod("other", Some("east-1"), "Running", "logs"),
        ]));
        let delete = api.expect("DELETE", &format!("{PODS}/writer")).await;
        let body = delete.body.clone();
        assert_eq!(body["gracePeriodSeconds"], 0, "{body}");
        assert_eq!(body["preconditions"]["uid"], "u-writer", "{body}");
        delete.ok(pod("writer", Some("east-1"), "Running", "data"));
        let fenced = run.await.unwrap().unwrap();
        assert_eq!(
            fenced,
            [format!("pod shop/writer on node east-1 (volume {ID})")]
        );
        api.expect_done().await;
    }

    #[tokio::test]
    async fn leaves_a_claim_the_relay_did_not_make_and_volumes_not_shared_with_it() {
        let (east, mut api) = testing::member("east");
        let vols = [
            volume(Some("east,west")),
            volume(None),
            volume(Some("north,west")),
        ];
        let run = tokio::spawn(async move { round(&east, &vols).await });
        api.expect("GET", CLAIM)
            .await
            .ok(claim("m-east-ffffffffffffffffffffffffffffffff"));
        assert!(run.await.unwrap().unwrap().is_empty());
        api.expect_done().await;
    }

    #[tokio::test]
    async fn a_pod_made_anew_under_the_name_waits_for_the_next_round() {
        let (east, mut api) = testing::member("east");
        let vols = [volume(Some("east,west"))];
        let run = tokio::spawn(async move { round(&east, &vols).await });
        api.expect("GET", CLAIM).await.ok(claim(ID));
        api.expect_page(PODS).await.ok(pods(vec![pod(
            "writer",
            Some("east-1"),
            "Running",
            "data",
        )]));
        api.expect("DELETE", &format!("{PODS}/writer"))
            .await
            .status(409, "Conflict", "Precondition failed: UID in precondition");
        assert!(run.await.unwrap().unwrap().is_empty());
        api.expect_done().await;
    }

    /// A pod the member refuses to delete (403) fails the round, but only
    /// after the other volumes had their turn.
    #[tokio::test]
    async fn a_refused_delete_leaves_the_other_volumes_fenced() {
        let (east, mut api) = testing::member("east");
        let mut other = volume(Some("east,west"));
        other.id = "m-east-ffffffffffffffffffffffffffffffff".into();
        other.backing = Backing::Member {
            member: "east".into(),
            namespace: "shop".into(),
            pvc: "logs".into(),
            selected_node: None,
            claim_uid: None,
        };
        let vols = [volume(Some("east,west")), other];
        let run = tokio::spawn(async move { round(&east, &vols).await });
        api.expect("GET", CLAIM).await.ok(claim(ID));
        api.expect_page(PODS).await.ok(pods(vec![pod(
            "writer",
            Some("east-1"),
            "Running",
            "data",
        )]));
        api.expect("DELETE", &format!("{PODS}/writer"))
            .await
            .status(403, "Forbidden", "pods \"writer\" is forbidden");
        let mut logs = claim("m-east-ffffffffffffffffffffffffffffffff");
        logs["metadata"]["name"] = json!("logs");
        api.expect("GET", "/api/v1/namespaces/shop/persistentvolumeclaims/logs")
            .await
            .ok(logs);
        api.expect_page(PODS).await.ok(pods(vec![pod(
            "tailer",
            Some("east-2"),
            "Running",
            "logs",
        )]));
        api.expect("DELETE", &format!("{PODS}/tailer"))
            .await
            .ok(pod("tailer", Some("east-2"), "Running", "logs"));
        let err = run.await.unwrap().unwrap_err();
        assert!(err.to_string().contains("forbidden"), "{err}");
        api.expect_done().await;
    }

    #[tokio::test]
    async fn an_unreachable_member_fails_the_round() {
        let (east, mut api) = testing::member("east");
        let vols = [volume(Some("east,west"))];
        let run = tokio::spawn(async move { round(&east, &vols).await });
        api.expect("GET", CLAIM).await.refuse();
        assert!(run.await.unwrap().is_err());
    }
}
