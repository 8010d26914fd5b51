//! A member PV's hostPath or local path, bind-mounted from this machine.
//! The path comes from another cluster, so it is taken only when it exists
//! here as a directory and is neither a system tree nor overlaps
//! csi-relay's state, the plugins dir or the staging path.

use std::io;
use std::path::{Path, PathBuf};

use super::member_pv::MemberPv;
use super::{bind, Expansion, Source, Staging};
use crate::backends::Health;
use crate::domain::error::{CsiError, CsiResult};
use crate::os::target_path::{self, PathError};

#[derive(Debug, Clone)]
pub struct HostPath {
    pub member: MemberPv,
    pub path: String,
    /// What the path must stay clear of.
    pub state_dir: PathBuf,
    pub plugins_dir: PathBuf,
}

impl HostPath {
    /// The path, resolved and checked against `staging`.
    fn dir(&self, staging: &Path) -> CsiResult<PathBuf> {
        let m = &self.member;
        let kind = m.source.kind.name();
        let path = self.path.as_str();
        let p = Path::new(path);
        if !p.is_absolute() {
            return Err(m.refused(format!("{kind} path {path:?} is not absolute")));
        }
        if let Err(e) = std::fs::metadata(p) {
            return Err(if e.kind() == io::ErrorKind::NotFound {
                m.refused(format!("{kind} path {path} does not exist on this node"))
            } else {
                CsiError::io("stat member path", p, e)
            });
        }
        let resolved = target_path::check(p).map_err(|e| match e {
            PathError::Resolve(io) if io.kind() != io::ErrorKind::PermissionDenied => {
                CsiError::io("resolve member path", p, io)
            }
            refused => m.refused(format!("{kind} path {path} is refused: {refused}")),
        })?;
        let protected = [
            (self.state_dir.as_path(), "csi-relay's state directory"),
            (self.plugins_dir.as_path(), "the CSI plugins directory"),
            (staging, "the staging path"),
        ];
        for (dir, what) in protected {
            let dir = target_path::resolve(dir).map_err(|e| CsiError::io("resolve", dir, e))?;
            if resolved.starts_with(&dir) || dir.starts_with(&resolved) {
                return Err(m.refused(format!(
                    "{kind} path {path} is refused: it resolves to {}, which overlaps {what} {}",
                    resolved.display(),
                    dir.display()
                )));
            }
        }
        if !resolved.is_dir() {
            return Err(m.refused(format!(
                "{kind} path {path} is not a directory on this node"
            )));
        }
        Ok(resolved)
    }
}

#[async_trait::async_trait]
impl Source for HostPath {
    async fn stage(&self, at: Staging<'_>) -> CsiResult<Option<String>> {
        self.member.mount_access_only(at.cap)?;
        let dir = self.dir(at.path)?;
        bind::stage_dir(&dir, at.path, at.cap, at.readonly).map(|()| None)
    }

    fn own_health(&self) -> Option<Health> {
        self.member.own_health()
    }

    /// A host directory has no size of its own to grow.
    async fn expand(&self, e: Expansion<'_>) -> CsiResult<i64> {
        Ok(e.as_recorded_or_requested())
    }
}
