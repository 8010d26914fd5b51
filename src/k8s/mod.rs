//! The Kubernetes API: one bounded way to call a cluster (`cluster`), its
//! errors as CSI errors (`error`), bounded waits for one object
//! (`converge`), a pod's port through its API server (`port_forward`), the names of what the relay creates
//! (`naming`), the `RelayVolume` resource and its writers (`relay_volume`,
//! `mirror`, `relay_summary`), what member clusters report of the relay's
//! volumes (`observation`) and of claims they cannot provision
//! (`member_problems`), and the virtual-node registrar.
//!
//! May import: `csi`, `domain`, `rt`, `os`, `store`.

pub mod cluster;
pub mod connect;
pub mod converge;
pub mod error;
pub mod member_problems;
pub mod member_view;
pub mod mirror;
pub mod name_set;
pub mod naming;
pub mod nodes;
pub mod observation;
pub mod port_forward;
pub mod registrar;
pub mod relay_move;
pub mod relay_summary;
pub mod relay_volume;
pub mod watched;

#[cfg(test)]
pub(crate) mod testing;

use std::time::Duration;

/// Upper bound of one Kubernetes API call (connect, send, answer).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Upper bound of a wait for a member object to converge (VolumeAttachment
/// attached or gone, VolumeSnapshot ready). Below the sidecars' default
/// 15 s RPC timeout, so the CO's retry, not its deadline, ends a long wait.
pub const WAIT_BUDGET: Duration = Duration::from_secs(8);
/// Interval between two looks at a converging object.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Server-side apply field manager of the controller.
pub const FIELD_MANAGER: &str = "csi-relay";

/// `text` cut to at most `max` bytes (on a character boundary, marked
/// with '…'): what goes into an object's field or a message someone reads
/// stays bounded whatever the source (a member's event, an error chain).
pub fn shortened(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}
