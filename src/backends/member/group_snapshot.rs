//! Member VolumeGroupSnapshots: the member claims of a host group snapshot
//! cut at one instant by the member's own snapshot-controller and driver,
//! and the VolumeSnapshots it makes mapped back to the relay's snapshots.
//! Through the dynamic API: the group snapshot CRDs are not part of
//! k8s-openapi, and members serve different versions of them.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};

use crate::domain::error::{CsiError, CsiResult};
use crate::domain::volume::{Backing, GroupSnapshot, Lifecycle, Snapshot};
use crate::k8s::cluster::Cluster;
use crate::k8s::naming;
use crate::k8s::POLL_INTERVAL;

pub const GROUP: &str = "groupsnapshot.storage.k8s.io";
/// The versions the relay can speak, newest first: the fields it uses
/// (spec.source.selector, spec.volumeGroupSnapshotClassName,
/// status.readyToUse, status.error) are the same in each.
const VERSIONS: [&str; 3] = ["v1", "v1beta2", "v1beta1"];
pub const DEFAULT_CLASS_ANNOTATION: &str = "groupsnapshot.storage.kubernetes.io/is-default-class";
/// The annotation naming the host group snapshot a member one is cut for.
pub const GROUP_ID_ANNOTATION: &str = "relay.csi.dev/group-snapshot-id";
/// The group's record and its snapshots' (JSON, `GroupRecord`): what a
/// controller with an empty state directory recovers the group from (the
/// deploy/ controller's state is an emptyDir: every new pod starts empty).
pub const GROUP_RECORD_ANNOTATION: &str = "relay.csi.dev/group-snapshot-record";

/// What a member VolumeGroupSnapshot carries of the host group snapshot.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct GroupRecord {
    pub group: GroupSnapshot,
    pub snapshots: Vec<Snapshot>,
}

fn resource(version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, version, kind), plural)
}

fn groups(version: &str) -> ApiResource {
    resource(version, "VolumeGroupSnapshot", "volumegroupsnapshots")
}

fn classes(version: &str) -> ApiResource {
    resource(
        version,
        "VolumeGroupSnapshotClass",
        "volumegroupsnapshotclasses",
    )
}

/// The group snapshot API version the member serves (its preferred one
/// when the relay speaks it), `None` when it serves none the relay knows.
pub async fn served_version(cluster: &Cluster) -> CsiResult<Option<&'static str>> {
    let client = cluster.client();
    let list = cluster
        .run("discover API groups", client.list_api_groups())
        .await?;
    let Some(group) = list.groups.iter().find(|g| g.name == GROUP) else {
        return Ok(None);
    };
    let preferred = group.preferred_version.as_ref().map(|v| v.version.as_str());
    let known = |v: &str| VERSIONS.iter().copied().find(|k| *k == v);
    if let Some(v) = preferred.and_then(known) {
        return Ok(Some(v));
    }
    Ok(VERSIONS
        .iter()
        .copied()
        .find(|k| group.versions.iter().any(|v| v.version == *k)))
}

/// How to use group snapshots when the member cannot: said in every refusal.
pub const PER_VOLUME_HINT: &str = "or set perVolumeSnapshots: \"true\" in the VolumeGroupSnapshotClass to cut one member VolumeSnapshot per volume, one after another (NOT crash-consistent)";

