//! What every service shares: settings, the state store, the backend and the
//! per-volume in-flight limiter.

use std::path::PathBuf;
use std::sync::Arc;

use crate::backends::Backend;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::observers::{RecordMirror, VolumeObserver};
use crate::domain::settings::DriverConfig;
use crate::domain::volume::Volume;
use crate::rt::limiter::Limiter;
use crate::store::{Limits, Store, StoreResult};

#[derive(Clone)]
pub struct Driver {
    pub config: Arc<DriverConfig>,
    pub store: Store,
    pub backend: Arc<dyn Backend>,
    pub limiter: Limiter,
    pub observers: Vec<Arc<dyn VolumeObserver>>,
    pub mirror: Option<Arc<dyn RecordMirror>>,
    /// Where other CSI drivers' node plugins listen on this node
    /// (`<dir>/<driver name>/csi.sock`): member PVs of those drivers are
    /// served through them.
    pub plugins_dir: PathBuf,
    /// False while the node's state is reconciled with the kernel after a
    /// start: Probe answers not ready and node calls UNAVAILABLE meanwhile.
    pub node_ready: Arc<std::sync::atomic::AtomicBool>,
    /// False while another replica holds the controller Lease
    /// (`--leader-election`): controller calls answer UNAVAILABLE.
    pub leading: Arc<std::sync::atomic::AtomicBool>,
}

impl Driver {
    pub fn new(config: DriverConfig, store: Store, backend: Arc<dyn Backend>) -> Self {
        Driver {
            config: Arc::new(config),
            store,
            backend,
            limiter: Limiter::default(),
            observers: Vec::new(),
            mirror: None,
            plugins_dir: PathBuf::from(crate::ops::node::member_plugin::DEFAULT_PLUGINS_DIR),
            node_ready: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            leading: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        }
    }

