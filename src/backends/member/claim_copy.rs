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

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;

use crate::backends::member::pvc::{self, annotation, bound_pv};
use crate::domain::error::{CsiError, CsiResult};
use crate::k8s::cluster::Cluster;
use crate::k8s::naming::VOLUME_ID_ANNOTATION;
use crate::k8s::WAIT_BUDGET;

/// Kosmos's mark on every object it copies into a member cluster.
pub const KOSMOS_COPY_ANNOTATION: &str = "kosmos.io/global";

/// How often the name is looked at while the copy goes (its PVC protection
/// finalizer is usually gone within milliseconds).
const GONE_POLL: Duration = Duration::from_millis(100);

/// Whether `claim` is a Kosmos copy the relay may replace (see the module
/// doc).
pub fn replaceable(claim: &PersistentVolumeClaim) -> bool {
    let unbound = bound_pv(claim).is_none() && pvc::phase(claim) == "Pending";
    // A copy made once the host claim was bound names the host's PV, which
    // the member does not have: Lost, bound to nothing that holds data (the
    // import of a shared volume finds these).
    let lost = pvc::phase(claim) == "Lost";
    annotation(claim, KOSMOS_COPY_ANNOTATION) == Some("true")
        && annotation(claim, VOLUME_ID_ANNOTATION).is_none()
        && (unbound || lost)
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

    #[test]
    fn only_kosmos_copies_that_hold_no_data_are_replaceable() {
        let kosmos = json!({KOSMOS_COPY_ANNOTATION: "true"});
        assert!(replaceable(&copy("Pending", None, kosmos.clone())));
        // Copied once the host claim was bound: names the host's PV, Lost.
        assert!(replaceable(&copy("Lost", Some("pvc-host"), kosmos.clone())));
        assert!(!replaceable(&copy("Bound", Some("pv-1"), kosmos.clone())));
        assert!(!replaceable(&copy("Pending", Some("pv-1"), kosmos)));
        assert!(!replaceable(&copy("Lost", Some("pvc-host"), json!({}))));
        let ours = json!({KOSMOS_COPY_ANNOTATION: "true", VOLUME_ID_ANNOTATION: "m-x"});
        assert!(!replaceable(&copy("Pending", None, ours)));
    }
}
