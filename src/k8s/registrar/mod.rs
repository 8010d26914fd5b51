//! The virtual-node registrar: does for virtual nodes what kubelet and
//! node-driver-registrar do for real ones.
//!
//! Why: a multi-cluster platform (Kosmos, virtual-kubelet) represents a
//! member cluster, or one of its nodes, as a *virtual* host Node. No kubelet
//! runs there, so nothing registers csi-relay on it: the node has no CSINode
//! entry and no `csi.volume.kubernetes.io/nodeid` annotation, and
//! external-attacher refuses to attach a volume to it (it cannot find the
//! node's CSI node id), and the node lacks the topology labels
//! WaitForFirstConsumer provisioning matches volumes against.
//!
//! The registrar is a `kube::runtime` controller over Nodes (enabled by a
//! flag; it runs in the controller Deployment). For every node matched by a
//! [`NodeSelector`] (default: the taint `kosmos.io/node=true:NoSchedule`
//! Kosmos puts on its virtual nodes) it keeps, as kubelet would:
//! - a CSINode named like the node whose `spec.drivers` has our entry
//!   `{name: <driver>, nodeID: <node name>, topologyKeys: [...]}`, with an
//!   owner reference to the Node, so it is garbage collected with it (kubelet
//!   sets the same reference; no finalizer is needed);
//! - our `driver → node name` pair in the node-id annotation, other drivers'
//!   pairs kept;
//! - the topology labels `<prefix>node=<node name>` and, when the node
//!   names its member cluster (the configured member label, else the member
//!   annotation, by default Kosmos's `kosmos-io/owned-by-cluster`, else the
//!   only member), `<prefix>member=<that name>`.
//!
//! When a node stops matching, exactly what the registrar added is taken
//! away again; other drivers' entries and labels kubelet or an admin set are
//! left alone (see [`fields`] for how ours are told apart). Nodes that never
//! matched cost no API request, so running it in a cluster of real nodes
//! that run the csi-relay node plugin is harmless.
//!
//! RBAC: nodes `get list watch patch`; `storage.k8s.io` csinodes
//! `get list watch create patch`.

mod controller;
pub mod fields;
pub mod nodeid;
mod reconcile;
pub mod selector;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

pub use controller::{run, run_until};
pub use fields::FIELD_MANAGER;
pub use nodeid::NODE_ID_ANNOTATION;
pub use selector::{NodeSelector, SelectorError, TaintEffect, DEFAULT_SELECTOR};

use selector::{check_key, check_value};

/// The annotation Kosmos writes on each of its nodes, naming the member
/// cluster (its `Cluster` object) the node stands for.
pub const KOSMOS_MEMBER_ANNOTATION: &str = "kosmos-io/owned-by-cluster";

/// Upper bound of one API call of a reconcile.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// A registered node is looked at again this often even without a change,
/// repairing what a watch may have missed.
pub const RESYNC_INTERVAL: Duration = Duration::from_secs(600);
/// First retry delay after a failed reconcile; doubled per failure.
pub const BACKOFF_BASE: Duration = Duration::from_secs(1);
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);
/// Reconciles running at once (each is a few requests).
const CONCURRENCY: u16 = 8;
/// Node heartbeats come in bursts; one reconcile per burst is enough.
const DEBOUNCE: Duration = Duration::from_secs(1);
/// How long [`controller::run_until`] waits for reconciles under way once asked to stop.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// What the registrar registers, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistrarConfig {
    /// The CSI driver name (the CSIDriver object's name).
    pub driver_name: String,
    /// The virtual nodes.
    pub selector: NodeSelector,
    /// Prefix of the topology keys, `topology.relay.csi.dev/` by default.
    /// The keys are `<prefix>node` and `<prefix>member`; they must be the
    /// ones the rest of the driver uses (StorageClass topology, the node
    /// plugin's NodeGetInfo, member resolution), so change it only together.
    pub topology_key_prefix: String,
    /// A node label whose value names the member cluster a virtual node
    /// stands for (e.g. `kosmos.io/cluster-name`); copied into
    /// `<prefix>member`. `None`: no member label is set (an admin-set
    /// `<prefix>member` label is still used as a topology key).
    pub member_label: Option<String>,
    /// A node annotation whose value names the member cluster, read when the
    /// member label is absent: Kosmos writes `kosmos-io/owned-by-cluster` on
    /// its nodes and sets no label naming the cluster.
    pub member_annotation: Option<String>,
    /// The member cluster of virtual nodes without that label or annotation:
    /// the only one, when the driver serves a single member cluster.
    pub default_member: Option<String>,
    /// Also mark registered virtual nodes
    /// `volumes.kubernetes.io/controller-managed-attach-detach: "true"` (as
    /// a kubelet marks its node), so the host attach/detach controller
    /// publishes the volumes of their pods: what global storage needs on
    /// Kosmos nodes (an import made, single writers held, before the pod's
    /// member gets the volume). It applies to every driver's volumes there.
    pub attach_managed: bool,
}

