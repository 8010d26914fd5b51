//! The CSI Node service against a real `csi-relay serve --mode all` process:
//! real bind mounts, loop devices and filesystems, checked through the
//! kernel's own accounts (/proc/self/mountinfo, /sys/block/loop*).
//!
//! Every mounting test unwinds what it created and then asserts that no mount
//! and no loop device references its temp dir any more.

use crate::{common, node_support};

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use csi_relay::csi::{
    self, node_service_capability, volume_capability::access_mode::Mode, volume_usage::Unit,
};
use tonic::Code;

use common::req::{block_cap, fs_cap, mount_cap, snw};
use common::{Driver, NODE};
use node_support::*;

fn usage(r: &csi::NodeGetVolumeStatsResponse, unit: Unit) -> csi::VolumeUsage {
    r.usage
        .iter()
        .find(|u| u.unit == unit as i32)
        .cloned()
        .unwrap_or_else(|| panic!("no {unit:?} usage in {r:?}"))
}

fn condition(r: &csi::NodeGetVolumeStatsResponse) -> csi::VolumeCondition {
    r.volume_condition
        .clone()
        .expect("VOLUME_CONDITION is advertised: stats must carry a condition")
}

// Node work on a local volume waits for no sync of its own: its intents
// and outcomes reach the log (a crash of the driver keeps them) and what
// they guard, a mount, does not outlive the machine. ControllerPublish,
// which nothing else witnesses, waits for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_work_on_a_local_volume_waits_for_no_sync() {
    require_mounts!();
    let addr = free_addr();
    let d = Driver::start(&["--metrics-address", &addr]).await;
    let _scrub = Scrub::new(&d);
    let commits = r#"csi_relay_store_syncs_total{cause="commit"}"#;
    let mut v = create_volume(&d, "no-sync", MIB, mount_cap(Mode::SingleNodeWriter)).await;
    let before = metric(&addr, commits).await;
    controller_publish(&d, &mut v, false).await;
    let published = metric(&addr, commits).await;
    assert_eq!(published, before + 1.0, "ControllerPublishVolume syncs");
    let target = d.path("pods/p1/volumes/vol");
    stage(&d, &v).await;
    publish(&d, &v, &target, false).await;
    assert!(is_mounted(&target));
    unpublish(&d, &v.id, &target).await;
    unstage(&d, &v).await;
    assert_eq!(
        metric(&addr, commits).await,
        published,
        "NodeStage, NodePublish, NodeUnpublish and NodeUnstage of a local volume sync nothing"
    );
    controller_unpublish(&d, &v).await;
    delete_volume(&d, &v.id).await;
}

// 1. Directory volume, two targets of a MULTI_NODE_MULTI_WRITER volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_volume_full_lifecycle() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let v = ready_volume(
        &d,
        "dir-life",
        16 * MIB,
        mount_cap(Mode::MultiNodeMultiWriter),
    )
    .await;
    let backing = d.state_dir.join("volumes").join(&v.id);
    assert!(
        backing.is_dir(),
        "a plain mount volume is a directory in the state dir"
    );
    let staged = mounts_at(&v.staging);
    assert_eq!(staged.len(), 1, "staged exactly once: {staged:?}");

    let t1 = d.path("pods/p1/volumes/vol");
    let t2 = d.path("pods/p2/volumes/vol");
    publish(&d, &v, &t1, false).await;
    publish(&d, &v, &t2, false).await;
    assert!(
        t1.is_dir() && t2.is_dir(),
        "the driver creates mount targets as directories"
    );
    assert!(is_mounted(&t1) && is_mounted(&t2));

    fs::write(t1.join("hello.txt"), b"written through t1").expect("write through target 1");
    assert_eq!(
        fs::read(t2.join("hello.txt")).expect("read through target 2"),
        b"written through t1"
    );
    assert_eq!(
        fs::read(backing.join("hello.txt")).expect("read in the backing dir"),
        b"written through t1"
    );
    fs::write(backing.join("back.txt"), b"from the backend").unwrap();
    assert_eq!(fs::read(t1.join("back.txt")).unwrap(), b"from the backend");

    let st = stats(&d, &v.id, &s(&t1))
        .await
        .expect("NodeGetVolumeStats on a target");
    // The directory's own figure, not the state-dir filesystem's: its
    // capacity, and what its files take (two small files, the dir itself).
    let bytes = usage(&st, Unit::Bytes);
    assert_eq!(bytes.total, 16 * MIB, "{bytes:?}");
    assert!(bytes.used >= 8 << 10 && bytes.used < 256 << 10, "{bytes:?}");
    assert_eq!(bytes.available, bytes.total - bytes.used, "{bytes:?}");
    fs::write(t1.join("mebibyte"), vec![1u8; MIB as usize]).unwrap();
    let grown = usage(&stats(&d, &v.id, &s(&t2)).await.unwrap(), Unit::Bytes);
    assert!(
        grown.used >= bytes.used + MIB && grown.used < bytes.used + 2 * MIB,
        "a MiB written shows as a MiB used: {bytes:?} then {grown:?}"
    );
    let inodes = usage(&st, Unit::Inodes);
    assert!(
        inodes.total > 0 && inodes.used > 0 && inodes.used <= inodes.total,
        "{inodes:?}"
    );
    assert!(!condition(&st).abnormal, "{:?}", st.volume_condition);
    let st = stats(&d, &v.id, &s(&v.staging))
        .await
        .expect("NodeGetVolumeStats on the staging path");
    assert!(!condition(&st).abnormal);

    unpublish(&d, &v.id, &t1).await;
    assert!(
        is_mounted(&t2),
        "unpublishing one target leaves the other alone"
    );
    assert_eq!(
        fs::read(t2.join("hello.txt")).unwrap(),
        b"written through t1"
    );
    unpublish(&d, &v.id, &t2).await;
    unstage(&d, &v).await;
    assert!(!is_mounted(&v.staging));
    assert!(
        v.staging.is_dir(),
        "the staging dir belongs to the CO: it is left in place"
    );
    controller_unpublish(&d, &v).await;
    delete_volume(&d, &v.id).await;
    assert!(!backing.exists(), "DeleteVolume removes the backing dir");
    assert_clean(&d);
}

