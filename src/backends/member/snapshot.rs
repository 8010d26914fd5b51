//! Member VolumeSnapshots, through the dynamic API (the snapshot CRDs are
//! not part of k8s-openapi). A member without the snapshot API gets a clear
//! FAILED_PRECONDITION, not a NOT_FOUND that looks like a missing object.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};

use crate::domain::error::{CsiError, CsiResult};
use crate::k8s::cluster::Cluster;
use crate::k8s::error::KubeResult;
use crate::k8s::POLL_INTERVAL;

pub const GROUP: &str = "snapshot.storage.k8s.io";
pub const VERSION: &str = "v1";

pub fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, "VolumeSnapshot"),
        "volumesnapshots",
    )
}

/// What one member VolumeSnapshot is made from.
pub struct SnapshotPlan<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub pvc: &'a str,
    pub class: Option<&'a str>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

pub fn manifest(plan: &SnapshotPlan<'_>) -> DynamicObject {
    let mut obj = DynamicObject::new(plan.name, &resource()).within(plan.namespace);
    obj.metadata.labels = Some(plan.labels.clone());
    obj.metadata.annotations = Some(plan.annotations.clone());
    let mut spec = serde_json::json!({
        "source": {"persistentVolumeClaimName": plan.pvc},
    });
    if let Some(class) = plan.class {
        spec["volumeSnapshotClassName"] = class.into();
    }
    obj.data = serde_json::json!({ "spec": spec });
    obj
}

fn ready(obj: &DynamicObject) -> bool {
    obj.data["status"]["readyToUse"].as_bool() == Some(true)
}

fn error(obj: &DynamicObject) -> Option<String> {
    obj.data["status"]["error"]["message"]
        .as_str()
        .map(str::to_string)
}

/// Whether the member serves snapshot.storage.k8s.io/v1.
async fn api_served(cluster: &Cluster) -> CsiResult<bool> {
    let client = cluster.client();
    let gv = format!("{GROUP}/{VERSION}");
    Ok(cluster
        .fetch(
            &format!("discover {gv}"),
            client.list_api_group_resources(&gv),
        )
        .await?
        .is_some())
}

fn no_api(cluster: &Cluster) -> CsiError {
    CsiError::FailedPrecondition(format!(
        "{} has no VolumeSnapshot API ({GROUP}/{VERSION} is not served): install the snapshot CRDs and snapshot controller there to snapshot its volumes",
        cluster.label()
    ))
}

/// Creates (or adopts) the member VolumeSnapshot and waits up to `wait` for
/// it to be ready to use; not ready in time is UNAVAILABLE (the CO retries).
pub async fn ensure_ready(
    cluster: &Cluster,
    obj: &DynamicObject,
    snapshot_id: &str,
    wait: Duration,
) -> CsiResult<()> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let namespace = obj.metadata.namespace.clone().unwrap_or_default();
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), &namespace, &resource());
    let get_what = format!("get VolumeSnapshot {namespace}/{name}");
    let created = cluster
        .create_or_missing(
            &format!("create VolumeSnapshot {namespace}/{name}"),
            api.create(&PostParams::default(), obj),
        )
        .await?;
    let mut current = match created {
        Ok(Some(created)) => created,
        Ok(None) => {
            let existing = cluster
                .fetch(&get_what, api.get(&name))
                .await?
                .ok_or_else(|| {
                    CsiError::Aborted(format!(
                        "{}: VolumeSnapshot {namespace}/{name} vanished while being created; retry",
                        cluster.label()
                    ))
                })?;
            let owner = existing
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(crate::k8s::naming::SNAPSHOT_ID_ANNOTATION));
            if owner.map(String::as_str) != Some(snapshot_id) {
                return Err(CsiError::FailedPrecondition(format!(
                    "{}: VolumeSnapshot {namespace}/{name} exists but does not belong to snapshot {snapshot_id}",
                    cluster.label()
                )));
            }
            existing
        }
        Err(message) => {
            return Err(if api_served(cluster).await? {
                CsiError::FailedPrecondition(format!(
                    "{}: cannot create VolumeSnapshot {namespace}/{name}: {message}",
                    cluster.label()
                ))
            } else {
                no_api(cluster)
            })
        }
    };
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if ready(&current) {
            return Ok(());
        }
        if tokio::time::Instant::now() + POLL_INTERVAL > deadline {
            let why = error(&current)
                .map(|e| format!(": the member's snapshotter reports {e:?}"))
                .unwrap_or_default();
            return Err(CsiError::Unavailable(format!(
                "{}: VolumeSnapshot {namespace}/{name} is not ready to use yet{why}; retry",
                cluster.label()
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
        current = cluster
            .fetch(&get_what, api.get(&name))
            .await?
            .ok_or_else(|| {
                CsiError::Aborted(format!(
                    "{}: VolumeSnapshot {namespace}/{name} was deleted while being cut; retry",
                    cluster.label()
                ))
            })?;
    }
}

/// Deletes the member VolumeSnapshot; already gone (or no snapshot API at
/// all) is success.
pub async fn delete(cluster: &Cluster, namespace: &str, name: &str) -> KubeResult<()> {
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), namespace, &resource());
    cluster
        .remove(
            &format!("delete VolumeSnapshot {namespace}/{name}"),
            api.delete(name, &DeleteParams::background()),
        )
        .await
}

