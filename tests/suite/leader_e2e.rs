//! `--leader-election` on the real host and member API servers, with two
//! controllers:
//! - a standby answers Probe "not ready" on its CSI socket (the stock
//!   sidecars wait in their Probe loop and never elect themselves beside
//!   it), refuses controller calls, and answers ready on its probe
//!   endpoint (its liveness); a leader that stops gives its Lease up and
//!   the standby serves within a renewal step;
//! - a frozen leader (SIGSTOP: nothing answers, nothing is refused) is
//!   replaced after the Lease duration, and once thawed sends no write and
//!   exits;
//! - a leader cut from the host API (a proxy that holds its connections)
//!   while it still reaches the member stops writing, and exits, before its
//!   Lease can pass.
//!
//! With the environment's audit logs (AUDIT=1 of tests/e2e-env), the API
//! servers' own record of each process's writes (its user agent names its
//! pid) is checked too; without them those checks print "skipped".
//! Skipped unless RELAY_E2E_* are set (see member_e2e.rs).

use crate::{common, e2e_support};

use std::time::{Duration, Instant, SystemTime};

use csi_relay::csi;
use csi_relay::csi::controller_client::ControllerClient;
use csi_relay::k8s::relay_volume::{self, RelayVolume};
use e2e_support::audit::AuditLogs;
use e2e_support::fault_proxy::{server_of, FaultProxy};
use nix::sys::signal::Signal;
use tonic::transport::Channel;
use tonic::Code;

const DRIVER: &str = "leader.e2e.relay.csi.dev";
/// The Lease the tests run with: renewed every 2 s, writes stop 7 s after
/// the last renewal, a standby takes over 10 s after it saw it.
const LEASE: Duration = Duration::from_secs(10);
const BOUGHT: Duration = Duration::from_secs(7);

async fn start(env: &e2e_support::Env, name: &str, host_kubeconfig: &str) -> common::Driver {
    e2e_support::start_elected_relay(env, name, host_kubeconfig, DRIVER).await
}

