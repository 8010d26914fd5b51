//! The registrar's `kube::runtime` controller over Nodes (and CSINodes):
//! what runs each reconcile, retries failed ones, and stops it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::Api;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tokio_stream::StreamExt;

use super::reconcile;
use super::{
    backoff, Context, ReconcileError, RegistrarConfig, RegistrarError, CONCURRENCY, DEBOUNCE,
    SHUTDOWN_GRACE,
};

pub(super) fn error_policy(node: Arc<Node>, err: &ReconcileError, ctx: Arc<Context>) -> Action {
    if let ReconcileError::InvalidNode(_) = err {
        tracing::warn!(error = %err, "cannot register the driver on this node until it changes");
        return Action::await_change();
    }
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let delay = backoff(ctx.failed(name));
    if err.is_conflict() {
        tracing::info!(error = %err, retry_in = ?delay, "node changed under the registrar, retrying");
    } else {
        tracing::warn!(error = %err, retry_in = ?delay, "virtual node registration failed, retrying");
    }
    Action::requeue(delay)
}

/// Runs the registrar until the future is dropped (or the task aborted).
/// Fails only on an invalid `config`; API errors are logged and retried.
pub async fn run(client: kube::Client, config: RegistrarConfig) -> Result<(), RegistrarError> {
    run_until(client.clone(), client, config, std::future::pending()).await
}

/// [`run`] that stops once `shutdown` completes: reconciles under way are
/// given [`SHUTDOWN_GRACE`] to finish, then dropped.
/// `watch_client` serves the node and CSINode watches (its reads may wait
/// as long as a watch stays open), `client` every other call.
pub async fn run_until(
    client: kube::Client,
    watch_client: kube::Client,
    config: RegistrarConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RegistrarError> {
    config.validate()?;
    tracing::info!(
        driver = config.driver_name.as_str(),
        selector = %config.selector,
        member_label = ?config.member_label,
        member_annotation = ?config.member_annotation,
        "virtual node registrar started"
    );
    let nodes = Api::<Node>::all(watch_client.clone());
    let csinodes = Api::<CSINode>::all(watch_client);
    let ctx = Arc::new(Context::new(client, config));
    let (stop, mut stopping) = tokio::sync::watch::channel(false);
    let results = Controller::new(nodes, watcher::Config::default())
        .with_config(
            controller::Config::default()
                .concurrency(CONCURRENCY)
                .debounce(DEBOUNCE),
        )
        // A CSINode deleted or edited behind our back is repaired at once.
        .watches(csinodes, watcher::Config::default(), |csinode: CSINode| {
            csinode
                .metadata
                .name
                .filter(|n| !n.is_empty())
                .map(|n| ObjectRef::<Node>::new(&n))
        })
        .graceful_shutdown_on(async move {
            let _ = stopping.wait_for(|stop| *stop).await;
        })
        .run(reconcile::reconcile, error_policy, ctx);
    let mut results = std::pin::pin!(results);
    let mut shutdown = std::pin::pin!(shutdown);
    // The controller alone can wait forever: stopped before its first list
    // of nodes arrived, it waits for that list before it stops.
    let grace = tokio::time::sleep(Duration::ZERO);
    let mut grace = std::pin::pin!(grace);
    let mut stopped = false;
    loop {
        tokio::select! {
            result = results.next() => match result {
                None => break,
                Some(Ok(_)) => {}
                // Logged by error_policy.
                Some(Err(controller::Error::ReconcilerFailed(..))) => {}
                Some(Err(controller::Error::ObjectNotFound(obj))) => {
                    tracing::debug!(node = %obj, "node gone before its reconcile")
                }
                Some(Err(e)) => tracing::warn!(error = %e, "virtual node registrar: watch failed"),
            },
            () = &mut shutdown, if !stopped => {
                stopped = true;
                let _ = stop.send(true);
                grace.as_mut().reset(tokio::time::Instant::now() + SHUTDOWN_GRACE);
            }
            () = &mut grace, if stopped => {
                tracing::warn!("virtual node registrar: stopping without waiting any longer");
                break;
            }
        }
    }
    tracing::info!("virtual node registrar stopped");
    Ok(())
}
