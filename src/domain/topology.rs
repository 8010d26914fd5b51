//! The topology keys this driver puts on nodes and volumes.

pub const TOPOLOGY_PREFIX: &str = "topology.relay.csi.dev/";
pub const TOPOLOGY_NODE_KEY: &str = "topology.relay.csi.dev/node";
/// The member cluster a volume lives in / a host node's pods run in.
pub const TOPOLOGY_MEMBER_KEY: &str = "topology.relay.csi.dev/member";
/// The member cluster's node a host node stands for (one-to-one mapping).
pub const TOPOLOGY_MEMBER_NODE_KEY: &str = "topology.relay.csi.dev/member-node";
