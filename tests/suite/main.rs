//! csi-relay's integration tests, in one binary: each module is one
//! concern (the controller calls, node calls on real mounts, crash and
//! restart, the real control planes). `common`, `node_support` and
//! `e2e_support` hold what they share.
//!
//! A test that needs root, a kernel feature, a tool or the e2e
//! environment says so in one way, `common::skip`: a loud `skipped: <why>`
//! line when it stops, and the count of such tests when the binary exits.
//! Tests on the shared control planes or kubelets, and the fuzz campaign,
//! take `common::alone` and run with no other test, as they did in
//! binaries of their own; the mount tests hold the same lock shared.

#[macro_use]
mod common;
mod e2e_support;
mod node_support;

mod check_cli;
mod controller;
mod crash_e2e;
mod crash_under_load;
mod deploy_kit_e2e;
mod deploy_manifests;
mod docs_commands;
mod foreign_clients;
mod fuzz_requests;
mod global_storage_e2e;
mod helm_chart;
mod helm_install_e2e;
mod host_outage_e2e;
mod housekeeping;
mod k8s_e2e;
mod kosmos_demo_e2e;
mod kosmos_e2e;
mod layering;
mod leader_e2e;
mod leader_scale_e2e;
mod least_privilege_e2e;
mod lost_member_e2e;
mod member_classes_e2e;
mod member_e2e;
mod member_provisioning_e2e;
mod member_scale_e2e;
mod mobility_block_e2e;
mod mobility_e2e;
mod monitoring;
mod node_lifecycle;
mod node_member;
mod node_restart;
mod node_safety;
mod partition_e2e;
mod releasable_e2e;
mod sanity_flows;
mod sanity_spec;
mod snapshots_in_use;
mod split_e2e;
mod upgrade_fixtures;
mod virtual_node_e2e;
