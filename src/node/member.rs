//! Member volumes on the node side: the member PV's source, described by
//! ControllerPublishVolume's publish_context, really mounted on this node.
//!
//! - NFS: `mount -t nfs` of the export at the staging path.
//! - hostPath / local: a bind mount of the path, when it exists on this node
//!   and is not a system tree, csi-relay's state, the plugins dir or an
//!   ancestor of the staging path (the paths come from another cluster).
//! - CSI: the member driver's own node plugin on this node does the work;
//!   csi-relay forwards the node calls to it (see `member_plugin`).
//!
//! A node plugin (`--mode node`) has its own store and never sees the
//! controller's records. NodeStageVolume of a volume it has no record of
//! creates a *node-local record* from the request: Ready, created for the
//! requested capability, marked with [`NODE_LOCAL`] in its parameters, and
//! with this node's attachment holding the publish_context (which the
//! controller hands out only after NODE_READY, so it stands for
//! ControllerPublishVolume). From then on the usual state machine, intent /
//! commit and restart reconciliation apply; when the node stops using the
//! volume (last NodeUnstage, or a failed first stage) the record is dropped.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};

use crate::backend::{Health, NodeSource};
use crate::capability::Capability;
use crate::driver::{now, Driver};
use crate::error::{CsiError, CsiResult};
use crate::member::source::{self, MemberSource, SourceKind};
use crate::mount::{mountinfo, nfs, syscalls, target_path};
use crate::node::member_plugin::{MemberCsiVolume, MemberPlugin, Secrets};
use crate::node::mounter;
use crate::volume::{Attachment, Backing, Lifecycle, NodeRecord, Volume};

/// `parameters` key marking a record this node made from a NodeStage
/// request (value "true").
pub const NODE_LOCAL: &str = "relay.csi.dev/node-local";

/// The source types this node can mount.
const SOURCE_TYPES: &[&str] = &["nfs", "hostPath", "local", "csi"];

pub fn is_node_local(vol: &Volume) -> bool {
    vol.parameters.get(NODE_LOCAL).is_some_and(|v| v == "true")
}

/// Whether `node_id` stages or publishes `vol`.
pub fn in_use(vol: &Volume, node_id: &str) -> bool {
    vol.node(node_id)
        .is_some_and(|n| n.stage.is_some() || !n.targets.is_empty())
}

/// Decodes a member publish_context: FAILED_PRECONDITION naming a source
/// type this node cannot mount, INVALID_ARGUMENT naming a missing or
/// malformed key.
pub fn decode(context: &BTreeMap<String, String>) -> CsiResult<MemberSource> {
    if let Some(t) = context.get(source::SOURCE_TYPE) {
        if !SOURCE_TYPES.contains(&t.as_str()) {
            return Err(CsiError::FailedPrecondition(format!(
                "member volume source type {t:?} cannot be mounted by csi-relay on this node (supported: {})",
                SOURCE_TYPES.join(", ")
            )));
        }
    }
    MemberSource::from_context(context)
}

/// The member source `vol` has on `node_id`: this node's attachment's
/// publish_context when it describes one, else what the backend says of a
/// member-backed record. `None` for every other volume.
pub fn source_of(d: &Driver, vol: &Volume, node_id: &str) -> CsiResult<Option<MemberSource>> {
    let context = vol
        .node(node_id)
        .and_then(|n| n.attachment.as_ref())
        .map(|a| &a.publish_context)
        .filter(|c| c.contains_key(source::SOURCE_TYPE));
    if let Some(c) = context {
        return decode(c).map(Some);
    }
    if is_node_local(vol) {
        return Err(CsiError::Internal(format!(
            "node-local record of volume {:?} has lost its member publish_context",
            vol.id
        )));
    }
    match &vol.backing {
        Backing::Member { .. } => match d.backend.node_source(vol)? {
            NodeSource::Member(m) => Ok(Some(*m)),
            _ => Ok(None),
        },
        _ => Ok(None),
    }
}

