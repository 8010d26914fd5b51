//! What Kosmos copied of a volume's objects and left behind, removed when
//! the volume is deleted.
//!
//! - **Its copy of the host claim in a member.** Kosmos copies a mirrored
//!   pod's claims into the member it runs the pod in. Where the relay makes
//!   its own claim there (an import, a move's switch) it replaces the copy;
//!   where it never does (a move given up: the pod went back before the
//!   copy was made), the copy stays once the pod went, bound to nothing of
//!   the member (Pending, or Lost naming the host's PV).
//! - **Its copy of an import's PV in the host.** Kosmos's leaf PV
//!   controller copies the PV of a claim it marked into the host under the
//!   same name, and deletes the copy when the member's PV goes. It reads
//!   the member through a cache: an import removed and made again under
//!   the same name (a move given up, then the pod back) was seen to leave
//!   the host copy `relay-<uuid>-import` Available after the member's PV
//!   was gone for good (2026-12-06, `mobility_block_e2e`).
//!
//! Neither holds data: the claim is bound to no member PV, and the host PV
//! copy is Retain (as the relay makes every import PV), so deleting the
//! object frees nothing. Each is known by what a copy of it must be, never
//! by marks alone (as `claim_copy` replaces a copy at publish), and deleted
//! on its uid.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::backends::member::claim_copy;
use crate::backends::member::mobility::import;
use crate::backends::member::pvc::{self, annotation, KOSMOS_COPY_ANNOTATION};
use crate::domain::error::CsiResult;
use crate::k8s::cluster::Cluster;
use crate::k8s::naming::{self, MemberVolume};

/// Kosmos's mark of the clusters a host object was copied from.
pub const KOSMOS_OWNERS_ANNOTATION: &str = "kosmos-io/cluster-owners";

/// Whether `claim` is a Kosmos copy bound to nothing of its member: marked
/// by Kosmos, not the relay's (no volume id, or it names the host's PV),
/// and Pending with no volume or Lost.
pub fn is_empty_copy(claim: &PersistentVolumeClaim) -> bool {
    let not_the_relays = annotation(claim, naming::VOLUME_ID_ANNOTATION).is_none()
        || pvc::copies_the_host_claim(claim);
    annotation(claim, KOSMOS_COPY_ANNOTATION) == Some("true")
        && not_the_relays
        && claim_copy::holds_no_data(claim)
}

/// Whether `pv`, found in the host under the import name of volume `uuid`,
/// is Kosmos's copy of an import PV that nothing uses: marked by Kosmos as
/// copied from a member, the volume's uuid label, Retain, not Bound.
pub fn is_stale_import_copy(pv: &PersistentVolume, uuid: &str) -> bool {
    let meta = &pv.metadata;
    let copied = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(KOSMOS_OWNERS_ANNOTATION))
        .is_some_and(|owners| !owners.is_empty());
    let of_the_volume = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(naming::VOLUME_UUID_LABEL))
        .is_some_and(|u| u == uuid);
    let spec = pv.spec.clone().unwrap_or_default();
    let retain = spec.persistent_volume_reclaim_policy.as_deref() == Some("Retain");
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    meta.name.as_deref() == Some(import::pv_name(uuid).as_str())
        && copied
        && of_the_volume
        && retain
        && phase != Some("Bound")
}

/// Deletes Kosmos's empty copy of the host claim at `at` in `cluster`, if
/// one is there; any other claim of that name is left alone.
pub async fn remove_claim_copy(cluster: &Cluster, at: &MemberVolume) -> CsiResult<()> {
    let Some(claim) = pvc::get(cluster, &at.namespace, &at.pvc).await? else {
        return Ok(());
    };
    if !is_empty_copy(&claim) {
        return Ok(());
    }
    pvc::delete_exactly(cluster, &claim).await?;
    tracing::info!(member = %cluster.name(), pvc = %at.pvc_path(), "Kosmos's copy of the host claim, bound to nothing there, deleted with the volume");
    Ok(())
}