/// The member VolumeGroupSnapshotClass to cut with: `named`, which must be
/// of `driver`, or else the member's one default class of `driver`.
pub async fn class_for(
    cluster: &Cluster,
    version: &str,
    driver: &str,
    named: Option<&str>,
) -> CsiResult<String> {
    let api: Api<DynamicObject> = Api::all_with(cluster.client(), &classes(version));
    let mut of_driver: Vec<(String, bool)> = Vec::new();
    let mut found_named: Option<String> = None;
    cluster
        .list_pages(
            "list VolumeGroupSnapshotClasses",
            &api,
            kube::api::ListParams::default(),
            |items| {
                for c in items {
                    let name = c.metadata.name.clone().unwrap_or_default();
                    let its = c.data["driver"].as_str().unwrap_or_default().to_string();
                    if Some(name.as_str()) == named {
                        found_named = Some(its.clone());
                    }
                    if its == driver {
                        let default = c
                            .metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                            .is_some_and(|v| v == "true");
                        of_driver.push((name, default));
                    }
                }
                Ok::<_, CsiError>(())
            },
        )
        .await?;
    let label = cluster.label();
    if let Some(named) = named {
        return match found_named {
            Some(its) if its == driver => Ok(named.to_string()),
            Some(its) => Err(CsiError::FailedPrecondition(format!(
                "{label}: VolumeGroupSnapshotClass {named} (memberGroupSnapshotClass) is of driver {its:?}, but the claims are of {driver:?}"
            ))),
            None => Err(CsiError::FailedPrecondition(format!(
                "{label} has no VolumeGroupSnapshotClass {named} (memberGroupSnapshotClass)"
            ))),
        };
    }
    let defaults: Vec<&String> = of_driver.iter().filter(|c| c.1).map(|c| &c.0).collect();
    match defaults.as_slice() {
        [one] => Ok((*one).clone()),
        [] if of_driver.is_empty() => Err(CsiError::FailedPrecondition(format!(
            "{label} has no VolumeGroupSnapshotClass of driver {driver:?}: it offers no group snapshots of these claims there; make one if the driver can cut groups, {PER_VOLUME_HINT}"
        ))),
        [] => Err(CsiError::FailedPrecondition(format!(
            "{label}: none of the VolumeGroupSnapshotClasses of driver {driver:?} ({:?}) is the default ({DEFAULT_CLASS_ANNOTATION}); name one as memberGroupSnapshotClass",
            of_driver.iter().map(|c| &c.0).collect::<Vec<_>>()
        ))),
        many => Err(CsiError::FailedPrecondition(format!(
            "{label}: driver {driver:?} has several default VolumeGroupSnapshotClasses ({many:?}); name one as memberGroupSnapshotClass"
        ))),
    }
}

/// What one member VolumeGroupSnapshot is made from.
pub struct GroupPlan<'a> {
    pub version: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub class: &'a str,
    pub group_id: &'a str,
    pub driver_name: &'a str,
    /// The uuid label of each member claim: the selector takes exactly them.
    pub uuids: Vec<String>,
    /// `GroupRecord` as JSON.
    pub record: String,
}

pub fn manifest(plan: &GroupPlan<'_>) -> DynamicObject {
    let mut obj = DynamicObject::new(plan.name, &groups(plan.version)).within(plan.namespace);
    obj.metadata.labels = Some(BTreeMap::from([(
        naming::MANAGED_BY.to_string(),
        naming::MANAGER.to_string(),
    )]));
    obj.metadata.annotations = Some(BTreeMap::from([
        (GROUP_ID_ANNOTATION.to_string(), plan.group_id.to_string()),
        (
            naming::DRIVER_ANNOTATION.to_string(),
            plan.driver_name.to_string(),
        ),
        (GROUP_RECORD_ANNOTATION.to_string(), plan.record.clone()),
    ]));
    obj.data = serde_json::json!({
        "spec": {
            "volumeGroupSnapshotClassName": plan.class,
            "source": {"selector": {"matchExpressions": [{
                "key": naming::VOLUME_UUID_LABEL,
                "operator": "In",
                "values": plan.uuids,
            }]}},
        }
    });
    obj
}

fn status_error(obj: &DynamicObject) -> Option<String> {
    obj.data["status"]["error"]["message"]
        .as_str()
        .map(str::to_string)
}

