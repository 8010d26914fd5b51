//! The persisted records: volumes, their per-node attachment state, snapshots
//! and group snapshots. Plain data; the rules for changing them live in
//! `state.rs`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::domain::capability::Capability;

/// Where a volume's bytes live: on the local backend, or in a member cluster.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Backing {
    /// A directory, bind-mounted for mount access.
    Directory,
    /// A sparse file attached through a loop device: raw block access, or a
    /// filesystem of `fs_type` for mount access.
    BlockFile { fs_type: String },
    /// A PersistentVolumeClaim in a member cluster (the member backend). The
    /// claim's name derives from the volume id, so a retry finds it again.
    Member {
        member: String,
        namespace: String,
        pvc: String,
        /// The member node the request's topology chose, if it named one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        selected_node: Option<String>,
        /// The uid of the claim the relay made there, once made. Marks on a
        /// claim are copied (Kosmos copies labels and annotations): only the
        /// claim of this uid is the volume's. Records made before it was
        /// kept have none, and are judged by the claim's marks alone.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        claim_uid: Option<String>,
    },
}

impl Backing {
    /// Whether the bytes are on this machine (the local backend).
    pub fn is_local(&self) -> bool {
        matches!(self, Backing::Directory | Backing::BlockFile { .. })
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ContentSource {
    Snapshot(String),
    Volume(String),
}

/// Whether the backend work behind a record has finished. A record is
/// committed as `Provisioning` before the backend is asked to do anything, so
/// a crash mid-way leaves a record the next retry resumes instead of an
/// orphaned allocation nobody knows about.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Lifecycle {
    Provisioning,
    Ready,
    Deleting,
}

/// Direction of an in-flight node operation, persisted before the mount work
/// starts so a restart knows what may be half done.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Progress {
    Applying,
    Done,
    Removing,
}

impl Progress {
    fn done() -> Progress {
        Progress::Done
    }

    fn is_done(&self) -> bool {
        *self == Progress::Done
    }
}

/// ControllerPublishVolume's record: NODE_READY on that node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Attachment {
    pub readonly: bool,
    pub capability: Capability,
    #[serde(default)]
    pub publish_context: BTreeMap<String, String>,
    /// `Applying` from the recorded intent until the backend's attach has
    /// answered: a call in flight, refused or cut short has not reached
    /// NODE_READY. Records written before this field are done.
    #[serde(default = "Progress::done", skip_serializing_if = "Progress::is_done")]
    pub progress: Progress,
}

/// NodeStageVolume's record: VOL_READY on that node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Stage {
    pub path: String,
    pub capability: Capability,
    /// The loop device backing a block-file volume while staged.
    pub device: Option<String>,
    pub progress: Progress,
}

/// NodePublishVolume's record for one target path: PUBLISHED on that node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Publication {
    pub readonly: bool,
    pub capability: Capability,
    pub progress: Progress,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeRecord {
    pub attachment: Option<Attachment>,
    pub stage: Option<Stage>,
    pub targets: BTreeMap<String, Publication>,
}

impl NodeRecord {
    pub fn is_empty(&self) -> bool {
        self.attachment.is_none() && self.stage.is_none() && self.targets.is_empty()
    }

    /// The furthest lifecycle state this node has reached: an intent still
    /// applying (in flight, refused or cut short) is not a state reached;
    /// one being removed still is, until its removal is done.
    pub fn phase(&self) -> Phase {
        let reached = |p: Progress| p != Progress::Applying;
        if self.targets.values().any(|t| reached(t.progress)) {
            Phase::Published
        } else if self.stage.as_ref().is_some_and(|s| reached(s.progress)) {
            Phase::VolReady
        } else if self
            .attachment
            .as_ref()
            .is_some_and(|a| reached(a.progress))
        {
            Phase::NodeReady
        } else {
            Phase::Created
        }
    }

