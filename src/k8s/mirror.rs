//! The controller's RelayVolumes as the durable copy a new controller
//! rebuilds from (`relay_volume::rebuild`): the state dir in `deploy/` is an
//! `emptyDir`, lost with the pod.
//!
//! Each volume record the controller commits is applied to its RelayVolume
//! before the call goes on, so a call is acknowledged, and a member object
//! made, only once the next controller can know of it. A write that fails
//! fails the call (UNAVAILABLE): the sidecars need the host API anyway, and
//! the CO retries. The volume is then remembered as unmirrored, and the
//! next call on it writes its record again before anything else; start-up
//! finds the volumes whose RelayVolume differs from the store (a crash
//! between the two writes) and remembers them the same way.

use std::collections::HashSet;
use std::sync::Mutex;

use crate::domain::error::{CsiError, CsiResult};
use crate::domain::observers::RecordMirror;
use crate::domain::volume::{Lifecycle, Volume};
use crate::k8s::relay_volume::RelayVolumeObserver;
use crate::rt::unpoisoned::lock;

pub struct RelayMirror {
    writer: RelayVolumeObserver,
    /// Volumes whose RelayVolume may not be what the store holds.
    unmirrored: Mutex<HashSet<String>>,
    /// Volumes whose RelayVolume this process made show a failure.
    failing: Mutex<HashSet<String>>,
    /// The name of the gRPC code the CO sees for an error: the mapping is
    /// `grpc::status`'s, which this layer does not import.
    code_name: CodeName,
}

/// Names the gRPC code of an error ("NotFound").
pub type CodeName = fn(&CsiError) -> String;

/// Longest failure text shown (the API server takes far more; a person
/// reading `kubectl get` does not).
const MAX_FAILURE_TEXT: usize = 1024;

/// `<call>: <CSI code>: <message>`, cut at [`MAX_FAILURE_TEXT`] bytes (on a
/// character boundary).
/// How long a call waits to show its failure on the RelayVolume.
const FAILURE_NOTE_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);

fn failure_text(call: &str, code: &str, error: &CsiError) -> String {
    crate::k8s::shortened(format!("{call}: {code}: {error}"), MAX_FAILURE_TEXT)
}

impl RelayMirror {
    pub fn new(writer: RelayVolumeObserver, code_name: CodeName) -> Self {
        RelayMirror {
            writer,
            unmirrored: Mutex::default(),
            failing: Mutex::default(),
            code_name,
        }
    }

    /// Remembers that volume `id`'s RelayVolume may lag its record.
    pub fn mark(&self, id: &str) {
        lock(&self.unmirrored).insert(id.to_string());
    }

    async fn remove_id(&self, id: &str) -> CsiResult<()> {
        let removed = self.writer.remove_id(id).await;
        self.landed(id, removed)
    }

    fn landed(&self, id: &str, written: CsiResult<()>) -> CsiResult<()> {
        match written {
            Ok(()) => {
                lock(&self.unmirrored).remove(id);
                Ok(())
            }
            Err(e) => {
                self.mark(id);
                Err(CsiError::Unavailable(format!(
                    "volume {id:?} is recorded here, but its RelayVolume could not be written to the host cluster ({e}); \
                     a controller that lost its state would not know of it, so the call fails until the host API answers (retry)"
                )))
            }
        }
    }
}

#[async_trait::async_trait]
impl RecordMirror for RelayMirror {
    async fn put(&self, vol: &Volume) -> CsiResult<()> {
        if vol.ephemeral {
            return Ok(());
        }
        let written = self.writer.apply(vol).await.map(drop);
        self.landed(&vol.id, written)?;
        // The volume moved on: a failure shown is no longer its state.
        // A member's word shown meanwhile stays (see `shows_failure`).
        let noted = lock(&self.failing).remove(&vol.id) && !self.writer.shows_member_word(&vol.id);
        if vol.lifecycle == Lifecycle::Ready && (noted || self.writer.shows_failure(&vol.id)) {
            if let Err(e) = self.writer.apply_failure(&vol.id, None).await {
                tracing::warn!(volume_id = %vol.id, error = %e, "RelayVolume still shows the last failure");
            }
        }
        Ok(())
    }

    async fn note_failure(&self, vol: &Volume, call: &str, error: &CsiError) {
        if vol.ephemeral {
            return;
        }
        let text = failure_text(call, &(self.code_name)(error), error);
        // Best effort, and short: the call's own answer must not wait on a
        // host API that does not answer.
        let noted = tokio::time::timeout(
            FAILURE_NOTE_BUDGET,
            self.writer.apply_failure(&vol.id, Some(&text)),
        )
        .await;
        match noted {
            Ok(Ok(())) => {
                lock(&self.failing).insert(vol.id.clone());
            }
            Ok(Err(e)) => {
                tracing::warn!(volume_id = %vol.id, error = %e, "cannot show the failure on the RelayVolume")
            }
            Err(_) => {
                tracing::warn!(volume_id = %vol.id, "the host did not take the failure for the RelayVolume in time")
            }
        }
    }

    async fn remove(&self, vol: &Volume) -> CsiResult<()> {
        if vol.ephemeral {
            return Ok(());
        }
        self.remove_id(&vol.id).await
    }

    async fn release(&self, vol: &Volume, left: &str) -> CsiResult<()> {
        let released = self.writer.release(vol, left).await;
        self.landed(&vol.id, released)
    }

    async fn settle(&self, id: &str, current: Option<&Volume>) -> CsiResult<()> {
        if !lock(&self.unmirrored).contains(id) {
            return Ok(());
        }
        tracing::info!(volume_id = %id, "writing the volume's RelayVolume again before the call goes on");
        match current {
            Some(vol) => self.put(vol).await,
            None => self.remove_id(id).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_text_names_call_and_code_and_stays_short() {
        let short = failure_text("CreateVolume", "Aborted", &CsiError::Aborted("busy".into()));
        assert_eq!(short, "CreateVolume: Aborted: busy");
        // A member's long answer, multi-byte characters at the cut.
        let long = CsiError::FailedPrecondition("é".repeat(2000));
        let text = failure_text("CreateVolume", "FailedPrecondition", &long);
        assert!(
            text.len() <= MAX_FAILURE_TEXT + '…'.len_utf8(),
            "{}",
            text.len()
        );
        assert!(text.starts_with("CreateVolume: FailedPrecondition: éé"));
        assert!(text.ends_with('…'));
    }
}
