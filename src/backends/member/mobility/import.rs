//! An import: a volume of shared storage (`domain::sharing`) made visible
//! in a member other than the one that provisioned it, where a pod of it
//! runs. A PV naming the same data as the origin's PV (reclaim Retain, so
//! removing the import never deletes data) pre-bound to a claim named as
//! the origin's member claim, which is what a mirrored pod's claim name
//! finds. Both carry the relay's marks; the relay removes only what
//! carries them.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PersistentVolumeSpec, Pod, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};

use crate::backends::member::claim_create;
use crate::backends::member::pvc::{self, claims};
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::sharing::Sharing;
use crate::domain::volume::Volume;
use crate::k8s::cluster::Cluster;
use crate::k8s::converge::{self, Waited};
use crate::k8s::naming::{self, MemberVolume};

/// Label on an import's PV and claim: the member that made the volume.
pub const IMPORTED_FROM_LABEL: &str = "relay.csi.dev/imported-from";

/// Volume context key: the origin PV's source as an import needs it
/// (JSON), kept by the CO in the host PV from CreateVolume on, so a member
/// can import the volume while the one that made it is lost.
pub const SHARED_SOURCE_KEY: &str = "relay.csi.dev/shared-source";

/// Longest recorded source taken back (it is read from a host PV).
const MAX_RECORDED: usize = 16 * 1024;

/// What an import needs of the origin's PV, as JSON.
pub fn recorded(pv: &PersistentVolume) -> CsiResult<String> {
    let spec = pv.spec.clone().unwrap_or_default();
    let kept = PersistentVolume {
        metadata: ObjectMeta {
            name: pv.metadata.name.clone(),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: spec.capacity,
            access_modes: spec.access_modes,
            volume_mode: spec.volume_mode,
            mount_options: spec.mount_options,
            csi: spec.csi,
            nfs: spec.nfs,
            host_path: spec.host_path,
            local: spec.local,
            ..Default::default()
        }),
        status: None,
    };
    let text = serde_json::to_string(&kept)
        .map_err(|e| CsiError::Internal(format!("encode the shared source: {e}")))?;
    if text.len() > MAX_RECORDED {
        return Err(CsiError::FailedPrecondition(format!(
            "PersistentVolume {} describes its source in {} bytes, more than the {MAX_RECORDED} a shared volume's context keeps",
            pv.metadata.name.as_deref().unwrap_or_default(),
            text.len()
        )));
    }
    Ok(text)
}

/// The origin's PV as `recorded` kept it.
pub fn from_recorded(text: &str) -> Result<PersistentVolume, String> {
    if text.len() > MAX_RECORDED {
        return Err(format!("{} bytes, more than {MAX_RECORDED}", text.len()));
    }
    serde_json::from_str(text).map_err(|e| e.to_string())
}

/// The import PV's name, the same in every member that imports the volume.
pub fn pv_name(uuid: &str) -> String {
    format!("relay-{uuid}-import")
}

