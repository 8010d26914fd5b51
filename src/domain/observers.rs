//! Who hears of committed volume records besides the store: observers
//! told after a commit, and the mirror written before a call goes on. The
//! operations call them (`ops::driver`); the Kubernetes layer implements
//! them (`k8s::relay_volume`, `k8s::mirror`).

use crate::domain::error::{CsiError, CsiResult};
use crate::domain::volume::Volume;

/// Told about every committed volume change, after the commit (for example
/// to mirror volume state into a Kubernetes custom resource). Each returns
/// whether the change landed; failures are the observer's to log, and a
/// queue in front of it (`ObserverQueue`) delivers it again later.
#[async_trait::async_trait]
pub trait VolumeObserver: Send + Sync + 'static {
    async fn changed(&self, vol: &Volume) -> bool;
    async fn removed(&self, vol: &Volume) -> bool;
}

/// A second durable copy of the controller's records, where a controller
/// that lost its state directory reads them back (the member backend's
/// RelayVolumes). Unlike an observer it is written before a call goes on:
/// a call that cannot write it fails, so nothing is acknowledged, and no
/// side effect beyond the store happens, that the next controller would
/// not know of.
#[async_trait::async_trait]
pub trait RecordMirror: Send + Sync + 'static {
    async fn put(&self, vol: &Volume) -> CsiResult<()>;
    async fn remove(&self, vol: &Volume) -> CsiResult<()>;
    /// The record is gone but its storage was left behind (`left` says
    /// where and why): a copy that can say so keeps saying it.
    async fn release(&self, vol: &Volume, _left: &str) -> CsiResult<()> {
        self.remove(vol).await
    }
    /// Makes the copy of volume `id` what the store holds (`current`) if
    /// an earlier write of it failed or is not known to have landed.
    async fn settle(&self, id: &str, current: Option<&Volume>) -> CsiResult<()>;
    /// Shows where users look why `call` on the volume failed, until the
    /// volume moves on. Best effort: the call's own error is what the CO
    /// acts on.
    async fn note_failure(&self, _vol: &Volume, _call: &str, _error: &CsiError) {}
}
