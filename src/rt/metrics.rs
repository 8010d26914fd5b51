//! The Prometheus metrics: RPCs by method and code and their latency,
//! housekeeping actions, state store syncs, Kubernetes API requests by
//! cluster and whether each cluster answers, unfinished volumes and the age
//! of the oldest create, the member claims observed and their PVs not read
//! yet, and leadership. `/metrics` serves the registry
//! (`app::metrics_http`); deploy/monitoring's alerts and dashboard use them.

use std::sync::OnceLock;

use prometheus::{
    HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

pub struct Metrics {
    pub registry: Registry,
    calls: IntCounterVec,
    latency: HistogramVec,
    housekeeping: IntCounterVec,
    store_syncs: IntCounterVec,
    kube_requests: IntCounterVec,
    reachable: IntGaugeVec,
    unfinished: IntGaugeVec,
    provisioning_oldest: IntGauge,
    member_claims: IntGaugeVec,
    member_unread: IntGaugeVec,
    fenced_pods: IntCounterVec,
    leader: IntGauge,
    move_bytes: IntCounterVec,
    move_passes: IntCounterVec,
    move_seconds: HistogramVec,
    move_failures: IntCounterVec,
}

/// The `action` values of `housekeeping_total`.
pub const HOUSEKEEPING_ACTIONS: [&str; 11] = [
    "abandoned_volume",
    "collected_attachment",
    "detached_loop",
    "expired_group_snapshot",
    "expired_snapshot",
    "expired_volume",
    "finished_group_snapshot_delete",
    "finished_snapshot_delete",
    "finished_volume_delete",
    "quarantined_record",
    "reclaimed_data",
];

fn build() -> Result<Metrics, prometheus::Error> {
    let registry = Registry::new_custom(Some("csi_relay".into()), None)?;
    let calls = IntCounterVec::new(
        Opts::new("rpc_total", "CSI RPCs served, by method and gRPC code"),
        &["method", "code"],
    )?;
    let latency = HistogramVec::new(
        HistogramOpts::new("rpc_duration_seconds", "CSI RPC latency, by method").buckets(vec![
            0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0,
        ]),
        &["method"],
    )?;
    let housekeeping = IntCounterVec::new(
        Opts::new(
            "housekeeping_total",
            "Leftovers cleaned up without a CO call: expired provisioning records, \
             finished deletions, reclaimed orphan data, quarantined records",
        ),
        &["action"],
    )?;
    let store_syncs = IntCounterVec::new(
        Opts::new(
            "store_syncs_total",
            "Syncs of the state store, by cause: a change that waited for it (commit), \
             lazy changes made durable in the background (flush), a create's record \
             synced beside its data (sync), a checkpoint of redb",
        ),
        &["cause"],
    )?;
    let kube_requests = IntCounterVec::new(
        Opts::new(
            "kube_requests_total",
            "Kubernetes API requests, by cluster (host, or the member's name) and outcome: \
             ok, api_error (the API server answered with an error), unreachable (no \
             connection or no answer in time), error (credentials, client)",
        ),
        &["cluster", "outcome"],
    )?;
    let reachable = IntGaugeVec::new(
        Opts::new(
            "cluster_reachable",
            "1 when the cluster's API server answered the last request, 0 when it was \
             unreachable",
        ),
        &["cluster"],
    )?;
    let unfinished = IntGaugeVec::new(
        Opts::new(
            "unfinished_volumes",
            "Volumes whose CreateVolume (provisioning) or DeleteVolume (deleting) has not \
             finished, at the last housekeeping sweep",
        ),
        &["lifecycle"],
    )?;
    // Only a create's age is known: a record holds when its volume was
    // created, not when its deletion began.
    let provisioning_oldest = IntGauge::with_opts(Opts::new(
        "provisioning_volume_oldest_seconds",
        "Age of the oldest volume whose CreateVolume has not finished, at the last \
         housekeeping sweep (0: none)",
    ))?;
    let member_claims = IntGaugeVec::new(
        Opts::new(
            "member_claims",
            "Relay claims the member observation holds, by member",
        ),
        &["member"],
    )?;
    let member_unread = IntGaugeVec::new(
        Opts::new(
            "member_unread_volumes",
            "Relay claims in a member bound to a PV that the relay has not read yet \
             (or could not read): until it does, their attachments and in-use states \
             there are not seen",
        ),
        &["member"],
    )?;
    let fenced_pods = IntCounterVec::new(
        Opts::new(
            "fenced_pods_total",
            "Pods deleted in a member declared lost (--fence-member) because they use a \
             shared volume that other members now write",
        ),
        &["member"],
    )?;
    let leader = IntGauge::with_opts(Opts::new(
        "leader",
        "1 while this controller holds its leader Lease (--leader-election), 0 while it waits",
    ))?;
    let move_bytes = IntCounterVec::new(
        Opts::new(
            "move_bytes_total",
            "Bytes a volume move sent between the movers (as on the wire, compressed where \
             it paid), by source and target member",
        ),
        &["from", "to"],
    )?;
    let move_passes = IntCounterVec::new(
        Opts::new(
            "move_passes_total",
            "Copy passes of volume moves, by source and target member",
        ),
        &["from", "to"],
    )?;
    let move_seconds = HistogramVec::new(
        HistogramOpts::new(
            "move_pass_duration_seconds",
            "How long a copy pass of a volume move took",
        )
        .buckets(vec![0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0]),
        &["from", "to"],
    )?;
    let move_failures = IntCounterVec::new(
        Opts::new(
            "move_failures_total",
            "Attempts of a volume move that failed and are retried (target claim, movers, \
             the copy), by source and target member",
        ),
        &["from", "to"],
    )?;
    // Every action from the start, at 0: an alert's increase() then counts
    // the first one too, and a scrape shows what can happen.
    for action in HOUSEKEEPING_ACTIONS {
        housekeeping.with_label_values(&[action]);
    }
    registry.register(Box::new(calls.clone()))?;
    registry.register(Box::new(latency.clone()))?;
    registry.register(Box::new(housekeeping.clone()))?;
    registry.register(Box::new(store_syncs.clone()))?;
    registry.register(Box::new(kube_requests.clone()))?;
    registry.register(Box::new(reachable.clone()))?;
    registry.register(Box::new(unfinished.clone()))?;
    registry.register(Box::new(provisioning_oldest.clone()))?;
    registry.register(Box::new(member_claims.clone()))?;
    registry.register(Box::new(member_unread.clone()))?;
    registry.register(Box::new(fenced_pods.clone()))?;
    registry.register(Box::new(move_bytes.clone()))?;
    registry.register(Box::new(move_passes.clone()))?;
    registry.register(Box::new(move_seconds.clone()))?;
    registry.register(Box::new(move_failures.clone()))?;
    registry.register(Box::new(crate::rt::move_stall::StallCollector::new()?))?;
    Ok(Metrics {
        registry,
        calls,
        latency,
        housekeeping,
        store_syncs,
        kube_requests,
        reachable,
        unfinished,
        provisioning_oldest,
        member_claims,
        member_unread,
        fenced_pods,
        leader,
        move_bytes,
        move_passes,
        move_seconds,
        move_failures,
    })
}

pub fn metrics() -> Option<&'static Metrics> {
    static METRICS: OnceLock<Option<Metrics>> = OnceLock::new();
    METRICS
        .get_or_init(|| match build() {
            Ok(m) => Some(m),
            Err(e) => {
                tracing::error!(error = %e, "metrics disabled: registry setup failed");
                None
            }
        })
        .as_ref()
}

