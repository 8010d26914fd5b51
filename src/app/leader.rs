//! One controller at a time (`--leader-election`): a coordination.k8s.io
//! Lease in the host cluster, with client-go's rules, so the relay and the
//! stock sidecars beside it judge a Lease the same way:
//! - a candidate takes a Lease that is free, or whose record has not
//!   changed for its duration *as the candidate saw it* (its own monotonic
//!   clock from the moment it read that record), never by comparing wall
//!   clocks across nodes; every write names the resourceVersion it read;
//! - the holder renews every fifth of the duration, and a renewal sent at
//!   instant `t` opens the write fence (`rt::fence`) until
//!   `t + duration − margin` (margin: 3/10 of the duration). No other
//!   candidate can take the Lease before `t + duration`, so a holder that
//!   cannot renew stops writing `margin` before anyone else may start,
//!   and exits.
//!
//! Why not kube-lease-manager (which this replaced): it judges expiry by
//! comparing the renewer's wall clock with its own, and does not tell the
//! holder that a renewal failed, so a holder cut from the API server kept
//! believing it led: no bound on when it stops writing.
//!
//! Once it leads, the relay also frees the sidecars' Leases that a pod other
//! than its own still holds (see [`hand_over_sidecars`]).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::time::Instant;

use crate::k8s::relay_volume::highest_term;
use crate::rt::fence::fence;

/// The Lease's name: one per driver name.
pub fn lease_name(driver_name: &str) -> String {
    let name: String = driver_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    format!("{}-controller", name.trim_matches('-'))
}

/// The pod this process runs in (`k8s::connect::pod_name`), else the node id.
pub fn pod_name(node_id: &str) -> String {
    crate::k8s::connect::pod_name().unwrap_or_else(|| node_id.to_string())
}

/// The pod part of a relay holder identity.
pub fn holder_pod(identity: &str) -> &str {
    identity.rsplit_once('_').map_or(identity, |(pod, _)| pod)
}

/// The Leases the stock sidecars elect with for `driver` (csi-lib-utils
/// names them so; a name's non-alphanumerics become '-'): provisioner,
/// attacher, resizer, snapshotter.
pub fn sidecar_lease_names(driver: &str) -> Vec<String> {
    [
        "",
        "external-attacher-leader-",
        "external-resizer-",
        "external-snapshotter-leader-",
    ]
    .iter()
    .map(|prefix| {
        let mut name: String = format!("{prefix}{driver}")
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        if name.ends_with('-') {
            name.push('X');
        }
        name
    })
    .collect()
}

/// The election's times, all derived from the Lease's duration.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub lease: Duration,
    pub renew_every: Duration,
    pub margin: Duration,
}

impl Timing {
    pub fn for_lease(seconds: u64) -> Self {
        let lease = Duration::from_secs(seconds);
        Timing {
            lease,
            renew_every: lease / 5,
            margin: lease * 3 / 10,
        }
    }

    /// How long a renewal sent now lets this replica write.
    pub fn bought(&self) -> Duration {
        self.lease.saturating_sub(self.margin)
    }
}

/// The holder, unless the Lease is free.
fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

fn duration_of(lease: &Lease, default: Duration) -> Duration {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .map_or(default, Duration::from_secs)
}

/// What a candidate makes of a Lease whose record it has seen unchanged
/// since `seen_since`.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Free, expired, or already ours: take it now.
    Take,
    /// Held: look again at the latest at this instant.
    WaitUntil(Instant),
}

pub fn judge(
    lease: &Lease,
    me: &str,
    seen_since: Instant,
    now: Instant,
    timing: &Timing,
) -> Verdict {
    match holder(lease) {
        None => Verdict::Take,
        Some(h) if h == me => Verdict::Take,
        Some(_) => {
            let expires = seen_since + duration_of(lease, timing.lease);
            if now >= expires {
                Verdict::Take
            } else {
                Verdict::WaitUntil(expires)
            }
        }
    }
}

