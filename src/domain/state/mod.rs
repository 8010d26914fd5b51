//! The volume state machine: CREATED → NODE_READY(node) → VOL_READY(node,
//! staging path) → PUBLISHED(node, targets) and back down.
//!
//! Every function here is pure: it takes the current record and a request and
//! either says the request is an idempotent repeat (`Step::Unchanged`), or
//! returns the next record (`Step::Next`), or the CSI error the spec requires.
//! Callers decide first, then do the I/O, then commit what was decided.
//!
//! This file holds the attachment and node transitions; `lifecycle` the
//! rest of a volume's life (create, delete, expand, modify, restore from a
//! copy), `node_local` the records a node plugin adopts from a request.

mod lifecycle;
mod node_local;

pub use lifecycle::{
    attached, create_repeat, delete, deleting, ephemeral_use, expand, modify, provisioned,
    provisioning, rebuilt, CreateRequest, NewVolume, Repeat,
};
pub use node_local::{
    adopt, in_use, is_node_local, may_adopt, settled, stage_needs_attachment, AdoptFacts, Settled,
    NODE_LOCAL,
};

use crate::domain::capability::{AccessMode, Capability};
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::volume::{
    Attachment, Lifecycle, NodeRecord, Progress, Publication, Stage, Volume,
};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The request repeats one that already took effect: reply OK, do nothing.
    Unchanged,
    /// The record as it must be committed for this request.
    Next(Box<Volume>),
}

/// The attach limit as seen by ControllerPublishVolume.
#[derive(Debug, Clone, Copy)]
pub struct AttachLimit {
    pub attached_on_node: u64,
    pub max: u64,
}

/// NOT_FOUND for a record that is not a volume for users (yet, or any more).
pub fn ready(vol: &Volume) -> CsiResult<()> {
    match vol.lifecycle {
        Lifecycle::Ready => Ok(()),
        // Half-created or half-deleted volumes do not exist for users.
        Lifecycle::Provisioning | Lifecycle::Deleting => {
            Err(CsiError::VolumeNotFound(vol.id.clone()))
        }
    }
}

/// The capability asked for must be one the volume was created for.
fn supported(vol: &Volume, cap: &Capability, field: &'static str) -> CsiResult<()> {
    let ok = vol.capabilities.iter().any(|c| {
        c.same_access(cap)
            && (c.mode == cap.mode || !c.mode.single_node() || cap.mode.single_node())
    });
    if ok {
        Ok(())
    } else {
        Err(CsiError::invalid(
            field,
            format!(
                "volume {:?} was created for {:?}; the requested {:?} access does not match",
                vol.id, vol.capabilities, cap
            ),
        ))
    }
}

fn with_node(vol: &Volume, node_id: &str, f: impl FnOnce(&mut NodeRecord)) -> Step {
    let mut next = vol.clone();
    let node = next.nodes.entry(node_id.to_string()).or_default();
    f(node);
    if node.is_empty() {
        next.nodes.remove(node_id);
    }
    Step::Next(Box::new(next))
}

