//! `RelayVolume`: every volume's state, visible in the host cluster
//! (`kubectl get relayvolumes`), and what a controller that lost its store
//! rebuilds it from.
//!
//! The object is server-side applied, with one field manager per writer so
//! their fields never clobber each other: the controller (`csi-relay`) owns
//! the spec, the overall phase and each node's attachment; the node plugin
//! on node N (`csi-relay-node-N`) owns N's entry's phase, staging path and
//! targets. `status.nodes` is a list-map keyed by `node`, so applies of
//! different writers merge per node.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::domain::error::{CsiError, CsiResult};
use crate::domain::member_source;
use crate::domain::observers::VolumeObserver;
use crate::domain::settings::Mode;
use crate::domain::volume::{Backing, Lifecycle, NodeRecord, Phase, Progress, Volume};
use crate::k8s::cluster::Cluster;
use crate::k8s::naming::{self, MemberVolume};
use crate::k8s::FIELD_MANAGER;
use crate::rt::unpoisoned::lock;
use crate::store::Store;

pub const GROUP: &str = "relay.csi.dev";
pub const VERSION: &str = "v1alpha1";
/// Observer calls are on the RPC path: a slow host API costs at most this.
/// The phase of a volume deleted without its storage (`release`).
pub const RELEASED: &str = "RELEASED";
pub const OBSERVER_TIMEOUT: Duration = Duration::from_secs(5);

/// The record is one JSON string, not an object: server-side apply merges
/// objects field by field, and a map the controller empties (an
/// attachment's publish_context, dropped at rebuild) came back as `null`,
/// which made the record unreadable and the volume lost at the next
/// rebuild. A string is applied whole.
fn record_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    // Objects written by earlier versions are read too.
    Ok(match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    })
}

/// Where a volume lives and what it is.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "relay.csi.dev",
    version = "v1alpha1",
    kind = "RelayVolume",
    plural = "relayvolumes",
    shortname = "rv",
    status = "RelayVolumeStatus",
    doc = "A csi-relay volume: where it lives and how far each node has got with it",
    printcolumn = r#"{"name": "PHASE", "type": "string", "jsonPath": ".status.phase"}"#,
    printcolumn = r#"{"name": "MEMBER", "type": "string", "jsonPath": ".spec.member"}"#,
    printcolumn = r#"{"name": "MEMBER-PVC", "type": "string", "jsonPath": ".spec.memberPvc"}"#,
    printcolumn = r#"{"name": "IMPORTS", "type": "string", "jsonPath": ".status.imports[*].member"}"#,
    printcolumn = r#"{"name": "MOVE", "type": "string", "jsonPath": ".status.move.phase", "priority": 1}"#,
    printcolumn = r#"{"name": "NODES", "type": "string", "jsonPath": ".status.nodeSummary"}"#,
    printcolumn = r#"{"name": "AGE", "type": "date", "jsonPath": ".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name": "LAST-ERROR", "type": "string", "jsonPath": ".status.lastError"}"#,
    // The API server's half of one writer at a time: a write from a
    // deposed leader (sent before its fence closed, held by the network or
    // a frozen node, delivered late) is refused once a newer leader has
    // written the volume. See `rt::fence`.
    validation = Rule::new("!has(self.spec.leaderTerm) || !has(oldSelf.spec.leaderTerm) || self.spec.leaderTerm >= oldSelf.spec.leaderTerm")
        .message("spec.leaderTerm may not go back: this write comes from a csi-relay controller that no longer leads (a newer leader has written this volume since)")
)]
#[serde(rename_all = "camelCase")]
pub struct RelayVolumeSpec {
    /// The CSI volume id.
    pub volume_id: String,
    /// The CSI volume name (the host PV's name).
    pub volume_name: String,
    pub capacity_bytes: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// namespace/name of the member PVC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_pvc: Option<String>,
    /// namespace/name of the host PVC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_pvc: Option<String>,
    /// The controller's record of the volume (JSON), to rebuild its store from.
    #[serde(deserialize_with = "record_text")]
    pub record: String,
    /// The format of this object: a controller refuses to start on one
    /// newer than it reads. 1 when absent (written before the field existed).
    #[serde(default = "first_format")]
    pub format_version: u32,
    /// The leader term (the leader Lease's transitions when the writing
    /// controller took it) of the last write; absent without
    /// `--leader-election`. Never goes back (the CRD's rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_term: Option<i64>,
}

/// The RelayVolume format this build writes. Raise it with any change of
/// `spec` (the record's JSON included) an older build would misread: a
/// controller that finds a newer one refuses to start before it writes.
pub const FORMAT: u32 = 1;

