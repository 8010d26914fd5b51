//! The driver side of node-local records (see `domain::state::node_local` for what
//! they are): adopting one for a NodeStageVolume this store knows nothing
//! of, and committing or dropping one after node work.

use std::collections::{BTreeMap, HashMap};

use crate::domain::capability::Capability;
use crate::domain::error::CsiResult;
use crate::domain::member_source::MemberSource;
use crate::domain::state::{self, AdoptFacts, Settled};
use crate::domain::volume::Volume;
use crate::ops::driver::{now, Driver};
use crate::ops::node::{ephemeral, sources};

/// The record NodeStageVolume works on: the store's, or, when the store
/// has none (or a node-local record nothing uses), one adopted from the
/// request: a member volume is described by the request itself.
pub async fn record_for_stage(
    d: &Driver,
    id: &str,
    publish_context: &HashMap<String, String>,
    volume_context: &HashMap<String, String>,
    cap: &Capability,
) -> CsiResult<Volume> {
    let node_id = &d.config.node_id;
    match d.find_volume(id).await? {
        Some(v) if !state::is_node_local(&v) || state::in_use(&v, node_id) => Ok(v),
        _ => {
            state::may_adopt(AdoptFacts {
                volume_id: id,
                node_id,
                controller: d.config.mode.controller(),
                member_backend: d.backend.kind() == "member",
                member_source: MemberSource::present(publish_context),
            })?;
            let context: BTreeMap<String, String> = publish_context.clone().into_iter().collect();
            let m = sources::resolve::decode(&context)?;
            let (secs, _) = now();
            Ok(state::adopt(
                id,
                node_id,
                &m,
                context,
                volume_context,
                cap,
                secs,
            ))
        }
    }
}

/// Commits `vol` after node work was undone or rolled back: kept, dropped
/// (a node-local record `node_id` no longer uses) or, for an inline
/// volume nothing uses, deleted.
pub async fn commit(d: &Driver, vol: &Volume, node_id: &str) -> CsiResult<()> {
    match state::settled(vol, node_id) {
        Settled::DeleteEphemeral => ephemeral::remove(d, vol).await,
        Settled::Drop => {
            d.remove_volume(vol).await?;
            tracing::info!(volume_id = %vol.id, "node-local member record dropped");
            Ok(())
        }
        // The outcome of node work (a removal, a rollback): what the mount
        // table witnesses needs no fsync of its own.
        Settled::Keep => d.put_outcome(vol).await,
    }
}
