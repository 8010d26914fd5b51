//! Runtime plumbing: blocking work leaves the async threads bounded in
//! number and time (`offload`, `bounded`), retries back off, one call per
//! volume at a time (`limiter`), observers are fed from a queue, and the
//! Prometheus counters live here. The write `fence` says until when this
//! process may change anything in a cluster; `heap` gives back what a
//! burst freed.
//!
//! May import: `csi`, `domain`.

pub mod backoff;
pub mod bounded;
pub mod fence;
pub mod heap;
pub mod limiter;
pub mod metrics;
pub mod move_stall;
pub mod observer_queue;
pub mod offload;
pub mod unpoisoned;