fn first_format() -> u32 {
    1
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelayVolumeStatus {
    /// PROVISIONING, CREATED, NODE_READY, VOL_READY, PUBLISHED or DELETING;
    /// RELEASED once deleted without its storage (`released` says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// What a volume deleted while its member was declared lost left in
    /// that member. The object stays as that record until an operator
    /// deletes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<String>,
    /// node=PHASE for every node the controller knows about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_summary: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["node"]))]
    pub nodes: Option<Vec<RelayNodeStatus>>,
    /// The members a shared volume (`sharedWith`) is imported into, other
    /// than `spec.member`, which made it; written by the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["member"]))]
    pub imports: Option<Vec<RelayImportStatus>>,
    /// The volume's move between members (`movableBetween`): the one in
    /// progress, else the last one; written by the controller's mover
    /// (`k8s::relay_move`).
    #[serde(default, rename = "move", skip_serializing_if = "Option::is_none")]
    pub moving: Option<RelayMoveStatus>,
    /// Why the last call on the volume failed (`<call>: <CSI code>: <message>`),
    /// while it has not moved on since; written by the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When that call failed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error_time: Option<String>,
    /// The leader term of the controller's last status write (every
    /// controller writer of the status sends it; node plugins do not lead
    /// and leave it alone). Never goes back: the CRD's rule refuses a
    /// deposed leader's late status write, as `spec.leaderTerm` does its
    /// spec write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self >= oldSelf",
        "message": "status.leaderTerm may not go back: this status write comes from a csi-relay controller that no longer leads (a newer leader has written this volume's status since)"
    }]))]
    pub leader_term: Option<i64>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelayMoveStatus {
    /// The member the data comes from.
    pub from: String,
    /// The member it goes to.
    pub to: String,
    /// Preparing, StartingMovers, Copying, Syncing (the source may still
    /// change: passes repeat), Verified (a pass may serve), Retrying,
    /// Moved (the volume's home is now `to`), or Stopped (a pod of it runs
    /// in `from` again: the volume stayed there).
    pub phase: String,
    /// Passes made.
    pub passes: u32,
    /// Bytes the source holds.
    pub total_bytes: u64,
    /// Bytes the last pass sent (before compression).
    pub sent_bytes: u64,
    /// When the last pass ended (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync: Option<String>,
    /// Seconds from the move's start to the switch (phase Moved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub move_seconds: Option<f64>,
    /// What the move waits for, or its last error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelayImportStatus {
    /// The member cluster that holds the import (its PV and claim).
    pub member: String,
    /// IMPORTED: made, for the host nodes named; IMPORTING: being made;
    /// RELEASING: every one of them is being unpublished, and the import
    /// goes once no pod there uses it.
    pub state: String,
    /// The host nodes that use the volume in that member.
    pub nodes: Vec<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelayNodeStatus {
    /// A host node, or `<member>/<member node>` for what the member
    /// cluster reports (pods that run there).
    pub node: String,
    /// The member cluster, for member-node entries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// namespace/name of the member pods using the volume on that node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<Vec<String>>,
    /// ControllerPublishVolume done (NODE_READY), written by the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
    /// NODE_READY, VOL_READY or PUBLISHED, written by the node plugin:
    /// the furthest state reached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The state a call is on its way to beyond `phase`: in flight, or
    /// refused (the volume's lastError says why) until it is retried or
    /// undone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<Vec<String>>,
}

/// The CRD as YAML, for deploy/.
pub fn crd_yaml() -> Result<String, String> {
    serde_saphyr::to_string(&RelayVolume::crd()).map_err(|e| format!("render CRD: {e}"))
}

/// The object name of a volume: its id when that is a valid name.
pub fn object_name(volume_id: &str) -> String {
    if naming::is_dns_subdomain(volume_id) {
        volume_id.to_string()
    } else {
        format!("v-{:016x}", naming::fnv64(volume_id))
    }
}

/// The record as the controller rebuilds it: attachments only, no node-side
/// mount state.
fn controller_record(vol: &Volume) -> Volume {
    let mut record = vol.clone();
    record.nodes = vol
        .nodes
        .iter()
        .filter(|(_, n)| n.attachment.is_some())
        .map(|(id, n)| {
            (
                id.clone(),
                NodeRecord {
                    attachment: n.attachment.clone(),
                    stage: None,
                    targets: BTreeMap::new(),
                },
            )
        })
        .collect();
    record
}

fn overall_phase(vol: &Volume) -> String {
    match vol.lifecycle {
        Lifecycle::Provisioning => "PROVISIONING".into(),
        Lifecycle::Deleting => "DELETING".into(),
        Lifecycle::Ready => vol.phase().as_str().into(),
    }
}

fn node_state(node: &str, n: &NodeRecord) -> RelayNodeStatus {
    RelayNodeStatus {
        node: node.to_string(),
        phase: Some(n.phase().as_str().to_string()),
        pending: n.pending().map(|p| p.as_str().to_string()),
        staging_path: n.stage.as_ref().map(|s| s.path.clone()),
        targets: Some(n.targets.keys().cloned().collect()),
        ..Default::default()
    }
}

pub fn spec_of(vol: &Volume) -> CsiResult<RelayVolumeSpec> {
    let (member, member_pvc) = match &vol.backing {
        Backing::Member { .. } => {
            let m = MemberVolume::of(vol)?;
            (Some(m.member.clone()), Some(m.pvc_path()))
        }
        _ => (None, None),
    };
    let host_pvc = match (
        vol.parameters.get("csi.storage.k8s.io/pvc/namespace"),
        vol.parameters.get("csi.storage.k8s.io/pvc/name"),
    ) {
        (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
        _ => None,
    };
    Ok(RelayVolumeSpec {
        volume_id: vol.id.clone(),
        volume_name: vol.name.clone(),
        capacity_bytes: vol.capacity_bytes.min(i64::MAX as u64) as i64,
        member,
        member_pvc,
        host_pvc,
        record: serde_json::to_string(&controller_record(vol))
            .map_err(|e| CsiError::Internal(format!("encode volume record: {e}")))?,
        format_version: FORMAT,
        leader_term: crate::rt::fence::fence().term(),
    })
}

/// Who writes: the controller (with node state too when it also serves the
/// node service, standalone), or the node plugin of one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    Controller { with_node_state: bool },
    Node { node_id: String },
}

impl Role {
    pub fn for_mode(mode: Mode, node_id: &str) -> Self {
        match mode {
            Mode::All => Role::Controller {
                with_node_state: true,
            },
            Mode::Controller => Role::Controller {
                with_node_state: false,
            },
            Mode::Node => Role::Node {
                node_id: node_id.to_string(),
            },
        }
    }

    pub fn field_manager(&self) -> String {
        match self {
            Role::Controller { .. } => FIELD_MANAGER.to_string(),
            Role::Node { node_id } => {
                let m = format!("{FIELD_MANAGER}-node-{node_id}");
                // The API server allows at most 128 characters.
                if m.len() <= 128 {
                    m
                } else {
                    format!("{FIELD_MANAGER}-node-{:016x}", naming::fnv64(node_id))
                }
            }
        }
    }
}

fn parse_phase(s: &str) -> Option<Phase> {
    [
        Phase::Created,
        Phase::NodeReady,
        Phase::VolReady,
        Phase::Published,
    ]
    .into_iter()
    .find(|p| p.as_str() == s)
}

/// How far one `status.nodes` entry (of any writer) has got.
fn entry_phase(e: &RelayNodeStatus) -> Option<Phase> {
    e.phase
        .as_deref()
        .and_then(parse_phase)
        .or((e.attached == Some(true)).then_some(Phase::NodeReady))
}

/// The overall phase and node summary of `vol`: the furthest state of any
/// node, from the controller's own record and from every entry the object
/// holds (node plugins' and the member clusters' alike).
pub fn summary(vol: &Volume, seen: Option<&RelayVolumeStatus>) -> (String, String) {
    // Per node: the state reached, and the furthest one a call is on its
    // way to (shown only beyond the state reached).
    let mut phases: BTreeMap<String, (Phase, Option<Phase>)> = vol
        .nodes
        .iter()
        .filter(|(_, n)| !n.is_empty())
        .map(|(id, n)| (id.clone(), (n.phase(), n.pending())))
        .collect();
    for e in seen.and_then(|s| s.nodes.as_ref()).into_iter().flatten() {
        let pending = e.pending.as_deref().and_then(parse_phase);
        if let Some(p) = entry_phase(e) {
            let slot = phases.entry(e.node.clone()).or_insert((p, None));
            slot.0 = slot.0.max(p);
            slot.1 = slot.1.max(pending);
        } else if pending.is_some() {
            let slot = phases
                .entry(e.node.clone())
                .or_insert((Phase::Created, None));
            slot.1 = slot.1.max(pending);
        }
    }
    let phase = match vol.lifecycle {
        Lifecycle::Ready => phases
            .values()
            .map(|(p, _)| *p)
            .fold(vol.phase(), Phase::max)
            .as_str()
            .to_string(),
        _ => overall_phase(vol),
    };
    let nodes = phases
        .iter()
        .map(|(id, (p, pending))| match pending.filter(|w| w > p) {
            Some(w) => format!("{id}={}({} pending)", p.as_str(), w.as_str()),
            None => format!("{id}={}", p.as_str()),
        })
        .collect::<Vec<_>>()
        .join(",");
    (phase, nodes)
}

/// The imports of a shared volume, from its attachments: each names the
/// member its node uses the volume in (`publish_context`), recorded once
/// ControllerPublishVolume made the import there. None when there is none.
fn imports_of(vol: &Volume) -> Option<Vec<RelayImportStatus>> {
    let Backing::Member { member: origin, .. } = &vol.backing else {
        return None;
    };
    // The furthest a node of that member got: Applying < Removing < Done.
    let rank = |p: Progress| match p {
        Progress::Removing => 0,
        Progress::Applying => 1,
        Progress::Done => 2,
    };
    let mut by_member: BTreeMap<&str, (u8, Vec<String>)> = BTreeMap::new();
    for (node, record) in &vol.nodes {
        let Some(a) = &record.attachment else {
            continue;
        };
        let Some(member) = a.publish_context.get(member_source::MEMBER) else {
            continue;
        };
        if member == origin {
            continue;
        }
        let entry = by_member.entry(member).or_default();
        entry.0 = entry.0.max(rank(a.progress));
        entry.1.push(node.clone());
    }
    let imports: Vec<RelayImportStatus> = by_member
        .into_iter()
        .map(|(member, (furthest, nodes))| RelayImportStatus {
            member: member.to_string(),
            state: ["RELEASING", "IMPORTING", "IMPORTED"][usize::from(furthest)].to_string(),
            nodes,
        })
        .collect();
    (!imports.is_empty()).then_some(imports)
}

/// The status this writer owns for `vol`; `seen` is the object as last
/// watched (the controller folds every writer's entries into its phase).
pub fn status_of(vol: &Volume, role: &Role, seen: Option<&RelayVolumeStatus>) -> RelayVolumeStatus {
    match role {
        Role::Controller { with_node_state } => {
            let nodes = vol
                .nodes
                .iter()
                .filter(|(_, n)| !n.is_empty())
                .map(|(id, n)| {
                    let mut s = if *with_node_state {
                        node_state(id, n)
                    } else {
                        RelayNodeStatus {
                            node: id.clone(),
                            ..Default::default()
                        }
                    };
                    s.attached = Some(n.phase() >= Phase::NodeReady);
                    if !*with_node_state {
                        s.pending = n.pending().map(|p| p.as_str().to_string());
                    }
                    s.readonly = n.attachment.as_ref().map(|a| a.readonly);
                    s
                })
                .collect::<Vec<_>>();
            let (phase, summary) = summary(vol, seen);
            RelayVolumeStatus {
                phase: Some(phase),
                node_summary: Some(summary),
                nodes: Some(nodes),
                imports: imports_of(vol),
                ..Default::default()
            }
        }
        Role::Node { node_id } => RelayVolumeStatus {
            phase: None,
            node_summary: None,
            nodes: Some(
                vol.node(node_id)
                    .filter(|n| !n.is_empty())
                    .map(|n| node_state(node_id, n))
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        },
    }
}

fn encode<T: Serialize>(value: &T) -> CsiResult<serde_json::Value> {
    serde_json::to_value(value).map_err(|e| CsiError::Internal(format!("encode RelayVolume: {e}")))
}

/// A server-side apply body setting `field` of RelayVolume `name`.
pub fn apply_body(name: &str, field: &str, value: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "RelayVolume",
        "metadata": {"name": name},
        field: value,
    })
}

