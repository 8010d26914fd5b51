//! A mirroring system's copy of the host claim, found where the relay's
//! member PVC should be.
//!
//! Kosmos mirrors a pod into the member as soon as it sits on a virtual
//! node and copies each of its host PVCs there under the same name unless a
//! claim of that name exists (`createStorageInLeafCluster`). When the pod
//! gets there before CreateVolume has made the relay's member PVC, Kosmos's
//! copy holds the name: it keeps the host's StorageClass, which the member
//! does not have, so it never binds, and the mirrored pod waits on it
//! forever. The member scheduler keeps such a pod unscheduled (its claim is
//! unbound), so nothing uses the copy and the member's PVC protection lets
//! it go at once.
//!
//! An unbound claim holds no data, nor does a Lost one (a copy made after
//! the host claim bound names the host's PV, which the member lacks), so
//! replacing it with the relay's own loses nothing; the mirrored pod then finds the relay's claim under the
//! name it expects. Only a claim Kosmos marked (`kosmos.io/global: "true"`),
//! that the relay did not make and that nothing bound is replaced: any
//! other claim of that name is refused, as before.
//!
//! Marks do not say who made a claim. Kosmos's leaf PVC controller copies a
//! member claim's labels and annotations onto the host claim, and its next
//! copy of the host claim (into another member, or into the same one once
//! the relay's claim went) carries them: the relay's volume-id annotation
//! included. What a copy cannot carry is the relay's spec: a claim's class
//! and the PersistentVolume it names are fixed at creation, and a copy has
//! the host claim's (the host class, the host PV). So a claim whose class or
//! volume name is not what the relay gives the name is not the relay's,
//! whatever its marks (`not_the_relays`).

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::backends::member::pvc::{self, annotation, bound_pv, KOSMOS_COPY_ANNOTATION};
use crate::domain::error::{CsiError, CsiResult};
use crate::k8s::cluster::Cluster;
use crate::k8s::naming::VOLUME_ID_ANNOTATION;
use crate::k8s::WAIT_BUDGET;

/// How often the name is looked at while the copy goes (its PVC protection
/// finalizer is usually gone within milliseconds).
const GONE_POLL: Duration = Duration::from_millis(100);

/// Whether `claim` is a Kosmos copy the relay may replace with `wanted`,
/// the claim it makes under that name (see the module doc).
pub fn replaceable(claim: &PersistentVolumeClaim, wanted: &PersistentVolumeClaim) -> bool {
    let not_made_by_the_relay = annotation(claim, VOLUME_ID_ANNOTATION).is_none()
        || not_the_relays(claim, wanted).is_some();
    annotation(claim, KOSMOS_COPY_ANNOTATION) == Some("true")
        && not_made_by_the_relay
        && holds_no_data(claim)
}

/// Whether `claim` is bound to nothing of its member: Pending with no
/// volume, or Lost (a copy made once the host claim was bound names the
/// host's PV, which the member does not have; the import of a shared
/// volume finds these).
pub fn holds_no_data(claim: &PersistentVolumeClaim) -> bool {
    let phase = pvc::phase(claim);
    (phase == "Pending" && bound_pv(claim).is_none()) || phase == "Lost"
}

/// Why `claim`, found under the name of `wanted`, cannot be the claim the
/// relay made there, whatever its marks: its class or the PersistentVolume
/// it names differ from what `wanted` fixes (both are immutable once made).
/// A class `wanted` leaves to the member's default, or a volume it leaves
/// to the binder, says nothing.
pub fn not_the_relays(
    claim: &PersistentVolumeClaim,
    wanted: &PersistentVolumeClaim,
) -> Option<String> {
    let spec = |c: &PersistentVolumeClaim| c.spec.clone().unwrap_or_default();
    let (have, want) = (spec(claim), spec(wanted));
    if let Some(class) = want.storage_class_name.as_deref() {
        let theirs = have.storage_class_name.as_deref().unwrap_or("");
        if theirs != class {
            return Some(format!(
                "its class is {theirs:?} where the relay's claim names {class:?}"
            ));
        }
    }
    if let Some(volume) = want.volume_name.as_deref() {
        let theirs = have.volume_name.as_deref().unwrap_or("");
        if theirs != volume {
            return Some(format!(
                "it names PersistentVolume {theirs:?} where the relay's claim names {volume:?}"
            ));
        }
    }
    None
}

