//! tonic's world: the CSI services (one file each, thin adapters onto
//! `ops`), the one mapping of `CsiError` to gRPC status codes and
//! messages (`status`), per-RPC logging and metrics (`observe`), the
//! `--endpoint` value and the filter that lets clients of any language
//! reach a unix socket.
//!
//! May import: `csi`, `domain`, `rt`, `os`, `store`, `k8s`, `backends`, `ops`.

pub mod authority_filter;
pub mod controller_service;
pub mod endpoint;
pub mod group_controller_service;
pub mod identity_service;
pub mod node_service;
pub mod observe;
pub mod status;

use std::future::Future;

use tonic::{Response, Status};

use crate::domain::error::CsiResult;
use crate::ops::driver::Driver;

/// An RPC whose work commits, syncs or touches storage: observed as every
/// call is (`observe::rpc`), and run whole off the async thread
/// (`rt::offload::call`) under the same method name.
pub async fn offloaded<T, Fut>(
    method: &'static str,
    object: &str,
    driver: &Driver,
    work: impl FnOnce(Driver) -> Fut,
) -> Result<Response<T>, Status>
where
    T: Send + 'static,
    Fut: Future<Output = CsiResult<T>> + Send + 'static,
{
    crate::grpc::observe::rpc(
        method,
        object,
        crate::rt::offload::call(method, work(driver.clone())),
    )
    .await
}
