//! Member volumes on the node side, against real processes and real mounts:
//! a `csi-relay serve --mode node` (the node plugin under test, with its own
//! store, as deployed) stages and publishes host volumes whose
//! publish_context describes a member PV source.
//!
//! - A CSI source is proxied to the member driver's node plugin, found at
//!   `<plugins dir>/<driver>/csi.sock`: here a second csi-relay serving the
//!   local backend under the driver name `member.csi.dev`, or an in-process
//!   plugin that does not stage (to check what is forwarded, and that a
//!   plugin without STAGE_UNSTAGE_VOLUME is not asked to stage).
//! - A hostPath / local source is bind-mounted from this machine.
//!
//! Every mounting test unwinds and asserts no mount is left in either
//! process's temp dir.

use crate::{common, node_support};

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use csi_relay::csi::{
    self,
    node_server::{Node, NodeServer},
    volume_capability::{access_mode::Mode, AccessType},
};
use csi_relay::domain::member_source::{self as source, MemberSource, SourceKind};
use csi_relay::domain::volume::Progress;
use tonic::{Code, Request, Response, Status};

use common::req::{block_cap, fs_cap, mount_cap, snw};
use common::Driver;
use node_support::*;

const MEMBER_DRIVER: &str = "member.csi.dev";

/// The member driver's node plugin: a second csi-relay (local backend) on
/// `<its temp dir>/plugins/member.csi.dev/csi.sock`.
async fn member_plugin() -> Driver {
    Driver::start_on(
        &format!("plugins/{MEMBER_DRIVER}/csi.sock"),
        &["--driver-name", MEMBER_DRIVER],
    )
    .await
}

/// The node plugin under test: `--mode node`, its own state, `plugins`.
async fn relay(plugins: &Path) -> Driver {
    Driver::start(&["--mode", "node", "--plugins-dir", &s(plugins)]).await
}

fn describe(kind: SourceKind, read_only: bool) -> HashMap<String, String> {
    MemberSource {
        member: "east".into(),
        pv: "pv-east-1".into(),
        member_node: Some("worker-1".into()),
        read_only,
        mount_options: vec![],
        kind,
    }
    .to_context()
    .expect("publish_context")
    .into_iter()
    .collect()
}

fn csi_source(driver: &str, member: &Vol) -> SourceKind {
    SourceKind::Csi {
        driver: driver.into(),
        volume_handle: member.id.clone(),
        fs_type: None,
        volume_attributes: member.context.clone().into_iter().collect(),
        publish_context: member.publish_context.clone().into_iter().collect(),
        attachment: None,
        stage_secret: None,
        publish_secret: None,
    }
}

/// A host volume of the node under test (the controller elsewhere made it).
fn host_vol(d: &Driver, id: &str, cap: csi::VolumeCapability, pc: HashMap<String, String>) -> Vol {
    Vol {
        id: id.into(),
        cap,
        staging: d.path(&format!("staging-{id}")),
        context: HashMap::new(),
        publish_context: pc,
    }
}

/// A member volume, created and ControllerPublished on the member plugin.
async fn member_volume(member: &Driver, name: &str) -> Vol {
    let mut v = create_volume(member, name, 16 * MIB, snw()).await;
    controller_publish(member, &mut v, false).await;
    v
}

async fn drop_member_volume(member: &Driver, v: &Vol) {
    controller_unpublish(member, v).await;
    delete_volume(member, &v.id).await;
}