/// The import PV of `origin` (the origin member's bound PV) for member
/// `to`. FAILED_PRECONDITION when the origin's source cannot be named from
/// another member: a directory outside the shared mount, a raw block
/// `local` device, a source type the relay does not relay.
pub fn pv_manifest(
    vol: &Volume,
    at: &MemberVolume,
    origin: &PersistentVolume,
    sharing: &Sharing,
    to: &str,
    driver_name: &str,
) -> CsiResult<PersistentVolume> {
    let from = at.member.as_str();
    let origin_name = origin.metadata.name.as_deref().unwrap_or_default();
    let refuse = |why: String| {
        CsiError::FailedPrecondition(format!(
            "volume {} cannot be imported into member cluster {to}: PersistentVolume {origin_name} in member cluster {from} {why}",
            vol.id
        ))
    };
    let spec = origin
        .spec
        .as_ref()
        .ok_or_else(|| refuse("has no spec".into()))?;
    let mut imported = PersistentVolumeSpec {
        access_modes: spec.access_modes.clone(),
        capacity: spec.capacity.clone(),
        mount_options: spec.mount_options.clone(),
        volume_mode: spec.volume_mode.clone(),
        persistent_volume_reclaim_policy: Some("Retain".into()),
        storage_class_name: Some(String::new()),
        claim_ref: Some(ObjectReference {
            namespace: Some(at.namespace.clone()),
            name: Some(at.pvc.clone()),
            kind: Some("PersistentVolumeClaim".into()),
            api_version: Some("v1".into()),
            ..Default::default()
        }),
        // No node affinity: the class says every node of the sharing
        // members reaches the storage; the origin's affinity names nodes
        // of another cluster.
        ..Default::default()
    };
    let directory = |path: &str| -> CsiResult<HostPathVolumeSource> {
        let path = sharing.translate(path, from, to).map_err(refuse)?;
        // `Directory`, never `DirectoryOrCreate`: on a node where the
        // shared filesystem is not mounted the directory is missing, and
        // the pod must fail there rather than start on an empty one.
        Ok(HostPathVolumeSource {
            path,
            type_: Some("Directory".into()),
        })
    };
    if from == to && sharing.moves() {
        // The access claim of a movable volume in the member that holds
        // its data: the source as it is, where it is (a local PV keeps
        // its node); nothing else reaches it.
        imported.node_affinity = spec.node_affinity.clone();
        imported.csi = spec.csi.clone();
        imported.nfs = spec.nfs.clone();
        imported.host_path = spec.host_path.clone();
        imported.local = spec.local.clone();
        if imported.csi.is_none()
            && imported.nfs.is_none()
            && imported.host_path.is_none()
            && imported.local.is_none()
        {
            return Err(refuse(
                "has a source csi-relay cannot import (supported: csi, nfs, hostPath, local)"
                    .into(),
            ));
        }
    } else if let Some(csi) = &spec.csi {
        imported.csi = Some(csi.clone());
    } else if let Some(nfs) = &spec.nfs {
        imported.nfs = Some(nfs.clone());
    } else if let Some(hp) = &spec.host_path {
        imported.host_path = Some(directory(&hp.path)?);
    } else if let Some(local) = &spec.local {
        if spec.volume_mode.as_deref() == Some("Block") {
            return Err(refuse(
                "is a raw block device on one node (local, volumeMode Block), which no other member reaches".into(),
            ));
        }
        imported.host_path = Some(directory(&local.path)?);
    } else {
        return Err(refuse(
            "has a source csi-relay cannot import (supported: csi, nfs, hostPath, local)".into(),
        ));
    }
    let mut labels = naming::labels(&at.uuid);
    labels.insert(IMPORTED_FROM_LABEL.into(), from.to_string());
    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(pv_name(&at.uuid)),
            labels: Some(labels),
            annotations: Some(
                [
                    (naming::VOLUME_ID_ANNOTATION.to_string(), vol.id.clone()),
                    (
                        naming::DRIVER_ANNOTATION.to_string(),
                        driver_name.to_string(),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(imported),
        status: None,
    })
}

/// The import's claim: the origin claim's name and namespace, bound to the
/// import PV by name (class "": no provisioner of the member touches it).
pub fn claim_manifest(
    at: &MemberVolume,
    pv: &PersistentVolume,
    host_metadata: (BTreeMap<String, String>, BTreeMap<String, String>),
) -> PersistentVolumeClaim {
    let (mut labels, annotations) = host_metadata;
    labels.insert(IMPORTED_FROM_LABEL.into(), at.member.clone());
    let spec = pv.spec.clone().unwrap_or_default();
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(at.pvc.clone()),
            namespace: Some(at.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: spec.access_modes,
            storage_class_name: Some(String::new()),
            volume_mode: spec.volume_mode,
            volume_name: pv.metadata.name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: spec.capacity.map(|c| {
                    c.into_iter()
                        .filter(|(k, _)| k == "storage")
                        .collect::<BTreeMap<_, _>>()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

fn is_ours(meta: &ObjectMeta, at: &MemberVolume) -> bool {
    let labels = meta.labels.as_ref();
    labels.and_then(|l| l.get(naming::VOLUME_UUID_LABEL)) == Some(&at.uuid)
        && labels.and_then(|l| l.get(IMPORTED_FROM_LABEL)) == Some(&at.member)
}

/// Makes the import in `cluster` (idempotent) and waits up to `wait` for
/// its claim to be Bound. A Kosmos copy of the host claim holding the
/// claim's name is replaced, as at CreateVolume.
pub async fn ensure(
    cluster: &Cluster,
    at: &MemberVolume,
    pv: &PersistentVolume,
    claim: &PersistentVolumeClaim,
    volume_id: &str,
    wait: Duration,
) -> CsiResult<()> {
    let label = cluster.label().to_string();
    let name = pv.metadata.name.clone().unwrap_or_default();
    let pvs = Api::<PersistentVolume>::all(cluster.client());
    let made = cluster
        .create(
            &format!("create PersistentVolume {name}"),
            pvs.create(&PostParams::default(), pv),
        )
        .await?;
    let existing = match made {
        Some(made) => made,
        None => pvc::get_pv(cluster, &name).await?.ok_or_else(|| {
            CsiError::Aborted(format!(
                "{label}: PersistentVolume {name} vanished while it was made; retry"
            ))
        })?,
    };
    if !is_ours(&existing.metadata, at) {
        return Err(CsiError::AlreadyExists(format!(
            "{label}: PersistentVolume {name} exists and is not csi-relay's import of volume {volume_id}; the relay never adopts it: delete or rename it"
        )));
    }
    if existing.metadata.deletion_timestamp.is_some() {
        return Err(CsiError::Unavailable(format!(
            "{label}: PersistentVolume {name} (an earlier import of volume {volume_id}) is being deleted; retry once it is gone"
        )));
    }
    let made = claim_create::ensure(cluster, claim, volume_id).await?;
    release_stale_binding(cluster, &existing, &made).await?;
    let path = at.pvc_path();
    let api = claims(cluster, &at.namespace);
    let gone = || {
        CsiError::Aborted(format!(
            "{label}: import claim {path} was deleted while binding; retry"
        ))
    };
    let bound = |c: &PersistentVolumeClaim| pvc::phase(c) == "Bound";
    let first = wait.min(NUDGE_AFTER);
    let mut waited = converge::until(cluster, &api, made, first, bound, gone).await?;
    if let Waited::TimedOut(current) = waited {
        nudge(cluster, &current, &name).await?;
        let rest = wait.saturating_sub(first);
        waited = converge::until(cluster, &api, current, rest, bound, gone).await?;
    }
    match waited {
        Waited::Reached(_) => Ok(()),
        Waited::TimedOut(current) => Err(CsiError::Unavailable(format!(
            "{label}: import claim {path} is {}, not yet Bound to PersistentVolume {name}, after {} s; retry",
            pvc::phase(&current),
            wait.as_secs()
        ))),
    }
}

/// How long an import claim may stay Pending before the relay nudges the
/// member's PV controller. Measured on v1.28: the controller binds the PV
/// to the new claim at once, and then, seemingly when the PV's event came
/// before the claim's, leaves the claim Pending until its periodic resync
/// (8.2 s after, with no other write to the claim): an update of the claim
/// makes it finish at once.
const NUDGE_AFTER: Duration = Duration::from_secs(2);

/// Annotation the nudge writes (the time, so each nudge is a change).
const NUDGE_ANNOTATION: &str = "relay.csi.dev/bind-nudged";

/// Wakes the member's PV controller for `claim` once import PV `pv` names
/// it (claimRef with its uid): an annotation update is an event for it.
/// Nothing when the PV is not bound to it yet (the controller is still at
/// work on the PV side).
async fn nudge(cluster: &Cluster, claim: &PersistentVolumeClaim, pv: &str) -> CsiResult<()> {
    let bound_to_it = pvc::get_pv(cluster, pv).await?.is_some_and(|v| {
        v.spec
            .and_then(|s| s.claim_ref)
            .and_then(|r| r.uid)
            .is_some_and(|uid| Some(uid) == claim.metadata.uid)
    });
    if !bound_to_it {
        return Ok(());
    }
    let name = claim.metadata.name.clone().unwrap_or_default();
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis().to_string())
        .unwrap_or_default();
    let patch = serde_json::json!({
        "metadata": {"uid": claim.metadata.uid, "annotations": {NUDGE_ANNOTATION: now}},
    });
    cluster
        .run(
            &format!("annotate PersistentVolumeClaim {namespace}/{name}"),
            claims(cluster, &namespace).patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            ),
        )
        .await?;
    tracing::info!(member = %cluster.name(), pvc = %format!("{namespace}/{name}"), pv, "import claim nudged: its PV names it, the member's PV controller had not finished binding");
    Ok(())
}

/// A PV kept from an import whose claim went (a crash between the two
/// deletes) still names that claim's uid, and the member's PV controller
/// will not bind it to the new one: the stale uid goes.
async fn release_stale_binding(
    cluster: &Cluster,
    pv: &PersistentVolume,
    claim: &PersistentVolumeClaim,
) -> CsiResult<()> {
    let bound_uid = pv
        .spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.as_deref());
    match (bound_uid, claim.metadata.uid.as_deref()) {
        (Some(old), Some(new)) if old != new => {}
        _ => return Ok(()),
    }
    let name = pv.metadata.name.clone().unwrap_or_default();
    let patch = serde_json::json!({
        "metadata": {"uid": pv.metadata.uid},
        "spec": {"claimRef": {"uid": null, "resourceVersion": null}},
    });
    cluster
        .run(
            &format!("release PersistentVolume {name} from an earlier import claim"),
            Api::<PersistentVolume>::all(cluster.client()).patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            ),
        )
        .await?;
    Ok(())
}

/// Whether `claim` is the relay's access claim (or import claim) of the
/// volume `at` names: what decides is what the relay made and the member
/// cannot have copied, the binding to the import PV by `volumeName`
/// (immutable once set, and that PV's `claimRef` names this claim); the
/// marks alone are not enough, since Kosmos copies them.
pub fn is_access_claim(claim: &PersistentVolumeClaim, at: &MemberVolume, volume_id: &str) -> bool {
    let names_the_import = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref())
        == Some(pv_name(&at.uuid).as_str());
    names_the_import && pvc::belongs_to(claim, volume_id)
}

