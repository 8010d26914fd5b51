//! The one error type the domain code returns, and the single place where each
//! failure is mapped to the gRPC status code the CSI spec requires for it.

use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum CsiError {
    #[error("{0} is required but was empty or missing")]
    Missing(&'static str),
    #[error("{field} is invalid: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("volume {0:?} does not exist")]
    VolumeNotFound(String),
    #[error("snapshot {0:?} does not exist")]
    SnapshotNotFound(String),
    #[error("volume group snapshot {0:?} does not exist")]
    GroupSnapshotNotFound(String),
    #[error("node {0:?} is not known to this driver")]
    NodeNotFound(String),
    #[error("{0}")]
    NotFound(String),
    /// The object exists but the request asks for something incompatible with it.
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    OutOfRange(String),
    #[error("{0}")]
    ResourceExhausted(String),
    /// Another operation holds the object, or a pagination token is stale.
    #[error("{0}")]
    Aborted(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Unimplemented(String),
    #[error("state store failure: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Internal(String),
}

pub type CsiResult<T> = Result<T, CsiError>;

impl CsiError {
    pub fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        CsiError::Invalid {
            field,
            reason: reason.into(),
        }
    }

    pub fn io(op: &'static str, path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        CsiError::Io {
            op,
            path: path.as_ref().display().to_string(),
            source,
        }
    }

    pub fn code(&self) -> Code {
        match self {
            CsiError::Missing(_) | CsiError::Invalid { .. } => Code::InvalidArgument,
            CsiError::VolumeNotFound(_)
            | CsiError::SnapshotNotFound(_)
            | CsiError::GroupSnapshotNotFound(_)
            | CsiError::NodeNotFound(_)
            | CsiError::NotFound(_) => Code::NotFound,
            CsiError::AlreadyExists(_) => Code::AlreadyExists,
            CsiError::FailedPrecondition(_) => Code::FailedPrecondition,
            CsiError::OutOfRange(_) => Code::OutOfRange,
            CsiError::ResourceExhausted(_) => Code::ResourceExhausted,
            CsiError::Aborted(_) => Code::Aborted,
            CsiError::Unavailable(_) => Code::Unavailable,
            CsiError::Unimplemented(_) => Code::Unimplemented,
            CsiError::Store(_) | CsiError::Io { .. } | CsiError::Internal(_) => Code::Internal,
        }
    }
}

impl From<CsiError> for Status {
    fn from(err: CsiError) -> Self {
        // The whole cause chain goes into the message so an operator sees the
        // root cause (errno, store error) without turning on debug logs.
        let mut message = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            let text = cause.to_string();
            if !message.contains(&text) {
                message.push_str(": ");
                message.push_str(&text);
            }
            source = cause.source();
        }
        Status::new(err.code(), message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_spec_table() {
        assert_eq!(CsiError::Missing("volume_id").code(), Code::InvalidArgument);
        assert_eq!(CsiError::VolumeNotFound("v".into()).code(), Code::NotFound);
        assert_eq!(CsiError::NodeNotFound("n".into()).code(), Code::NotFound);
        assert_eq!(CsiError::Aborted("busy".into()).code(), Code::Aborted);
        assert_eq!(
            CsiError::Internal("x".into()).code(),
            Code::Internal,
            "internal failures must not masquerade as client errors"
        );
    }

    #[test]
    fn status_message_names_the_field() {
        let status: Status = CsiError::Missing("volume_capabilities").into();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("volume_capabilities"));
    }

    #[test]
    fn status_message_carries_the_cause_chain() {
        let err = CsiError::io(
            "create directory",
            "/x/y",
            std::io::Error::from_raw_os_error(28),
        );
        let status: Status = err.into();
        assert!(status.message().contains("/x/y"), "{}", status.message());
        assert!(
            status.message().contains("No space left"),
            "{}",
            status.message()
        );
    }
}
