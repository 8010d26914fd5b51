//! Where volume data really lives. The controller talks to one `Backend`;
//! the embedded local backend is the default, the member-cluster backend
//! reaches a remote Kubernetes cluster.
//!
//! The trait is shaped for a remote, slow, fallible backend: every call is
//! async (and may be cancelled by dropping it), every call is idempotent and
//! keyed by the driver's own record ids, so a retry after a timeout, a crash
//! or a cancelled RPC converges on the same result without duplicates.
//!
//! May import: `csi`, `domain`, `rt`, `os`, `store`, `k8s`.

pub mod local;
pub mod member;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use crate::csi;
use crate::domain::capability::Capability;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::params::{GroupSnapshotParams, SnapshotParams, VolumeParams};
use crate::domain::volume::{Backing, GroupSnapshot, Snapshot, Volume};

/// Where a new volume's initial content comes from.
pub enum SourceData<'a> {
    Snapshot(&'a Snapshot),
    Volume(&'a Volume),
}

/// How a group snapshot's members were cut (`Backend::create_group_snapshot`).
#[derive(Debug)]
pub enum GroupCut {
    /// At one instant, by the storage: the snapshots as cut.
    Whole(Vec<Snapshot>),
    /// Not by the backend: the caller cuts each, one after another.
    OneByOne,
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
    /// A member cluster's PersistentVolume source (NFS export, host path,
    /// local path or CSI volume), as ControllerPublishVolume described it.
    Member(Box<crate::domain::member_source::MemberSource>),
}

/// Whose data a stored entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataKind {
    Volume,
    Snapshot,
}

/// One entry of a backend's own storage: a volume's or snapshot's data, or
/// a temporary one still being filled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredData {
    pub kind: DataKind,
    pub id: String,
    pub path: std::path::PathBuf,
    pub temporary: bool,
}

/// An attachment the backend itself made on its storage's side (a member
/// VolumeAttachment), found by its marks; housekeeping removes those no
/// record wants any more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnAttachment {
    pub volume_id: String,
    pub name: String,
    /// Where it lives (the member cluster), for logs.
    pub place: String,
}

/// What the backend decides for a new volume before anything is allocated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub id: String,
    pub backing: Backing,
    /// accessible_topology of the new volume.
    pub topology: Vec<BTreeMap<String, String>>,
    /// volume_context of the new volume.
    pub context: BTreeMap<String, String>,
}

/// GetCapacity's answer, when the backend knows its storage better than
/// "total minus allocated".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapacityReport {
    pub available: u64,
    pub maximum_volume_size: Option<u64>,
}

/// The `offered` segments a volume can be placed in under `req` (only keys
/// of this driver's topology prefix are compared); RESOURCE_EXHAUSTED when
/// none of the requisite topologies can be served.
pub fn requested_topology(
    offered: Vec<BTreeMap<String, String>>,
    req: Option<&csi::TopologyRequirement>,
) -> CsiResult<Vec<BTreeMap<String, String>>> {
    let Some(req) = req else { return Ok(offered) };
    let matches = |t: &csi::Topology| {
        offered.iter().any(|o| {
            t.segments.iter().all(|(k, v)| {
                !k.starts_with(crate::domain::topology::TOPOLOGY_PREFIX) || o.get(k) == Some(v)
            })
        })
    };
    if !req.requisite.is_empty() && !req.requisite.iter().any(matches) {
        return Err(CsiError::ResourceExhausted(format!(
            "none of the requisite topologies {:?} can be served; this driver offers {offered:?}",
            req.requisite
                .iter()
                .map(|t| &t.segments)
                .collect::<Vec<_>>()
        )));
    }
    Ok(offered)
}