/// ControllerPublishVolume → NODE_READY on `node_id`.
pub fn controller_publish(
    vol: &Volume,
    node_id: &str,
    readonly: bool,
    cap: &Capability,
    limit: Option<AttachLimit>,
) -> CsiResult<Step> {
    ready(vol)?;
    if let Some(existing) = vol.node(node_id).and_then(|n| n.attachment.as_ref()) {
        if existing.readonly == readonly && existing.capability == *cap {
            return Ok(Step::Unchanged);
        }
        return Err(CsiError::AlreadyExists(format!(
            "volume {:?} is already published to node {node_id:?} with readonly={} and {:?}; \
             unpublish it before publishing with readonly={readonly} and {:?}",
            vol.id, existing.readonly, existing.capability, cap
        )));
    }
    supported(vol, cap, "volume_capability")?;
    let others: Vec<&str> = vol.attached_nodes().filter(|n| *n != node_id).collect();
    if !others.is_empty() {
        let single_node = cap.mode.single_node()
            || vol
                .nodes
                .values()
                .filter_map(|n| n.attachment.as_ref())
                .any(|a| a.capability.mode.single_node());
        if single_node {
            // Where a node uses a member volume (its attachment's member),
            // so the message says which cluster holds it.
            let held: Vec<String> = others
                .iter()
                .map(|n| {
                    match vol
                        .node(n)
                        .and_then(|r| r.attachment.as_ref())
                        .and_then(|a| a.publish_context.get(crate::domain::member_source::MEMBER))
                    {
                        Some(m) => format!("{n:?} (member cluster {m})"),
                        None => format!("{n:?}"),
                    }
                })
                .collect();
            return Err(CsiError::FailedPrecondition(format!(
                "volume {:?} has a single-node access mode and is already published to node(s) {}; it can be published to node {node_id:?} once unpublished there",
                vol.id,
                held.join(", ")
            )));
        }
        if cap.mode == AccessMode::MultiNodeSingleWriter && !readonly {
            let writer = vol
                .nodes
                .iter()
                .find(|(_, n)| n.attachment.as_ref().is_some_and(|a| !a.readonly));
            if let Some((writer, _)) = writer {
                return Err(CsiError::FailedPrecondition(format!(
                    "volume {:?} is MULTI_NODE_SINGLE_WRITER and node {writer:?} already writes to it",
                    vol.id
                )));
            }
        }
    }
    if let Some(limit) = limit {
        if limit.attached_on_node >= limit.max {
            return Err(CsiError::ResourceExhausted(format!(
                "node {node_id:?} already has {} volumes attached, the maximum is {}",
                limit.attached_on_node, limit.max
            )));
        }
    }
    Ok(with_node(vol, node_id, |n| {
        n.attachment = Some(Attachment {
            readonly,
            capability: cap.clone(),
            publish_context: Default::default(),
            progress: Progress::Applying,
        })
    }))
}

/// ControllerUnpublishVolume: NODE_READY → CREATED on `node_id`. Unknown
/// attachments are a success (the call is idempotent). Node-side state is
/// left alone: a CO force-detaching an unreachable node must not be blocked.
pub fn controller_unpublish(vol: &Volume, node_id: &str) -> Step {
    match vol.node(node_id) {
        Some(n) if n.attachment.is_some() => with_node(vol, node_id, |n| n.attachment = None),
        _ => Step::Unchanged,
    }
}

/// NodeStageVolume → VOL_READY at `path`, recorded as in progress.
pub fn node_stage(
    vol: &Volume,
    node_id: &str,
    path: &str,
    cap: &Capability,
    attach_required: bool,
) -> CsiResult<Step> {
    ready(vol)?;
    let node = vol.node(node_id);
    if let Some(stage) = node.and_then(|n| n.stage.as_ref()) {
        if stage.path != path {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {:?} is already staged on node {node_id:?} at {:?}; unstage it before staging at {path:?}",
                vol.id, stage.path
            )));
        }
        if stage.capability != *cap {
            return Err(CsiError::AlreadyExists(format!(
                "volume {:?} is already staged at {path:?} with {:?}, which differs from the requested {:?}",
                vol.id, stage.capability, cap
            )));
        }
        return Ok(match stage.progress {
            Progress::Done => Step::Unchanged,
            // A retry of an interrupted stage (or unstage) redoes the work.
            Progress::Applying | Progress::Removing => with_node(vol, node_id, |n| {
                if let Some(s) = n.stage.as_mut() {
                    s.progress = Progress::Applying;
                }
            }),
        });
    }
    supported(vol, cap, "volume_capability")?;
    if attach_required && node.and_then(|n| n.attachment.as_ref()).is_none() {
        return Err(CsiError::FailedPrecondition(format!(
            "volume {:?} is not published to node {node_id:?}: ControllerPublishVolume must succeed before NodeStageVolume",
            vol.id
        )));
    }
    Ok(with_node(vol, node_id, |n| {
        n.stage = Some(Stage {
            path: path.to_string(),
            capability: cap.clone(),
            device: None,
            progress: Progress::Applying,
        })
    }))
}

/// NodeUnstageVolume: marks the stage as being removed. `Unchanged` when
/// nothing is staged at `path`.
pub fn node_unstage(vol: &Volume, node_id: &str, path: &str) -> CsiResult<Step> {
    let Some(node) = vol.node(node_id) else {
        return Ok(Step::Unchanged);
    };
    match &node.stage {
        Some(stage) if stage.path == path => {
            if !node.targets.is_empty() {
                return Err(CsiError::FailedPrecondition(format!(
                    "volume {:?} is still published on node {node_id:?} at {:?}: NodeUnpublishVolume must come first",
                    vol.id,
                    node.targets.keys().collect::<Vec<_>>()
                )));
            }
            Ok(with_node(vol, node_id, |n| {
                if let Some(s) = n.stage.as_mut() {
                    s.progress = Progress::Removing;
                }
            }))
        }
        _ => Ok(Step::Unchanged),
    }
}

