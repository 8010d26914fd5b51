//! `kube::Error` → `CsiError`, in one place. The message always names the
//! cluster and the operation, so an operator knows where to look.
//!
//! - no connection / no answer → UNAVAILABLE "member cluster X unreachable: …"
//! - 401 / 403 → FAILED_PRECONDITION naming the refused operation
//! - 429 / 5xx → UNAVAILABLE (the API server asks for a retry)
//! - 404 / 409 → left to the caller (absent, already exists), else
//!   NOT_FOUND / ABORTED
//! - anything else → INTERNAL with the API's message

use std::time::Duration;

use crate::domain::error::CsiError;

/// A failed call, before the caller decides what 404 or 409 means.
#[derive(Debug)]
pub enum Failure {
    /// The API server answered with an error status.
    Api {
        code: u16,
        reason: String,
        message: String,
    },
    /// Anything else, already mapped.
    Other(CsiError),
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

pub fn unreachable(label: &str, what: &str, detail: impl std::fmt::Display) -> CsiError {
    CsiError::Unavailable(format!("{label} unreachable: {what}: {detail}"))
}

pub fn timed_out(label: &str, what: &str, after: Duration) -> CsiError {
    unreachable(
        label,
        what,
        format!("no answer within {}s", after.as_secs_f32()),
    )
}

/// Classifies a client error of `what` against the cluster called `label`
/// ("member cluster east", "host cluster").
pub fn classify(label: &str, what: &str, err: kube::Error) -> Failure {
    match err {
        kube::Error::Api(status) => Failure::Api {
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
        | kube::Error::ProxyProtocolDisabled { .. } => {
            Failure::Other(unreachable(label, what, chain(&err)))
        }
        kube::Error::Auth(_) => Failure::Other(CsiError::FailedPrecondition(format!(
            "{label}: cannot obtain credentials for {what}: {}",
            chain(&err)
        ))),
        other => Failure::Other(CsiError::Internal(format!(
            "{label}: {what} failed: {}",
            chain(&other)
        ))),
    }
}

/// The CSI error for a failure nobody handled specially.
pub fn to_csi(label: &str, what: &str, failure: Failure) -> CsiError {
    let (code, reason, message) = match failure {
        Failure::Other(e) => return e,
        Failure::Api {
            code,
            reason,
            message,
        } => (code, reason, message),
    };
    match code {
        401 => CsiError::FailedPrecondition(format!(
            "{label} rejected csi-relay's credentials for {what}: {message}"
        )),
        403 => CsiError::FailedPrecondition(format!(
            "{label} forbids {what}: {message}; grant csi-relay's identity there this permission"
        )),
        404 => CsiError::NotFound(format!("{label}: {what}: {message}")),
        409 => CsiError::Aborted(format!("{label}: {what} conflicted: {message}; retry")),
        429 | 500 | 502 | 503 | 504 => CsiError::Unavailable(format!(
            "{label} cannot serve {what} right now ({code} {reason}): {message}"
        )),
        _ => CsiError::Internal(format!(
            "{label}: {what} failed ({code} {reason}): {message}"
        )),
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
        to_csi(
            "member cluster east",
            "get PersistentVolumeClaim a/b",
            classify("member cluster east", "get PersistentVolumeClaim a/b", err),
        )
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
        let err = timed_out("member cluster east", "list nodes", Duration::from_secs(10));
        assert_eq!(err.code(), Code::Unavailable);
        assert!(err.to_string().contains("within 10s"), "{err}");
    }
}
