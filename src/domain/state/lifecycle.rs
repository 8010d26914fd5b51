//! A volume's life outside the node calls: creation (`Provisioning`, then
//! `Ready`), deletion (`Deleting`), expansion, modification, the
//! attachment's publish_context and records restored from a copy. Pure
//! like the rest of `state`: the callers do the backend work between the
//! intent and the outcome these functions describe.

use std::collections::BTreeMap;

use super::{ready, Step};
use crate::domain::capability::Capability;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::volume::{Backing, ContentSource, Lifecycle, Progress, Volume};

/// What a CreateVolume request asks for, as a record of the same name is
/// compared with it.
#[derive(Debug, Clone, Copy)]
pub struct CreateRequest<'a> {
    pub name: &'a str,
    pub required_bytes: u64,
    /// 0: no limit.
    pub limit_bytes: u64,
    pub capabilities: &'a [Capability],
    pub parameters: &'a BTreeMap<String, String>,
    pub source: &'a Option<ContentSource>,
}

/// What a CreateVolume repeat does with the record of its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repeat {
    /// The volume exists as asked: reply with it.
    Created,
    /// A create cut short: finish it on the same record.
    Resume,
}

/// Why `existing` does not answer `req`, if it does not.
fn mismatch(existing: &Volume, req: &CreateRequest<'_>) -> Option<String> {
    let size = existing.capacity_bytes;
    let admits = size >= req.required_bytes && (req.limit_bytes == 0 || size <= req.limit_bytes);
    if !admits {
        return Some(format!(
            "it has {} bytes, outside the requested range [{}, {}]",
            existing.capacity_bytes, req.required_bytes, req.limit_bytes
        ));
    }
    if existing.capabilities != req.capabilities {
        return Some(format!(
            "it was created with capabilities {:?}",
            existing.capabilities
        ));
    }
    if existing.parameters != *req.parameters {
        return Some(format!(
            "it was created with parameters {:?}",
            existing.parameters
        ));
    }
    if existing.source != *req.source {
        return Some(format!("it was created from {:?}", existing.source));
    }
    None
}

/// CreateVolume of a name that already has a record: ALREADY_EXISTS when
/// the record answers another request, ABORTED while it is being deleted.
pub fn create_repeat(existing: &Volume, req: &CreateRequest<'_>) -> CsiResult<Repeat> {
    if let Some(why) = mismatch(existing, req) {
        return Err(CsiError::AlreadyExists(format!(
            "a volume named {:?} already exists ({}) and {why}",
            req.name, existing.id
        )));
    }
    match existing.lifecycle {
        Lifecycle::Ready => Ok(Repeat::Created),
        Lifecycle::Provisioning => Ok(Repeat::Resume),
        Lifecycle::Deleting => Err(CsiError::Aborted(format!(
            "volume {:?} named {:?} is being deleted; retry once DeleteVolume completes",
            existing.id, req.name
        ))),
    }
}

/// Everything a new volume is created with.
#[derive(Debug, Clone)]
pub struct NewVolume {
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
    pub ephemeral: bool,
}

/// The record committed before any storage is allocated: `Provisioning`,
/// on no node, so a crash leaves something a retry (or the sweep) finishes.
pub fn provisioning(new: NewVolume) -> Volume {
    Volume {
        id: new.id,
        name: new.name,
        capacity_bytes: new.capacity_bytes,
        backing: new.backing,
        capabilities: new.capabilities,
        parameters: new.parameters,
        mutable_parameters: new.mutable_parameters,
        source: new.source,
        topology: new.topology,
        context: new.context,
        created_unix: new.created_unix,
        lifecycle: Lifecycle::Provisioning,
        ephemeral: new.ephemeral,
        nodes: BTreeMap::new(),
    }
}

/// After the backend allocated the storage (or start-up found it complete).
pub fn provisioned(vol: &Volume) -> Volume {
    let mut next = vol.clone();
    next.lifecycle = Lifecycle::Ready;
    next
}

/// The record marked for removal, committed before the storage is released.
pub fn deleting(vol: &Volume) -> Volume {
    let mut next = vol.clone();
    next.lifecycle = Lifecycle::Deleting;
    next
}