/// The pods of `cluster` placed on a node that use the claim named as the
/// volume's, as `pod ns/name on node N` (finished pods do not count).
pub async fn users(cluster: &Cluster, at: &MemberVolume) -> CsiResult<Vec<String>> {
    Ok(pods_using(cluster, at)
        .await?
        .iter()
        .map(|pod| {
            format!(
                "pod {}/{} on node {}",
                at.namespace,
                pod.metadata.name.as_deref().unwrap_or_default(),
                pod.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_deref())
                    .unwrap_or_default()
            )
        })
        .collect())
}

/// The pods of `cluster` placed on a node, not finished, whose volumes
/// name the claim `at` names.
pub async fn pods_using(cluster: &Cluster, at: &MemberVolume) -> CsiResult<Vec<Pod>> {
    let pods = Api::<Pod>::namespaced(cluster.client(), &at.namespace);
    let mut found = Vec::new();
    cluster
        .list_pages(
            &format!("list Pods in {}", at.namespace),
            &pods,
            ListParams::default(),
            |page: Vec<Pod>| {
                for pod in page {
                    let status = pod.status.as_ref().and_then(|s| s.phase.as_deref());
                    if matches!(status, Some("Succeeded") | Some("Failed")) {
                        continue;
                    }
                    // A pod no node took mounts nothing (a mirrored pod
                    // waiting for its claim).
                    let Some(spec) = pod.spec.as_ref().filter(|s| s.node_name.is_some()) else {
                        continue;
                    };
                    let uses = spec.volumes.iter().flatten().any(|v| {
                        v.persistent_volume_claim
                            .as_ref()
                            .is_some_and(|c| c.claim_name == at.pvc)
                    });
                    if uses {
                        found.push(pod);
                    }
                }
                Ok::<_, CsiError>(())
            },
        )
        .await?;
    Ok(found)
}

