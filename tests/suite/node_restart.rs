//! Node restart safety: the driver is stopped (SIGTERM) or killed (SIGKILL)
//! with volumes staged and published; the kernel keeps the mounts, the
//! driver's start-up reconciliation must make its records and the kernel
//! agree again, and the CO's unwinding calls must then leave nothing behind.

use crate::{common, node_support};

use std::fs;

use csi_relay::csi::volume_capability::access_mode::Mode;

use common::req::{block_cap, fs_cap, snw};
use common::Driver;
use node_support::*;

// 9a. A mount lost while the driver was down is restored at start-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_target_mount_is_restored_after_a_crash() {
    require_mounts!();
    let mut d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let v = ready_volume(&d, "lost-target", 16 * MIB, snw()).await;
    let target = d.path("pods/p1/vol");
    publish(&d, &v, &target, false).await;
    fs::write(target.join("keep.txt"), b"before the crash").unwrap();
    outcomes_durable().await;

    d.crash();
    run("umount", &[&s(&target)]);
    assert!(!is_mounted(&target));
    assert!(!target.join("keep.txt").exists());
    d.start_again().await;

    assert!(
        is_mounted(&target),
        "start-up reconciliation restores the publication"
    );
    assert_eq!(mounts_at(&target).len(), 1);
    assert_eq!(
        fs::read(target.join("keep.txt")).expect("data through the restored target"),
        b"before the crash"
    );
    let st = stats(&d, &v.id, &s(&target)).await.unwrap();
    assert!(!st.volume_condition.unwrap().abnormal);

    unpublish(&d, &v.id, &target).await;
    destroy(&d, &v).await;
    assert_clean(&d);
}

// 9a, block file: both the staging mount and the publication were lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_ext4_mounts_are_restored_after_a_crash() {
    require_mounts!();
    let mut d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let v = ready_volume(
        &d,
        "lost-ext4",
        32 * MIB,
        fs_cap(Mode::SingleNodeWriter, "ext4", &[]),
    )
    .await;
    let target = d.path("pods/p1/vol");
    publish(&d, &v, &target, false).await;
    fs::write(target.join("keep.txt"), b"on ext4").unwrap();
    outcomes_durable().await;

    d.crash();
    run("umount", &[&s(&target)]);
    run("umount", &[&s(&v.staging)]);
    d.start_again().await;

    assert!(is_mounted(&v.staging) && is_mounted(&target));
    assert_eq!(mounts_at(&v.staging).len(), 1);
    assert_eq!(fs::read(target.join("keep.txt")).unwrap(), b"on ext4");
    assert_eq!(
        loops_of(&d).len(),
        1,
        "the loop device is reused, not duplicated: {:?}",
        loops_of(&d)
    );

    unpublish(&d, &v.id, &target).await;
    destroy(&d, &v).await;
    assert_clean(&d);
}

/// Publishes one volume of each kind; returns them with their targets.
async fn publish_all_kinds(d: &Driver) -> Vec<(Vol, std::path::PathBuf)> {
    let mut out = Vec::new();
    for (name, cap) in [
        ("dir", snw()),
        ("ext4", fs_cap(Mode::SingleNodeWriter, "ext4", &[])),
        ("block", block_cap(Mode::SingleNodeWriter)),
    ] {
        let v = ready_volume(d, name, 32 * MIB, cap).await;
        let target = d.path(&format!("pods/{name}/vol"));
        publish(d, &v, &target, false).await;
        if name != "block" {
            fs::write(target.join("data.txt"), name).unwrap();
        }
        out.push((v, target));
    }
    out
}

async fn check_and_unwind(d: &Driver, vols: Vec<(Vol, std::path::PathBuf)>) {
    assert_eq!(
        loops_of(d).len(),
        2,
        "the staged block-file volumes keep their loop devices: {:?}",
        loops_of(d)
    );
    for (v, target) in &vols {
        assert!(is_mounted(target), "{}", target.display());
        assert_eq!(
            mounts_at(target).len(),
            1,
            "no duplicate mount at {}",
            target.display()
        );
        assert_eq!(
            mounts_at(&v.staging).len() + mounts_at(&v.staging.join("device")).len(),
            1
        );
        // The CO cannot know whether its last calls took effect: it repeats them.
        stage(d, v).await;
        publish(d, v, target, false).await;
        assert_eq!(mounts_at(target).len(), 1);
        if !v.staging.join("device").exists() {
            let name = target
                .parent()
                .unwrap()
                .file_name()
                .unwrap()
                .to_str()
                .unwrap();
            assert_eq!(fs::read_to_string(target.join("data.txt")).unwrap(), name);
        }
    }
    for (v, target) in &vols {
        unpublish(d, &v.id, target).await;
        unpublish(d, &v.id, target).await;
        destroy(d, v).await;
    }
    assert_clean(d);
}