/// A server-side apply body of a controller's status write: `status` with
/// the leader term this process writes under, so that the API server
/// refuses it once a newer leader has written the volume's status
/// (`RelayVolumeStatus::leader_term`). Every controller writer of the
/// status goes through here; `term` is the fence's.
pub fn controller_status_body(
    name: &str,
    mut status: serde_json::Value,
    term: Option<i64>,
) -> serde_json::Value {
    if let (Some(term), Some(fields)) = (term, status.as_object_mut()) {
        fields.insert("leaderTerm".into(), term.into());
    }
    apply_body(name, "status", status)
}

/// LAST-ERROR's text for what member `member` says of claim
/// `namespace/name` it does not provision.
pub fn member_word(member: &str, namespace: &str, name: &str, said: &str) -> String {
    format!("member {member}: PersistentVolumeClaim {namespace}/{name} is not provisioned: {said}")
}

/// Whether a LAST-ERROR text is a member's word (`member_word`), not a
/// call's failure (`<call>: <code>: <message>`).
pub fn is_member_word(text: &str) -> bool {
    text.strip_prefix("member ")
        .and_then(|rest| rest.split_once(": PersistentVolumeClaim "))
        .is_some_and(|(_, claim)| claim.contains(" is not provisioned: "))
}

/// Sets (`Some`) or clears (`None`) `status.lastError` of volume `id`'s
/// object. Its own field manager owns the two fields, so the writers of the
/// rest never drop them, and applying none removes them; the controller's
/// calls and what the members say of their claims share it (the newest
/// word is shown). A missing object is left missing.
pub async fn apply_last_error(host: &Cluster, id: &str, failure: Option<&str>) -> CsiResult<()> {
    let name = object_name(id);
    let params = PatchParams::apply(&format!("{FIELD_MANAGER}-errors")).force();
    let status = match failure {
        Some(text) => serde_json::json!({
            "lastError": text,
            "lastErrorTime": k8s_openapi::jiff::Timestamp::now().to_string(),
        }),
        None => serde_json::json!({}),
    };
    let body = controller_status_body(&name, status, crate::rt::fence::fence().term());
    // The answer is not read: parsed untyped, an object this build could
    // not read whole still counts as written.
    let api = Api::<kube::api::DynamicObject>::all_with(
        host.client(),
        &kube::api::ApiResource::erase::<RelayVolume>(&()),
    );
    host.fetch(
        &format!("apply RelayVolume {name} status.lastError"),
        api.patch_status(&name, &params, &Patch::Apply(&body)),
    )
    .await?;
    Ok(())
}