/// The node under test holds no record of `id` any more.
async fn forgotten(d: &Driver, v: &Vol) {
    let st = stats(d, &v.id, &s(&v.staging)).await;
    expect_code(st, Code::NotFound, "stats of a dropped node-local record");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn csi_volume_is_proxied_to_the_member_plugin() {
    require_mounts!();
    let member = member_plugin().await;
    let _member_scrub = Scrub::new(&member);
    let d = relay(&member.path("plugins")).await;
    let _scrub = Scrub::new(&d);
    let mv = member_volume(&member, "proxied").await;
    let hv = host_vol(
        &d,
        "host-proxied",
        snw(),
        describe(csi_source(MEMBER_DRIVER, &mv), false),
    );

    stage(&d, &hv).await;
    assert!(
        is_mounted(&hv.staging),
        "the member plugin stages at the host volume's staging path"
    );
    stats(&member, &mv.id, &s(&hv.staging))
        .await
        .expect("the member plugin recorded the stage at our staging path");
    let target = d.path("pods/p1/volumes/vol");
    publish(&d, &hv, &target, false).await;
    assert_eq!(mounts_at(&target).len(), 1);

    fs::write(target.join("hello.txt"), b"through the relay").expect("write through the target");
    let backing = member.state_dir.join("volumes").join(&mv.id);
    assert_eq!(
        fs::read(backing.join("hello.txt")).expect("data in the member's backing dir"),
        b"through the relay"
    );

    // The CO repeats calls whose answers it lost.
    stage(&d, &hv).await;
    publish(&d, &hv, &target, false).await;
    assert_eq!(mounts_at(&hv.staging).len(), 1);
    assert_eq!(mounts_at(&target).len(), 1);

    let st = stats(&d, &hv.id, &s(&target))
        .await
        .expect("NodeGetVolumeStats forwarded to the member plugin");
    let bytes = st
        .usage
        .iter()
        .find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32)
        .expect("bytes usage");
    assert!(bytes.total > 0 && bytes.used > 0, "{bytes:?}");
    assert!(!st.volume_condition.expect("condition").abnormal);

    // A second staging path for the same volume is refused, as for any volume.
    let mut elsewhere = hv.clone();
    elsewhere.staging = d.path("staging-other");
    fs::create_dir_all(&elsewhere.staging).unwrap();
    expect_code(
        try_stage(&d, stage_req(&elsewhere)).await,
        Code::FailedPrecondition,
        "stage at a second path",
    );

    unpublish(&d, &hv.id, &target).await;
    unstage(&d, &hv).await;
    assert!(!is_mounted(&hv.staging));
    forgotten(&d, &hv).await;
    // Repeats after the record is gone are answered OK: nothing to undo.
    unstage(&d, &hv).await;
    unpublish(&d, &hv.id, &target).await;
    assert_eq!(
        fs::read(backing.join("hello.txt")).unwrap(),
        b"through the relay",
        "unwinding keeps the member's data"
    );
    drop_member_volume(&member, &mv).await;
    assert_clean(&d);
    assert_clean(&member);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_path_and_local_sources_are_bind_mounted() {
    require_mounts!();
    let d = relay(Path::new("/nonexistent/plugins")).await;
    let _scrub = Scrub::new(&d);
    let host = tempfile::Builder::new()
        .prefix("csi-relay-hostpath-")
        .tempdir()
        .unwrap();
    let data = fs::canonicalize(host.path()).unwrap().join("data");
    fs::create_dir_all(&data).unwrap();
    fs::write(data.join("seed.txt"), b"on the member node").unwrap();

    let hv = host_vol(
        &d,
        "host-path",
        mount_cap(Mode::MultiNodeMultiWriter),
        describe(
            SourceKind::HostPath {
                path: s(&data),
                type_: Some("Directory".into()),
            },
            false,
        ),
    );
    stage(&d, &hv).await;
    assert_eq!(
        fs::read(hv.staging.join("seed.txt")).unwrap(),
        b"on the member node"
    );
    let target = d.path("pods/p1/vol");
    publish(&d, &hv, &target, false).await;
    fs::write(target.join("new.txt"), b"from the pod").unwrap();
    assert_eq!(fs::read(data.join("new.txt")).unwrap(), b"from the pod");
    let st = stats(&d, &hv.id, &s(&target)).await.expect("stats");
    assert!(!st.volume_condition.unwrap().abnormal);
    unpublish(&d, &hv.id, &target).await;
    unstage(&d, &hv).await;
    forgotten(&d, &hv).await;
    assert!(data.join("new.txt").exists(), "unwinding keeps the data");

    // A read-only member PV is staged (and so published) read-only.
    let ro = host_vol(
        &d,
        "local-ro",
        snw(),
        describe(
            SourceKind::Local {
                path: s(&data),
                fs_type: None,
            },
            true,
        ),
    );
    stage(&d, &ro).await;
    let target = d.path("pods/p2/vol");
    publish(&d, &ro, &target, false).await;
    let err = fs::write(target.join("x"), b"x").expect_err("read-only member PV");
    assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{err}");
    assert!(mounts_at(&target)[0].options.iter().any(|o| o == "ro"));
    unpublish(&d, &ro.id, &target).await;
    unstage(&d, &ro).await;
    assert_clean(&d);
    assert!(leftovers(host.path()).is_empty());
}

/// A NodeStage that must fail, leaving nothing mounted and no record.
async fn refused(d: &Driver, v: &Vol, code: Code, needle: &str) {
    fs::create_dir_all(&v.staging).unwrap();
    let st = expect_code(try_stage(d, stage_req(v)).await, code, &v.id);
    assert!(
        st.message().contains(needle),
        "{}: {:?} does not name {needle:?}",
        v.id,
        st.message()
    );
    assert!(!is_mounted(&v.staging));
    forgotten(d, v).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_sources_are_refused_and_leave_nothing() {
    let member = member_plugin().await;
    let plugins = member.path("plugins");
    let d = relay(&plugins).await;
    let _scrub = Scrub::new(&d);

    let mut unknown = describe(
        SourceKind::HostPath {
            path: "/x".into(),
            type_: None,
        },
        false,
    );
    unknown.insert(source::SOURCE_TYPE.into(), "iscsi".into());
    let v = host_vol(&d, "iscsi", snw(), unknown);
    refused(&d, &v, Code::FailedPrecondition, "iscsi").await;

    let absent = d.path("no/such/dir");
    let host_path = |path: &Path| {
        describe(
            SourceKind::HostPath {
                path: s(path),
                type_: None,
            },
            false,
        )
    };
    let v = host_vol(&d, "absent", snw(), host_path(&absent));
    refused(&d, &v, Code::FailedPrecondition, &s(&absent)).await;
    for (name, path) in [
        ("etc", PathBuf::from("/etc")),
        ("state", d.state_dir.clone()),
        ("kubelet-root", d.dir.path().to_path_buf()),
        ("plugins", plugins.clone()),
    ] {
        let v = host_vol(&d, name, snw(), host_path(&path));
        refused(&d, &v, Code::FailedPrecondition, "refused").await;
    }
    let data = tempfile::tempdir().unwrap();
    let v = host_vol(
        &d,
        "block",
        block_cap(Mode::SingleNodeWriter),
        host_path(data.path()),
    );
    refused(&d, &v, Code::InvalidArgument, "mount access only").await;

    // The member driver has no node plugin on this node.
    let mv = Vol {
        id: "vol-elsewhere".into(),
        cap: snw(),
        staging: PathBuf::new(),
        context: HashMap::new(),
        publish_context: HashMap::new(),
    };
    let v = host_vol(
        &d,
        "no-plugin",
        snw(),
        describe(csi_source("absent.csi.dev", &mv), false),
    );
    let socket = plugins.join("absent.csi.dev").join("csi.sock");
    refused(&d, &v, Code::Unavailable, &s(&socket)).await;

    // A malformed description names the missing key.
    let mut broken = describe(
        SourceKind::Nfs {
            server: "10.0.0.5".into(),
            path: "/exports/a".into(),
        },
        false,
    );
    broken.remove(source::NFS_PATH);
    let v = host_vol(&d, "broken", snw(), broken);
    refused(&d, &v, Code::InvalidArgument, source::NFS_PATH).await;

    // No member description and no record: nothing this node knows.
    let v = host_vol(&d, "unknown", snw(), HashMap::new());
    refused(&d, &v, Code::NotFound, "unknown").await;

    // NFS needs mount.nfs (nfs-common) on the node.
    let nfs = describe(
        SourceKind::Nfs {
            server: "192.0.2.1".into(),
            path: "/exports/a".into(),
        },
        false,
    );
    let v = host_vol(&d, "nfs", snw(), nfs);
    if csi_relay::os::nfs::helper_installed() {
        common::skip(
            "mount.nfs is installed but no NFS server runs here: a real NFS mount is not tested",
        );
    } else {
        refused(
            &d,
            &v,
            Code::FailedPrecondition,
            "nfs-common not installed on this node",
        )
        .await;
    }
    assert_clean(&d);
}

// ---------------------------------------------------------------------------
// An in-process member plugin that publishes without staging.

#[derive(Default)]
struct Calls {
    stages: Vec<csi::NodeStageVolumeRequest>,
    unstages: Vec<csi::NodeUnstageVolumeRequest>,
    publishes: Vec<csi::NodePublishVolumeRequest>,
    unpublishes: Vec<csi::NodeUnpublishVolumeRequest>,
}

struct NoStagePlugin {
    backing: PathBuf,
    calls: Arc<Mutex<Calls>>,
}

#[tonic::async_trait]
impl Node for NoStagePlugin {
    async fn node_stage_volume(
        &self,
        r: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        self.calls.lock().unwrap().stages.push(r.into_inner());
        Err(Status::unimplemented("this plugin does not stage"))
    }

    async fn node_unstage_volume(
        &self,
        r: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        self.calls.lock().unwrap().unstages.push(r.into_inner());
        Err(Status::unimplemented("this plugin does not stage"))
    }

    async fn node_publish_volume(
        &self,
        r: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        let req = r.into_inner();
        let target = PathBuf::from(&req.target_path);
        self.calls.lock().unwrap().publishes.push(req);
        if !is_mounted(&target) {
            fs::create_dir_all(&target).map_err(|e| Status::internal(e.to_string()))?;
            nix::mount::mount(
                Some(&self.backing),
                &target,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| Status::internal(e.to_string()))?;
        }
        Ok(Response::new(csi::NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        let req = r.into_inner();
        let target = PathBuf::from(&req.target_path);
        self.calls.lock().unwrap().unpublishes.push(req);
        if is_mounted(&target) {
            nix::mount::umount2(&target, nix::mount::MntFlags::empty())
                .map_err(|e| Status::internal(e.to_string()))?;
        }
        let _ = fs::remove_dir(&target);
        Ok(Response::new(csi::NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        _: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        Err(Status::unimplemented("not advertised"))
    }

    async fn node_expand_volume(
        &self,
        _: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        Err(Status::unimplemented("not advertised"))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::NodeGetCapabilitiesResponse {
            capabilities: vec![],
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: "worker-1".into(),
            ..Default::default()
        }))
    }
}

/// Serves `plugin` on `socket` until the returned sender is dropped.
fn serve_plugin(plugin: NoStagePlugin, socket: &Path) -> tokio::sync::oneshot::Sender<()> {
    fs::create_dir_all(socket.parent().unwrap()).unwrap();
    let listener = tokio::net::UnixListener::bind(socket).expect("bind plugin socket");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(NodeServer::new(plugin))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                async {
                    let _ = stopped.await;
                },
            ),
    );
    stop
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plugin_that_does_not_stage_gets_exactly_the_member_volume() {
    require_mounts!();
    let plugins_home = tempfile::Builder::new()
        .prefix("csi-relay-plugins-")
        .tempdir()
        .unwrap();
    let plugins = plugins_home.path().join("plugins");
    let d = relay(&plugins).await;
    let _scrub = Scrub::new(&d);
    let backing = plugins_home.path().join("backing");
    fs::create_dir_all(&backing).unwrap();
    let calls = Arc::new(Mutex::new(Calls::default()));
    let _stop = serve_plugin(
        NoStagePlugin {
            backing: backing.clone(),
            calls: calls.clone(),
        },
        &plugins.join("nostage.csi.dev/csi.sock"),
    );

    let attributes: BTreeMap<String, String> = [("share".to_string(), "s1".to_string())].into();
    let member_pc: BTreeMap<String, String> =
        [("devicePath".to_string(), "/dev/x".to_string())].into();
    let described = MemberSource {
        member: "east".into(),
        pv: "pv-nostage".into(),
        member_node: Some("worker-1".into()),
        read_only: false,
        mount_options: vec!["noatime".into()],
        kind: SourceKind::Csi {
            driver: "nostage.csi.dev".into(),
            volume_handle: "handle-42".into(),
            fs_type: Some("xfs".into()),
            volume_attributes: attributes.clone(),
            publish_context: member_pc.clone(),
            attachment: Some("relay-abc".into()),
            stage_secret: None,
            publish_secret: None,
        },
    };
    let mut hv = host_vol(
        &d,
        "host-nostage",
        fs_cap(Mode::SingleNodeSingleWriter, "", &["nodev"]),
        described.to_context().unwrap().into_iter().collect(),
    );
    hv.context.insert("host-key".into(), "host-value".into());
    let mut req = stage_req(&hv);
    req.secrets = common::req::secrets();
    fs::create_dir_all(&hv.staging).unwrap();
    try_stage(&d, req).await.expect("NodeStage");
    assert!(
        calls.lock().unwrap().stages.is_empty(),
        "a plugin without STAGE_UNSTAGE is not asked to stage"
    );

    let target = d.path("pods/p1/vol");
    let mut req = publish_req(&hv, &target, false);
    req.secrets = common::req::secrets();
    try_publish(&d, req).await.expect("NodePublish");
    fs::write(target.join("f"), b"via the plugin").unwrap();
    assert_eq!(fs::read(backing.join("f")).unwrap(), b"via the plugin");
    {
        let c = calls.lock().unwrap();
        assert_eq!(c.publishes.len(), 1);
        let p = &c.publishes[0];
        assert_eq!(p.volume_id, "handle-42", "the member volume handle");
        assert_eq!(p.target_path, s(&target), "our target path");
        assert_eq!(
            p.staging_target_path, "",
            "no staging path for a plugin that does not stage"
        );
        assert_eq!(
            p.volume_context,
            attributes.clone().into_iter().collect::<HashMap<_, _>>()
        );
        assert_eq!(
            p.publish_context,
            member_pc.clone().into_iter().collect::<HashMap<_, _>>()
        );
        assert!(p.secrets.is_empty(), "the host's secrets are not forwarded");
        assert!(!p.readonly);
        let cap = p.volume_capability.as_ref().expect("capability");
        assert_eq!(
            cap.access_mode.unwrap().mode,
            Mode::SingleNodeWriter as i32,
            "a plugin without SINGLE_NODE_MULTI_WRITER gets SINGLE_NODE_WRITER"
        );
        match &cap.access_type {
            Some(AccessType::Mount(m)) => {
                assert_eq!(m.fs_type, "xfs", "the member PV's fsType");
                assert_eq!(m.mount_flags, ["noatime", "nodev"]);
            }
            other => panic!("{other:?}"),
        }
    }
    // NodeGetVolumeStats: not offered by the plugin, answered from the mount.
    let st = stats(&d, &hv.id, &s(&target)).await.expect("stats");
    assert!(!st.usage.is_empty());

    unpublish(&d, &hv.id, &target).await;
    unstage(&d, &hv).await;
    {
        let c = calls.lock().unwrap();
        assert_eq!(c.unpublishes.len(), 1);
        assert_eq!(c.unpublishes[0].volume_id, "handle-42");
        assert!(
            c.unstages.is_empty(),
            "nothing to unstage in a plugin that does not stage"
        );
    }
    forgotten(&d, &hv).await;
    assert_clean(&d);
    assert!(leftovers(plugins_home.path()).is_empty());
}

// ---------------------------------------------------------------------------
// Restart reconciliation.

async fn proxied_and_published(member: &Driver, d: &Driver, name: &str) -> (Vol, Vol, PathBuf) {
    let mv = member_volume(member, name).await;
    let hv = host_vol(
        d,
        &format!("host-{name}"),
        snw(),
        describe(csi_source(MEMBER_DRIVER, &mv), false),
    );
    stage(d, &hv).await;
    let target = d.path(&format!("pods/{name}/vol"));
    publish(d, &hv, &target, false).await;
    fs::write(target.join("keep.txt"), name).unwrap();
    (mv, hv, target)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_proxied_mounts_are_asked_of_the_member_plugin_again() {
    require_mounts!();
    let member = member_plugin().await;
    let _member_scrub = Scrub::new(&member);
    let mut d = relay(&member.path("plugins")).await;
    let _scrub = Scrub::new(&d);
    let (mv, hv, target) = proxied_and_published(&member, &d, "lost").await;

    d.crash();
    run("umount", &[&s(&target)]);
    run("umount", &[&s(&hv.staging)]);
    assert!(!is_mounted(&target) && !is_mounted(&hv.staging));
    d.start_again().await;

    assert_eq!(
        mounts_at(&hv.staging).len(),
        1,
        "the stage is forwarded again"
    );
    assert_eq!(
        mounts_at(&target).len(),
        1,
        "the publication is forwarded again"
    );
    assert_eq!(fs::read_to_string(target.join("keep.txt")).unwrap(), "lost");

    unpublish(&d, &hv.id, &target).await;
    unstage(&d, &hv).await;
    forgotten(&d, &hv).await;
    drop_member_volume(&member, &mv).await;
    assert_clean(&d);
    assert_clean(&member);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_proxied_work_is_rolled_back_through_the_member_plugin() {
    require_mounts!();
    let member = member_plugin().await;
    let _member_scrub = Scrub::new(&member);
    let mut d = relay(&member.path("plugins")).await;
    let _scrub = Scrub::new(&d);
    let (mv, hv, target) = proxied_and_published(&member, &d, "interrupted").await;
    // A healthy neighbour that must come through untouched.
    let (mv2, hv2, target2) = proxied_and_published(&member, &d, "neighbour").await;

    // The driver died after recording its intents, before committing them.
    d.crash();
    {
        let store = csi_relay::store::Store::open(&d.state_dir).expect("open the node's store");
        let mut vol = store.volume(&hv.id).unwrap().expect("node-local record");
        let node = vol.nodes.get_mut(common::NODE).expect("this node's state");
        node.targets.get_mut(&s(&target)).unwrap().progress = Progress::Applying;
        node.stage.as_mut().unwrap().progress = Progress::Removing;
        store.put_volume(&vol).unwrap();
    }
    d.start_again().await;

    assert!(
        !is_mounted(&target) && !target.exists(),
        "the publication is undone by the member plugin"
    );
    assert!(
        !is_mounted(&hv.staging),
        "the stage is undone by the member plugin"
    );
    forgotten(&d, &hv).await;
    expect_code(
        stats(&member, &mv.id, &s(&hv.staging)).await,
        Code::NotFound,
        "the member plugin no longer stages the volume",
    );
    assert!(is_mounted(&target2) && is_mounted(&hv2.staging));
    assert_eq!(
        fs::read_to_string(target2.join("keep.txt")).unwrap(),
        "neighbour"
    );

    // The CO's retries start clean.
    stage(&d, &hv).await;
    publish(&d, &hv, &target, false).await;
    assert_eq!(
        fs::read_to_string(target.join("keep.txt")).unwrap(),
        "interrupted"
    );
    for (v, t) in [(&hv, &target), (&hv2, &target2)] {
        unpublish(&d, &v.id, t).await;
        unstage(&d, v).await;
    }
    drop_member_volume(&member, &mv).await;
    drop_member_volume(&member, &mv2).await;
    assert_clean(&d);
    assert_clean(&member);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_mounted_member_volume_is_restored_after_a_crash() {
    require_mounts!();
    let mut d = relay(Path::new("/nonexistent/plugins")).await;
    let _scrub = Scrub::new(&d);
    let host = tempfile::tempdir().unwrap();
    let data = fs::canonicalize(host.path()).unwrap();
    let hv = host_vol(
        &d,
        "host-restart",
        snw(),
        describe(
            SourceKind::HostPath {
                path: s(&data),
                type_: None,
            },
            false,
        ),
    );
    stage(&d, &hv).await;
    let target = d.path("pods/p1/vol");
    publish(&d, &hv, &target, false).await;
    fs::write(target.join("keep.txt"), b"kept").unwrap();
    d.crash();
    run("umount", &[&s(&target)]);
    run("umount", &[&s(&hv.staging)]);
    d.start_again().await;
    assert_eq!(mounts_at(&hv.staging).len(), 1);
    assert_eq!(mounts_at(&target).len(), 1);
    assert_eq!(fs::read(target.join("keep.txt")).unwrap(), b"kept");
    unpublish(&d, &hv.id, &target).await;
    unstage(&d, &hv).await;
    forgotten(&d, &hv).await;
    assert_clean(&d);
    assert!(leftovers(host.path()).is_empty());
}

// The member volume and its plugin are gone (deleted under the mounts):
// unpublish and unstage still succeed once nothing is mounted, so kubelet
// can clean the pod up; while something is mounted the error stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_member_volume_never_wedges_unpublish_or_unstage() {
    require_mounts!();
    let mut member = member_plugin().await;
    let _member_scrub = Scrub::new(&member);
    let d = relay(&member.path("plugins")).await;
    let _scrub = Scrub::new(&d);
    let (_mv, hv, target) = proxied_and_published(&member, &d, "gone").await;

    member.stop();
    let err = expect_code(
        try_unpublish(&d, &hv.id, &target).await,
        Code::Unavailable,
        "unpublish through a gone plugin while the target is mounted",
    );
    assert!(err.message().contains(MEMBER_DRIVER), "{}", err.message());
    assert!(is_mounted(&target));

    run("umount", &[&s(&target)]);
    unpublish(&d, &hv.id, &target).await;
    run("umount", &[&s(&hv.staging)]);
    unstage(&d, &hv).await;
    forgotten(&d, &hv).await;
    assert_clean(&d);
}