// Plain mount access by default: a block file with a filesystem of the
// volume's size, so a pod cannot write past its claim and df, the kubelet's
// stats and the claim agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_mount_access_gets_a_filesystem_of_the_volumes_size_by_default() {
    require_mounts!();
    let d = Driver::start(&["--default-mount-backing=block"]).await;
    let _scrub = Scrub::new(&d);
    let v = ready_volume(&d, "sized", 32 * MIB, mount_cap(Mode::SingleNodeWriter)).await;
    let img = d.state_dir.join("volumes").join(format!("{}.img", v.id));
    assert!(img.is_file(), "a block file backs the volume");
    assert_eq!(fs::metadata(&img).unwrap().len(), 32 * MIB as u64);
    let target = d.path("pods/p1/volumes/vol");
    publish(&d, &v, &target, false).await;
    let total = fs_size(&target);
    assert!(
        total > 24 * MIB as u64 && total <= 32 * MIB as u64,
        "the filesystem has the volume's size, less its own metadata: {total}"
    );
    let st = stats(&d, &v.id, &s(&target)).await.unwrap();
    let bytes = usage(&st, Unit::Bytes);
    assert_eq!(bytes.total as u64, total, "{bytes:?}");
    // 48 MiB do not fit in a 32 MiB volume.
    let err = fs::write(target.join("too-much"), vec![3u8; 48 * MIB as usize])
        .expect_err("a write larger than the volume must fail");
    assert_eq!(err.raw_os_error(), Some(28), "ENOSPC, got {err}");
    unpublish(&d, &v.id, &target).await;
    destroy(&d, &v).await;
    assert!(!img.exists());
    assert_clean(&d);
}

// 2. ext4 on a loop device; data survives unstage + restage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext4_volume_data_survives_restage() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let v = ready_volume(
        &d,
        "ext4-life",
        64 * MIB,
        fs_cap(Mode::SingleNodeWriter, "ext4", &[]),
    )
    .await;
    let img = d.state_dir.join("volumes").join(format!("{}.img", v.id));
    assert_eq!(
        fs::metadata(&img).expect("block-file volume").len(),
        64 * MIB as u64
    );
    let staged = mounts_at(&v.staging);
    assert_eq!(staged.len(), 1, "{staged:?}");
    assert_eq!(staged[0].fs_type, "ext4");
    assert!(staged[0].source.starts_with("/dev/loop"), "{staged:?}");
    let loops = loops_of(&d);
    assert_eq!(
        loops.len(),
        1,
        "one loop device per staged volume: {loops:?}"
    );
    assert_eq!(loops[0].0, staged[0].source);

    let target = d.path("pods/p1/volumes/data");
    publish(&d, &v, &target, false).await;
    assert_eq!(mounts_at(&target)[0].fs_type, "ext4");
    fs::create_dir(target.join("sub")).unwrap();
    fs::write(target.join("sub/data.bin"), vec![0xA5u8; 3 * 1024 * 1024]).unwrap();

    let st = stats(&d, &v.id, &s(&target)).await.unwrap();
    let bytes = usage(&st, Unit::Bytes);
    assert!(
        bytes.total > 32 * MIB && bytes.total <= 64 * MIB,
        "the filesystem's own size: {bytes:?}"
    );
    assert!(bytes.used >= 3 * MIB, "{bytes:?}");
    assert!(usage(&st, Unit::Inodes).used >= 2);
    assert!(!condition(&st).abnormal);

    // Down to NODE_READY: nothing mounted, no loop device.
    unpublish(&d, &v.id, &target).await;
    unstage(&d, &v).await;
    assert!(!is_mounted(&v.staging));
    assert!(
        loops_of(&d).is_empty(),
        "unstage detaches the loop device: {:?}",
        loops_of(&d)
    );
    assert_clean(&d);

    // Up again: the same filesystem (not a fresh mkfs) with the data.
    stage(&d, &v).await;
    publish(&d, &v, &target, false).await;
    assert_eq!(
        fs::read(target.join("sub/data.bin")).unwrap(),
        vec![0xA5u8; 3 * 1024 * 1024]
    );

    unpublish(&d, &v.id, &target).await;
    destroy(&d, &v).await;
    assert!(!img.exists());
    assert_clean(&d);
}

