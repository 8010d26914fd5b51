//! Fuzzing every RPC's request decoding and validation, on stable Rust: a
//! proptest harness that drives the real services in-process (local
//! backend, real store, real mounts confined to a temp dir) with
//! - arbitrary bytes decoded as each request type, and
//! - structured requests built from hostile values (traversal, NUL bytes,
//!   symlinks into /etc, oversized ids and maps, injected fs types and
//!   mount flags, negative sizes, unknown enum values, ids of real volumes).
//!
//! Every answer must be a success or a precise CSI error (never UNKNOWN,
//! never an empty message), no handler may panic, and no mount may appear
//! outside the test's directory. The campaign runs in a child process with
//! a mount namespace of its own, so that what it compares, the whole mount
//! table, holds only what the driver under test mounted.
//!
//! CI runs a short campaign (`FUZZ_CASES`, default 48 per target). A long
//! run: `FUZZ_CASES=20000 cargo test --release --test fuzz_requests -- --nocapture`.

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use csi_relay::csi::{
    self, controller_server::Controller, group_controller_server::GroupController,
    identity_server::Identity, node_server::Node, volume_capability,
};
use csi_relay::grpc::{
    controller_service::ControllerService, group_controller_service::GroupControllerService,
    identity_service::IdentityService, node_service::NodeService,
};
use proptest::prelude::*;
use prost::Message;
use tonic::{Code, Request};

struct Harness {
    root: PathBuf,
    runtime: tokio::runtime::Runtime,
    controller: ControllerService,
    group: GroupControllerService,
    node: NodeService,
    identity: IdentityService,
    volumes: Vec<String>,
}

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

/// One driver for the whole campaign, so state builds up across cases.
fn harness() -> Option<&'static Harness> {
    static H: OnceLock<Option<Harness>> = OnceLock::new();
    H.get_or_init(|| {
        if let Err(why) = common::can_mount() {
            common::skip(&format!("{why}: the fuzz campaign drives real node calls"));
            return None;
        }
        let root = std::env::temp_dir().join(format!("csi-relay-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&root).ok()?;
        // A trap: a path through this link resolves into /etc.
        let _ = std::os::unix::fs::symlink("/etc", root.join("etc-link"));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .ok()?;
        let state = root.join("state");
        let args = {
            use clap::Parser;
            let argv = [
                "csi-relay",
                "serve",
                "--node-id",
                "fuzz-node",
                "--state-dir",
                state.to_str()?,
                "--max-volumes-per-node",
                "4",
                "--mutable-parameters",
                "iops",
                "--capacity",
                "1073741824",
            ];
            match csi_relay::app::cli::Cli::try_parse_from(argv).ok()?.command {
                csi_relay::app::cli::Command::Serve(a) => a,
                _ => return None,
            }
        };
        let driver = runtime
            .block_on(csi_relay::app::server::build(&args))
            .ok()?;
        let controller = ControllerService::new(driver.clone());
        let mut volumes = Vec::new();
        for (name, cap) in [
            ("fuzz-dir", common::req::snw()),
            (
                "fuzz-blk",
                common::req::block_cap(volume_capability::access_mode::Mode::SingleNodeWriter),
            ),
        ] {
            let req = csi::CreateVolumeRequest {
                name: name.into(),
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: 16 << 20,
                    limit_bytes: 0,
                }),
                volume_capabilities: vec![cap],
                ..Default::default()
            };
            let v = runtime
                .block_on(controller.create_volume(Request::new(req)))
                .ok()?;
            volumes.push(v.into_inner().volume?.volume_id);
        }
        Some(Harness {
            root,
            runtime,
            group: GroupControllerService::new(driver.clone()),
            node: NodeService::new(driver.clone()),
            identity: IdentityService::new(driver),
            controller,
            volumes,
        })
    })
    .as_ref()
}

