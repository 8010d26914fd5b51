//! The gRPC services: one file each, thin adapters onto the domain modules.

pub mod controller;
pub mod group_controller;
pub mod identity;
pub mod node;

use std::future::Future;

use tonic::{Response, Status};

use crate::driver::Driver;
use crate::error::CsiResult;

/// An RPC whose work commits, syncs or touches storage: observed as every
/// call is (`observe::rpc`), and run whole off the async thread
/// (`offload::call`) under the same method name.
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
    crate::observe::rpc(
        method,
        object,
        crate::offload::call(method, work(driver.clone())),
    )
    .await
}