// 3. Read-only publication.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_publish_refuses_writes() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    for (name, cap) in [
        ("ro-dir", snw()),
        ("ro-ext4", fs_cap(Mode::SingleNodeWriter, "ext4", &[])),
    ] {
        let v = ready_volume(&d, name, 32 * MIB, cap).await;
        let rw = d.path(&format!("pods/{name}-rw/vol"));
        let ro = d.path(&format!("pods/{name}-ro/vol"));
        publish(&d, &v, &rw, false).await;
        publish(&d, &v, &ro, true).await;
        fs::write(rw.join("seen.txt"), b"visible read-only").unwrap();
        assert_eq!(
            fs::read(ro.join("seen.txt")).unwrap(),
            b"visible read-only",
            "{name}"
        );
        let err = fs::write(ro.join("nope.txt"), b"x")
            .expect_err("a read-only target must refuse writes");
        assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{name}: {err}");
        let err = fs::remove_file(ro.join("seen.txt")).expect_err("nor deletes");
        assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{name}: {err}");
        let m = mounts_at(&ro);
        assert!(m.last().unwrap().options.iter().any(|o| o == "ro"), "{m:?}");
        // The read-only bind must not have turned the staging mount read-only.
        fs::write(rw.join("still-rw.txt"), b"ok").expect("the rw target stays writable");
        assert!(!mounts_at(&v.staging)[0].options.iter().any(|o| o == "ro"));

        unpublish(&d, &v.id, &ro).await;
        unpublish(&d, &v.id, &rw).await;
        destroy(&d, &v).await;
    }
    assert_clean(&d);
}

