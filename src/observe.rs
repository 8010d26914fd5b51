//! Per-RPC logging and Prometheus metrics. Only ids and codes are logged:
//! requests are never formatted wholesale, so CSI `secrets` cannot leak.

use std::future::Future;
use std::sync::OnceLock;
use std::time::Instant;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use tonic::{Response, Status};

use crate::error::CsiResult;

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

/// Runs one RPC body: converts its error to a CSI status, logs the outcome
/// with the object it concerned, and records count and latency.
pub async fn rpc<T>(
    method: &'static str,
    object: &str,
    body: impl Future<Output = CsiResult<T>>,
) -> Result<Response<T>, Status> {
    let started = Instant::now();
    let result = body.await;
    let elapsed = started.elapsed();
    let code = match &result {
        Ok(_) => tonic::Code::Ok,
        Err(e) => e.code(),
    };
    if let Some(m) = metrics() {
        m.calls
            .with_label_values(&[method, &format!("{code:?}")])
            .inc();
        m.latency
            .with_label_values(&[method])
            .observe(elapsed.as_secs_f64());
    }
    match result {
        Ok(reply) => {
            tracing::debug!(method, object, ms = elapsed.as_millis() as u64, "ok");
            Ok(Response::new(reply))
        }
        Err(err) => {
            let status: Status = err.into();
            if matches!(code, tonic::Code::Internal | tonic::Code::Unavailable) {
                tracing::error!(method, object, code = ?code, error = %status.message(), "failed");
            } else {
                tracing::info!(method, object, code = ?code, error = %status.message(), "refused");
            }
            Err(status)
        }
    }
}
