//! Node-side operations: staging (VOL_READY), publishing (PUBLISHED), their
//! reversal, stats, expansion, ephemeral inline volumes, member-cluster
//! volumes (mounted here or proxied to their own CSI node plugin) and the
//! restart reconciliation. Each follows the same order: ask `state` what the
//! request means, persist the intent, do the mount work, persist the outcome.

pub mod bounded;
pub mod ephemeral;
pub mod expand;
pub mod member;
pub mod member_plugin;
pub mod mounter;
pub mod publish;
pub mod reconcile;
pub mod source;
pub mod stage;
pub mod stats;

use crate::error::CsiError;
use crate::mount::syscalls::MountError;

impl From<MountError> for CsiError {
    fn from(e: MountError) -> Self {
        CsiError::Internal(e.to_string())
    }
}
