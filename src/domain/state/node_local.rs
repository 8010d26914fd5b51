//! Node-local records. A node plugin (`--mode node`) has its own store and
//! never sees the controller's records. NodeStageVolume of a volume it has
//! no record of adopts one from the request: Ready, created for the
//! requested capability, marked with [`NODE_LOCAL`] in its parameters, and
//! with this node's attachment holding the publish_context (which the
//! controller hands out only after NODE_READY, so it stands for
//! ControllerPublishVolume). From then on the usual transitions, intent /
//! commit and restart reconciliation apply; when the node stops using the
//! volume the record is dropped.

use std::collections::{BTreeMap, HashMap};

use crate::domain::capability::Capability;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::member_source::{self as source, MemberSource};
use crate::domain::volume::{Attachment, Backing, Lifecycle, NodeRecord, Progress, Volume};

/// `parameters` key marking a record this node made from a NodeStage
/// request (value "true").
pub const NODE_LOCAL: &str = "relay.csi.dev/node-local";

pub fn is_node_local(vol: &Volume) -> bool {
    vol.parameters.get(NODE_LOCAL).is_some_and(|v| v == "true")
}

/// Whether `node_id` stages or publishes `vol`.
pub fn in_use(vol: &Volume, node_id: &str) -> bool {
    vol.node(node_id)
        .is_some_and(|n| n.stage.is_some() || !n.targets.is_empty())
}

/// Whether NodeStageVolume needs an attachment on record first. Only a
/// controller sharing the store (standalone `--mode all`) records one for
/// a store's own volumes; a node-local record's attachment is the
/// controller's publish_context, so it always has one.
pub fn stage_needs_attachment(vol: &Volume, controller_shares_store: bool) -> bool {
    controller_shares_store || is_node_local(vol)
}

/// Where this node stands, as far as adopting a record goes.
#[derive(Debug, Clone, Copy)]
pub struct AdoptFacts<'a> {
    pub volume_id: &'a str,
    pub node_id: &'a str,
    /// A controller shares the store: its records are the only ones.
    pub controller: bool,
    /// The backend is the member backend, so the CO's call lacks a
    /// ControllerPublishVolume rather than naming an unknown volume.
    pub member_backend: bool,
    /// The publish_context describes a member source.
    pub member_source: bool,
}

/// Whether NodeStageVolume may adopt a record for a volume this store does
/// not hold: only a node plugin, and only from a member publish_context.
pub fn may_adopt(f: AdoptFacts<'_>) -> CsiResult<()> {
    if f.controller {
        return Err(CsiError::VolumeNotFound(f.volume_id.to_string()));
    }
    if !f.member_source {
        if f.member_backend {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {:?} is not published to node {:?}: NodeStageVolume needs the publish_context of a successful ControllerPublishVolume",
                f.volume_id, f.node_id
            )));
        }
        return Err(CsiError::VolumeNotFound(f.volume_id.to_string()));
    }
    Ok(())
}

/// The node-local record of `id` on `node_id`, from the stage request's
/// decoded member source `m`, its publish_context and volume_context.
pub fn adopt(
    id: &str,
    node_id: &str,
    m: &MemberSource,
    publish_context: BTreeMap<String, String>,
    volume_context: &HashMap<String, String>,
    cap: &Capability,
    now_unix: i64,
) -> Volume {
    let attribute = |key: &str| volume_context.get(key).cloned().unwrap_or_default();
    let node = NodeRecord {
        attachment: Some(Attachment {
            readonly: m.read_only,
            capability: cap.clone(),
            publish_context,
            progress: Progress::Done,
        }),
        stage: None,
        targets: BTreeMap::new(),
    };
    Volume {
        id: id.to_string(),
        name: format!("node-local/{id}"),
        capacity_bytes: 0,
        backing: Backing::Member {
            member: m.member.clone(),
            namespace: attribute(source::MEMBER_NAMESPACE),
            pvc: attribute(source::MEMBER_PVC),
            selected_node: m.member_node.clone(),
            claim_uid: None,
        },
        capabilities: vec![cap.clone()],
        parameters: [(NODE_LOCAL.to_string(), "true".to_string())].into(),
        mutable_parameters: BTreeMap::new(),
        source: None,
        topology: Vec::new(),
        context: volume_context.clone().into_iter().collect(),
        created_unix: now_unix,
        lifecycle: Lifecycle::Ready,
        ephemeral: false,
        nodes: [(node_id.to_string(), node)].into(),
    }
}