/// The node-local record NodeStageVolume creates for `id`, which this
/// node's store does not hold. Only a node plugin (no controller sharing
/// the store) makes one, and only from a member publish_context.
pub fn adopt(
    d: &Driver,
    id: &str,
    publish_context: &HashMap<String, String>,
    volume_context: &HashMap<String, String>,
    cap: &Capability,
) -> CsiResult<Volume> {
    let node_id = &d.config.node_id;
    if d.config.mode.controller() {
        return Err(CsiError::VolumeNotFound(id.to_string()));
    }
    if !MemberSource::present(publish_context) {
        if d.backend.kind() == "member" {
            return Err(CsiError::FailedPrecondition(format!(
                "volume {id:?} is not published to node {node_id:?}: NodeStageVolume needs the publish_context of a successful ControllerPublishVolume"
            )));
        }
        return Err(CsiError::VolumeNotFound(id.to_string()));
    }
    let context: BTreeMap<String, String> = publish_context.clone().into_iter().collect();
    let m = decode(&context)?;
    let (secs, _) = now();
    let attribute = |key: &str| volume_context.get(key).cloned().unwrap_or_default();
    let node = NodeRecord {
        attachment: Some(Attachment {
            readonly: m.read_only,
            capability: cap.clone(),
            publish_context: context,
        }),
        stage: None,
        targets: BTreeMap::new(),
    };
    Ok(Volume {
        id: id.to_string(),
        name: format!("node-local/{id}"),
        capacity_bytes: 0,
        backing: Backing::Member {
            member: m.member.clone(),
            namespace: attribute(source::MEMBER_NAMESPACE),
            pvc: attribute(source::MEMBER_PVC),
            selected_node: m.member_node.clone(),
        },
        capabilities: vec![cap.clone()],
        parameters: [(NODE_LOCAL.to_string(), "true".to_string())].into(),
        mutable_parameters: BTreeMap::new(),
        source: None,
        topology: Vec::new(),
        context: volume_context.clone().into_iter().collect(),
        created_unix: secs,
        lifecycle: Lifecycle::Ready,
        ephemeral: false,
        nodes: [(node_id.clone(), node)].into(),
    })
}

/// Commits `vol`, or drops it when it is a node-local record `node_id` no
/// longer uses.
pub async fn commit(d: &Driver, vol: &Volume, node_id: &str) -> CsiResult<()> {
    if is_node_local(vol) && !in_use(vol, node_id) {
        d.remove_volume(vol).await?;
        tracing::info!(volume_id = %vol.id, "node-local member record dropped");
        Ok(())
    } else {
        // The outcome of node work (a removal, a rollback): what the mount
        // table witnesses needs no fsync of its own.
        d.put_outcome(vol).await
    }
}

/// The health NodeGetVolumeStats reports for a node-local record: this
/// node knows the member source only, the member cluster is the
/// controller's to watch.
pub fn health(m: &MemberSource) -> Health {
    Health {
        abnormal: false,
        message: format!(
            "member cluster {}: PersistentVolume {} ({} source)",
            m.member,
            m.pv,
            m.kind.name()
        ),
    }
}

fn refused(m: &MemberSource, why: impl std::fmt::Display) -> CsiError {
    CsiError::FailedPrecondition(format!(
        "member cluster {}: PersistentVolume {}: {why}",
        m.member, m.pv
    ))
}

/// A hostPath / local path from the member cluster, resolved and checked:
/// it must exist here as a directory, and neither lie in a system tree nor
/// overlap csi-relay's state, the plugins dir or the staging path.
fn host_dir(d: &Driver, m: &MemberSource, path: &str, staging: &Path) -> CsiResult<PathBuf> {
    let kind = m.kind.name();
    let p = Path::new(path);
    if !p.is_absolute() {
        return Err(refused(m, format!("{kind} path {path:?} is not absolute")));
    }
    if let Err(e) = std::fs::metadata(p) {
        return Err(if e.kind() == io::ErrorKind::NotFound {
            refused(m, format!("{kind} path {path} does not exist on this node"))
        } else {
            CsiError::io("stat member path", p, e)
        });
    }
    let resolved = target_path::check(p).map_err(|e| match e.kind() {
        io::ErrorKind::PermissionDenied => {
            refused(m, format!("{kind} path {path} is refused: {e}"))
        }
        _ => CsiError::io("resolve member path", p, e),
    })?;
    let protected = [
        (d.config.state_dir.as_path(), "csi-relay's state directory"),
        (d.plugins_dir.as_path(), "the CSI plugins directory"),
        (staging, "the staging path"),
    ];
    for (dir, what) in protected {
        let dir = target_path::resolve(dir).map_err(|e| CsiError::io("resolve", dir, e))?;
        if resolved.starts_with(&dir) || dir.starts_with(&resolved) {
            return Err(refused(
                m,
                format!(
                    "{kind} path {path} is refused: it resolves to {}, which overlaps {what} {}",
                    resolved.display(),
                    dir.display()
                ),
            ));
        }
    }
    if !resolved.is_dir() {
        return Err(refused(
            m,
            format!("{kind} path {path} is not a directory on this node"),
        ));
    }
    Ok(resolved)
}

