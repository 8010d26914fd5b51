//! The Prometheus metrics: RPCs by method and code and their latency,
//! housekeeping actions, state store syncs. `/metrics` serves the registry
//! (`app::metrics_http`).

use std::sync::OnceLock;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

pub struct Metrics {
    pub registry: Registry,
    calls: IntCounterVec,
    latency: HistogramVec,
    housekeeping: IntCounterVec,
    store_syncs: IntCounterVec,
}

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
    registry.register(Box::new(calls.clone()))?;
    registry.register(Box::new(latency.clone()))?;
    registry.register(Box::new(housekeeping.clone()))?;
    registry.register(Box::new(store_syncs.clone()))?;
    Ok(Metrics {
        registry,
        calls,
        latency,
        housekeeping,
        store_syncs,
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

/// Counts one housekeeping action (see `housekeeping_total`).
pub fn housekeeping(action: &'static str) {
    if let Some(m) = metrics() {
        m.housekeeping.with_label_values(&[action]).inc();
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
