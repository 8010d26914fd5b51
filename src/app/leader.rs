//! One controller at a time (`--leader-election`): a coordination.k8s.io
//! Lease in the host cluster, held through `kube-lease-manager`. Until this
//! replica holds it, controller calls answer UNAVAILABLE and no background
//! controller work starts; a replica that loses it exits, so a deposed
//! leader never acts on a view another leader has since changed.

use kube_lease_manager::{LeaseManagerBuilder, LeaseParams};
use tokio::sync::watch;

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

/// Who this replica is in the Lease: the pod (HOSTNAME) and process.
pub fn identity(node_id: &str) -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| node_id.to_string());
    format!("{host}-{}", std::process::id())
}

/// Waits until this replica holds the Lease, then watches it: losing it
/// ends the process. Returns once leading.
pub async fn lead(
    client: kube::Client,
    driver_name: &str,
    node_id: &str,
    namespace: &str,
    lease_seconds: u64,
) -> Result<LeaseHold, String> {
    let name = lease_name(driver_name);
    let me = identity(node_id);
    let duration = lease_seconds;
    let grace = (lease_seconds / 3).max(2);
    let manager = LeaseManagerBuilder::new(client, &name)
        .with_namespace(namespace)
        .with_parameters(LeaseParams::new(&me, duration, grace))
        .build()
        .await
        .map_err(|e| format!("leader Lease {namespace}/{name}: {e}"))?;
    let (mut channel, task) = manager.watch().await;
    tracing::info!(lease = %name, namespace, identity = %me, "waiting to lead");
    crate::rt::metrics::leader(false);
    while !*channel.borrow_and_update() {
        if channel.changed().await.is_err() {
            return Err(format!(
                "leader Lease {namespace}/{name}: its manager stopped"
            ));
        }
    }
    tracing::info!(lease = %name, identity = %me, "holding the leader Lease");
    crate::rt::metrics::leader(true);
    let watching = channel.clone();
    let guard = tokio::spawn(async move {
        let mut channel = watching;
        loop {
            let lost = match channel.changed().await {
                Ok(()) => !*channel.borrow_and_update(),
                Err(_) => true,
            };
            if lost {
                tracing::error!(lease = %name, "lost the leader Lease; exiting so that only the new leader acts");
                std::process::exit(1);
            }
        }
    });
    Ok(LeaseHold {
        channel: Some(channel),
        task: Some(task),
        guard,
    })
}

/// Held while leading; `release` gives the Lease up at shutdown so a
/// successor need not wait for it to expire.
pub struct LeaseHold {
    channel: Option<watch::Receiver<bool>>,
    task: Option<
        tokio::task::JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
    >,
    /// Ends the process when the Lease is lost; stopped before a release.
    guard: tokio::task::JoinHandle<()>,
}

impl LeaseHold {
    pub async fn release(mut self) {
        // Giving the Lease up is not losing it.
        self.guard.abort();
        let _ = (&mut self.guard).await;
        drop(self.channel.take());
        if let Some(task) = self.task.take() {
            match task.await {
                Ok(Ok(manager)) => {
                    if let Err(e) = manager.release().await {
                        tracing::warn!(error = %e, "could not release the leader Lease; it expires on its own");
                    }
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "leader Lease manager failed"),
                Err(e) => tracing::warn!(error = %e, "leader Lease manager panicked"),
            }
        }
    }
}

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
}