/// The answer to a harmless controller call: a volume that does not exist.
async fn answer(c: &mut ControllerClient<Channel>) -> Code {
    match c
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: "m-e2e-00000000000000000000000000000000".into(),
        })
        .await
    {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

/// Waits for `d`'s CSI socket to serve; how long it took.
async fn until_serving(d: &common::Driver, within: Duration) -> Duration {
    let started = Instant::now();
    let channel = tokio::time::timeout(within, d.serving())
        .await
        .unwrap_or_else(|_| panic!("not serving within {within:?}"));
    let mut c = ControllerClient::new(channel);
    assert_eq!(answer(&mut c).await, Code::NotFound);
    started.elapsed()
}

/// Who holds the relay Lease: the process identity its user agent names.
async fn holder(host: &kube::Client) -> String {
    let api: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(host.clone(), "default");
    let lease = api
        .get(&csi_relay::app::leader::lease_name(DRIVER))
        .await
        .expect("the relay Lease");
    lease
        .spec
        .and_then(|s| s.holder_identity)
        .expect("a holder")
}

fn audit() -> Option<AuditLogs> {
    match AuditLogs::open() {
        Ok(a) => Some(a),
        Err(why) => {
            common::skip(&format!("audit-log checks: {why}"));
            None
        }
    }
}

fn at(t: SystemTime) -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::try_from(t).expect("a time after 1970")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_alive_not_ready_and_serves_once_the_leader_gives_up() {
    let _alone = common::alone();
    let Some(env) = e2e_support::env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let host = e2e_support::client(&env.host_kubeconfig).await;
    e2e_support::install_crd(&host).await;
    let mut first = start(&env, "first", &env.host_kubeconfig).await;
    until_serving(&first, Duration::from_secs(30)).await;
    let second = start(&env, "second", &env.host_kubeconfig).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Alive for its liveness probe (the probe endpoint)...
    let alive = second
        .identity()
        .probe(csi::ProbeRequest {})
        .await
        .expect("Probe on the probe endpoint")
        .into_inner();
    assert_eq!(alive.ready, Some(true));
    // ...not ready on its CSI socket, where the sidecars ask before they
    // elect themselves; it names itself, and answers what sidecars ask
    // before their Probe loop, and refuses the rest.
    let csi_channel = common::channel_to(&second.socket).await;
    let ready = csi::identity_client::IdentityClient::new(csi_channel.clone())
        .probe(csi::ProbeRequest {})
        .await
        .expect("Probe on the CSI socket")
        .into_inner();
    assert_eq!(
        ready.ready,
        Some(false),
        "a standby said ready to its sidecars"
    );
    csi::identity_client::IdentityClient::new(csi_channel.clone())
        .get_plugin_info(csi::GetPluginInfoRequest {})
        .await
        .expect("GetPluginInfo from a standby");
    let mut c2 = ControllerClient::new(csi_channel);
    c2.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {})
        .await
        .expect("capabilities from a standby");
    let refused = c2
        .create_volume(e2e_support::member_create(&env, "leader-e2e", 1 << 20))
        .await
        .expect_err("a standby creates nothing");
    assert_eq!(refused.code(), Code::Unavailable);
    assert!(refused.message().contains("standing by"), "{refused:?}");
    first.stop_gracefully().await;
    // Released at exit: the standby, watching the Lease, takes it at once.
    let took = until_serving(&second, Duration::from_secs(30)).await;
    assert!(took < Duration::from_secs(3), "takeover took {took:?}");
    eprintln!("standby served {took:?} after the leader stopped (it released the Lease)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_is_replaced_and_once_thawed_writes_nothing() {
    let _alone = common::alone();
    let Some(env) = e2e_support::env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let host = e2e_support::client(&env.host_kubeconfig).await;
    e2e_support::install_crd(&host).await;
    let audit = audit();
    let mut first = start(&env, "first", &env.host_kubeconfig).await;
    until_serving(&first, Duration::from_secs(30)).await;
    let first_id = holder(&host).await;
    let second = start(&env, "second", &env.host_kubeconfig).await;
    let mut c1 = ControllerClient::new(first.serving().await);
    let name = format!("leader-freeze-{}", std::process::id());
    let made = e2e_support::create_until_ok(&c1, &env, &name, 16 << 20).await;
    let mark = audit.as_ref().map(AuditLogs::mark);
    // Frozen mid-work: a call in flight when every process stops.
    let frozen_at = SystemTime::now();
    let freeze = Instant::now();
    let inflight = tokio::spawn(async move {
        let r = c1
            .create_volume(e2e_support::member_create(
                &e2e_support::env().expect("env"),
                &format!("leader-freeze-b-{}", std::process::id()),
                16 << 20,
            ))
            .await;
        r.map(|r| r.into_inner().volume.map(|v| v.volume_id))
    });
    // Let the call reach it, then stop every process of it.
    tokio::time::sleep(Duration::from_millis(30)).await;
    first.signal(Signal::SIGSTOP);
    let took = until_serving(&second, Duration::from_secs(40)).await;
    let served_after = freeze.elapsed();
    // The Lease (10 s from when the standby last saw it renewed) plus the
    // new leader's start: its rebuild from RelayVolumes.
    assert!(
        served_after >= LEASE - Duration::from_secs(2),
        "the standby led {served_after:?} after the freeze, before the Lease could expire"
    );
    assert!(
        served_after < Duration::from_secs(20),
        "failover took {served_after:?}"
    );
    let mut c2 = ControllerClient::new(second.serving().await);
    // The new leader works: the volume made before the freeze is known.
    let got = c2
        .controller_get_volume(csi::ControllerGetVolumeRequest {
            volume_id: made.volume_id.clone(),
        })
        .await;
    assert!(
        got.is_ok(),
        "the new leader does not know {}: {got:?}",
        made.volume_id
    );
    let thawed_at = SystemTime::now();
    first.signal(Signal::SIGCONT);
    let status = first.exited_within(Duration::from_secs(5)).await;
    assert!(
        status.is_some_and(|s| !s.success()),
        "the thawed old leader did not step down: {status:?}"
    );
    let _ = tokio::time::timeout(Duration::from_secs(15), inflight).await;
    if let (Some(audit), Some(mark)) = (&audit, &mark) {
        let writes = audit.writes_since(mark, &format!("({first_id})"));
        let late: Vec<_> = writes
            .iter()
            .filter(|w| w.received > at(frozen_at + Duration::from_millis(500)))
            .collect();
        assert!(
            late.is_empty(),
            "the frozen leader wrote after its freeze (thawed at {}): {late:?}",
            at(thawed_at)
        );
        eprintln!(
            "audit: {} writes by the old leader, none after its freeze",
            writes.len()
        );
    }
    eprintln!(
        "failover: standby served {served_after:?} after the freeze ({took:?} of waiting on its socket); the thawed leader exited"
    );
    let mut ids = vec![made.volume_id];
    let again = c2
        .create_volume(e2e_support::member_create(
            &env,
            &format!("leader-freeze-b-{}", std::process::id()),
            16 << 20,
        ))
        .await;
    if let Ok(r) = again {
        ids.extend(r.into_inner().volume.map(|v| v.volume_id));
    }
    for id in ids {
        e2e_support::delete_until_ok(&c2, &id).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_cut_from_the_host_stops_writing_before_its_lease_can_pass() {
    let _alone = common::alone();
    let Some(env) = e2e_support::env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let host = e2e_support::client(&env.host_kubeconfig).await;
    e2e_support::install_crd(&host).await;
    let audit = audit();
    let proxy = FaultProxy::to(&server_of(&env.host_kubeconfig)).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let via_proxy = proxy.kubeconfig(&env.host_kubeconfig, &dir.path().join("host.kubeconfig"));
    let via_proxy = via_proxy.to_str().expect("utf-8 path").to_string();
    let mut first = start(&env, "first", &via_proxy).await;
    until_serving(&first, Duration::from_secs(30)).await;
    let first_id = holder(&host).await;
    let second = start(&env, "second", &env.host_kubeconfig).await;
    let c1 = ControllerClient::new(first.serving().await);
    let name = format!("leader-cut-{}", std::process::id());
    let made = e2e_support::create_until_ok(&c1, &env, &name, 16 << 20).await;
    let mark = audit.as_ref().map(AuditLogs::mark);
    // Its last renewal was sent before this instant: it may write until
    // 7 s after, no later.
    let cut_at = SystemTime::now();
    let cut = Instant::now();
    proxy.cut();
    // Calls keep coming to it while cut, as its sidecars would send them.
    let load = {
        let (c1, env) = (c1.clone(), env.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while cut.elapsed() < LEASE {
                let mut c = c1.clone();
                let _ = tokio::time::timeout(
                    Duration::from_secs(2),
                    c.create_volume(e2e_support::member_create(
                        &env,
                        &format!("leader-cut-{}-{n}", std::process::id()),
                        16 << 20,
                    )),
                )
                .await;
                n += 1;
            }
        })
    };
    let status = first.exited_within(Duration::from_secs(15)).await;
    let exited_after = cut.elapsed();
    assert!(
        status.is_some_and(|s| !s.success()),
        "the leader cut from the host did not step down: {status:?}"
    );
    assert!(
        exited_after <= BOUGHT + Duration::from_secs(1),
        "it stepped down {exited_after:?} after the cut, later than its last renewal allowed"
    );
    let _ = load.await;
    let took = until_serving(&second, Duration::from_secs(30)).await;
    let served_after = cut.elapsed();
    eprintln!(
        "cut from the host: the leader stopped writing and exited {exited_after:?} after the cut; the standby served {served_after:?} after it ({took:?} waiting on its socket)"
    );
    if let (Some(audit), Some(mark)) = (&audit, &mark) {
        let writes = audit.writes_since(mark, &format!("({first_id})"));
        let member: Vec<_> = writes.iter().filter(|w| w.cluster == "member").collect();
        let late: Vec<_> = member
            .iter()
            .filter(|w| w.received > at(cut_at + BOUGHT))
            .collect();
        assert!(
            late.is_empty(),
            "member writes by the cut leader after its renew deadline: {late:?}"
        );
        eprintln!(
            "audit: {} member writes by the cut leader after the cut, none after {BOUGHT:?}",
            member.len()
        );
    }
    proxy.heal();
    // Writes it sent before its fence closed, held by the partition, land
    // now: RelayVolumes recorded as intents for creates that never reached
    // the member. The new leader clears what it knows; the rest goes here.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let c2 = ControllerClient::new(second.serving().await);
    let prefix = format!("leader-cut-{}", std::process::id());
    let api: kube::Api<RelayVolume> = kube::Api::all(host.clone());
    let mine = |rvs: Vec<RelayVolume>| -> Vec<RelayVolume> {
        rvs.into_iter()
            .filter(|rv| rv.spec.volume_name.starts_with(&prefix))
            .collect()
    };
    let listed = mine(
        api.list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default(),
    );
    let mut ids: Vec<String> = listed.iter().map(|rv| rv.spec.volume_id.clone()).collect();
    if !ids.contains(&made.volume_id) {
        ids.push(made.volume_id.clone());
    }
    for id in &ids {
        e2e_support::delete_until_ok(&c2, id).await;
    }
    for rv in mine(
        api.list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default(),
    ) {
        if let Some(n) = rv.metadata.name.as_deref() {
            eprintln!(
                "RelayVolume {n} ({}) outlived its DeleteVolume; removed",
                rv.spec.volume_name
            );
            let _ = api.delete(n, &Default::default()).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_refuses_a_relay_volume_write_from_an_older_leader_term() {
    let _alone = common::alone();
    let Some(env) = e2e_support::env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let host = e2e_support::client(&env.host_kubeconfig).await;
    e2e_support::install_crd(&host).await;
    let api: kube::Api<RelayVolume> = kube::Api::all(host.clone());
    let name = format!("m-e2e-{:032x}", u128::from(std::process::id()) << 32);
    let spec = |term: Option<i64>| csi_relay::k8s::relay_volume::RelayVolumeSpec {
        volume_id: name.clone(),
        volume_name: "pvc-term".into(),
        capacity_bytes: 1 << 20,
        member: None,
        member_pvc: None,
        host_pvc: None,
        record: "{}".into(),
        format_version: 1,
        leader_term: term,
    };
    let pp = kube::api::PostParams::default();
    let mut rv = api
        .create(&pp, &RelayVolume::new(&name, spec(Some(5))))
        .await
        .expect("create with term 5");
    // A deposed leader's write, delivered late: refused, with the reason.
    rv.spec = spec(Some(4));
    let refused = api.replace(&name, &pp, &rv).await;
    match &refused {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 422, "{e:?}");
            assert!(e.message.contains("no longer leads"), "{e:?}");
        }
        other => panic!("a write from term 4 over term 5 was not refused: {other:?}"),
    }
    // The same term and a newer one pass.
    for term in [5, 6] {
        rv = api.get(&name).await.expect("get");
        rv.spec = spec(Some(term));
        let written = api
            .replace(&name, &pp, &rv)
            .await
            .unwrap_or_else(|e| panic!("term {term}: {e}"));
        assert_eq!(written.spec.leader_term, Some(term));
    }

    // The status, written as the controller writes it: server-side applies
    // of several field managers, each with the term it writes under.
    let apply = |manager: &str, status: serde_json::Value, term: Option<i64>| {
        let api = api.clone();
        let name = name.clone();
        let body = relay_volume::controller_status_body(&name, status, term);
        let params = kube::api::PatchParams::apply(manager).force();
        async move {
            api.patch_status(&name, &params, &kube::api::Patch::Apply(&body))
                .await
        }
    };
    let written = apply(
        "csi-relay",
        serde_json::json!({"phase": "CREATED", "nodes": []}),
        Some(6),
    )
    .await
    .expect("status of term 6");
    assert_eq!(written.status.and_then(|s| s.leader_term), Some(6));
    // A deposed leader's LAST-ERROR, its node entries and its phase,
    // delivered late: each refused, with the reason.
    for (manager, status) in [
        (
            "csi-relay-errors",
            serde_json::json!({"lastError": "ControllerPublishVolume: UNAVAILABLE: late"}),
        ),
        (
            "csi-relay",
            serde_json::json!({"phase": "NODE_READY", "nodes": [
                {"node": "n1", "attached": true, "pending": "VOL_READY"}]}),
        ),
        (
            "csi-relay-member1",
            serde_json::json!({"nodes": [{"node": "member1/m1", "member": "member1",
                "phase": "PUBLISHED"}]}),
        ),
    ] {
        match apply(manager, status, Some(5)).await {
            Err(kube::Error::Api(e)) => {
                assert_eq!(e.code, 422, "{manager}: {e:?}");
                assert!(
                    e.message.contains("status.leaderTerm may not go back"),
                    "{e:?}"
                );
            }
            other => {
                panic!("{manager}: a status write of term 5 over term 6 was not refused: {other:?}")
            }
        }
    }
    let now = api.get(&name).await.expect("get");
    let status = now.status.expect("status");
    assert_eq!(status.phase.as_deref(), Some("CREATED"), "{status:?}");
    assert!(status.last_error.is_none(), "{status:?}");
    // The same term and a newer one pass, and a node plugin's entry, which
    // carries no term (node plugins do not lead), passes beside them.
    apply(
        "csi-relay-errors",
        serde_json::json!({"lastError": "CreateVolume: UNAVAILABLE: now"}),
        Some(6),
    )
    .await
    .expect("status of term 6 again");
    let params = kube::api::PatchParams::apply("csi-relay-node-n1").force();
    let node_entry = relay_volume::apply_body(
        &name,
        "status",
        serde_json::json!({"nodes": [{"node": "n1", "phase": "VOL_READY"}]}),
    );
    api.patch_status(&name, &params, &kube::api::Patch::Apply(&node_entry))
        .await
        .expect("a node plugin's entry");
    let written = apply(
        "csi-relay",
        serde_json::json!({"phase": "VOL_READY"}),
        Some(7),
    )
    .await
    .expect("status of term 7");
    let status = written.status.expect("status");
    assert_eq!(status.leader_term, Some(7));
    assert_eq!(
        status.last_error.as_deref(),
        Some("CreateVolume: UNAVAILABLE: now")
    );
    let _ = api.delete(&name, &Default::default()).await;
}
