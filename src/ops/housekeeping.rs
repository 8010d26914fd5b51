//! Cleans up what no CO call will ever come back for.
//!
//! A create commits its record as `Provisioning` before it allocates, so a
//! crash leaves a record the CO's retry finishes. But a CO may never retry
//! a name (the claim was deleted meanwhile), and then the record and its
//! data stay for ever, invisible to ListVolumes. A periodic sweep (the
//! first at start-up) therefore:
//! - rolls back creates older than `--stale-provisioning-after` (the CO was
//!   never told they exist, so nothing is lost: a late retry starts anew),
//!   and, every [`ABANDONED_CHECK`], sooner those whose claim the backend
//!   shows gone (`Backend::abandoned`): a refused create whose PVC was
//!   deleted would otherwise show as work in progress for an hour;
//! - finishes deletions the CO asked for but that were cut short;
//! - removes backend data that no record owns (a crash mid-way through a
//!   delete, or temporary copies);
//! - removes member attachments no record wants (kept at unpublish while
//!   a member pod still used the volume on that node);
//! - detaches loop devices whose volume file was deleted under them (a
//!   tool that outlived a crash could attach after the start-up sweep).
//!
//! Every action takes the same in-flight guards as the RPCs, so the sweep
//! never races a call on the same volume or name; a busy one waits for the
//! next round.

use std::time::Duration;

use crate::backends::{DataKind, OwnAttachment, StoredData};
use crate::domain::error::CsiResult;
use crate::domain::volume::{GroupSnapshot, Lifecycle, Snapshot, Volume};
use crate::ops::driver::{now, Driver};
use crate::rt::limiter::{
    group_key, group_name_key, snapshot_key, snapshot_name_key, volume_key, volume_name_key,
};

/// Delay of the first sweep after start-up.
const FIRST_SWEEP_AFTER: Duration = Duration::from_secs(2);
/// How often unfinished creates are checked for a claim that is gone: one
/// API read per unfinished create, and there are few.
pub const ABANDONED_CHECK: Duration = Duration::from_secs(20);

/// What one sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub expired_volumes: usize,
    /// Unfinished creates rolled back because their claim is gone.
    pub abandoned_volumes: usize,
    pub expired_snapshots: usize,
    /// Group snapshots whose create was never finished, rolled back with
    /// their member snapshots (and what the backend made for the group).
    pub expired_group_snapshots: usize,
    pub finished_group_snapshot_deletes: usize,
    pub finished_volume_deletes: usize,
    pub finished_snapshot_deletes: usize,
    pub reclaimed_data: usize,
    pub collected_attachments: usize,
    pub detached_loops: usize,
    /// Entries skipped because a call was working on them.
    pub busy: usize,
}

impl Report {
    pub fn is_empty(&self) -> bool {
        *self
            == Report {
                busy: self.busy,
                ..Default::default()
            }
    }
}

fn stale(created_unix: i64, grace: Duration) -> bool {
    let (now, _) = now();
    now.saturating_sub(created_unix) >= grace.as_secs() as i64
}

/// At start-up, before any call: a `Provisioning` volume whose data the
/// backend shows complete was created, and its `Ready` commit (which needs
/// no fsync of its own) was lost to a crash; the CO may have been told it
/// exists, so it is recorded `Ready`. Returns how many.
pub async fn promote_created(d: &Driver) -> CsiResult<usize> {
    let mut promoted = 0;
    for vol in d.db(|s| s.unfinished_volumes()).await? {
        if vol.lifecycle == Lifecycle::Provisioning && d.backend.created(&vol).await {
            d.put_volume(&crate::domain::state::provisioned(&vol))
                .await?;
            tracing::info!(volume_id = %vol.id, name = %vol.name, "created volume recorded Ready again after a restart");
            promoted += 1;
        }
    }
    Ok(promoted)
}