    pub fn with_plugins_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.plugins_dir = dir.into();
        self
    }

    pub fn with_mirror(mut self, mirror: Arc<dyn RecordMirror>) -> Self {
        self.mirror = Some(mirror);
        self
    }

    /// Before a call acts on volume `id` (whose record is `current`): its
    /// mirrored copy is brought up to date, or the call fails.
    pub async fn settle_mirror(&self, id: &str, current: Option<&Volume>) -> CsiResult<()> {
        match &self.mirror {
            Some(m) => m.settle(id, current).await,
            None => Ok(()),
        }
    }

    /// See [`RecordMirror::note_failure`].
    pub async fn note_failure(&self, vol: &Volume, call: &str, error: &CsiError) {
        if let Some(m) = &self.mirror {
            m.note_failure(vol, call, error).await;
        }
    }

    pub fn with_observer(mut self, observer: Arc<dyn VolumeObserver>) -> Self {
        self.observers.push(observer);
        self
    }

    /// UNAVAILABLE on a replica that stands by for the controller Lease.
    pub fn require_leader(&self) -> CsiResult<()> {
        if self.leading.load(std::sync::atomic::Ordering::Acquire) {
            Ok(())
        } else {
            Err(CsiError::Unavailable(
                "this csi-relay controller replica is standing by: another one holds the leader Lease; the sidecars of the leading replica call it"
                    .into(),
            ))
        }
    }

    /// UNAVAILABLE while the node is being reconciled after a start.
    pub fn require_node_ready(&self) -> CsiResult<()> {
        if self.node_ready.load(std::sync::atomic::Ordering::Acquire) {
            Ok(())
        } else {
            Err(CsiError::Unavailable(
                "the node's volumes are being reconciled with the kernel after a start; retry"
                    .into(),
            ))
        }
    }

    /// Runs store work that may wait for an fsync (see `Store::run`).
    pub async fn db<T, F>(&self, f: F) -> CsiResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> StoreResult<T> + Send + 'static,
    {
        Ok(self.store.run(f).await?)
    }

    /// The volume record, if there is one. A read is a lookup in pages
    /// the store keeps cached: it runs in place, with no thread hop.
    pub async fn find_volume(&self, id: &str) -> CsiResult<Option<Volume>> {
        Ok(self.store.volume(id)?)
    }

    /// The record of a volume a controller call is about to act on, once
    /// its mirrored copy is up to date (see `settle_mirror`). Called under
    /// the volume's guard.
    pub async fn volume_to_change(&self, id: &str) -> CsiResult<Option<Volume>> {
        let vol = self.find_volume(id).await?;
        self.settle_mirror(id, vol.as_ref()).await?;
        Ok(vol)
    }

    /// `volume_to_change`, NOT_FOUND naming the id when there is none.
    pub async fn existing_volume_to_change(&self, id: &str) -> CsiResult<Volume> {
        self.volume_to_change(id)
            .await?
            .ok_or_else(|| CsiError::VolumeNotFound(id.to_string()))
    }

    /// The volume record, or NOT_FOUND naming the id.
    pub async fn volume(&self, id: &str) -> CsiResult<Volume> {
        self.find_volume(id)
            .await?
            .ok_or_else(|| CsiError::VolumeNotFound(id.to_string()))
    }

    /// Commits a volume record, then tells the observers.
    pub async fn put_volume(&self, vol: &Volume) -> CsiResult<()> {
        self.put_volume_limited(vol, Limits::default()).await
    }

    /// Commits a volume record unless it would go past `limits` (too many
    /// attachments on a node, more bytes than the capacity: both
    /// RESOURCE_EXHAUSTED), then tells the observers.
    pub async fn put_volume_limited(&self, vol: &Volume, limits: Limits) -> CsiResult<()> {
        self.put_within(vol, true, limits).await
    }

    async fn put_within(&self, vol: &Volume, durable: bool, limits: Limits) -> CsiResult<()> {
        let record = Arc::new(vol.clone());
        self.write(vol, Write::Put, move |s| {
            s.put_shared(record, durable, limits)
        })
        .await
    }

    /// Commits the outcome of work whose result the kernel or the backend
    /// witnesses durably (a mount in the mount table, renamed data): for
    /// local volumes without an fsync of its own, since start-up derives a
    /// lost outcome again from that witness (see `witnessed`). Member
    /// volumes, whose witness is elsewhere, are committed durably.
    pub async fn put_outcome(&self, vol: &Volume) -> CsiResult<()> {
        if !witnessed(vol) {
            return self.put_volume(vol).await;
        }
        let record = Arc::new(vol.clone());
        self.write(vol, Write::Put, move |s| {
            s.put_shared(record, false, Limits::default())
        })
        .await
    }

    /// Records the intent of node work on a local volume before the work:
    /// a mount, a loop device. The record reaches the log (the kernel's
    /// page cache) before the side effect, so a crash of this process keeps
    /// it; it gets no fsync of its own because what it guards dies with the
    /// machine too: a machine crash that loses the record loses the mount
    /// as well, and the CO stages and publishes again after a reboot.
    /// Member volumes, whose node work has effects beyond this machine,
    /// are committed durably. (CreateVolume logs its `Provisioning` record
    /// this way when it syncs the log itself, beside the data's creation.)
    pub async fn put_intent(&self, vol: &Volume) -> CsiResult<()> {
        self.put_outcome(vol).await
    }

    /// `put_intent`, refused (RESOURCE_EXHAUSTED) past `limits`.
    pub async fn put_intent_within(&self, vol: &Volume, limits: Limits) -> CsiResult<()> {
        self.put_within(vol, !witnessed(vol), limits).await
    }

    /// Deletes a record whose data is gone; lazily, as `put_outcome`
    /// (start-up finishes a `Deleting` record whose data is absent).
    pub async fn remove_outcome(&self, vol: &Volume) -> CsiResult<()> {
        let id = vol.id.clone();
        self.write(vol, Write::Remove, move |s| s.remove_volume_lazily(&id))
            .await
    }

    /// Deletes a volume record, then tells the observers.
    pub async fn remove_volume(&self, vol: &Volume) -> CsiResult<()> {
        let id = vol.id.clone();
        self.write(vol, Write::Remove, move |s| s.remove_volume(&id))
            .await
    }

    /// Deletes the record of a volume whose storage stays behind (`left`
    /// says where and why); its mirrored copy is kept as the record of
    /// that, instead of being removed.
    pub async fn release_volume(&self, vol: &Volume, left: &str) -> CsiResult<()> {
        let id = vol.id.clone();
        self.write(vol, Write::Release(left), move |s| s.remove_volume(&id))
            .await
    }

    /// Runs one store write of `vol` (`f` owns what it writes: the one
    /// copy of the record a put makes, or the id a removal needs), then
    /// tells the observers.
    async fn write<F>(&self, vol: &Volume, kind: Write<'_>, f: F) -> CsiResult<()>
    where
        F: FnOnce(&Store) -> StoreResult<()> + Send + 'static,
    {
        self.db(f).await?;
        if let Some(m) = &self.mirror {
            match kind {
                Write::Put => m.put(vol).await?,
                Write::Remove => m.remove(vol).await?,
                Write::Release(left) => m.release(vol, left).await?,
            }
        }
        for o in &self.observers {
            match kind {
                // Observers behind a queue retry on their own.
                Write::Put => o.changed(vol).await,
                Write::Remove | Write::Release(_) => o.removed(vol).await,
            };
        }
        Ok(())
    }
}

#[derive(Clone, Copy)]
enum Write<'a> {
    Put,
    Remove,
    /// Removed, its storage left behind for the reason given.
    Release(&'a str),
}

/// Whether a volume's node state and creation are witnessed on this
/// machine durably without the store: local volumes (their mounts are in
/// the mount table, their data renamed into place and fsynced).
pub fn witnessed(vol: &Volume) -> bool {
    vol.backing.is_local()
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
            crate::backends::NodeSource::Directory(p)
            | crate::backends::NodeSource::BlockFile(p) => Ok(p),
            crate::backends::NodeSource::Member(source) => {
                Err(CsiError::FailedPrecondition(format!(
                    "volume {:?} is a member-cluster {} volume with no path on this node",
                    vol.id,
                    source.kind.name()
                )))
            }
        }
    }
}
