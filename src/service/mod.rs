//! The gRPC services: one file each, thin adapters onto the domain modules.

pub mod controller;
pub mod group_controller;
pub mod identity;
pub mod node;
