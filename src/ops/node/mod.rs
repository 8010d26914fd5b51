//! Node-side operations: staging (VOL_READY), publishing (PUBLISHED), their
//! reversal, stats, expansion, ephemeral inline volumes, node-local records
//! of member volumes and the restart reconciliation. Each follows the same
//! order: validate, ask `state` what the request means, persist the intent,
//! have the volume's source (`sources`) do the work, persist the outcome.

pub mod ephemeral;
pub mod expand;
pub mod member_plugin;
pub mod node_local;
pub mod paths;
pub mod publish;
pub mod reconcile;
pub mod sources;
pub mod stage;
pub mod stats;