// 4. Raw block: the target is a device file the workload can mkfs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_block_volume_is_a_usable_device() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let v = ready_volume(&d, "raw", 32 * MIB, block_cap(Mode::SingleNodeWriter)).await;
    let device = v.staging.join("device");
    assert!(
        is_mounted(&device),
        "a raw block volume is staged as {}",
        device.display()
    );
    assert_eq!(loops_of(&d).len(), 1);

    let target = d.path("plugins/volumeDevices/publish/raw/pod-1");
    publish(&d, &v, &target, false).await;
    let meta = fs::metadata(&target).expect("the target exists");
    assert!(
        !meta.is_dir(),
        "a raw block target is a file, not a directory"
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(
        meta.file_type().is_block_device(),
        "the target is the device itself"
    );
    assert!(is_mounted(&target));

    let t = s(&target);
    run("mkfs.ext4", &["-q", "-F", &t]);
    let out = run("blkid", &["-p", "-o", "value", "-s", "TYPE", &t]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ext4");

    let st = stats(&d, &v.id, &t).await.expect("stats of a block target");
    let bytes = usage(&st, Unit::Bytes);
    assert_eq!(bytes.total, 32 * MIB, "{st:?}");
    assert!(!condition(&st).abnormal);

    // The kubelet asks at its own map path, a bind of the published device.
    let map_path = d.path("plugins/volumeDevices/raw/dev/pod-1");
    fs::create_dir_all(map_path.parent().unwrap()).unwrap();
    fs::write(&map_path, b"").unwrap();
    run("mount", &["--bind", &t, &s(&map_path)]);
    let st = stats(&d, &v.id, &s(&map_path)).await;
    run("umount", &[&s(&map_path)]);
    let st = st.expect("stats at the kubelet's map path of the device");
    assert_eq!(usage(&st, Unit::Bytes).total, 32 * MIB, "{st:?}");
    // Another file there is not the volume.
    let err = stats(&d, &v.id, &s(&map_path)).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");

    // Idempotent on block too.
    publish(&d, &v, &target, false).await;
    assert_eq!(mounts_at(&target).len(), 1);

    unpublish(&d, &v.id, &target).await;
    destroy(&d, &v).await;
    assert!(
        !device.exists(),
        "unstage removes the device file it created"
    );
    assert_clean(&d);
}

// 5. Idempotent repeats and the spec's error codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeats_are_idempotent_and_errors_follow_the_spec() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let v = create_volume(&d, "idem", 16 * MIB, snw()).await;

    // Out of order: stage before ControllerPublish.
    fs::create_dir_all(&v.staging).unwrap();
    expect_code(
        try_stage(&d, stage_req(&v)).await,
        Code::FailedPrecondition,
        "stage before ControllerPublish",
    );
    assert!(!is_mounted(&v.staging));
    let mut v = v;
    controller_publish(&d, &mut v, false).await;
    // Out of order: publish before stage.
    let target = d.path("pods/p1/vol");
    expect_code(
        try_publish(&d, publish_req(&v, &target, false)).await,
        Code::FailedPrecondition,
        "publish before stage",
    );
    assert!(!target.exists(), "a refused publish creates nothing");

    for _ in 0..3 {
        stage(&d, &v).await;
    }
    assert_eq!(mounts_at(&v.staging).len(), 1, "repeated stages mount once");
    for _ in 0..3 {
        publish(&d, &v, &target, false).await;
    }
    assert_eq!(mounts_at(&target).len(), 1, "repeated publishes mount once");

    // Conflicts with what is already in effect.
    let mut other = v.clone();
    other.cap = fs_cap(Mode::SingleNodeWriter, "", &["noatime"]);
    expect_code(
        try_stage(&d, stage_req(&other)).await,
        Code::AlreadyExists,
        "stage with another capability",
    );
    expect_code(
        try_publish(&d, publish_req(&v, &target, true)).await,
        Code::AlreadyExists,
        "publish again with readonly changed",
    );
    let mut elsewhere = v.clone();
    elsewhere.staging = d.path("staging-elsewhere");
    fs::create_dir_all(&elsewhere.staging).unwrap();
    expect_code(
        try_stage(&d, stage_req(&elsewhere)).await,
        Code::FailedPrecondition,
        "stage at a second path",
    );
    expect_code(
        try_publish(&d, publish_req(&elsewhere, &d.path("pods/p9/vol"), false)).await,
        Code::FailedPrecondition,
        "publish from a path that is not the staging path",
    );
    assert!(!is_mounted(&elsewhere.staging));
    expect_code(
        try_unstage(&d, &v.id, &v.staging).await,
        Code::FailedPrecondition,
        "unstage while published",
    );
    assert!(is_mounted(&v.staging) && is_mounted(&target));

    // Unknown volumes and paths.
    let mut ghost = v.clone();
    ghost.id = "no-such-volume".into();
    expect_code(
        try_stage(&d, stage_req(&ghost)).await,
        Code::NotFound,
        "stage of an unknown volume",
    );
    expect_code(
        try_publish(&d, publish_req(&ghost, &d.path("pods/g/vol"), false)).await,
        Code::NotFound,
        "publish of unknown volume",
    );
    expect_code(
        try_unpublish(&d, "no-such-volume", &target).await,
        Code::NotFound,
        "unpublish of an unknown volume",
    );
    expect_code(
        stats(&d, "no-such-volume", &s(&target)).await,
        Code::NotFound,
        "stats of an unknown volume",
    );
    expect_code(
        stats(&d, &v.id, "some/path").await,
        Code::NotFound,
        "stats where it is not published",
    );
    expect_code(
        stats(&d, &v.id, &s(&d.path("pods/p2/vol"))).await,
        Code::NotFound,
        "stats at an unknown target",
    );
    assert!(
        is_mounted(&target),
        "errors must not disturb the publication"
    );

    // Missing fields.
    let mut r = stage_req(&v);
    r.volume_id.clear();
    expect_code(
        try_stage(&d, r).await,
        Code::InvalidArgument,
        "stage without volume_id",
    );
    let mut r = stage_req(&v);
    r.staging_target_path.clear();
    expect_code(
        try_stage(&d, r).await,
        Code::InvalidArgument,
        "stage without staging path",
    );
    let mut r = stage_req(&v);
    r.volume_capability = None;
    expect_code(
        try_stage(&d, r).await,
        Code::InvalidArgument,
        "stage without capability",
    );
    let mut r = publish_req(&v, &target, false);
    r.volume_id.clear();
    expect_code(
        try_publish(&d, r).await,
        Code::InvalidArgument,
        "publish without volume_id",
    );
    let mut r = publish_req(&v, &target, false);
    r.target_path.clear();
    expect_code(
        try_publish(&d, r).await,
        Code::InvalidArgument,
        "publish without target",
    );
    let mut r = publish_req(&v, &target, false);
    r.staging_target_path.clear();
    expect_code(
        try_publish(&d, r).await,
        Code::InvalidArgument,
        "publish without staging path",
    );
    let mut r = publish_req(&v, &target, false);
    r.volume_capability = None;
    expect_code(
        try_publish(&d, r).await,
        Code::InvalidArgument,
        "publish without capability",
    );
    expect_code(
        try_unpublish(&d, "", &target).await,
        Code::InvalidArgument,
        "unpublish without volume_id",
    );
    expect_code(
        try_unpublish(&d, &v.id, Path::new("")).await,
        Code::InvalidArgument,
        "unpublish without target",
    );
    expect_code(
        try_unstage(&d, "", &v.staging).await,
        Code::InvalidArgument,
        "unstage without volume_id",
    );
    expect_code(
        try_unstage(&d, &v.id, Path::new("")).await,
        Code::InvalidArgument,
        "unstage without staging path",
    );
    expect_code(
        stats(&d, "", &s(&target)).await,
        Code::InvalidArgument,
        "stats without volume_id",
    );
    expect_code(
        stats(&d, &v.id, "").await,
        Code::InvalidArgument,
        "stats without path",
    );
    let expand = |id: &str, path: &str| csi::NodeExpandVolumeRequest {
        volume_id: id.into(),
        volume_path: path.into(),
        ..Default::default()
    };
    expect_code(
        d.node().node_expand_volume(expand("", &s(&target))).await,
        Code::InvalidArgument,
        "expand without id",
    );
    expect_code(
        d.node().node_expand_volume(expand(&v.id, "")).await,
        Code::InvalidArgument,
        "expand without path",
    );
    expect_code(
        d.node()
            .node_expand_volume(expand(&v.id, &s(&d.path("pods/p2/vol"))))
            .await,
        Code::NotFound,
        "expand where it is not published",
    );

    // System paths are refused, and nothing is mounted or created there.
    // Judged against what was mounted under /etc before (the machine's own,
    // or another program's meanwhile, are not this test's to judge).
    let under_etc = || -> std::collections::BTreeSet<std::path::PathBuf> {
        mounts()
            .into_iter()
            .map(|m| m.mount_point)
            .filter(|p| p.starts_with("/etc"))
            .collect()
    };
    let etc_before = under_etc();
    let etc_x = Path::new("/etc/x");
    let existed = etc_x.exists();
    expect_code(
        try_publish(&d, publish_req(&v, etc_x, false)).await,
        Code::InvalidArgument,
        "publish at /etc/x",
    );
    assert_eq!(etc_x.exists(), existed, "/etc/x must be left alone");
    assert_eq!(under_etc(), etc_before, "nothing may be mounted at /etc/x");
    let link = d.path("sneaky");
    std::os::unix::fs::symlink("/etc", &link).unwrap();
    expect_code(
        try_publish(&d, publish_req(&v, &link.join("x"), false)).await,
        Code::InvalidArgument,
        "publish through a symlink into /etc",
    );
    assert_eq!(under_etc(), etc_before, "nothing may be mounted under /etc");

    // Repeats of the reversal.
    for _ in 0..3 {
        unpublish(&d, &v.id, &target).await;
    }
    // A refused publish must not have left a record that blocks unstaging.
    for _ in 0..3 {
        unstage(&d, &v).await;
    }
    assert!(!is_mounted(&v.staging));
    expect_code(
        try_publish(&d, publish_req(&v, &target, false)).await,
        Code::FailedPrecondition,
        "publish after unstage",
    );

    // SINGLE_NODE_SINGLE_WRITER: one target only.
    let sw = ready_volume(
        &d,
        "single-writer",
        16 * MIB,
        mount_cap(Mode::SingleNodeSingleWriter),
    )
    .await;
    let a = d.path("pods/sw-a/vol");
    let b = d.path("pods/sw-b/vol");
    publish(&d, &sw, &a, false).await;
    publish(&d, &sw, &a, false).await;
    expect_code(
        try_publish(&d, publish_req(&sw, &b, false)).await,
        Code::FailedPrecondition,
        "second SNSW target",
    );
    assert!(!b.exists() && !is_mounted(&b));
    unpublish(&d, &sw.id, &a).await;
    publish(&d, &sw, &b, false).await;
    unpublish(&d, &sw.id, &b).await;
    destroy(&d, &sw).await;

    // A staging path in /etc is refused too, and leaves no record behind.
    let mut sys = create_volume(&d, "sys-staging", 16 * MIB, snw()).await;
    controller_publish(&d, &mut sys, false).await;
    let mut bad = sys.clone();
    bad.staging = "/etc/x-staging".into();
    expect_code(
        try_stage(&d, stage_req(&bad)).await,
        Code::InvalidArgument,
        "stage at /etc",
    );
    assert!(!Path::new("/etc/x-staging").exists());
    stage(&d, &sys).await;
    destroy(&d, &sys).await;

    controller_unpublish(&d, &v).await;
    delete_volume(&d, &v.id).await;
    assert_clean(&d);
}

