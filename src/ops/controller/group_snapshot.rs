//! GroupController: Create/Delete/GetVolumeGroupSnapshot. A group snapshot
//! is one snapshot per source volume, cut while every source volume is held
//! by the in-flight limiter so no other operation changes them meanwhile:
//! at one instant by the storage where the backend can (a member
//! VolumeGroupSnapshot), else one after another.

use std::collections::BTreeMap;

use crate::backends::GroupCut;
use crate::csi;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::params::{self, GroupSnapshotParams};
use crate::domain::validate;
use crate::domain::volume::{GroupSnapshot, Lifecycle, Snapshot, Volume};
use crate::ops::controller::{snapshot, wire};
use crate::ops::driver::{now, Driver};
use crate::rt::limiter::{group_key, group_name_key, volume_key};

const MAX_GROUP_VOLUMES: usize = 128;

async fn members(d: &Driver, g: &GroupSnapshot) -> CsiResult<Vec<Snapshot>> {
    let ids = g.snapshot_ids.clone();
    d.db(move |s| {
        let mut out = Vec::new();
        for id in &ids {
            if let Some(snap) = s.snapshot(id)? {
                out.push(snap);
            }
        }
        Ok(out)
    })
    .await
}

pub async fn create(
    d: &Driver,
    req: csi::CreateVolumeGroupSnapshotRequest,
) -> CsiResult<csi::CreateVolumeGroupSnapshotResponse> {
    let name = validate::id(&req.name, "name")?.to_string();
    if req.source_volume_ids.is_empty() {
        return Err(CsiError::Missing("source_volume_ids"));
    }
    if req.source_volume_ids.len() > MAX_GROUP_VOLUMES {
        return Err(CsiError::invalid(
            "source_volume_ids",
            format!("more than {MAX_GROUP_VOLUMES} volumes"),
        ));
    }
    let mut sources: Vec<String> = Vec::new();
    for id in &req.source_volume_ids {
        sources.push(validate::id(id, "source_volume_ids")?.to_string());
    }
    sources.sort();
    sources.dedup();
    validate::map(&req.parameters, "parameters")?;
    validate::secrets(&req.secrets)?;
    let typed: GroupSnapshotParams = params::decode(&req.parameters, "parameters")?;
    d.backend.check_group_snapshot_parameters(&typed)?;
    let parameters: BTreeMap<String, String> = req.parameters.into_iter().collect();

    let mut keys = vec![group_name_key(&name)];
    keys.extend(sources.iter().map(|v| volume_key(v)));
    let _guard = d.limiter.try_acquire(&keys)?;

    let lookup = name.clone();
    let mut group = match d.db(move |s| s.group_by_name(&lookup)).await? {
        Some(g) => {
            if g.source_volume_ids != sources {
                return Err(CsiError::AlreadyExists(format!(
                    "group snapshot name {name:?} is taken by {} of volumes {:?}",
                    g.id, g.source_volume_ids
                )));
            }
            if g.lifecycle == Lifecycle::Deleting {
                return Err(CsiError::Aborted(format!(
                    "group snapshot {:?} is being deleted",
                    g.id
                )));
            }
            g
        }
        None => {
            let (secs, nanos) = now();
            GroupSnapshot {
                id: format!("group-{}", uuid::Uuid::new_v4().simple()),
                name: name.clone(),
                source_volume_ids: sources.clone(),
                snapshot_ids: Vec::new(),
                created_unix: secs,
                created_nanos: nanos,
                lifecycle: Lifecycle::Provisioning,
                parameters: parameters.clone(),
            }
        }
    };
    if group.lifecycle == Lifecycle::Ready {
        let snaps = members(d, &group).await?;
        return Ok(csi::CreateVolumeGroupSnapshotResponse {
            group_snapshot: Some(wire::group_snapshot(&group, &snaps)),
        });
    }
    let mut volumes = Vec::new();
    for id in &sources {
        let v = d.volume(id).await?;
        if v.lifecycle != Lifecycle::Ready {
            return Err(CsiError::VolumeNotFound(id.clone()));
        }
        volumes.push(v);
    }
    // Plan every member snapshot id in the group record before cutting any,
    // so a crash mid-way is resumed, not duplicated.
    let existing = members(d, &group).await?;
    let mut planned = Vec::new();
    for v in &volumes {
        let snap = match existing.iter().find(|s| s.source_volume_id == v.id) {
            Some(s) => s.clone(),
            None => snapshot::new_record(
                &format!("{}/{}", group.id, v.id),
                v,
                typed.per_volume(),
                Some(&group.id),
            ),
        };
        planned.push(snap);
    }
    group.snapshot_ids = planned.iter().map(|s| s.id.clone()).collect();
    let pending = group.clone();
    d.db(move |s| s.put_group(&pending)).await?;
    // Each member snapshot recorded before the backend cuts anything, so
    // DeleteVolumeGroupSnapshot after a failed or abandoned create finds
    // what to release.
    let records = planned.clone();
    d.db(move |s| {
        records
            .iter()
            .filter(|r| r.lifecycle != Lifecycle::Ready)
            .try_for_each(|r| s.put_snapshot(r))
    })
    .await?;
    let pairs: Vec<(Snapshot, Volume)> = planned.into_iter().zip(volumes).collect();
    let mut done = Vec::new();
    match d.backend.create_group_snapshot(&group, &pairs).await? {
        GroupCut::OneByOne => {
            for (snap, vol) in pairs {
                done.push(snapshot::cut(d, snap, &vol).await?);
            }
        }
        GroupCut::Whole(cut) => {
            for mut snap in cut {
                snap.lifecycle = Lifecycle::Ready;
                done.push(snap);
            }
            let records = done.clone();
            d.db(move |s| records.iter().try_for_each(|r| s.put_snapshot(r)))
                .await?;
        }
    }
    group.lifecycle = Lifecycle::Ready;
    let ready = group.clone();
    d.db(move |s| s.put_group(&ready)).await?;
    tracing::info!(group_snapshot_id = %group.id, volumes = ?sources, "volume group snapshot created");
    Ok(csi::CreateVolumeGroupSnapshotResponse {
        group_snapshot: Some(wire::group_snapshot(&group, &done)),
    })
}