/// Counts one housekeeping action (see `housekeeping_total`), one of
/// [`HOUSEKEEPING_ACTIONS`].
pub fn housekeeping(action: &'static str) {
    debug_assert!(HOUSEKEEPING_ACTIONS.contains(&action), "{action}");
    if let Some(m) = metrics() {
        m.housekeeping.with_label_values(&[action]).inc();
    }
}

/// Counts one pod the fence deleted in a member declared lost.
pub fn fenced_pod(member: &str) {
    if let Some(m) = metrics() {
        m.fenced_pods.with_label_values(&[member]).inc();
    }
}

/// Counts one sync of the state store (see `store_syncs_total`).
pub fn store_sync(cause: &'static str) {
    if let Some(m) = metrics() {
        m.store_syncs.with_label_values(&[cause]).inc();
    }
}

/// Counts one finished RPC with its gRPC code (`Debug` of tonic's `Code`)
/// and records its latency.
pub fn rpc_done(method: &'static str, code: &str, elapsed: std::time::Duration) {
    if let Some(m) = metrics() {
        m.calls.with_label_values(&[method, code]).inc();
        m.latency
            .with_label_values(&[method])
            .observe(elapsed.as_secs_f64());
    }
}

/// A pass of a move from member `from` to `to`: bytes sent, seconds.
pub fn move_pass(from: &str, to: &str, bytes: u64, seconds: f64) {
    if let Some(m) = metrics() {
        m.move_bytes.with_label_values(&[from, to]).inc_by(bytes);
        m.move_passes.with_label_values(&[from, to]).inc();
        m.move_seconds
            .with_label_values(&[from, to])
            .observe(seconds);
    }
}

/// An attempt of a move that failed (it is retried).
pub fn move_failure(from: &str, to: &str) {
    if let Some(m) = metrics() {
        m.move_failures.with_label_values(&[from, to]).inc();
    }
}

/// Counts one Kubernetes API request of `cluster` by its outcome, and
/// records whether the cluster answered.
pub fn kube_request(cluster: &str, outcome: &'static str) {
    if let Some(m) = metrics() {
        m.kube_requests.with_label_values(&[cluster, outcome]).inc();
        let answered = match outcome {
            "ok" | "api_error" => 1,
            "unreachable" => 0,
            _ => return,
        };
        m.reachable.with_label_values(&[cluster]).set(answered);
    }
}

/// The unfinished volumes housekeeping found: how many creates and
/// deletes, and the oldest create's age in seconds (0: none).
pub fn unfinished_volumes(provisioning: usize, oldest_provisioning: i64, deleting: usize) {
    if let Some(m) = metrics() {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        m.unfinished
            .with_label_values(&["provisioning"])
            .set(count(provisioning));
        m.unfinished
            .with_label_values(&["deleting"])
            .set(count(deleting));
        m.provisioning_oldest.set(oldest_provisioning.max(0));
    }
}

/// What the observation of `member` holds: its relay claims, and how many
/// of those are bound to a PV not read yet.
pub fn member_claims(member: &str, claims: usize, unread: usize) {
    if let Some(m) = metrics() {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        m.member_claims
            .with_label_values(&[member])
            .set(count(claims));
        m.member_unread
            .with_label_values(&[member])
            .set(count(unread));
    }
}

/// Whether this controller leads; registered (so exported) only by a
/// process that takes part in leader election.
pub fn leader(leads: bool) {
    if let Some(m) = metrics() {
        // Registering twice is refused and harmless: it is there already.
        let _ = m.registry.register(Box::new(m.leader.clone()));
        m.leader.set(i64::from(leads));
    }
}