// 9b. A clean restart in the middle of a lifecycle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_while_published_then_unwind() {
    require_mounts!();
    let mut d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let vols = publish_all_kinds(&d).await;
    d.restart().await;
    check_and_unwind(&d, vols).await;
}

// 9b. The same after SIGKILL, right after the last publish: the outcome
// commits a crash may lose are recovered from the mount table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_while_published_then_unwind() {
    require_mounts!();
    let mut d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let vols = publish_all_kinds(&d).await;
    d.crash();
    d.start_again().await;
    check_and_unwind(&d, vols).await;
}

// A node reboot while the driver was down: every mount and every loop
// device is gone. Start-up brings all of them back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn everything_lost_while_down_is_restored() {
    require_mounts!();
    let mut d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let vols = publish_all_kinds(&d).await;
    outcomes_durable().await;
    d.crash();
    for (v, target) in &vols {
        run("umount", &[&s(target)]);
        let device = v.staging.join("device");
        run(
            "umount",
            &[&s(if device.exists() { &device } else { &v.staging })],
        );
    }
    for (dev, _) in loops_of(&d) {
        run("losetup", &["--detach", &dev]);
    }
    // A detach only completes once every opener (a concurrent losetup scan,
    // say) has closed the device.
    wait_for("the loop devices to be released", || {
        loops_of(&d).is_empty()
    })
    .await;
    assert!(vols
        .iter()
        .all(|(v, t)| !is_mounted(t) && !is_mounted(&v.staging)));
    d.start_again().await;
    check_and_unwind(&d, vols).await;
}

// Unwinding across restarts: every step in a different process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unwind_across_restarts() {
    require_mounts!();
    let mut d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let v = ready_volume(
        &d,
        "steps",
        32 * MIB,
        fs_cap(Mode::SingleNodeWriter, "ext4", &[]),
    )
    .await;
    let target = d.path("pods/p1/vol");
    publish(&d, &v, &target, false).await;
    d.crash();
    d.start_again().await;
    unpublish(&d, &v.id, &target).await;
    d.restart().await;
    assert!(
        !is_mounted(&target) && !target.exists(),
        "an unpublished target stays gone"
    );
    assert!(is_mounted(&v.staging), "the stage is restored/kept");
    unstage(&d, &v).await;
    d.crash();
    d.start_again().await;
    assert!(!is_mounted(&v.staging), "an unstaged volume stays unstaged");
    assert!(loops_of(&d).is_empty());
    controller_unpublish(&d, &v).await;
    delete_volume(&d, &v.id).await;
    assert_clean(&d);
}

// A loop device on one of the driver's volume files that no stage accounts
// for (left by a crash between attach and commit) is detached at start-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_loop_device_is_detached_at_start() {
    require_mounts!();
    let mut d = Driver::start(&[]).await;
    let _scrub = Scrub::new(&d);
    let mut v = create_volume(
        &d,
        "stale",
        16 * MIB,
        fs_cap(Mode::SingleNodeWriter, "ext4", &[]),
    )
    .await;
    controller_publish(&d, &mut v, false).await;
    let img = d.state_dir.join("volumes").join(format!("{}.img", v.id));
    run("losetup", &["--find", "--show", &s(&img)]);
    assert_eq!(loops_of(&d).len(), 1);
    d.restart().await;
    assert!(
        loops_of(&d).is_empty(),
        "stale loop devices are detached: {:?}",
        loops_of(&d)
    );
    // A loop device on a file that is gone (sysfs says "<file> (deleted)").
    let orphan = d.state_dir.join("volumes").join("orphan.img");
    fs::write(&orphan, vec![0u8; 1 << 20]).unwrap();
    run("losetup", &["--find", "--show", &s(&orphan)]);
    fs::remove_file(&orphan).unwrap();
    assert_eq!(loops_of(&d).len(), 1, "{:?}", loops_of(&d));
    d.crash();
    d.start_again().await;
    assert!(
        loops_of(&d).is_empty(),
        "a loop device on a deleted volume file is detached: {:?}",
        loops_of(&d)
    );
    // And the volume stages normally afterwards.
    stage(&d, &v).await;
    assert_eq!(loops_of(&d).len(), 1);
    destroy(&d, &v).await;
    assert_clean(&d);
}