/// The Lease's transitions: the term of its holder.
fn transitions(lease: &Lease) -> i64 {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .map_or(0, i64::from)
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// `lease` as taken (or renewed) by `me` now.
fn taken_by(mut lease: Lease, me: &str, timing: &Timing) -> Lease {
    let now = now_micro();
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    if spec.holder_identity.as_deref() != Some(me) {
        spec.acquire_time = Some(now.clone());
        spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
        spec.holder_identity = Some(me.to_string());
    }
    spec.renew_time = Some(now);
    spec.lease_duration_seconds = Some(i32::try_from(timing.lease.as_secs()).unwrap_or(i32::MAX));
    lease
}

/// The Lease `name` before it is first taken: its transitions at `floor`
/// (the highest term recorded), so that taking it counts the term above.
fn new_lease(name: &str, namespace: &str, floor: Option<i64>) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            ..ObjectMeta::default()
        },
        spec: floor.map(|term| LeaseSpec {
            // A term beyond i32 cannot be counted above: taking it saturates.
            lease_transitions: Some(i32::try_from(term.max(0)).unwrap_or(i32::MAX)),
            ..LeaseSpec::default()
        }),
    }
}

fn is_status(e: &kube::Error, code: u16) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == code)
}

/// Held while leading; `release` gives the Lease up at shutdown so a
/// successor need not wait for it to expire.
pub struct LeaseHold {
    keeper: tokio::task::JoinHandle<()>,
    api: Api<Lease>,
    name: String,
    me: String,
    /// The pod whose relay held the Lease before this one, if another.
    pub previous_pod: Option<String>,
}

/// Waits until this replica holds the Lease, opens the fence, and keeps
/// renewing it; failing to renew in time (or finding another holder) closes
/// the fence for good and ends the process. Returns once leading.
pub async fn lead(
    client: kube::Client,
    driver_name: &str,
    pod: &str,
    namespace: &str,
    timing: Timing,
) -> Result<LeaseHold, String> {
    let name = lease_name(driver_name);
    let me = crate::k8s::connect::process_identity().to_string();
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    crate::rt::metrics::leader(false);
    tracing::info!(lease = %name, namespace, identity = %me, "waiting to lead");
    let mut seen: Option<(String, Instant)> = None;
    let changed = std::sync::Arc::new(tokio::sync::Notify::new());
    let watch = tokio::spawn(wake_on_change(api.clone(), name.clone(), changed.clone()));
    let (lease, previous) = loop {
        let read = tokio::time::timeout(
            timing.renew_every.max(Duration::from_secs(1)),
            api.get_opt(&name),
        )
        .await;
        let current = match read {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => {
                tracing::warn!(lease = %name, error = %e, "cannot read the leader Lease; trying again");
                tokio::time::sleep(timing.renew_every).await;
                continue;
            }
            Err(_) => {
                tracing::warn!(lease = %name, "reading the leader Lease timed out; trying again");
                continue;
            }
        };
        let Some(current) = current else {
            // A Lease made anew counts its terms from above every term the
            // RelayVolumes record, or each write of this leader would be
            // refused as a deposed one's (see `highest_term`).
            let floor = match highest_term(&crate::k8s::cluster::Cluster::host(client.clone()))
                .await
            {
                Ok(floor) => floor,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the RelayVolumes' leader terms before making the leader Lease; trying again");
                    tokio::time::sleep(timing.renew_every).await;
                    continue;
                }
            };
            let fresh = taken_by(new_lease(&name, namespace, floor), &me, &timing);
            let sent = Instant::now();
            match api.create(&PostParams::default(), &fresh).await {
                Ok(made) => {
                    fence().set_term(transitions(&made));
                    fence().extend_to(sent + timing.bought());
                    break (made, None);
                }
                Err(e) if is_status(&e, 409) => continue,
                Err(e) => {
                    tracing::warn!(lease = %name, error = %e, "cannot create the leader Lease; trying again");
                    tokio::time::sleep(timing.renew_every).await;
                    continue;
                }
            }
        };
        let rv = current
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        let now = Instant::now();
        let since = match &seen {
            Some((v, at)) if *v == rv => *at,
            _ => {
                seen = Some((rv, now));
                now
            }
        };
        match judge(&current, &me, since, now, &timing) {
            Verdict::WaitUntil(at) => {
                // A release (a leader stopping) is seen at once, not at the
                // next look: a replica starting meanwhile does not get there
                // first.
                tokio::select! {
                    () = tokio::time::sleep_until(at.min(now + timing.renew_every)) => {}
                    () = changed.notified() => {}
                }
            }
            Verdict::Take => {
                let previous = holder(&current).map(|h| holder_pod(h).to_string());
                let sent = Instant::now();
                match api
                    .replace(
                        &name,
                        &PostParams::default(),
                        &taken_by(current, &me, &timing),
                    )
                    .await
                {
                    Ok(taken) => {
                        fence().set_term(transitions(&taken));
                        fence().extend_to(sent + timing.bought());
                        break (taken, previous);
                    }
                    // Someone else wrote it first: read it again.
                    Err(e) if is_status(&e, 409) => continue,
                    Err(e) => {
                        tracing::warn!(lease = %name, error = %e, "cannot take the leader Lease; trying again");
                        tokio::time::sleep(timing.renew_every).await;
                    }
                }
            }
        }
    };
    watch.abort();
    crate::rt::metrics::leader(true);
    tracing::info!(lease = %name, identity = %me, previous = ?previous, "holding the leader Lease");
    let keeper = tokio::spawn(keep(api.clone(), name.clone(), me.clone(), lease, timing));
    let previous_pod = previous.filter(|p| p != pod);
    Ok(LeaseHold {
        keeper,
        api,
        name,
        me,
        previous_pod,
    })
}