/// The highest leader term any RelayVolume records (spec or status);
/// `None` when none records one or the CRD is not installed. A leader
/// Lease made anew (the first install, or after its namespace was deleted:
/// `helm uninstall` keeps the CRD and the RelayVolumes) starts its count
/// above it: the CRD's rules refuse a term that goes back, and a new
/// Lease's count starts again at 1.
pub async fn highest_term(host: &Cluster) -> Result<Option<i64>, crate::k8s::error::KubeError> {
    let api = Api::<RelayVolume>::all(host.client());
    let mut highest: Option<i64> = None;
    host.list_pages(
        "list RelayVolumes for their leader terms",
        &api,
        ListParams::default(),
        |items: Vec<RelayVolume>| {
            for rv in &items {
                let status = rv.status.as_ref().and_then(|s| s.leader_term);
                highest = highest.max(rv.spec.leader_term).max(status);
            }
            Ok::<(), crate::k8s::error::KubeError>(())
        },
    )
    .await?;
    Ok(highest)
}

/// Mirrors volume records into RelayVolumes in the host cluster.
#[derive(Clone)]
pub struct RelayVolumeObserver {
    host: Cluster,
    role: Role,
    /// The RelayVolumes as watched (controller): every writer's entries.
    view: Option<View>,
    /// The phase and node summary the controller last sent, by object
    /// name: the watch events of its own earlier writes, which arrive
    /// after it moved on, are then not taken for a summary that lags
    /// (`relay_summary`; each was a status patch more per volume). Set
    /// before a write goes, so one in flight counts; dropped when it fails.
    sent: Arc<Mutex<HashMap<String, (String, String)>>>,
}