/// Deletes Kosmos's copy in the host of volume `uuid`'s import PV, if it
/// outlived the member's. Kosmos copies the member PV's finalizers too: the
/// member driver's attacher finalizer, which no attacher in the host ever
/// removes, would hold the copy forever; it is taken off when no host
/// VolumeAttachment names the PV.
pub async fn remove_host_pv_copy(host: &Cluster, uuid: &str) -> CsiResult<()> {
    let name = import::pv_name(uuid);
    let api = Api::<PersistentVolume>::all(host.client());
    // The finalizer first, on the PV as read (the delete changes its
    // resourceVersion); a change meanwhile (Kosmos updates its copy from
    // the member's) means reading it again.
    let mut pv = None;
    for _ in 0..3 {
        let Some(now) = pvc::get_pv(host, &name).await? else {
            return Ok(());
        };
        if !is_stale_import_copy(&now, uuid) {
            return Ok(());
        }
        let finalizers = now.metadata.finalizers.clone().unwrap_or_default();
        let kept: Vec<String> = finalizers
            .iter()
            .filter(|f| !copied_attacher_finalizer(&now, f))
            .cloned()
            .collect();
        if kept.len() == finalizers.len() || attached_in_host(host, &name).await? {
            pv = Some(now);
            break;
        }
        // Only this object as read: the resourceVersion makes any change
        // since (a PV made anew under the name included) a conflict.
        let patch = json!({"metadata": {
            "resourceVersion": now.metadata.resource_version,
            "finalizers": kept,
        }});
        match host
            .run(
                &format!("patch PersistentVolume {name} (finalizers)"),
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await
        {
            Ok(patched) => {
                tracing::info!(pv = %name, "the member driver's attacher finalizer Kosmos copied taken off its host copy of the import PV");
                pv = Some(patched);
                break;
            }
            Err(e) if e.status() == Some(404) => return Ok(()),
            Err(e) if e.status() == Some(409) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    let Some(pv) = pv.filter(|p| p.metadata.deletion_timestamp.is_none()) else {
        return Ok(());
    };
    match pvc::delete_pv_exactly(host, &pv).await {
        Err(e) if e.status() != Some(409) => return Err(e.into()),
        _ => {}
    }
    tracing::info!(pv = %name, "Kosmos's copy in the host of the volume's import PV deleted with the volume");
    Ok(())
}

/// The finalizer the member driver's external-attacher put on the member
/// PV, copied with it: `external-attacher/<driver>`, every character of the
/// driver's name but letters, digits and '-' written '-' (as the attacher
/// sanitizes it: `hostpath.kl.csi.k8s.io` → `hostpath-kl-csi-k8s-io`).
fn copied_attacher_finalizer(pv: &PersistentVolume, finalizer: &str) -> bool {
    let sanitized = |d: &str| -> String {
        d.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '-'
                }
            })
            .collect()
    };
    let driver = pv
        .spec
        .as_ref()
        .and_then(|s| s.csi.as_ref())
        .map(|c| sanitized(&c.driver));
    driver.is_some_and(|d| finalizer == format!("external-attacher/{d}"))
}