/// Wakes the standby on every change of the Lease (a watch of that one
/// object); looking every renewal period stays the fallback.
async fn wake_on_change(
    api: Api<Lease>,
    name: String,
    changed: std::sync::Arc<tokio::sync::Notify>,
) {
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    let config = kube::runtime::watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(kube::runtime::watcher(api, config).default_backoff());
    while let Some(event) = events.next().await {
        if event.is_ok() {
            changed.notify_one();
        }
    }
}

/// Renews the Lease every `renew_every`; ends the process once the fence
/// expires (no renewal in time) or the Lease has another holder.
async fn keep(api: Api<Lease>, name: String, me: String, mut lease: Lease, timing: Timing) {
    let mut next = Instant::now() + timing.renew_every;
    loop {
        tokio::select! {
            biased;
            () = fence().expired() => step_down_and_exit(&name, "the Lease could not be renewed in time"),
            () = tokio::time::sleep_until(next) => {}
        }
        // No timeout of its own: a slow answer that still comes before the
        // fence closes counts (the renewal is dated from when it was sent).
        let sent = Instant::now();
        let (params, renewed) = (PostParams::default(), taken_by(lease.clone(), &me, &timing));
        let answer = tokio::select! {
            biased;
            () = fence().expired() => step_down_and_exit(&name, "the Lease could not be renewed in time"),
            answer = api.replace(&name, &params, &renewed) => answer,
        };
        // After a failure, again at once (a little later): the time left is
        // what the last renewal bought, not a renewal period.
        next = Instant::now() + RETRY_RENEWAL;
        match answer {
            Ok(renewed) => {
                fence().extend_to(sent + timing.bought());
                lease = renewed;
                next = sent + timing.renew_every;
            }
            Err(e) if is_status(&e, 409) || is_status(&e, 404) => {
                // Changed or gone under us: ours only if it still names us.
                match api.get_opt(&name).await {
                    Ok(Some(now)) if holder(&now) == Some(me.as_str()) => lease = now,
                    Ok(_) => step_down_and_exit(&name, "another replica holds the Lease"),
                    Err(e) => {
                        tracing::warn!(lease = %name, error = %e, "cannot read the leader Lease")
                    }
                }
            }
            Err(e) => {
                tracing::warn!(lease = %name, error = %e, "cannot renew the leader Lease; trying again")
            }
        }
    }
}

/// Between failed renewals.
const RETRY_RENEWAL: Duration = Duration::from_millis(250);

fn step_down_and_exit(lease: &str, why: &str) -> ! {
    fence().step_down();
    crate::rt::metrics::leader(false);
    tracing::error!(
        lease,
        reason = why,
        "no longer the leader: every write stopped; exiting so that only the new leader acts"
    );
    std::process::exit(1)
}

impl LeaseHold {
    /// Stops every write, then frees the Lease (a standby sees it free at
    /// its next look instead of waiting for it to expire).
    pub async fn release(self) {
        self.keeper.abort();
        let _ = self.keeper.await;
        fence().step_down();
        crate::rt::metrics::leader(false);
        match self.api.get_opt(&self.name).await {
            Ok(Some(mut lease)) if holder(&lease) == Some(self.me.as_str()) => {
                if let Some(spec) = lease.spec.as_mut() {
                    spec.holder_identity = None;
                    spec.renew_time = None;
                }
                if let Err(e) = self
                    .api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
                {
                    tracing::warn!(error = %e, "could not release the leader Lease; it expires on its own");
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "could not release the leader Lease; it expires on its own")
            }
        }
    }
}

