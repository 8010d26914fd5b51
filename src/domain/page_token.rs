//! Opaque pagination tokens for ListVolumes and ListSnapshots: the id of the
//! last entry returned, hex-encoded behind a version tag. Anything else is a
//! token this driver never issued: ABORTED, as the spec asks.

use crate::domain::error::{CsiError, CsiResult};

const TAG: &str = "p1.";

pub fn encode(last_id: &str) -> String {
    format!("{TAG}{}", hex::encode(last_id))
}

pub fn decode(token: &str) -> CsiResult<Option<String>> {
    if token.is_empty() {
        return Ok(None);
    }
    let bad = || {
        CsiError::Aborted(format!(
            "starting_token {token:?} was not issued by this driver; restart the listing without a token"
        ))
    };
    let hex_part = token.strip_prefix(TAG).ok_or_else(bad)?;
    let bytes = hex::decode(hex_part).map_err(|_| bad())?;
    String::from_utf8(bytes).map(Some).map_err(|_| bad())
}

/// `max_entries` as a page size: 0 means "as many as you like".
pub fn page_size(max_entries: i32) -> CsiResult<usize> {
    match max_entries {
        n if n < 0 => Err(CsiError::invalid("max_entries", format!("{n} is negative"))),
        0 => Ok(usize::MAX),
        n => Ok(n as usize),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::status::CsiCode;

    #[test]
    fn round_trip_and_rejects_foreign_tokens() {
        assert_eq!(decode(&encode("vol-1")).unwrap().as_deref(), Some("vol-1"));
        assert_eq!(decode("").unwrap(), None);
        for bad in ["invalid-token", "p1.zz", "10"] {
            assert_eq!(decode(bad).unwrap_err().code(), tonic::Code::Aborted);
        }
        assert!(page_size(-1).is_err());
        assert_eq!(page_size(0).unwrap(), usize::MAX);
    }
}