/// Runs this test again in a child process with a mount namespace of its own
/// (private propagation): another program mounting on this machine meanwhile
/// (under /tmp or anywhere) is not seen there, so "no mount outside the
/// requested paths" judges only the driver's mounts. Loop devices are not
/// namespaced; the campaign judges and detaches only those backed by its files.
fn campaign_in_own_mount_namespace() {
    use std::os::unix::process::CommandExt;
    if let Err(why) = common::can_mount() {
        common::skip(&format!("{why}: the fuzz campaign drives real node calls"));
        return;
    }
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => panic!("the test binary's path: {e}"),
    };
    let mut child = std::process::Command::new(exe);
    child
        .args(["--exact", "fuzz_requests::fuzz_all", "--nocapture"])
        .args(["--test-threads", "1"])
        .env(IN_NAMESPACE, "1")
        // The parent reports the campaign (common::alone); the child must not
        // add a line of its own.
        .env_remove("RELAY_SUITE_REPORT");
    // SAFETY: between fork and exec only two syscalls run (unshare, mount),
    // both async-signal-safe; nothing is allocated or locked.
    unsafe {
        child.pre_exec(|| {
            if nix::libc::unshare(nix::libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            nix::mount::mount(
                None::<&str>,
                "/",
                None::<&str>,
                nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
                None::<&str>,
            )?;
            Ok(())
        });
    }
    let out = child
        .output()
        .unwrap_or_else(|e| panic!("starting the campaign in its own mount namespace: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the campaign failed in its own mount namespace ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains("1 passed"),
        "the campaign did not run:\n{stdout}\n{stderr}"
    );
    let lines = stderr.lines();
    for line in lines.clone().filter(|l| l.starts_with("skipped: ")) {
        // "skipped: <test>: <why>": the child names the same test.
        let why = line.splitn(3, ": ").nth(2).unwrap_or(line);
        common::skip(why);
    }
    for line in lines.filter(|l| l.starts_with("fuzz: ")) {
        eprintln!("{line} (in a mount namespace of its own)");
    }
}

/// Mount points outside the harness's directory, from mountinfo.
fn foreign_mounts(root: &Path) -> Vec<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let root = root.to_string_lossy();
    let mut v: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| !m.starts_with(root.as_ref()))
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

/// Node paths are kept inside the harness's directory unless they are ones
/// the driver must refuse anyway (relative, system trees): a campaign must
/// never mount over this machine's own directories.
fn confine(root: &Path, path: &mut String) {
    const REFUSED: &[&str] = &["/etc", "/proc", "/sys", "/dev", "/usr", "/boot"];
    let refused = REFUSED
        .iter()
        .any(|t| path == t || path.starts_with(&format!("{t}/")));
    if path.starts_with('/') && !refused {
        *path = format!("{}{}", root.display(), path);
    }
}

/// The checks every answer passes.
fn judge<T>(what: &str, r: Result<tonic::Response<T>, tonic::Status>) -> Result<(), TestCaseError> {
    if let Err(s) = r {
        prop_assert!(
            !matches!(s.code(), Code::Unknown | Code::Ok),
            "{what}: code {:?}: {}",
            s.code(),
            s.message()
        );
        prop_assert!(
            !s.message().is_empty(),
            "{what}: {:?} without a message",
            s.code()
        );
    }
    Ok(())
}

macro_rules! each_request {
    ($h:expr, $bytes:expr, $($svc:ident . $method:ident($ty:ty)),* $(,)?) => {{
        $(
            if let Ok(mut req) = <$ty>::decode($bytes) {
                confine_request(&$h.root, &mut req);
                let r = $h.runtime.block_on($h.$svc.$method(Request::new(req)));
                judge(stringify!($method), r)?;
            }
        )*
    }};
}

/// Confines the paths of node requests (a no-op for the rest).
trait Paths {
    fn paths(&mut self) -> Vec<&mut String> {
        Vec::new()
    }
}

fn confine_request(root: &Path, req: &mut impl Paths) {
    for p in req.paths() {
        confine(root, p);
    }
}

