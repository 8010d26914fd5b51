//! The member PersistentVolumeClaim (and its StorageClass and PV): manifest,
//! lookups, delete, resize. Creating it is `claim_create`'s.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec, TypedLocalObjectReference,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};

use crate::domain::capability::{AccessMode, Capability};
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::params::VolumeParams;
use crate::domain::quantity;
use crate::domain::volume::Volume;
use crate::k8s::cluster::Cluster;
use crate::k8s::error::KubeResult;
use crate::k8s::naming::{self, MemberVolume};

const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";

/// The member PVC's access modes for the volume's capabilities.
pub fn access_modes(caps: &[Capability]) -> Vec<String> {
    let mut modes: Vec<String> = Vec::new();
    for cap in caps {
        let mode = match cap.mode {
            AccessMode::SingleNodeWriter
            | AccessMode::SingleNodeReaderOnly
            | AccessMode::SingleNodeMultiWriter => "ReadWriteOnce",
            AccessMode::SingleNodeSingleWriter => "ReadWriteOncePod",
            AccessMode::MultiNodeReaderOnly => "ReadOnlyMany",
            AccessMode::MultiNodeSingleWriter | AccessMode::MultiNodeMultiWriter => "ReadWriteMany",
        };
        if !modes.iter().any(|m| m == mode) {
            modes.push(mode.to_string());
        }
    }
    if modes.is_empty() {
        modes.push("ReadWriteOnce".into());
    }
    modes
}

/// Where a new member PVC's initial content comes from (same namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataSource {
    /// A member VolumeSnapshot.
    Snapshot(String),
    /// Another member PVC (a clone).
    Claim(String),
}

/// Everything a member PVC is made from.
pub struct ClaimPlan<'a> {
    pub vol: &'a Volume,
    pub at: &'a MemberVolume,
    pub params: &'a VolumeParams,
    pub data_source: Option<DataSource>,
    /// Set as `volume.kubernetes.io/selected-node` (WaitForFirstConsumer).
    pub selected_node: Option<&'a str>,
    pub driver_name: &'a str,
}

pub fn manifest(plan: &ClaimPlan<'_>) -> PersistentVolumeClaim {
    let (labels, mut annotations) =
        naming::pvc_metadata(plan.vol, &plan.at.uuid, plan.params, plan.driver_name);
    if let Some(node) = plan.selected_node {
        annotations.insert(naming::SELECTED_NODE_ANNOTATION.into(), node.to_string());
    }
    let block = plan.vol.capabilities.iter().any(Capability::is_block);
    let data_source = plan.data_source.as_ref().map(|s| match s {
        DataSource::Snapshot(name) => TypedLocalObjectReference {
            api_group: Some(crate::backends::member::snapshot::GROUP.into()),
            kind: "VolumeSnapshot".into(),
            name: name.clone(),
        },
        DataSource::Claim(name) => TypedLocalObjectReference {
            api_group: None,
            kind: "PersistentVolumeClaim".into(),
            name: name.clone(),
        },
    });
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(plan.at.pvc.clone()),
            namespace: Some(plan.at.namespace.clone()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(access_modes(&plan.vol.capabilities)),
            storage_class_name: plan.params.member_storage_class.clone(),
            volume_mode: Some(if block { "Block" } else { "Filesystem" }.into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(quantity::format_bytes(plan.vol.capacity_bytes)),
                )])),
                ..Default::default()
            }),
            data_source,
            ..Default::default()
        }),
        status: None,
    }
}

pub fn claims(cluster: &Cluster, namespace: &str) -> Api<PersistentVolumeClaim> {
    Api::namespaced(cluster.client(), namespace)
}

pub async fn get(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
) -> KubeResult<Option<PersistentVolumeClaim>> {
    cluster
        .fetch(
            &format!("get PersistentVolumeClaim {namespace}/{name}"),
            claims(cluster, namespace).get(name),
        )
        .await
}

/// Whether the relay made `pvc` for this volume. Only then does it read,
/// change, mount or delete it: a record (rebuilt from an editable
/// RelayVolume, or one whose claim a mirroring system replaced) only says
/// where to look.
pub fn belongs_to(pvc: &PersistentVolumeClaim, volume_id: &str) -> bool {
    annotation(pvc, naming::VOLUME_ID_ANNOTATION) == Some(volume_id)
}

/// Whether `pvc` is the very claim the record names: the relay's for this
/// volume by its marks and, where the record keeps the uid of the claim
/// the relay made (`MemberVolume::claim_uid`), of that uid. Marks alone
/// decide only for records made before the uid was kept.
pub fn is_recorded(pvc: &PersistentVolumeClaim, at: &MemberVolume, volume_id: &str) -> bool {
    belongs_to(pvc, volume_id) && not_the_recorded(pvc, at).is_none()
}