/// Every VolumeSnapshot in the member marked as made by csi-relay, handed
/// to `each` page by page; a member without the snapshot API has none.
pub async fn made_by_relay(cluster: &Cluster, each: impl FnMut(DynamicObject)) -> CsiResult<()> {
    list_made_by_relay(cluster, "list csi-relay VolumeSnapshots", &resource(), each).await
}

/// Every object of `resource`, in all namespaces, marked as made by
/// csi-relay (`app.kubernetes.io/managed-by=csi-relay`), handed to `each`
/// page by page; an API the member does not serve has none.
pub async fn list_made_by_relay(
    cluster: &Cluster,
    what: &str,
    resource: &ApiResource,
    mut each: impl FnMut(DynamicObject),
) -> CsiResult<()> {
    let api: Api<DynamicObject> = Api::all_with(cluster.client(), resource);
    let params = kube::api::ListParams::default().labels(&format!(
        "{}={}",
        crate::k8s::naming::MANAGED_BY,
        crate::k8s::naming::MANAGER
    ));
    cluster
        .list_pages(what, &api, params, |items| {
            items.into_iter().for_each(&mut each);
            Ok::<_, CsiError>(())
        })
        .await?;
    Ok(())
}

/// The snapshot record a member VolumeSnapshot carries, taken only as far
/// as it agrees with the object itself: its id with the id annotation, its
/// member with `member`, its namespace and claim with the object's, its
/// source volume with a volume id of that member. Ready iff the member
/// says it is ready to use.
pub fn recovered(
    member: &str,
    driver_name: &str,
    obj: &DynamicObject,
) -> Result<crate::domain::volume::Snapshot, String> {
    use crate::domain::volume::{Backing, Lifecycle};
    use crate::k8s::naming;
    let annotation = |k: &str| obj.metadata.annotations.as_ref().and_then(|a| a.get(k));
    if annotation(naming::DRIVER_ANNOTATION).map(String::as_str) != Some(driver_name) {
        return Err("made by another driver name".into());
    }
    let record = annotation(naming::SNAPSHOT_RECORD_ANNOTATION).ok_or("no record")?;
    let mut snap: crate::domain::volume::Snapshot =
        serde_json::from_str(record).map_err(|e| format!("record unreadable: {e}"))?;
    if annotation(naming::SNAPSHOT_ID_ANNOTATION) != Some(&snap.id) {
        return Err("the record's id is not the object's".into());
    }
    crate::domain::validate::id(&snap.id, "snapshot_id").map_err(|e| e.to_string())?;
    crate::domain::validate::id(&snap.name, "name").map_err(|e| e.to_string())?;
    let Backing::Member {
        member: m,
        namespace,
        pvc,
        ..
    } = &snap.backing
    else {
        return Err("not a member snapshot".into());
    };
    let source = obj.data["spec"]["source"]["persistentVolumeClaimName"].as_str();
    if m != member
        || obj.metadata.namespace.as_ref() != Some(namespace)
        || source != Some(pvc.as_str())
        || naming::parse_volume_id(&snap.source_volume_id).map(|(m, _)| m) != Some(member)
    {
        return Err(
            "its member, namespace, claim or source volume disagree with the object".into(),
        );
    }
    if snap.group_snapshot_id.is_some() {
        return Err("group snapshots are not recovered".into());
    }
    snap.lifecycle = if ready(obj) {
        Lifecycle::Ready
    } else {
        Lifecycle::Provisioning
    };
    Ok(snap)
}
