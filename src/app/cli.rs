//! The command line (a stable interface: flag names do not change). The
//! settings derived from it are `domain::settings`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::domain::settings::{Mode, MountBacking, SpecVersion, DEFAULT_DRIVER_NAME};
use crate::grpc::endpoint::Endpoint;

#[derive(Parser, Debug)]
#[command(
    name = "csi-relay",
    version,
    about = "A CSI driver that relays volume operations to a member cluster's storage; standalone it serves volumes from an embedded local backend"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
// Parsed once at start-up: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Command {
    /// Serve the CSI Identity, Controller, GroupController and Node services.
    Serve(ServeArgs),
    /// Print the RelayVolume CustomResourceDefinition (YAML) for the host cluster.
    Crd,
    /// Check an installation: the CRD, this identity's rights, the driver's
    /// StorageClasses, how host nodes map to members, stuck volumes; one
    /// line each with its fix. Exit 0: healthy, 1: problems, 2: could not check.
    Check(crate::app::check::CheckArgs),
    /// Serve one end of a volume move (run by the relay in a member pod
    /// that mounts the volume's claim there; not for use by hand).
    Mover(MoverArgs),
}

#[derive(Args, Debug, Clone)]
pub struct MoverArgs {
    /// Which end: `source` (reads the old member's claim) or `target`.
    #[arg(long, value_parser = ["source", "target"])]
    pub role: String,
    /// The move's id: both ends and the controller must agree on it.
    #[arg(long)]
    pub move_id: String,
    /// The file holding the move's key (hex), from its Secret.
    #[arg(long)]
    pub key_file: std::path::PathBuf,
    /// Where the volume is: its mount (filesystem) or device (--block).
    #[arg(long)]
    pub path: std::path::PathBuf,
    #[arg(long)]
    pub block: bool,
    /// The address to listen on: the pod's loopback (the way in is a
    /// port-forward through the API server), or 0.0.0.0 for a source
    /// mover the target mover may reach on the pod network.
    #[arg(long, default_value = "127.0.0.1")]
    pub listen: std::net::IpAddr,
    #[arg(long, default_value_t = crate::backends::member::mobility::mover::PORT)]
    pub port: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// Directories and loop-device block files under --state-dir.
    Local,
    /// PersistentVolumeClaims in member clusters (--member).
    Member,
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Where to listen: unix:///path/to/csi.sock or tcp://127.0.0.1:PORT.
    /// A stale unix socket file is removed on start and on shutdown.
    #[arg(
        long,
        env = "CSI_ENDPOINT",
        default_value = "unix:///tmp/csi-relay/csi.sock"
    )]
    pub endpoint: Endpoint,

    /// A second endpoint serving only the Identity service, whose Probe says
    /// whether the process is healthy, leading or not. With
    /// `--leader-election` a standby answers Probe "not ready" on the main
    /// endpoint, so the sidecars beside it wait instead of electing
    /// themselves; the liveness probe asks here, and a standby stays alive.
    #[arg(long, value_name = "ENDPOINT")]
    pub probe_endpoint: Option<Endpoint>,

    /// This node's id, reported by NodeGetInfo and used as its topology.
    #[arg(long, env = "CSI_NODE_ID")]
    pub node_id: String,

    /// Directory for the state store and the local backend's volumes and snapshots.
    #[arg(long, env = "CSI_STATE_DIR", default_value = "/var/lib/csi-relay")]
    pub state_dir: PathBuf,

    /// CSI driver name (GetPluginInfo); StorageClasses name it as provisioner.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME, value_parser = crate::domain::settings::parse_driver_name)]
    pub driver_name: String,

    /// Which services to serve.
    #[arg(long, value_enum, default_value_t = Mode::All)]
    pub mode: Mode,

    /// Attach limit per node (NodeGetInfo max_volumes_per_node; ControllerPublish
    /// answers RESOURCE_EXHAUSTED beyond it). 0 means no limit.
    #[arg(long, default_value_t = 0)]
    pub max_volumes_per_node: u64,

    /// Total bytes the local backend may allocate to volumes and snapshots
    /// (GetCapacity). Default: what is free on the filesystem holding
    /// --state-dir at start-up, plus what the volumes and snapshots already
    /// recorded hold.
    #[arg(long)]
    pub capacity: Option<u64>,

    /// Local backend: what a volume with plain mount access is, when its
    /// StorageClass sets no `backing` and the request names no fs_type.
    #[arg(long, value_enum, default_value_t = MountBacking::Block)]
    pub default_mount_backing: MountBacking,

    /// Largest volume CreateVolume / ControllerExpandVolume accept (OUT_OF_RANGE
    /// beyond). Default: the capacity.
    #[arg(long)]
    pub max_volume_size: Option<u64>,

    /// Comma-separated names of the mutable parameters that CreateVolume and
    /// ControllerModifyVolume accept; any other mutable parameter is refused.
    #[arg(long, value_delimiter = ',')]
    pub mutable_parameters: Vec<String>,

    /// Other node ids the local backend accepts in ControllerPublishVolume:
    /// nodes that share this machine's storage (repeatable).
    #[arg(long = "peer-node", value_name = "NODE_ID")]
    pub peer_nodes: Vec<String>,

    /// Where volumes live: the embedded local backend, or member clusters.
    #[arg(long, value_enum, default_value_t = BackendKind::Local)]
    pub backend: BackendKind,

    /// A member cluster the member backend provisions in: its name (a DNS-1123
    /// label of at most 40 characters, as StorageClasses and topology name it)
    /// and the kubeconfig that reaches it (repeatable; required at least once
    /// with --backend member for the controller service).
    #[arg(long = "member", value_name = "NAME=KUBECONFIG", value_parser = crate::k8s::connect::parse_member)]
    pub members: Vec<crate::k8s::connect::MemberArg>,

    /// A member cluster declared lost for good (deleted, its credentials
    /// revoked), repeatable; not also given as --member. The relay never
    /// contacts it (but for --fence-member): ControllerUnpublishVolume and DeleteVolume of its volumes
    /// succeed and leave its member objects there, each deleted volume's
    /// RelayVolume kept as the record of that (phase RELEASED, label
    /// relay.csi.dev/released-from=NAME); every other call on them is
    /// refused. A member that is merely unreachable is never treated so.
    #[arg(long = "lost-member", value_name = "NAME", value_parser = crate::k8s::naming::parse_member_name)]
    pub lost_members: Vec<String>,

    /// The image the movers of volume moves run (movableBetween classes):
    /// this release of csi-relay, as the members pull it. Without it such
    /// volumes stay in the member that made them, and a pod of theirs on
    /// another member is refused, saying so.
    #[arg(
        long = "mover-image",
        env = "CSI_RELAY_MOVER_IMAGE",
        value_name = "IMAGE"
    )]
    pub mover_image: Option<String>,

    /// Which way a move's bytes go between its movers. auto: mover to
    /// mover on the pod network where the members' pod networks reach each
    /// other (Kosmos ClusterLink, Liqo, Submariner; the source mover then
    /// listens on its pod IP, for sessions that need the move's key), else
    /// through the API servers, which the first pass finds out within 5 s.
    /// api: always through the API servers' port-forwards.
    #[arg(
        long = "mover-path",
        env = "CSI_RELAY_MOVER_PATH",
        value_enum,
        default_value = "auto"
    )]
    pub mover_path: crate::backends::member::mobility::moving::MoverPath,

    /// A member declared lost (--lost-member NAME) that may come back, and
    /// the kubeconfig that reaches it (repeatable). As long as it stays
    /// declared lost, the leading controller asks it every 3 s and deletes,
    /// without grace, every pod there that uses a shared volume (sharedWith
    /// names it): another member writes that volume now. Nothing else is
    /// done there, and no data is deleted. Needs pod list and delete there.
    #[arg(long = "fence-member", value_name = "NAME=KUBECONFIG", value_parser = crate::k8s::connect::parse_member)]
    pub fence_members: Vec<crate::k8s::connect::MemberArg>,

    /// Kubeconfig of the host cluster, where the member backend keeps its
    /// RelayVolume objects and looks up nodes. Default: in-cluster config.
    #[arg(long, value_name = "PATH")]
    pub host_kubeconfig: Option<PathBuf>,

    /// kubelet's plugins directory on this node: a member PersistentVolume of
    /// CSI driver D is staged and published through D's node plugin at
    /// <DIR>/<D>/csi.sock.
    #[arg(long, value_name = "DIR", env = "CSI_PLUGINS_DIR", default_value = crate::ops::node::member_plugin::DEFAULT_PLUGINS_DIR)]
    pub plugins_dir: PathBuf,

    /// Serve Prometheus metrics (RPC counts by method and code, latencies)
    /// at http://ADDR/metrics, e.g. 127.0.0.1:9809. Off when unset.
    #[arg(long, value_name = "ADDR")]
    pub metrics_address: Option<std::net::SocketAddr>,

    /// Run the virtual-node registrar: keep CSINode entries, the node-id
    /// annotation and topology labels for host nodes that run no kubelet
    /// (matched by --virtual-node-selector), so external-attacher works on them.
    #[arg(long)]
    pub virtual_node_registrar: bool,

    /// With --virtual-node-registrar: also mark each registered virtual node
    /// volumes.kubernetes.io/controller-managed-attach-detach=true, so the
    /// host attach/detach controller publishes its pods' volumes (global
    /// storage on Kosmos nodes: the import and the single-writer rule come
    /// with ControllerPublishVolume). Applies to every CSI driver's volumes
    /// on those nodes.
    #[arg(long)]
    pub virtual_node_attach: bool,

    /// One controller at a time: hold a coordination.k8s.io Lease in the
    /// host cluster before doing any controller work (RPCs, housekeeping,
    /// registrar, member watches) or opening --endpoint; a replica writes to
    /// a cluster only while a renewal of its Lease is fresh, and exits once
    /// it is not. The member backend's store is rebuilt from the host's
    /// RelayVolumes each time a replica starts to lead.
    #[arg(long)]
    pub leader_election: bool,

    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "csi-relay")]
    pub leader_election_namespace: String,

    /// Seconds a Lease holder stays leader without renewing it. It renews
    /// every fifth of this, and stops writing 3/10 of it before a standby
    /// may take over.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(5..=300))]
    pub leader_election_lease_seconds: u64,

    /// Which nodes are virtual: `taint:KEY[=VALUE]:EFFECT` or `label:KEY=VALUE`.
    #[arg(long, value_name = "SELECTOR", default_value = crate::k8s::registrar::DEFAULT_SELECTOR)]
    pub virtual_node_selector: crate::k8s::registrar::NodeSelector,

    /// Node label whose value names a virtual node's member cluster; copied
    /// into the `topology.relay.csi.dev/member` topology (e.g. kosmos.io/cluster-name).
    #[arg(long, value_name = "LABEL")]
    pub virtual_node_member_label: Option<String>,

    /// Node annotation whose value names a virtual node's member cluster,
    /// read when the member label is absent; Kosmos writes this one on its
    /// nodes. Empty: none.
    #[arg(long, value_name = "ANNOTATION", default_value = crate::k8s::registrar::KOSMOS_MEMBER_ANNOTATION)]
    pub virtual_node_member_annotation: String,

    /// The member cluster whose volumes this node mounts: NodeGetInfo then
    /// reports topology `topology.relay.csi.dev/member=NAME`, which member
    /// volumes' PVs require of the node they are used on.
    #[arg(long, value_name = "NAME", env = "CSI_NODE_MEMBER")]
    pub node_member: Option<String>,

    /// A volume or snapshot whose CreateVolume/CreateSnapshot started this
    /// many seconds ago and never finished is rolled back by housekeeping
    /// (the CO stopped retrying it). Longer than the CO's retry back-off.
    #[arg(long, value_name = "SECONDS", default_value_t = 3600)]
    pub stale_provisioning_after: u64,

    /// Seconds between housekeeping sweeps (the first runs at start-up):
    /// stale provisioning, unfinished deletions, data no record owns.
    #[arg(long, value_name = "SECONDS", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub housekeeping_interval: u64,

    /// The CSI spec version whose capabilities are advertised. 1.10 hides
    /// what v1.12 added (GET_SNAPSHOT) from validators that refuse
    /// capabilities they do not know (csi-sanity up to v5.4); every RPC is
    /// served either way.
    #[arg(long, value_enum, default_value_t = SpecVersion::V1_12)]
    pub csi_spec: SpecVersion,

    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}