// 6. Online expansion of a mounted ext4 volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext4_volume_expands_online() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let v = ready_volume(
        &d,
        "grow",
        64 * MIB,
        fs_cap(Mode::SingleNodeWriter, "ext4", &[]),
    )
    .await;
    let target = d.path("pods/p1/vol");
    publish(&d, &v, &target, false).await;
    fs::write(target.join("before.txt"), b"kept across the resize").unwrap();
    let before = fs_size(&target);
    assert!(before <= 64 * MIB as u64, "{before}");

    let r = d
        .controller()
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: v.id.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 128 * MIB,
                limit_bytes: 0,
            }),
            volume_capability: Some(v.cap.clone()),
            ..Default::default()
        })
        .await
        .expect("ControllerExpandVolume")
        .into_inner();
    assert!(r.capacity_bytes >= 128 * MIB);
    assert!(
        r.node_expansion_required,
        "a filesystem on a block file grows on the node"
    );
    assert_eq!(
        fs_size(&target),
        before,
        "nothing changes on the node before NodeExpandVolume"
    );

    let req = expand_req(&v, &target, 128 * MIB);
    if !has_capability(CAP_SYS_RESOURCE) {
        // ext4's online resize ioctl needs CAP_SYS_RESOURCE: without it the
        // node must report the failure, not claim success.
        common::skip("online ext4 growth needs CAP_SYS_RESOURCE, which this process lacks");
        let st = expect_code(
            d.node().node_expand_volume(req).await,
            Code::Internal,
            "NodeExpandVolume without CAP_SYS_RESOURCE",
        );
        assert!(st.message().contains("resize2fs"), "{}", st.message());
        assert_eq!(fs_size(&target), before);
        assert_eq!(
            fs::read(target.join("before.txt")).unwrap(),
            b"kept across the resize"
        );
    } else {
        let r = d
            .node()
            .node_expand_volume(req.clone())
            .await
            .expect("NodeExpandVolume")
            .into_inner();
        assert!(r.capacity_bytes >= 128 * MIB, "{r:?}");
        let after = fs_size(&target);
        assert!(
            after > 100 * MIB as u64 && after > before + 50 * MIB as u64,
            "before {before}, after {after}"
        );
        // Repeating it is harmless.
        d.node()
            .node_expand_volume(req)
            .await
            .expect("NodeExpandVolume repeated");
        assert_eq!(fs_size(&target), after);
        assert_eq!(
            fs::read(target.join("before.txt")).unwrap(),
            b"kept across the resize"
        );
        let st = stats(&d, &v.id, &s(&target)).await.unwrap();
        assert_eq!(usage(&st, Unit::Bytes).total as u64, after);
    }
    // The device under the filesystem grew in any case.
    let dev = &mounts_at(&v.staging)[0].source;
    assert_eq!(device_size(Path::new(dev)), 128 * MIB as u64);

    // Staged again (a pod recreated, the node restarted), the filesystem
    // fills the device, grown offline before mounting if it did not yet;
    // NodeExpandVolume then has nothing to do and succeeds, with or without
    // CAP_SYS_RESOURCE.
    unpublish(&d, &v.id, &target).await;
    unstage(&d, &v).await;
    stage(&d, &v).await;
    publish(&d, &v, &target, false).await;
    let restaged = fs_size(&target);
    assert!(restaged > 100 * MIB as u64, "restaged at {restaged} bytes");
    assert_eq!(
        fs::read(target.join("before.txt")).unwrap(),
        b"kept across the resize"
    );
    let req = expand_req(&v, &target, 128 * MIB);
    d.node()
        .node_expand_volume(req)
        .await
        .expect("NodeExpandVolume on a filesystem that fills its device");
    assert_eq!(fs_size(&target), restaged);

    unpublish(&d, &v.id, &target).await;
    destroy(&d, &v).await;
    assert_clean(&d);
}