/// What NodePublishVolume needs from staging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StagingRule {
    /// STAGE_UNSTAGE is advertised: the staging path must be the staged one.
    Required,
    /// Ephemeral inline volumes are published without staging.
    NotUsed,
}

/// NodePublishVolume → PUBLISHED at `target`, recorded as in progress.
pub fn node_publish(
    vol: &Volume,
    node_id: &str,
    target: &str,
    staging_path: &str,
    readonly: bool,
    cap: &Capability,
    staging: StagingRule,
) -> CsiResult<Step> {
    ready(vol)?;
    let node = vol.node(node_id);
    if let Some(existing) = node.and_then(|n| n.targets.get(target)) {
        if existing.readonly != readonly || existing.capability != *cap {
            return Err(CsiError::AlreadyExists(format!(
                "volume {:?} is already published at {target:?} with readonly={} and {:?}; \
                 the request asks for readonly={readonly} and {:?}",
                vol.id, existing.readonly, existing.capability, cap
            )));
        }
        return Ok(match existing.progress {
            Progress::Done => Step::Unchanged,
            Progress::Applying | Progress::Removing => with_node(vol, node_id, |n| {
                if let Some(p) = n.targets.get_mut(target) {
                    p.progress = Progress::Applying;
                }
            }),
        });
    }
    supported(vol, cap, "volume_capability")?;
    if staging == StagingRule::Required {
        match node.and_then(|n| n.stage.as_ref()) {
            Some(stage) if stage.path == staging_path && stage.progress == Progress::Done => {}
            Some(stage) if stage.path != staging_path => {
                return Err(CsiError::FailedPrecondition(format!(
                    "volume {:?} is staged at {:?}, not at the given staging_target_path {staging_path:?}",
                    vol.id, stage.path
                )))
            }
            _ => {
                return Err(CsiError::FailedPrecondition(format!(
                    "volume {:?} is not staged on node {node_id:?}: NodeStageVolume must succeed before NodePublishVolume",
                    vol.id
                )))
            }
        }
    }
    if let Some(node) = node {
        let single_writer = cap.mode == AccessMode::SingleNodeSingleWriter
            || node
                .targets
                .values()
                .any(|p| p.capability.mode == AccessMode::SingleNodeSingleWriter);
        if single_writer && !node.targets.is_empty() {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {:?} is SINGLE_NODE_SINGLE_WRITER and already published at {:?}",
                vol.id,
                node.targets.keys().collect::<Vec<_>>()
            )));
        }
    }
    Ok(with_node(vol, node_id, |n| {
        n.targets.insert(
            target.to_string(),
            Publication {
                readonly,
                capability: cap.clone(),
                progress: Progress::Applying,
            },
        );
    }))
}

/// NodeUnpublishVolume: marks the target as being removed; `Unchanged` when
/// the volume is not published there.
pub fn node_unpublish(vol: &Volume, node_id: &str, target: &str) -> Step {
    match vol.node(node_id).and_then(|n| n.targets.get(target)) {
        Some(_) => with_node(vol, node_id, |n| {
            if let Some(p) = n.targets.get_mut(target) {
                p.progress = Progress::Removing;
            }
        }),
        None => Step::Unchanged,
    }
}

/// After the mount work of a stage succeeded.
pub fn stage_done(vol: &Volume, node_id: &str, device: Option<String>) -> Volume {
    let mut next = vol.clone();
    if let Some(stage) = next.nodes.get_mut(node_id).and_then(|n| n.stage.as_mut()) {
        stage.progress = Progress::Done;
        stage.device = device;
    }
    next
}

/// After the unmount work of an unstage succeeded.
pub fn stage_removed(vol: &Volume, node_id: &str) -> Volume {
    let mut next = vol.clone();
    if let Some(node) = next.nodes.get_mut(node_id) {
        node.stage = None;
        if node.is_empty() {
            next.nodes.remove(node_id);
        }
    }
    next
}

pub fn publish_done(vol: &Volume, node_id: &str, target: &str) -> Volume {
    let mut next = vol.clone();
    if let Some(p) = next
        .nodes
        .get_mut(node_id)
        .and_then(|n| n.targets.get_mut(target))
    {
        p.progress = Progress::Done;
    }
    next
}

