//! The node plugin of a member PV's own CSI driver, on this node: csi-relay
//! is a CSI proxy for such volumes. The plugin is found where kubelet's
//! plugin registration puts it, `<plugins dir>/<driver name>/csi.sock`, and
//! every node call on the host volume is forwarded to it with the member
//! volume's handle, attributes and attachment metadata.
//!
//! Staging: the member plugin stages at the host volume's own staging path
//! (kubelet's per-volume `globalmount`), exactly where kubelet would have
//! staged the member volume had it called the plugin itself. csi-relay adds
//! nothing there: no extra directory to create, to clean or to leak, and a
//! plugin that keeps state next to its staging mount finds it where it
//! expects. A plugin that does not advertise STAGE_UNSTAGE_VOLUME is not
//! asked to stage; NodeStage then only records VOL_READY here, and
//! NodePublish reaches the plugin without a staging path.
//!
//! The host's `secrets` are never forwarded: they belong to csi-relay's
//! StorageClass, not to the member driver. The member PV's own node
//! secrets (nodeStageSecretRef, nodePublishSecretRef) are read from the
//! member cluster by this node plugin and passed on, never logged.

use std::collections::BTreeMap;
use std::future::Future;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::{Code, Response, Status};

use crate::csi::{
    self, node_client::NodeClient, node_service_capability, volume_capability::access_mode::Mode,
    volume_capability::AccessType as WireAccessType,
};
use crate::domain::capability::{AccessMode, Capability};
use crate::domain::error::{CsiError, CsiResult};
use crate::domain::member_source::{MemberSource, SourceKind};

pub use node_service_capability::rpc::Type as NodeCapability;

/// Secret values for one call: never printed, even by `{:?}`.
#[derive(Default, Clone)]
pub struct Secrets(std::collections::HashMap<String, String>);

impl Secrets {
    pub fn new(values: std::collections::HashMap<String, String>) -> Self {
        Secrets(values)
    }

    fn into_inner(self) -> std::collections::HashMap<String, String> {
        self.0
    }
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secrets({} keys, values redacted)", self.0.len())
    }
}

/// kubelet's plugins directory, where node plugins' sockets live.
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// The socket file name inside `<plugins dir>/<driver name>/`.
pub const SOCKET_NAME: &str = "csi.sock";
/// Upper bound of connecting to a member plugin.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Upper bound of one forwarded call. A stage may attach and format a
/// device; the CO's own deadline usually ends the call (and this one with
/// it) first.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(100);

/// The member CSI volume, as its driver's node plugin is told about it.
#[derive(Debug, Clone, Copy)]
pub struct MemberCsiVolume<'a> {
    /// The member cluster the volume lives in.
    pub member: &'a str,
    pub driver: &'a str,
    pub handle: &'a str,
    pub fs_type: Option<&'a str>,
    pub attributes: &'a BTreeMap<String, String>,
    pub publish_context: &'a BTreeMap<String, String>,
    /// The member PV's mountOptions.
    pub mount_options: &'a [String],
    /// `namespace/name` of the member Secrets NodeStage/NodePublish need.
    pub stage_secret: Option<&'a str>,
    pub publish_secret: Option<&'a str>,
}

impl<'a> MemberCsiVolume<'a> {
    /// The CSI part of a member source, if it is a CSI volume.
    pub fn of(source: &'a MemberSource) -> Option<Self> {
        match &source.kind {
            SourceKind::Csi {
                driver,
                volume_handle,
                fs_type,
                volume_attributes,
                publish_context,
                stage_secret,
                publish_secret,
                ..
            } => Some(MemberCsiVolume {
                member: &source.member,
                driver,
                handle: volume_handle,
                fs_type: fs_type.as_deref(),
                attributes: volume_attributes,
                publish_context,
                mount_options: &source.mount_options,
                stage_secret: stage_secret.as_deref(),
                publish_secret: publish_secret.as_deref(),
            }),
            _ => None,
        }
    }
}

