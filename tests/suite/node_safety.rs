//! Node service safety: what a mount may be put over, what an access mode
//! promises, and what "already mounted" must mean before a repeat is
//! answered OK.

use crate::{common, node_support};

use std::fs;

use csi_relay::csi::volume_capability::access_mode::Mode;
use tonic::Code;

use common::req::{block_cap, fs_cap, mount_cap, snw};
use common::Driver;
use node_support::*;

// A reader-only access mode is read-only even when the CO leaves
// NodePublishVolume's readonly flag unset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_only_modes_are_mounted_read_only() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    for (name, cap) in [
        ("rox-dir", mount_cap(Mode::MultiNodeReaderOnly)),
        ("srox-ext4", fs_cap(Mode::SingleNodeReaderOnly, "ext4", &[])),
    ] {
        let v = ready_volume(&d, name, 32 * MIB, cap).await;
        let target = d.path(&format!("pods/{name}/vol"));
        publish(&d, &v, &target, false).await;
        let err = fs::write(target.join("x"), b"x")
            .expect_err("a reader-only volume must not be writable");
        assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{name}: {err}");
        // Idempotent repeat of the same request.
        publish(&d, &v, &target, false).await;
        unpublish(&d, &v.id, &target).await;
        destroy(&d, &v).await;
    }
    assert_clean(&d);
}

// ControllerPublishVolume(readonly=true): "the SP MUST publish the volume in
// readonly mode". Every publication on that node is read-only, mount flags
// (which need a bind remount) included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_attachment_is_read_only_on_the_node() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    for (name, cap) in [
        (
            "ro-attach-dir",
            fs_cap(Mode::SingleNodeWriter, "", &["nosuid"]),
        ),
        (
            "ro-attach-ext4",
            fs_cap(Mode::SingleNodeWriter, "ext4", &["noatime"]),
        ),
    ] {
        let mut v = create_volume(&d, name, 32 * MIB, cap).await;
        controller_publish(&d, &mut v, true).await;
        stage(&d, &v).await;
        let target = d.path(&format!("pods/{name}/vol"));
        publish(&d, &v, &target, true).await;
        let err = fs::write(target.join("x"), b"x").expect_err("read-only attachment");
        assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{name}: {err}");
        let rw_asked = d.path(&format!("pods/{name}-2/vol"));
        publish(&d, &v, &rw_asked, false).await;
        let err =
            fs::write(rw_asked.join("x"), b"x").expect_err("read-only attachment, rw publish");
        assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{name}: {err}");
        unpublish(&d, &v.id, &target).await;
        unpublish(&d, &v.id, &rw_asked).await;
        destroy(&d, &v).await;
    }
    assert_clean(&d);
}

// A reader-only raw block volume: a read-only bind of a device node does
// not stop writes to the device, so the device itself must be read-only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reader_only_raw_block_device_refuses_writes() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let v = ready_volume(
        &d,
        "rox-raw",
        16 * MIB,
        block_cap(Mode::MultiNodeReaderOnly),
    )
    .await;
    let target = d.path("plugins/volumeDevices/publish/rox-raw/pod-1");
    publish(&d, &v, &target, false).await;
    let mut dev = fs::File::open(&target).expect("readable");
    let mut buf = [0u8; 512];
    std::io::Read::read_exact(&mut dev, &mut buf).expect("read from a reader-only device");
    drop(dev);
    let write = fs::OpenOptions::new()
        .write(true)
        .open(&target)
        .and_then(|mut f| {
            std::io::Write::write_all(&mut f, &[1u8; 512]).and_then(|_| f.sync_all())
        });
    assert!(
        write.is_err(),
        "writing to a reader-only raw block volume must fail"
    );
    let out = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", &s(&target)])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "mkfs on a reader-only device must fail"
    );
    unpublish(&d, &v.id, &target).await;
    destroy(&d, &v).await;
    assert_clean(&d);
}