/// DeleteVolume: refused while any node still uses the volume; `Unchanged`
/// when a deletion was already under way.
pub fn delete(vol: &Volume) -> CsiResult<Step> {
    let busy: Vec<(&String, &'static str)> = vol
        .nodes
        .iter()
        .filter(|(_, n)| !n.is_empty())
        .map(|(id, n)| (id, n.phase().as_str()))
        .collect();
    if !busy.is_empty() {
        return Err(CsiError::FailedPrecondition(format!(
            "volume {:?} is still in use on node(s) {:?}; unpublish it first",
            vol.id, busy
        )));
    }
    Ok(match vol.lifecycle {
        Lifecycle::Deleting => Step::Unchanged,
        Lifecycle::Ready | Lifecycle::Provisioning => Step::Next(Box::new(deleting(vol))),
    })
}

/// ControllerExpandVolume to `target` bytes: `Unchanged` when the volume is
/// already at least that large (volumes never shrink), OUT_OF_RANGE beyond
/// `max_bytes`.
pub fn expand(vol: &Volume, target: u64, max_bytes: u64) -> CsiResult<Step> {
    ready(vol)?;
    if target <= vol.capacity_bytes {
        return Ok(Step::Unchanged);
    }
    if target > max_bytes {
        return Err(CsiError::OutOfRange(format!(
            "{target} bytes requested; this driver's maximum volume size is {max_bytes} bytes"
        )));
    }
    let mut next = vol.clone();
    next.capacity_bytes = target;
    Ok(Step::Next(Box::new(next)))
}

/// ControllerModifyVolume: `changes` set over the volume's mutable
/// parameters; `Unchanged` when they already hold.
pub fn modify(vol: &Volume, changes: BTreeMap<String, String>) -> CsiResult<Step> {
    ready(vol)?;
    let mut parameters = vol.mutable_parameters.clone();
    parameters.extend(changes);
    if parameters == vol.mutable_parameters {
        return Ok(Step::Unchanged);
    }
    let mut next = vol.clone();
    next.mutable_parameters = parameters;
    Ok(Step::Next(Box::new(next)))
}

/// After the backend attached the volume to `node_id`: NODE_READY is
/// reached, and the attachment keeps the publish_context the node side needs.
pub fn attached(vol: &Volume, node_id: &str, context: BTreeMap<String, String>) -> Volume {
    let mut next = vol.clone();
    if let Some(a) = next
        .nodes
        .get_mut(node_id)
        .and_then(|n| n.attachment.as_mut())
    {
        a.publish_context = context;
        a.progress = Progress::Done;
    }
    next
}

/// A record restored from a copy kept elsewhere (a RelayVolume): the
/// store's own record wins, and what node plugins mount (the attachments'
/// publish_context) is never taken from a copy: the next
/// ControllerPublishVolume derives it again.
pub fn rebuilt(stored: Option<&Volume>, mut copy: Volume) -> Step {
    if stored.is_some() {
        return Step::Unchanged;
    }
    for node in copy.nodes.values_mut() {
        if let Some(a) = node.attachment.as_mut() {
            a.publish_context.clear();
        }
    }
    Step::Next(Box::new(copy))
}

/// What an inline ephemeral volume's first NodePublishVolume starts from:
/// `Some` record to use, `None` when it must be created (again: a create
/// cut short is redone). ALREADY_EXISTS for a persistent volume's id.
pub fn ephemeral_use(existing: Option<&Volume>, id: &str) -> CsiResult<Option<Volume>> {
    match existing {
        Some(v) if !v.ephemeral => Err(CsiError::AlreadyExists(format!(
            "volume {id:?} exists as a persistent volume; it cannot be used inline"
        ))),
        Some(v) if v.lifecycle == Lifecycle::Ready => Ok(Some(v.clone())),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::volume::{Attachment, NodeRecord};
    use crate::grpc::status::CsiCode;

    fn new_volume() -> NewVolume {
        NewVolume {
            id: "vol-1".into(),
            name: "pvc-1".into(),
            capacity_bytes: 1 << 20,
            backing: Backing::Directory,
            capabilities: vec![Capability::plain_mount()],
            parameters: BTreeMap::new(),
            mutable_parameters: BTreeMap::new(),
            source: None,
            topology: vec![],
            context: BTreeMap::new(),
            created_unix: 7,
            ephemeral: false,
        }
    }

    fn next(step: CsiResult<Step>) -> Volume {
        match step {
            Ok(Step::Next(v)) => *v,
            other => panic!("expected a transition, got {other:?}"),
        }
    }

    fn attached_to(mut vol: Volume, node: &str) -> Volume {
        vol.nodes.insert(
            node.into(),
            NodeRecord {
                attachment: Some(Attachment {
                    readonly: false,
                    capability: Capability::plain_mount(),
                    publish_context: [("k".to_string(), "v".to_string())].into(),
                    progress: Progress::Done,
                }),
                stage: None,
                targets: BTreeMap::new(),
            },
        );
        vol
    }

    #[test]
    fn a_volume_is_provisioning_until_created() {
        let v = provisioning(new_volume());
        assert_eq!(v.lifecycle, Lifecycle::Provisioning);
        assert!(v.nodes.is_empty());
        assert_eq!(
            ready(&v).unwrap_err().code(),
            tonic::Code::NotFound,
            "not a volume for users yet"
        );
        let v = provisioned(&v);
        assert_eq!(v.lifecycle, Lifecycle::Ready);
        assert_eq!(v.created_unix, 7);
    }

    #[test]
    fn create_repeats_resume_reply_or_refuse() {
        let caps = vec![Capability::plain_mount()];
        let parameters = BTreeMap::new();
        let source = None;
        let req = CreateRequest {
            name: "pvc-1",
            required_bytes: 1 << 20,
            limit_bytes: 0,
            capabilities: &caps,
            parameters: &parameters,
            source: &source,
        };
        let v = provisioning(new_volume());
        assert_eq!(create_repeat(&v, &req).unwrap(), Repeat::Resume);
        assert_eq!(
            create_repeat(&provisioned(&v), &req).unwrap(),
            Repeat::Created
        );
        let err = create_repeat(&deleting(&v), &req).unwrap_err();
        assert_eq!(err.code(), tonic::Code::Aborted);
        let bigger = CreateRequest {
            required_bytes: 2 << 20,
            ..req
        };
        let err = create_repeat(&v, &bigger).unwrap_err();
        assert_eq!(err.code(), tonic::Code::AlreadyExists);
        assert!(
            err.to_string().contains("outside the requested range"),
            "{err}"
        );
        let other = BTreeMap::from([("a".to_string(), "b".to_string())]);
        let err = create_repeat(
            &v,
            &CreateRequest {
                parameters: &other,
                ..req
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("parameters"), "{err}");
    }

    #[test]
    fn deletion_is_refused_while_used_and_marked_once() {
        let v = provisioned(&provisioning(new_volume()));
        let busy = attached_to(v.clone(), "n1");
        assert_eq!(
            delete(&busy).unwrap_err().code(),
            tonic::Code::FailedPrecondition
        );
        let marked = next(delete(&v));
        assert_eq!(marked.lifecycle, Lifecycle::Deleting);
        assert_eq!(delete(&marked).unwrap(), Step::Unchanged);
        // A create cut short is deleted too.
        let half = provisioning(new_volume());
        assert_eq!(next(delete(&half)).lifecycle, Lifecycle::Deleting);
    }

    #[test]
    fn expansion_only_grows_within_the_maximum() {
        let v = provisioned(&provisioning(new_volume()));
        assert_eq!(expand(&v, 1 << 20, 1 << 30).unwrap(), Step::Unchanged);
        assert_eq!(expand(&v, 1 << 10, 1 << 30).unwrap(), Step::Unchanged);
        assert_eq!(
            expand(&v, 2 << 30, 1 << 30).unwrap_err().code(),
            tonic::Code::OutOfRange
        );
        assert_eq!(next(expand(&v, 2 << 20, 1 << 30)).capacity_bytes, 2 << 20);
        assert_eq!(
            expand(&provisioning(new_volume()), 2 << 20, 1 << 30)
                .unwrap_err()
                .code(),
            tonic::Code::NotFound
        );
    }

    #[test]
    fn modification_merges_and_repeats_are_unchanged() {
        let v = provisioned(&provisioning(new_volume()));
        let changes = BTreeMap::from([("iops".to_string(), "100".to_string())]);
        let m = next(modify(&v, changes.clone()));
        assert_eq!(m.mutable_parameters, changes);
        assert_eq!(modify(&m, changes.clone()).unwrap(), Step::Unchanged);
        assert_eq!(modify(&m, BTreeMap::new()).unwrap(), Step::Unchanged);
        assert_eq!(
            modify(&deleting(&v), changes).unwrap_err().code(),
            tonic::Code::NotFound
        );
    }

    #[test]
    fn the_attachment_keeps_the_backends_context() {
        let v = attached_to(provisioned(&provisioning(new_volume())), "n1");
        let ctx = BTreeMap::from([("x".to_string(), "y".to_string())]);
        let a = attached(&v, "n1", ctx.clone());
        assert_eq!(
            a.nodes["n1"].attachment.as_ref().unwrap().publish_context,
            ctx
        );
        // No attachment on that node: nothing to record it on.
        assert_eq!(attached(&v, "n2", ctx), v);
    }

    #[test]
    fn a_rebuilt_record_never_overrides_the_store_nor_carries_contexts() {
        let copy = attached_to(provisioned(&provisioning(new_volume())), "n1");
        assert_eq!(rebuilt(Some(&copy), copy.clone()), Step::Unchanged);
        let Step::Next(restored) = rebuilt(None, copy) else {
            panic!("expected a restored record")
        };
        assert!(restored.nodes["n1"]
            .attachment
            .as_ref()
            .unwrap()
            .publish_context
            .is_empty());
    }

    #[test]
    fn inline_volumes_reuse_ready_records_and_never_persistent_ones() {
        let mut eph = provisioning(NewVolume {
            ephemeral: true,
            ..new_volume()
        });
        assert_eq!(ephemeral_use(Some(&eph), "vol-1").unwrap(), None);
        eph = provisioned(&eph);
        assert_eq!(ephemeral_use(Some(&eph), "vol-1").unwrap(), Some(eph));
        assert_eq!(ephemeral_use(None, "vol-1").unwrap(), None);
        let persistent = provisioned(&provisioning(new_volume()));
        assert_eq!(
            ephemeral_use(Some(&persistent), "vol-1")
                .unwrap_err()
                .code(),
            tonic::Code::AlreadyExists
        );
    }
}