/// Whether a host VolumeAttachment names PV `name` (then a host attacher
/// owns the finalizer).
async fn attached_in_host(host: &Cluster, name: &str) -> CsiResult<bool> {
    let vas = host
        .fetch(
            "list VolumeAttachments",
            Api::<VolumeAttachment>::all(host.client()).list(&Default::default()),
        )
        .await?
        .map(|l| l.items)
        .unwrap_or_default();
    Ok(vas
        .iter()
        .any(|va| va.spec.source.persistent_volume_name.as_deref() == Some(name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(
        phase: &str,
        volume: Option<&str>,
        annotations: serde_json::Value,
    ) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "app", "uid": "u1", "annotations": annotations},
            "spec": {"volumeName": volume},
            "status": {"phase": phase}
        }))
        .expect("claim")
    }

    #[test]
    fn only_kosmos_copies_bound_to_nothing_are_empty() {
        let kosmos = json!({"kosmos.io/global": "true"});
        assert!(is_empty_copy(&claim("Pending", None, kosmos.clone())));
        assert!(is_empty_copy(&claim(
            "Lost",
            Some("pvc-host"),
            kosmos.clone()
        )));
        // Bound to a member PV: it may hold data.
        assert!(!is_empty_copy(&claim("Bound", Some("pv-1"), kosmos)));
        // Not marked by Kosmos: a user's claim.
        assert!(!is_empty_copy(&claim("Pending", None, json!({}))));
        // The relay's own (its volume id, not naming the host PV).
        let relays = json!({"kosmos.io/global": "true", naming::VOLUME_ID_ANNOTATION: "m-1"});
        assert!(!is_empty_copy(&claim("Pending", None, relays)));
        // A copy that inherited the relay's marks names the host's PV.
        let inherited = json!({"kosmos.io/global": "true", naming::VOLUME_ID_ANNOTATION: "m-1",
            naming::VOLUME_NAME_ANNOTATION: "pvc-host"});
        assert!(is_empty_copy(&claim("Lost", Some("pvc-host"), inherited)));
    }

    fn pv(
        name: &str,
        owners: Option<&str>,
        uuid: &str,
        policy: &str,
        phase: &str,
    ) -> PersistentVolume {
        let annotations = owners.map_or(json!({}), |o| json!({KOSMOS_OWNERS_ANNOTATION: o}));
        serde_json::from_value(json!({
            "metadata": {"name": name, "uid": "p1", "annotations": annotations,
                         "labels": {naming::VOLUME_UUID_LABEL: uuid}},
            "spec": {"persistentVolumeReclaimPolicy": policy},
            "status": {"phase": phase}
        }))
        .expect("pv")
    }

    #[test]
    fn only_the_member_drivers_attacher_finalizer_counts_as_copied() {
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "relay-abc-import"},
            "spec": {"csi": {"driver": "hostpath.kl.csi.k8s.io", "volumeHandle": "h"}}
        }))
        .expect("pv");
        assert!(copied_attacher_finalizer(
            &pv,
            "external-attacher/hostpath-kl-csi-k8s-io"
        ));
        assert!(!copied_attacher_finalizer(
            &pv,
            "kubernetes.io/pv-protection"
        ));
        assert!(!copied_attacher_finalizer(
            &pv,
            "external-attacher/relay-csi-dev"
        ));
        let hostpath: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "relay-abc-import"}, "spec": {"hostPath": {"path": "/x"}}
        }))
        .expect("pv");
        assert!(!copied_attacher_finalizer(
            &hostpath,
            "external-attacher/hostpath-kl-csi-k8s-io"
        ));
    }

    #[test]
    fn a_host_pv_is_a_stale_import_copy_only_with_every_trait() {
        let name = import::pv_name("abc");
        assert!(is_stale_import_copy(
            &pv(&name, Some("member1"), "abc", "Retain", "Available"),
            "abc"
        ));
        assert!(is_stale_import_copy(
            &pv(&name, Some("member1"), "abc", "Retain", "Released"),
            "abc"
        ));
        // Not copied by Kosmos.
        assert!(!is_stale_import_copy(
            &pv(&name, None, "abc", "Retain", "Available"),
            "abc"
        ));
        // In use.
        assert!(!is_stale_import_copy(
            &pv(&name, Some("member1"), "abc", "Retain", "Bound"),
            "abc"
        ));
        // Deleting it could free data.
        assert!(!is_stale_import_copy(
            &pv(&name, Some("member1"), "abc", "Delete", "Available"),
            "abc"
        ));
        // Another volume's label, or another name.
        assert!(!is_stale_import_copy(
            &pv(&name, Some("member1"), "xyz", "Retain", "Available"),
            "abc"
        ));
        assert!(!is_stale_import_copy(
            &pv("pvc-1", Some("member1"), "abc", "Retain", "Available"),
            "abc"
        ));
    }

    /// A copy Kosmos already deleted, held by the member driver's attacher
    /// finalizer: the finalizer goes on the resourceVersion read, a
    /// conflict reads it again, and no second delete is sent.
    #[tokio::test]
    async fn a_held_host_copy_loses_the_copied_attacher_finalizer_only() {
        let (host, mut api) = crate::k8s::testing::host();
        let name = import::pv_name("abc");
        let held = |rv: &str| {
            json!({"metadata": {"name": name, "uid": "p1", "resourceVersion": rv,
                "deletionTimestamp": "2026-12-06T15:56:31Z",
                "finalizers": ["external-attacher/hostpath-kl-csi-k8s-io", "kubernetes.io/pv-protection"],
                "annotations": {KOSMOS_OWNERS_ANNOTATION: "member1"},
                "labels": {naming::VOLUME_UUID_LABEL: "abc"}},
              "spec": {"persistentVolumeReclaimPolicy": "Retain",
                       "csi": {"driver": "hostpath.kl.csi.k8s.io", "volumeHandle": "h"}},
              "status": {"phase": "Available"}})
        };
        let path = format!("/api/v1/persistentvolumes/{name}");
        // The cluster goes with the call: the mock is idle once it is dropped.
        let call = async move { remove_host_pv_copy(&host, "abc").await };
        let (done, ()) = tokio::join!(call, async {
            api.expect("GET", &path).await.ok(held("7"));
            api.expect("GET", "/apis/storage.k8s.io/v1/volumeattachments")
                .await
                .ok(json!({"items": []}));
            let patch = api.expect("PATCH", &path).await;
            assert_eq!(patch.body["metadata"]["resourceVersion"], "7");
            patch.status(409, "Conflict", "the object has been modified");
            api.expect("GET", &path).await.ok(held("8"));
            api.expect("GET", "/apis/storage.k8s.io/v1/volumeattachments")
                .await
                .ok(json!({"items": []}));
            let patch = api.expect("PATCH", &path).await;
            assert_eq!(
                patch.body["metadata"],
                json!({"resourceVersion": "8", "finalizers": ["kubernetes.io/pv-protection"]})
            );
            patch.ok(held("9"));
            api.expect_idle().await;
        });
        done.expect("removed");
    }
}