// 6a. The same on xfs, whose online growth (xfs_growfs) needs CAP_SYS_ADMIN
// only; the volume also survives a restage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xfs_volume_lifecycle_and_online_expansion() {
    require_mounts!();
    if !Path::new("/usr/sbin/mkfs.xfs").exists() && !Path::new("/sbin/mkfs.xfs").exists() {
        common::skip("mkfs.xfs is not installed (xfsprogs)");
        return;
    }
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    // mkfs.xfs refuses filesystems under 300 MiB; the file is sparse.
    let v = ready_volume(
        &d,
        "xfs",
        320 * MIB,
        fs_cap(Mode::SingleNodeWriter, "xfs", &[]),
    )
    .await;
    assert_eq!(mounts_at(&v.staging)[0].fs_type, "xfs");
    let target = d.path("pods/p1/vol");
    publish(&d, &v, &target, false).await;
    fs::write(target.join("x.txt"), b"on xfs").unwrap();
    unpublish(&d, &v.id, &target).await;
    unstage(&d, &v).await;
    assert!(loops_of(&d).is_empty());
    stage(&d, &v).await;
    publish(&d, &v, &target, false).await;
    assert_eq!(fs::read(target.join("x.txt")).unwrap(), b"on xfs");

    // A clone carries its source's XFS UUID; both are staged at once.
    let mut clone_req = common::req::create("xfs-clone", 320 * MIB, v.cap.clone());
    clone_req.volume_content_source = Some(csi::VolumeContentSource {
        r#type: Some(csi::volume_content_source::Type::Volume(
            csi::volume_content_source::VolumeSource {
                volume_id: v.id.clone(),
            },
        )),
    });
    let made = d
        .controller()
        .create_volume(clone_req)
        .await
        .expect("clone of the xfs volume")
        .into_inner()
        .volume
        .expect("a volume");
    let mut clone = Vol {
        id: made.volume_id,
        cap: v.cap.clone(),
        staging: d.path("staging-xfs-clone"),
        context: made.volume_context,
        publish_context: Default::default(),
    };
    controller_publish(&d, &mut clone, false).await;
    stage(&d, &clone).await;
    let clone_target = d.path("pods/p2/vol");
    publish(&d, &clone, &clone_target, false).await;
    assert_eq!(fs::read(clone_target.join("x.txt")).unwrap(), b"on xfs");
    unpublish(&d, &clone.id, &clone_target).await;
    destroy(&d, &clone).await;

    let before = fs_size(&target);
    let r = d
        .controller()
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: v.id.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 480 * MIB,
                limit_bytes: 0,
            }),
            volume_capability: Some(v.cap.clone()),
            ..Default::default()
        })
        .await
        .expect("ControllerExpandVolume")
        .into_inner();
    assert!(r.node_expansion_required);
    let req = expand_req(&v, &target, 480 * MIB);
    d.node()
        .node_expand_volume(req.clone())
        .await
        .expect("NodeExpandVolume on xfs");
    let after = fs_size(&target);
    assert!(
        after > before + 100 * MIB as u64,
        "before {before}, after {after}"
    );
    d.node()
        .node_expand_volume(req)
        .await
        .expect("NodeExpandVolume repeated");
    assert_eq!(fs::read(target.join("x.txt")).unwrap(), b"on xfs");

    unpublish(&d, &v.id, &target).await;
    destroy(&d, &v).await;
    assert_clean(&d);
}

// 6b. Online expansion of a published raw block volume: the device grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_block_volume_expands_online() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let v = ready_volume(&d, "grow-raw", 32 * MIB, block_cap(Mode::SingleNodeWriter)).await;
    let target = d.path("plugins/volumeDevices/publish/grow-raw/pod-1");
    publish(&d, &v, &target, false).await;
    assert_eq!(device_size(&target), 32 * MIB as u64);
    let r = d
        .controller()
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: v.id.clone(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 48 * MIB,
                limit_bytes: 0,
            }),
            volume_capability: Some(v.cap.clone()),
            ..Default::default()
        })
        .await
        .expect("ControllerExpandVolume")
        .into_inner();
    assert!(
        r.node_expansion_required,
        "a loop device must be told its file grew"
    );
    let r = d
        .node()
        .node_expand_volume(csi::NodeExpandVolumeRequest {
            volume_id: v.id.clone(),
            volume_path: s(&target),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: 48 * MIB,
                limit_bytes: 0,
            }),
            staging_target_path: s(&v.staging),
            volume_capability: Some(v.cap.clone()),
            ..Default::default()
        })
        .await
        .expect("NodeExpandVolume of a raw block volume")
        .into_inner();
    assert_eq!(r.capacity_bytes, 48 * MIB);
    assert_eq!(
        device_size(&target),
        48 * MIB as u64,
        "the published device shows the new size"
    );
    let st = stats(&d, &v.id, &s(&target)).await.unwrap();
    assert_eq!(usage(&st, Unit::Bytes).total, 48 * MIB);

    unpublish(&d, &v.id, &target).await;
    destroy(&d, &v).await;
    assert_clean(&d);
}

