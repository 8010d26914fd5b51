//! Records as bytes, for the tables and the log alike: a volume, snapshot
//! or group snapshot as its table holds it, and a change (`Op`) as the
//! write-ahead log holds it, both JSON. An `Op`'s serde layout is the log's
//! format, which replay reads back after an upgrade: a change to it that an
//! older build would misread raises `STORE_FORMAT`. A volume write is
//! encoded once, its record serving both the table and the log
//! (`Encoded`).

use std::sync::Arc;

use serde::{de::DeserializeOwned, Serialize};

use super::error::{StoreError, StoreResult};
use crate::domain::volume::{GroupSnapshot, Snapshot, Volume};

/// One logged change: what replay applies again after a crash.
#[derive(Serialize, serde::Deserialize)]
pub(super) enum Op {
    /// Shared with the overlay and the round that plans it: a record is
    /// copied once per write, where the caller hands it over.
    PutVolume(Arc<Volume>),
    RemoveVolume(String),
    PutSnapshot(Box<Snapshot>),
    RemoveSnapshot(String),
    PutGroup(Box<GroupSnapshot>),
    RemoveGroup(String),
    /// Moves undecodable records of `table` aside.
    Quarantine {
        table: String,
        ids: Vec<String>,
    },
}

impl Op {
    /// The volume a change writes (`None`: removes), for the overlay.
    pub(super) fn pending_volume(&self) -> Option<(&str, Option<&Arc<Volume>>)> {
        match self {
            Op::PutVolume(vol) => Some((vol.id.as_str(), Some(vol))),
            Op::RemoveVolume(id) => Some((id.as_str(), None)),
            _ => None,
        }
    }
}

pub(super) fn decode<T: DeserializeOwned>(
    table: &'static str,
    key: &str,
    bytes: &[u8],
) -> StoreResult<T> {
    serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt {
        table,
        key: key.to_string(),
        source,
    })
}

pub(super) fn encode<T: Serialize>(value: &T) -> StoreResult<Vec<u8>> {
    thread_local! {
        /// Records are written here and copied out at their size: written
        /// straight into a new Vec, a record of a few hundred bytes had it
        /// grown (and copied) three or four times.
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with_borrow_mut(|buf| {
        buf.clear();
        let written = serde_json::to_writer(&mut *buf, value).map_err(StoreError::Encode);
        let out = written.map(|()| buf.to_vec());
        if buf.capacity() > SCRATCH_KEPT {
            *buf = Vec::new();
        }
        out
    })
}

/// The largest scratch buffer a thread keeps between encodings.
const SCRATCH_KEPT: usize = 64 << 10;

/// An op encoded once: a volume record as its table holds it (the log
/// wraps it as serde writes the op, straight into the round's payload), or
/// any other op as the log holds it.
pub(super) enum Encoded {
    Volume(Vec<u8>),
    Other(Vec<u8>),
}

/// What serde writes before the record of an `Op::PutVolume` (and `}` after).
const PUT_VOLUME_OPEN: &[u8] = br#"{"PutVolume":"#;

impl Encoded {
    /// Bytes `log_into` appends.
    pub(super) fn logged_len(&self) -> usize {
        match self {
            Encoded::Volume(record) => PUT_VOLUME_OPEN.len() + record.len() + 1,
            Encoded::Other(logged) => logged.len(),
        }
    }

    /// Appends the op as the log holds it.
    pub(super) fn log_into(&self, out: &mut Vec<u8>) {
        match self {
            Encoded::Volume(record) => {
                out.extend_from_slice(PUT_VOLUME_OPEN);
                out.extend_from_slice(record);
                out.push(b'}');
            }
            Encoded::Other(logged) => out.extend_from_slice(logged),
        }
    }

    /// A volume record's encoding, for its table.
    pub(super) fn record(&self) -> Option<&[u8]> {
        match self {
            Encoded::Volume(record) => Some(record),
            Encoded::Other(_) => None,
        }
    }

    pub(super) fn into_record(self) -> Option<Vec<u8>> {
        match self {
            Encoded::Volume(record) => Some(record),
            Encoded::Other(_) => None,
        }
    }
}

/// Encodes `op` for the log and, a volume record, for its table: once.
pub(super) fn encode_op(op: &Op) -> StoreResult<Encoded> {
    match op {
        Op::PutVolume(vol) => Ok(Encoded::Volume(encode(vol)?)),
        _ => Ok(Encoded::Other(encode(op)?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::volume::{sample as vol, with_attachment};
    use crate::store::limits::Limits;
    use crate::store::tables::apply_and_encode;
    use crate::store::Store;

    #[test]
    fn a_volume_encoded_once_is_logged_exactly_as_serde_writes_the_op() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let v = with_attachment(vol("a", "name-a"), "node-1");
        let op = Op::PutVolume(Arc::new(v));
        let txn = store.db.begin_write().unwrap();
        for op in [op, Op::RemoveVolume("a".into())] {
            let encoded = apply_and_encode(&txn, &op, &Limits::default()).unwrap();
            let mut logged = Vec::new();
            encoded.log_into(&mut logged);
            assert_eq!(logged, serde_json::to_vec(&op).unwrap());
            assert_eq!(encoded.logged_len(), logged.len());
        }
    }
}
