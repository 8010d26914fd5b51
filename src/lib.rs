//! csi-relay: a CSI driver that relays volume operations to a member
//! cluster's storage; standalone it serves volumes from an embedded local
//! backend. See README.md for the big picture.
//!
//! The crate is layered; a module imports only from the layers listed
//! before it (checked by `tests/suite/layering.rs`):
//!
//! | layer | holds |
//! |---|---|
//! | `csi` | the CSI protocol's types, generated from `proto/csi.proto` |
//! | `domain` | volumes, capabilities, parameters, validation, the state machine: no I/O |
//! | `rt` | runtime plumbing: blocking work off the async threads, back-off, guards, metrics |
//! | `os` | the kernel and system tools: mounts, loop devices, filesystems |
//! | `store` | the durable state store: redb, its write-ahead log, group commit |
//! | `k8s` | the Kubernetes API: clusters, RelayVolumes, the registrar, member observation |
//! | `backends` | where volume data lives: the `Backend` trait, local and member |
//! | `ops` | what each CSI call does: controller and node operations, housekeeping |
//! | `grpc` | tonic's world: the services, the CSI status mapping, the endpoint |
//! | `app` | the command line, start-up and shutdown, leader election |

pub mod csi;

pub mod domain;

pub mod rt;

pub mod os;

pub mod store;

pub mod k8s;

pub mod backends;

pub mod ops;

pub mod grpc;

pub mod app;
