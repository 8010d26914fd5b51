//! What every service shares: settings, the state store, the backend and the
//! per-volume in-flight limiter.

use std::path::PathBuf;
use std::sync::Arc;

use crate::backend::Backend;
use crate::config::DriverConfig;
use crate::error::{CsiError, CsiResult};
use crate::limiter::Limiter;
use crate::store::{Store, StoreResult};
use crate::volume::Volume;

/// Told about every committed volume change, after the commit (for example
/// to mirror volume state into a Kubernetes custom resource). Failures are
/// the observer's to log: the store is the source of truth.
#[tonic::async_trait]
pub trait VolumeObserver: Send + Sync + 'static {
    async fn changed(&self, vol: &Volume);
    async fn removed(&self, vol: &Volume);
}

#[derive(Clone)]
pub struct Driver {
    pub config: Arc<DriverConfig>,
    pub store: Store,
    pub backend: Arc<dyn Backend>,
    pub limiter: Limiter,
    pub observers: Vec<Arc<dyn VolumeObserver>>,
    /// Where other CSI drivers' node plugins listen on this node
    /// (`<dir>/<driver name>/csi.sock`): member PVs of those drivers are
    /// served through them.
    pub plugins_dir: PathBuf,
}

impl Driver {
    pub fn new(config: DriverConfig, store: Store, backend: Arc<dyn Backend>) -> Self {
        Driver {
            config: Arc::new(config),
            store,
            backend,
            limiter: Limiter::default(),
            observers: Vec::new(),
            plugins_dir: PathBuf::from(crate::node::member_plugin::DEFAULT_PLUGINS_DIR),
        }
    }

    pub fn with_plugins_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.plugins_dir = dir.into();
        self
    }

    pub fn with_observer(mut self, observer: Arc<dyn VolumeObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// Runs a blocking store call on the blocking pool.
    pub async fn db<T, F>(&self, f: F) -> CsiResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> StoreResult<T> + Send + 'static,
    {
        Ok(self.store.run(f).await?)
    }

    /// The volume record, if there is one.
    pub async fn find_volume(&self, id: &str) -> CsiResult<Option<Volume>> {
        let key = id.to_string();
        self.db(move |s| s.volume(&key)).await
    }

    /// The volume record, or NOT_FOUND naming the id.
    pub async fn volume(&self, id: &str) -> CsiResult<Volume> {
        self.find_volume(id)
            .await?
            .ok_or_else(|| CsiError::VolumeNotFound(id.to_string()))
    }

    /// Commits a volume record, then tells the observers.
    pub async fn put_volume(&self, vol: &Volume) -> CsiResult<()> {
        let record = vol.clone();
        self.db(move |s| s.put_volume(&record)).await?;
        for o in &self.observers {
            o.changed(vol).await;
        }
        Ok(())
    }

    /// Deletes a volume record, then tells the observers.
    pub async fn remove_volume(&self, vol: &Volume) -> CsiResult<()> {
        let id = vol.id.clone();
        self.db(move |s| s.remove_volume(&id)).await?;
        for o in &self.observers {
            o.removed(vol).await;
        }
        Ok(())
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
            crate::backend::NodeSource::Member(source) => {
                Err(CsiError::FailedPrecondition(format!(
                    "volume {:?} is a member-cluster {} volume with no path on this node",
                    vol.id,
                    source.kind.name()
                )))
            }
        }
    }
}
