//! A directory on this node (the local backend's directory volumes and
//! inline ephemeral volumes): bind-mounted, for mount access only.

use std::path::PathBuf;

use super::{bind, Expansion, Publishing, Source, Staging};
use crate::domain::error::CsiResult;

#[derive(Debug, Clone)]
pub struct Directory {
    dir: PathBuf,
}

impl Directory {
    pub fn new(dir: PathBuf) -> Self {
        Directory { dir }
    }

    /// A source whose only use is tearing down what is mounted at our
    /// paths, when the volume's own source can no longer be described:
    /// unstaging and unpublishing a directory never reads its path.
    pub fn teardown_only() -> Self {
        Directory {
            dir: PathBuf::new(),
        }
    }
}

#[async_trait::async_trait]
impl Source for Directory {
    async fn stage(&self, at: Staging<'_>) -> CsiResult<Option<String>> {
        bind::stage_dir(&self.dir, at.path, at.cap, at.readonly).map(|()| None)
    }

    async fn publish(&self, p: Publishing<'_>) -> CsiResult<()> {
        match p.staging {
            Some(staging) => {
                bind::publish_staged(p.volume_id, staging, p.target, p.cap, p.readonly)
            }
            // An inline volume is never staged: its directory is the source.
            None => bind::publish(&self.dir, p.target, p.cap, p.readonly),
        }
    }

    /// A directory has no device or filesystem of its own to grow.
    async fn expand(&self, e: Expansion<'_>) -> CsiResult<i64> {
        Ok(e.capacity_bytes as i64)
    }
}
