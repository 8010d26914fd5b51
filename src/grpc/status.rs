//! The one place a `CsiError` becomes a gRPC status: the code the CSI spec
//! requires for each outcome, and a message that carries the whole cause
//! chain (errno, store error) so an operator sees the root cause without
//! turning on debug logs.

use tonic::{Code, Status};

use crate::domain::error::CsiError;

/// The gRPC code of an outcome. A trait, so that code outside `grpc`
/// that asks for a code (tests, mostly) says so with an import.
pub trait CsiCode {
    fn code(&self) -> Code;
}

impl CsiCode for CsiError {
    fn code(&self) -> Code {
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

/// The name of an outcome's code ("NotFound"), for texts that show it
/// beside the message (a RelayVolume's failure note).
pub fn code_name(err: &CsiError) -> String {
    format!("{:?}", err.code())
}

impl From<CsiError> for Status {
    fn from(err: CsiError) -> Self {
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
