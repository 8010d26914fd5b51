//! CreateVolume, DeleteVolume and ControllerExpandVolume.
//!
//! CreateVolume commits a `Provisioning` record (and its name) before asking
//! the backend for storage, so a crash or a cancelled call leaves a record
//! that the CO's retry with the same name picks up and finishes, never an
//! orphaned allocation and never a second volume.

use std::collections::{BTreeMap, HashMap};

use crate::backends::SourceData;
use crate::csi::{self, volume_content_source::Type as SourceType};
use crate::domain::capability::Capability;
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::params::{self, VolumeParams};
use crate::domain::state::{self, CreateRequest, NewVolume, Repeat, Step};
use crate::domain::validate;
use crate::domain::volume::{Backing, ContentSource, Lifecycle, Volume};
use crate::ops::controller::wire;
use crate::ops::driver::{now, Driver};
use crate::rt::limiter::{volume_key, volume_name_key};
use crate::store::Limits;

/// Size of a volume whose request names no capacity.
pub const DEFAULT_VOLUME_SIZE: u64 = 1 << 30;
/// Smallest block-file volume: room for a filesystem's metadata.
pub const MIN_BLOCK_FILE_SIZE: u64 = 16 << 20;
const ALIGN: u64 = 4096;

/// The requested capacity range, checked.
#[derive(Debug, Clone, Copy)]
pub struct SizeRange {
    pub required: u64,
    pub limit: u64,
}

impl SizeRange {
    pub fn from_wire(range: Option<&csi::CapacityRange>) -> CsiResult<Self> {
        let Some(r) = range else {
            return Ok(SizeRange {
                required: 0,
                limit: 0,
            });
        };
        if r.required_bytes < 0 || r.limit_bytes < 0 {
            return Err(CsiError::invalid(
                "capacity_range",
                format!(
                    "required_bytes={} and limit_bytes={} must not be negative",
                    r.required_bytes, r.limit_bytes
                ),
            ));
        }
        if r.limit_bytes > 0 && r.limit_bytes < r.required_bytes {
            return Err(CsiError::invalid(
                "capacity_range",
                format!(
                    "limit_bytes={} is below required_bytes={}",
                    r.limit_bytes, r.required_bytes
                ),
            ));
        }
        Ok(SizeRange {
            required: r.required_bytes as u64,
            limit: r.limit_bytes as u64,
        })
    }

    /// The size to allocate: at least `floor`, aligned when the limit allows.
    fn choose(&self, floor: u64, max: u64) -> CsiResult<u64> {
        let wanted = if self.required > 0 {
            self.required
        } else if self.limit > 0 {
            self.limit.min(DEFAULT_VOLUME_SIZE)
        } else {
            DEFAULT_VOLUME_SIZE
        };
        let mut size = wanted.max(floor);
        let aligned = size.div_ceil(ALIGN) * ALIGN;
        if self.limit == 0 || aligned <= self.limit {
            size = aligned;
        }
        if self.limit > 0 && size > self.limit {
            return Err(CsiError::OutOfRange(format!(
                "the volume needs at least {size} bytes but limit_bytes is {}",
                self.limit
            )));
        }
        if size > max {
            return Err(CsiError::OutOfRange(format!(
                "{size} bytes requested; this driver's maximum volume size is {max} bytes"
            )));
        }
        Ok(size)
    }
}

fn decode_source(source: Option<&csi::VolumeContentSource>) -> CsiResult<Option<ContentSource>> {
    let Some(source) = source else {
        return Ok(None);
    };
    match &source.r#type {
        None => Err(CsiError::invalid(
            "volume_content_source",
            "type is missing: set snapshot or volume",
        )),
        Some(SourceType::Snapshot(s)) => Ok(Some(ContentSource::Snapshot(
            validate::id(&s.snapshot_id, "volume_content_source.snapshot.snapshot_id")?.to_string(),
        ))),
        Some(SourceType::Volume(v)) => Ok(Some(ContentSource::Volume(
            validate::id(&v.volume_id, "volume_content_source.volume.volume_id")?.to_string(),
        ))),
    }
}