/// Deletes the copy `claim` (only that object: the delete is conditional on
/// its uid) and waits, within [`WAIT_BUDGET`], until the name is free.
/// ABORTED when it is still there after that: the CO retries the call.
pub async fn remove(cluster: &Cluster, claim: &PersistentVolumeClaim) -> CsiResult<()> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let uid = claim.metadata.uid.clone();
    // 409 inside: another claim took the name meanwhile; the caller looks again.
    pvc::delete_exactly(cluster, claim).await?;
    tracing::info!(member = %cluster.name(), pvc = %format!("{namespace}/{name}"),
        "replacing Kosmos's unbound copy of the host claim with the relay's member PVC");
    let deadline = tokio::time::Instant::now() + WAIT_BUDGET;
    loop {
        match pvc::get(cluster, &namespace, &name).await? {
            None => return Ok(()),
            Some(now) if now.metadata.uid != uid => return Ok(()),
            Some(now) if tokio::time::Instant::now() >= deadline => {
                let finalizers = now.metadata.finalizers.unwrap_or_default();
                return Err(CsiError::Aborted(format!(
                    "{}: Kosmos's unbound copy of PersistentVolumeClaim {namespace}/{name} was deleted so that the relay's claim can take its name, but it is still there after {}s (finalizers {finalizers:?}; a member pod scheduled onto a node with it keeps it); retry",
                    cluster.label(),
                    WAIT_BUDGET.as_secs()
                )));
            }
            Some(_) => tokio::time::sleep(GONE_POLL).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn copy(
        phase: &str,
        volume: Option<&str>,
        annotations: serde_json::Value,
    ) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "app", "annotations": annotations},
            "spec": {"volumeName": volume},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    /// The claim the relay makes under the name: `class` and `volume` as
    /// it fixes them (None: left to the member).
    fn wanted(class: Option<&str>, volume: Option<&str>) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "app"},
            "spec": {"storageClassName": class, "volumeName": volume}
        }))
        .unwrap()
    }

    #[test]
    fn only_kosmos_copies_that_hold_no_data_are_replaceable() {
        let any = wanted(None, None);
        let kosmos = json!({KOSMOS_COPY_ANNOTATION: "true"});
        assert!(replaceable(&copy("Pending", None, kosmos.clone()), &any));
        // Copied once the host claim was bound: names the host's PV, Lost.
        assert!(replaceable(
            &copy("Lost", Some("pvc-host"), kosmos.clone()),
            &any
        ));
        assert!(!replaceable(
            &copy("Bound", Some("pv-1"), kosmos.clone()),
            &any
        ));
        assert!(!replaceable(&copy("Pending", Some("pv-1"), kosmos), &any));
        assert!(!replaceable(
            &copy("Lost", Some("pvc-host"), json!({})),
            &any
        ));
        let ours = json!({KOSMOS_COPY_ANNOTATION: "true", VOLUME_ID_ANNOTATION: "m-x"});
        assert!(!replaceable(&copy("Pending", None, ours), &any));
    }

    /// The stuck import of issue 61: member2's claim was a Kosmos copy of the
    /// host claim that had inherited the relay's marks (volume id, uuid,
    /// imported-from) through Kosmos's leaf PVC controller; it named the host
    /// PV and the host class, and was Lost. The relay took it for its import
    /// claim and waited on it for six minutes.
    #[test]
    fn a_copy_that_inherited_the_relays_marks_is_told_apart_by_its_spec() {
        let import = wanted(Some(""), Some("relay-0a1b-import"));
        let inherited = json!({
            KOSMOS_COPY_ANNOTATION: "true",
            VOLUME_ID_ANNOTATION: "m-member1-0a1b",
        });
        let mut lost = copy("Lost", Some("pvc-host"), inherited.clone());
        lost.spec.as_mut().unwrap().storage_class_name = Some("relay-shared".into());
        let why = not_the_relays(&lost, &import).expect("not the relay's");
        assert!(why.contains("relay-shared"), "{why}");
        assert!(replaceable(&lost, &import));
        // Its class matching, the PV it names still gives it away.
        lost.spec.as_mut().unwrap().storage_class_name = Some(String::new());
        let why = not_the_relays(&lost, &import).expect("not the relay's");
        assert!(
            why.contains("pvc-host") && why.contains("relay-0a1b-import"),
            "{why}"
        );
        assert!(replaceable(&lost, &import));
        // The relay's own import claim, even one Kosmos marked, is kept.
        let mut made = copy("Pending", Some("relay-0a1b-import"), inherited.clone());
        made.spec.as_mut().unwrap().storage_class_name = Some(String::new());
        assert_eq!(not_the_relays(&made, &import), None);
        assert!(!replaceable(&made, &import));
        // A copy that inherited the marks and is bound to data is never
        // replaced (it is refused: claim_create).
        let mut bound = copy("Bound", Some("pv-data"), inherited.clone());
        bound.spec.as_mut().unwrap().storage_class_name = Some("fast".into());
        assert!(not_the_relays(&bound, &wanted(Some("standard"), None)).is_some());
        assert!(!replaceable(&bound, &wanted(Some("standard"), None)));
        // An origin claim whose class the member defaults says nothing by
        // class; the binder's volume name says nothing either.
        assert_eq!(not_the_relays(&bound, &wanted(None, None)), None);
        assert!(!replaceable(
            &copy("Pending", None, inherited),
            &wanted(None, None)
        ));
    }
}
