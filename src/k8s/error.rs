//! What a call to a Kubernetes API server can end in: `KubeError`, each
//! variant naming the cluster and the operation, so an operator knows where
//! to look. `Cluster` hands 404 and 409 to the caller where they mean
//! "absent" or "already there"; whatever is left becomes a CSI outcome in
//! one place, `From<KubeError> for CsiError`:
//!
//! - no connection / no answer → UNAVAILABLE "member cluster X unreachable: …"
//! - 401 / 403 → FAILED_PRECONDITION naming the refused operation
//! - 429 / 5xx → UNAVAILABLE (the API server asks for a retry)
//! - 404 / 409 → NOT_FOUND / ABORTED
//! - anything else → INTERNAL with the API's message

use std::time::Duration;

use crate::domain::error::CsiError;

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// No connection, or no answer within the call's time limit.
    #[error("{label} unreachable: {what}: {detail}")]
    Unreachable {
        label: String,
        what: String,
        detail: String,
    },
    /// The client could not obtain credentials (exec plugin, token file).
    #[error("{label}: cannot obtain credentials for {what}: {detail}")]
    Credentials {
        label: String,
        what: String,
        detail: String,
    },
    /// The API server answered with an error status.
    #[error("{}", api_text(label, what, *code, reason, message))]
    Api {
        label: String,
        what: String,
        code: u16,
        reason: String,
        message: String,
    },
    /// Anything else the client reports.
    #[error("{label}: {what} failed: {detail}")]
    Client {
        label: String,
        what: String,
        detail: String,
    },
}

pub type KubeResult<T> = Result<T, KubeError>;

fn api_text(label: &str, what: &str, code: u16, reason: &str, message: &str) -> String {
    match code {
        401 => format!("{label} rejected csi-relay's credentials for {what}: {message}"),
        403 => format!(
            "{label} forbids {what}: {message}; grant csi-relay's identity there this permission"
        ),
        404 => format!("{label}: {what}: {message}"),
        409 => format!("{label}: {what} conflicted: {message}; retry"),
        429 | 500 | 502 | 503 | 504 => {
            format!("{label} cannot serve {what} right now ({code} {reason}): {message}")
        }
        _ => format!("{label}: {what} failed ({code} {reason}): {message}"),
    }
}

impl KubeError {
    /// No connection, or no answer in time.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, KubeError::Unreachable { .. })
    }

    /// The API server's status code, when it answered with one.
    pub fn status(&self) -> Option<u16> {
        match self {
            KubeError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }
}

impl From<KubeError> for CsiError {
    fn from(e: KubeError) -> Self {
        let text = e.to_string();
        match e {
            KubeError::Unreachable { .. } => CsiError::Unavailable(text),
            KubeError::Credentials { .. } => CsiError::FailedPrecondition(text),
            KubeError::Client { .. } => CsiError::Internal(text),
            KubeError::Api { code, .. } => match code {
                401 | 403 => CsiError::FailedPrecondition(text),
                404 => CsiError::NotFound(text),
                409 => CsiError::Aborted(text),
                429 | 500 | 502 | 503 | 504 => CsiError::Unavailable(text),
                _ => CsiError::Internal(text),
            },
        }
    }
}

/// The error and its sources, as one line.
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

pub fn timed_out(label: &str, what: &str, after: Duration) -> KubeError {
    KubeError::Unreachable {
        label: label.to_string(),
        what: what.to_string(),
        detail: format!("no answer within {}s", after.as_secs_f32()),
    }
}

