//! Controller-side operations, one file per concern. Each takes the decoded
//! gRPC request and returns the reply; `grpc::controller_service` only wires them.

pub mod capacity;
pub mod group_snapshot;
pub mod listing;
pub mod modify;
pub mod provision;
pub mod publish;
pub mod snapshot;
pub mod wire;