impl RelayVolumeObserver {
    pub fn new(host: Cluster, role: Role) -> Self {
        RelayVolumeObserver {
            host: host.with_timeout(OBSERVER_TIMEOUT),
            role,
            view: None,
            sent: Arc::default(),
        }
    }

    /// Folds the watched objects' entries into the phase it writes.
    pub fn with_view(mut self, view: View) -> Self {
        self.view = Some(view);
        self
    }

    fn seen(&self, name: &str) -> Option<RelayVolumeStatus> {
        self.watched(name)?.status.clone()
    }

    /// Object `name` as last watched.
    pub fn watched(&self, name: &str) -> Option<Arc<Seen>> {
        self.view.as_ref()?.get(&view_key(name))
    }

    /// Whether the last phase and node summary sent for volume `id`'s
    /// object (landed, or still on its way) are these.
    pub fn has_sent(&self, id: &str, phase: &str, nodes: &str) -> bool {
        lock(&self.sent)
            .get(&object_name(id))
            .is_some_and(|(p, n)| p == phase && n == nodes)
    }

    fn api(&self) -> Api<RelayVolume> {
        Api::all(self.host.client())
    }

    /// Applies this writer's view of `vol`. `Ok(false)`: a node's entry
    /// found no object yet (the controller's first apply is on its way).
    pub async fn apply(&self, vol: &Volume) -> CsiResult<bool> {
        let name = object_name(&vol.id);
        let params = PatchParams::apply(&self.role.field_manager()).force();
        if let Role::Controller { .. } = self.role {
            let mut body = apply_body(&name, "spec", encode(&spec_of(vol)?)?);
            body["metadata"]["labels"] = serde_json::json!({naming::MANAGED_BY: naming::MANAGER});
            self.host
                .run(
                    &format!("apply RelayVolume {name}"),
                    self.api().patch(&name, &params, &Patch::Apply(&body)),
                )
                .await?;
        }
        let landed = self.apply_status(vol).await?;
        match self.role {
            Role::Controller { .. } if !landed => Err(CsiError::Unavailable(format!(
                "{}: RelayVolume {name} was deleted while it was written",
                self.host.label()
            ))),
            // A node may get ahead of the controller's first apply.
            _ => Ok(landed),
        }
    }

    /// Applies this writer's status of `vol` only. A status apply never
    /// creates the object: `Ok(false)` when it does not exist.
    pub async fn apply_status(&self, vol: &Volume) -> CsiResult<bool> {
        self.apply_status_onto(vol, None).await
    }

    /// `apply_status`, onto the object at `resource_version` only (the
    /// API server answers 409 when it changed since): for a writer whose
    /// view of `vol` may be older than the object, such as one kept as the
    /// record of a released volume.
    pub async fn apply_status_onto(
        &self,
        vol: &Volume,
        resource_version: Option<&str>,
    ) -> CsiResult<bool> {
        let name = object_name(&vol.id);
        let params = PatchParams::apply(&self.role.field_manager()).force();
        let seen = self.seen(&name);
        let status = status_of(vol, &self.role, seen.as_ref());
        let mut body = match self.role {
            Role::Controller { .. } => {
                controller_status_body(&name, encode(&status)?, crate::rt::fence::fence().term())
            }
            Role::Node { .. } => apply_body(&name, "status", encode(&status)?),
        };
        if let Some(version) = resource_version {
            body["metadata"]["resourceVersion"] = version.into();
        }
        let summary = match (&status.phase, &status.node_summary) {
            (Some(phase), Some(nodes)) => {
                let summary = (phase.clone(), nodes.clone());
                lock(&self.sent).insert(name.clone(), summary.clone());
                Some(summary)
            }
            _ => None,
        };
        let api = self.api();
        let patch = Patch::Apply(&body);
        let applied = self
            .host
            .fetch(
                &format!("apply RelayVolume {name} status"),
                api.patch_status(&name, &params, &patch),
            )
            .await;
        if !matches!(applied, Ok(Some(_))) {
            // Not on the object: forgotten, unless a later write replaced it.
            let mut sent = lock(&self.sent);
            if summary.is_some() && sent.get(&name) == summary.as_ref() {
                sent.remove(&name);
            }
        }
        Ok(applied?.is_some())
    }

    /// Whether the watched object shows a call's failure
    /// (`status.lastError`). A member's word on its claim is not one: it
    /// goes when the member claim binds or goes (`member_problems`), not
    /// when a call on the volume succeeds. (CreateVolume's success, applied
    /// after the member's first warning on a claim it provisions at once,
    /// wiped that word, and the member's repeats were taken as shown.)
    pub fn shows_failure(&self, id: &str) -> bool {
        self.seen(&object_name(id))
            .and_then(|s| s.last_error)
            .is_some_and(|e| !is_member_word(&e))
    }

    /// Whether the watched object shows a member's word on its claim.
    pub fn shows_member_word(&self, id: &str) -> bool {
        self.seen(&object_name(id))
            .and_then(|s| s.last_error)
            .is_some_and(|e| is_member_word(&e))
    }