// 7. NodeGetInfo and NodeGetCapabilities.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_info_and_capabilities() {
    let d = Driver::start(&["--max-volumes-per-node", "4"]).await;
    let info = d
        .node()
        .node_get_info(csi::NodeGetInfoRequest {})
        .await
        .expect("NodeGetInfo")
        .into_inner();
    assert_eq!(info.node_id, NODE);
    assert_eq!(info.max_volumes_per_node, 4);
    let topology = info.accessible_topology.expect("accessible_topology");
    assert_eq!(
        topology.segments,
        HashMap::from([("topology.relay.csi.dev/node".to_string(), NODE.to_string())])
    );

    let caps = d
        .node()
        .node_get_capabilities(csi::NodeGetCapabilitiesRequest {})
        .await
        .expect("NodeGetCapabilities")
        .into_inner()
        .capabilities;
    use node_service_capability::rpc::Type;
    let mut got: Vec<i32> = caps
        .iter()
        .map(|c| match &c.r#type {
            Some(node_service_capability::Type::Rpc(r)) => r.r#type,
            other => panic!("unexpected capability {other:?}"),
        })
        .collect();
    got.sort_unstable();
    let mut want: Vec<i32> = [
        Type::StageUnstageVolume,
        Type::GetVolumeStats,
        Type::ExpandVolume,
        Type::VolumeCondition,
        Type::SingleNodeMultiWriter,
    ]
    .iter()
    .map(|t| *t as i32)
    .collect();
    want.sort_unstable();
    assert_eq!(got, want, "{caps:?}");
}

// 8. Ephemeral inline volumes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ephemeral_inline_volume_lives_with_its_publication() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let id = "csi-0a1b2c3d4e5f";
    let context: HashMap<String, String> = [
        ("csi.storage.k8s.io/ephemeral", "true"),
        ("csi.storage.k8s.io/pod.name", "web-0"),
        ("csi.storage.k8s.io/pod.namespace", "default"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let target = d.path("pods/web-0/volumes/kubernetes.io~csi/scratch/mount");
    let req = csi::NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: s(&target),
        volume_capability: Some(snw()),
        volume_context: context.clone(),
        ..Default::default()
    };
    try_publish(&d, req.clone())
        .await
        .expect("ephemeral NodePublishVolume");
    let data = d.state_dir.join("volumes").join(id);
    assert!(
        data.is_dir(),
        "an inline volume is created on first publish"
    );
    assert!(is_mounted(&target));
    try_publish(&d, req.clone())
        .await
        .expect("repeated ephemeral NodePublishVolume");
    assert_eq!(mounts_at(&target).len(), 1);
    fs::write(target.join("scratch.txt"), b"inline").unwrap();
    assert_eq!(fs::read(data.join("scratch.txt")).unwrap(), b"inline");
    let st = stats(&d, id, &s(&target))
        .await
        .expect("stats of an inline volume");
    assert!(!condition(&st).abnormal);

    unpublish(&d, id, &target).await;
    assert!(
        !data.exists(),
        "the last NodeUnpublishVolume deletes an inline volume"
    );
    assert_clean(&d);

    // Raw block is not an inline volume, and a refused one leaves nothing behind.
    let mut bad = req.clone();
    bad.volume_capability = Some(block_cap(Mode::SingleNodeWriter));
    expect_code(
        try_publish(&d, bad).await,
        Code::InvalidArgument,
        "inline raw block",
    );
    let mut bad = req.clone();
    bad.target_path = "/etc/inline".into();
    expect_code(
        try_publish(&d, bad).await,
        Code::InvalidArgument,
        "inline at /etc",
    );
    assert!(
        !data.exists(),
        "a refused inline publish must not leave its data behind"
    );
    assert!(!Path::new("/etc/inline").exists());
    assert_clean(&d);
}

// 9c. A published volume whose backing data vanished is reported abnormal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vanished_backing_data_is_reported_abnormal() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let v = ready_volume(&d, "doomed", 16 * MIB, snw()).await;
    let target = d.path("pods/p1/vol");
    publish(&d, &v, &target, false).await;
    let st = stats(&d, &v.id, &s(&target)).await.unwrap();
    assert!(!condition(&st).abnormal);

    let backing = d.state_dir.join("volumes").join(&v.id);
    fs::remove_dir_all(&backing).expect("delete the backing dir of a mounted volume");
    let st = stats(&d, &v.id, &s(&target))
        .await
        .expect("stats still answer");
    let c = condition(&st);
    assert!(c.abnormal, "{st:?}");
    assert!(!c.message.is_empty());

    // A lost mount is abnormal as well.
    let v2 = ready_volume(&d, "lost", 16 * MIB, snw()).await;
    let t2 = d.path("pods/p2/vol");
    publish(&d, &v2, &t2, false).await;
    run("umount", &[&s(&t2)]);
    let st = stats(&d, &v2.id, &s(&t2))
        .await
        .expect("stats of a lost mount");
    assert!(condition(&st).abnormal, "{st:?}");
    // Re-publishing restores it.
    publish(&d, &v2, &t2, false).await;
    assert!(is_mounted(&t2));
    assert!(!condition(&stats(&d, &v2.id, &s(&t2)).await.unwrap()).abnormal);

    unpublish(&d, &v.id, &target).await;
    destroy(&d, &v).await;
    unpublish(&d, &v2.id, &t2).await;
    destroy(&d, &v2).await;
    assert_clean(&d);
}

