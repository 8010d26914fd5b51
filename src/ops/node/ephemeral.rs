//! Ephemeral inline volumes (`csi.storage.k8s.io/ephemeral=true`): created by
//! the first NodePublishVolume, deleted with the last NodeUnpublishVolume.

use std::collections::{BTreeMap, HashMap};

use crate::domain::capability::Capability;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::state::{self, NewVolume};
use crate::domain::volume::{Backing, Volume};
use crate::ops::controller::provision::DEFAULT_VOLUME_SIZE;
use crate::ops::driver::{now, Driver};

pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";

pub fn requested(context: &HashMap<String, String>) -> bool {
    context.get(EPHEMERAL_KEY).is_some_and(|v| v == "true")
}

/// The volume's record, created (with its storage) on first use.
pub async fn ensure(
    d: &Driver,
    id: &str,
    context: &HashMap<String, String>,
    cap: &Capability,
) -> CsiResult<Volume> {
    if let Some(existing) = state::ephemeral_use(d.find_volume(id).await?.as_ref(), id)? {
        return Ok(existing);
    }
    if cap.is_block() {
        return Err(CsiError::invalid(
            "volume_capability",
            "ephemeral inline volumes support mount access only",
        ));
    }
    // The id is chosen by kubelet, but it becomes a directory name: only a
    // plain name is accepted.
    let safe = id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !id.starts_with('-');
    if !safe {
        return Err(CsiError::invalid(
            "volume_id",
            format!("{id:?}: inline volume ids must be [A-Za-z0-9_-]"),
        ));
    }
    let (secs, _) = now();
    let vol = state::provisioning(NewVolume {
        id: id.to_string(),
        name: format!("ephemeral/{id}"),
        capacity_bytes: DEFAULT_VOLUME_SIZE,
        backing: Backing::Directory,
        capabilities: vec![cap.clone()],
        parameters: BTreeMap::new(),
        mutable_parameters: BTreeMap::new(),
        source: None,
        topology: d.backend.volume_topology(),
        context: context.clone().into_iter().collect(),
        created_unix: secs,
        ephemeral: true,
    });
    d.put_volume(&vol).await?;
    d.backend.create_volume(&vol, None).await?;
    let vol = state::provisioned(&vol);
    d.put_volume(&vol).await?;
    tracing::info!(volume_id = %id, "ephemeral volume created");
    Ok(vol)
}

/// Deletes an ephemeral volume once nothing uses it.
pub async fn remove(d: &Driver, vol: &Volume) -> CsiResult<()> {
    d.put_volume(&state::deleting(vol)).await?;
    d.backend.delete_volume(vol).await?;
    d.remove_volume(vol).await?;
    tracing::info!(volume_id = %vol.id, "ephemeral volume deleted");
    Ok(())
}