/// Mutable parameters must all be ones the admin allowed (--mutable-parameters).
pub fn check_mutable(
    d: &Driver,
    params: &HashMap<String, String>,
) -> CsiResult<BTreeMap<String, String>> {
    validate::map(params, "mutable_parameters")?;
    let allowed = &d.config.mutable_parameters;
    let mut refused: Vec<&String> = params.keys().filter(|k| !allowed.contains(*k)).collect();
    if !refused.is_empty() {
        refused.sort();
        return Err(CsiError::invalid(
            "mutable_parameters",
            format!(
                "{refused:?} cannot be set or modified; this driver accepts only {:?} (--mutable-parameters)",
                allowed
            ),
        ));
    }
    Ok(params.clone().into_iter().collect())
}

pub async fn create_volume(
    d: &Driver,
    req: csi::CreateVolumeRequest,
) -> CsiResult<csi::CreateVolumeResponse> {
    let name = validate::id(&req.name, "name")?.to_string();
    let caps = Capability::list_from_wire(&req.volume_capabilities, "volume_capabilities")?;
    validate::map(&req.parameters, "parameters")?;
    validate::secrets(&req.secrets)?;
    let range = SizeRange::from_wire(req.capacity_range.as_ref())?;
    let typed: VolumeParams = params::decode(&req.parameters, "parameters")?;
    d.backend.check_parameters(&typed)?;
    let mutable = check_mutable(d, &req.mutable_parameters)?;
    let source = decode_source(req.volume_content_source.as_ref())?;
    // Looked up before placing (the copy's kind follows its source's); an
    // error counts only for a new volume: a repeated create succeeds even
    // once its source is gone.
    let source_facts = match &source {
        Some(src) => Some(source_facts(d, src).await),
        None => None,
    };
    let source_backing = source_facts
        .as_ref()
        .and_then(|f| f.as_ref().ok())
        .map(|(_, backing)| backing);
    let placement = d.backend.place(
        &name,
        &typed,
        &caps,
        req.accessibility_requirements.as_ref(),
        source_backing,
    )?;
    let parameters: BTreeMap<String, String> = req.parameters.into_iter().collect();

    let mut keys = vec![volume_name_key(&name)];
    if let Some(ContentSource::Volume(src)) = &source {
        keys.push(volume_key(src));
    }
    let _guard = d.limiter.try_acquire(&keys)?;

    // Reads run in place (see `Driver::find_volume`).
    let request = CreateRequest {
        name: &name,
        required_bytes: range.required,
        limit_bytes: range.limit,
        capabilities: &caps,
        parameters: &parameters,
        source: &source,
    };
    // Decided once: a record logged without its sync must get it below.
    let alone = overlap_syncs(&placement.backing);
    let existing = d.store.volume_by_name(&name)?;
    let id = existing.as_ref().map_or(&placement.id, |v| &v.id);
    d.settle_mirror(id, existing.as_ref()).await?;
    let (vol, overlap) = match existing {
        Some(existing) => match state::create_repeat(&existing, &request)? {
            Repeat::Created => return Ok(reply(&existing)),
            Repeat::Resume => (existing, alone),
        },
        None => {
            let floor = match &placement.backing {
                Backing::BlockFile { .. } => MIN_BLOCK_FILE_SIZE,
                Backing::Directory | Backing::Member { .. } => 0,
            };
            let mut size = range.choose(floor, d.config.max_volume_size)?;
            if let Some(facts) = source_facts {
                let (src_size, _) = facts?;
                if src_size > size {
                    if range.limit > 0 && src_size > range.limit {
                        return Err(CsiError::OutOfRange(format!(
                            "the source holds {src_size} bytes, more than limit_bytes={}",
                            range.limit
                        )));
                    }
                    size = src_size;
                }
            }
            // Checked where the record is logged, against every create and
            // growth logged before it: creates of other names run beside
            // this one.
            let within = Limits {
                attach: None,
                capacity: Some(d.backend.total_capacity().await?),
            };
            let (secs, _) = now();
            let overlap = alone;
            let vol = state::provisioning(NewVolume {
                id: placement.id,
                name: name.clone(),
                capacity_bytes: size,
                backing: placement.backing,
                capabilities: caps.clone(),
                parameters: parameters.clone(),
                mutable_parameters: mutable,
                source: source.clone(),
                topology: placement.topology,
                context: placement.context,
                created_unix: secs,
                ephemeral: false,
            });
            if overlap {
                d.put_intent_within(&vol, within).await?;
            } else {
                d.put_volume_limited(&vol, within).await?;
            }
            (vol, overlap)
        }
    };

    let made = if overlap {
        // The record is logged (a crash of this process keeps it), not yet
        // synced: the log's sync runs on another thread while this one
        // creates the data and syncs its directory. Both are durable before
        // the reply. A machine crash before that may keep the data without
        // the record: housekeeping reclaims data no record owns.
        let store = d.store.clone();
        let synced = crate::rt::offload::start(move || store.sync());
        let allocated = allocate(d, &vol).await;
        let synced = synced
            .await
            .map_err(|e| CsiError::Internal(format!("log sync failed: {e}")))?;
        let made = allocated?;
        synced?;
        made
    } else {
        match allocate(d, &vol).await {
            Ok(made) => made,
            Err(e) => {
                d.note_failure(&vol, "CreateVolume", &e).await;
                return Err(e);
            }
        }
    };
    let mut vol = state::provisioned(&vol);
    if let Some(backing) = made {
        vol.backing = backing;
    }
    match d.backend.created_context(&vol).await {
        Ok(extra) => vol.context.extend(extra),
        Err(e) => {
            d.note_failure(&vol, "CreateVolume", &e).await;
            return Err(e);
        }
    }
    // Local data renamed into place witnesses the creation: start-up turns
    // a `Provisioning` record whose data is there into `Ready`.
    d.put_outcome(&vol).await?;
    tracing::info!(volume_id = %vol.id, name = %vol.name, bytes = vol.capacity_bytes, backing = ?vol.backing, "volume created");
    Ok(reply(&vol))
}

