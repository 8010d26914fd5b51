//! The settings the driver runs with, resolved once at start-up from the
//! command line (`app::cli`), and the choices among them.

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::ValueEnum;

use crate::domain::topology::{TOPOLOGY_MEMBER_KEY, TOPOLOGY_NODE_KEY};

pub const DEFAULT_DRIVER_NAME: &str = "relay.csi.dev";

/// A CSI driver name as Kubernetes takes it: at most 63 bytes (the CSI
/// spec's bound on GetPluginInfo's name) and a DNS-1123 subdomain, as the
/// CSIDriver object's name and every PV's `spec.csi.driver` must be. Checked
/// at start, since the API server refuses a bad one only on the first
/// CSIDriver or PV, long after the relay answered GetPluginInfo with it.
pub fn parse_driver_name(name: &str) -> Result<String, String> {
    if name.len() <= 63 && crate::domain::validate::is_object_name(name) {
        Ok(name.to_string())
    } else {
        Err(format!(
            "driver name {name:?}: at most 63 lower-case letters, digits, '-' and '.', each dot-separated part beginning and ending with a letter or digit (a CSIDriver's name, e.g. {DEFAULT_DRIVER_NAME})"
        ))
    }
}

/// What the local backend gives mount access when neither the StorageClass
/// (`backing`) nor the request (raw block, an explicit fs_type) decides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum MountBacking {
    /// A sparse file on a loop device with its own ext4 filesystem: the
    /// volume has the size it was given (df, NodeGetVolumeStats, writes).
    #[default]
    Block,
    /// A plain directory: nothing enforces its size (the figures reported
    /// are its own usage against its capacity); needs no loop devices.
    Directory,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Controller and node services in one process (standalone).
    All,
    /// Identity, Controller and GroupController only (the controller Deployment).
    Controller,
    /// Identity and Node only (the node DaemonSet).
    Node,
}

impl Mode {
    pub fn controller(self) -> bool {
        matches!(self, Mode::All | Mode::Controller)
    }
    pub fn node(self) -> bool {
        matches!(self, Mode::All | Mode::Node)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum SpecVersion {
    #[value(name = "1.10")]
    V1_10,
    #[value(name = "1.12")]
    V1_12,
}

/// Settings the services share, resolved once at start-up.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    pub driver_name: String,
    pub node_id: String,
    pub mode: Mode,
    pub max_volumes_per_node: u64,
    pub capacity: u64,
    pub max_volume_size: u64,
    pub mutable_parameters: BTreeSet<String>,
    /// Resolved through symlinks at start-up: the directory whose store is
    /// open, which staging and target paths are checked against.
    pub state_dir: PathBuf,
    /// The member cluster this node runs pods for (`--node-member`).
    pub node_member: Option<String>,
    /// Age after which an unfinished create is rolled back.
    pub stale_provisioning_after: std::time::Duration,
    /// Capabilities newer than this spec version are not advertised.
    pub csi_spec: SpecVersion,
}

impl DriverConfig {
    /// NodeGetInfo's topology: this node, and its member cluster when set,
    /// so the node carries the segment member volumes' PVs are pinned to.
    pub fn node_topology(&self) -> std::collections::BTreeMap<String, String> {
        let mut t: std::collections::BTreeMap<String, String> =
            [(TOPOLOGY_NODE_KEY.to_string(), self.node_id.clone())].into();
        if let Some(member) = &self.node_member {
            t.insert(TOPOLOGY_MEMBER_KEY.to_string(), member.clone());
        }
        t
    }

    /// A controller of the default driver name on node `node_id` in
    /// `state_dir`, with `capacity` bytes, no limits and no mutable
    /// parameters (tests adjust the rest).
    #[cfg(test)]
    pub fn for_tests(state_dir: &std::path::Path, node_id: &str, capacity: u64) -> Self {
        DriverConfig {
            driver_name: "relay.csi.dev".into(),
            node_id: node_id.into(),
            mode: Mode::Controller,
            max_volumes_per_node: 0,
            capacity,
            max_volume_size: capacity,
            mutable_parameters: Default::default(),
            state_dir: state_dir.to_path_buf(),
            node_member: None,
            stale_provisioning_after: std::time::Duration::from_secs(3600),
            csi_spec: SpecVersion::V1_12,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_name_is_what_a_csidriver_may_be_named() {
        for good in [
            DEFAULT_DRIVER_NAME,
            "member.relay.csi.dev",
            "a",
            "relay-1.example.com",
        ] {
            assert_eq!(parse_driver_name(good).as_deref(), Ok(good));
        }
        let long = format!("{}.com", "a".repeat(60));
        for bad in [
            "",
            "Bad_Driver",
            "Relay.csi.dev",
            "relay.csi.dev.",
            ".relay",
            "relay..csi",
            "relay.-csi",
            "relay csi",
            long.as_str(),
        ] {
            let e = parse_driver_name(bad).expect_err(bad);
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }
}