/// Creates (or adopts) the member VolumeGroupSnapshot and waits up to
/// `wait` until it and a VolumeSnapshot of each of `claims` are ready to
/// use; returns each claim's member VolumeSnapshot. Not ready in time is
/// UNAVAILABLE (the CO retries).
pub async fn ensure_ready(
    cluster: &Cluster,
    obj: &DynamicObject,
    plan: &GroupPlan<'_>,
    claims: &[String],
    wait: Duration,
) -> CsiResult<BTreeMap<String, String>> {
    let (name, namespace) = (plan.name, plan.namespace);
    let label = cluster.label();
    let api: Api<DynamicObject> =
        Api::namespaced_with(cluster.client(), namespace, &groups(plan.version));
    let get_what = format!("get VolumeGroupSnapshot {namespace}/{name}");
    let created = cluster
        .create_or_missing(
            &format!("create VolumeGroupSnapshot {namespace}/{name}"),
            api.create(&PostParams::default(), obj),
        )
        .await?;
    let mut current = match created {
        Ok(Some(created)) => created,
        Ok(None) => {
            let existing = cluster.fetch(&get_what, api.get(name)).await?.ok_or_else(|| {
                CsiError::Aborted(format!(
                    "{label}: VolumeGroupSnapshot {namespace}/{name} vanished while being created; retry"
                ))
            })?;
            let owner = existing
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(GROUP_ID_ANNOTATION));
            if owner.map(String::as_str) != Some(plan.group_id) {
                return Err(CsiError::FailedPrecondition(format!(
                    "{label}: VolumeGroupSnapshot {namespace}/{name} exists but was not cut for group snapshot {}",
                    plan.group_id
                )));
            }
            existing
        }
        Err(message) => {
            return Err(CsiError::FailedPrecondition(format!(
                "{label}: cannot create VolumeGroupSnapshot {namespace}/{name}: {message}"
            )))
        }
    };
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let mut waiting = "it is not ready to use yet".to_string();
        if current.data["status"]["readyToUse"].as_bool() == Some(true) {
            let uid = current.metadata.uid.clone().unwrap_or_default();
            let found = of_group(&snapshots_in(cluster, namespace).await?, name, &uid);
            let missing: Vec<&String> = claims
                .iter()
                .filter(|c| !found.get(*c).is_some_and(|s| s.1))
                .collect();
            if missing.is_empty() {
                return Ok(found.into_iter().map(|(c, (s, _))| (c, s)).collect());
            }
            waiting = format!("no VolumeSnapshot of claims {missing:?} is ready to use yet");
        }
        if tokio::time::Instant::now() + POLL_INTERVAL > deadline {
            let why = status_error(&current)
                .map(|e| format!(": the member's snapshotter reports {e:?}"))
                .unwrap_or_default();
            return Err(CsiError::Unavailable(format!(
                "{label}: VolumeGroupSnapshot {namespace}/{name}: {waiting}{why}; retry"
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
        current = cluster
            .fetch(&get_what, api.get(name))
            .await?
            .ok_or_else(|| {
                CsiError::Aborted(format!(
                "{label}: VolumeGroupSnapshot {namespace}/{name} was deleted while being cut; retry"
            ))
            })?;
    }
}

/// Every VolumeSnapshot in `namespace` of the member.
pub async fn snapshots_in(cluster: &Cluster, namespace: &str) -> CsiResult<Vec<DynamicObject>> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(cluster.client(), namespace, &super::snapshot::resource());
    let mut all = Vec::new();
    cluster
        .list_pages(
            &format!("list VolumeSnapshots in {namespace}"),
            &api,
            kube::api::ListParams::default(),
            |items| {
                all.extend(items);
                Ok::<_, CsiError>(())
            },
        )
        .await?;
    Ok(all)
}

/// Of `snapshots`, those the member made for its VolumeGroupSnapshot
/// `group` (owned by it, or naming it in their status), by the claim each
/// is of: (name, ready to use). Names the member chose are checked before
/// use.
pub fn of_group(
    snapshots: &[DynamicObject],
    group: &str,
    uid: &str,
) -> BTreeMap<String, (String, bool)> {
    let mut found = BTreeMap::new();
    for s in snapshots {
        let owned = s
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "VolumeGroupSnapshot" && !uid.is_empty() && o.uid == uid);
        let named = s.data["status"]["volumeGroupSnapshotName"].as_str() == Some(group);
        let (Some(name), Some(claim)) = (
            s.metadata.name.as_ref(),
            s.data["spec"]["source"]["persistentVolumeClaimName"].as_str(),
        ) else {
            continue;
        };
        if (owned || named) && crate::domain::validate::is_object_name(name) {
            let ready = s.data["status"]["readyToUse"].as_bool() == Some(true);
            found.insert(claim.to_string(), (name.clone(), ready));
        }
    }
    found
}

/// Deletes the member VolumeGroupSnapshot (its class's deletionPolicy
/// decides what becomes of the data); already gone, or no group snapshot
/// API at all, is success.
pub async fn delete(cluster: &Cluster, namespace: &str, name: &str) -> CsiResult<()> {
    let Some(version) = served_version(cluster).await? else {
        return Ok(());
    };
    let api: Api<DynamicObject> =
        Api::namespaced_with(cluster.client(), namespace, &groups(version));
    Ok(cluster
        .remove(
            &format!("delete VolumeGroupSnapshot {namespace}/{name}"),
            api.delete(name, &DeleteParams::background()),
        )
        .await?)
}

