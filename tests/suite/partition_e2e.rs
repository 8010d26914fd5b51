//! Partitions, on real control planes: a controller (`--mode controller`,
//! member backend) reaches the host and the member API servers through
//! fault proxies on 127.0.0.1 (`e2e_support::fault_proxy`), while a CO of 8
//! workers drives 24 member volumes through CreateVolume →
//! ControllerPublishVolume → ControllerUnpublishVolume → DeleteVolume,
//! retrying what is retryable as the sidecars do. The same load runs three
//! times: with no cut, with the member API black-holed for 45 s, and with
//! the host API black-holed for 45 s, each cut starting while member
//! claims and attachments are being made.
//!
//! Checked every time: no call outlives the sidecars' `--timeout` (60 s in
//! deploy/); the relay keeps running; every volume completes its lifecycle;
//! the member never holds two claims for one volume name (sampled every
//! 250 ms); nothing is left in the member or the host. Printed: each call's
//! worst answer time, the answers while cut, the time from the heal to the
//! first successful call and to the last volume done, beside the run with
//! no cut. Skipped unless RELAY_E2E_* are set (see member_e2e.rs).

use crate::{common, e2e_support};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::req::snw;
use csi_relay::csi;
use csi_relay::csi::controller_client::ControllerClient;
use csi_relay::k8s::relay_volume::RelayVolume;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ListParams};
use kube::Client;
use tonic::transport::Channel;
use tonic::Code;

use e2e_support::fault_proxy::{server_of, FaultProxy};
use e2e_support::{env, mapped_clusters, member_create, publish_request, volume_name_of, Env};

const VOLUMES: usize = 24;
const WORKERS: usize = 8;
const CUT: Duration = Duration::from_secs(45);
/// When the cut starts, after the load did; worker k starts its first
/// volume k × `STAGGER` in, so that some CreateVolumes meet the cut too.
const CUT_AFTER: Duration = Duration::from_secs(1);
const STAGGER: Duration = Duration::from_millis(250);
/// external-provisioner's and external-attacher's `--timeout` in deploy/.
const SIDECAR_TIMEOUT: Duration = Duration::from_secs(60);
/// The CO's pause before it repeats a retryable call.
const RETRY_PAUSE: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    None,
    Member,
    Host,
}

/// One answered call.
#[derive(Debug, Clone)]
struct Answer {
    call: &'static str,
    asked: Instant,
    answered: Instant,
    /// `None`: OK.
    code: Option<Code>,
}

#[derive(Default)]
struct Log {
    answers: Mutex<Vec<Answer>>,
    done: Mutex<Vec<Instant>>,
}

impl Log {
    fn answered(&self, answer: Answer) {
        self.answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(answer);
    }
}

