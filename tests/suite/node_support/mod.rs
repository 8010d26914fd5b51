//! Helpers shared by the Node service integration tests: the CSI calls in
//! the order kubelet makes them, probes of what the kernel really has
//! mounted and attached, and a last-resort scrubber so that a failing test
//! never leaves a mount or a loop device behind on the machine.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use csi_relay::csi;
use tonic::{Code, Status};

use crate::common::{req, Driver, NODE};

pub const MIB: i64 = 1 << 20;

/// A volume as the node tests drive it: its id, the capability every call
/// uses, and the staging path the test (as kubelet) created for it.
#[derive(Clone, Debug)]
pub struct Vol {
    pub id: String,
    pub cap: csi::VolumeCapability,
    pub staging: PathBuf,
    pub context: HashMap<String, String>,
    pub publish_context: HashMap<String, String>,
}

pub fn s(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_string()
}

pub async fn create_volume(d: &Driver, name: &str, bytes: i64, cap: csi::VolumeCapability) -> Vol {
    let v = d
        .controller()
        .create_volume(req::create(name, bytes, cap.clone()))
        .await
        .unwrap_or_else(|e| panic!("CreateVolume {name}: {e:?}"))
        .into_inner()
        .volume
        .expect("CreateVolume returned no volume");
    assert!(!v.volume_id.is_empty());
    let staging = d.path(&format!("staging-{name}"));
    Vol {
        id: v.volume_id,
        cap,
        staging,
        context: v.volume_context,
        publish_context: HashMap::new(),
    }
}

pub async fn controller_publish(d: &Driver, v: &mut Vol, readonly: bool) {
    let r = d
        .controller()
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: v.id.clone(),
            node_id: NODE.into(),
            volume_capability: Some(v.cap.clone()),
            readonly,
            volume_context: v.context.clone(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("ControllerPublishVolume {}: {e:?}", v.id));
    v.publish_context = r.into_inner().publish_context;
}

pub async fn controller_unpublish(d: &Driver, v: &Vol) {
    d.controller()
        .controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
            volume_id: v.id.clone(),
            node_id: NODE.into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("ControllerUnpublishVolume {}: {e:?}", v.id));
}

pub async fn delete_volume(d: &Driver, id: &str) {
    d.controller()
        .delete_volume(csi::DeleteVolumeRequest {
            volume_id: id.into(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("DeleteVolume {id}: {e:?}"));
}

pub fn stage_req(v: &Vol) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: v.id.clone(),
        publish_context: v.publish_context.clone(),
        staging_target_path: s(&v.staging),
        volume_capability: Some(v.cap.clone()),
        secrets: HashMap::new(),
        volume_context: v.context.clone(),
    }
}

pub async fn try_stage(d: &Driver, r: csi::NodeStageVolumeRequest) -> Result<(), Status> {
    d.node().node_stage_volume(r).await.map(|_| ())
}

/// NodeStageVolume, creating the staging directory first as kubelet does.
pub async fn stage(d: &Driver, v: &Vol) {
    std::fs::create_dir_all(&v.staging).expect("create staging dir");
    try_stage(d, stage_req(v))
        .await
        .unwrap_or_else(|e| panic!("NodeStageVolume {}: {e:?}", v.id));
}

pub async fn try_unstage(d: &Driver, id: &str, staging: &Path) -> Result<(), Status> {
    d.node()
        .node_unstage_volume(csi::NodeUnstageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: s(staging),
        })
        .await
        .map(|_| ())
}

pub async fn unstage(d: &Driver, v: &Vol) {
    try_unstage(d, &v.id, &v.staging)
        .await
        .unwrap_or_else(|e| panic!("NodeUnstageVolume {}: {e:?}", v.id));
}

pub fn publish_req(v: &Vol, target: &Path, readonly: bool) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: v.id.clone(),
        publish_context: v.publish_context.clone(),
        staging_target_path: s(&v.staging),
        target_path: s(target),
        volume_capability: Some(v.cap.clone()),
        readonly,
        secrets: HashMap::new(),
        volume_context: v.context.clone(),
    }
}

