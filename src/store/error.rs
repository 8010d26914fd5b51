//! What can go wrong in the state store, and how it reaches a CSI call:
//! a limit the change would pass (attachments on a node, capacity) is
//! RESOURCE_EXHAUSTED, anything else an internal store failure.

use crate::domain::error::CsiError;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("embedded store: {0}")]
    Db(#[from] redb::Error),
    #[error("record {key:?} in table {table} cannot be decoded: {source}")]
    Corrupt {
        table: &'static str,
        key: String,
        source: serde_json::Error,
    },
    #[error("record cannot be encoded: {0}")]
    Encode(serde_json::Error),
    #[error("node {node:?} already has {attached} volumes attached, the maximum is {max}")]
    AttachLimit {
        node: String,
        attached: u64,
        max: u64,
    },
    #[error("{needed} more bytes requested but only {} of {capacity} bytes are free", capacity.saturating_sub(*allocated))]
    CapacityExceeded {
        needed: u64,
        allocated: u64,
        capacity: u64,
    },
    #[error("store worker stopped: {0}")]
    Worker(String),
    #[error(
        "state directory {dir} holds store format {found}, newer than the format {known} this build of \
         csi-relay reads: it was written by a newer csi-relay. Run that version (or newer); this build \
         changed nothing in it"
    )]
    NewerFormat { dir: String, found: u64, known: u64 },
}

macro_rules! db_err {
    ($($t:ty),*) => {$(
        impl From<$t> for StoreError {
            fn from(e: $t) -> Self { StoreError::Db(e.into()) }
        }
    )*};
}
db_err!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

pub type StoreResult<T> = Result<T, StoreError>;

impl StoreError {
    /// A change refused by a limit, decided before it wrote anything.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            StoreError::AttachLimit { .. } | StoreError::CapacityExceeded { .. }
        )
    }
}

impl From<StoreError> for CsiError {
    fn from(e: StoreError) -> Self {
        if e.is_refusal() {
            CsiError::ResourceExhausted(e.to_string())
        } else {
            CsiError::Store(Box::new(e))
        }
    }
}
