//! A member claim of a class that binds at once (Immediate) is Bound before
//! CreateVolume answers: the host claim binds when CreateVolume answers, and
//! a host claim Bound over a member claim that never will be is the
//! inconsistency users of mirroring systems report (Kosmos's own sync shows
//! it). Not Bound within the wait is UNAVAILABLE with what the member said
//! of the claim (its provisioner's last warning): the provisioner retries,
//! and shows the reason on the host claim's events meanwhile.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::api::{Api, ListParams};

use crate::backends::member::pvc::{claims, phase};
use crate::domain::error::{CsiError, CsiResult};
use crate::k8s::cluster::Cluster;
use crate::k8s::converge::{self, Waited};
use crate::k8s::member_problems::said;

/// Waits up to `wait` for `claim` (as just made or adopted) to be Bound.
pub async fn await_bound(
    cluster: &Cluster,
    claim: PersistentVolumeClaim,
    wait: Duration,
) -> CsiResult<()> {
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    let name = claim.metadata.name.clone().unwrap_or_default();
    let waited = converge::until(
        cluster,
        &claims(cluster, &namespace),
        claim,
        wait,
        |c| phase(c) == "Bound",
        || {
            CsiError::Aborted(format!(
                "{}: PersistentVolumeClaim {namespace}/{name} was deleted while binding; retry",
                cluster.label()
            ))
        },
    )
    .await?;
    let current = match waited {
        Waited::Reached(_) => return Ok(()),
        Waited::TimedOut(current) => current,
    };
    let why = match last_warning(cluster, &current).await {
        Some(said) => format!("; the member says {said}"),
        None => "; the member has said nothing of it yet".into(),
    };
    Err(CsiError::Unavailable(format!(
        "{}: PersistentVolumeClaim {namespace}/{name} (StorageClass {}, which binds at once) is {}, not Bound, after {} s{why}; CreateVolume answers once the member binds it (retry)",
        cluster.label(),
        current
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref())
            .unwrap_or("?"),
        phase(&current),
        wait.as_secs(),
    )))
}

/// The newest warning the member recorded on this very claim (its uid,
/// not an earlier claim of the name), as `Reason: message`. None when it
/// has none or cannot be read: the wait's own error still says the claim
/// is not Bound.
pub async fn last_warning(cluster: &Cluster, claim: &PersistentVolumeClaim) -> Option<String> {
    let namespace = claim.metadata.namespace.as_deref()?;
    let name = claim.metadata.name.as_deref()?;
    let uid = claim.metadata.uid.as_deref();
    let mut fields = format!(
        "involvedObject.kind=PersistentVolumeClaim,involvedObject.name={name},type=Warning"
    );
    if let Some(uid) = uid {
        fields.push_str(&format!(",involvedObject.uid={uid}"));
    }
    let events = cluster
        .run(
            &format!("list Events of PersistentVolumeClaim {namespace}/{name}"),
            Api::<Event>::namespaced(cluster.client(), namespace)
                .list(&ListParams::default().fields(&fields).limit(50)),
        )
        .await
        .ok()?;
    newest_warning(&events.items)
}

/// `Reason: message` of the newest event, bounded in length.
pub fn newest_warning(events: &[Event]) -> Option<String> {
    let when = |e: &Event| {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or(e.event_time.as_ref().map(|t| t.0))
            .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    };
    events.iter().max_by_key(|e| when(e)).map(said)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn event(reason: &str, message: &str, secs: i64) -> Event {
        Event {
            reason: Some(reason.into()),
            message: Some(message.into()),
            last_timestamp: Some(Time(
                k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default(),
            )),
            ..Default::default()
        }
    }

    #[test]
    fn the_newest_warning_is_told_and_bounded() {
        assert_eq!(newest_warning(&[]), None);
        let said = newest_warning(&[
            event("ProvisioningFailed", "old", 100),
            event(
                "ProvisioningFailed",
                "error generating accessibility requirements: no available topology found",
                200,
            ),
        ]);
        assert_eq!(
            said.as_deref(),
            Some("ProvisioningFailed: error generating accessibility requirements: no available topology found")
        );
        let long = newest_warning(&[event("X", &"é".repeat(600), 1)]).unwrap_or_default();
        assert!(
            long.len() <= crate::k8s::member_problems::MEMBER_WORDS + '…'.len_utf8(),
            "{}",
            long.len()
        );
        assert!(long.ends_with('…'));
    }
}