fn mount_access_only(m: &MemberSource, cap: &Capability) -> CsiResult<()> {
    if cap.is_block() {
        return Err(CsiError::invalid(
            "volume_capability",
            format!(
                "member PersistentVolume {} is a {} volume: it can be staged for mount access only",
                m.pv,
                m.kind.name()
            ),
        ));
    }
    Ok(())
}

async fn stage_nfs(
    m: &MemberSource,
    server: &str,
    export: &str,
    staging: &Path,
    cap: &Capability,
    readonly: bool,
) -> CsiResult<()> {
    mount_access_only(m, cap)?;
    let staging = mounter::guard(staging, "staging_target_path")?;
    let mut options = m.mount_options.clone();
    options.extend(cap.mount_flags().iter().cloned());
    let args =
        nfs::mount_args(server, export, &options, readonly, &staging).map_err(|w| refused(m, w))?;
    mounter::ensure_dir(&staging)?;
    let current = mountinfo::mounted_at(&staging)
        .map_err(|e| CsiError::io("read mountinfo for", &staging, e))?;
    if let Some(entry) = current {
        return if nfs::is_export(&entry.fs_type, &entry.source, server, export) {
            Ok(())
        } else {
            Err(CsiError::FailedPrecondition(format!(
                "{} is already a mount point of {} ({}), not of NFS export {}; it must be unmounted first",
                staging.display(),
                entry.source,
                entry.fs_type,
                nfs::device(server, export)
            )))
        };
    }
    if !nfs::helper_installed() {
        return Err(CsiError::FailedPrecondition(format!(
            "nfs-common not installed on this node: {} is needed to mount NFS export {} of member PersistentVolume {}",
            nfs::HELPER,
            nfs::device(server, export),
            m.pv
        )));
    }
    if let Err(e) = nfs::mount(&args).await {
        // A mount that completed after its helper was killed is ours: the
        // staging path was not a mount point before.
        let _ = syscalls::unmount_all(&staging);
        return Err(CsiError::io("mount NFS export at", &staging, e));
    }
    Ok(())
}

/// The member Secret a member driver's call needs, read from the member
/// (the reference came through the publish_context; only names are logged).
async fn secrets_for(d: &Driver, member: &str, reference: Option<&str>) -> CsiResult<Secrets> {
    match reference {
        None => Ok(Secrets::default()),
        Some(r) => Ok(Secrets::new(d.backend.node_secret(member, r).await?)),
    }
}

async fn plugin(d: &Driver, v: &MemberCsiVolume<'_>) -> CsiResult<MemberPlugin> {
    MemberPlugin::connect(&d.plugins_dir, v.driver).await
}

/// Stages the member source at `staging`.
pub async fn stage(
    d: &Driver,
    m: &MemberSource,
    staging: &Path,
    cap: &Capability,
    readonly: bool,
) -> CsiResult<()> {
    match &m.kind {
        SourceKind::Nfs { server, path } => {
            stage_nfs(m, server, path, staging, cap, readonly).await
        }
        SourceKind::HostPath { path, .. } | SourceKind::Local { path, .. } => {
            mount_access_only(m, cap)?;
            let dir = host_dir(d, m, path, staging)?;
            mounter::stage(&NodeSource::Directory(dir), staging, cap, "", readonly)
                .await
                .map(|_| ())
        }
        SourceKind::Csi { .. } => {
            let v = csi_volume(m)?;
            let p = plugin(d, &v).await?;
            mounter::guard(staging, "staging_target_path")?;
            let secrets = secrets_for(d, v.member, v.stage_secret).await?;
            p.stage(&v, staging, cap, secrets).await
        }
    }
}

fn csi_volume(m: &MemberSource) -> CsiResult<MemberCsiVolume<'_>> {
    MemberCsiVolume::of(m).ok_or_else(|| {
        CsiError::Internal(format!(
            "member PersistentVolume {} is not a CSI volume",
            m.pv
        ))
    })
}

/// Reverses [`stage`]. Nothing staged is success.
pub async fn unstage(
    d: &Driver,
    m: &MemberSource,
    staging: &Path,
    cap: &Capability,
) -> CsiResult<()> {
    match MemberCsiVolume::of(m) {
        Some(v) => {
            mounter::guard(staging, "staging_target_path")?;
            let undone = match plugin(d, &v).await {
                Ok(p) => p.unstage(&v, staging).await,
                Err(e) => Err(e),
            };
            nothing_left(undone, staging, &v)
        }
        None => mounter::unstage(&NodeSource::Member(Box::new(m.clone())), staging, cap).await,
    }
}

