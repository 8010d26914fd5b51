//! Start-up reconciliation of this node's recorded state with the kernel's.
//!
//! Rules: work that was in flight when the driver stopped (`Applying` or
//! `Removing`) is rolled back completely: unmounted, detached and forgotten,
//! so the CO's retry starts clean. Finished work whose mount vanished is
//! restored; if that fails the volume stays recorded and NodeGetVolumeStats
//! reports it abnormal. Loop devices on this driver's volume files that no
//! record accounts for are detached.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::driver::Driver;
use crate::error::CsiResult;
use crate::mount::loopdev;
use crate::node::{
    ephemeral, mounter,
    stage::{default_fs, staged_readonly},
};
use crate::state;
use crate::volume::{Progress, Volume};

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
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
        let vol = reconcile_volume(d, vol, &node_id, &mut report).await?;
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

async fn reconcile_volume(
    d: &Driver,
    mut vol: Volume,
    node_id: &str,
    report: &mut Report,
) -> CsiResult<Volume> {
    let Some(node) = vol.node(node_id).cloned() else {
        return Ok(vol);
    };
    let source = d.backend.node_source(&vol)?;
    // 1. A finished stage comes back first: publications are bound from it.
    let mut stage_ok = true;
    if let Some(stage) = node.stage.as_ref().filter(|s| s.progress == Progress::Done) {
        if !mounter::is_mounted(&mounter::staged_source(
            Path::new(&stage.path),
            &stage.capability,
        )) {
            match mounter::stage(
                &source,
                Path::new(&stage.path),
                &stage.capability,
                default_fs(&vol),
                staged_readonly(&vol, node_id, &stage.capability),
            )
            .await
            {
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
            Progress::Applying | Progress::Removing => match mounter::unpublish(path) {
                Ok(()) => {
                    vol = state::publish_removed(&vol, node_id, target);
                    report.rolled_back += 1;
                }
                Err(e) => {
                    tracing::warn!(volume_id = %vol.id, target, error = %e, "rollback of interrupted publish failed");
                    report.failed += 1;
                }
            },
            Progress::Done if stage_ok && !mounter::is_mounted(path) => {
                let from = match (&vol.ephemeral, &node.stage) {
                    (true, _) => ephemeral::data_dir(d, &vol),
                    (false, Some(s)) => Ok(mounter::staged_source(
                        Path::new(&s.path),
                        &publication.capability,
                    )),
                    (false, None) => Err(crate::error::CsiError::Internal(
                        "publication without stage".into(),
                    )),
                };
                match from.and_then(|f| {
                    let readonly = publication.readonly
                        || staged_readonly(&vol, node_id, &publication.capability);
                    mounter::publish(&f, path, &publication.capability, readonly)
                }) {
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
            match mounter::unstage(&source, Path::new(&stage.path), &stage.capability).await {
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
    if vol.ephemeral && vol.nodes.is_empty() {
        ephemeral::remove(d, &vol).await?;
    } else {
        d.put_volume(&vol).await?;
    }
    Ok(vol)
}
