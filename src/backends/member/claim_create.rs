//! Creating the member PVC, idempotently: the relay's own claim from an
//! earlier attempt is adopted, a mirroring system's copy of the host claim
//! holding the name is replaced (`claim_copy`), anyone else's is refused.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::PostParams;

use crate::backends::member::claim_copy;
use crate::backends::member::pvc::{annotation, belongs_to, claims, get};
use crate::domain::error::{CsiError, CsiResult};
use crate::k8s::cluster::Cluster;
use crate::k8s::naming;

/// How often one call replaces a mirroring system's copy of the claim
/// before it gives the CO the retry (the copy reappeared each time).
const REPLACE_ATTEMPTS: usize = 3;

/// Creates the member PVC, or adopts the one a previous attempt created.
/// A Kosmos copy of the host claim holding the name is replaced (see
/// [`claim_copy`]).
pub async fn ensure(
    cluster: &Cluster,
    pvc: &PersistentVolumeClaim,
    volume_id: &str,
) -> CsiResult<PersistentVolumeClaim> {
    let namespace = pvc.metadata.namespace.clone().unwrap_or_default();
    let name = pvc.metadata.name.clone().unwrap_or_default();
    let api = claims(cluster, &namespace);
    let what = format!("create PersistentVolumeClaim {namespace}/{name}");
    for _ in 0..REPLACE_ATTEMPTS {
        match cluster
            .create_or_missing(&what, api.create(&PostParams::default(), pvc))
            .await?
        {
            Ok(Some(created)) => return Ok(created),
            Ok(None) => {}
            Err(why) => {
                return Err(CsiError::FailedPrecondition(format!(
                    "{}: namespace {namespace:?} of PersistentVolumeClaim {name} does not exist ({why}); create it there, or set the StorageClass parameter createMemberNamespace: \"true\"",
                    cluster.label()
                )))
            }
        }
        // Already there: ours from an earlier attempt, or someone else's.
        let Some(existing) = get(cluster, &namespace, &name).await? else {
            continue;
        };
        if claim_copy::replaceable(&existing, pvc) {
            claim_copy::remove(cluster, &existing).await?;
            continue;
        }
        return adopt(cluster, existing, pvc, volume_id);
    }
    Err(CsiError::Aborted(format!(
        "{}: PersistentVolumeClaim {namespace}/{name} was taken by another claim {REPLACE_ATTEMPTS} times while the relay created it; retry",
        cluster.label()
    )))
}

/// The claim found under the member PVC's name: the relay's own from an
/// earlier attempt, or an error saying whose it is. Its marks are not
/// enough: a copy carries them too, so a claim whose spec is not what the
/// relay made (`wanted`) is refused as someone else's.
fn adopt(
    cluster: &Cluster,
    existing: PersistentVolumeClaim,
    wanted: &PersistentVolumeClaim,
    volume_id: &str,
) -> CsiResult<PersistentVolumeClaim> {
    let namespace = existing.metadata.namespace.as_deref().unwrap_or_default();
    let name = existing.metadata.name.as_deref().unwrap_or_default();
    if belongs_to(&existing, volume_id) {
        if let Some(why) = claim_copy::not_the_relays(&existing, wanted) {
            return Err(CsiError::AlreadyExists(format!(
                "{}: PersistentVolumeClaim {namespace}/{name} carries csi-relay's marks for volume {volume_id} but is not the claim the relay made ({why}): a copy that inherited them (Kosmos copies a member claim's labels and annotations onto the host claim, and its copies of the host claim carry them) and that holds data, so the relay does not replace it: delete it if nothing needs it",
                cluster.label(),
            )));
        }
    }
    if !belongs_to(&existing, volume_id) {
        let whose = match annotation(&existing, naming::VOLUME_ID_ANNOTATION) {
            Some(other) => format!("the relay made it for volume {other}"),
            None => format!(
                "it has no {} annotation, so something else made it",
                naming::VOLUME_ID_ANNOTATION
            ),
        };
        return Err(CsiError::AlreadyExists(format!(
            "{}: PersistentVolumeClaim {namespace}/{name} already exists and csi-relay did not create it for volume {volume_id} ({whose}); the relay never adopts or changes a claim it did not make: delete or rename that claim, or, where no pod expects the claim under the host claim's name, set the StorageClass parameter memberClaimName: generated",
            cluster.label(),
        )));
    }
    if existing.metadata.deletion_timestamp.is_some() {
        return Err(CsiError::Aborted(format!(
            "{}: PersistentVolumeClaim {namespace}/{name} is being deleted; retry once it is gone",
            cluster.label()
        )));
    }
    Ok(existing)
}