/// One CSI call as the CO makes it: bounded by the sidecars' timeout,
/// repeated while retryable; every answer logged.
async fn call<T, F, Fut>(log: &Log, name: &'static str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    loop {
        let asked = Instant::now();
        let outcome = tokio::time::timeout(SIDECAR_TIMEOUT, f()).await;
        let answered = Instant::now();
        match outcome {
            Err(_) => {
                log.answered(Answer {
                    call: name,
                    asked,
                    answered,
                    code: Some(Code::DeadlineExceeded),
                });
            }
            Ok(Ok(reply)) => {
                log.answered(Answer {
                    call: name,
                    asked,
                    answered,
                    code: None,
                });
                return reply.into_inner();
            }
            Ok(Err(status)) => {
                log.answered(Answer {
                    call: name,
                    asked,
                    answered,
                    code: Some(status.code()),
                });
                assert!(
                    matches!(
                        status.code(),
                        Code::Unavailable | Code::Aborted | Code::DeadlineExceeded
                    ),
                    "{name}: an answer the CO cannot retry: {status:?}"
                );
            }
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// One volume's lifecycle, as the provisioner and the attacher drive it.
async fn lifecycle(c: ControllerClient<Channel>, env: &Env, log: &Log, name: String, node: &str) {
    let vol = call(log, "CreateVolume", || {
        let mut c = c.clone();
        let req = member_create(env, &name, 16 << 20);
        async move { c.create_volume(req).await }
    })
    .await
    .volume
    .expect("a volume");
    call(log, "ControllerPublishVolume", || {
        let mut c = c.clone();
        let req = publish_request(&vol, node, snw());
        async move { c.controller_publish_volume(req).await }
    })
    .await;
    call(log, "ControllerUnpublishVolume", || {
        let mut c = c.clone();
        let req = csi::ControllerUnpublishVolumeRequest {
            volume_id: vol.volume_id.clone(),
            node_id: node.to_string(),
            ..Default::default()
        };
        async move { c.controller_unpublish_volume(req).await }
    })
    .await;
    call(log, "DeleteVolume", || {
        let mut c = c.clone();
        let req = csi::DeleteVolumeRequest {
            volume_id: vol.volume_id.clone(),
            ..Default::default()
        };
        async move { c.delete_volume(req).await }
    })
    .await;
    log.done
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(Instant::now());
}

/// The most member claims ever seen at once for one of the run's volume
/// names, sampled until `stop`; and how many samples were taken.
async fn sample_claims(
    member: Client,
    namespace: String,
    prefix: String,
    stop: Arc<AtomicBool>,
) -> (usize, usize) {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(member, &namespace);
    let (mut most, mut samples) = (0, 0);
    while !stop.load(Ordering::SeqCst) {
        if let Ok(list) = pvcs.list(&ListParams::default()).await {
            let mut per_name: BTreeMap<String, usize> = BTreeMap::new();
            for name in list.items.iter().filter_map(volume_name_of) {
                if name.starts_with(&prefix) {
                    *per_name.entry(name.to_string()).or_default() += 1;
                }
            }
            most = most.max(per_name.values().copied().max().unwrap_or(0));
            samples += 1;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    (most, samples)
}

/// What one run measured.
struct Figures {
    cut: Cut,
    total: Duration,
    /// call → (answers, worst answer time).
    per_call: BTreeMap<&'static str, (usize, Duration)>,
    /// Answers that arrived while cut, per code.
    while_cut: BTreeMap<String, usize>,
    /// From the heal to the first OK answer, and to the last volume done
    /// (none with no cut).
    first_ok_after_heal: Option<Duration>,
    done_after_heal: Option<Duration>,
    most_claims_per_name: usize,
    claim_samples: usize,
}

impl Figures {
    fn print(&self) {
        eprintln!(
            "figures: partition {:?}: {VOLUMES} volumes, {WORKERS} workers, all done {:.1} s after the start; first OK answer {} after the heal, last volume done {} after it; at most {} member claim(s) per name ({} samples)",
            self.cut,
            self.total.as_secs_f64(),
            secs(self.first_ok_after_heal),
            secs(self.done_after_heal),
            self.most_claims_per_name,
            self.claim_samples
        );
        for (call, (n, worst)) in &self.per_call {
            eprintln!(
                "figures: partition {:?}: {call}: {n} answers, worst {:.2} s",
                self.cut,
                worst.as_secs_f64()
            );
        }
        if !self.while_cut.is_empty() {
            eprintln!(
                "figures: partition {:?}: answered while cut: {:?}",
                self.cut, self.while_cut
            );
        }
    }
}

fn secs(d: Option<Duration>) -> String {
    d.map(|d| format!("{:.1} s", d.as_secs_f64()))
        .unwrap_or_else(|| "-".into())
}

async fn run(env: &Env, host: &Client, member: &Client, node: &str, cut: Cut) -> Figures {
    let host_proxy = FaultProxy::to(&server_of(&env.host_kubeconfig)).await;
    let member_proxy = FaultProxy::to(&server_of(&env.member_kubeconfig)).await;
    let dir = tempfile::tempdir().expect("kubeconfig dir");
    let host_kc = host_proxy.kubeconfig(&env.host_kubeconfig, &dir.path().join("host"));
    let member_kc =
        member_proxy.kubeconfig(&env.relay_member_kubeconfig, &dir.path().join("member"));
    let member_arg = format!("e2e={}", member_kc.display());
    let host_arg = host_kc.display().to_string();
    let mut d = common::Driver::start_as(
        "controller",
        &[
            "--mode",
            "controller",
            "--backend",
            "member",
            "--member",
            &member_arg,
            "--host-kubeconfig",
            &host_arg,
        ],
    )
    .await;

    let prefix = format!("part-{}-{:?}-", std::process::id(), cut).to_lowercase();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample_claims(
        member.clone(),
        env.namespace.clone(),
        prefix.clone(),
        stop.clone(),
    ));

    let log = Arc::new(Log::default());
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut workers = Vec::new();
    for k in 0..WORKERS {
        let (c, log, next, prefix) = (d.controller(), log.clone(), next.clone(), prefix.clone());
        let (env, node) = (env.clone(), node.to_string());
        workers.push(tokio::spawn(async move {
            tokio::time::sleep(STAGGER * k as u32).await;
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= VOLUMES {
                    return;
                }
                lifecycle(c.clone(), &env, &log, format!("{prefix}{i}"), &node).await;
            }
        }));
    }
    // The cut and the heal; with no cut, the load alone.
    let window = match cut {
        Cut::None => None,
        Cut::Member | Cut::Host => {
            tokio::time::sleep(CUT_AFTER).await;
            let proxy = if cut == Cut::Member {
                &member_proxy
            } else {
                &host_proxy
            };
            proxy.cut();
            let cut_at = Instant::now();
            tokio::time::sleep(CUT).await;
            proxy.heal();
            Some((cut_at, Instant::now()))
        }
    };
    for w in workers {
        w.await.expect("a CO worker");
    }
    let total = start.elapsed();
    stop.store(true, Ordering::SeqCst);
    let (most_claims_per_name, claim_samples) = sampler.await.expect("the claim sampler");

    assert!(
        d.pid()
            .is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists()),
        "the relay kept running through the {cut:?} cut"
    );
    e2e_support::nothing_left_in_member(member, &env.namespace, &prefix, None).await;
    let relay: Api<RelayVolume> = Api::all(host.clone());
    let left: Vec<String> = relay
        .list(&ListParams::default())
        .await
        .expect("list RelayVolumes")
        .items
        .into_iter()
        .filter(|rv| rv.spec.volume_name.starts_with(&prefix))
        .map(|rv| rv.spec.volume_name)
        .collect();
    assert!(left.is_empty(), "RelayVolumes left after {cut:?}: {left:?}");
    d.stop_gracefully().await;

    let answers = log
        .answers
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let mut per_call: BTreeMap<&'static str, (usize, Duration)> = BTreeMap::new();
    let mut while_cut: BTreeMap<String, usize> = BTreeMap::new();
    for a in &answers {
        let took = a.answered - a.asked;
        let entry = per_call.entry(a.call).or_default();
        entry.0 += 1;
        entry.1 = entry.1.max(took);
        if window.is_some_and(|(cut_at, healed)| a.answered > cut_at && a.answered < healed) {
            let code = a.code.map(|c| format!("{c:?}")).unwrap_or("Ok".into());
            *while_cut.entry(format!("{} {code}", a.call)).or_default() += 1;
        }
    }
    let first_ok_after_heal = window.and_then(|(_, healed)| {
        answers
            .iter()
            .filter(|a| a.code.is_none() && a.answered >= healed)
            .map(|a| a.answered - healed)
            .min()
    });
    let last_done = log
        .done
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .max()
        .copied();
    let done_after_heal = window
        .zip(last_done)
        .map(|((_, healed), last)| last.saturating_duration_since(healed));
    let figures = Figures {
        cut,
        total,
        per_call,
        while_cut,
        first_ok_after_heal,
        done_after_heal,
        most_claims_per_name,
        claim_samples,
    };
    figures.print();
    for (call, (_, worst)) in &figures.per_call {
        assert!(
            *worst < SIDECAR_TIMEOUT,
            "{cut:?}: a {call} took {worst:?}, past the sidecars' --timeout"
        );
    }
    assert!(
        figures.most_claims_per_name <= 1,
        "{cut:?}: two member claims for one volume name"
    );
    figures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitions_leave_calls_bounded_and_nothing_behind() {
    let _alone = common::alone();
    let Some(env) = env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let (host, member, node) = mapped_clusters(&env).await;
    for cut in [Cut::None, Cut::Member, Cut::Host] {
        run(&env, &host, &member, &node, cut).await;
    }
}