/// NodeExpandVolume of `v` published at `target`, to `bytes`.
pub fn expand_req(v: &Vol, target: &Path, bytes: i64) -> csi::NodeExpandVolumeRequest {
    csi::NodeExpandVolumeRequest {
        volume_id: v.id.clone(),
        volume_path: s(target),
        capacity_range: Some(csi::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        staging_target_path: s(&v.staging),
        volume_capability: Some(v.cap.clone()),
        ..Default::default()
    }
}

pub async fn try_publish(d: &Driver, r: csi::NodePublishVolumeRequest) -> Result<(), Status> {
    d.node().node_publish_volume(r).await.map(|_| ())
}

pub async fn publish(d: &Driver, v: &Vol, target: &Path, readonly: bool) {
    try_publish(d, publish_req(v, target, readonly))
        .await
        .unwrap_or_else(|e| panic!("NodePublishVolume {} at {}: {e:?}", v.id, target.display()));
}

pub async fn try_unpublish(d: &Driver, id: &str, target: &Path) -> Result<(), Status> {
    d.node()
        .node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: s(target),
        })
        .await
        .map(|_| ())
}

pub async fn unpublish(d: &Driver, id: &str, target: &Path) {
    try_unpublish(d, id, target)
        .await
        .unwrap_or_else(|e| panic!("NodeUnpublishVolume {id} at {}: {e:?}", target.display()));
    assert!(
        !target.exists(),
        "NodeUnpublishVolume must remove the target {}",
        target.display()
    );
}

pub async fn stats(
    d: &Driver,
    id: &str,
    path: &str,
) -> Result<csi::NodeGetVolumeStatsResponse, Status> {
    d.node()
        .node_get_volume_stats(csi::NodeGetVolumeStatsRequest {
            volume_id: id.into(),
            volume_path: path.into(),
            staging_target_path: String::new(),
        })
        .await
        .map(|r| r.into_inner())
}

/// Creates, attaches and stages a volume: VOL_READY on this node.
pub async fn ready_volume(d: &Driver, name: &str, bytes: i64, cap: csi::VolumeCapability) -> Vol {
    let mut v = create_volume(d, name, bytes, cap).await;
    controller_publish(d, &mut v, false).await;
    stage(d, &v).await;
    v
}

/// Unwinds a VOL_READY volume completely: unstage, detach, delete.
pub async fn destroy(d: &Driver, v: &Vol) {
    unstage(d, v).await;
    controller_unpublish(d, v).await;
    delete_volume(d, &v.id).await;
}

pub fn expect_code<T: std::fmt::Debug>(r: Result<T, Status>, code: Code, what: &str) -> Status {
    match r {
        Ok(v) => panic!("{what}: expected {code:?}, got OK {v:?}"),
        Err(st) => {
            assert_eq!(st.code(), code, "{what}: {}", st.message());
            assert!(!st.message().is_empty(), "{what}: an error must say why");
            st
        }
    }
}

/// Undoes the kernel's octal escaping in mountinfo fields.
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() {
            if let Ok(v) = u8::from_str_radix(&field[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One line of /proc/self/mountinfo, parsed by hand (independently of the
/// driver's own parser).
#[derive(Debug, Clone)]
pub struct Mount {
    pub root: String,
    pub mount_point: PathBuf,
    pub options: Vec<String>,
    pub fs_type: String,
    pub source: String,
}

pub fn mounts() -> Vec<Mount> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("read mountinfo")
        .lines()
        .filter_map(|line| {
            let (l, r) = line.split_once(" - ")?;
            let l: Vec<&str> = l.split(' ').collect();
            let r: Vec<&str> = r.split(' ').collect();
            Some(Mount {
                root: unescape(l[3]),
                mount_point: PathBuf::from(unescape(l[4])),
                options: l[5].split(',').map(str::to_string).collect(),
                fs_type: r[0].to_string(),
                source: unescape(r[1]),
            })
        })
        .collect()
}

/// Every mount stacked exactly at `path`.
pub fn mounts_at(path: &Path) -> Vec<Mount> {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    mounts()
        .into_iter()
        .filter(|m| m.mount_point == path)
        .collect()
}

pub fn is_mounted(path: &Path) -> bool {
    !mounts_at(path).is_empty()
}

/// Attached loop devices and their backing files, from sysfs.
pub fn loop_devices() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/sys/block")
        .expect("read /sys/block")
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        if let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file")) {
            out.push((format!("/dev/{name}"), backing.trim().to_string()));
        }
    }
    out
}