macro_rules! no_paths { ($($t:ty),*) => { $(impl Paths for $t {})* }; }
no_paths!(
    csi::GetPluginInfoRequest,
    csi::GetPluginCapabilitiesRequest,
    csi::ProbeRequest,
    csi::CreateVolumeRequest,
    csi::DeleteVolumeRequest,
    csi::ControllerPublishVolumeRequest,
    csi::ControllerUnpublishVolumeRequest,
    csi::ValidateVolumeCapabilitiesRequest,
    csi::ListVolumesRequest,
    csi::GetCapacityRequest,
    csi::ControllerGetCapabilitiesRequest,
    csi::CreateSnapshotRequest,
    csi::DeleteSnapshotRequest,
    csi::ListSnapshotsRequest,
    csi::GetSnapshotRequest,
    csi::ControllerExpandVolumeRequest,
    csi::ControllerGetVolumeRequest,
    csi::ControllerModifyVolumeRequest,
    csi::GroupControllerGetCapabilitiesRequest,
    csi::CreateVolumeGroupSnapshotRequest,
    csi::DeleteVolumeGroupSnapshotRequest,
    csi::GetVolumeGroupSnapshotRequest,
    csi::NodeGetCapabilitiesRequest,
    csi::NodeGetInfoRequest
);
impl Paths for csi::NodeStageVolumeRequest {
    fn paths(&mut self) -> Vec<&mut String> {
        vec![&mut self.staging_target_path]
    }
}
impl Paths for csi::NodeUnstageVolumeRequest {
    fn paths(&mut self) -> Vec<&mut String> {
        vec![&mut self.staging_target_path]
    }
}
impl Paths for csi::NodePublishVolumeRequest {
    fn paths(&mut self) -> Vec<&mut String> {
        vec![&mut self.staging_target_path, &mut self.target_path]
    }
}
impl Paths for csi::NodeUnpublishVolumeRequest {
    fn paths(&mut self) -> Vec<&mut String> {
        vec![&mut self.target_path]
    }
}
impl Paths for csi::NodeGetVolumeStatsRequest {
    fn paths(&mut self) -> Vec<&mut String> {
        vec![&mut self.volume_path, &mut self.staging_target_path]
    }
}
impl Paths for csi::NodeExpandVolumeRequest {
    fn paths(&mut self) -> Vec<&mut String> {
        vec![&mut self.volume_path, &mut self.staging_target_path]
    }
}

fn every_rpc(h: &Harness, bytes: &[u8]) -> Result<(), TestCaseError> {
    each_request!(
        h,
        bytes,
        identity.get_plugin_info(csi::GetPluginInfoRequest),
        identity.get_plugin_capabilities(csi::GetPluginCapabilitiesRequest),
        identity.probe(csi::ProbeRequest),
        controller.create_volume(csi::CreateVolumeRequest),
        controller.delete_volume(csi::DeleteVolumeRequest),
        controller.controller_publish_volume(csi::ControllerPublishVolumeRequest),
        controller.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest),
        controller.validate_volume_capabilities(csi::ValidateVolumeCapabilitiesRequest),
        controller.list_volumes(csi::ListVolumesRequest),
        controller.get_capacity(csi::GetCapacityRequest),
        controller.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest),
        controller.create_snapshot(csi::CreateSnapshotRequest),
        controller.delete_snapshot(csi::DeleteSnapshotRequest),
        controller.list_snapshots(csi::ListSnapshotsRequest),
        controller.get_snapshot(csi::GetSnapshotRequest),
        controller.controller_expand_volume(csi::ControllerExpandVolumeRequest),
        controller.controller_get_volume(csi::ControllerGetVolumeRequest),
        controller.controller_modify_volume(csi::ControllerModifyVolumeRequest),
        group.group_controller_get_capabilities(csi::GroupControllerGetCapabilitiesRequest),
        group.create_volume_group_snapshot(csi::CreateVolumeGroupSnapshotRequest),
        group.delete_volume_group_snapshot(csi::DeleteVolumeGroupSnapshotRequest),
        group.get_volume_group_snapshot(csi::GetVolumeGroupSnapshotRequest),
        node.node_stage_volume(csi::NodeStageVolumeRequest),
        node.node_unstage_volume(csi::NodeUnstageVolumeRequest),
        node.node_publish_volume(csi::NodePublishVolumeRequest),
        node.node_unpublish_volume(csi::NodeUnpublishVolumeRequest),
        node.node_get_volume_stats(csi::NodeGetVolumeStatsRequest),
        node.node_expand_volume(csi::NodeExpandVolumeRequest),
        node.node_get_capabilities(csi::NodeGetCapabilitiesRequest),
        node.node_get_info(csi::NodeGetInfoRequest),
    );
    Ok(())
}

