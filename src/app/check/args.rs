//! The flags of `csi-relay check`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};

use crate::domain::settings::DEFAULT_DRIVER_NAME;
use crate::k8s::connect::MemberArg;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// Kubeconfig of the host cluster. Default: in-cluster config.
    #[arg(long, value_name = "PATH")]
    pub host_kubeconfig: Option<PathBuf>,

    /// A member cluster, as `serve` takes it (repeatable).
    #[arg(long = "member", value_name = "NAME=KUBECONFIG", value_parser = crate::k8s::connect::parse_member)]
    pub members: Vec<MemberArg>,

    /// A member declared lost for good, as `serve` takes it (repeatable).
    #[arg(long = "lost-member", value_name = "NAME", value_parser = crate::k8s::naming::parse_member_name)]
    pub lost_members: Vec<String>,

    /// The CSI driver name whose StorageClasses and nodes are checked.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME, value_parser = crate::domain::settings::parse_driver_name)]
    pub driver_name: String,

    /// Namespace of the controller's pods and Leases.
    #[arg(long, env = "POD_NAMESPACE", default_value = "csi-relay")]
    pub namespace: String,

    /// Label selector of the controller's pods.
    #[arg(long, default_value = "app=csi-relay-controller")]
    pub controller_selector: String,

    /// Seconds after which a volume still PROVISIONING is reported stuck.
    #[arg(long, default_value_t = 600)]
    pub stuck_after: u64,

    /// Which nodes are virtual, as `serve` takes it.
    #[arg(long, value_name = "SELECTOR", default_value = crate::k8s::registrar::DEFAULT_SELECTOR)]
    pub virtual_node_selector: crate::k8s::registrar::NodeSelector,

    /// Node annotation naming a virtual node's member, as `serve` takes it.
    #[arg(long, value_name = "ANNOTATION", default_value = crate::k8s::registrar::KOSMOS_MEMBER_ANNOTATION)]
    pub virtual_node_member_annotation: String,

    /// `text` (a line per finding) or `json` (for scripts).
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}
