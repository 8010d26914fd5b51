//! Volume mobility: where a volume's data lives and how it gets to where
//! its pod runs, in one place.
//! - Members that reach one storage (`sharedWith`): the import of a
//!   volume into the member a pod runs in (`import`, the backend's steps in
//!   `imports`), gated access for single-writer volumes (`access`), and the
//!   fence of a lost member that comes back (`lost_member_fence`).
//! - Members that share no storage (`movableBetween`): the volume moves
//!   with its pod (`home`, `moving`). The data goes from the old member's
//!   claim to a new claim in the new member through two movers (`mover`,
//!   the same binary as `csi-relay mover`), with the controller between
//!   them (`pass`) over an authenticated, encrypted channel (`channel`)
//!   that runs through each member's API server. A pass sends only the
//!   chunks the target lacks (`tree`, `wire`, `source`, `target`), so
//!   passes made while the pod still runs leave the last one, after it
//!   stopped, little to send. Movers and pods take turns on a volume's
//!   attachments in a member (`attachments`).
//! - What Kosmos copied of a volume's claims and PVs and left when the
//!   volume goes (`kosmos_leftovers`).
//!
//! `imports` and `home` are child modules of `backend` (their methods are
//! the member backend's).

pub mod access;
pub mod attachments;
pub mod channel;
pub mod import;
pub mod kosmos_leftovers;
pub mod lost_member_fence;
pub mod mover;
pub mod mover_pod;
pub mod moving;
pub mod pass;
pub mod source;
pub mod target;
pub mod tree;
pub mod wire;

#[cfg(test)]
mod pass_tests;
