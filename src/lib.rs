//! csi-relay: a CSI driver that relays volume operations to a member
//! cluster's storage; standalone it serves volumes from an embedded local
//! backend. See README.md for the big picture.

pub mod authority_filter;
pub mod backend;
pub mod backoff;
pub mod capability;
pub mod config;
pub mod controller;
pub mod csi;
pub mod driver;
pub mod endpoint;
pub mod error;
pub mod group_commit;
pub mod housekeeping;
pub mod leader;
pub mod limiter;
pub mod member;
pub mod metrics_http;
pub mod mount;
pub mod node;
pub mod observe;
pub mod observer_queue;
pub mod offload;
pub mod overlay;
pub mod page_token;
pub mod params;
pub mod registrar;
pub mod server;
pub mod service;
pub mod state;
pub mod store;
pub mod unpoisoned;
pub mod validate;
pub mod volume;
pub mod wal;
