//! Start-up reconciliation of this node's recorded state with the kernel's.
//!
//! Rules: work that was in flight when the driver stopped (`Applying` or
//! `Removing`) is rolled back completely: unmounted, detached and forgotten,
//! so the CO's retry starts clean. Finished work whose mount vanished is
//! restored; if that fails the volume stays recorded and NodeGetVolumeStats
//! reports it abnormal. Loop devices on this driver's volume files that no
//! record accounts for are detached.
//!
//! Member volumes follow the same rules: NFS and bind mounts are redone
//! here, a member CSI volume's lost stage or publication is asked of its
//! node plugin again (NodeStage / NodePublish are idempotent) and its
//! interrupted ones are unpublished / unstaged through it. A node-local
//! record nothing uses any more is dropped.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::domain::error::{CsiError, CsiResult};
use crate::domain::state;
use crate::domain::volume::{Progress, Volume};
use crate::ops::driver::Driver;
use crate::ops::node::sources::{self, Publishing, Source, Staging};
use crate::ops::node::{node_local, stage::staged_readonly};
use crate::os::loopdev;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Finished work whose outcome commit a crash lost (the mount table
    /// witnesses it): recorded as done.
    pub rolled_forward: usize,
    pub rolled_back: usize,
    pub restored: usize,
    pub failed: usize,
    pub stale_loops_detached: usize,
}

pub async fn reconcile(d: &Driver) -> CsiResult<Report> {
    let node_id = d.config.node_id.clone();
    let lookup = node_id.clone();
    let volumes = d.db(move |s| s.volumes_on_node(&lookup)).await?;
    let mut report = Report::default();
    let mut in_use: HashSet<PathBuf> = HashSet::new();
    for vol in volumes {
        let id = vol.id.clone();
        let vol = match reconcile_volume(d, vol, &node_id, &mut report).await {
            Ok(vol) => vol,
            // The store failing fails every volume: the whole run is
            // retried later.
            Err(e @ CsiError::Store(_)) => return Err(e),
            // One volume that cannot be reconciled must not keep the node
            // from serving the others; its own calls report what is wrong.
            Err(e) => {
                tracing::error!(volume_id = %id, error = %e, "volume left as recorded");
                report.failed += 1;
                continue;
            }
        };
        if vol.node(&node_id).and_then(|n| n.stage.as_ref()).is_some() {
            if let Ok(p) = d.backend_path(&vol) {
                in_use.insert(std::fs::canonicalize(&p).unwrap_or(p));
            }
        }
    }
    let volumes_dir = d.config.state_dir.join("volumes");
    let volumes_dir = std::fs::canonicalize(&volumes_dir).unwrap_or(volumes_dir);
    for loop_dev in loopdev::devices().unwrap_or_default() {
        let (dev, backing) = (loop_dev.device, loop_dev.backing);
        if backing.starts_with(&volumes_dir) && !in_use.contains(&backing) {
            // By device: the file may be gone (sysfs then says "<file> (deleted)").
            if let Err(e) = loopdev::detach(&dev).await {
                tracing::warn!(device = %dev.display(), error = %e, "could not detach stale loop device");
            } else {
                tracing::info!(device = %dev.display(), file = %backing.display(), "detached stale loop device");
                report.stale_loops_detached += 1;
            }
        }
    }
    tracing::info!(?report, "node state reconciled with the kernel");
    Ok(report)
}

/// Records as done the stage and publications of `vol` whose mounts exist.
fn roll_forward(mut vol: Volume, src: &dyn Source, node_id: &str, report: &mut Report) -> Volume {
    let Some(node) = vol.node(node_id).cloned() else {
        return vol;
    };
    if let Some(stage) = node.stage.as_ref() {
        if stage.progress == Progress::Applying
            && src.is_staged(Path::new(&stage.path), &stage.capability)
        {
            vol = state::stage_done(&vol, node_id, src.staged_device());
            report.rolled_forward += 1;
        }
    }
    for (target, publication) in &node.targets {
        if publication.progress == Progress::Applying && src.is_published(Path::new(target)) {
            vol = state::publish_done(&vol, node_id, target);
            report.rolled_forward += 1;
        }
    }
    vol
}

