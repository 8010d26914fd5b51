//! A member PV of a CSI driver: csi-relay is a proxy, and every node call
//! is forwarded to the member driver's own node plugin on this node (see
//! `node::member_plugin` for how it is found and what it is told). The
//! plugin's mounts and layout are its own; this node only checks the paths
//! it is handed and cleans a target up the way the plugin would have.

use std::path::Path;

use super::member_pv::MemberPv;
use super::{is_mounted, Expansion, Publishing, Source, Staging};
use crate::backends::Health;
use crate::csi;
use crate::domain::capability::Capability;
use crate::domain::error::{CsiError, CsiResult};
use crate::ops::driver::Driver;
use crate::ops::node::member_plugin::{MemberCsiVolume, MemberPlugin, Secrets};
use crate::ops::node::paths::guard;

pub struct CsiProxy {
    pub member: MemberPv,
    /// Where the plugins are, and the backend that reads member Secrets.
    pub driver: Driver,
}

impl CsiProxy {
    fn volume(&self) -> CsiResult<MemberCsiVolume<'_>> {
        MemberCsiVolume::of(&self.member.source).ok_or_else(|| {
            CsiError::Internal(format!(
                "member PersistentVolume {} is not a CSI volume",
                self.member.source.pv
            ))
        })
    }

    async fn plugin(&self, v: &MemberCsiVolume<'_>) -> CsiResult<MemberPlugin> {
        MemberPlugin::connect(&self.driver.plugins_dir, v.driver).await
    }

    /// The member Secret a member driver's call needs, read from the member
    /// (the reference came through the publish_context; only names are
    /// logged).
    async fn secrets(&self, member: &str, reference: Option<&str>) -> CsiResult<Secrets> {
        match reference {
            None => Ok(Secrets::default()),
            Some(r) => Ok(Secrets::new(
                self.driver.backend.node_secret(member, r).await?,
            )),
        }
    }
}

/// An unpublish or unstage the member plugin cannot do because the member
/// volume, or the plugin itself, is gone, still succeeds when nothing is
/// mounted at the path: otherwise kubelet would retry it for ever and
/// never clean the pod up. A path still mounted keeps the error.
fn nothing_left(undone: CsiResult<()>, path: &Path, v: &MemberCsiVolume<'_>) -> CsiResult<()> {
    match undone {
        Err(e)
            if (e.is_not_found() || matches!(e, CsiError::Unavailable(_))) && !is_mounted(path) =>
        {
            tracing::warn!(driver = v.driver, path = %path.display(), error = %e, "member volume or plugin gone, and nothing is mounted: done");
            Ok(())
        }
        other => other,
    }
}

#[async_trait::async_trait]
impl Source for CsiProxy {
    async fn stage(&self, at: Staging<'_>) -> CsiResult<Option<String>> {
        let v = self.volume()?;
        let p = self.plugin(&v).await?;
        guard(at.path, "staging_target_path")?;
        let secrets = self.secrets(v.member, v.stage_secret).await?;
        p.stage(&v, at.path, at.cap, secrets).await.map(|()| None)
    }

    async fn unstage(&self, staging: &Path, _cap: &Capability) -> CsiResult<()> {
        let v = self.volume()?;
        guard(staging, "staging_target_path")?;
        let undone = match self.plugin(&v).await {
            Ok(p) => p.unstage(&v, staging).await,
            Err(e) => Err(e),
        };
        nothing_left(undone, staging, &v)
    }

    async fn publish(&self, p: Publishing<'_>) -> CsiResult<()> {
        let staging = p.staging.ok_or_else(|| super::not_staged(p.volume_id))?;
        let v = self.volume()?;
        let plugin = self.plugin(&v).await?;
        let target = guard(p.target, "target_path")?;
        let secrets = self.secrets(v.member, v.publish_secret).await?;
        plugin
            .publish(&v, staging, &target, p.cap, p.readonly, secrets)
            .await
    }

    async fn unpublish(&self, target: &Path) -> CsiResult<()> {
        let v = self.volume()?;
        let target = guard(target, "target_path")?;
        let undone = match self.plugin(&v).await {
            Ok(p) => p.unpublish(&v, &target).await,
            Err(e) => Err(e),
        };
        nothing_left(undone, &target, &v)?;
        // What the plugin would have done last: the target goes.
        super::bind::unpublish(&target)
    }

    /// Only a staging path that is no mount point at all counts as lost:
    /// the plugin's layout is its own, and asking it again is harmless.
    fn is_staged(&self, staging: &Path, _cap: &Capability) -> bool {
        is_mounted(staging)
    }

    fn delegates(&self) -> bool {
        true
    }

    async fn forwarded_stats(
        &self,
        target: &Path,
        staging: Option<&Path>,
    ) -> CsiResult<Option<csi::NodeGetVolumeStatsResponse>> {
        let v = self.volume()?;
        self.plugin(&v).await?.stats(&v, target, staging).await
    }

    fn own_health(&self) -> Option<Health> {
        self.member.own_health()
    }

    /// The volume grows in the member cluster; its plugin may have a
    /// filesystem to grow here.
    async fn expand(&self, e: Expansion<'_>) -> CsiResult<i64> {
        let v = self.volume()?;
        let cap = match e.capability {
            Some(c) => Some(Capability::from_wire(c, "volume_capability")?),
            None => e.stage.map(|s| s.capability.clone()),
        };
        let staging = e.stage.map(|s| Path::new(&s.path));
        let grown = self
            .plugin(&v)
            .await?
            .expand(&v, e.path, staging, e.capacity_range, cap.as_ref())
            .await?;
        Ok(grown.unwrap_or_else(|| e.as_recorded_or_requested()))
    }
}
