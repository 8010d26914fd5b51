//! The member-cluster backend: every host volume is a PersistentVolumeClaim
//! in a member cluster, reached with `kube`.
//!
//! - CreateVolume creates the member PVC (named from the volume id, so a
//!   retry finds it); where the member class binds at once it answers once
//!   the claim is Bound (bounded: a retryable error naming what the member
//!   said until then); where it waits for a consumer, at once.
//! - ControllerPublishVolume waits for nothing unbounded: it answers a
//!   retryable error until the member PVC is Bound, creates a member
//!   VolumeAttachment when the member's CSI driver needs one, and describes
//!   the member PV's source in the publish_context for the node side.
//! - Every state change is mirrored into a `RelayVolume` in the host cluster,
//!   which a restarted controller rebuilds its store from.
//!
//! Every API call is bounded by [`crate::k8s::CALL_TIMEOUT`]; an unreachable cluster is
//! UNAVAILABLE naming it, never a hang.

pub mod attach;
pub mod backend;
pub mod capacity;
pub mod claim_bound;
pub mod claim_copy;
pub mod claim_create;
pub mod group_snapshot;
pub mod mobility;
pub mod namespace;
pub mod pvc;
pub mod snapshot;

#[cfg(test)]
mod flow_tests;
