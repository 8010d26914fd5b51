//! The one error type the domain and the operations return: each variant
//! is one outcome the CSI spec names (which field is invalid, which object
//! is missing, what precondition fails). Lower layers have their own typed
//! errors (`StoreError`, `MountError`, the Kubernetes API's failures) and
//! convert into this one where they meet the operations; `grpc::status`
//! is the one place that turns it into a gRPC status code and message.

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
    /// The state store failed (its own error, with its causes, is the source).
    #[error("state store failure: {0}")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
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

    /// Any of the "does not exist" outcomes (NOT_FOUND).
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            CsiError::VolumeNotFound(_)
                | CsiError::SnapshotNotFound(_)
                | CsiError::GroupSnapshotNotFound(_)
                | CsiError::NodeNotFound(_)
                | CsiError::NotFound(_)
        )
    }

    pub fn io(op: &'static str, path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        CsiError::Io {
            op,
            path: path.as_ref().display().to_string(),
            source,
        }
    }
}
