//! `GET /metrics` in the Prometheus text format, on `--metrics-address`.

use std::convert::Infallible;
use std::net::SocketAddr;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus::{Encoder, TextEncoder};

fn reply(req: &Request<Incoming>) -> Response<Full<Bytes>> {
    let respond = |status: StatusCode, content_type: &str, body: Vec<u8>| {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        *r.status_mut() = status;
        if let Ok(v) = content_type.parse() {
            r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
        }
        r
    };
    if req.method() != Method::GET || req.uri().path() != "/metrics" {
        return respond(
            StatusCode::NOT_FOUND,
            "text/plain",
            b"only GET /metrics is served\n".to_vec(),
        );
    }
    let Some(metrics) = crate::rt::metrics::metrics() else {
        return respond(
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            b"metrics are disabled\n".to_vec(),
        );
    };
    let encoder = TextEncoder::new();
    let mut body = Vec::new();
    match encoder.encode(&metrics.registry.gather(), &mut body) {
        Ok(()) => respond(StatusCode::OK, encoder.format_type(), body),
        Err(e) => respond(
            StatusCode::INTERNAL_SERVER_ERROR,
            "text/plain",
            format!("{e}\n").into_bytes(),
        ),
    }
}

/// Binds `addr` and serves until the task is dropped.
pub async fn serve(addr: SocketAddr) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(%addr, "serving Prometheus metrics at /metrics");
    Ok(tokio::spawn(async move {
        loop {
            let (stream, _) = match listener.accept().await {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics listener accept failed");
                    continue;
                }
            };
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(
                        |req| async move { Ok::<_, Infallible>(reply(&req)) },
                    );
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(error = %e, "metrics connection ended");
                }
            });
        }
    }))
}