/// Whether CreateVolume syncs the record's log and the new data's
/// directory at once rather than one after the other: for data on this
/// machine, when no other call is in flight. Alone, a create waits out both
/// syncs (measured at one client: 260-276 lifecycles/s one after the other,
/// 281-291 at once). Under load the group commits share each sync among
/// many calls, and a second thread per create costs more than it saves (64
/// clients, overlapping always: 838-855 against 884-950).
fn overlap_syncs(backing: &Backing) -> bool {
    #[cfg(test)]
    if tests::OVERLAP.with(std::cell::Cell::get) {
        return backing.is_local();
    }
    backing.is_local() && crate::rt::offload::calls_in_flight().is_some_and(|n| n <= 1)
}

/// Has the backend allocate a volume's storage from its content source.
/// NOT_FOUND is reserved to a missing content source: a backend's own "not
/// found" (a member namespace or class that does not exist) is a
/// precondition the admin must fix.
async fn allocate(d: &Driver, vol: &Volume) -> CsiResult<Option<Backing>> {
    let allocated = match &vol.source {
        None => d.backend.create_volume(vol, None).await,
        Some(ContentSource::Snapshot(id)) => {
            let snap = ready_snapshot(d, id).await?;
            d.backend
                .create_volume(vol, Some(SourceData::Snapshot(&snap)))
                .await
        }
        Some(ContentSource::Volume(id)) => {
            let src = d.volume(id).await?;
            if src.lifecycle != Lifecycle::Ready {
                return Err(CsiError::VolumeNotFound(id.clone()));
            }
            d.backend
                .create_volume(vol, Some(SourceData::Volume(&src)))
                .await
        }
    };
    allocated
}

fn reply(vol: &Volume) -> csi::CreateVolumeResponse {
    csi::CreateVolumeResponse {
        volume: Some(wire::volume(vol)),
    }
}

async fn ready_snapshot(d: &Driver, id: &str) -> CsiResult<crate::domain::volume::Snapshot> {
    let key = id.to_string();
    match d.db(move |s| s.snapshot(&key)).await? {
        Some(s) if s.lifecycle == Lifecycle::Ready => Ok(s),
        _ => Err(CsiError::SnapshotNotFound(id.to_string())),
    }
}

