//! Per-RPC logging and metrics. Only ids and codes are logged: requests
//! are never formatted wholesale, so CSI `secrets` cannot leak.

use std::future::Future;
use std::time::Instant;

use tonic::{Response, Status};

use crate::domain::error::CsiResult;
use crate::grpc::status::CsiCode;

/// Runs one RPC body: converts its error to a CSI status, logs the outcome
/// with the object it concerned, and records count and latency.
pub async fn rpc<T>(
    method: &'static str,
    object: &str,
    body: impl Future<Output = CsiResult<T>>,
) -> Result<Response<T>, Status> {
    let started = Instant::now();
    let result = body.await;
    let elapsed = started.elapsed();
    let code = match &result {
        Ok(_) => tonic::Code::Ok,
        Err(e) => e.code(),
    };
    crate::rt::metrics::rpc_done(method, &format!("{code:?}"), elapsed);
    match result {
        Ok(reply) => {
            tracing::debug!(method, object, ms = elapsed.as_millis() as u64, "ok");
            Ok(Response::new(reply))
        }
        Err(err) => {
            let status: Status = err.into();
            if matches!(code, tonic::Code::Internal | tonic::Code::Unavailable) {
                tracing::error!(method, object, code = ?code, error = %status.message(), "failed");
            } else {
                tracing::info!(method, object, code = ?code, error = %status.message(), "refused");
            }
            Err(status)
        }
    }
}