// A repeated NodeStageVolume / NodePublishVolume restores a mount that was
// lost while the driver kept running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_calls_restore_lost_mounts() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    for (name, cap) in [
        ("restore-dir", snw()),
        ("restore-ext4", fs_cap(Mode::SingleNodeWriter, "ext4", &[])),
        ("restore-raw", block_cap(Mode::SingleNodeWriter)),
    ] {
        let v = ready_volume(&d, name, 16 * MIB, cap).await;
        let raw = name == "restore-raw";
        let staged = if raw {
            v.staging.join("device")
        } else {
            v.staging.clone()
        };
        let target = d.path(&format!("pods/{name}/vol"));
        publish(&d, &v, &target, false).await;
        if !raw {
            fs::write(target.join("f.txt"), name).unwrap();
        }
        run("umount", &[&s(&target)]);
        run("umount", &[&s(&staged)]);
        stage(&d, &v).await;
        assert_eq!(mounts_at(&staged).len(), 1, "{name}: staging restored");
        publish(&d, &v, &target, false).await;
        assert_eq!(mounts_at(&target).len(), 1, "{name}: target restored");
        if !raw {
            assert_eq!(fs::read_to_string(target.join("f.txt")).unwrap(), name);
        }
        assert!(loops_of(&d).len() <= 1, "{name}: {:?}", loops_of(&d));
        unpublish(&d, &v.id, &target).await;
        destroy(&d, &v).await;
    }
    assert_clean(&d);
}

// NodePublishVolume from a staging path whose mount is gone must not bind
// the bare staging directory (the node's own disk) into the workload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_from_a_lost_stage_is_refused() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let v = ready_volume(&d, "lost-stage", 16 * MIB, snw()).await;
    let backing = d.state_dir.join("volumes").join(&v.id);
    fs::write(backing.join("real.txt"), b"volume data").unwrap();
    run("umount", &[&s(&v.staging)]);
    let target = d.path("pods/p1/vol");
    expect_code(
        try_publish(&d, publish_req(&v, &target, false)).await,
        Code::FailedPrecondition,
        "publish while the stage is lost",
    );
    assert!(!target.exists() && !is_mounted(&target));
    // The CO's answer: stage again, then publish.
    stage(&d, &v).await;
    publish(&d, &v, &target, false).await;
    assert_eq!(fs::read(target.join("real.txt")).unwrap(), b"volume data");
    unpublish(&d, &v.id, &target).await;
    destroy(&d, &v).await;
    assert_clean(&d);
}

// mountinfo escapes blanks, tabs and backslashes in paths (`\040`, ...): a
// target with them must be recognised as mounted, so that a repeat does not
// stack a second mount and unpublish leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_with_blanks_and_backslashes() {
    require_mounts!();
    let d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let mut v = create_volume(&d, "blanks", 16 * MIB, snw()).await;
    v.staging = d.path("staging with\tblanks");
    let mut c = v.clone();
    controller_publish(&d, &mut c, false).await;
    let v = c;
    stage(&d, &v).await;
    stage(&d, &v).await;
    assert_eq!(mounts_at(&v.staging).len(), 1);
    let target = d.path("pods/p 1/vol\\x");
    publish(&d, &v, &target, false).await;
    publish(&d, &v, &target, false).await;
    assert_eq!(
        mounts_at(&target).len(),
        1,
        "a repeat must not stack mounts"
    );
    let st = stats(&d, &v.id, &s(&target)).await.unwrap();
    assert!(!st.volume_condition.unwrap().abnormal);
    unpublish(&d, &v.id, &target).await;
    destroy(&d, &v).await;
    assert_clean(&d);
}

// A target directory serves one publication only: NodeUnpublishVolume
// removes it, and nothing of it is kept to serve another pod (its owner,
// xattrs or security labels would follow). Spare targets an earlier
// version kept in the state dir are removed at start when empty, and left
// alone otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_serves_one_publication_and_earlier_spares_are_removed() {
    require_mounts!();
    let mut d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    d.stop_gracefully().await;
    let spares = d.state_dir.join("spare");
    fs::create_dir_all(spares.join("a")).unwrap();
    fs::create_dir_all(spares.join("b/not-empty")).unwrap();
    d.start_again().await;
    let v = ready_volume(&d, "one-target", MIB, mount_cap(Mode::SingleNodeWriter)).await;
    assert!(!spares.join("a").exists(), "an empty spare is removed");
    assert!(
        spares.join("b/not-empty").is_dir(),
        "anything else is left alone"
    );
    for pod in ["p1", "p2"] {
        let t = d.path(&format!("pods/{pod}/volumes/vol"));
        fs::create_dir_all(t.parent().unwrap()).unwrap();
        publish(&d, &v, &t, false).await;
        assert!(is_mounted(&t));
        unpublish(&d, &v.id, &t).await;
        assert!(!t.exists(), "NodeUnpublishVolume removes the target");
    }
    let kept: Vec<_> = fs::read_dir(&spares)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        kept,
        vec![std::ffi::OsString::from("b")],
        "no target was kept"
    );
    fs::remove_dir_all(&spares).unwrap();
    unstage(&d, &v).await;
    destroy(&d, &v).await;
    assert_clean(&d);
}