/// Why `pvc` is not the claim of the uid the record keeps, if it is not.
fn not_the_recorded(pvc: &PersistentVolumeClaim, at: &MemberVolume) -> Option<String> {
    let recorded = at.claim_uid.as_deref()?;
    let uid = pvc.metadata.uid.as_deref();
    (uid != Some(recorded)).then(|| {
        format!(
            "its uid is {}, not {recorded}, the uid of the claim the relay made",
            uid.unwrap_or("unset")
        )
    })
}

/// Kosmos's mark on every object it copies into a member cluster.
pub const KOSMOS_COPY_ANNOTATION: &str = "kosmos.io/global";

/// Whether `claim` is Kosmos's copy of the host claim rather than a claim
/// the relay made: Kosmos marked it (`kosmos.io/global`, which the relay
/// never writes) and it names as its PersistentVolume the host's PV, whose
/// name the relay's claims record (`VOLUME_NAME_ANNOTATION`, the volume's
/// CSI name). Both are needed: a member PV may carry the host PV's name (a
/// PV made beforehand under the volume's name), and the relay's claim is
/// bound to it then. The relay's annotations say nothing: such a copy
/// inherits them.
pub fn copies_the_host_claim(claim: &PersistentVolumeClaim) -> bool {
    let host_pv = annotation(claim, naming::VOLUME_NAME_ANNOTATION);
    annotation(claim, KOSMOS_COPY_ANNOTATION) == Some("true")
        && host_pv.is_some()
        && bound_pv(claim) == host_pv
}

/// The volume's member PVC: `None` when no claim holds its name, and
/// FAILED_PRECONDITION when one does that is not the relay's for it (a
/// copy of the host claim that carries the relay's marks included).
pub async fn owned(
    cluster: &Cluster,
    at: &MemberVolume,
    volume_id: &str,
) -> CsiResult<Option<PersistentVolumeClaim>> {
    let Some(claim) = get(cluster, &at.namespace, &at.pvc).await? else {
        return Ok(None);
    };
    if !belongs_to(&claim, volume_id) {
        return Err(CsiError::FailedPrecondition(format!(
            "{}: PersistentVolumeClaim {} is not the one csi-relay created for volume {volume_id} (its {} is {:?}); the relay does not touch it",
            cluster.label(),
            at.pvc_path(),
            naming::VOLUME_ID_ANNOTATION,
            annotation(&claim, naming::VOLUME_ID_ANNOTATION)
        )));
    }
    if let Some(why) = not_the_recorded(&claim, at) {
        return Err(CsiError::FailedPrecondition(format!(
            "{}: PersistentVolumeClaim {} carries csi-relay's marks for volume {volume_id} but {why}: a copy (Kosmos copies claims, marks included) or a claim made after the relay's was deleted; the relay does not touch it",
            cluster.label(),
            at.pvc_path(),
        )));
    }
    if copies_the_host_claim(&claim) {
        return Err(CsiError::FailedPrecondition(format!(
            "{}: PersistentVolumeClaim {} carries csi-relay's marks for volume {volume_id} but names the host's PersistentVolume {}: a copy of the host claim (Kosmos copies them, marks included), not the claim the relay made, which is gone; the relay does not touch it",
            cluster.label(),
            at.pvc_path(),
            bound_pv(&claim).unwrap_or_default()
        )));
    }
    Ok(Some(claim))
}

/// Deletes the volume's member PVC. Already gone is success, and so is a
/// claim of that name that is not the relay's (a mirroring system deleted
/// ours and made its own): it is left alone. The delete is conditional on
/// the uid read, so a claim replaced in between is not deleted either.
pub async fn delete(cluster: &Cluster, at: &MemberVolume, volume_id: &str) -> CsiResult<()> {
    let (namespace, name) = (&at.namespace, &at.pvc);
    let Some(claim) = get(cluster, namespace, name).await? else {
        return Ok(());
    };
    if !is_recorded(&claim, at, volume_id) || copies_the_host_claim(&claim) {
        tracing::warn!(member = %cluster.name(), pvc = %at.pvc_path(), volume_id, "member PVC of that name is not the relay's; left alone");
        return Ok(());
    }
    delete_exactly(cluster, &claim).await
}

