//! Member VolumeAttachments: for a member PV whose CSI driver needs
//! ControllerPublish (CSIDriver.spec.attachRequired), csi-relay asks the
//! member's own external-attacher to attach it to the member node, and waits
//! a bounded time for `status.attached`.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::storage::v1::{
    CSIDriver, VolumeAttachment, VolumeAttachmentSource, VolumeAttachmentSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, PostParams};

use crate::domain::error::{CsiError, CsiResult};
use crate::k8s::cluster::Cluster;
use crate::k8s::converge::{self, Waited};
use crate::k8s::POLL_INTERVAL;

/// Whether the member's `driver` needs a VolumeAttachment. Kubernetes
/// treats a driver without a CSIDriver object, or without the field, as
/// attach-required.
pub async fn attach_required(cluster: &Cluster, driver: &str) -> CsiResult<bool> {
    let found = cluster
        .fetch(
            &format!("get CSIDriver {driver}"),
            Api::<CSIDriver>::all(cluster.client()).get(driver),
        )
        .await?;
    Ok(found.and_then(|d| d.spec.attach_required).unwrap_or(true))
}

/// What the relay asks the member to attach: which object, by which
/// attacher, of which PV, to which member node, for which host node.
pub struct Wanted<'a> {
    pub name: &'a str,
    pub attacher: &'a str,
    pub pv: &'a str,
    pub member_node: &'a str,
    pub host_node: &'a str,
}

