//! Snapshots of volumes in use, and copy-on-write where the filesystem has
//! it: the copy is a clean filesystem image, and a sparse volume's copy
//! costs what its data costs.

use crate::{common, node_support};

use std::fs;
use std::os::unix::fs::MetadataExt;

use csi_relay::backends::local::sparse_copy::{copy_file, Method};
use csi_relay::csi::{self, volume_capability::access_mode::Mode};

use common::req::fs_cap;
use common::Driver;
use node_support::*;

// An ext4 volume staged on this node is frozen for the copy: the snapshot
// holds the data written just before it, with a clean journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_filesystem_is_frozen_for_its_snapshot() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let cap = fs_cap(Mode::SingleNodeWriter, "ext4", &[]);
    let v = ready_volume(&d, "frozen-src", 64 * MIB, cap.clone()).await;
    let target = d.path("pods/writer/vol");
    publish(&d, &v, &target, false).await;
    // Written, not synced: only a freeze gets it into the copy for sure.
    fs::write(target.join("data"), b"written just before the snapshot").unwrap();
    let snap = d
        .controller()
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: v.id.clone(),
            name: "frozen-snap".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    let log = d.log();
    assert!(
        log.contains("filesystem frozen for the snapshot copy"),
        "{log}"
    );
    assert!(!log.contains("cannot freeze"), "{log}");
    // Still writable afterwards: the filesystem was thawed.
    fs::write(target.join("after"), b"x").unwrap();

    let mut req = common::req::create("frozen-restore", 64 * MIB, cap.clone());
    req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Snapshot(
            csi::volume_content_source::SnapshotSource {
                snapshot_id: snap.snapshot_id.clone(),
            },
        )),
    });
    let vol = d
        .controller()
        .create_volume(req)
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    let mut restored = Vol {
        id: vol.volume_id,
        cap,
        staging: d.path("staging/frozen-restore"),
        context: vol.volume_context,
        publish_context: Default::default(),
    };
    controller_publish(&d, &mut restored, false).await;
    stage(&d, &restored).await;
    let t2 = d.path("pods/reader/vol");
    publish(&d, &restored, &t2, false).await;
    assert_eq!(
        fs::read(t2.join("data")).unwrap(),
        b"written just before the snapshot"
    );
    assert!(!t2.join("after").exists());
    unpublish(&d, &restored.id, &t2).await;
    destroy(&d, &restored).await;
    unpublish(&d, &v.id, &target).await;
    destroy(&d, &v).await;
    assert_clean(&d);
}

// The staging path of a volume whose mount is gone (a reboot, a lost
// mount) holds whatever is there now: here another filesystem of the
// test's own. A freeze applies to the filesystem that holds the path, so it
// must be refused unless the path is this volume's loop-device mount: the
// other filesystem stays writable, and the snapshot is crash-consistent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_volumes_own_filesystem_is_ever_frozen() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let cap = fs_cap(Mode::SingleNodeWriter, "ext4", &[]);
    let v = ready_volume(&d, "lost-mount", 64 * MIB, cap).await;
    // The mount goes from under the driver; another filesystem takes its
    // place at the staging path.
    run("umount", &[v.staging.to_str().unwrap()]);
    let img = d.path("other.img");
    fs::File::create(&img)
        .unwrap()
        .set_len(32 * MIB as u64)
        .unwrap();
    run("mkfs.ext4", &["-q", "-F", img.to_str().unwrap()]);
    run(
        "mount",
        &[
            "-o",
            "loop",
            img.to_str().unwrap(),
            v.staging.to_str().unwrap(),
        ],
    );
    let result = d
        .controller()
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: v.id.clone(),
            name: "lost-mount-snap".into(),
            ..Default::default()
        })
        .await;
    // Still writable: it was never frozen.
    fs::write(v.staging.join("after"), b"x").unwrap();
    run("umount", &[v.staging.to_str().unwrap()]);
    let log = d.log();
    assert!(result.is_ok(), "{result:?}");
    assert!(
        !log.contains("filesystem frozen for the snapshot copy"),
        "another filesystem was frozen: {log}"
    );
    assert!(log.contains("not frozen"), "{log}");
    destroy(&d, &v).await;
    assert_clean(&d);
}

// On XFS with reflink the copy shares the source's extents.
#[test]
fn xfs_copies_are_reflinks() {
    require_mounts!();
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("xfs.img");
    fs::File::create(&img)
        .unwrap()
        .set_len(512 * MIB as u64)
        .unwrap();
    let mkfs = std::process::Command::new("mkfs.xfs")
        .args(["-q", "-m", "reflink=1", img.to_str().unwrap()])
        .status();
    if !mkfs.is_ok_and(|s| s.success()) {
        common::skip("mkfs.xfs with reflink is not available");
        return;
    }
    let mnt = dir.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    run(
        "mount",
        &["-o", "loop", img.to_str().unwrap(), mnt.to_str().unwrap()],
    );
    let result = std::panic::catch_unwind(|| {
        let src = mnt.join("src.img");
        let f = fs::File::create(&src).unwrap();
        f.set_len(256 * MIB as u64).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&f, &[7u8; 1 << 20], 0).unwrap();
        f.sync_all().unwrap();
        let copied = copy_file(&src, &mnt.join("copy.img")).unwrap();
        assert_eq!(copied.method, Method::Reflink, "{copied:?}");
        assert_eq!(copied.data_bytes, 0);
        assert_eq!(
            fs::read(&src).unwrap(),
            fs::read(mnt.join("copy.img")).unwrap()
        );
        assert_eq!(
            fs::metadata(mnt.join("copy.img")).unwrap().size(),
            256 * MIB as u64
        );
    });
    run("umount", &[mnt.to_str().unwrap()]);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