/// Classifies a client error of `what` against the cluster called `label`
/// ("member cluster east", "host cluster").
pub fn classify(label: &str, what: &str, err: kube::Error) -> KubeError {
    let (label, what) = (label.to_string(), what.to_string());
    match err {
        kube::Error::Api(status) => KubeError::Api {
            label,
            what,
            code: status.code,
            reason: status.reason.clone(),
            message: status.message.clone(),
        },
        kube::Error::HyperError(_)
        | kube::Error::Service(_)
        | kube::Error::RustlsTls(_)
        | kube::Error::TlsRequired
        | kube::Error::ReadEvents(_)
        | kube::Error::ProxyProtocolUnsupported { .. }
        | kube::Error::ProxyProtocolDisabled { .. } => KubeError::Unreachable {
            label,
            what,
            detail: chain(&err),
        },
        kube::Error::Auth(_) => KubeError::Credentials {
            label,
            what,
            detail: chain(&err),
        },
        other => KubeError::Client {
            label,
            what,
            detail: chain(&other),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::status::CsiCode;
    use tonic::Code;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            message: format!("the server says {reason}"),
            ..Default::default()
        }))
    }

    fn mapped(err: kube::Error) -> CsiError {
        classify("member cluster east", "get PersistentVolumeClaim a/b", err).into()
    }

    #[test]
    fn status_codes_map_to_csi_codes() {
        let cases = [
            (401, "Unauthorized", Code::FailedPrecondition),
            (403, "Forbidden", Code::FailedPrecondition),
            (404, "NotFound", Code::NotFound),
            (409, "Conflict", Code::Aborted),
            (422, "Invalid", Code::Internal),
            (429, "TooManyRequests", Code::Unavailable),
            (500, "InternalError", Code::Unavailable),
            (503, "ServiceUnavailable", Code::Unavailable),
        ];
        for (status, reason, code) in cases {
            let err = mapped(api(status, reason));
            assert_eq!(err.code(), code, "{status}: {err}");
            let text = err.to_string();
            assert!(text.contains("member cluster east"), "{text}");
            assert!(text.contains(&format!("says {reason}")), "{text}");
        }
    }

    /// The texts operators and tests have read since before `KubeError`
    /// existed, word for word.
    #[test]
    fn every_status_keeps_its_text() {
        let cases = [
            (401, "Unauthorized", "member cluster east rejected csi-relay's credentials for get PersistentVolumeClaim a/b: the server says Unauthorized"),
            (403, "Forbidden", "member cluster east forbids get PersistentVolumeClaim a/b: the server says Forbidden; grant csi-relay's identity there this permission"),
            (404, "NotFound", "member cluster east: get PersistentVolumeClaim a/b: the server says NotFound"),
            (409, "Conflict", "member cluster east: get PersistentVolumeClaim a/b conflicted: the server says Conflict; retry"),
            (503, "ServiceUnavailable", "member cluster east cannot serve get PersistentVolumeClaim a/b right now (503 ServiceUnavailable): the server says ServiceUnavailable"),
            (422, "Invalid", "member cluster east: get PersistentVolumeClaim a/b failed (422 Invalid): the server says Invalid"),
        ];
        for (status, reason, text) in cases {
            assert_eq!(mapped(api(status, reason)).to_string(), text);
        }
        let e: CsiError =
            timed_out("host cluster", "list nodes", Duration::from_millis(2500)).into();
        assert_eq!(
            e.to_string(),
            "host cluster unreachable: list nodes: no answer within 2.5s"
        );
    }

    #[test]
    fn forbidden_names_the_operation() {
        let err = mapped(api(403, "Forbidden"));
        assert!(
            err.to_string()
                .contains("forbids get PersistentVolumeClaim a/b"),
            "{err}"
        );
    }

    #[test]
    fn connection_failures_are_unavailable_naming_the_cluster() {
        let err = mapped(kube::Error::Service(Box::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "connection refused",
        ))));
        assert_eq!(err.code(), Code::Unavailable);
        let text = err.to_string();
        assert!(
            text.starts_with("member cluster east unreachable"),
            "{text}"
        );
        assert!(text.contains("connection refused"), "{text}");
        let err: CsiError =
            timed_out("member cluster east", "list nodes", Duration::from_secs(10)).into();
        assert_eq!(err.code(), Code::Unavailable);
        assert!(err.to_string().contains("within 10s"), "{err}");
    }
}