impl RegistrarConfig {
    /// The default selector and topology prefix, no member label.
    pub fn new(driver_name: impl Into<String>) -> Self {
        RegistrarConfig {
            driver_name: driver_name.into(),
            selector: NodeSelector::default(),
            topology_key_prefix: crate::domain::topology::TOPOLOGY_PREFIX.to_string(),
            member_label: None,
            member_annotation: None,
            default_member: None,
            attach_managed: false,
        }
    }

    pub fn node_key(&self) -> String {
        format!("{}node", self.topology_key_prefix)
    }

    pub fn member_key(&self) -> String {
        format!("{}member", self.topology_key_prefix)
    }

    /// Checks every name against the API server's rules, so that a bad flag
    /// fails at start-up rather than on every node.
    pub fn validate(&self) -> Result<(), RegistrarError> {
        let invalid = |field: &'static str, value: &str, reason: String| RegistrarError::Config {
            field,
            value: value.to_string(),
            reason,
        };
        let driver = &self.driver_name;
        if driver.is_empty() {
            return Err(invalid("driver name", driver, "is empty".into()));
        }
        check_value(driver).map_err(|r| invalid("driver name", driver, r))?;
        let prefix = &self.topology_key_prefix;
        if !prefix.ends_with('/') {
            return Err(invalid(
                "topology key prefix",
                prefix,
                "must end with '/'".into(),
            ));
        }
        check_key(&self.member_key()).map_err(|r| invalid("topology key prefix", prefix, r))?;
        if let Some(label) = &self.member_label {
            check_key(label).map_err(|r| invalid("member label", label, r))?;
        }
        if let Some(key) = &self.member_annotation {
            check_key(key).map_err(|r| invalid("member annotation", key, r))?;
        }
        Ok(())
    }
}

/// Why the registrar did not start.
#[derive(Debug, thiserror::Error)]
pub enum RegistrarError {
    #[error("virtual node registrar: {field} {value:?} {reason}")]
    Config {
        field: &'static str,
        value: String,
        reason: String,
    },
}

/// Why one reconcile failed (logged, then retried per [`backoff`]).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("node {node}: {action}: {source}")]
    Api {
        node: String,
        action: String,
        #[source]
        source: Box<kube::Error>,
    },
    #[error("node {node}: {action}: no answer within {}s", CALL_TIMEOUT.as_secs())]
    Timeout { node: String, action: String },
    /// The node cannot be registered as it is (no uid, a name too long for
    /// a label value): retried when it changes, not before.
    #[error("{0}")]
    InvalidNode(String),
}

impl ReconcileError {
    /// Someone else wrote the node between our read and our write.
    pub fn is_conflict(&self) -> bool {
        matches!(self, ReconcileError::Api { source, .. }
            if matches!(source.as_ref(), kube::Error::Api(s) if s.code == 409))
    }
}

/// The delay before retry number `failures` (1 = the first): 1 s doubling
/// to 5 min.
pub fn backoff(failures: u32) -> Duration {
    crate::rt::backoff::doubling(failures, BACKOFF_BASE, BACKOFF_MAX)
}

/// What every reconcile shares.
pub(crate) struct Context {
    client: kube::Client,
    config: RegistrarConfig,
    /// Consecutive failures per node, for the backoff.
    failures: Mutex<HashMap<String, u32>>,
}

impl Context {
    pub(crate) fn new(client: kube::Client, config: RegistrarConfig) -> Self {
        Context {
            client,
            config,
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        // A panic elsewhere cannot leave a counter map inconsistent.
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn succeeded(&self, node: &str) {
        self.failures().remove(node);
    }

    /// Records one more failure of `node`; returns how many in a row.
    fn failed(&self, node: &str) -> u32 {
        let mut failures = self.failures();
        let n = failures.entry(node.to_string()).or_default();
        *n = n.saturating_add(1);
        *n
    }
}
