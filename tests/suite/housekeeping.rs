//! Housekeeping: what a crash leaves behind and no CO call comes back for
//! is rolled back or reclaimed, and what a call may still need is kept.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use common::req::{create, snw};
use common::Driver;
use csi_relay::csi;
use csi_relay::domain::capability::Capability;
use csi_relay::domain::volume::{Backing, Lifecycle, Volume};
use csi_relay::store::Store;

const MIB: i64 = 1 << 20;

fn record(id: &str, name: &str, lifecycle: Lifecycle, age_secs: i64) -> Volume {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    Volume {
        id: id.into(),
        name: name.into(),
        capacity_bytes: MIB as u64,
        backing: Backing::Directory,
        capabilities: Capability::list_from_wire(&[snw()], "volume_capabilities").unwrap(),
        parameters: BTreeMap::new(),
        mutable_parameters: BTreeMap::new(),
        source: None,
        topology: vec![],
        context: BTreeMap::new(),
        created_unix: now - age_secs,
        lifecycle,
        ephemeral: false,
        nodes: BTreeMap::new(),
    }
}

fn entries(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

async fn listed(d: &Driver) -> BTreeSet<String> {
    d.volumes().await.into_iter().map(|v| v.volume_id).collect()
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates a 1 MiB mount volume named `name` and returns its id.
async fn create_id(d: &Driver, name: &str) -> String {
    d.controller()
        .create_volume(create(name, MIB, snw()))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap()
        .volume_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_creates_cut_deletes_and_orphaned_data_are_cleaned_up() {
    let mut d = Driver::start(&["--stale-provisioning-after", "600"]).await;
    let keep = create_id(&d, "keep").await;
    d.stop_gracefully().await;

    // What crashes leave: records of creates and deletes cut short, and
    // data without any record.
    let volumes = d.state_dir.join("volumes");
    let snapshots = d.state_dir.join("snapshots");
    {
        let store = Store::open(&d.state_dir).unwrap();
        // (id, lifecycle, age, data complete?)
        for (id, lifecycle, age, complete) in [
            ("vol-stale", Lifecycle::Provisioning, 7200, false),
            ("vol-fresh", Lifecycle::Provisioning, 0, false),
            ("vol-done", Lifecycle::Provisioning, 7200, true),
            ("vol-deleting", Lifecycle::Deleting, 0, true),
        ] {
            store
                .put_volume(&record(id, &format!("name-{id}"), lifecycle, age))
                .unwrap();
            // Unfinished data has a temporary name; finished data its own.
            let data = match complete {
                true => volumes.join(id),
                false => volumes.join(format!(".tmp-{id}")),
            };
            fs::create_dir(&data).unwrap();
            fs::write(data.join("data"), b"x").unwrap();
        }
    }
    fs::create_dir(volumes.join("vol-orphan")).unwrap();
    fs::write(volumes.join(".tmp-vol-orphan2.img"), b"half a copy").unwrap();
    fs::write(snapshots.join("snap-orphan.img"), b"x").unwrap();
    fs::write(volumes.join("not a volume"), b"left alone").unwrap();

    d.start_again().await;
    let expect: BTreeSet<String> = [
        keep.clone(),
        "vol-done".into(),
        ".tmp-vol-fresh".into(),
        "not a volume".into(),
    ]
    .into();
    until("the start-up sweep", || entries(&volumes) == expect).await;
    assert!(entries(&snapshots).is_empty(), "{:?}", entries(&snapshots));
    // A create whose data is complete was finished (its Ready commit was
    // lost): the CO may have been told it exists.
    assert_eq!(listed(&d).await, [keep.clone(), "vol-done".into()].into());
    // The fresh create is still the CO's to finish: its retry resumes it.
    let resumed = d
        .controller()
        .create_volume(create("name-vol-fresh", MIB, snw()))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(resumed.volume_id, "vol-fresh");
    // The stale one is gone, so a late retry of its name starts anew.
    let late = d
        .controller()
        .create_volume(create("name-vol-stale", MIB, snw()))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_ne!(late.volume_id, "vol-stale");
    let log = d.log();
    assert!(log.contains("rolled back a volume"), "{log}");
    assert!(
        log.contains("recorded Ready again after a restart"),
        "{log}"
    );
    assert!(log.contains("reclaimed data no record owns"), "{log}");
    assert!(
        log.contains("finished an interrupted DeleteVolume"),
        "{log}"
    );
}

// Random SIGKILLs under a concurrent create/delete load: after a restart
// and one sweep, the data directory holds exactly the volumes that exist.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_under_load_leave_no_orphaned_data() {
    const ROUNDS: u64 = 12;
    const CLIENTS: usize = 4;
    let mut d = Driver::start(&["--stale-provisioning-after", "0"]).await;
    let volumes = d.state_dir.join("volumes");
    let mut told_exists: BTreeSet<String> = BTreeSet::new();
    for round in 0..ROUNDS {
        let stop = Instant::now() + Duration::from_millis(20 + (round * 37) % 150);
        let clients = (0..CLIENTS).map(|c| {
            let mut ctl = d.controller();
            async move {
                let mut created = Vec::new();
                let mut deleted = Vec::new();
                let mut i = 0;
                while Instant::now() < stop {
                    let name = format!("r{round}-c{c}-{i}");
                    i += 1;
                    let Ok(v) = ctl.create_volume(create(&name, MIB, snw())).await else {
                        break;
                    };
                    let id = v.into_inner().volume.unwrap().volume_id;
                    if i % 2 == 0 {
                        // Asked to delete, it is gone or going whatever
                        // the answer: a cut-short delete is finished by
                        // housekeeping.
                        let _ = ctl
                            .delete_volume(csi::DeleteVolumeRequest {
                                volume_id: id.clone(),
                                ..Default::default()
                            })
                            .await;
                        deleted.push(id);
                        continue;
                    }
                    created.push(id);
                }
                (created, deleted)
            }
        });
        let load = tokio::spawn(futures::future::join_all(clients));
        tokio::time::sleep(stop - Instant::now()).await;
        d.crash();
        for (created, deleted) in load.await.unwrap() {
            told_exists.extend(created);
            for id in deleted {
                told_exists.remove(&id);
            }
        }
        d.start_again().await;
    }
    let exist = listed(&d).await;
    for id in &told_exists {
        assert!(
            exist.contains(id),
            "volume {id} the CO was told exists is lost"
        );
    }
    until("the sweep to reclaim every orphan", || {
        entries(&volumes) == exist.iter().cloned().collect::<BTreeSet<String>>()
    })
    .await;
}

// One undecodable record (a bug of an older version, a bit flip) must not
// stop the driver: it is quarantined and everything else is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_record_does_not_stop_start_up() {
    let mut d = Driver::start(&[]).await;
    let mut ids = Vec::new();
    for name in ["bad", "good"] {
        let id = create_id(&d, name).await;
        // Attached here, so the node's start-up reconciliation reads it.
        d.controller()
            .controller_publish_volume(csi::ControllerPublishVolumeRequest {
                volume_id: id.clone(),
                node_id: common::NODE.into(),
                volume_capability: Some(snw()),
                ..Default::default()
            })
            .await
            .unwrap();
        ids.push(id);
    }
    d.stop_gracefully().await;
    {
        let db = redb::Database::create(d.state_dir.join("state.redb")).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(redb::TableDefinition::<&str, &[u8]>::new("volumes"))
            .unwrap()
            .insert(ids[0].as_str(), b"\x00garbage".as_slice())
            .unwrap();
        txn.commit().unwrap();
    }
    d.start_again().await;
    assert_eq!(listed(&d).await, [ids[1].clone()].into());
    let gone = d
        .controller()
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: ids[0].clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound, "{}", gone.message());
    let log = d.log();
    assert!(log.contains("moved to quarantine"), "{log}");
}