#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Short name for logs and errors.
    fn kind(&self) -> &'static str;

    /// Whether the backend can serve requests (Probe).
    async fn healthy(&self) -> CsiResult<()>;

    /// Total bytes the backend offers (GetCapacity).
    async fn total_capacity(&self) -> CsiResult<u64>;

    /// Every topology segment the backend serves volumes in.
    fn volume_topology(&self) -> Vec<BTreeMap<String, String>>;

    /// Refuses StorageClass parameters this backend does not use
    /// (INVALID_ARGUMENT naming them).
    fn check_parameters(&self, _params: &VolumeParams) -> CsiResult<()> {
        Ok(())
    }

    /// Refuses VolumeSnapshotClass parameters this backend does not use.
    fn check_snapshot_parameters(&self, _params: &SnapshotParams) -> CsiResult<()> {
        Ok(())
    }

    /// Decides the id, backing, topology and context of a new volume from its
    /// CSI name, decoded parameters, capabilities and accessibility
    /// requirements.
    fn place(
        &self,
        name: &str,
        params: &VolumeParams,
        caps: &[Capability],
        req: Option<&csi::TopologyRequirement>,
        source: Option<&Backing>,
    ) -> CsiResult<Placement>;

    /// Whether volumes with these parameters are reachable from `segments`
    /// (GetCapacity's accessible_topology).
    fn serves_topology(&self, _params: &VolumeParams, segments: &HashMap<String, String>) -> bool {
        self.volume_topology()
            .iter()
            .any(|o| segments.iter().all(|(k, v)| o.get(k) == Some(v)))
    }

    /// Bytes free right now where new volumes' data goes, when the backend
    /// knows (GetCapacity never offers more than this).
    async fn free_bytes(&self) -> CsiResult<Option<u64>> {
        Ok(None)
    }

    /// GetCapacity from the backend's own knowledge; `None` means "total
    /// capacity minus what this driver allocated".
    async fn capacity_for(
        &self,
        _params: &VolumeParams,
        _segments: Option<&HashMap<String, String>>,
    ) -> CsiResult<Option<CapacityReport>> {
        Ok(None)
    }

    /// Whether ControllerPublish may target this node.
    async fn node_known(&self, node_id: &str) -> CsiResult<bool>;

    /// Allocates the volume's storage (with initial content). Idempotent: a
    /// retry after a partial attempt completes it. Never NOT_FOUND: to the
    /// CO, CreateVolume's NOT_FOUND says the content source does not exist
    /// (the caller checks that against its records first); anything the
    /// backend finds missing on the way is FAILED_PRECONDITION.
    /// `Some(backing)`: the record's backing as made, kept from then on
    /// (the member backend adds the uid of the claim it made).
    async fn create_volume(
        &self,
        vol: &Volume,
        source: Option<SourceData<'_>>,
    ) -> CsiResult<Option<Backing>>;

    /// What the created volume's context gets beyond its placement's, once
    /// `create_volume` succeeded: facts only known then (the member
    /// backend: where a shared volume's data is, for imports made while
    /// the member that made it is lost). The CO keeps the context in the
    /// host PV, which no one changes afterwards.
    async fn created_context(&self, _vol: &Volume) -> CsiResult<BTreeMap<String, String>> {
        Ok(BTreeMap::new())
    }

    /// Ids of storage an earlier build made ahead and left, once, at
    /// start-up (see `pool_leftovers`).
    fn premade_leftovers(&self) -> Vec<String> {
        Vec::new()
    }

    /// Puts in place the `premade_leftovers` a record owns, as their
    /// create would have (at start-up, before any call). Returns how many
    /// it moved.
    async fn restore_premade(&self, _owned: &[String]) -> CsiResult<usize> {
        Ok(0)
    }

    /// Discards `premade_leftovers` no record owns.
    async fn discard_premade(&self, _orphans: &[String]) -> CsiResult<()> {
        Ok(())
    }

    /// Whether the volume's storage is completely there, as `create_volume`
    /// leaves it (a witness of a finished create whose `Ready` commit a
    /// crash lost). `false` when the backend cannot tell.
    async fn created(&self, _vol: &Volume) -> bool {
        false
    }

    /// Whether the CO can no longer want a volume whose CreateVolume never
    /// finished (the claim it was for is gone), so that it is rolled back
    /// now rather than once it is stale. `false` when the backend cannot
    /// tell.
    async fn abandoned(&self, _vol: &Volume) -> CsiResult<bool> {
        Ok(false)
    }

    /// Why DeleteVolume of `vol` must leave its storage where it is and
    /// only release the volume (its member was declared lost for good);
    /// `None` for a volume whose storage is deleted as usual.
    fn left_behind(&self, _vol: &Volume) -> Option<String> {
        None
    }

    /// Releases the volume's storage. Already absent is success.
    async fn delete_volume(&self, vol: &Volume) -> CsiResult<()>;

    /// Grows the volume's storage to `new_size` bytes. Returns whether the
    /// node must finish it (NodeExpandVolume: a filesystem to grow).
    async fn expand_volume(&self, vol: &Volume, new_size: u64) -> CsiResult<bool>;

    /// Cuts a point-in-time copy of `source` for `snap`. Idempotent.
    async fn create_snapshot(&self, snap: &Snapshot, source: &Volume) -> CsiResult<()>;

    /// Bytes a cut snapshot's data really takes, if the backend can tell.
    async fn snapshot_allocated(&self, _snap: &Snapshot) -> Option<u64> {
        None
    }

    /// Releases a snapshot. Already absent is success.
    async fn delete_snapshot(&self, snap: &Snapshot) -> CsiResult<()>;

    /// Refuses VolumeGroupSnapshotClass parameters this backend does not use
    /// (INVALID_ARGUMENT naming them).
    fn check_group_snapshot_parameters(&self, _params: &GroupSnapshotParams) -> CsiResult<()> {
        Ok(())
    }

    /// Cuts every snapshot of `group` (each with its source volume) at one
    /// instant where the storage can: `GroupCut::Whole` with the snapshots
    /// as cut. `GroupCut::OneByOne`: the caller cuts each with
    /// `create_snapshot`. Refused with FAILED_PRECONDITION where the group
    /// cannot be cut as one and its parameters do not accept one by one.
    /// Idempotent.
    async fn create_group_snapshot(
        &self,
        _group: &GroupSnapshot,
        _members: &[(Snapshot, Volume)],
    ) -> CsiResult<GroupCut> {
        Ok(GroupCut::OneByOne)
    }

    /// Group snapshots (each with its snapshots) the backend's storage
    /// describes, for a controller whose store lacks them.
    async fn recover_groups(&self) -> CsiResult<Vec<(GroupSnapshot, Vec<Snapshot>)>> {
        Ok(Vec::new())
    }

    /// Releases what `create_group_snapshot` made for the group as a whole,
    /// before each of `snaps` is released with `delete_snapshot`. Already
    /// absent is success.
    async fn delete_group_snapshot(
        &self,
        _group: &GroupSnapshot,
        _snaps: &[Snapshot],
    ) -> CsiResult<()> {
        Ok(())
    }

    /// Every piece of data the backend keeps on this machine, for the
    /// housekeeping sweep that reclaims data no record owns.
    async fn stored_data(&self) -> CsiResult<Vec<StoredData>> {
        Ok(Vec::new())
    }

    /// Snapshots the backend's own storage describes (a controller that lost
    /// its store gets them back; RelayVolumes cover volumes only).
    async fn recover_snapshots(&self) -> CsiResult<Vec<crate::domain::volume::Snapshot>> {
        Ok(Vec::new())
    }

    /// The data of the member Secret `reference` (`namespace/name`) in
    /// `member`, which a member volume's own driver needs on the node.
    async fn node_secret(
        &self,
        member: &str,
        reference: &str,
    ) -> CsiResult<std::collections::HashMap<String, String>> {
        Err(CsiError::FailedPrecondition(format!(
            "the member volume's driver needs Secret {reference} of member cluster {member}, and this node plugin has no client for it: run it with --backend member --member {member}=KUBECONFIG (get on secrets is all it needs)"
        )))
    }

    /// Removes one entry `stored_data` listed. Already absent is success.
    async fn remove_data(&self, _data: &StoredData) -> CsiResult<()> {
        Ok(())
    }

    /// Where `vol` must live before `node_id` can use it, when that is no
    /// longer where it is: a volume that moves with its pod (the member
    /// backend's `movableBetween`). None: attach where it is. The new
    /// backing, once its data is copied and verified there; the caller
    /// records it before anything uses it. A move in progress is
    /// UNAVAILABLE, its progress in the message.
    async fn moved_home(&self, _vol: &Volume, _node_id: &str) -> CsiResult<Option<Backing>> {
        Ok(None)
    }

    /// A user asked for the volume's copy in member `to` ahead of a move
    /// (`Some`), kept in sync while its pods still run where it is; `None`:
    /// no longer asked (a copy a publish needs goes on). Called under the
    /// volume's lock.
    async fn pre_copy(&self, vol: &Volume, _to: Option<&str>) -> CsiResult<()> {
        Err(CsiError::FailedPrecondition(format!(
            "volume {}: this backend does not move volumes between members",
            vol.id
        )))
    }

    /// Makes the volume available to `node_id`; returns the publish_context the
    /// node side needs.
    async fn attach(&self, vol: &Volume, node_id: &str) -> CsiResult<BTreeMap<String, String>>;

    /// Every attachment this backend made on its storage's side.
    async fn own_attachments(&self) -> CsiResult<Vec<OwnAttachment>> {
        Ok(Vec::new())
    }

    /// Removes `a` unless something else still uses the volume there;
    /// true when it was removed.
    async fn collect_attachment(&self, _a: &OwnAttachment) -> CsiResult<bool> {
        Ok(false)
    }

    /// Reverses `attach`. Already detached is success.
    async fn detach(&self, vol: &Volume, node_id: &str) -> CsiResult<()>;

    /// The volume's backing health (ControllerGetVolume, ListVolumes, NodeGetVolumeStats).
    async fn health(&self, vol: &Volume) -> Health;

    /// What the node side mounts for this volume.
    fn node_source(&self, vol: &Volume) -> CsiResult<NodeSource>;
}