    /// See [`apply_last_error`].
    pub async fn apply_failure(&self, id: &str, failure: Option<&str>) -> CsiResult<()> {
        apply_last_error(&self.host, id, failure).await
    }

    /// Keeps `vol`'s object as the record of a volume deleted without its
    /// storage: phase RELEASED, `left` in `status.released`, and the label
    /// that names the member it was left in. The controller never writes
    /// it again, and start-up never restores a record from it.
    pub async fn release(&self, vol: &Volume, left: &str) -> CsiResult<()> {
        let name = object_name(&vol.id);
        let params = PatchParams::apply(&format!("{FIELD_MANAGER}-release")).force();
        let status = controller_status_body(
            &name,
            serde_json::json!({"phase": RELEASED, "released": left}),
            crate::rt::fence::fence().term(),
        );
        let shown = self
            .host
            .fetch(
                &format!("apply RelayVolume {name} status.released"),
                self.api()
                    .patch_status(&name, &params, &Patch::Apply(&status)),
            )
            .await?;
        // Never written by the controller again: nothing to remember.
        lock(&self.sent).remove(&name);
        if shown.is_none() {
            // Already deleted by hand: nothing is left to keep.
            return Ok(());
        }
        let member = match &vol.backing {
            Backing::Member { member, .. } => member.clone(),
            _ => String::new(),
        };
        let label = serde_json::json!({
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "kind": "RelayVolume",
            "metadata": {"name": name, "labels": {naming::RELEASED_FROM_LABEL: member}},
        });
        self.host
            .fetch(
                &format!("label RelayVolume {name} released"),
                self.api().patch(&name, &params, &Patch::Apply(&label)),
            )
            .await?;
        Ok(())
    }

    /// Removes `vol`'s object (controller) or this node's entry (node).
    pub async fn remove(&self, vol: &Volume) -> CsiResult<()> {
        self.remove_id(&vol.id).await
    }

    /// `remove` of volume `id`.
    pub async fn remove_id(&self, id: &str) -> CsiResult<()> {
        let name = object_name(id);
        match &self.role {
            Role::Controller { .. } => {
                self.host
                    .remove(
                        &format!("delete RelayVolume {name}"),
                        self.api().delete(&name, &DeleteParams::default()),
                    )
                    .await?;
                lock(&self.sent).remove(&name);
            }
            Role::Node { .. } => {
                let params = PatchParams::apply(&self.role.field_manager()).force();
                let body = apply_body(&name, "status", serde_json::json!({"nodes": []}));
                self.host
                    .fetch(
                        &format!("apply RelayVolume {name} status"),
                        self.api()
                            .patch_status(&name, &params, &Patch::Apply(&body)),
                    )
                    .await?;
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl VolumeObserver for RelayVolumeObserver {
    async fn changed(&self, vol: &Volume) -> bool {
        if vol.ephemeral {
            return true;
        }
        match self.apply(vol).await {
            Ok(landed) => landed,
            Err(e) => {
                tracing::warn!(volume_id = %vol.id, error = %e, "RelayVolume not updated; will retry");
                false
            }
        }
    }

    async fn removed(&self, vol: &Volume) -> bool {
        if vol.ephemeral {
            return true;
        }
        match self.remove(vol).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(volume_id = %vol.id, error = %e, "RelayVolume not removed; will retry");
                false
            }
        }
    }
}

/// What start-up made of the host cluster's RelayVolumes.
#[derive(Debug)]
pub struct Rebuilt {
    /// Records the store lacked, restored from their RelayVolume.
    pub restored: usize,
    /// Member volumes whose RelayVolume is not the store's record: missing,
    /// or holding another state (a controller stopped between the store's
    /// write and the RelayVolume's).
    pub lagging: Vec<String>,
}

/// Restores the volume records the store lacks from the host cluster's
/// RelayVolumes (a controller whose state directory was lost), and finds
/// the ones that lag the store, from one listing.
pub async fn rebuild(host: &Cluster, store: &Store) -> CsiResult<Rebuilt> {
    // By pages, keeping only the records.
    let api = Api::<RelayVolume>::all(host.client());
    let mut records: Vec<(String, String)> = Vec::new();
    let served = host
        .list_pages(
            "list RelayVolumes",
            &api,
            ListParams::default(),
            |items: Vec<RelayVolume>| {
                // Before anything is restored or written: objects of a newer
                // build (a rollback) are refused whole, not half-read.
                if let Some(newer) = items.iter().find(|rv| rv.spec.format_version > FORMAT) {
                    return Err(CsiError::FailedPrecondition(format!(
                        "RelayVolume {} is of format {}, newer than the format {FORMAT} this build of csi-relay reads (written by a newer csi-relay): run that version (or newer); this build changed nothing",
                        newer.metadata.name.as_deref().unwrap_or_default(),
                        newer.spec.format_version
                    )));
                }
                // A released volume's object is kept for the operator: no
                // volume to restore.
                records.extend(
                    items
                        .into_iter()
                        .filter(|rv| !is_released(rv))
                        .map(|rv| (rv.spec.volume_id, rv.spec.record)),
                );
                Ok(())
            },
        )
        .await?;
    if served.is_none() {
        return Err(CsiError::FailedPrecondition(format!(
            "{}: the RelayVolume API ({GROUP}/{VERSION}) is not served; install its CRD: csi-relay crd | kubectl apply -f -",
            host.label()
        )));
    }
    let mut restored = 0;
    let mut mirrored = std::collections::HashMap::with_capacity(records.len());
    for (listed, record) in records {
        let vol: Volume = match serde_json::from_str(&record) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(volume_id = %listed, error = %e, "RelayVolume record unreadable; skipped");
                continue;
            }
        };
        mirrored.insert(listed.clone(), record);
        let vol = match untrusted(vol) {
            Ok(v) => v,
            Err(why) => {
                tracing::warn!(volume_id = %listed, reason = %why, "RelayVolume record refused; skipped");
                continue;
            }
        };
        let id = vol.id.clone();
        let stored = store.run(move |s| s.volume(&id)).await?;
        let crate::domain::state::Step::Next(record) =
            crate::domain::state::rebuilt(stored.as_ref(), vol)
        else {
            continue;
        };
        let vol = (*record).clone();
        store.run(move |s| s.put_volume(&record)).await?;
        tracing::info!(volume_id = %vol.id, name = %vol.name, "volume record restored from its RelayVolume");
        restored += 1;
    }
    let lagging = lagging(store, &mirrored).await?;
    Ok(Rebuilt { restored, lagging })
}

