//! What each CSI call does, over the layers below: the shared context
//! (`driver`: settings, store, backend, guards), the controller and node
//! operations, and housekeeping (what no CO call will come back for). Each
//! operation takes the decoded request and returns the reply or a
//! `CsiError`; `grpc` only wires them to tonic.
//!
//! May import: `csi`, `domain`, `rt`, `os`, `store`, `k8s`, `backends`.

pub mod controller;
pub mod driver;
pub mod housekeeping;
pub mod node;
pub mod pre_copy;