// A loop device left over a deleted volume file (a losetup that outlived
// a crash attached it after the start-up sweep) is detached by the sweep;
// one over a live file is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loop_device_over_a_deleted_volume_file_is_detached() {
    require_mounts!();
    let d = Driver::start(&["--housekeeping-interval", "1"]).await;
    let volumes = d.state_dir.join("volumes");
    fs::create_dir_all(&volumes).unwrap();
    let attach = |file: &Path| {
        fs::write(file, vec![0u8; 1 << 20]).unwrap();
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(file)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let gone = volumes.join("vol-unlinked.img");
    let gone_dev = attach(&gone);
    fs::remove_file(&gone).unwrap();
    // A file outside the volumes directory is not the driver's.
    let foreign = d.path("foreign.img");
    let foreign_dev = attach(&foreign);
    let backing = |dev: &str| {
        let name = Path::new(dev)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()
    };
    until("the sweep to detach the device", || {
        backing(&gone_dev).is_none()
    })
    .await;
    fs::remove_file(&foreign).unwrap();
    // Sweeps run every second: give one the chance to (wrongly) act.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let still = backing(&foreign_dev);
    let _ = std::process::Command::new("losetup")
        .args(["--detach", &foreign_dev])
        .status();
    assert!(
        still.is_some(),
        "a device outside the volumes dir was detached"
    );
}

// Earlier builds made directory volumes ahead in `pool/` and renamed one
// into place with no sync of its own, the record standing for the rename.
// After an upgrade, what they left is settled at start: an entry a record
// owns (a rename a power cut undid) goes into place; any other is
// discarded, never handed out, since it may be a deleted volume's data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_builds_pool_leftovers_are_put_back_or_discarded() {
    let mut d = Driver::start(&[]).await;
    let volumes = d.state_dir.join("volumes");
    let id = create_id(&d, "pooled-before").await;
    d.crash();
    fs::create_dir_all(d.state_dir.join("pool/a")).unwrap();
    fs::create_dir_all(d.state_dir.join("pool/b")).unwrap();
    fs::rename(volumes.join(&id), d.state_dir.join("pool/a").join(&id)).unwrap();
    let stale = "vol-0123456789abcdef0123456789abcdef";
    fs::create_dir(d.state_dir.join("pool/b").join(stale)).unwrap();
    fs::write(d.state_dir.join("pool/b").join(stale).join("secret"), b"x").unwrap();
    d.start_again().await;
    assert!(volumes.join(&id).is_dir(), "the volume's directory is back");
    until("the stale entry and the pool to be gone", || {
        !d.state_dir.join("pool").exists()
    })
    .await;
    assert!(listed(&d).await.contains(&id));
    let v = create_id(&d, "after").await;
    assert_ne!(v, stale);
    assert!(fs::read_dir(volumes.join(&v)).unwrap().next().is_none());
    let log = d.log();
    assert!(log.contains("moved into place"), "{log}");
    assert!(log.contains("discarded the directories"), "{log}");
}