/// Where `driver`'s node plugin listens. The name comes from the member
/// cluster: it must be one plain path component (the CSI name rules).
pub fn socket_path(plugins_dir: &Path, driver: &str) -> CsiResult<PathBuf> {
    let plain = !driver.is_empty()
        && driver.len() <= 63
        && driver != "."
        && driver != ".."
        && driver
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
    if !plain {
        return Err(CsiError::FailedPrecondition(format!(
            "member CSI driver name {driver:?} is not a valid CSI driver name"
        )));
    }
    Ok(plugins_dir.join(driver).join(SOCKET_NAME))
}

/// A connection to one member node plugin, with its advertised capabilities.
pub struct MemberPlugin {
    driver: String,
    socket: PathBuf,
    client: NodeClient<Channel>,
    capabilities: Vec<NodeCapability>,
}

fn unavailable(driver: &str, socket: &Path, why: impl std::fmt::Display) -> CsiError {
    CsiError::Unavailable(format!(
        "the node plugin of member CSI driver {driver} is not reachable on this node at {}: {why}",
        socket.display()
    ))
}

/// A member plugin's error, with its code kept: the CO's reaction to it
/// (retry, give up) is the member driver's to decide.
fn forwarded(label: &str, rpc: &str, status: &Status) -> CsiError {
    let msg = format!("{label}: {rpc}: {}", status.message());
    match status.code() {
        Code::InvalidArgument => CsiError::invalid("request forwarded to the member driver", msg),
        Code::NotFound => CsiError::NotFound(msg),
        Code::AlreadyExists => CsiError::AlreadyExists(msg),
        Code::FailedPrecondition => CsiError::FailedPrecondition(msg),
        Code::OutOfRange => CsiError::OutOfRange(msg),
        Code::ResourceExhausted => CsiError::ResourceExhausted(msg),
        Code::Aborted => CsiError::Aborted(msg),
        Code::Unimplemented => CsiError::Unimplemented(msg),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => CsiError::Unavailable(msg),
        _ => CsiError::Internal(msg),
    }
}