// ---- hostile values ------------------------------------------------------------

fn hostile_string() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-z0-9-]{1,24}",
        "\\PC{0,64}",
        Just("../../etc/passwd".to_string()),
        Just("a\0b".to_string()),
        "[a-z]{129,300}",
        Just("vol-00000000000000000000000000000000".to_string()),
    ]
}

fn hostile_id(h: &'static Harness) -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::sample::select(h.volumes.clone()),
        2 => hostile_string(),
    ]
}

fn hostile_path(h: &'static Harness) -> impl Strategy<Value = String> {
    let root = h.root.display().to_string();
    prop_oneof![
        Just(String::new()),
        Just("relative/path".to_string()),
        Just("/etc/csi-target".to_string()),
        Just("/proc/self/root".to_string()),
        Just("/".to_string()),
        Just(format!("{root}/etc-link/x")),
        Just(format!("{root}/state/volumes")),
        Just(format!("{root}/a/../../escape")),
        Just(format!("{root}//double//slash/")),
        Just(format!("{root}/nul\0byte")),
        Just(format!("{root}/{}", "d".repeat(5000))),
        "[a-z]{1,3}".prop_map(move |s| format!("{root}/p/{s}")),
    ]
}

fn hostile_map() -> impl Strategy<Value = HashMap<String, String>> {
    prop_oneof![
        proptest::collection::hash_map(hostile_string(), hostile_string(), 0..6),
        Just(HashMap::from([("big".to_string(), "v".repeat(8000))])),
        proptest::collection::hash_map("[a-z]{1,8}", "[a-z]{1,8}", 200..260),
        Just(HashMap::from([(
            "backing".to_string(),
            "block".to_string()
        )])),
        Just(HashMap::from([(
            "csi.storage.k8s.io/ephemeral".to_string(),
            "true".to_string()
        )])),
    ]
}

fn hostile_cap() -> impl Strategy<Value = Option<csi::VolumeCapability>> {
    let fs = prop_oneof![
        Just(String::new()),
        Just("ext4".to_string()),
        Just("xfs".to_string()),
        Just("ext4,rw".to_string()),
        Just("-o remount".to_string()),
        Just("nfs".to_string()),
        hostile_string(),
    ];
    let flags = proptest::collection::vec(
        prop_oneof![
            Just("ro".to_string()),
            Just("bind".to_string()),
            Just("remount,rw".to_string()),
            Just("x-mount.mkdir=/etc".to_string()),
            hostile_string(),
        ],
        0..4,
    );
    let access = prop_oneof![
        Just(None),
        Just(Some(volume_capability::AccessType::Block(
            volume_capability::BlockVolume {}
        ))),
        (fs, flags, hostile_string()).prop_map(|(fs_type, mount_flags, group)| Some(
            volume_capability::AccessType::Mount(volume_capability::MountVolume {
                fs_type,
                mount_flags,
                volume_mount_group: group,
            })
        )),
    ];
    prop_oneof![
        1 => Just(None),
        6 => (-2i32..10, access).prop_map(|(mode, access_type)| Some(csi::VolumeCapability {
            access_mode: Some(volume_capability::AccessMode { mode }),
            access_type,
        })),
    ]
}

#[derive(Debug, Clone)]
enum Call {
    Create(csi::CreateVolumeRequest),
    Publish(csi::ControllerPublishVolumeRequest),
    Stage(csi::NodeStageVolumeRequest),
    NodePublish(csi::NodePublishVolumeRequest),
    NodeUnpublish(csi::NodeUnpublishVolumeRequest),
    Unstage(csi::NodeUnstageVolumeRequest),
    Expand(csi::ControllerExpandVolumeRequest),
    Snapshot(csi::CreateSnapshotRequest),
}