/// Every VolumeGroupSnapshot in the member marked as made by csi-relay,
/// handed to `each` page by page; a member without the group snapshot API
/// has none.
pub async fn made_by_relay(cluster: &Cluster, each: impl FnMut(DynamicObject)) -> CsiResult<()> {
    let Some(version) = served_version(cluster).await? else {
        return Ok(());
    };
    super::snapshot::list_made_by_relay(
        cluster,
        "list csi-relay VolumeGroupSnapshots",
        &groups(version),
        each,
    )
    .await
}

/// The group record a member VolumeGroupSnapshot carries, taken only as far
/// as it agrees with the object: its id with the id annotation, its driver
/// name, each snapshot of it, in this member and the object's namespace, of
/// a volume of this member (`settled` then says how far it is cut).
pub fn recovered(
    member: &str,
    driver_name: &str,
    obj: &DynamicObject,
) -> Result<GroupRecord, String> {
    let annotation = |k: &str| obj.metadata.annotations.as_ref().and_then(|a| a.get(k));
    if annotation(naming::DRIVER_ANNOTATION).map(String::as_str) != Some(driver_name) {
        return Err("made by another driver name".into());
    }
    let raw = annotation(GROUP_RECORD_ANNOTATION).ok_or("no record")?;
    let record: GroupRecord =
        serde_json::from_str(raw).map_err(|e| format!("record unreadable: {e}"))?;
    let group = &record.group;
    if annotation(GROUP_ID_ANNOTATION) != Some(&group.id)
        || obj.metadata.name.as_deref() != Some(naming::group_snapshot_name(&group.id).as_str())
    {
        return Err("the record's id is not the object's".into());
    }
    crate::domain::validate::id(&group.id, "group_snapshot_id").map_err(|e| e.to_string())?;
    crate::domain::validate::id(&group.name, "name").map_err(|e| e.to_string())?;
    let ids: Vec<&String> = record.snapshots.iter().map(|s| &s.id).collect();
    if ids != group.snapshot_ids.iter().collect::<Vec<_>>() {
        return Err("the record's snapshots are not its group's".into());
    }
    for snap in &record.snapshots {
        crate::domain::validate::id(&snap.id, "snapshot_id").map_err(|e| e.to_string())?;
        crate::domain::validate::id(&snap.name, "name").map_err(|e| e.to_string())?;
        let Backing::Member {
            member: m,
            namespace,
            ..
        } = &snap.backing
        else {
            return Err("not a member snapshot".into());
        };
        if m != member
            || obj.metadata.namespace.as_ref() != Some(namespace)
            || snap.group_snapshot_id.as_ref() != Some(&group.id)
            || naming::parse_volume_id(&snap.source_volume_id).map(|(m, _)| m) != Some(member)
        {
            return Err(
                "a snapshot's member, namespace, group or source volume disagrees with the object"
                    .into(),
            );
        }
    }
    Ok(record)
}

/// `record`, recovered from `obj`, as far as the member shows it cut:
/// ready (with each snapshot's member VolumeSnapshot, from `snapshots` of
/// the object's namespace) iff the member shows the group and a
/// VolumeSnapshot of each claim ready; else unfinished, which housekeeping
/// rolls back.
pub fn settled(
    mut record: GroupRecord,
    obj: &DynamicObject,
    snapshots: &[DynamicObject],
) -> GroupRecord {
    let found = of_group(
        snapshots,
        obj.metadata.name.as_deref().unwrap_or_default(),
        obj.metadata.uid.as_deref().unwrap_or_default(),
    );
    let cut = obj.data["status"]["readyToUse"].as_bool() == Some(true)
        && record.snapshots.iter().all(|s| match &s.backing {
            Backing::Member { pvc, .. } => found.get(pvc).is_some_and(|f| f.1),
            _ => false,
        });
    let lifecycle = if cut {
        Lifecycle::Ready
    } else {
        Lifecycle::Provisioning
    };
    record.group.lifecycle = lifecycle;
    for snap in &mut record.snapshots {
        snap.lifecycle = lifecycle;
        snap.member_snapshot = match &snap.backing {
            Backing::Member { pvc, .. } if cut => found.get(pvc).map(|f| f.0.clone()),
            _ => None,
        };
    }
    record
}