/// The size and kind of the data a new volume starts from.
async fn source_facts(d: &Driver, source: &ContentSource) -> CsiResult<(u64, Backing)> {
    match source {
        ContentSource::Snapshot(id) => {
            let s = ready_snapshot(d, id).await?;
            Ok((s.size_bytes, s.backing))
        }
        ContentSource::Volume(id) => {
            let v = d.volume(id).await?;
            if v.lifecycle != Lifecycle::Ready {
                return Err(CsiError::VolumeNotFound(id.clone()));
            }
            Ok((v.capacity_bytes, v.backing))
        }
    }
}

pub async fn delete_volume(
    d: &Driver,
    req: csi::DeleteVolumeRequest,
) -> CsiResult<csi::DeleteVolumeResponse> {
    let id = validate::id(&req.volume_id, "volume_id")?.to_string();
    validate::secrets(&req.secrets)?;
    let _guard = d.limiter.try_acquire(&[volume_key(&id)])?;
    let Some(vol) = d.volume_to_change(&id).await? else {
        // Deleting what does not exist is success: the CO may be retrying.
        return Ok(csi::DeleteVolumeResponse {});
    };
    let vol = match state::delete(&vol)? {
        Step::Unchanged => vol,
        Step::Next(marked) => {
            d.put_volume(&marked).await?;
            *marked
        }
    };
    if let Err(e) = d.backend.delete_volume(&vol).await {
        d.note_failure(&vol, "DeleteVolume", &e).await;
        return Err(e);
    }
    if let Some(left) = d.backend.left_behind(&vol) {
        // Its storage stays where it is: the volume's copy says so, where
        // the operator who declared the member lost looks.
        d.release_volume(&vol, &left).await?;
        return Ok(csi::DeleteVolumeResponse {});
    }
    // The durable `Deleting` record and the data's absence witness this:
    // start-up housekeeping finishes a lost removal.
    d.remove_outcome(&vol).await?;
    tracing::info!(volume_id = %vol.id, name = %vol.name, "volume deleted");
    Ok(csi::DeleteVolumeResponse {})
}