// Paths in the driver's own state dir are never mounted over: that would
// hide or redirect another volume's data (or the state store).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_in_the_state_dir_are_refused() {
    require_mounts!();
    let mut d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let victim = ready_volume(&d, "victim", 16 * MIB, snw()).await;
    let victim_dir = d.state_dir.join("volumes").join(&victim.id);
    fs::write(victim_dir.join("precious.txt"), b"victim data").unwrap();
    let v = ready_volume(&d, "attacker", 16 * MIB, snw()).await;

    for bad in [
        victim_dir.clone(),
        d.state_dir.clone(),
        d.state_dir.join("volumes"),
        d.state_dir.join("new/dir"),
    ] {
        expect_code(
            try_publish(&d, publish_req(&v, &bad, false)).await,
            Code::InvalidArgument,
            &format!("publish at {}", bad.display()),
        );
        assert!(
            !is_mounted(&bad),
            "{} must not be mounted over",
            bad.display()
        );
    }
    assert!(!d.state_dir.join("new").exists());
    assert_eq!(
        fs::read(victim_dir.join("precious.txt")).unwrap(),
        b"victim data"
    );

    let mut other = create_volume(&d, "stage-in-state", 16 * MIB, snw()).await;
    controller_publish(&d, &mut other, false).await;
    let mut bad = other.clone();
    bad.staging = d.state_dir.join("staging");
    expect_code(
        try_stage(&d, stage_req(&bad)).await,
        Code::InvalidArgument,
        "stage in the state dir",
    );
    assert!(!d.state_dir.join("staging").exists());
    // The refused request left no record: staging at a proper path works.
    stage(&d, &other).await;

    // A state dir named through a symlink is resolved when the driver
    // starts: its real location is refused just the same.
    d.stop();
    let real_state = d.state_dir.clone();
    let link = d.dir.path().join("state-link");
    std::os::unix::fs::symlink(&real_state, &link).unwrap();
    d.state_dir = link;
    d.start_again().await;
    for bad in [real_state.join("volumes/new"), real_state.join("new/dir")] {
        expect_code(
            try_publish(&d, publish_req(&v, &bad, false)).await,
            Code::InvalidArgument,
            &format!("publish at {} (state dir named by a link)", bad.display()),
        );
        assert!(!bad.exists(), "{} must not be created", bad.display());
    }

    // Everything still unwinds.
    destroy(&d, &other).await;
    destroy(&d, &v).await;
    destroy(&d, &victim).await;
    assert_clean(&d);
}

// A target that is already a mount point of something else is not "already
// published": answering OK would hand the workload the wrong data.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_mount_at_the_target_is_not_success() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let a = ready_volume(&d, "a", 16 * MIB, snw()).await;
    let b = ready_volume(&d, "b", 16 * MIB, snw()).await;
    let target = d.path("pods/p1/vol");
    publish(&d, &a, &target, false).await;
    fs::write(target.join("a.txt"), b"volume a").unwrap();

    // The CO (wrongly) publishes b at the same target.
    expect_code(
        try_publish(&d, publish_req(&b, &target, false)).await,
        Code::FailedPrecondition,
        "publish b where a is mounted",
    );
    assert_eq!(mounts_at(&target).len(), 1);
    assert_eq!(fs::read(target.join("a.txt")).unwrap(), b"volume a");
    // b is not recorded as published there: it can be unstaged.
    unstage(&d, &b).await;
    stage(&d, &b).await;

    // A staging path already holding another volume's mount.
    let mut c = create_volume(
        &d,
        "c",
        16 * MIB,
        fs_cap(Mode::SingleNodeWriter, "ext4", &[]),
    )
    .await;
    controller_publish(&d, &mut c, false).await;
    let mut c_at_b = c.clone();
    c_at_b.staging = b.staging.clone();
    expect_code(
        try_stage(&d, stage_req(&c_at_b)).await,
        Code::FailedPrecondition,
        "stage c over b's staging",
    );
    assert_eq!(mounts_at(&b.staging).len(), 1);
    assert!(
        loops_of(&d).is_empty(),
        "the refused stage left no loop device: {:?}",
        loops_of(&d)
    );
    stage(&d, &c).await;

    unpublish(&d, &a.id, &target).await;
    destroy(&d, &a).await;
    destroy(&d, &b).await;
    destroy(&d, &c).await;
    assert_clean(&d);
}

#[tokio::test]
async fn node_member_joins_the_node_topology() {
    let d = common::Driver::start(&["--node-member", "east"]).await;
    let info = d
        .node()
        .node_get_info(csi_relay::csi::NodeGetInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let segments = info.accessible_topology.unwrap().segments;
    assert_eq!(
        segments
            .get("topology.relay.csi.dev/member")
            .map(String::as_str),
        Some("east")
    );
    assert_eq!(
        segments
            .get("topology.relay.csi.dev/node")
            .map(String::as_str),
        Some(common::NODE)
    );
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_csi-relay"))
        .args(["serve", "--node-id", "n", "--node-member", "Not_A_Label"])
        .arg("--state-dir")
        .arg(d.path("other-state"))
        .arg("--endpoint")
        .arg(format!("unix://{}", d.path("other.sock").display()))
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--node-member"));
}

// A target at, inside or above the staging path would bind the staged
// volume onto itself, and unstaging would then fail for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_overlapping_the_staging_path_is_refused() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let v = ready_volume(&d, "overlap", 32 * MIB, mount_cap(Mode::SingleNodeWriter)).await;
    let link = d.path("pods/link-into-staging");
    fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&v.staging, &link).unwrap();
    for target in [v.staging.clone(), v.staging.join("inner"), link.join("vol")] {
        let err = expect_code(
            try_publish(&d, publish_req(&v, &target, false)).await,
            Code::InvalidArgument,
            "target overlapping staging",
        );
        assert!(
            err.message().contains("target_path") && err.message().contains("staging_target_path"),
            "{}",
            err.message()
        );
    }
    assert!(!is_mounted(&v.staging.join("inner")));
    fs::remove_file(&link).unwrap();
    destroy(&d, &v).await;
    assert_clean(&d);
}