    /// The furthest state an intent of this node is on its way to, when it
    /// is beyond the state reached.
    pub fn pending(&self) -> Option<Phase> {
        let applying = |p: Progress| p == Progress::Applying;
        let wanted = if self.targets.values().any(|t| applying(t.progress)) {
            Phase::Published
        } else if self.stage.as_ref().is_some_and(|s| applying(s.progress)) {
            Phase::VolReady
        } else if self
            .attachment
            .as_ref()
            .is_some_and(|a| applying(a.progress))
        {
            Phase::NodeReady
        } else {
            return None;
        };
        (wanted > self.phase()).then_some(wanted)
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    #[serde(rename = "CREATED")]
    Created,
    #[serde(rename = "NODE_READY")]
    NodeReady,
    #[serde(rename = "VOL_READY")]
    VolReady,
    #[serde(rename = "PUBLISHED")]
    Published,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Created => "CREATED",
            Phase::NodeReady => "NODE_READY",
            Phase::VolReady => "VOL_READY",
            Phase::Published => "PUBLISHED",
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Volume {
    pub id: String,
    pub name: String,
    pub capacity_bytes: u64,
    pub backing: Backing,
    pub capabilities: Vec<Capability>,
    pub parameters: BTreeMap<String, String>,
    pub mutable_parameters: BTreeMap<String, String>,
    pub source: Option<ContentSource>,
    pub topology: Vec<BTreeMap<String, String>>,
    pub context: BTreeMap<String, String>,
    pub created_unix: i64,
    pub lifecycle: Lifecycle,
    /// Inline ephemeral volumes live and die with one NodePublish.
    #[serde(default)]
    pub ephemeral: bool,
    pub nodes: BTreeMap<String, NodeRecord>,
}

impl Volume {
    pub fn node(&self, node_id: &str) -> Option<&NodeRecord> {
        self.nodes.get(node_id)
    }

    /// Whether ControllerPublish is recorded on `node`.
    pub fn attached_to(&self, node: &str) -> bool {
        self.nodes.get(node).is_some_and(|n| n.attachment.is_some())
    }

    pub fn attached_nodes(&self) -> impl Iterator<Item = &str> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.attachment.is_some())
            .map(|(id, _)| id.as_str())
    }

    /// The volume-wide phase: the furthest any node has reached.
    pub fn phase(&self) -> Phase {
        self.nodes
            .values()
            .map(NodeRecord::phase)
            .max()
            .unwrap_or(Phase::Created)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub id: String,
    pub name: String,
    pub source_volume_id: String,
    pub size_bytes: u64,
    pub backing: Backing,
    pub created_unix: i64,
    pub created_nanos: i32,
    pub lifecycle: Lifecycle,
    pub parameters: BTreeMap<String, String>,
    pub group_snapshot_id: Option<String>,
    /// Bytes the snapshot's data really takes (a sparse or shared copy
    /// takes far less than `size_bytes`), when the backend knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    /// The member VolumeSnapshot, where the member named it: one of a
    /// member VolumeGroupSnapshot (its snapshot-controller makes them).
    /// None: `naming::snapshot_name` of the id, made by the relay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_snapshot: Option<String>,
}

impl Snapshot {
    /// What the snapshot counts against the backend's capacity.
    pub fn charged_bytes(&self) -> u64 {
        self.allocated_bytes.unwrap_or(self.size_bytes)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct GroupSnapshot {
    pub id: String,
    pub name: String,
    pub source_volume_ids: Vec<String>,
    pub snapshot_ids: Vec<String>,
    pub created_unix: i64,
    pub created_nanos: i32,
    pub lifecycle: Lifecycle,
    pub parameters: BTreeMap<String, String>,
}

/// A ready directory volume of 100 bytes, for tests.
#[cfg(test)]
pub fn sample(id: &str, name: &str) -> Volume {
    Volume {
        id: id.into(),
        name: name.into(),
        capacity_bytes: 100,
        backing: Backing::Directory,
        capabilities: vec![],
        parameters: BTreeMap::new(),
        mutable_parameters: BTreeMap::new(),
        source: None,
        topology: vec![],
        context: BTreeMap::new(),
        created_unix: 0,
        lifecycle: Lifecycle::Ready,
        ephemeral: false,
        nodes: BTreeMap::new(),
    }
}

/// `v` attached (ControllerPublished) to `node`, for tests.
#[cfg(test)]
pub fn with_attachment(mut v: Volume, node: &str) -> Volume {
    use crate::domain::capability::{AccessMode, AccessType};
    v.nodes.insert(
        node.into(),
        NodeRecord {
            attachment: Some(Attachment {
                readonly: false,
                capability: Capability {
                    mode: AccessMode::SingleNodeWriter,
                    access: AccessType::Block,
                },
                publish_context: BTreeMap::new(),
                progress: Progress::Done,
            }),
            ..Default::default()
        },
    );
    v
}