fn canonical(dir: &Path) -> String {
    s(&std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf()))
}

/// Mountinfo lines and loop devices that reference `dir`.
pub fn leftovers(dir: &Path) -> Vec<String> {
    let dir = canonical(dir);
    let mut found: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .expect("read mountinfo")
        .lines()
        .filter(|l| l.contains(&format!("{dir}/")) || l.contains(&format!("{dir} ")))
        .map(|l| format!("mount: {l}"))
        .collect();
    found.extend(
        loop_devices()
            .into_iter()
            .filter(|(_, b)| Path::new(b).starts_with(&dir))
            .map(|(dev, b)| format!("loop device: {dev} -> {b}")),
    );
    found
}

/// Requirement 10: nothing in the kernel still references the test's dir.
pub fn assert_clean(d: &Driver) {
    let left = leftovers(d.dir.path());
    assert!(
        left.is_empty(),
        "mounts or loop devices left behind:\n{}",
        left.join("\n")
    );
}

/// Loop devices attached to files under the test's state dir.
pub fn loops_of(d: &Driver) -> Vec<(String, String)> {
    let dir = canonical(d.dir.path());
    loop_devices()
        .into_iter()
        .filter(|(_, b)| Path::new(b).starts_with(&dir))
        .collect()
}

pub fn run(program: &str, args: &[&str]) -> std::process::Output {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed with {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Polls `done` for up to 10 seconds.
pub async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Whether this process holds `cap` (a capability number) in its effective
/// set; the driver it spawns inherits the same set.
pub fn has_capability(cap: u32) -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|mask| mask & (1u64 << cap) != 0)
}

/// CAP_SYS_RESOURCE: ext4's online resize ioctl requires it.
pub const CAP_SYS_RESOURCE: u32 = 24;

/// Size of a block device (or of the device behind a device file) in bytes.
pub fn device_size(path: &Path) -> u64 {
    let out = run("blockdev", &["--getsize64", &s(path)]);
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("blockdev size")
}

/// Bytes of a mounted filesystem (statvfs), as `df` would say.
pub fn fs_size(path: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(path).expect("statvfs");
    st.blocks() as u64 * st.fragment_size() as u64
}

/// Last resort for failing tests: lazily unmounts everything under the
/// test's temp dir and detaches its loop devices, so that a failure does not
/// leak kernel objects on the machine or break the temp dir's removal.
/// Declare it after the `Driver` so that it runs before the dir is removed.
pub struct Scrub(PathBuf);

impl Scrub {
    pub fn new(d: &Driver) -> Scrub {
        Scrub(std::fs::canonicalize(d.dir.path()).expect("canonical temp dir"))
    }
}

impl Drop for Scrub {
    fn drop(&mut self) {
        let dir = self.0.clone();
        for _ in 0..8 {
            let mut points: Vec<PathBuf> = mounts()
                .into_iter()
                .map(|m| m.mount_point)
                .filter(|p| p.starts_with(&dir))
                .collect();
            if points.is_empty() {
                break;
            }
            if !std::thread::panicking() {
                eprintln!("scrub: unmounting leftovers {points:?}");
            }
            points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for p in points {
                let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
            }
        }
        for (dev, backing) in loop_devices() {
            if Path::new(&backing).starts_with(&dir) {
                let _ = Command::new("losetup").args(["--detach", &dev]).output();
            }
        }
    }
}

/// Waits until the outcomes of the calls made so far are durable. They are
/// committed without an fsync of their own (the mount table witnesses
/// them) and flushed within 50 ms; a crash before that is covered by the
/// witness, but a crash *and* the loss of the mounts while the driver is
/// down (a double fault) is not.
pub async fn outcomes_durable() {
    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
}

/// A loopback address nothing listens on yet, for `--metrics-address`.
pub fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
    let port = listener.local_addr().expect("its address").port();
    format!("127.0.0.1:{port}")
}

/// The value of one series (`name{labels}` as exposed) on the driver's
/// /metrics, 0 when it has not been counted yet.
pub async fn metric(addr: &str, series: &str) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr)
        .await
        .expect("metrics listener");
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .expect("metrics request");
    let mut body = String::new();
    conn.read_to_string(&mut body)
        .await
        .expect("metrics answer");
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}