pub fn manifest(wanted: &Wanted<'_>, labels: BTreeMap<String, String>) -> VolumeAttachment {
    let Wanted {
        name,
        attacher,
        pv,
        member_node: node,
        host_node,
    } = wanted;
    VolumeAttachment {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(labels),
            annotations: Some(
                [(
                    crate::k8s::naming::HOST_NODE_ANNOTATION.to_string(),
                    host_node.to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        spec: VolumeAttachmentSpec {
            attacher: attacher.to_string(),
            node_name: node.to_string(),
            source: VolumeAttachmentSource {
                persistent_volume_name: Some(pv.to_string()),
                ..Default::default()
            },
        },
        status: None,
    }
}

fn attached(va: &VolumeAttachment) -> Option<BTreeMap<String, String>> {
    let status = va.status.as_ref()?;
    status
        .attached
        .then(|| status.attachment_metadata.clone().unwrap_or_default())
}

fn attach_error(va: &VolumeAttachment) -> Option<String> {
    va.status
        .as_ref()
        .and_then(|s| s.attach_error.as_ref())
        .and_then(|e| e.message.clone())
}

/// Creates (or adopts) the VolumeAttachment and waits up to `wait` for it to
/// be attached; returns its attachmentMetadata. Not attached in time is
/// UNAVAILABLE: the CO retries, and the retry finds the same object.
pub async fn ensure_attached(
    cluster: &Cluster,
    va: &VolumeAttachment,
    wait: Duration,
) -> CsiResult<BTreeMap<String, String>> {
    let name = va.metadata.name.clone().unwrap_or_default();
    let api = Api::<VolumeAttachment>::all(cluster.client());
    let get_what = format!("get VolumeAttachment {name}");
    let current = match cluster
        .create(
            &format!("create VolumeAttachment {name}"),
            api.create(&PostParams::default(), va),
        )
        .await?
    {
        Some(created) => created,
        None => {
            let existing = cluster
                .fetch(&get_what, api.get(&name))
                .await?
                .ok_or_else(|| {
                    CsiError::Aborted(format!(
                        "{}: VolumeAttachment {name} vanished while being created; retry",
                        cluster.label()
                    ))
                })?;
            if existing.spec != va.spec {
                return Err(CsiError::FailedPrecondition(format!(
                    "{}: VolumeAttachment {name} exists for {:?} on node {:?}, not for {:?} on {:?}",
                    cluster.label(),
                    existing.spec.source.persistent_volume_name,
                    existing.spec.node_name,
                    va.spec.source.persistent_volume_name,
                    va.spec.node_name
                )));
            }
            existing
        }
    };
    let waited = converge::until(
        cluster,
        &api,
        current,
        wait,
        |va| attached(va).is_some(),
        || {
            CsiError::Aborted(format!(
                "{}: VolumeAttachment {name} was deleted while attaching; retry",
                cluster.label()
            ))
        },
    )
    .await?;
    match waited {
        Waited::Reached(va) => Ok(attached(&va).unwrap_or_default()),
        Waited::TimedOut(current) => {
            let why = attach_error(&current)
                .map(|e| format!(": the member's attacher reports {e:?}"))
                .unwrap_or_default();
            Err(CsiError::Unavailable(format!(
                "{}: VolumeAttachment {name} ({} on node {}) is not attached yet{why}; retry",
                cluster.label(),
                va.spec
                    .source
                    .persistent_volume_name
                    .as_deref()
                    .unwrap_or("?"),
                va.spec.node_name
            )))
        }
    }
}

/// The relay's own VolumeAttachments in `cluster`: (name, volume uuid).
pub async fn own(cluster: &Cluster) -> CsiResult<Vec<(String, String)>> {
    let api = Api::<VolumeAttachment>::all(cluster.client());
    let selector = format!(
        "{}={}",
        crate::k8s::naming::MANAGED_BY,
        crate::k8s::naming::MANAGER
    );
    // Names and labels are all it needs: metadata only, by pages.
    let mut found = Vec::new();
    cluster
        .list_metadata_pages(
            "list the relay's VolumeAttachments",
            &api,
            kube::api::ListParams::default().labels(&selector),
            |items| {
                found.extend(items.into_iter().filter_map(|va| {
                    let uuid = va
                        .metadata
                        .labels
                        .as_ref()?
                        .get(crate::k8s::naming::VOLUME_UUID_LABEL)?
                        .clone();
                    Some((va.metadata.name?, uuid))
                }));
                Ok::<_, CsiError>(())
            },
        )
        .await?;
    Ok(found)
}

/// Another VolumeAttachment of the same PV to the same member node than our
/// `ours` (the member's attach/detach controller makes one for a member pod
/// that mounts the volume), if any: detaching ours would make the member
/// driver detach the volume under that pod.
pub async fn shared_with(cluster: &Cluster, ours: &str) -> CsiResult<Option<String>> {
    let api = Api::<VolumeAttachment>::all(cluster.client());
    let Some(va) = cluster
        .fetch(&format!("get VolumeAttachment {ours}"), api.get(ours))
        .await?
    else {
        return Ok(None);
    };
    let pv = va.spec.source.persistent_volume_name.clone();
    let node = va.spec.node_name.clone();
    if pv.is_none() {
        return Ok(None);
    }
    // Every attachment of the member, by pages: a member with thousands
    // would otherwise come as one response per detach.
    let mut shared = None;
    cluster
        .list_pages(
            "list VolumeAttachments",
            &api,
            kube::api::ListParams::default(),
            |items| {
                if shared.is_none() {
                    shared = items
                        .into_iter()
                        .find(|other| {
                            other.metadata.name.as_deref() != Some(ours)
                                && other.metadata.deletion_timestamp.is_none()
                                && other.spec.node_name == node
                                && other.spec.source.persistent_volume_name == pv
                        })
                        .and_then(|other| other.metadata.name);
                }
                Ok::<_, CsiError>(())
            },
        )
        .await?;
    Ok(shared)
}

/// The relay's VolumeAttachments of the volume `uuid` (one per member node
/// it was ever attached to and not yet detached from).
pub async fn of_volume(cluster: &Cluster, uuid: &str) -> CsiResult<Vec<VolumeAttachment>> {
    let api = Api::<VolumeAttachment>::all(cluster.client());
    let selector = format!(
        "{}={},{}={uuid}",
        crate::k8s::naming::MANAGED_BY,
        crate::k8s::naming::MANAGER,
        crate::k8s::naming::VOLUME_UUID_LABEL,
    );
    Ok(cluster
        .fetch(
            &format!("list the relay's VolumeAttachments of volume {uuid}"),
            api.list(&kube::api::ListParams::default().labels(&selector)),
        )
        .await?
        .map(|l| l.items)
        .unwrap_or_default())
}

/// The host node a VolumeAttachment was made for; `None` for one made by a
/// build that did not record it.
pub fn host_node(va: &VolumeAttachment) -> Option<&str> {
    va.metadata
        .annotations
        .as_ref()?
        .get(crate::k8s::naming::HOST_NODE_ANNOTATION)
        .map(String::as_str)
}

/// Deletes the VolumeAttachment and waits up to `wait` for the member's
/// attacher to detach and remove it. Already gone is success.
pub async fn ensure_detached(cluster: &Cluster, name: &str, wait: Duration) -> CsiResult<()> {
    let api = Api::<VolumeAttachment>::all(cluster.client());
    cluster
        .remove(
            &format!("delete VolumeAttachment {name}"),
            api.delete(name, &DeleteParams::default()),
        )
        .await?;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let Some(va) = cluster
            .fetch(&format!("get VolumeAttachment {name}"), api.get(name))
            .await?
        else {
            return Ok(());
        };
        if tokio::time::Instant::now() + POLL_INTERVAL > deadline {
            let why = va
                .status
                .as_ref()
                .and_then(|s| s.detach_error.as_ref())
                .and_then(|e| e.message.clone())
                .map(|e| format!(": the member's attacher reports {e:?}"))
                .unwrap_or_default();
            return Err(CsiError::Unavailable(format!(
                "{}: VolumeAttachment {name} is still being detached{why}; retry",
                cluster.label()
            )));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}