fn check_ids(g: &GroupSnapshot, given: &[String]) -> CsiResult<()> {
    if given.is_empty() {
        return Ok(());
    }
    let mut given = given.to_vec();
    given.sort();
    let mut have = g.snapshot_ids.clone();
    have.sort();
    if given != have {
        return Err(CsiError::FailedPrecondition(format!(
            "snapshot_ids {given:?} do not match the members {have:?} of group snapshot {:?}",
            g.id
        )));
    }
    Ok(())
}

pub async fn delete(
    d: &Driver,
    req: csi::DeleteVolumeGroupSnapshotRequest,
) -> CsiResult<csi::DeleteVolumeGroupSnapshotResponse> {
    let id = validate::id(&req.group_snapshot_id, "group_snapshot_id")?.to_string();
    validate::secrets(&req.secrets)?;
    let _guard = d.limiter.try_acquire(&[group_key(&id)])?;
    let key = id.clone();
    let Some(group) = d.db(move |s| s.group(&key)).await? else {
        return Ok(csi::DeleteVolumeGroupSnapshotResponse {});
    };
    check_ids(&group, &req.snapshot_ids)?;
    remove(d, group).await?;
    Ok(csi::DeleteVolumeGroupSnapshotResponse {})
}

/// Releases a group snapshot: what the backend made for the group, then
/// each member snapshot, then the record (for DeleteVolumeGroupSnapshot
/// and housekeeping's roll-back of a create never finished).
pub async fn remove(d: &Driver, mut group: GroupSnapshot) -> CsiResult<()> {
    if group.lifecycle != Lifecycle::Deleting {
        group.lifecycle = Lifecycle::Deleting;
        let marked = group.clone();
        d.db(move |s| s.put_group(&marked)).await?;
    }
    let snaps = members(d, &group).await?;
    d.backend.delete_group_snapshot(&group, &snaps).await?;
    for snap in snaps {
        snapshot::remove(d, snap).await?;
    }
    let id = group.id.clone();
    d.db(move |s| s.remove_group(&id)).await?;
    tracing::info!(group_snapshot_id = %group.id, "volume group snapshot deleted");
    Ok(())
}

pub async fn get(
    d: &Driver,
    req: csi::GetVolumeGroupSnapshotRequest,
) -> CsiResult<csi::GetVolumeGroupSnapshotResponse> {
    let id = validate::id(&req.group_snapshot_id, "group_snapshot_id")?.to_string();
    validate::secrets(&req.secrets)?;
    let key = id.clone();
    let group = d
        .db(move |s| s.group(&key))
        .await?
        .filter(|g| g.lifecycle == Lifecycle::Ready)
        .ok_or(CsiError::GroupSnapshotNotFound(id))?;
    check_ids(&group, &req.snapshot_ids)?;
    let snaps = members(d, &group).await?;
    Ok(csi::GetVolumeGroupSnapshotResponse {
        group_snapshot: Some(wire::group_snapshot(&group, &snaps)),
    })
}