fn hostile_call(h: &'static Harness) -> impl Strategy<Value = Call> {
    let size = prop_oneof![Just(-1i64), Just(0), Just(i64::MAX), 0i64..(64 << 20)];
    prop_oneof![
        (
            hostile_string(),
            size.clone(),
            proptest::collection::vec(hostile_cap(), 0..3),
            hostile_map(),
            hostile_map()
        )
            .prop_map(|(name, bytes, caps, parameters, secrets)| Call::Create(
                csi::CreateVolumeRequest {
                    name,
                    capacity_range: Some(csi::CapacityRange {
                        required_bytes: bytes,
                        limit_bytes: 0
                    }),
                    volume_capabilities: caps.into_iter().flatten().collect(),
                    parameters,
                    secrets,
                    ..Default::default()
                }
            )),
        (
            hostile_id(h),
            prop_oneof![Just("fuzz-node".to_string()), hostile_string()],
            hostile_cap(),
            any::<bool>(),
            hostile_map()
        )
            .prop_map(
                |(volume_id, node_id, volume_capability, readonly, volume_context)| Call::Publish(
                    csi::ControllerPublishVolumeRequest {
                        volume_id,
                        node_id,
                        volume_capability,
                        readonly,
                        volume_context,
                        ..Default::default()
                    }
                )
            ),
        (
            hostile_id(h),
            hostile_path(h),
            hostile_cap(),
            hostile_map(),
            hostile_map()
        )
            .prop_map(
                |(
                    volume_id,
                    staging_target_path,
                    volume_capability,
                    publish_context,
                    volume_context,
                )| Call::Stage(csi::NodeStageVolumeRequest {
                    volume_id,
                    staging_target_path,
                    volume_capability,
                    publish_context,
                    volume_context,
                    ..Default::default()
                })
            ),
        (
            hostile_id(h),
            hostile_path(h),
            hostile_path(h),
            hostile_cap(),
            any::<bool>(),
            hostile_map()
        )
            .prop_map(
                |(
                    volume_id,
                    staging_target_path,
                    target_path,
                    volume_capability,
                    readonly,
                    volume_context,
                )| Call::NodePublish(csi::NodePublishVolumeRequest {
                    volume_id,
                    staging_target_path,
                    target_path,
                    volume_capability,
                    readonly,
                    volume_context,
                    ..Default::default()
                })
            ),
        (hostile_id(h), hostile_path(h)).prop_map(|(volume_id, target_path)| Call::NodeUnpublish(
            csi::NodeUnpublishVolumeRequest {
                volume_id,
                target_path
            }
        )),
        (hostile_id(h), hostile_path(h)).prop_map(
            |(volume_id, staging_target_path)| Call::Unstage(csi::NodeUnstageVolumeRequest {
                volume_id,
                staging_target_path
            })
        ),
        (hostile_id(h), size, hostile_cap()).prop_map(|(volume_id, bytes, volume_capability)| {
            Call::Expand(csi::ControllerExpandVolumeRequest {
                volume_id,
                capacity_range: Some(csi::CapacityRange {
                    required_bytes: bytes,
                    limit_bytes: 0,
                }),
                volume_capability,
                ..Default::default()
            })
        }),
        (hostile_id(h), hostile_string(), hostile_map()).prop_map(
            |(source_volume_id, name, parameters)| Call::Snapshot(csi::CreateSnapshotRequest {
                source_volume_id,
                name,
                parameters,
                ..Default::default()
            })
        ),
    ]
}

