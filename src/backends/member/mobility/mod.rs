//! Volume mobility: a volume of a class whose members share no storage
//! moves with its pod. The data goes from the old member's claim to a new
//! claim in the new member through two movers (`mover`, the same binary
//! as `csi-relay mover`), with the controller between them (`pass`) over
//! an authenticated, encrypted channel (`channel`) that runs through each
//! member's API server. A pass sends only the chunks the target lacks
//! (`tree`, `wire`, `source`, `target`), so passes made while the pod
//! still runs leave the last one, after it stopped, little to send.

pub mod channel;
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