/// At start-up, before any call and before `promote_created`: storage made
/// ahead that an earlier build left (see `backends::local::pool_leftovers`). An entry a
/// volume record owns was taken by a create whose move into place a power
/// cut undid: it goes into place again before any call can need it. The
/// rest are discarded in the background, off the way to Probe ready.
/// Returns how many were put in place.
pub async fn settle_premade(d: &Driver) -> CsiResult<usize> {
    let leftovers = d.backend.premade_leftovers();
    if leftovers.is_empty() {
        return Ok(0);
    }
    // One store read for all: each is a lookup in cached pages. A failed
    // read fails start-up rather than taking an owned entry for an orphan.
    let (owned, orphans) = d
        .db(move |s| {
            let (mut owned, mut orphans) = (Vec::new(), Vec::new());
            for id in leftovers {
                match s.volume(&id)? {
                    Some(_) => owned.push(id),
                    None => orphans.push(id),
                }
            }
            Ok((owned, orphans))
        })
        .await?;
    let placed = d.backend.restore_premade(&owned).await?;
    let backend = d.backend.clone();
    tokio::spawn(async move {
        match backend.discard_premade(&orphans).await {
            Ok(()) => tracing::info!(
                discarded = orphans.len(),
                "discarded the directories an earlier run made ahead"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "cannot discard the directories an earlier run made ahead; the next start tries again")
            }
        }
    });
    Ok(placed)
}

/// Of the unfinished volumes at `now` (unix seconds): how many creates, the
/// oldest create's age in seconds (0: none), how many deletes. A delete has
/// no age: its record holds when the volume was created, not when its
/// deletion began.
fn unfinished_figures(unfinished: &[Volume], now: i64) -> (usize, i64, usize) {
    let creating = unfinished
        .iter()
        .filter(|v| v.lifecycle == Lifecycle::Provisioning);
    let oldest = creating
        .clone()
        .map(|v| now.saturating_sub(v.created_unix))
        .max()
        .unwrap_or(0);
    let deleting = unfinished
        .iter()
        .filter(|v| v.lifecycle == Lifecycle::Deleting)
        .count();
    (creating.count(), oldest, deleting)
}

/// Runs one sweep. Errors on single entries are logged and left for the
/// next round; only a failing store read ends the sweep early.
pub async fn sweep(d: &Driver) -> CsiResult<Report> {
    let mut report = Report::default();
    let grace = d.config.stale_provisioning_after;
    let unfinished = d.db(|s| s.unfinished_volumes()).await?;
    let (creating, oldest, deleting) = unfinished_figures(&unfinished, now().0);
    crate::rt::metrics::unfinished_volumes(creating, oldest, deleting);
    for vol in unfinished {
        let due = vol.lifecycle == Lifecycle::Deleting || stale(vol.created_unix, grace);
        if due {
            sweep_volume(d, vol, Expiry::Stale, &mut report).await;
        }
    }
    sweep_abandoned(d, &mut report).await?;
    for snap in d.db(|s| s.unfinished_snapshots()).await? {
        // A group's member snapshots go with their group.
        let due = snap.group_snapshot_id.is_none()
            && (snap.lifecycle == Lifecycle::Deleting || stale(snap.created_unix, grace));
        if due {
            sweep_snapshot(d, snap, &mut report).await;
        }
    }
    for group in d.db(|s| s.unfinished_groups()).await? {
        if group.lifecycle == Lifecycle::Deleting || stale(group.created_unix, grace) {
            sweep_group(d, group, &mut report).await;
        }
    }
    for data in d.backend.stored_data().await? {
        reclaim(d, data, &mut report).await;
    }
    for a in d.backend.own_attachments().await? {
        collect_attachment(d, a, &mut report).await;
    }
    detach_unlinked_loops(d, &mut report).await;
    Ok(report)
}

/// Rolls back the unfinished creates whose claim the backend shows gone.
pub async fn sweep_abandoned(d: &Driver, report: &mut Report) -> CsiResult<()> {
    for vol in d.db(|s| s.unfinished_volumes()).await? {
        if vol.lifecycle != Lifecycle::Provisioning {
            continue;
        }
        match d.backend.abandoned(&vol).await {
            Ok(true) => sweep_volume(d, vol, Expiry::ClaimGone, report).await,
            Ok(false) => {}
            Err(e) => {
                tracing::debug!(volume_id = %vol.id, error = %e, "housekeeping: cannot tell whether an unfinished create's claim is gone")
            }
        }
    }
    Ok(())
}

