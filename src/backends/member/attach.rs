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
    let mut current = match cluster
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
    let deadline = tokio::time::Instant::now() + wait;
    let mut changes = watch_one(&api, &name, &current, wait).await;
    loop {
        if let Some(metadata) = attached(&current) {
            return Ok(metadata);
        }
        if tokio::time::Instant::now() + POLL_INTERVAL > deadline {
            let why = attach_error(&current)
                .map(|e| format!(": the member's attacher reports {e:?}"))
                .unwrap_or_default();
            return Err(CsiError::Unavailable(format!(
                "{}: VolumeAttachment {name} ({} on node {}) is not attached yet{why}; retry",
                cluster.label(),
                va.spec
                    .source
                    .persistent_volume_name
                    .as_deref()
                    .unwrap_or("?"),
                va.spec.node_name
            )));
        }
        // The watch hands over the changed object itself; a watch that
        // stays quiet says nothing changed; only without a watch is the
        // object read again.
        current = match next_change(&mut changes).await {
            Next::Changed(changed) => *changed,
            Next::Unchanged => continue,
            Next::Unknown => cluster
                .fetch(&get_what, api.get(&name))
                .await?
                .ok_or_else(|| {
                    CsiError::Aborted(format!(
                        "{}: VolumeAttachment {name} was deleted while attaching; retry",
                        cluster.label()
                    ))
                })?,
        };
    }
}

type Changes = std::pin::Pin<
    Box<dyn futures::Stream<Item = kube::Result<kube::api::WatchEvent<VolumeAttachment>>> + Send>,
>;

/// A watch of one VolumeAttachment from the version just read, so its
/// `attached` wakes the wait as soon as the member's attacher sets it
/// rather than at the next poll (the member attaches in about 100 ms; a
/// poll alone made every publish take at least `POLL_INTERVAL`, on the
/// pod's path). None when the watch cannot start: the poll still runs.
async fn watch_one(
    api: &Api<VolumeAttachment>,
    name: &str,
    current: &VolumeAttachment,
    wait: Duration,
) -> Option<Changes> {
    let version = current.metadata.resource_version.as_deref()?;
    // The API server ends the watch by itself once the wait is over
    // (it takes at most 295 s).
    let secs = u32::try_from(wait.as_secs().clamp(1, 290)).unwrap_or(290);
    let params = kube::api::WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(secs);
    match tokio::time::timeout(POLL_INTERVAL, api.watch(&params, version)).await {
        Ok(Ok(stream)) => Some(Box::pin(stream)),
        _ => None,
    }
}

/// What one `POLL_INTERVAL` of waiting told.
#[derive(Debug)]
enum Next {
    /// The watch handed over the changed object.
    Changed(Box<VolumeAttachment>),
    /// The watch is up and reported nothing: the object is as it was. (A
    /// watch that stays silent past the client's read timeout fails, and
    /// is dropped.)
    Unchanged,
    /// No watch: the object must be read.
    Unknown,
}

/// Waits for the next change the watch reports, or `POLL_INTERVAL` at
/// most. A watch that ends or fails (a partition, a version too old, a
/// deletion) is dropped, and the caller reads the object from then on, so
/// the watch only ever makes the wait shorter.
async fn next_change(changes: &mut Option<Changes>) -> Next {
    use futures::StreamExt;
    let Some(stream) = changes.as_mut() else {
        tokio::time::sleep(POLL_INTERVAL).await;
        return Next::Unknown;
    };
    match tokio::time::timeout(POLL_INTERVAL, stream.next()).await {
        Ok(Some(Ok(kube::api::WatchEvent::Added(va) | kube::api::WatchEvent::Modified(va)))) => {
            Next::Changed(Box::new(va))
        }
        Err(_) => Next::Unchanged,
        Ok(Some(Ok(_))) | Ok(Some(Err(_))) | Ok(None) => {
            *changes = None;
            tokio::time::sleep(POLL_INTERVAL).await;
            Next::Unknown
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

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::WatchEvent;

    fn va(attached: bool) -> VolumeAttachment {
        let mut va = VolumeAttachment::default();
        va.metadata.name = Some("csi-x".into());
        va.status = Some(k8s_openapi::api::storage::v1::VolumeAttachmentStatus {
            attached,
            ..Default::default()
        });
        va
    }

    fn stream(events: Vec<kube::Result<WatchEvent<VolumeAttachment>>>) -> Option<Changes> {
        Some(Box::pin(futures::stream::iter(events)))
    }

    #[tokio::test(start_paused = true)]
    async fn a_watched_change_is_handed_over_at_once() {
        let mut changes = stream(vec![Ok(WatchEvent::Modified(va(true)))]);
        let started = tokio::time::Instant::now();
        let got = next_change(&mut changes).await;
        assert!(
            matches!(&got, Next::Changed(v) if v.status.as_ref().is_some_and(|s| s.attached)),
            "{got:?}"
        );
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert!(changes.is_some(), "a watch that delivers is kept");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_that_fails_or_ends_is_dropped_and_the_poll_goes_on() {
        let gone = kube::Error::Api(Box::new(
            kube::core::Status::failure("too old resource version", "Expired").with_code(410),
        ));
        for events in [
            vec![Err(gone)],
            vec![],
            vec![Ok(WatchEvent::Deleted(va(false)))],
        ] {
            let mut changes = stream(events);
            let started = tokio::time::Instant::now();
            assert!(matches!(next_change(&mut changes).await, Next::Unknown));
            assert!(changes.is_none(), "the broken watch is dropped");
            assert_eq!(started.elapsed(), POLL_INTERVAL, "the poll's pace is kept");
            // Without a watch the wait is the poll alone.
            let started = tokio::time::Instant::now();
            assert!(matches!(next_change(&mut changes).await, Next::Unknown));
            assert_eq!(started.elapsed(), POLL_INTERVAL);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_quiet_watch_is_kept_and_waits_one_poll_interval() {
        let mut changes: Option<Changes> = Some(Box::pin(futures::stream::pending()));
        let started = tokio::time::Instant::now();
        // Nothing changed: no read is needed.
        assert!(matches!(next_change(&mut changes).await, Next::Unchanged));
        assert_eq!(started.elapsed(), POLL_INTERVAL);
        assert!(changes.is_some());
    }
}