/// Whether `rv` is the record of a volume deleted without its storage: by
/// its phase, or by its label should the status have been lost.
pub fn is_released(rv: &RelayVolume) -> bool {
    rv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(RELEASED)
        || rv
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(naming::RELEASED_FROM_LABEL))
}

/// The member volumes of the store whose record differs from `mirrored`
/// (volume id → the RelayVolume's record).
async fn lagging(
    store: &Store,
    mirrored: &std::collections::HashMap<String, String>,
) -> CsiResult<Vec<String>> {
    let records = store.all_volumes().await?;
    Ok(records
        .into_iter()
        .filter(|vol| !vol.ephemeral && matches!(vol.backing, Backing::Member { .. }))
        .filter(|vol| !spec_of(vol).is_ok_and(|spec| mirrored.get(&vol.id) == Some(&spec.record)))
        .map(|vol| vol.id)
        .collect())
}

/// A RelayVolume is editable by anyone with RBAC on it, so a record read
/// back from one is taken only as far as it can be checked: a member volume
/// whose id, member and claim name agree (the claim name is derived from the
/// id, so no edit can point it at someone else's claim). What node plugins
/// mount (the attachments' publish_context) is never taken from it: it is
/// dropped here and derived again from the member's PersistentVolume by the
/// next ControllerPublishVolume.
pub fn untrusted(mut vol: Volume) -> Result<Volume, String> {
    let Some((member, _)) = naming::parse_volume_id(&vol.id) else {
        return Err(format!("{:?} is not a member volume id", vol.id));
    };
    let Backing::Member {
        member: backing_member,
        namespace,
        pvc,
        ..
    } = &vol.backing
    else {
        return Err("only member-cluster volumes are kept in RelayVolumes".into());
    };
    // A volume that moves with its pod lives in any member its class lists;
    // the claim there must still carry this volume's id (`pvc::owned`).
    let moved_to = |m: &str| {
        vol.parameters.get("movableBetween").is_some_and(|list| {
            list.split(',')
                .filter_map(|pair| pair.split_once('='))
                .any(|(name, _)| name.trim() == m)
        })
    };
    if backing_member != member && !moved_to(backing_member) {
        return Err(format!(
            "its member {backing_member:?} is not the one its id names ({member:?})"
        ));
    }
    // The claim may be named after the host PVC; whatever the record says,
    // the member backend acts only on a claim that carries this volume's
    // id (`pvc::owned`), so a forged name reaches nothing else.
    if !naming::is_dns_subdomain(pvc) {
        return Err(format!("its member claim {pvc:?} is not a valid name"));
    }
    if !naming::is_dns_label(namespace) {
        return Err(format!("namespace {namespace:?} is not a DNS label"));
    }
    if vol.ephemeral {
        return Err("inline ephemeral volumes are never mirrored".into());
    }
    crate::domain::validate::id(&vol.name, "name").map_err(|e| e.to_string())?;
    for node in vol.nodes.values_mut() {
        if let Some(a) = node.attachment.as_mut() {
            a.publish_context.clear();
        }
    }
    Ok(vol)
}

#[cfg(test)]
#[path = "relay_volume_tests.rs"]
mod tests;

// The view: what the controller keeps of each watched RelayVolume: only what its
// readers read. The catch-up reads the name, the version it writes onto,
// the volume id and the status; the member observer the status entries;
// the member's warnings the host claim and LAST-ERROR. Whole objects
// (an `ObjectMeta` and a spec of mostly empty fields, about 700 bytes
// before any string) cost 1 KiB per volume more at 10,000 volumes
// (`bench/member-scale.sh`); the record, labels and managedFields, which
// the store or nobody reads, more still.

/// A watched RelayVolume, as the controller keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub name: String,
    pub resource_version: Option<String>,
    pub volume_id: String,
    /// namespace/name of the host claim.
    pub host_pvc: Option<String>,
    pub status: Option<RelayVolumeStatus>,
}

/// The RelayVolumes as watched, by name.
pub type View = kube::runtime::reflector::Store<Seen>;