/// A loop device over a deleted volume file serves data no record owns
/// and pins the file's blocks. Detaching a device that is still mounted
/// only marks it to go on the last unmount, so this never pulls a
/// filesystem from under a user.
async fn detach_unlinked_loops(d: &Driver, report: &mut Report) {
    let dir = d.config.state_dir.join("volumes");
    let found = match crate::os::loopdev::unlinked_under(&dir) {
        Ok(found) => found,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            tracing::warn!(error = %e, "housekeeping: cannot list loop devices");
            return;
        }
    };
    for dev in found {
        match crate::os::loopdev::detach(&dev.device).await {
            Ok(()) => {
                tracing::warn!(device = %dev.device.display(), file = %dev.backing.display(), "housekeeping: detached a loop device over a deleted volume file");
                crate::rt::metrics::housekeeping("detached_loop");
                report.detached_loops += 1;
            }
            Err(e) => {
                tracing::warn!(device = %dev.device.display(), error = %e, "housekeeping: cannot detach a loop device over a deleted volume file; will retry")
            }
        }
    }
}

/// Removes a backend-side attachment no record wants: its volume is gone,
/// or unpublished while something else (a member pod) still used the
/// volume on that node, and that user is gone now.
async fn collect_attachment(d: &Driver, a: OwnAttachment, report: &mut Report) {
    let Ok(_guard) = d.limiter.try_acquire(&[volume_key(&a.volume_id)]) else {
        report.busy += 1;
        return;
    };
    let wanted = match d.find_volume(&a.volume_id).await {
        Ok(Some(vol)) => vol
            .nodes
            .values()
            .filter_map(|n| n.attachment.as_ref())
            .any(|att| {
                // An intent (no context yet) may be attaching under this name.
                att.publish_context.is_empty()
                    || att
                        .publish_context
                        .get(crate::domain::member_source::MEMBER_ATTACHMENT)
                        == Some(&a.name)
            }),
        Ok(None) => false,
        Err(e) => {
            tracing::warn!(volume_id = %a.volume_id, error = %e, "housekeeping: cannot look up the owner of an attachment");
            true
        }
    };
    if wanted {
        return;
    }
    match d.backend.collect_attachment(&a).await {
        Ok(true) => {
            tracing::warn!(attachment = %a.name, member = %a.place, volume_id = %a.volume_id, "housekeeping: removed an attachment no record wants");
            crate::rt::metrics::housekeeping("collected_attachment");
            report.collected_attachments += 1;
        }
        Ok(false) => {}
        Err(e) => {
            tracing::warn!(attachment = %a.name, error = %e, "housekeeping: cannot remove an unwanted attachment; will retry")
        }
    }
}

/// Why an unfinished create is rolled back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// Older than `--stale-provisioning-after`.
    Stale,
    /// Its claim is gone (`Backend::abandoned`).
    ClaimGone,
}