pub fn publish_removed(vol: &Volume, node_id: &str, target: &str) -> Volume {
    let mut next = vol.clone();
    if let Some(node) = next.nodes.get_mut(node_id) {
        node.targets.remove(target);
        if node.is_empty() {
            next.nodes.remove(node_id);
        }
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::capability::AccessType;
    use crate::domain::volume::Phase;
    use crate::grpc::status::CsiCode;
    use proptest::prelude::*;

    fn volume(mode: AccessMode) -> Volume {
        Volume {
            capacity_bytes: 1 << 20,
            capabilities: vec![Capability::mount(mode)],
            ..crate::domain::volume::sample("vol-1", "pvc-1")
        }
    }

    fn next(step: CsiResult<Step>) -> Volume {
        match step {
            Ok(Step::Next(v)) => *v,
            other => panic!("expected a transition, got {other:?}"),
        }
    }

    fn code(r: CsiResult<Step>) -> tonic::Code {
        r.unwrap_err().code()
    }

    #[test]
    fn full_lifecycle_up_and_down() {
        let c = Capability::mount(AccessMode::SingleNodeWriter);
        let v = volume(AccessMode::SingleNodeWriter);
        assert_eq!(v.phase(), Phase::Created);
        let v = next(controller_publish(&v, "n1", false, &c, None));
        // The intent only: NODE_READY is reached once the backend attached.
        assert_eq!(v.phase(), Phase::Created);
        assert_eq!(v.nodes["n1"].pending(), Some(Phase::NodeReady));
        let v = super::lifecycle::attached(&v, "n1", Default::default());
        assert_eq!(v.phase(), Phase::NodeReady);
        assert_eq!(v.nodes["n1"].pending(), None);
        let v = next(node_stage(&v, "n1", "/s", &c, true));
        // A stage in progress is not VOL_READY yet.
        assert_eq!(v.phase(), Phase::NodeReady);
        assert_eq!(v.nodes["n1"].pending(), Some(Phase::VolReady));
        let v = stage_done(&v, "n1", None);
        assert_eq!(v.phase(), Phase::VolReady);
        let v = next(node_publish(
            &v,
            "n1",
            "/t",
            "/s",
            false,
            &c,
            StagingRule::Required,
        ));
        let v = publish_done(&v, "n1", "/t");
        assert_eq!(v.phase(), Phase::Published);
        assert_eq!(
            code(Ok(()).and_then(|_| delete(&v).map(|_| Step::Unchanged))),
            tonic::Code::FailedPrecondition
        );
        let v = next(Ok(node_unpublish(&v, "n1", "/t")));
        let v = publish_removed(&v, "n1", "/t");
        let v = next(node_unstage(&v, "n1", "/s"));
        let v = stage_removed(&v, "n1");
        assert_eq!(v.phase(), Phase::NodeReady);
        let v = next(Ok(controller_unpublish(&v, "n1")));
        assert_eq!(v.phase(), Phase::Created);
        assert!(v.nodes.is_empty());
        assert!(delete(&v).is_ok());
    }

    #[test]
    fn repeats_are_unchanged_and_conflicts_already_exist() {
        let c = Capability::mount(AccessMode::SingleNodeWriter);
        let v = next(controller_publish(
            &volume(AccessMode::SingleNodeWriter),
            "n1",
            false,
            &c,
            None,
        ));
        assert_eq!(
            controller_publish(&v, "n1", false, &c, None).unwrap(),
            Step::Unchanged
        );
        assert_eq!(
            code(controller_publish(&v, "n1", true, &c, None)),
            tonic::Code::AlreadyExists
        );
        let v = stage_done(&next(node_stage(&v, "n1", "/s", &c, true)), "n1", None);
        assert_eq!(
            node_stage(&v, "n1", "/s", &c, true).unwrap(),
            Step::Unchanged
        );
        let mut other = c.clone();
        other.access = AccessType::Block;
        assert_eq!(
            code(node_stage(&v, "n1", "/s", &other, true)),
            tonic::Code::AlreadyExists
        );
        let v = publish_done(
            &next(node_publish(
                &v,
                "n1",
                "/t",
                "/s",
                false,
                &c,
                StagingRule::Required,
            )),
            "n1",
            "/t",
        );
        assert_eq!(
            node_publish(&v, "n1", "/t", "/s", false, &c, StagingRule::Required).unwrap(),
            Step::Unchanged
        );
        assert_eq!(
            code(node_publish(
                &v,
                "n1",
                "/t",
                "/s",
                true,
                &c,
                StagingRule::Required
            )),
            tonic::Code::AlreadyExists
        );
    }

    #[test]
    fn single_node_modes_refuse_a_second_node() {
        let c = Capability::mount(AccessMode::SingleNodeWriter);
        let v = next(controller_publish(
            &volume(AccessMode::SingleNodeWriter),
            "n1",
            false,
            &c,
            None,
        ));
        assert_eq!(
            code(controller_publish(&v, "n2", false, &c, None)),
            tonic::Code::FailedPrecondition
        );
        let m = Capability::mount(AccessMode::MultiNodeMultiWriter);
        let v = next(controller_publish(
            &volume(AccessMode::MultiNodeMultiWriter),
            "n1",
            false,
            &m,
            None,
        ));
        assert!(matches!(
            controller_publish(&v, "n2", false, &m, None),
            Ok(Step::Next(_))
        ));
    }

    #[test]
    fn multi_node_single_writer_allows_one_writer() {
        let c = Capability::mount(AccessMode::MultiNodeSingleWriter);
        let v = next(controller_publish(
            &volume(AccessMode::MultiNodeSingleWriter),
            "n1",
            false,
            &c,
            None,
        ));
        assert_eq!(
            code(controller_publish(&v, "n2", false, &c, None)),
            tonic::Code::FailedPrecondition
        );
        assert!(controller_publish(&v, "n2", true, &c, None).is_ok());
    }

    #[test]
    fn attach_limit_is_resource_exhausted() {
        let c = Capability::mount(AccessMode::SingleNodeWriter);
        let limit = AttachLimit {
            attached_on_node: 2,
            max: 2,
        };
        assert_eq!(
            code(controller_publish(
                &volume(AccessMode::SingleNodeWriter),
                "n1",
                false,
                &c,
                Some(limit)
            )),
            tonic::Code::ResourceExhausted
        );
    }

    #[test]
    fn out_of_order_calls_fail_precondition() {
        let c = Capability::mount(AccessMode::SingleNodeWriter);
        let v = volume(AccessMode::SingleNodeWriter);
        assert_eq!(
            code(node_stage(&v, "n1", "/s", &c, true)),
            tonic::Code::FailedPrecondition
        );
        assert!(node_stage(&v, "n1", "/s", &c, false).is_ok());
        assert_eq!(
            code(node_publish(
                &v,
                "n1",
                "/t",
                "/s",
                false,
                &c,
                StagingRule::Required
            )),
            tonic::Code::FailedPrecondition
        );
        let v = next(controller_publish(&v, "n1", false, &c, None));
        let v = stage_done(&next(node_stage(&v, "n1", "/s", &c, true)), "n1", None);
        assert_eq!(
            code(node_stage(&v, "n1", "/other", &c, true)),
            tonic::Code::FailedPrecondition
        );
        assert_eq!(
            code(node_publish(
                &v,
                "n1",
                "/t",
                "/other",
                false,
                &c,
                StagingRule::Required
            )),
            tonic::Code::FailedPrecondition
        );
        let v = publish_done(
            &next(node_publish(
                &v,
                "n1",
                "/t",
                "/s",
                false,
                &c,
                StagingRule::Required,
            )),
            "n1",
            "/t",
        );
        assert_eq!(
            code(node_unstage(&v, "n1", "/s")),
            tonic::Code::FailedPrecondition
        );
    }

    #[test]
    fn single_node_single_writer_has_one_target() {
        let c = Capability::mount(AccessMode::SingleNodeSingleWriter);
        let v = volume(AccessMode::SingleNodeSingleWriter);
        let v = stage_done(&next(node_stage(&v, "n1", "/s", &c, false)), "n1", None);
        let v = publish_done(
            &next(node_publish(
                &v,
                "n1",
                "/t1",
                "/s",
                false,
                &c,
                StagingRule::Required,
            )),
            "n1",
            "/t1",
        );
        assert_eq!(
            code(node_publish(
                &v,
                "n1",
                "/t2",
                "/s",
                false,
                &c,
                StagingRule::Required
            )),
            tonic::Code::FailedPrecondition
        );
    }

    #[test]
    fn unfinished_records_are_not_volumes() {
        let mut v = volume(AccessMode::SingleNodeWriter);
        v.lifecycle = Lifecycle::Provisioning;
        let c = Capability::mount(AccessMode::SingleNodeWriter);
        assert_eq!(
            code(controller_publish(&v, "n1", false, &c, None)),
            tonic::Code::NotFound
        );
    }

    #[derive(Debug, Clone)]
    enum Call {
        CPub(u8, bool),
        CUnpub(u8),
        Stage(u8, u8),
        Unstage(u8, u8),
        Pub(u8, u8, u8, bool),
        Unpub(u8, u8),
    }

    fn call() -> impl Strategy<Value = Call> {
        prop_oneof![
            (0..3u8, any::<bool>()).prop_map(|(n, r)| Call::CPub(n, r)),
            (0..3u8).prop_map(Call::CUnpub),
            (0..3u8, 0..2u8).prop_map(|(n, s)| Call::Stage(n, s)),
            (0..3u8, 0..2u8).prop_map(|(n, s)| Call::Unstage(n, s)),
            (0..3u8, 0..3u8, 0..2u8, any::<bool>()).prop_map(|(n, t, s, r)| Call::Pub(n, t, s, r)),
            (0..3u8, 0..3u8).prop_map(|(n, t)| Call::Unpub(n, t)),
        ]
    }

    proptest! {
        /// Whatever the call order, the invariants hold: nothing is published
        /// without being staged on that node, a single-node volume is attached
        /// to at most one node, every successful call is idempotent, and a
        /// volume can always be unwound back to CREATED.
        #[test]
        fn random_call_sequences_keep_invariants(mode in prop_oneof![Just(AccessMode::SingleNodeWriter), Just(AccessMode::MultiNodeMultiWriter)], calls in proptest::collection::vec(call(), 1..40)) {
            let c = Capability::mount(mode);
            let mut v = volume(mode);
            for call in calls {
                let node = |n: u8| format!("n{n}");
                let result = match &call {
                    Call::CPub(n, r) => controller_publish(&v, &node(*n), *r, &c, Some(AttachLimit { attached_on_node: 0, max: 4 })),
                    Call::CUnpub(n) => Ok(controller_unpublish(&v, &node(*n))),
                    Call::Stage(n, s) => node_stage(&v, &node(*n), &format!("/s{s}"), &c, true)
                        .map(|st| match st { Step::Next(x) => Step::Next(Box::new(stage_done(&x, &node(*n), None))), u => u }),
                    Call::Unstage(n, s) => node_unstage(&v, &node(*n), &format!("/s{s}"))
                        .map(|st| match st { Step::Next(x) => Step::Next(Box::new(stage_removed(&x, &node(*n)))), u => u }),
                    Call::Pub(n, t, s, r) => node_publish(&v, &node(*n), &format!("/t{t}"), &format!("/s{s}"), *r, &c, StagingRule::Required)
                        .map(|st| match st { Step::Next(x) => Step::Next(Box::new(publish_done(&x, &node(*n), &format!("/t{t}")))), u => u }),
                    Call::Unpub(n, t) => Ok(node_unpublish(&v, &node(*n), &format!("/t{t}")))
                        .map(|st| match st { Step::Next(x) => Step::Next(Box::new(publish_removed(&x, &node(*n), &format!("/t{t}")))), u => u }),
                };
                if let Ok(Step::Next(nv)) = result {
                    v = *nv;
                }
                for n in v.nodes.values() {
                    prop_assert!(n.targets.is_empty() || n.stage.is_some(), "published without stage: {:?}", v);
                }
                if mode.single_node() {
                    prop_assert!(v.attached_nodes().count() <= 1);
                }
            }
            // Unwind everything, in CSI order, and land in CREATED.
            for (node_id, n) in v.nodes.clone() {
                for t in n.targets.keys() {
                    if let Step::Next(x) = node_unpublish(&v, &node_id, t) { v = publish_removed(&x, &node_id, t); }
                }
                if let Some(s) = &n.stage {
                    if let Step::Next(x) = node_unstage(&v, &node_id, &s.path).unwrap() { v = stage_removed(&x, &node_id); }
                }
                if let Step::Next(x) = controller_unpublish(&v, &node_id) { v = *x; }
            }
            prop_assert_eq!(v.phase(), Phase::Created);
            prop_assert!(delete(&v).is_ok());
        }
    }
}