/// NodePublishVolume through the member CSI plugin.
pub async fn publish_proxied(
    d: &Driver,
    v: &MemberCsiVolume<'_>,
    staging: &Path,
    target: &Path,
    cap: &Capability,
    readonly: bool,
) -> CsiResult<()> {
    let p = plugin(d, v).await?;
    let target = mounter::guard(target, "target_path")?;
    let secrets = secrets_for(d, v.member, v.publish_secret).await?;
    p.publish(v, staging, &target, cap, readonly, secrets).await
}

/// NodeUnpublishVolume through the member CSI plugin.
pub async fn unpublish_proxied(
    d: &Driver,
    v: &MemberCsiVolume<'_>,
    target: &Path,
) -> CsiResult<()> {
    let target = mounter::guard(target, "target_path")?;
    let undone = match plugin(d, v).await {
        Ok(p) => p.unpublish(v, &target).await,
        Err(e) => Err(e),
    };
    nothing_left(undone, &target, v)?;
    // What the plugin would have done last: the target goes.
    mounter::unpublish(&target)
}

/// An unpublish or unstage the member plugin cannot do because the member
/// volume, or the plugin itself, is gone, still succeeds when nothing is
/// mounted at the path: otherwise kubelet would retry it for ever and
/// never clean the pod up. A path still mounted keeps the error.
fn nothing_left(undone: CsiResult<()>, path: &Path, v: &MemberCsiVolume<'_>) -> CsiResult<()> {
    match undone {
        Err(e)
            if matches!(e.code(), tonic::Code::NotFound | tonic::Code::Unavailable)
                && !mounter::is_mounted(path) =>
        {
            tracing::warn!(driver = v.driver, path = %path.display(), error = %e, "member volume or plugin gone, and nothing is mounted: done");
            Ok(())
        }
        other => other,
    }
}

/// NodeGetVolumeStats through the member CSI plugin, when it offers it.
pub async fn stats_proxied(
    d: &Driver,
    v: &MemberCsiVolume<'_>,
    path: &Path,
    staging: Option<&Path>,
) -> CsiResult<Option<crate::csi::NodeGetVolumeStatsResponse>> {
    plugin(d, v).await?.stats(v, path, staging).await
}

/// NodeExpandVolume through the member CSI plugin, when it offers it.
pub async fn expand_proxied(
    d: &Driver,
    v: &MemberCsiVolume<'_>,
    path: &Path,
    staging: Option<&Path>,
    capacity: Option<crate::csi::CapacityRange>,
    cap: Option<&Capability>,
) -> CsiResult<Option<i64>> {
    plugin(d, v)
        .await?
        .expand(v, path, staging, capacity, cap)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn unknown_source_types_are_a_failed_precondition_naming_them() {
        let c = context(&[
            (source::SOURCE_TYPE, "iscsi"),
            (source::MEMBER, "east"),
            (source::MEMBER_PV, "pv-1"),
        ]);
        let err = decode(&c).unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(err.to_string().contains("\"iscsi\""), "{err}");
    }

    #[test]
    fn known_source_types_decode() {
        let c = context(&[
            (source::SOURCE_TYPE, "hostPath"),
            (source::MEMBER, "east"),
            (source::MEMBER_PV, "pv-1"),
            (source::HOST_PATH, "/data/x"),
        ]);
        let m = decode(&c).unwrap();
        assert_eq!(
            m.kind,
            SourceKind::HostPath {
                path: "/data/x".into(),
                type_: None
            }
        );
        let mut broken = c.clone();
        broken.remove(source::HOST_PATH);
        assert_eq!(
            decode(&broken).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn block_access_is_refused_for_mounted_sources() {
        let m = MemberSource {
            member: "east".into(),
            pv: "pv-1".into(),
            member_node: None,
            read_only: false,
            mount_options: vec![],
            kind: SourceKind::Nfs {
                server: "s".into(),
                path: "/e".into(),
            },
        };
        let block = Capability {
            mode: crate::capability::AccessMode::SingleNodeWriter,
            access: crate::capability::AccessType::Block,
        };
        let err = mount_access_only(&m, &block).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.to_string().contains("nfs"), "{err}");
    }
}