async fn sweep_volume(d: &Driver, vol: Volume, why: Expiry, report: &mut Report) {
    let Ok(_guard) = d
        .limiter
        .try_acquire(&[volume_name_key(&vol.name), volume_key(&vol.id)])
    else {
        report.busy += 1;
        return;
    };
    // Re-read under the guard: a call may have finished it meanwhile.
    let Ok(Some(vol)) = d.find_volume(&vol.id).await else {
        return;
    };
    if vol.lifecycle == Lifecycle::Ready || !vol.nodes.is_empty() {
        return;
    }
    let expired = vol.lifecycle == Lifecycle::Provisioning;
    let result = async {
        d.backend.delete_volume(&vol).await?;
        match d.backend.left_behind(&vol) {
            Some(left) => d.release_volume(&vol, &left).await,
            None => d.remove_volume(&vol).await,
        }
    }
    .await;
    match result {
        Ok(()) if expired && why == Expiry::ClaimGone => {
            tracing::warn!(volume_id = %vol.id, name = %vol.name, created_unix = vol.created_unix, "housekeeping: rolled back a volume whose CreateVolume was never finished and whose claim is gone");
            crate::rt::metrics::housekeeping("abandoned_volume");
            report.abandoned_volumes += 1;
        }
        Ok(()) if expired => {
            tracing::warn!(volume_id = %vol.id, name = %vol.name, created_unix = vol.created_unix, "housekeeping: rolled back a volume whose CreateVolume was never finished");
            crate::rt::metrics::housekeeping("expired_volume");
            report.expired_volumes += 1;
        }
        Ok(()) => {
            tracing::info!(volume_id = %vol.id, "housekeeping: finished an interrupted DeleteVolume");
            crate::rt::metrics::housekeeping("finished_volume_delete");
            report.finished_volume_deletes += 1;
        }
        Err(e) => {
            tracing::warn!(volume_id = %vol.id, error = %e, "housekeeping: cannot clean up volume; will retry")
        }
    }
}

async fn sweep_snapshot(d: &Driver, snap: Snapshot, report: &mut Report) {
    let Ok(_guard) = d.limiter.try_acquire(&[
        snapshot_name_key(&snap.name),
        snapshot_key(&snap.id),
        volume_key(&snap.source_volume_id),
    ]) else {
        report.busy += 1;
        return;
    };
    let id = snap.id.clone();
    let Ok(Some(snap)) = d.db(move |s| s.snapshot(&id)).await else {
        return;
    };
    if snap.lifecycle == Lifecycle::Ready {
        return;
    }
    let expired = snap.lifecycle == Lifecycle::Provisioning;
    match crate::ops::controller::snapshot::remove(d, snap.clone()).await {
        Ok(()) if expired => {
            tracing::warn!(snapshot_id = %snap.id, name = %snap.name, "housekeeping: rolled back a snapshot whose CreateSnapshot was never finished");
            crate::rt::metrics::housekeeping("expired_snapshot");
            report.expired_snapshots += 1;
        }
        Ok(()) => {
            crate::rt::metrics::housekeeping("finished_snapshot_delete");
            report.finished_snapshot_deletes += 1;
        }
        Err(e) => {
            tracing::warn!(snapshot_id = %snap.id, error = %e, "housekeeping: cannot clean up snapshot; will retry")
        }
    }
}

/// A group snapshot whose create was refused or abandoned: the CO never got
/// its id, so nothing else would ever delete it.
async fn sweep_group(d: &Driver, group: GroupSnapshot, report: &mut Report) {
    let mut keys = vec![group_name_key(&group.name), group_key(&group.id)];
    keys.extend(group.source_volume_ids.iter().map(|v| volume_key(v)));
    let Ok(_guard) = d.limiter.try_acquire(&keys) else {
        report.busy += 1;
        return;
    };
    let id = group.id.clone();
    let Ok(Some(group)) = d.db(move |s| s.group(&id)).await else {
        return;
    };
    if group.lifecycle == Lifecycle::Ready {
        return;
    }
    let expired = group.lifecycle == Lifecycle::Provisioning;
    match crate::ops::controller::group_snapshot::remove(d, group.clone()).await {
        Ok(()) if expired => {
            tracing::warn!(group_snapshot_id = %group.id, name = %group.name, "housekeeping: rolled back a group snapshot whose CreateVolumeGroupSnapshot was never finished");
            crate::rt::metrics::housekeeping("expired_group_snapshot");
            report.expired_group_snapshots += 1;
        }
        Ok(()) => {
            crate::rt::metrics::housekeeping("finished_group_snapshot_delete");
            report.finished_group_snapshot_deletes += 1;
        }
        Err(e) => {
            tracing::warn!(group_snapshot_id = %group.id, error = %e, "housekeeping: cannot clean up group snapshot; will retry")
        }
    }
}