impl From<RelayVolume> for Seen {
    fn from(rv: RelayVolume) -> Self {
        Seen {
            name: rv.metadata.name.unwrap_or_default(),
            resource_version: rv.metadata.resource_version,
            volume_id: rv.spec.volume_id,
            host_pvc: rv.spec.host_pvc,
            status: rv.status,
        }
    }
}

/// `event`, its objects kept as `Seen`.
pub fn seen_event(
    event: kube::runtime::watcher::Event<RelayVolume>,
) -> kube::runtime::watcher::Event<Seen> {
    match event {
        kube::runtime::watcher::Event::Apply(rv) => kube::runtime::watcher::Event::Apply(rv.into()),
        kube::runtime::watcher::Event::Delete(rv) => {
            kube::runtime::watcher::Event::Delete(rv.into())
        }
        kube::runtime::watcher::Event::Init => kube::runtime::watcher::Event::Init,
        kube::runtime::watcher::Event::InitApply(rv) => {
            kube::runtime::watcher::Event::InitApply(rv.into())
        }
        kube::runtime::watcher::Event::InitDone => kube::runtime::watcher::Event::InitDone,
    }
}

/// `rv` applied, as the watch tells it.
#[cfg(test)]
pub fn applied(rv: RelayVolume) -> kube::runtime::watcher::Event<Seen> {
    kube::runtime::watcher::Event::Apply(rv.into())
}

/// The name `Seen` is found by in a `View`.
pub fn view_key(name: &str) -> kube::runtime::reflector::ObjectRef<Seen> {
    kube::runtime::reflector::ObjectRef::new(name)
}

/// An empty view and what fills it (the watch, or a test).
pub fn new_view() -> (View, kube::runtime::reflector::store::Writer<Seen>) {
    kube::runtime::reflector::store()
}

// Kept in a reflector's store as RelayVolumes are: same kind, same key.
impl kube::runtime::reflector::Lookup for Seen {
    type DynamicType = ();

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        <RelayVolume as kube::Resource>::kind(&())
    }

    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        <RelayVolume as kube::Resource>::group(&())
    }

    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        <RelayVolume as kube::Resource>::version(&())
    }

    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        <RelayVolume as kube::Resource>::plural(&())
    }

    fn name(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some(std::borrow::Cow::Borrowed(&self.name))
    }

    fn namespace(&self) -> Option<std::borrow::Cow<'_, str>> {
        None
    }

    fn resource_version(&self) -> Option<std::borrow::Cow<'_, str>> {
        self.resource_version
            .as_deref()
            .map(std::borrow::Cow::Borrowed)
    }

    fn uid(&self) -> Option<std::borrow::Cow<'_, str>> {
        None
    }
}

#[cfg(test)]
mod view_tests {
    use super::*;
    use kube::runtime::reflector;
    use kube::runtime::watcher;

    fn object() -> RelayVolume {
        let mut rv = RelayVolume::new(
            "rv-1",
            RelayVolumeSpec {
                volume_id: "m-east-1".into(),
                volume_name: "pvc-1".into(),
                capacity_bytes: 1,
                member: Some("east".into()),
                member_pvc: Some("relay/relay-1".into()),
                host_pvc: Some("apps/data".into()),
                record: "{\"id\":\"m-east-1\"}".into(),
                format_version: 1,
                leader_term: Some(3),
            },
        );
        rv.metadata.resource_version = Some("7".into());
        rv.metadata.uid = Some("4f1c".into());
        rv.status = Some(RelayVolumeStatus {
            phase: Some("PUBLISHED".into()),
            node_summary: Some("east/n1".into()),
            last_error: Some("member says no".into()),
            nodes: Some(vec![RelayNodeStatus {
                node: "east/n1".into(),
                member: Some("east".into()),
                phase: Some("PUBLISHED".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        rv
    }

    // What the readers read is kept, and the store finds it by name as it
    // found the object; a delete takes it out.
    #[test]
    fn keeps_what_the_readers_read_under_the_objects_name() {
        let rv = object();
        let seen = Seen::from(rv.clone());
        assert_eq!(seen.name, "rv-1");
        assert_eq!(seen.resource_version.as_deref(), Some("7"));
        assert_eq!(seen.volume_id, "m-east-1");
        assert_eq!(seen.host_pvc.as_deref(), Some("apps/data"));
        assert_eq!(seen.status, rv.status);

        let (reader, mut writer) = new_view();
        writer.apply_watcher_event(&seen_event(watcher::Event::Apply(rv.clone())));
        assert_eq!(reader.get(&view_key("rv-1")).as_deref(), Some(&seen));
        assert_eq!(
            view_key("rv-1"),
            reflector::ObjectRef::<Seen>::from_obj(&seen)
        );
        writer.apply_watcher_event(&seen_event(watcher::Event::Delete(rv)));
        assert!(reader.get(&view_key("rv-1")).is_none());
    }

    // A relist replaces the whole view, as it does for whole objects.
    #[test]
    fn a_relist_replaces_the_new_view() {
        let (reader, mut writer) = new_view();
        writer.apply_watcher_event(&seen_event(watcher::Event::Apply(object())));
        let mut other = object();
        other.metadata.name = Some("rv-2".into());
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(other),
            watcher::Event::InitDone,
        ] {
            writer.apply_watcher_event(&seen_event(event));
        }
        assert!(reader.get(&view_key("rv-1")).is_none());
        assert!(reader.get(&view_key("rv-2")).is_some());
    }
}
