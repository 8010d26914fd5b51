//! CreateSnapshot, DeleteSnapshot, ListSnapshots.

use std::collections::BTreeMap;

use crate::csi;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::page_token;
use crate::domain::params::{self, SnapshotParams};
use crate::domain::validate;
use crate::domain::volume::{Lifecycle, Snapshot, Volume};
use crate::ops::controller::wire;
use crate::ops::driver::{now, Driver};
use crate::rt::limiter::{snapshot_key, snapshot_name_key, volume_key};

/// Cuts (or finishes cutting) one snapshot of `source`. Shared with group
/// snapshots. The record is committed as `Provisioning` first so a retry
/// resumes the same snapshot id.
pub async fn cut(d: &Driver, mut snap: Snapshot, source: &Volume) -> CsiResult<Snapshot> {
    if snap.lifecycle == Lifecycle::Ready {
        return Ok(snap);
    }
    let pending = snap.clone();
    d.db(move |s| s.put_snapshot(&pending)).await?;
    d.backend.create_snapshot(&snap, source).await?;
    snap.allocated_bytes = d.backend.snapshot_allocated(&snap).await;
    snap.lifecycle = Lifecycle::Ready;
    let done = snap.clone();
    d.db(move |s| s.put_snapshot(&done)).await?;
    tracing::info!(snapshot_id = %snap.id, source_volume_id = %source.id, "snapshot created");
    Ok(snap)
}

pub fn new_record(
    name: &str,
    source: &Volume,
    parameters: BTreeMap<String, String>,
    group: Option<&str>,
) -> Snapshot {
    let (secs, nanos) = now();
    Snapshot {
        id: format!("snap-{}", uuid::Uuid::new_v4().simple()),
        name: name.to_string(),
        source_volume_id: source.id.clone(),
        size_bytes: source.capacity_bytes,
        backing: source.backing.clone(),
        created_unix: secs,
        created_nanos: nanos,
        lifecycle: Lifecycle::Provisioning,
        parameters,
        group_snapshot_id: group.map(str::to_string),
        allocated_bytes: None,
        member_snapshot: None,
    }
}

pub async fn create_snapshot(
    d: &Driver,
    req: csi::CreateSnapshotRequest,
) -> CsiResult<csi::CreateSnapshotResponse> {
    let name = validate::id(&req.name, "name")?.to_string();
    let source_id = validate::id(&req.source_volume_id, "source_volume_id")?.to_string();
    validate::map(&req.parameters, "parameters")?;
    validate::secrets(&req.secrets)?;
    let typed: SnapshotParams = params::decode(&req.parameters, "parameters")?;
    d.backend.check_snapshot_parameters(&typed)?;
    let parameters: BTreeMap<String, String> = req.parameters.into_iter().collect();

    let _guard = d
        .limiter
        .try_acquire(&[snapshot_name_key(&name), volume_key(&source_id)])?;
    let lookup = name.clone();
    let existing = d.db(move |s| s.snapshot_by_name(&lookup)).await?;
    if let Some(existing) = &existing {
        if existing.source_volume_id != source_id {
            return Err(CsiError::AlreadyExists(format!(
                "snapshot name {name:?} is taken by {} of volume {:?}, not of {source_id:?}",
                existing.id, existing.source_volume_id
            )));
        }
        if existing.lifecycle == Lifecycle::Deleting {
            return Err(CsiError::Aborted(format!(
                "snapshot {:?} is being deleted",
                existing.id
            )));
        }
    }
    let source = d.volume(&source_id).await?;
    if source.lifecycle != Lifecycle::Ready {
        return Err(CsiError::VolumeNotFound(source_id));
    }
    let snap = existing.unwrap_or_else(|| new_record(&name, &source, parameters, None));
    let snap = cut(d, snap, &source).await?;
    Ok(csi::CreateSnapshotResponse {
        snapshot: Some(wire::snapshot(&snap)),
    })
}

