//! What this node mounts for a volume record, and the stage / publish work
//! for it: the backend's node source (local directories and block files,
//! done by `mounter`), or a member PV's source (done by `member`: NFS and
//! bind mounts here, CSI volumes through the member driver's node plugin).

use std::path::{Path, PathBuf};

use crate::backend::NodeSource;
use crate::capability::Capability;
use crate::driver::Driver;
use crate::error::{CsiError, CsiResult};
use crate::node::member_plugin::MemberCsiVolume;
use crate::node::{ephemeral, member, mounter};
use crate::volume::{Backing, Volume};

/// The source `vol` is staged and published from on `node_id`.
pub fn of(d: &Driver, vol: &Volume, node_id: &str) -> CsiResult<NodeSource> {
    match member::source_of(d, vol, node_id)? {
        Some(m) => Ok(NodeSource::Member(Box::new(m))),
        None => d.backend.node_source(vol),
    }
}

/// The source to unpublish and unstage with. A member volume whose source
/// description is gone (a controller sharing the store force-detached it
/// first) is torn down by unmounting what is mounted at our paths.
pub fn for_teardown(d: &Driver, vol: &Volume, node_id: &str) -> CsiResult<NodeSource> {
    match of(d, vol, node_id) {
        Ok(s) => Ok(s),
        Err(e) if matches!(vol.backing, Backing::Member { .. }) && !member::is_node_local(vol) => {
            tracing::warn!(volume_id = %vol.id, error = %e, "member source unknown; unmounting locally");
            // A directory source's teardown is a plain unmount; its path is unused.
            Ok(NodeSource::Directory(PathBuf::new()))
        }
        Err(e) => Err(e),
    }
}

/// The member CSI volume behind `source`, when its node plugin does the work.
pub fn proxied(source: &NodeSource) -> Option<MemberCsiVolume<'_>> {
    match source {
        NodeSource::Member(m) => MemberCsiVolume::of(m),
        _ => None,
    }
}

/// Whether a finished stage's mount is still there. For a member CSI
/// volume only a staging path that is no mount point at all counts as
/// lost: the plugin's layout is its own, and asking it again is harmless.
pub fn staged(source: &NodeSource, staging: &Path, cap: &Capability) -> bool {
    match source {
        NodeSource::Member(_) => mounter::is_mounted(staging),
        _ => mounter::is_mounted(&mounter::staged_source(staging, cap)),
    }
}

/// Stages `source` at `staging`; returns the loop device used, if any.
pub async fn stage(
    d: &Driver,
    source: &NodeSource,
    staging: &Path,
    cap: &Capability,
    default_fs: &str,
    readonly: bool,
) -> CsiResult<Option<String>> {
    match source {
        NodeSource::Member(m) => member::stage(d, m, staging, cap, readonly)
            .await
            .map(|()| None),
        other => mounter::stage(other, staging, cap, default_fs, readonly).await,
    }
}

/// Reverses [`stage`]. Nothing staged is success.
pub async fn unstage(
    d: &Driver,
    source: &NodeSource,
    staging: &Path,
    cap: &Capability,
) -> CsiResult<()> {
    match source {
        NodeSource::Member(m) => member::unstage(d, m, staging, cap).await,
        other => mounter::unstage(other, staging, cap).await,
    }
}

/// Publishes `vol` at `target`: a bind mount from its staging path (or an
/// ephemeral volume's directory), or NodePublishVolume through the member
/// CSI plugin.
pub async fn publish(
    d: &Driver,
    source: &NodeSource,
    vol: &Volume,
    staging: Option<&Path>,
    target: &Path,
    cap: &Capability,
    readonly: bool,
) -> CsiResult<()> {
    if vol.ephemeral {
        let from = ephemeral::data_dir(d, vol)?;
        return mounter::publish(&from, target, cap, readonly);
    }
    let staging = staging.ok_or_else(|| {
        CsiError::Internal(format!("volume {:?}: publication without stage", vol.id))
    })?;
    if let Some(v) = proxied(source) {
        return member::publish_proxied(d, &v, staging, target, cap, readonly).await;
    }
    let from = mounter::staged_source(staging, cap);
    // Binding a staging path whose mount is gone would hand the workload an
    // empty directory on the node's own disk instead of the volume.
    if !mounter::is_mounted(&from) {
        return Err(CsiError::FailedPrecondition(format!(
            "volume {:?} is recorded as staged at {} but nothing is mounted at {}; \
             NodeStageVolume must be repeated first",
            vol.id,
            staging.display(),
            from.display()
        )));
    }
    mounter::publish(&from, target, cap, readonly)
}

/// Reverses [`publish`]: the target is unmounted and removed (by the member
/// CSI plugin for its volumes). Absent is success.
pub async fn unpublish(d: &Driver, source: &NodeSource, target: &Path) -> CsiResult<()> {
    match proxied(source) {
        Some(v) => member::unpublish_proxied(d, &v, target).await,
        None => mounter::unpublish(target),
    }
}