/// Removes the import from `cluster`: its claim, then its PV (Retain: the
/// data stays). UNAVAILABLE while a pod there still uses the claim, so a
/// single-writer volume is never written from two members at once.
pub async fn remove(cluster: &Cluster, at: &MemberVolume, volume_id: &str) -> CsiResult<()> {
    // The import's claim names the import's PV; a copy that inherited the
    // marks names the host's, and is not the relay's to delete. Only pods
    // of the relay's claim hold the release: a pod placed by hand on a node
    // that names a claim the relay never made there (a publish that was
    // refused) mounts nothing of the volume, and must not keep its
    // unpublish from ever succeeding.
    if let Some(claim) = pvc::get(cluster, &at.namespace, &at.pvc)
        .await?
        .filter(|c| is_access_claim(c, at, volume_id))
    {
        let users = users(cluster, at).await?;
        if !users.is_empty() {
            return Err(CsiError::Unavailable(format!(
                "{}: the import of volume {volume_id} is still used by {}; it is removed once no pod there uses it (retry)",
                cluster.label(),
                users.join(", ")
            )));
        }
        pvc::delete_exactly(cluster, &claim).await?;
    }
    let name = pv_name(&at.uuid);
    let Some(pv) = pvc::get_pv(cluster, &name).await? else {
        return Ok(());
    };
    if !is_ours(&pv.metadata, at) {
        tracing::warn!(member = %cluster.name(), pv = %name, volume_id, "PersistentVolume of the import's name is not the relay's; left alone");
        return Ok(());
    }
    pvc::delete_pv_exactly(cluster, &pv).await?;
    tracing::info!(member = %cluster.name(), volume_id, pv = %name, "import removed (the data stays)");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::params::VolumeParams;
    use crate::domain::volume::{Backing, Lifecycle};
    use serde_json::json;

    fn at() -> MemberVolume {
        MemberVolume {
            member: "east".into(),
            namespace: "shop".into(),
            pvc: "data".into(),
            uuid: "0a1b".into(),
            selected_node: None,
            claim_uid: None,
        }
    }

    fn vol() -> Volume {
        Volume {
            id: "m-east-0a1b".into(),
            name: "pvc-1".into(),
            capacity_bytes: 1 << 30,
            backing: Backing::Member {
                member: "east".into(),
                namespace: "shop".into(),
                pvc: "data".into(),
                selected_node: None,
                claim_uid: None,
            },
            capabilities: vec![],
            parameters: Default::default(),
            mutable_parameters: Default::default(),
            source: None,
            topology: vec![],
            context: Default::default(),
            created_unix: 0,
            lifecycle: Lifecycle::Ready,
            ephemeral: false,
            nodes: Default::default(),
        }
    }

    fn sharing(paths: Option<&str>) -> Sharing {
        Sharing::of(&VolumeParams {
            shared_with: Some("east,west".into()),
            shared_paths: paths.map(str::to_string),
            ..Default::default()
        })
        .unwrap()
        .unwrap()
    }

    fn origin(source: serde_json::Value, mode: &str) -> PersistentVolume {
        let mut spec = json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
            "volumeMode": mode, "mountOptions": ["noatime"],
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "fast",
            "claimRef": {"namespace": "shop", "name": "data", "uid": "u-1"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["east-1"]}]}]}}});
        for (k, v) in source.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(json!({"metadata": {"name": "pv-east"}, "spec": spec})).unwrap()
    }

    #[test]
    fn csi_and_nfs_sources_are_named_as_they_are_and_kept() {
        for source in [
            json!({"csi": {"driver": "cephfs.csi.ceph.com", "volumeHandle": "0001-abc",
                           "volumeAttributes": {"clusterID": "c1"},
                           "nodeStageSecretRef": {"name": "s", "namespace": "ceph"}}}),
            json!({"nfs": {"server": "filer", "path": "/exports/a"}}),
        ] {
            let pv = pv_manifest(
                &vol(),
                &at(),
                &origin(source.clone(), "Filesystem"),
                &sharing(None),
                "west",
                "relay.csi.dev",
            )
            .unwrap();
            let got = serde_json::to_value(&pv).unwrap();
            let key = source.as_object().unwrap().keys().next().unwrap().clone();
            assert_eq!(got["spec"][&key], source[&key], "{got}");
            assert_eq!(got["spec"]["persistentVolumeReclaimPolicy"], "Retain");
            assert_eq!(got["spec"]["storageClassName"], "");
            assert_eq!(
                got["spec"]["claimRef"],
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "shop", "name": "data"})
            );
            assert_eq!(got["spec"]["mountOptions"], json!(["noatime"]));
            assert_eq!(got["spec"]["accessModes"], json!(["ReadWriteMany"]));
            assert!(got["spec"].get("nodeAffinity").is_none(), "{got}");
            assert_eq!(got["metadata"]["name"], "relay-0a1b-import");
            assert_eq!(got["metadata"]["labels"][IMPORTED_FROM_LABEL], "east");
        }
    }

    #[test]
    fn directories_move_under_the_importing_members_mount_and_block_devices_do_not() {
        let s = sharing(Some("east=/mnt/e,west=/srv/w"));
        let local = origin(json!({"local": {"path": "/mnt/e/v/pvc-1"}}), "Filesystem");
        let pv = pv_manifest(&vol(), &at(), &local, &s, "west", "relay.csi.dev").unwrap();
        let hp = pv.spec.unwrap().host_path.unwrap();
        assert_eq!(
            (hp.path.as_str(), hp.type_.as_deref()),
            ("/srv/w/v/pvc-1", Some("Directory"))
        );
        let block = origin(json!({"local": {"path": "/dev/sdb"}}), "Block");
        let err = pv_manifest(&vol(), &at(), &block, &s, "west", "relay.csi.dev").unwrap_err();
        assert!(err.to_string().contains("raw block device"), "{err}");
        let outside = origin(json!({"hostPath": {"path": "/var/lib/x"}}), "Filesystem");
        let err = pv_manifest(&vol(), &at(), &outside, &s, "west", "relay.csi.dev").unwrap_err();
        assert_eq!(
            crate::grpc::status::CsiCode::code(&err),
            tonic::Code::FailedPrecondition
        );
        assert!(err.to_string().contains("not under /mnt/e"), "{err}");
        let iscsi = origin(
            json!({"iscsi": {"targetPortal": "t", "iqn": "i", "lun": 0}}),
            "Filesystem",
        );
        let err = pv_manifest(&vol(), &at(), &iscsi, &s, "west", "relay.csi.dev").unwrap_err();
        assert!(err.to_string().contains("cannot import"), "{err}");
    }

    #[test]
    fn the_claim_binds_the_import_by_name_with_no_class() {
        let pv = pv_manifest(
            &vol(),
            &at(),
            &origin(json!({"nfs": {"server": "f", "path": "/a"}}), "Filesystem"),
            &sharing(None),
            "west",
            "relay.csi.dev",
        )
        .unwrap();
        let claim = claim_manifest(
            &at(),
            &pv,
            (
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "csi-relay".to_string(),
                )]
                .into(),
                [(
                    naming::VOLUME_ID_ANNOTATION.to_string(),
                    "m-east-0a1b".to_string(),
                )]
                .into(),
            ),
        );
        let got = serde_json::to_value(&claim).unwrap();
        assert_eq!(got["metadata"]["namespace"], "shop");
        assert_eq!(got["metadata"]["name"], "data");
        assert_eq!(got["metadata"]["labels"][IMPORTED_FROM_LABEL], "east");
        assert_eq!(got["spec"]["volumeName"], "relay-0a1b-import");
        assert_eq!(got["spec"]["storageClassName"], "");
        assert_eq!(
            got["spec"]["resources"]["requests"],
            json!({"storage": "1Gi"})
        );
        assert_eq!(got["spec"]["volumeMode"], "Filesystem");
    }
}
