//! The process: the command line (`cli`), start-up and shutdown
//! (`server`), leader election, and the `/metrics` endpoint.
//!
//! May import: every other layer.

pub mod check;
pub mod cli;
pub mod leader;
pub mod metrics_http;
pub mod server;