/// What the leading relay does to a sidecar's Lease held elsewhere.
#[derive(Debug, PartialEq, Eq)]
pub enum Handover {
    /// Nothing: free, or held by this pod already.
    Leave,
    /// Clear the holder: external-provisioner before v6.3 elects under an
    /// identity of its own making (`<ms>-<random>-<driver>`), which the relay
    /// cannot name (v6.3 elects through csi-lib-utils, under the pod's name);
    /// freed, it is taken at the first try of whichever provisioner asks,
    /// and only this pod's can ask (the others wait in their Probe loop).
    Free,
    /// Name this pod as the holder: csi-lib-utils elects under the pod's
    /// name, so this pod's sidecar takes the record for its own and renews
    /// it at its next try, while the other pod's sidecar, finding another
    /// holder, stops leading and exits.
    Claim,
}

pub fn handover(lease_name: &str, holder: Option<&str>, driver: &str, pod: &str) -> Handover {
    let Some(holder) = holder.filter(|h| !h.is_empty()) else {
        return Handover::Leave;
    };
    if holder == pod {
        return Handover::Leave;
    }
    if sidecar_lease_names(driver).first().map(String::as_str) == Some(lease_name) {
        Handover::Free
    } else {
        Handover::Claim
    }
}

/// Puts the sidecars' Leases where this relay leads: see [`Handover`]. At
/// the start of leading every sidecar Lease is handled (no sidecar of this
/// pod is past its Probe loop yet); afterwards (`all` false) only those
/// claimed by pod name, since a provisioner's Lease cannot be told apart
/// from this pod's own. A sidecar that elects itself without a Probe loop
/// (external-resizer) can lead in a standby pod, which refuses its calls:
/// it is moved here within one look. Each write names the resourceVersion
/// it read.
pub async fn hand_over_sidecars(client: kube::Client, namespace: &str, driver: &str, pod: &str) {
    hand_over(client, namespace, driver, pod, true).await
}

async fn hand_over(client: kube::Client, namespace: &str, driver: &str, pod: &str, all: bool) {
    let api: Api<Lease> = Api::namespaced(client, namespace);
    for name in sidecar_lease_names(driver) {
        if !fence().allows() {
            return;
        }
        let lease = match api.get_opt(&name).await {
            Ok(Some(l)) => l,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(lease = %name, error = %e, "cannot read a sidecar's Lease");
                continue;
            }
        };
        let held_by = holder(&lease).map(str::to_string);
        let action = handover(&name, held_by.as_deref(), driver, pod);
        let mut moved = lease;
        let spec = moved.spec.get_or_insert_with(LeaseSpec::default);
        match action {
            Handover::Leave => continue,
            Handover::Free if !all => continue,
            Handover::Free => spec.holder_identity = None,
            Handover::Claim => {
                let now = now_micro();
                spec.holder_identity = Some(pod.to_string());
                spec.acquire_time = Some(now.clone());
                spec.renew_time = Some(now);
                spec.lease_transitions =
                    Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
            }
        }
        match api.replace(&name, &PostParams::default(), &moved).await {
            Ok(_) => {
                tracing::info!(lease = %name, held_by = ?held_by, action = ?action, "moved a sidecar's Lease to the leading replica's pod")
            }
            Err(e) => {
                tracing::warn!(lease = %name, error = %e, "cannot move a sidecar's Lease; its sidecar waits for it to expire")
            }
        }
    }
}

/// While leading, looks at the sidecars' Leases every few seconds (see
/// [`hand_over_sidecars`]).
pub fn keep_sidecars_here(client: kube::Client, namespace: String, driver: String, pod: String) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(SIDECAR_LOOK).await;
            if fence().stepped_down() {
                return;
            }
            hand_over(client.clone(), &namespace, &driver, &pod, false).await;
        }
    });
}

