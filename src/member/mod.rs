//! The member-cluster backend: every host volume is a PersistentVolumeClaim
//! in a member cluster, reached with `kube`.
//!
//! - CreateVolume creates the member PVC (named from the volume id, so a
//!   retry finds it) and returns at once; binding happens in the member.
//! - ControllerPublishVolume waits for nothing unbounded: it answers a
//!   retryable error until the member PVC is Bound, creates a member
//!   VolumeAttachment when the member's CSI driver needs one, and describes
//!   the member PV's source in the publish_context for the node side.
//! - Every state change is mirrored into a `RelayVolume` in the host cluster,
//!   which a restarted controller rebuilds its store from.
//!
//! Every API call is bounded by [`CALL_TIMEOUT`]; an unreachable cluster is
//! UNAVAILABLE naming it, never a hang.

pub mod attach;
pub mod backend;
pub mod capacity;
pub mod claim_copy;
pub mod cluster;
pub mod config;
pub mod error;
pub mod member_view;
pub mod mirror;
pub mod namespace;
pub mod naming;
pub mod nodes;
pub mod observation;
pub mod pvc;
pub mod quantity;
pub mod relay_summary;
pub mod relay_volume;
pub mod snapshot;
pub mod source;
pub mod watched;

#[cfg(test)]
mod flow_tests;
#[cfg(test)]
pub(crate) mod testing;

use std::time::Duration;

/// Upper bound of one Kubernetes API call (connect, send, answer).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Upper bound of a wait for a member object to converge (VolumeAttachment
/// attached or gone, VolumeSnapshot ready). Below the sidecars' default
/// 15 s RPC timeout, so the CO's retry, not its deadline, ends a long wait.
pub const WAIT_BUDGET: Duration = Duration::from_secs(8);
/// Interval between two looks at a converging object.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Server-side apply field manager of the controller.
pub const FIELD_MANAGER: &str = "csi-relay";
