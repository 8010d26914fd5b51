//! A member PV's NFS export, mounted here with `mount -t nfs` at the
//! staging path and bound from there to each target.

use super::member_pv::MemberPv;
use super::{bind, Expansion, Source, Staging};
use crate::backends::Health;
use crate::domain::error::{CsiError, CsiResult};
use crate::ops::node::paths::guard;
use crate::os::{mountinfo, nfs, syscalls};

#[derive(Debug, Clone)]
pub struct Nfs {
    pub member: MemberPv,
    pub server: String,
    pub export: String,
}

#[async_trait::async_trait]
impl Source for Nfs {
    async fn stage(&self, at: Staging<'_>) -> CsiResult<Option<String>> {
        let m = &self.member;
        let (server, export) = (self.server.as_str(), self.export.as_str());
        m.mount_access_only(at.cap)?;
        let staging = guard(at.path, "staging_target_path")?;
        let mut options = m.source.mount_options.clone();
        options.extend(at.cap.mount_flags().iter().cloned());
        let args = nfs::mount_args(server, export, &options, at.readonly, &staging)
            .map_err(|w| m.refused(w))?;
        bind::ensure_dir(&staging)?;
        let current = mountinfo::mounted_at(&staging)
            .map_err(|e| CsiError::io("read mountinfo for", &staging, e))?;
        if let Some(entry) = current {
            return if nfs::is_export(&entry.fs_type, &entry.source, server, export) {
                Ok(None)
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
                m.source.pv
            )));
        }
        if let Err(e) = nfs::mount(&args).await {
            // A mount that completed after its helper was killed is ours: the
            // staging path was not a mount point before.
            let _ = syscalls::unmount_all(&staging);
            return Err(CsiError::io("mount NFS export at", &staging, e));
        }
        Ok(None)
    }

    fn own_health(&self) -> Option<Health> {
        self.member.own_health()
    }

    /// An export grows on its server; this node has nothing to do.
    async fn expand(&self, e: Expansion<'_>) -> CsiResult<i64> {
        Ok(e.as_recorded_or_requested())
    }
}