/// Removes a snapshot's data and record (for DeleteSnapshot and groups).
pub async fn remove(d: &Driver, mut snap: Snapshot) -> CsiResult<()> {
    if snap.lifecycle != Lifecycle::Deleting {
        snap.lifecycle = Lifecycle::Deleting;
        let marked = snap.clone();
        d.db(move |s| s.put_snapshot(&marked)).await?;
    }
    d.backend.delete_snapshot(&snap).await?;
    let id = snap.id.clone();
    d.db(move |s| s.remove_snapshot(&id)).await?;
    tracing::info!(snapshot_id = %snap.id, "snapshot deleted");
    Ok(())
}

pub async fn delete_snapshot(
    d: &Driver,
    req: csi::DeleteSnapshotRequest,
) -> CsiResult<csi::DeleteSnapshotResponse> {
    let id = validate::id(&req.snapshot_id, "snapshot_id")?.to_string();
    validate::secrets(&req.secrets)?;
    let _guard = d.limiter.try_acquire(&[snapshot_key(&id)])?;
    let key = id.clone();
    let Some(snap) = d.db(move |s| s.snapshot(&key)).await? else {
        return Ok(csi::DeleteSnapshotResponse {});
    };
    if let Some(group) = &snap.group_snapshot_id {
        let gid = group.clone();
        if d.db(move |s| s.group(&gid)).await?.is_some() {
            return Err(CsiError::FailedPrecondition(format!(
                "snapshot {id:?} belongs to volume group snapshot {group:?}; delete the group snapshot instead"
            )));
        }
    }
    remove(d, snap).await?;
    Ok(csi::DeleteSnapshotResponse {})
}

pub async fn list_snapshots(
    d: &Driver,
    req: csi::ListSnapshotsRequest,
) -> CsiResult<csi::ListSnapshotsResponse> {
    let limit = page_token::page_size(req.max_entries)?;
    let after = page_token::decode(&req.starting_token)?;
    validate::secrets(&req.secrets)?;
    let entries = |snaps: Vec<Snapshot>| -> Vec<csi::list_snapshots_response::Entry> {
        snaps
            .iter()
            .map(|s| csi::list_snapshots_response::Entry {
                snapshot: Some(wire::snapshot(s)),
            })
            .collect()
    };
    if !req.snapshot_id.is_empty() {
        // One snapshot at most; an unknown id is an empty list, not an error.
        let id = req.snapshot_id.clone();
        let found = d
            .db(move |s| s.snapshot(&id))
            .await?
            .filter(|s| s.lifecycle == Lifecycle::Ready)
            .filter(|s| {
                req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id
            })
            .filter(|s| after.as_deref().is_none_or(|a| s.id.as_str() > a));
        return Ok(csi::ListSnapshotsResponse {
            entries: entries(found.into_iter().collect()),
            next_token: String::new(),
        });
    }
    let source = req.source_volume_id.clone();
    let page = d
        .db(move |s| {
            if source.is_empty() {
                s.list_snapshots(after.as_deref(), limit)
            } else {
                s.list_snapshots_of(&source, after.as_deref(), limit)
            }
        })
        .await?;
    Ok(csi::ListSnapshotsResponse {
        entries: entries(page.items),
        next_token: page
            .next
            .as_deref()
            .map(page_token::encode)
            .unwrap_or_default(),
    })
}

pub async fn get_snapshot(
    d: &Driver,
    req: csi::GetSnapshotRequest,
) -> CsiResult<csi::GetSnapshotResponse> {
    let id = validate::id(&req.snapshot_id, "snapshot_id")?.to_string();
    validate::secrets(&req.secrets)?;
    let key = id.clone();
    match d.db(move |s| s.snapshot(&key)).await? {
        // A snapshot being cut or deleted does not exist for the CO yet/any more.
        Some(snap) if snap.lifecycle == Lifecycle::Ready => Ok(csi::GetSnapshotResponse {
            snapshot: Some(wire::snapshot(&snap)),
        }),
        _ => Err(CsiError::SnapshotNotFound(id)),
    }
}