async fn reconcile_volume(
    d: &Driver,
    mut vol: Volume,
    node_id: &str,
    report: &mut Report,
) -> CsiResult<Volume> {
    if vol.node(node_id).is_none() {
        return Ok(vol);
    }
    // Restoring needs the exact source; undoing interrupted work can do
    // with an unmount when a member volume's description is gone.
    let exact = sources::for_restore(d, &vol, node_id)?;
    let fallback;
    let teardown: &dyn Source = match &exact {
        Some(s) => s.as_ref(),
        None => match sources::for_teardown(d, &vol, node_id) {
            Ok(s) => {
                fallback = s;
                fallback.as_ref()
            }
            Err(e) => {
                tracing::error!(volume_id = %vol.id, error = %e, "volume left as recorded");
                report.failed += 1;
                return Ok(vol);
            }
        },
    };
    // 0. Local volumes' outcomes are committed without an fsync of their
    // own: work the mount table shows finished is recorded as done.
    if let (true, Some(src)) = (crate::ops::driver::witnessed(&vol), &exact) {
        vol = roll_forward(vol, src.as_ref(), node_id, report);
    }
    let Some(node) = vol.node(node_id).cloned() else {
        return Ok(vol);
    };
    // 1. A finished stage comes back first: publications are bound from it.
    let mut stage_ok = true;
    if let Some(stage) = node.stage.as_ref().filter(|s| s.progress == Progress::Done) {
        let staging = Path::new(&stage.path);
        let lost = exact
            .as_ref()
            .is_none_or(|s| !s.is_staged(staging, &stage.capability));
        if lost {
            let restored = match &exact {
                Some(s) => {
                    s.stage(Staging {
                        path: staging,
                        cap: &stage.capability,
                        readonly: staged_readonly(&vol, node_id, &stage.capability),
                    })
                    .await
                }
                None => Err(CsiError::FailedPrecondition("source unknown".into())),
            };
            match restored {
                Ok(device) => {
                    vol = state::stage_done(&vol, node_id, device);
                    report.restored += 1;
                }
                Err(e) => {
                    tracing::error!(volume_id = %vol.id, error = %e, "could not restore staging; volume reported abnormal");
                    report.failed += 1;
                    stage_ok = false;
                }
            }
        }
    }
    // 2. Publications: interrupted ones are undone, lost ones re-bound.
    for (target, publication) in &node.targets {
        let path = Path::new(target);
        match publication.progress {
            Progress::Applying | Progress::Removing => match teardown.unpublish(path).await {
                Ok(()) => {
                    vol = state::publish_removed(&vol, node_id, target);
                    report.rolled_back += 1;
                }
                Err(e) => {
                    tracing::warn!(volume_id = %vol.id, target, error = %e, "rollback of interrupted publish failed");
                    report.failed += 1;
                }
            },
            Progress::Done if stage_ok && !teardown.is_published(path) => {
                let readonly =
                    publication.readonly || staged_readonly(&vol, node_id, &publication.capability);
                let staging = node.stage.as_ref().map(|s| Path::new(&s.path));
                let restored = match &exact {
                    Some(s) => {
                        s.publish(Publishing {
                            volume_id: &vol.id,
                            staging: if vol.ephemeral { None } else { staging },
                            target: path,
                            cap: &publication.capability,
                            readonly,
                        })
                        .await
                    }
                    None => Err(CsiError::FailedPrecondition("source unknown".into())),
                };
                match restored {
                    Ok(()) => report.restored += 1,
                    Err(e) => {
                        tracing::error!(volume_id = %vol.id, target, error = %e, "could not restore publication");
                        report.failed += 1;
                    }
                }
            }
            Progress::Done => {}
        }
    }
    // 3. An interrupted stage is undone once nothing is published from it.
    if let Some(stage) = node.stage.as_ref().filter(|s| s.progress != Progress::Done) {
        let published = vol.node(node_id).is_some_and(|n| !n.targets.is_empty());
        if !published {
            match teardown
                .unstage(Path::new(&stage.path), &stage.capability)
                .await
            {
                Ok(()) => {
                    vol = state::stage_removed(&vol, node_id);
                    report.rolled_back += 1;
                }
                Err(e) => {
                    tracing::warn!(volume_id = %vol.id, error = %e, "rollback of interrupted stage failed");
                    report.failed += 1;
                }
            }
        }
    }
    node_local::commit(d, &vol, node_id).await?;
    Ok(vol)
}
