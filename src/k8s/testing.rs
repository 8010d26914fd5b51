//! A scripted Kubernetes API for unit tests (kube-rs' controller-rs
//! `fixtures.rs` pattern): the client under test talks to a
//! `tower_test::mock` service, the test answers each request in turn and
//! asserts exactly what was asked.

use std::collections::BTreeMap;
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use serde_json::{json, Value};
use tower_test::mock::{self, Handle, SendResponse};

use crate::k8s::cluster::Cluster;

pub struct MockApi {
    handle: Handle<Request<Body>, Response<Body>>,
}

/// One request the code under test made.
pub struct Call {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: String,
    /// What the client asked for back: a metadata-only listing says so here.
    pub accept: String,
    pub body: Value,
    send: SendResponse<Response<Body>>,
}

pub fn client() -> (kube::Client, MockApi) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(service, "default"), MockApi { handle })
}

pub fn member(name: &str) -> (Cluster, MockApi) {
    let (c, api) = client();
    (Cluster::member(name, c), api)
}

pub fn host() -> (Cluster, MockApi) {
    let (c, api) = client();
    (Cluster::host(c), api)
}

/// A controller (node id "ctrl") over member "east" in `dir`, its host
/// cluster, and the two clusters' mock API servers: (driver, host, member
/// API, host API).
pub fn controller(
    dir: &std::path::Path,
) -> (crate::ops::driver::Driver, Cluster, MockApi, MockApi) {
    controller_losing(dir, &[])
}

/// `controller`, with `lost` declared lost for good (`--lost-member`).
pub fn controller_losing(
    dir: &std::path::Path,
    lost: &[&str],
) -> (crate::ops::driver::Driver, Cluster, MockApi, MockApi) {
    let (east, member) = member("east");
    let (host, host_api) = host();
    let backend = crate::backends::member::backend::MemberBackend::new(
        vec![east],
        Some(host.clone()),
        "relay.csi.dev",
    )
    .with_virtual_nodes(crate::k8s::registrar::NodeSelector::default())
    .with_lost_members(lost.iter().map(|m| m.to_string()));
    // Capacity as the CO reads it: an int64.
    let config = crate::domain::settings::DriverConfig::for_tests(dir, "ctrl", i64::MAX as u64);
    let store = crate::store::Store::open(dir).expect("open the test store");
    let driver = crate::ops::driver::Driver::new(config, store, std::sync::Arc::new(backend));
    (driver, host, member, host_api)
}

fn header(headers: &http::HeaderMap, name: http::header::HeaderName) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

impl MockApi {
    pub async fn next(&mut self) -> Call {
        let (req, send) = self
            .handle
            .next_request()
            .await
            .expect("the client under test made no further request");
        let (parts, body) = req.into_parts();
        let bytes = body.collect_bytes().await.expect("request body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("a JSON request body")
        };
        Call {
            method: parts.method.to_string(),
            path: parts.uri.path().to_string(),
            query: parts.uri.query().unwrap_or_default().to_string(),
            content_type: header(&parts.headers, http::header::CONTENT_TYPE),
            accept: header(&parts.headers, http::header::ACCEPT),
            body,
            send,
        }
    }

    /// The next request, which must be `method path`.
    pub async fn expect(&mut self, method: &str, path: &str) -> Call {
        let call = self.next().await;
        assert_eq!(
            (call.method.as_str(), call.path.as_str()),
            (method, path),
            "unexpected request (query {:?}, body {})",
            call.query,
            call.body
        );
        call
    }

    /// The next page of a listing at `path`: a listing that stops after a
    /// page fails here instead of hanging.
    pub async fn expect_page(&mut self, path: &str) -> Call {
        tokio::time::timeout(Duration::from_secs(10), self.expect("GET", path))
            .await
            .expect("the listing asks for its next page")
    }

    /// Asserts the client makes no further request.
    pub async fn expect_idle(&mut self) {
        let next = tokio::time::timeout(Duration::from_secs(60), self.handle.next_request()).await;
        if let Ok(Some((req, _))) = next {
            panic!("unexpected request {} {}", req.method(), req.uri());
        }
    }

    /// Once the client is dropped: asserts it made no request left unanswered.
    pub async fn expect_done(mut self) {
        if let Some((req, _)) = self.handle.next_request().await {
            panic!("unexpected request {} {}", req.method(), req.uri());
        }
    }
}

impl Call {
    /// The query string as `key => value` (undecoded).
    pub fn query_map(&self) -> BTreeMap<String, String> {
        self.query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.to_string(), v.to_string())
            })
            .collect()
    }

    pub fn reply(self, status: u16, body: Value) {
        let response = Response::builder()
            .status(status)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Body::from(serde_json::to_vec(&body).expect("JSON")))
            .expect("response");
        self.send.send_response(response);
    }

    pub fn ok(self, body: Value) {
        self.reply(200, body)
    }

    /// 201 echoing the request body (what the API server does, give or take).
    pub fn created(self) {
        let body = self.body.clone();
        self.reply(201, body)
    }

    /// 200 echoing the request body.
    pub fn echo(self) {
        let body = self.body.clone();
        self.ok(body)
    }

    pub fn status(self, code: u16, reason: &str, message: &str) {
        self.reply(
            code,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                   "code": code, "reason": reason, "message": message}),
        )
    }

    pub fn not_found(self) {
        self.status(404, "NotFound", "not found")
    }

    pub fn already_exists(self) {
        self.status(409, "AlreadyExists", "already exists")
    }

    /// The connection fails (refused, reset, DNS...).
    pub fn refuse(self) {
        self.send.send_error(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ));
    }

    /// Never answers (keeps the request pending until the test ends).
    pub fn hang(self) -> SendResponse<Response<Body>> {
        self.send
    }
}