pub async fn expand_volume(
    d: &Driver,
    req: csi::ControllerExpandVolumeRequest,
) -> CsiResult<csi::ControllerExpandVolumeResponse> {
    let id = validate::id(&req.volume_id, "volume_id")?.to_string();
    let range = SizeRange::from_wire(Some(
        req.capacity_range
            .as_ref()
            .ok_or(CsiError::Missing("capacity_range"))?,
    ))?;
    if range.required == 0 && range.limit == 0 {
        return Err(CsiError::invalid(
            "capacity_range",
            "neither required_bytes nor limit_bytes is set",
        ));
    }
    validate::secrets(&req.secrets)?;
    if let Some(cap) = &req.volume_capability {
        // Optional, but a malformed one is still the caller's error.
        Capability::from_wire(cap, "volume_capability")?;
    }
    let _guard = d.limiter.try_acquire(&[volume_key(&id)])?;
    let vol = d.existing_volume_to_change(&id).await?;
    let target = if range.required > 0 {
        range.required
    } else {
        range.limit
    };
    let Step::Next(grown) = state::expand(&vol, target, d.config.max_volume_size)? else {
        // Already this size: a repeat, maybe of a call whose reply was lost
        // or that stopped between the record and the storage. The
        // backend's growth is idempotent, and says again whether the node
        // must finish it.
        let node_expansion_required = d.backend.expand_volume(&vol, vol.capacity_bytes).await?;
        return Ok(csi::ControllerExpandVolumeResponse {
            capacity_bytes: vol.capacity_bytes as i64,
            node_expansion_required,
        });
    };
    // The new size is recorded first, within the capacity (checked where it
    // is logged, against every create and growth before it), then the
    // storage grows.
    let within = Limits {
        attach: None,
        capacity: Some(d.backend.total_capacity().await?),
    };
    d.put_volume_limited(&grown, within).await?;
    // The backend says whether the node must finish it: a block file's
    // loop device and filesystem, a member volume whose driver grows the
    // filesystem where it is mounted.
    let node_expansion_required = match d.backend.expand_volume(&vol, target).await {
        Ok(required) => required,
        Err(e) => {
            // The size it had, so that what is reported and counted is what
            // the storage holds; the CO's retry starts over. (If this write
            // is lost too, the retry finds the new size and grows the
            // storage then.)
            if let Err(undo) = d.put_volume(&vol).await {
                tracing::warn!(volume_id = %vol.id, error = %undo, "cannot record the size back after a failed expansion; the retry grows the storage");
            }
            return Err(e);
        }
    };
    tracing::info!(volume_id = %vol.id, bytes = target, "volume expanded");
    Ok(csi::ControllerExpandVolumeResponse {
        capacity_bytes: target as i64,
        node_expansion_required,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::status::CsiCode;

    use std::sync::Arc;

    use crate::backends::local::LocalBackend;
    use crate::domain::settings::{DriverConfig, Mode};
    use crate::store::Store;

    thread_local! {
        /// Makes this thread's creates overlap their two syncs, as a create
        /// that runs alone in a server does (lib tests bound no calls, so
        /// `calls_in_flight` cannot tell).
        pub(super) static OVERLAP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    fn local_driver(dir: &std::path::Path) -> Driver {
        // Directories: the tests read the volumes' data names.
        let backend = LocalBackend::new(dir, "n1", &[], 1 << 30)
            .unwrap()
            .with_mount_default(crate::domain::settings::MountBacking::Directory);
        let config = DriverConfig {
            mode: Mode::All,
            ..DriverConfig::for_tests(dir, "n1", 1 << 30)
        };
        Driver::new(config, Store::open(dir).unwrap(), Arc::new(backend))
    }

    fn request(name: &str) -> csi::CreateVolumeRequest {
        use csi::volume_capability::{access_mode::Mode as M, AccessMode, AccessType};
        csi::CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 1 << 20,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![csi::VolumeCapability {
                access_mode: Some(AccessMode {
                    mode: M::SingleNodeWriter as i32,
                }),
                access_type: Some(AccessType::Mount(Default::default())),
            }],
            ..Default::default()
        }
    }

    /// The volumes' data the local backend holds (temporary copies aside).
    fn data(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join("volumes"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        names
    }

    // A lone create syncs its record's log while it makes the data. When
    // that sync fails, the CO hears it and nothing is lost or doubled: the
    // store takes no change until a restart, the restart finds the record
    // (logged) and its data (made), and the CO's retry gets that volume.
    #[tokio::test]
    async fn a_lone_create_whose_log_sync_fails_is_refused_and_its_retry_gets_the_one_volume() {
        OVERLAP.with(|o| o.set(true));
        let tmp = tempfile::tempdir().unwrap();
        let d = local_driver(tmp.path());
        d.store.fail_next_sync();
        let err = create_volume(&d, request("pvc-1")).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::Internal, "{err}");
        assert!(err.to_string().contains("restarted"), "{err}");
        let made = data(tmp.path());
        assert_eq!(made.len(), 1, "the data was made beside the sync");
        let refused = create_volume(&d, request("pvc-2")).await.unwrap_err();
        assert!(refused.to_string().contains("restarted"), "{refused}");

        drop(d);
        let d = local_driver(tmp.path());
        assert_eq!(
            crate::ops::housekeeping::promote_created(&d).await.unwrap(),
            1
        );
        let retry = create_volume(&d, request("pvc-1")).await.unwrap();
        let id = retry.volume.unwrap().volume_id;
        assert_eq!(made, vec![id.clone()], "the retry found the volume made");
        let report = crate::ops::housekeeping::sweep(&d).await.unwrap();
        assert_eq!(report.reclaimed_data, 0, "{report:?}");
        assert_eq!(data(tmp.path()), vec![id]);
        OVERLAP.with(|o| o.set(false));
    }

    // ControllerExpandVolume records the new size before the storage grows.
    // When the storage cannot grow, the old size is recorded again (what is
    // reported and counted is what the storage holds); a repeat of a growth
    // that went through asks the backend again whether the node must finish
    // it, since the first reply may have been lost.
    #[tokio::test]
    async fn a_failed_growth_records_the_old_size_and_a_repeat_asks_the_backend_again() {
        use csi::volume_capability::{AccessType, BlockVolume};
        let tmp = tempfile::tempdir().unwrap();
        let d = local_driver(tmp.path());
        let mut req = request("pvc-grow");
        req.volume_capabilities[0].access_type = Some(AccessType::Block(BlockVolume {}));
        let vol = create_volume(&d, req).await.unwrap().volume.unwrap();
        let size = vol.capacity_bytes as u64;
        let allocated = d.store.allocated_bytes().unwrap();
        let expand = |bytes: u64| csi::ControllerExpandVolumeRequest {
            volume_id: vol.volume_id.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: bytes as i64,
                limit_bytes: 0,
            }),
            ..Default::default()
        };
        let file = tmp
            .path()
            .join("volumes")
            .join(format!("{}.img", vol.volume_id));
        let kept = tmp.path().join("kept.img");
        std::fs::rename(&file, &kept).unwrap();
        let err = expand_volume(&d, expand(2 * size)).await.unwrap_err();
        assert!(err.to_string().contains("grow volume file"), "{err}");
        let record = d.volume(&vol.volume_id).await.unwrap();
        assert_eq!(
            record.capacity_bytes, size,
            "the old size is recorded again"
        );
        assert_eq!(d.store.allocated_bytes().unwrap(), allocated);

        std::fs::rename(&kept, &file).unwrap();
        let grown = expand_volume(&d, expand(2 * size)).await.unwrap();
        assert_eq!(grown.capacity_bytes as u64, 2 * size);
        assert!(grown.node_expansion_required);
        assert_eq!(std::fs::metadata(&file).unwrap().len(), 2 * size);
        let again = expand_volume(&d, expand(2 * size)).await.unwrap();
        assert!(again.node_expansion_required, "a repeat still says so");
    }

    // A sweep lists every volume's data; one a record owns is passed over
    // without taking its volume's turn, so a CO call on it that runs
    // meanwhile is not refused ABORTED. An orphan is still reclaimed.
    #[tokio::test]
    async fn a_sweep_leaves_a_live_volume_free_for_calls_and_reclaims_an_orphan() {
        let tmp = tempfile::tempdir().unwrap();
        let d = local_driver(tmp.path());
        let live = create_volume(&d, request("pvc-live")).await.unwrap();
        let id = live.volume.unwrap().volume_id;
        let orphan = "vol-00000000000000000000000000000001";
        std::fs::create_dir(tmp.path().join("volumes").join(orphan)).unwrap();

        let call = d
            .limiter
            .try_acquire(&[crate::rt::limiter::volume_key(&id)])
            .unwrap();
        let report = crate::ops::housekeeping::sweep(&d).await.unwrap();
        assert_eq!(
            report.busy, 0,
            "the sweep wanted the live volume: {report:?}"
        );
        assert_eq!(report.reclaimed_data, 1, "{report:?}");
        assert_eq!(data(tmp.path()), vec![id]);
        drop(call);
    }

    #[test]
    fn sizes_respect_the_range() {
        let r = SizeRange {
            required: 10,
            limit: 0,
        };
        assert_eq!(r.choose(0, u64::MAX).unwrap(), 4096);
        let r = SizeRange {
            required: 10,
            limit: 100,
        };
        assert_eq!(
            r.choose(0, u64::MAX).unwrap(),
            10,
            "no alignment beyond the limit"
        );
        assert_eq!(
            SizeRange {
                required: 0,
                limit: 0
            }
            .choose(0, u64::MAX)
            .unwrap(),
            DEFAULT_VOLUME_SIZE
        );
        assert_eq!(
            SizeRange {
                required: 5 << 30,
                limit: 0
            }
            .choose(0, 1 << 30)
            .unwrap_err()
            .code(),
            tonic::Code::OutOfRange
        );
        assert_eq!(
            SizeRange {
                required: 0,
                limit: 1 << 20
            }
            .choose(16 << 20, u64::MAX)
            .unwrap_err()
            .code(),
            tonic::Code::OutOfRange
        );
    }

    #[test]
    fn bad_ranges_are_invalid() {
        let bad = csi::CapacityRange {
            required_bytes: 10,
            limit_bytes: 5,
        };
        assert_eq!(
            SizeRange::from_wire(Some(&bad)).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        let neg = csi::CapacityRange {
            required_bytes: -1,
            limit_bytes: 0,
        };
        assert_eq!(
            SizeRange::from_wire(Some(&neg)).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
