//! One operation per volume (or snapshot, or name) at a time. A second call
//! on a busy key is answered ABORTED at once, as the CSI spec asks, so the CO
//! retries with backoff; calls on other keys never wait for each other.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use crate::domain::error::CsiError;

#[derive(Clone, Default)]
pub struct Limiter {
    busy: Arc<Mutex<HashSet<String>>>,
}

/// Holds its keys until dropped, including when the RPC future is cancelled.
pub struct InFlight {
    busy: Arc<Mutex<HashSet<String>>>,
    keys: Vec<String>,
}

impl Limiter {
    /// Takes every key or none of them.
    pub fn try_acquire(&self, keys: &[String]) -> Result<InFlight, CsiError> {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(key) = keys.iter().find(|k| busy.contains(*k)) {
            return Err(CsiError::Aborted(format!(
                "an operation on {key} is already in progress; retry later"
            )));
        }
        let mut keys = keys.to_vec();
        keys.sort();
        keys.dedup();
        for k in &keys {
            busy.insert(k.clone());
        }
        Ok(InFlight {
            busy: self.busy.clone(),
            keys,
        })
    }

    pub fn in_flight(&self) -> usize {
        self.busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        for k in &self.keys {
            busy.remove(k);
        }
    }
}

pub fn volume_key(id: &str) -> String {
    format!("volume {id:?}")
}

pub fn volume_name_key(name: &str) -> String {
    format!("volume name {name:?}")
}

pub fn snapshot_key(id: &str) -> String {
    format!("snapshot {id:?}")
}

pub fn snapshot_name_key(name: &str) -> String {
    format!("snapshot name {name:?}")
}

pub fn group_key(id: &str) -> String {
    format!("group snapshot {id:?}")
}

pub fn group_name_key(name: &str) -> String {
    format!("group snapshot name {name:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::status::CsiCode;

    #[test]
    fn second_holder_is_aborted_until_the_first_drops() {
        let l = Limiter::default();
        let g = l.try_acquire(&[volume_key("a")]).unwrap();
        let err = l.try_acquire(&[volume_key("a")]).err().unwrap();
        assert_eq!(err.code(), tonic::Code::Aborted);
        let other = l.try_acquire(&[volume_key("b")]).unwrap();
        drop(g);
        assert!(l.try_acquire(&[volume_key("a")]).is_ok());
        drop(other);
        assert_eq!(l.in_flight(), 0);
    }

    #[test]
    fn all_or_nothing() {
        let l = Limiter::default();
        let _b = l.try_acquire(&[volume_key("b")]).unwrap();
        assert!(l.try_acquire(&[volume_key("a"), volume_key("b")]).is_err());
        assert_eq!(l.in_flight(), 1, "a failed acquire must not keep a key");
    }
}