fn run(h: &Harness, call: Call) -> Result<(), TestCaseError> {
    let rt = &h.runtime;
    match call {
        Call::Create(r) => judge(
            "CreateVolume",
            rt.block_on(h.controller.create_volume(Request::new(r))),
        ),
        Call::Publish(r) => judge(
            "ControllerPublishVolume",
            rt.block_on(h.controller.controller_publish_volume(Request::new(r))),
        ),
        Call::Stage(mut r) => {
            confine_request(&h.root, &mut r);
            judge(
                "NodeStageVolume",
                rt.block_on(h.node.node_stage_volume(Request::new(r))),
            )
        }
        Call::NodePublish(mut r) => {
            confine_request(&h.root, &mut r);
            judge(
                "NodePublishVolume",
                rt.block_on(h.node.node_publish_volume(Request::new(r))),
            )
        }
        Call::NodeUnpublish(mut r) => {
            confine_request(&h.root, &mut r);
            judge(
                "NodeUnpublishVolume",
                rt.block_on(h.node.node_unpublish_volume(Request::new(r))),
            )
        }
        Call::Unstage(mut r) => {
            confine_request(&h.root, &mut r);
            judge(
                "NodeUnstageVolume",
                rt.block_on(h.node.node_unstage_volume(Request::new(r))),
            )
        }
        Call::Expand(r) => judge(
            "ControllerExpandVolume",
            rt.block_on(h.controller.controller_expand_volume(Request::new(r))),
        ),
        Call::Snapshot(r) => judge(
            "CreateSnapshot",
            rt.block_on(h.controller.create_snapshot(Request::new(r))),
        ),
    }
}

/// Unmounts whatever the campaign left mounted under its directory and
/// removes it, once per test process.
struct Cleanup;
impl Drop for Cleanup {
    fn drop(&mut self) {
        let Some(h) = harness() else { return };
        let root = h.root.to_string_lossy().into_owned();
        for _ in 0..8 {
            let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            let mut mine: Vec<&str> = info
                .lines()
                .filter_map(|l| l.split(' ').nth(4))
                .filter(|m| m.starts_with(&root))
                .collect();
            if mine.is_empty() {
                break;
            }
            mine.sort_by_key(|m| std::cmp::Reverse(m.len()));
            for m in mine {
                let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
            }
        }
        // Loop devices of block volumes the campaign left staged.
        if let Ok(devices) = std::fs::read_dir("/sys/block") {
            for dev in devices.flatten() {
                let backing = dev.path().join("loop/backing_file");
                let file = std::fs::read_to_string(backing).unwrap_or_default();
                if file.trim().starts_with(&root) {
                    let name = format!("/dev/{}", dev.file_name().to_string_lossy());
                    let _ = std::process::Command::new("losetup")
                        .args(["-d", &name])
                        .status();
                }
            }
        }
        let still_mounted = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap_or_default()
            .contains(&root);
        if !still_mounted {
            let _ = std::fs::remove_dir_all(&h.root);
        }
    }
}

/// Set in the campaign's own process, which runs in a mount namespace of its
/// own: what it judges (the whole mount table) is then only what it made.
const IN_NAMESPACE: &str = "RELAY_FUZZ_IN_OWN_MOUNT_NAMESPACE";

#[test]
fn fuzz_all() {
    let _alone = common::alone();
    if std::env::var_os(IN_NAMESPACE).is_none() {
        campaign_in_own_mount_namespace();
        return;
    }
    let Some(h) = harness() else { return };
    let _cleanup = Cleanup;
    let before = foreign_mounts(&h.root);
    let config = ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = proptest::test_runner::TestRunner::new(config.clone());
    let bytes = proptest::collection::vec(any::<u8>(), 0..600);
    let result = runner.run(&bytes, |b| every_rpc(h, &b));
    assert!(result.is_ok(), "arbitrary bytes: {result:?}");
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases() * 8,
        ..config
    });
    let result = runner.run(&proptest::collection::vec(hostile_call(h), 1..6), |calls| {
        for call in calls {
            run(h, call)?;
        }
        prop_assert_eq!(
            foreign_mounts(&h.root),
            before.clone(),
            "a mount appeared outside the requested paths"
        );
        Ok(())
    });
    assert!(result.is_ok(), "hostile requests: {result:?}");
    assert_eq!(foreign_mounts(&h.root), before);
    eprintln!(
        "fuzz: {} byte inputs x 30 request types, {} hostile call sequences",
        cases(),
        cases() * 8
    );
}