/// How often the leader looks at the sidecars' Leases: a resizer leading in
/// the wrong pod costs at most this plus its own retry period.
const SIDECAR_LOOK: Duration = Duration::from_secs(3);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_are_valid_and_per_driver() {
        assert_eq!(lease_name("relay.csi.dev"), "relay-csi-dev-controller");
        assert_eq!(lease_name("Other_Driver"), "other-driver-controller");
        assert!(crate::k8s::naming::is_dns_subdomain(&lease_name(
            "relay.csi.dev"
        )));
    }

    #[test]
    fn sidecar_leases_are_named_as_csi_lib_utils_names_them() {
        assert_eq!(
            sidecar_lease_names("relay.csi.dev"),
            [
                "relay-csi-dev",
                "external-attacher-leader-relay-csi-dev",
                "external-resizer-relay-csi-dev",
                "external-snapshotter-leader-relay-csi-dev"
            ]
        );
        assert_eq!(sidecar_lease_names("a.b_")[0], "a-b-X");
    }

    #[test]
    fn sidecar_leases_held_elsewhere_are_freed_or_claimed() {
        let d = "relay.csi.dev";
        let pod = "ctl-a";
        // The provisioner elects under an identity of its own: freed.
        assert_eq!(
            handover(
                "relay-csi-dev",
                Some("1795845410536-5067-relay-csi-dev"),
                d,
                pod
            ),
            Handover::Free
        );
        // The others elect by pod name: claimed for this pod.
        for lease in &sidecar_lease_names(d)[1..] {
            assert_eq!(handover(lease, Some("ctl-b"), d, pod), Handover::Claim);
            assert_eq!(handover(lease, Some(pod), d, pod), Handover::Leave);
            assert_eq!(handover(lease, None, d, pod), Handover::Leave);
            assert_eq!(handover(lease, Some(""), d, pod), Handover::Leave);
        }
    }

    #[test]
    fn identities_name_the_pod() {
        assert_eq!(
            holder_pod("csi-relay-controller-7d9-abc_0a1b2c3d"),
            "csi-relay-controller-7d9-abc"
        );
        assert_eq!(holder_pod("plain"), "plain");
        let me = crate::k8s::connect::process_identity();
        assert_eq!(me, crate::k8s::connect::process_identity());
        assert!(me.rsplit_once('_').is_some_and(|(_, tag)| tag.len() == 8));
    }

    fn lease(holder: Option<&str>, seconds: i32) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(seconds),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_lease_made_anew_counts_its_term_above_every_recorded_one() {
        let timing = Timing::for_lease(10);
        let first = taken_by(new_lease("l", "ns", None), "me", &timing);
        assert_eq!(transitions(&first), 1);
        let after = taken_by(new_lease("l", "ns", Some(7)), "me", &timing);
        assert_eq!(transitions(&after), 8);
        assert_eq!(after.metadata.namespace.as_deref(), Some("ns"));
        let huge = taken_by(new_lease("l", "ns", Some(i64::MAX)), "me", &timing);
        assert_eq!(transitions(&huge), i64::from(i32::MAX));
    }

    #[tokio::test(start_paused = true)]
    async fn a_held_lease_is_taken_only_a_whole_duration_after_its_record_was_seen() {
        let t = Timing::for_lease(10);
        let seen = Instant::now();
        let held = lease(Some("other_1"), 10);
        assert_eq!(
            judge(&held, "me_2", seen, seen + Duration::from_secs(9), &t),
            Verdict::WaitUntil(seen + Duration::from_secs(10))
        );
        assert_eq!(
            judge(&held, "me_2", seen, seen + Duration::from_secs(10), &t),
            Verdict::Take
        );
        // Its own duration rules, not ours.
        let long = lease(Some("other_1"), 30);
        assert!(matches!(
            judge(&long, "me_2", seen, seen + Duration::from_secs(20), &t),
            Verdict::WaitUntil(_)
        ));
        // Free or ours: at once.
        assert_eq!(
            judge(&lease(None, 10), "me_2", seen, seen, &t),
            Verdict::Take
        );
        assert_eq!(
            judge(&lease(Some(""), 10), "me_2", seen, seen, &t),
            Verdict::Take
        );
        assert_eq!(
            judge(&lease(Some("me_2"), 10), "me_2", seen, seen, &t),
            Verdict::Take
        );
    }

    #[test]
    fn a_renewal_stops_writes_a_margin_before_anyone_may_take_over() {
        let t = Timing::for_lease(10);
        assert_eq!(t.renew_every, Duration::from_secs(2));
        assert_eq!(t.bought(), Duration::from_secs(7));
        // Three renewals may fail before the fence closes.
        assert!(t.bought() > t.renew_every * 3);
        assert!(t.lease - t.bought() >= Duration::from_secs(3));
    }

    #[test]
    fn taking_counts_a_transition_and_renewing_does_not() {
        let t = Timing::for_lease(10);
        let taken = taken_by(lease(Some("other_1"), 10), "me_2", &t);
        let spec = taken.spec.clone().unwrap_or_default();
        assert_eq!(spec.holder_identity.as_deref(), Some("me_2"));
        assert_eq!(spec.lease_transitions, Some(1));
        assert!(spec.acquire_time.is_some() && spec.renew_time.is_some());
        let renewed = taken_by(taken, "me_2", &t);
        let again = renewed.spec.unwrap_or_default();
        assert_eq!(again.lease_transitions, Some(1));
        assert_eq!(again.acquire_time, spec.acquire_time);
    }
}
