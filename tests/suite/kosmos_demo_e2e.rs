//! The seed's demo (`member_classes_e2e`) and then global storage
//! (`global_storage_e2e`) in one Kosmos environment: `tests/kosmos/env-up.sh`
//! and `demo-up.sh` run once, `env-down.sh` once, which saves a CI run the
//! environment's start and teardown (about 70 s). Global storage adds its
//! shared storage (`shared-up.sh`) after the demo, and takes it down itself.
//!
//! Runs when the two-cluster environment is up (RELAY_E2E_*,
//! RELAY_E2E_SIDECARS) and E2E_HOME holds Kosmos, kubelets and both
//! provisioners; prints "skipped" otherwise. The global storage part also
//! needs GlusterFS (Debian's glusterfs-server, glusterfs-client) and ctr,
//! and is skipped, saying so, without them or with
//! `RELAY_GLOBAL_STORAGE=skip` (`tests/oldest-sidecars/run.sh` sets it).
//! Global storage ends with the moves between members' own storage
//! (`mobility_e2e`); `RELAY_KOSMOS_ONLY=mobility` runs those alone,
//! `RELAY_KOSMOS_ONLY=mobility-block` only its block moves.

use crate::{common, global_storage_e2e, member_classes_e2e};

use crate::e2e_support::demo_relay::Prerequisites;
use crate::e2e_support::ScriptedEnv;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_seeds_demo_then_global_storage_in_one_kosmos_environment() {
    let _alone = common::alone();
    let pre = match Prerequisites::of(&[]) {
        Ok(p) => p,
        Err(why) => {
            common::skip(&why);
            return;
        }
    };
    let kosmos = ScriptedEnv::new("kosmos", "env-down.sh", &pre.e2e_home, vec![]);
    kosmos.run("env-up.sh");
    kosmos.run("demo-up.sh");
    // RELAY_KOSMOS_ONLY=mobility: the moves alone; mobility-block: the
    // block moves alone (a developer's loops).
    if !only_mobility() {
        member_classes_e2e::run(&pre, &kosmos).await;
    }
    if std::env::var("RELAY_GLOBAL_STORAGE").as_deref() == Ok("skip") {
        common::skip("global storage: RELAY_GLOBAL_STORAGE=skip");
        return;
    }
    match Prerequisites::of(&global_storage_e2e::TOOLS) {
        Ok(pre) => global_storage_e2e::run(&pre, &kosmos).await,
        Err(why) => common::skip(&format!("global storage: {why}")),
    }
}

/// RELAY_KOSMOS_ONLY names the moves (`mobility`, `mobility-block`).
pub(crate) fn only_mobility() -> bool {
    std::env::var("RELAY_KOSMOS_ONLY").is_ok_and(|v| v.starts_with("mobility"))
}