/// Deletes `claim` as read, only that object: the delete is conditional on
/// its uid. Gone already, or replaced by another claim of the name (409),
/// is success: that claim is not deleted.
pub async fn delete_exactly(cluster: &Cluster, claim: &PersistentVolumeClaim) -> CsiResult<()> {
    let namespace = claim.metadata.namespace.as_deref().unwrap_or_default();
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    let params = DeleteParams {
        preconditions: claim.metadata.uid.clone().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match cluster
        .remove(
            &format!("delete PersistentVolumeClaim {namespace}/{name}"),
            claims(cluster, namespace).delete(name, &params),
        )
        .await
    {
        Ok(()) => Ok(()),
        Err(e) if e.status() == Some(409) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes `pv` and only that object (the delete is conditional on its
/// uid); a PV made anew under the name is a 409 the caller judges.
pub async fn delete_pv_exactly(cluster: &Cluster, pv: &PersistentVolume) -> KubeResult<()> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let params = DeleteParams {
        preconditions: pv.metadata.uid.clone().map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    cluster
        .remove(
            &format!("delete PersistentVolume {name}"),
            Api::<PersistentVolume>::all(cluster.client()).delete(name, &params),
        )
        .await
}

/// The metadata of every member PVC the relay named `driver_name` made (by
/// its marks), handed to `each` page by page: the sweep needs a few
/// annotations of each claim, not 10,000 whole objects in one response.
pub async fn made_by(
    cluster: &Cluster,
    driver_name: &str,
    mut each: impl FnMut(&ObjectMeta),
) -> CsiResult<()> {
    let params =
        ListParams::default().labels(&format!("{}={}", naming::MANAGED_BY, naming::MANAGER));
    let api = Api::<PersistentVolumeClaim>::all(cluster.client());
    cluster
        .list_metadata_pages(
            "list csi-relay PersistentVolumeClaims",
            &api,
            params,
            |items| {
                items
                    .iter()
                    .map(|claim| &claim.metadata)
                    .filter(|meta| {
                        annotation_of(meta, naming::DRIVER_ANNOTATION) == Some(driver_name)
                    })
                    .for_each(&mut each);
                Ok::<_, CsiError>(())
            },
        )
        .await?;
    Ok(())
}

pub async fn get_pv(cluster: &Cluster, name: &str) -> KubeResult<Option<PersistentVolume>> {
    cluster
        .fetch(
            &format!("get PersistentVolume {name}"),
            Api::<PersistentVolume>::all(cluster.client()).get(name),
        )
        .await
}

/// Tells the member's WaitForFirstConsumer provisioner which node to use.
pub async fn select_node(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    node: &str,
) -> KubeResult<()> {
    let patch = serde_json::json!({
        "metadata": {"annotations": {naming::SELECTED_NODE_ANNOTATION: node}}
    });
    cluster
        .run(
            &format!("annotate PersistentVolumeClaim {namespace}/{name} with its selected node"),
            claims(cluster, namespace).patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        .map(|_| ())
}

/// A node a WaitForFirstConsumer claim no pod consumes may be sent to (a
/// gated volume's data claim: its pods use an access claim whose PV keeps
/// the data PV's node affinity, so the member scheduler follows the data):
/// the first, by name, of the Ready nodes that take pods.
pub async fn a_schedulable_node(cluster: &Cluster) -> KubeResult<Option<String>> {
    let nodes = cluster
        .run(
            "list Nodes",
            Api::<k8s_openapi::api::core::v1::Node>::all(cluster.client())
                .list(&ListParams::default()),
        )
        .await?;
    let mut fit: Vec<String> = nodes
        .items
        .into_iter()
        .filter(|n| {
            let spec = n.spec.as_ref();
            let cordoned = spec.and_then(|s| s.unschedulable).unwrap_or(false);
            let tainted = spec
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|t| t.iter().any(|t| t.effect != "PreferNoSchedule"));
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            ready && !cordoned && !tainted
        })
        .filter_map(|n| n.metadata.name)
        .collect();
    fit.sort();
    Ok(fit.into_iter().next())
}

/// Raises the member PVC's storage request; returns the member's answer.
pub async fn request_storage(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    bytes: u64,
) -> KubeResult<PersistentVolumeClaim> {
    let patch = serde_json::json!({
        "spec": {"resources": {"requests": {"storage": quantity::format_bytes(bytes)}}}
    });
    cluster
        .run(
            &format!("resize PersistentVolumeClaim {namespace}/{name}"),
            claims(cluster, namespace).patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
}

/// The named StorageClass (FAILED_PRECONDITION when the member has none of
/// that name), or without a name the member's default one, if any.
pub async fn storage_class(
    cluster: &Cluster,
    name: Option<&str>,
) -> CsiResult<Option<StorageClass>> {
    let api = Api::<StorageClass>::all(cluster.client());
    if let Some(name) = name {
        return match cluster
            .fetch(&format!("get StorageClass {name}"), api.get(name))
            .await?
        {
            Some(sc) => Ok(Some(sc)),
            None => Err(CsiError::FailedPrecondition(format!(
                "{} has no StorageClass {name:?} (parameter memberStorageClass)",
                cluster.label()
            ))),
        };
    }
    let all = cluster
        .run("list StorageClasses", api.list(&ListParams::default()))
        .await?;
    Ok(all.items.into_iter().find(|sc| {
        sc.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
            .is_some_and(|v| v == "true")
    }))
}

pub fn binds_late(sc: &StorageClass) -> bool {
    sc.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer")
}

pub fn phase(pvc: &PersistentVolumeClaim) -> &str {
    pvc.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

pub fn bound_pv(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|n| !n.is_empty())
}

pub fn annotation<'a>(pvc: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    annotation_of(&pvc.metadata, key)
}

pub fn annotation_of<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The capacity the member reports for the bound volume.
pub fn capacity(pvc: &PersistentVolumeClaim) -> Option<u64> {
    pvc.status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| quantity::parse_bytes(&q.0))
}

/// The member PVC's requested size.
pub fn requested(pvc: &PersistentVolumeClaim) -> Option<u64> {
    pvc.spec
        .as_ref()
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| quantity::parse_bytes(&q.0))
}

/// The member PVC's conditions as (type, message).
pub fn conditions(pvc: &PersistentVolumeClaim) -> Vec<(String, String)> {
    pvc.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|cs| {
            cs.iter()
                .map(|c| (c.type_.clone(), c.message.clone().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default()
}

/// The member's resize state of "storage" (allocatedResourceStatuses).
pub fn resize_status(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.status
        .as_ref()
        .and_then(|s| s.allocated_resource_statuses.as_ref())
        .and_then(|m| m.get("storage"))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The relay's claim names a member PV (or none yet); a copy of the
    /// host claim, marks and all, names the host's PV.
    #[test]
    fn a_copy_of_the_host_claim_is_told_by_its_binding_not_its_marks() {
        let marked = |volume_name: Option<&str>, kosmos: bool| -> PersistentVolumeClaim {
            let mut annotations = serde_json::json!({
                naming::VOLUME_ID_ANNOTATION: "m-east-0a1b",
                naming::VOLUME_NAME_ANNOTATION: "pvc-host-1"});
            if kosmos {
                annotations["kosmos.io/global"] = "true".into();
            }
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "data", "annotations": annotations},
                "spec": {"volumeName": volume_name}
            }))
            .unwrap()
        };
        let claim = |volume_name| marked(volume_name, true);
        assert!(copies_the_host_claim(&claim(Some("pvc-host-1"))));
        assert!(!copies_the_host_claim(&claim(Some("pvc-member-9"))));
        assert!(!copies_the_host_claim(&claim(Some("relay-0a1b-import"))));
        assert!(!copies_the_host_claim(&claim(None)));
        assert!(belongs_to(&claim(Some("pvc-host-1")), "m-east-0a1b"));
        // The relay's own claim bound to a member PV made beforehand under
        // the volume's name (member_scale_e2e does that): not a copy.
        assert!(!copies_the_host_claim(&marked(Some("pvc-host-1"), false)));
    }

    #[test]
    fn access_modes_follow_the_csi_modes() {
        use AccessMode::*;
        let cases: [(&[AccessMode], &[&str]); 5] = [
            (&[SingleNodeWriter], &["ReadWriteOnce"]),
            (&[SingleNodeSingleWriter], &["ReadWriteOncePod"]),
            (&[MultiNodeReaderOnly], &["ReadOnlyMany"]),
            (
                &[MultiNodeMultiWriter, MultiNodeSingleWriter],
                &["ReadWriteMany"],
            ),
            (
                &[SingleNodeWriter, MultiNodeReaderOnly],
                &["ReadWriteOnce", "ReadOnlyMany"],
            ),
        ];
        for (modes, want) in cases {
            let caps: Vec<Capability> = modes.iter().map(|m| Capability::mount(*m)).collect();
            assert_eq!(access_modes(&caps), want, "{modes:?}");
        }
    }

    #[test]
    fn status_helpers_read_the_member_answer() {
        let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "x", "annotations": {"a": "b"}},
            "spec": {"volumeName": "pv-1", "resources": {"requests": {"storage": "2Gi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"},
                       "allocatedResourceStatuses": {"storage": "ControllerResizeInProgress"},
                       "conditions": [{"type": "Resizing", "status": "True", "message": "m"}]}
        }))
        .unwrap();
        assert_eq!(phase(&pvc), "Bound");
        assert_eq!(bound_pv(&pvc), Some("pv-1"));
        assert_eq!(capacity(&pvc), Some(1 << 30));
        assert_eq!(requested(&pvc), Some(2 << 30));
        assert_eq!(annotation(&pvc, "a"), Some("b"));
        assert_eq!(resize_status(&pvc), Some("ControllerResizeInProgress"));
        assert_eq!(
            conditions(&pvc),
            [("Resizing".to_string(), "m".to_string())]
        );
        assert_eq!(phase(&PersistentVolumeClaim::default()), "Pending");
        let _ = Capability::block(AccessMode::SingleNodeWriter);
    }
}
