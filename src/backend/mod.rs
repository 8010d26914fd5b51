//! Where volume data really lives. The controller talks to one `Backend`;
//! the embedded local backend is the default, the member-cluster backend
//! reaches a remote Kubernetes cluster.
//!
//! The trait is shaped for a remote, slow, fallible backend: every call is
//! async (and may be cancelled by dropping it), every call is idempotent and
//! keyed by the driver's own record ids, so a retry after a timeout, a crash
//! or a cancelled RPC converges on the same result without duplicates.

pub mod local;
pub mod tree_copy;

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::error::CsiResult;
use crate::volume::{Snapshot, Volume};

/// Where a new volume's initial content comes from.
pub enum SourceData<'a> {
    Snapshot(&'a Snapshot),
    Volume(&'a Volume),
}

/// The health of a volume's backing storage, as CSI's VolumeCondition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub abnormal: bool,
    pub message: String,
}

impl Health {
    pub fn ok() -> Self {
        Health {
            abnormal: false,
            message: "volume is healthy".into(),
        }
    }
}

/// What a node mounts for a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeSource {
    /// A directory on this node: bind-mounted for mount access.
    Directory(PathBuf),
    /// A file on this node attached through a loop device.
    BlockFile(PathBuf),
}

#[tonic::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Short name for logs and errors.
    fn kind(&self) -> &'static str;

    /// Whether the backend can serve requests (Probe).
    async fn healthy(&self) -> CsiResult<()>;

    /// Total bytes the backend offers (GetCapacity).
    async fn total_capacity(&self) -> CsiResult<u64>;

    /// The topology segments a new volume is accessible from.
    fn volume_topology(&self) -> Vec<BTreeMap<String, String>>;

    /// Whether ControllerPublish may target this node.
    async fn node_known(&self, node_id: &str) -> CsiResult<bool>;

    /// Allocates the volume's storage (with initial content). Idempotent: a
    /// retry after a partial attempt completes it.
    async fn create_volume(&self, vol: &Volume, source: Option<SourceData<'_>>) -> CsiResult<()>;

    /// Releases the volume's storage. Already absent is success.
    async fn delete_volume(&self, vol: &Volume) -> CsiResult<()>;

    /// Grows the volume's storage to `new_size` bytes.
    async fn expand_volume(&self, vol: &Volume, new_size: u64) -> CsiResult<()>;

    /// Cuts a point-in-time copy of `source` for `snap`. Idempotent.
    async fn create_snapshot(&self, snap: &Snapshot, source: &Volume) -> CsiResult<()>;

    /// Releases a snapshot. Already absent is success.
    async fn delete_snapshot(&self, snap: &Snapshot) -> CsiResult<()>;

    /// Makes the volume available to `node_id`; returns the publish_context the
    /// node side needs.
    async fn attach(&self, vol: &Volume, node_id: &str) -> CsiResult<BTreeMap<String, String>>;

    /// Reverses `attach`. Already detached is success.
    async fn detach(&self, vol: &Volume, node_id: &str) -> CsiResult<()>;

    /// The volume's backing health (ControllerGetVolume, ListVolumes, NodeGetVolumeStats).
    async fn health(&self, vol: &Volume) -> Health;

    /// What the node side mounts for this volume.
    fn node_source(&self, vol: &Volume) -> CsiResult<NodeSource>;
}
