//! What this node mounts a volume from. Each kind of source is one type
//! behind [`Source`], which owns all node-side work on it: stage, publish,
//! their reversal, what restart reconciliation needs to restore them,
//! stats and expansion. The RPC code around it validates the request, asks
//! `state` what it means, commits the intent, calls the source and commits
//! the outcome; it never looks at what kind of source it holds.
//!
//! [`resolve`] is the one place that decides the kind from a volume record.

pub mod bind;
pub mod block_file;
pub mod csi_proxy;
pub mod directory;
pub mod host_path;
pub mod member_pv;
pub mod nfs;
pub mod resolve;

use std::path::Path;

use crate::backends::Health;
use crate::csi;
use crate::domain::capability::Capability;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::volume::Stage;

pub use bind::{is_mounted, staged_source, BLOCK_DEVICE_FILE};
pub use resolve::{for_restore, for_teardown, of};

/// A NodeStageVolume (or its restoration after a restart).
#[derive(Debug, Clone, Copy)]
pub struct Staging<'a> {
    pub path: &'a Path,
    pub cap: &'a Capability,
    /// Read-only for every publication: a reader-only access mode or a
    /// read-only attachment.
    pub readonly: bool,
}

/// A NodePublishVolume (or its restoration after a restart).
#[derive(Debug, Clone, Copy)]
pub struct Publishing<'a> {
    pub volume_id: &'a str,
    /// Where the volume is staged; `None` for an inline ephemeral volume,
    /// which is published straight from its own data.
    pub staging: Option<&'a Path>,
    pub target: &'a Path,
    pub cap: &'a Capability,
    pub readonly: bool,
}

/// A NodeExpandVolume at a path the volume is staged or published at.
#[derive(Debug, Clone, Copy)]
pub struct Expansion<'a> {
    pub volume_id: &'a str,
    /// The size the controller recorded.
    pub capacity_bytes: u64,
    pub path: &'a Path,
    pub stage: Option<&'a Stage>,
    pub capacity_range: Option<csi::CapacityRange>,
    /// The request's capability, as sent (only a forwarding source needs
    /// it, so only that one refuses a malformed one).
    pub capability: Option<&'a csi::VolumeCapability>,
}

impl Expansion<'_> {
    /// The answer when nothing on this node grows: the volume is as large
    /// as the controller says, or as asked.
    pub fn as_recorded_or_requested(&self) -> i64 {
        let requested = self
            .capacity_range
            .as_ref()
            .map_or(0, |r| r.required_bytes.max(0));
        requested.max(self.capacity_bytes.min(i64::MAX as u64) as i64)
    }
}

/// A source asked to publish without a staging path: only inline volumes
/// are, and they are directories.
fn not_staged(volume_id: &str) -> CsiError {
    CsiError::Internal(format!("volume {volume_id:?}: publication without stage"))
}

/// All node-side work on one kind of source. Every method is idempotent:
/// it looks at what is mounted before acting, so a retry (or the restart
/// reconciliation) finishes work a crash or a cancelled call cut short.
#[async_trait::async_trait]
pub trait Source: Send + Sync {
    /// Stages the volume; returns the loop device used, if any.
    async fn stage(&self, at: Staging<'_>) -> CsiResult<Option<String>>;

    /// Reverses [`Source::stage`]. Nothing staged is success. By default
    /// what stage mounted at the staging path is unmounted.
    async fn unstage(&self, staging: &Path, cap: &Capability) -> CsiResult<()> {
        bind::unstage(staging, cap)
    }

    /// By default a bind mount of the staged volume at the target.
    async fn publish(&self, p: Publishing<'_>) -> CsiResult<()> {
        let staging = p.staging.ok_or_else(|| not_staged(p.volume_id))?;
        bind::publish_staged(p.volume_id, staging, p.target, p.cap, p.readonly)
    }

    /// Reverses [`Source::publish`]: the target is unmounted and removed.
    /// Absent is success.
    async fn unpublish(&self, target: &Path) -> CsiResult<()> {
        bind::unpublish(target)
    }

    /// Whether a finished stage's mount is still there (a repeated stage
    /// answers at once; a restart restores what is not).
    fn is_staged(&self, staging: &Path, cap: &Capability) -> bool {
        is_mounted(&staged_source(staging, cap))
    }

    /// Whether a finished publication's mount is still there.
    fn is_published(&self, target: &Path) -> bool {
        is_mounted(target)
    }

    /// The device a stage the mount table shows finished uses, for a
    /// record whose outcome commit a crash lost.
    fn staged_device(&self) -> Option<String> {
        None
    }

    /// Whether another plugin does the mount work, with a layout of its
    /// own: a stage whose mount is not seen is then asked again as a
    /// matter of course, not restored.
    fn delegates(&self) -> bool {
        false
    }

    /// NodeGetVolumeStats at a target as the volume's own driver answers
    /// it, when there is one that does.
    async fn forwarded_stats(
        &self,
        _target: &Path,
        _staging: Option<&Path>,
    ) -> CsiResult<Option<csi::NodeGetVolumeStatsResponse>> {
        Ok(None)
    }

    /// The health this node knows by itself; `None` leaves it to the
    /// backend.
    fn own_health(&self) -> Option<Health> {
        None
    }

    /// Bytes of a raw-block volume's data, when this node can tell.
    fn block_bytes(&self) -> Option<u64> {
        None
    }

    /// Makes the node see a volume the controller grew; the size to answer.
    async fn expand(&self, e: Expansion<'_>) -> CsiResult<i64>;
}