/// Removes `data` when no record owns it. A record is always committed
/// before its data is created and removed after it is gone, so data whose
/// record is absent (checked after the listing) can belong to no call.
/// Owned data is passed over without taking its volume's turn: a sweep
/// must not make a CO call on a live volume answer ABORTED.
async fn reclaim(d: &Driver, data: StoredData, report: &mut Report) {
    if !orphan(d, &data).await {
        return;
    }
    let key = match data.kind {
        DataKind::Volume => volume_key(&data.id),
        DataKind::Snapshot => snapshot_key(&data.id),
    };
    let Ok(_guard) = d.limiter.try_acquire(&[key]) else {
        report.busy += 1;
        return;
    };
    // Again under the key: a call may have finished meanwhile.
    if !orphan(d, &data).await {
        return;
    }
    match d.backend.remove_data(&data).await {
        Ok(()) => {
            tracing::warn!(path = %data.path.display(), kind = ?data.kind, id = %data.id, "housekeeping: reclaimed data no record owns");
            crate::rt::metrics::housekeeping("reclaimed_data");
            report.reclaimed_data += 1;
        }
        Err(e) => {
            tracing::warn!(path = %data.path.display(), error = %e, "housekeeping: cannot reclaim orphaned data")
        }
    }
}

/// Whether no record owns `data` (a failed lookup counts as owned).
async fn orphan(d: &Driver, data: &StoredData) -> bool {
    let id = data.id.clone();
    let owner = match data.kind {
        DataKind::Volume => d
            .db(move |s| s.volume(&id))
            .await
            .map(|v| v.map(|v| v.lifecycle)),
        DataKind::Snapshot => d
            .db(move |s| s.snapshot(&id))
            .await
            .map(|s| s.map(|s| s.lifecycle)),
    };
    match owner {
        Ok(None) => true,
        // A temporary copy of finished data is a leftover; one of an
        // unfinished create is still that create's (or expiry's) business.
        Ok(Some(Lifecycle::Ready)) => data.temporary,
        Ok(Some(_)) => false,
        Err(e) => {
            tracing::warn!(id = %data.id, error = %e, "housekeeping: cannot look up the owner of stored data");
            false
        }
    }
}

/// Sweeps every `interval` (the first shortly after start-up), until the
/// process ends.
pub fn spawn(d: Driver, interval: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // Not in the way of start-up: the first sweep (which lists every
        // piece of stored data) waits until the driver has settled.
        tokio::time::sleep(FIRST_SWEEP_AFTER.min(interval)).await;
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut check = tokio::time::interval(ABANDONED_CHECK.min(interval));
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Both first ticks are due now: the full sweep covers the check.
        check.tick().await;
        loop {
            let full = tokio::select! {
                _ = tick.tick() => true,
                _ = check.tick() => false,
            };
            let work = d.clone();
            let swept = crate::rt::offload::call("housekeeping", async move {
                if full {
                    sweep(&work).await
                } else {
                    let mut report = Report::default();
                    sweep_abandoned(&work, &mut report).await.map(|()| report)
                }
            })
            .await;
            match swept {
                Ok(r) if r.is_empty() => {
                    tracing::debug!(busy = r.busy, "housekeeping: nothing to do")
                }
                Ok(r) => tracing::info!(report = ?r, "housekeeping sweep done"),
                Err(e) => tracing::warn!(error = %e, "housekeeping sweep failed; will retry"),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delete_of_an_old_volume_is_counted_but_gives_no_age() {
        use crate::domain::volume::sample;
        let at = |id: &str, lifecycle, created_unix| Volume {
            lifecycle,
            created_unix,
            ..sample(id, id)
        };
        let unfinished = [
            at("a", Lifecycle::Provisioning, 1_000),
            at("b", Lifecycle::Provisioning, 1_900),
            // Created a year before its deletion began.
            at("c", Lifecycle::Deleting, 1_000 - 365 * 86_400),
        ];
        assert_eq!(unfinished_figures(&unfinished, 2_000), (2, 1_000, 1));
        assert_eq!(unfinished_figures(&[], 2_000), (0, 0, 0));
    }
}
