//! What every service shares: settings, the state store, the backend and the
//! per-volume in-flight limiter.

use std::sync::Arc;

use crate::backend::Backend;
use crate::config::DriverConfig;
use crate::error::{CsiError, CsiResult};
use crate::limiter::Limiter;
use crate::store::{Store, StoreResult};
use crate::volume::Volume;

#[derive(Clone)]
pub struct Driver {
    pub config: Arc<DriverConfig>,
    pub store: Store,
    pub backend: Arc<dyn Backend>,
    pub limiter: Limiter,
}

impl Driver {
    pub fn new(config: DriverConfig, store: Store, backend: Arc<dyn Backend>) -> Self {
        Driver {
            config: Arc::new(config),
            store,
            backend,
            limiter: Limiter::default(),
        }
    }

    /// Runs a blocking store call on the blocking pool.
    pub async fn db<T, F>(&self, f: F) -> CsiResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> StoreResult<T> + Send + 'static,
    {
        Ok(self.store.run(f).await?)
    }

    /// The volume record, or NOT_FOUND naming the id.
    pub async fn volume(&self, id: &str) -> CsiResult<Volume> {
        let key = id.to_string();
        self.db(move |s| s.volume(&key))
            .await?
            .ok_or_else(|| CsiError::VolumeNotFound(id.to_string()))
    }

    pub async fn put_volume(&self, vol: &Volume) -> CsiResult<()> {
        let vol = vol.clone();
        self.db(move |s| s.put_volume(&vol)).await
    }
}

/// Seconds and nanoseconds since the epoch, for records' creation times.
pub fn now() -> (i64, i32) {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_secs() as i64, d.subsec_nanos() as i32)
}

impl Driver {
    /// The node-local path of a volume's data (directory or block file).
    pub fn backend_path(&self, vol: &Volume) -> CsiResult<std::path::PathBuf> {
        match self.backend.node_source(vol)? {
            crate::backend::NodeSource::Directory(p) | crate::backend::NodeSource::BlockFile(p) => {
                Ok(p)
            }
        }
    }
}