/// What becomes of a record once node work on it was undone or rolled back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// Commit it.
    Keep,
    /// A node-local record nothing here uses any more: drop it.
    Drop,
    /// An inline ephemeral volume nothing uses any more: delete it, data
    /// and all.
    DeleteEphemeral,
}

pub fn settled(vol: &Volume, node_id: &str) -> Settled {
    if vol.ephemeral && vol.nodes.is_empty() {
        Settled::DeleteEphemeral
    } else if is_node_local(vol) && !in_use(vol, node_id) {
        Settled::Drop
    } else {
        Settled::Keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::member_source::SourceKind;
    use crate::domain::volume::{Progress, Stage};
    use crate::grpc::status::CsiCode;

    fn facts() -> AdoptFacts<'static> {
        AdoptFacts {
            volume_id: "east~ns~pvc",
            node_id: "n1",
            controller: false,
            member_backend: false,
            member_source: true,
        }
    }

    fn member() -> MemberSource {
        MemberSource {
            member: "east".into(),
            pv: "pv-1".into(),
            member_node: Some("worker-1".into()),
            read_only: true,
            mount_options: vec![],
            kind: SourceKind::Nfs {
                server: "s".into(),
                path: "/e".into(),
            },
        }
    }

    #[test]
    fn only_a_node_plugin_adopts_and_only_from_a_member_context() {
        assert!(may_adopt(facts()).is_ok());
        let code = |f: AdoptFacts<'_>| may_adopt(f).unwrap_err().code();
        assert_eq!(
            code(AdoptFacts {
                controller: true,
                ..facts()
            }),
            tonic::Code::NotFound
        );
        assert_eq!(
            code(AdoptFacts {
                member_source: false,
                ..facts()
            }),
            tonic::Code::NotFound
        );
        assert_eq!(
            code(AdoptFacts {
                member_source: false,
                member_backend: true,
                ..facts()
            }),
            tonic::Code::FailedPrecondition
        );
    }

    #[test]
    fn an_adopted_record_is_ready_attached_and_dropped_when_unused() {
        let ctx = BTreeMap::from([("k".to_string(), "v".to_string())]);
        let vc = HashMap::from([(source::MEMBER_NAMESPACE.to_string(), "ns".to_string())]);
        let v = adopt(
            "east~ns~pvc",
            "n1",
            &member(),
            ctx.clone(),
            &vc,
            &Capability::plain_mount(),
            5,
        );
        assert!(is_node_local(&v));
        assert_eq!(v.lifecycle, Lifecycle::Ready);
        let a = v.nodes["n1"].attachment.as_ref().unwrap();
        assert!(a.readonly);
        assert_eq!(a.publish_context, ctx);
        assert!(matches!(&v.backing, Backing::Member { namespace, .. } if namespace == "ns"));
        assert!(!in_use(&v, "n1"));
        assert!(stage_needs_attachment(&v, false));
        assert_eq!(settled(&v, "n1"), Settled::Drop);
        let mut staged = v.clone();
        if let Some(n) = staged.nodes.get_mut("n1") {
            n.stage = Some(Stage {
                path: "/s".into(),
                capability: Capability::plain_mount(),
                device: None,
                progress: Progress::Done,
            });
        }
        assert_eq!(settled(&staged, "n1"), Settled::Keep);
    }

    #[test]
    fn unused_inline_volumes_are_deleted_and_others_kept() {
        let ctx = BTreeMap::new();
        let mut v = adopt(
            "id",
            "n1",
            &member(),
            ctx,
            &HashMap::new(),
            &Capability::plain_mount(),
            0,
        );
        v.parameters.clear();
        assert!(!stage_needs_attachment(&v, false));
        assert!(stage_needs_attachment(&v, true));
        assert_eq!(settled(&v, "n1"), Settled::Keep);
        v.nodes.clear();
        v.ephemeral = true;
        assert_eq!(settled(&v, "n1"), Settled::DeleteEphemeral);
    }
}
