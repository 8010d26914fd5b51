//! `--leader-election` on a real host API server: of two controllers only
//! the Lease holder serves controller calls (the other answers UNAVAILABLE
//! while its Probe stays ready), and when the leader stops the standby
//! takes over within the Lease duration. Skipped unless
//! RELAY_E2E_* are set (see member_e2e.rs).

use crate::{common, e2e_support};

use std::time::{Duration, Instant};

use common::req::snw;
use csi_relay::csi;
use tonic::Code;

async fn start(env: &e2e_support::Env, name: &str) -> common::Driver {
    e2e_support::start_member_relay(
        env,
        name,
        &[
            "--mode",
            "controller",
            "--leader-election",
            "--leader-election-namespace",
            "default",
            "--leader-election-lease-seconds",
            "10",
            "--driver-name",
            "leader.e2e.relay.csi.dev",
        ],
    )
    .await
}

/// The answer to a harmless controller call: a volume that does not exist.
async fn answer(d: &common::Driver) -> Code {
    match d
        .controller()
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: "m-e2e-00000000000000000000000000000000".into(),
        })
        .await
    {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

async fn until_code(d: &common::Driver, want: Code, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let got = answer(d).await;
        if got == want {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "expected {want:?} within {within:?}, still {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_serves_and_a_standby_takes_over() {
    let _alone = common::alone();
    let Some(env) = e2e_support::env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let host = e2e_support::client(&env.host_kubeconfig).await;
    e2e_support::install_crd(&host).await;
    let mut first = start(&env, "first").await;
    until_code(&first, Code::NotFound, Duration::from_secs(30)).await;
    let second = start(&env, "second").await;
    // The standby is alive (Probe ready) but serves no controller call.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let probe = second
        .identity()
        .probe(csi::ProbeRequest {})
        .await
        .expect("Probe")
        .into_inner();
    assert_eq!(probe.ready, Some(true));
    assert_eq!(answer(&second).await, Code::Unavailable);
    let refused = second
        .controller()
        .create_volume(common::req::create("leader-e2e", 1 << 20, snw()))
        .await
        .expect_err("a standby creates nothing");
    assert!(refused.message().contains("standing by"), "{refused:?}");
    // Capabilities are answered by anyone: sidecars ask before they elect.
    second
        .controller()
        .controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .expect("capabilities from a standby");
    first.stop_gracefully().await;
    let took = until_code(&second, Code::NotFound, Duration::from_secs(30)).await;
    // Within the 10 s Lease (a standby re-reads the Lease when it would
    // expire) plus a renewal step.
    assert!(took < Duration::from_secs(14), "takeover took {took:?}");
    eprintln!("standby took over {took:?} after the leader stopped");
}
