//! Creates in one directory share the fsync that makes their names durable.
//!
//! Every new volume or snapshot is renamed into place and its directory
//! synced before CreateVolume answers. Under 64 concurrent creates that was
//! one directory fsync per call, one after the other (measured: a whole
//! fsync per lifecycle while the store's log needed half a sync). Here a
//! sync covers every rename made before it started, through the same group
//! commit the store uses: whoever arrives while one runs waits for the next,
//! which then serves all of them at once.

use std::fs;
use std::path::{Path, PathBuf};

use crate::domain::error::{CsiError, CsiResult};
use crate::store::group_commit::{GroupCommit, Round};
use crate::store::{StoreError, StoreResult};

struct SyncDir(PathBuf);

impl Round<()> for SyncDir {
    fn run(&self, changes: Vec<Option<()>>, _durable: bool) -> Vec<StoreResult<()>> {
        let synced = fs::File::open(&self.0).and_then(|f| f.sync_all());
        changes
            .iter()
            .map(|_| match &synced {
                Ok(()) => Ok(()),
                Err(e) => Err(StoreError::Worker(e.to_string())),
            })
            .collect()
    }
}

pub struct DirSync {
    dir: PathBuf,
    syncs: GroupCommit<()>,
}

impl DirSync {
    pub fn new(dir: &Path) -> Self {
        DirSync {
            dir: dir.to_path_buf(),
            syncs: GroupCommit::new(Box::new(SyncDir(dir.to_path_buf()))),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Returns once a sync of the directory that began after this call did
    /// has finished: every entry changed before the call is then durable.
    pub fn sync(&self) -> CsiResult<()> {
        self.syncs.submit((), true).map_err(|e| {
            let reason = match e {
                StoreError::Worker(reason) => reason,
                other => other.to_string(),
            };
            CsiError::io("fsync directory", &self.dir, std::io::Error::other(reason))
        })
    }

    /// Directory syncs made so far (each may have served many callers).
    pub fn syncs(&self) -> u64 {
        self.syncs.rounds()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::status::CsiCode;

    #[test]
    fn each_call_waits_for_a_sync_begun_after_it_and_a_missing_directory_is_an_io_error() {
        let tmp = tempfile::tempdir().unwrap();
        let sync = std::sync::Arc::new(DirSync::new(tmp.path()));
        // One after another, no sync can serve a later call: one each.
        for n in 1..=3 {
            sync.sync().unwrap();
            assert_eq!(sync.syncs(), n);
        }
        // Together, every caller returns Ok (sharing itself is proved by
        // group_commit's tests, behind a sync slow enough to queue on).
        let callers: Vec<_> = (0..16)
            .map(|_| {
                let sync = sync.clone();
                std::thread::spawn(move || sync.sync())
            })
            .collect();
        for c in callers {
            c.join().unwrap().unwrap();
        }
        assert!((4..=19).contains(&sync.syncs()), "{}", sync.syncs());

        let gone = DirSync::new(&tmp.path().join("gone"));
        let e = gone.sync().unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal, "{e}");
        assert!(e.to_string().contains("gone"), "{e}");
    }
}