impl MemberPlugin {
    /// Connects to `driver`'s node plugin under `plugins_dir` and asks for
    /// its capabilities; UNAVAILABLE naming the socket when it is absent or
    /// does not answer.
    pub async fn connect(plugins_dir: &Path, driver: &str) -> CsiResult<Self> {
        let socket = socket_path(plugins_dir, driver)?;
        match std::fs::metadata(&socket) {
            Ok(m) if m.file_type().is_socket() => {}
            Ok(_) => return Err(unavailable(driver, &socket, "not a unix socket")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(unavailable(driver, &socket, "no such socket"))
            }
            Err(e) => return Err(unavailable(driver, &socket, e)),
        }
        let path = socket.clone();
        let endpoint = Endpoint::from_static("http://[::]:50051").connect_timeout(CONNECT_TIMEOUT);
        let connecting = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }));
        let channel = match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(e)) => {
                let cause = std::error::Error::source(&e)
                    .map(|c| format!("{e}: {c}"))
                    .unwrap_or_else(|| e.to_string());
                return Err(unavailable(driver, &socket, cause));
            }
            Err(_) => {
                return Err(unavailable(
                    driver,
                    &socket,
                    format!("no connection within {CONNECT_TIMEOUT:?}"),
                ))
            }
        };
        let mut plugin = MemberPlugin {
            driver: driver.to_string(),
            socket,
            client: NodeClient::new(channel),
            capabilities: Vec::new(),
        };
        let mut client = plugin.client.clone();
        let caps = plugin
            .call(
                "NodeGetCapabilities",
                client.node_get_capabilities(csi::NodeGetCapabilitiesRequest {}),
            )
            .await?;
        plugin.capabilities = caps
            .capabilities
            .iter()
            .filter_map(|c| match &c.r#type {
                Some(node_service_capability::Type::Rpc(rpc)) => {
                    NodeCapability::try_from(rpc.r#type).ok()
                }
                None => None,
            })
            .collect();
        Ok(plugin)
    }

    fn label(&self) -> String {
        format!(
            "member CSI driver {} at {}",
            self.driver,
            self.socket.display()
        )
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn has(&self, cap: NodeCapability) -> bool {
        self.capabilities.contains(&cap)
    }

    /// Whether the plugin stages volumes (STAGE_UNSTAGE_VOLUME).
    pub fn stages(&self) -> bool {
        self.has(NodeCapability::StageUnstageVolume)
    }

    async fn call<T>(
        &self,
        rpc: &'static str,
        fut: impl Future<Output = Result<Response<T>, Status>>,
    ) -> CsiResult<T> {
        match tokio::time::timeout(CALL_TIMEOUT, fut).await {
            Ok(Ok(reply)) => Ok(reply.into_inner()),
            Ok(Err(status)) => Err(forwarded(&self.label(), rpc, &status)),
            Err(_) => Err(CsiError::Unavailable(format!(
                "{}: {rpc} did not answer within {CALL_TIMEOUT:?}",
                self.label()
            ))),
        }
    }

    /// The capability as the member plugin gets it: the member PV's fs_type
    /// and mountOptions win, and what the plugin does not advertise is
    /// expressed the way the CSI spec asks a CO to (SINGLE_NODE_WRITER for
    /// the single-writer modes, no volume_mount_group).
    pub fn capability(&self, vol: &MemberCsiVolume<'_>, cap: &Capability) -> csi::VolumeCapability {
        let mut wire = cap.to_wire();
        if let Some(WireAccessType::Mount(m)) = wire.access_type.as_mut() {
            if let Some(fs) = vol.fs_type.filter(|f| !f.is_empty()) {
                m.fs_type = fs.to_string();
            }
            let mut flags: Vec<String> = vol.mount_options.to_vec();
            for f in std::mem::take(&mut m.mount_flags) {
                if !flags.contains(&f) {
                    flags.push(f);
                }
            }
            m.mount_flags = flags;
            if !self.has(NodeCapability::VolumeMountGroup) {
                m.volume_mount_group.clear();
            }
        }
        let single_writer = matches!(
            cap.mode,
            AccessMode::SingleNodeSingleWriter | AccessMode::SingleNodeMultiWriter
        );
        if single_writer && !self.has(NodeCapability::SingleNodeMultiWriter) {
            if let Some(m) = wire.access_mode.as_mut() {
                m.mode = Mode::SingleNodeWriter as i32;
            }
        }
        wire
    }

    fn staging_arg(&self, staging: &Path) -> String {
        if self.stages() {
            staging.to_string_lossy().into_owned()
        } else {
            String::new()
        }
    }

    /// NodeStageVolume at `staging`; nothing to do for a plugin that does
    /// not stage.
    pub async fn stage(
        &self,
        vol: &MemberCsiVolume<'_>,
        staging: &Path,
        cap: &Capability,
        secrets: Secrets,
    ) -> CsiResult<()> {
        if !self.stages() {
            return Ok(());
        }
        let req = csi::NodeStageVolumeRequest {
            volume_id: vol.handle.to_string(),
            publish_context: vol.publish_context.clone().into_iter().collect(),
            staging_target_path: staging.to_string_lossy().into_owned(),
            volume_capability: Some(self.capability(vol, cap)),
            secrets: secrets.into_inner(),
            volume_context: vol.attributes.clone().into_iter().collect(),
        };
        let mut client = self.client.clone();
        self.call("NodeStageVolume", client.node_stage_volume(req))
            .await
            .map(|_| ())
    }

    pub async fn unstage(&self, vol: &MemberCsiVolume<'_>, staging: &Path) -> CsiResult<()> {
        if !self.stages() {
            return Ok(());
        }
        let req = csi::NodeUnstageVolumeRequest {
            volume_id: vol.handle.to_string(),
            staging_target_path: staging.to_string_lossy().into_owned(),
        };
        let mut client = self.client.clone();
        self.call("NodeUnstageVolume", client.node_unstage_volume(req))
            .await
            .map(|_| ())
    }

    pub async fn publish(
        &self,
        vol: &MemberCsiVolume<'_>,
        staging: &Path,
        target: &Path,
        cap: &Capability,
        readonly: bool,
        secrets: Secrets,
    ) -> CsiResult<()> {
        let req = csi::NodePublishVolumeRequest {
            volume_id: vol.handle.to_string(),
            publish_context: vol.publish_context.clone().into_iter().collect(),
            staging_target_path: self.staging_arg(staging),
            target_path: target.to_string_lossy().into_owned(),
            volume_capability: Some(self.capability(vol, cap)),
            readonly,
            secrets: secrets.into_inner(),
            volume_context: vol.attributes.clone().into_iter().collect(),
        };
        let mut client = self.client.clone();
        self.call("NodePublishVolume", client.node_publish_volume(req))
            .await
            .map(|_| ())
    }

    pub async fn unpublish(&self, vol: &MemberCsiVolume<'_>, target: &Path) -> CsiResult<()> {
        let req = csi::NodeUnpublishVolumeRequest {
            volume_id: vol.handle.to_string(),
            target_path: target.to_string_lossy().into_owned(),
        };
        let mut client = self.client.clone();
        self.call("NodeUnpublishVolume", client.node_unpublish_volume(req))
            .await
            .map(|_| ())
    }

    /// NodeGetVolumeStats, when the plugin offers it.
    pub async fn stats(
        &self,
        vol: &MemberCsiVolume<'_>,
        path: &Path,
        staging: Option<&Path>,
    ) -> CsiResult<Option<csi::NodeGetVolumeStatsResponse>> {
        if !self.has(NodeCapability::GetVolumeStats) {
            return Ok(None);
        }
        let req = csi::NodeGetVolumeStatsRequest {
            volume_id: vol.handle.to_string(),
            volume_path: path.to_string_lossy().into_owned(),
            staging_target_path: staging.map(|s| self.staging_arg(s)).unwrap_or_default(),
        };
        let mut client = self.client.clone();
        let mut reply = self
            .call("NodeGetVolumeStats", client.node_get_volume_stats(req))
            .await?;
        if !self.has(NodeCapability::VolumeCondition) {
            reply.volume_condition = None;
        }
        Ok(Some(reply))
    }

    /// NodeExpandVolume, when the plugin offers it; the new size in bytes.
    pub async fn expand(
        &self,
        vol: &MemberCsiVolume<'_>,
        path: &Path,
        staging: Option<&Path>,
        capacity: Option<csi::CapacityRange>,
        cap: Option<&Capability>,
    ) -> CsiResult<Option<i64>> {
        if !self.has(NodeCapability::ExpandVolume) {
            return Ok(None);
        }
        let req = csi::NodeExpandVolumeRequest {
            volume_id: vol.handle.to_string(),
            volume_path: path.to_string_lossy().into_owned(),
            capacity_range: capacity,
            staging_target_path: staging.map(|s| self.staging_arg(s)).unwrap_or_default(),
            volume_capability: cap.map(|c| self.capability(vol, c)),
            secrets: Default::default(),
        };
        let mut client = self.client.clone();
        let reply = self
            .call("NodeExpandVolume", client.node_expand_volume(req))
            .await?;
        Ok(Some(reply.capacity_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::status::CsiCode;

    #[test]
    fn socket_paths_stay_inside_the_plugins_dir() {
        let dir = Path::new("/var/lib/kubelet/plugins");
        assert_eq!(
            socket_path(dir, "ebs.csi.aws.com").unwrap(),
            Path::new("/var/lib/kubelet/plugins/ebs.csi.aws.com/csi.sock")
        );
        for bad in ["", ".", "..", "a/b", "../x", &"a".repeat(64)] {
            let err = socket_path(dir, bad).unwrap_err();
            assert_eq!(err.code(), Code::FailedPrecondition, "{bad:?}");
        }
    }

    #[test]
    fn member_errors_keep_their_code() {
        let e = forwarded("d", "NodeStageVolume", &Status::not_found("gone"));
        assert_eq!(e.code(), Code::NotFound);
        assert!(e.to_string().contains("NodeStageVolume: gone"), "{e}");
        let e = forwarded("d", "x", &Status::deadline_exceeded("slow"));
        assert_eq!(e.code(), Code::Unavailable);
        let e = forwarded("d", "x", &Status::unknown("?"));
        assert_eq!(e.code(), Code::Internal);
    }

    fn plugin(capabilities: Vec<NodeCapability>) -> MemberPlugin {
        MemberPlugin {
            driver: "d".into(),
            socket: PathBuf::from("/x/csi.sock"),
            client: NodeClient::new(Endpoint::from_static("http://[::]:1").connect_lazy()),
            capabilities,
        }
    }

    #[tokio::test]
    async fn forwarded_capability_follows_the_member_pv_and_the_plugin() {
        let attributes = BTreeMap::new();
        let context = BTreeMap::new();
        let options = vec!["noatime".to_string(), "nodev".to_string()];
        let vol = MemberCsiVolume {
            member: "east",
            driver: "d",
            handle: "h",
            fs_type: Some("xfs"),
            attributes: &attributes,
            publish_context: &context,
            mount_options: &options,
            stage_secret: None,
            publish_secret: None,
        };
        let cap = Capability {
            mode: AccessMode::SingleNodeMultiWriter,
            access: crate::domain::capability::AccessType::Mount {
                fs_type: "ext4".into(),
                mount_flags: vec!["nodev".into(), "sync".into()],
                volume_mount_group: "1000".into(),
            },
        };
        let bare = plugin(vec![]).capability(&vol, &cap);
        assert_eq!(
            bare.access_mode.unwrap().mode,
            Mode::SingleNodeWriter as i32
        );
        let Some(WireAccessType::Mount(m)) = &bare.access_type else {
            panic!("{bare:?}")
        };
        assert_eq!(m.fs_type, "xfs");
        assert_eq!(m.mount_flags, ["noatime", "nodev", "sync"]);
        assert!(m.volume_mount_group.is_empty());
        let full = plugin(vec![
            NodeCapability::SingleNodeMultiWriter,
            NodeCapability::VolumeMountGroup,
        ])
        .capability(&vol, &cap);
        assert_eq!(
            full.access_mode.unwrap().mode,
            Mode::SingleNodeMultiWriter as i32
        );
        let Some(WireAccessType::Mount(m)) = &full.access_type else {
            panic!("{full:?}")
        };
        assert_eq!(m.volume_mount_group, "1000");
        assert!(!plugin(vec![]).stages());
        assert_eq!(plugin(vec![]).staging_arg(Path::new("/s")), "");
        let staging = plugin(vec![NodeCapability::StageUnstageVolume]);
        assert_eq!(staging.staging_arg(Path::new("/s")), "/s");
    }

    #[tokio::test]
    async fn an_absent_socket_is_unavailable_and_named() {
        let tmp = tempfile::tempdir().unwrap();
        let err = MemberPlugin::connect(tmp.path(), "absent.csi.dev")
            .await
            .err()
            .unwrap();
        assert_eq!(err.code(), Code::Unavailable);
        let socket = tmp.path().join("absent.csi.dev/csi.sock");
        assert!(
            err.to_string().contains(&socket.display().to_string()),
            "{err}"
        );
        // A stale socket file nobody listens on.
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        let err = MemberPlugin::connect(tmp.path(), "absent.csi.dev")
            .await
            .err()
            .unwrap();
        assert_eq!(err.code(), Code::Unavailable, "{err}");
    }

    #[test]
    fn secrets_never_print_their_values() {
        let s = Secrets::new([("key".to_string(), "hunter2".to_string())].into());
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("1 keys"),
            "{shown}"
        );
    }
}
