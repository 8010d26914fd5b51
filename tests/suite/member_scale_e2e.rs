//! What member objects cost the controller, on the real control planes: a
//! benchmark that prints figures (the controller's RSS and CPU time, read
//! from /proc) and checks that member-side states still arrive under load.
//!
//! 1. M relay volumes (CreateVolume through the relay; their member claims
//!    bind to PVs made beforehand), each used by a member pod on a node of
//!    the test's own: anonymous RSS per volume (heap and stacks: the
//!    binary's own pages vary with the code paths run), and how long until
//!    every RelayVolume shows NODE_READY.
//! 2. Start-up with M volumes: the controller restarted on its state
//!    directory, then a new one with an empty state directory, rebuilding
//!    from the RelayVolumes: time to Probe ready, and its RSS.
//! 3. One volume at a time, its member pod set Running: CPU per change and
//!    the time until that RelayVolume shows PUBLISHED.
//! 4. N member pods that use no relay volume, created then all relabelled,
//!    first in a namespace of their own, then in the relay's namespace:
//!    what they add to RSS and CPU.
//!
//! With the environment's audit logs (AUDIT=1 of tests/e2e-env), it also
//! counts csi-relay's own requests to each API server, per volume and
//! phase, by verb and resource; bench/member-scale.sh runs it that way.
//!
//! Sizes: RELAY_SCALE_VOLUMES (default 50) and RELAY_SCALE_PODS (default
//! 500); RELAY_TEST_BINARY measures another build (e.g. a release one)
//! than the test's, and RUST_LOG=info leaves out the debug log's cost.
//! Runs when RELAY_E2E_* are set (see member_e2e.rs),
//! otherwise prints "skipped".

use crate::{common, e2e_support};

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use csi_relay::k8s::relay_volume::RelayVolume;
use futures::{stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

use e2e_support::audit::{per_unit, AuditLogs, Mark};
use e2e_support::{client, env, eventually, member_create, until_ok};

/// The user agent of csi-relay's requests.
const AGENT: &str = "csi-relay/";

/// Says a figure on the real stderr (libtest captures a passing test's
/// output).
fn figure(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "figure: {line}");
}

fn size(var: &str, default: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A line of /proc/<pid>/status, in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
}

/// The controller's anonymous resident memory (KiB: its heap and stacks,
/// without the binary's pages, which vary with the code paths run) and
/// CPU time (s), from /proc.
fn sample(pid: u32) -> (u64, f64) {
    let rss = status_kib(pid, "RssAnon:");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    // Fields after the command (which may hold spaces): utime and stime
    // are the 12th and 13th.
    let rest = &stat[stat.rfind(')').expect("stat comm") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    (rss, ticks as f64 / hz)
}

/// Waits until the controller has used no CPU for two seconds (it has
/// caught up with what the member sent), then samples it.
async fn settled(pid: u32) -> (u64, f64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = sample(pid).1;
    let mut quiet = 0;
    while quiet < 4 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = sample(pid).1;
        quiet = if now == last { quiet + 1 } else { 0 };
        last = now;
    }
    sample(pid)
}

/// Waits, looking every 20 ms, until volume `id`'s RelayVolume shows
/// PUBLISHED.
async fn published(relay: &Api<RelayVolume>, id: &str) {
    let name = csi_relay::k8s::relay_volume::object_name(id);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let rv = relay.get_opt(&name).await.ok().flatten();
        if rv.as_ref().and_then(e2e_support::phase).as_deref() == Some("PUBLISHED") {
            return;
        }
        assert!(Instant::now() < deadline, "{name} never PUBLISHED");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn mib(kib: i64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

async fn in_parallel<I, F, Fut>(items: I, f: F)
where
    I: IntoIterator,
    F: Fn(I::Item) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    stream::iter(items.into_iter().map(f))
        .buffer_unordered(32)
        .collect::<Vec<()>>()
        .await;
}

/// Unrelated pods: no volume, a scheduler nobody runs (they stay Pending
/// and unbound, so nothing garbage-collects them).
async fn unrelated_pods(member: &Client, namespace: &str, n: usize, pid: u32, label: &str) {
    let pods: Api<Pod> = Api::namespaced(member.clone(), namespace);
    let (rss0, cpu0) = settled(pid).await;
    let start = Instant::now();
    in_parallel(0..n, |i| {
        let pods = pods.clone();
        async move {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": format!("unrelated-{i}"), "labels": {"unrelated": "a"}},
                "spec": {"schedulerName": "relay-bench-nobody",
                         "automountServiceAccountToken": false,
                         "containers": [{"name": "c", "image": "busybox",
                                         "command": ["sleep", "3600"],
                                         "env": [{"name": "PADDING", "value": "x".repeat(512)}]}]}
            }))
            .unwrap();
            pods.create(&PostParams::default(), &pod)
                .await
                .expect("create an unrelated pod");
        }
    })
    .await;
    let created = start.elapsed();
    let (rss1, cpu1) = settled(pid).await;
    in_parallel(0..n, |i| {
        let pods = pods.clone();
        async move {
            let patch = json!({"metadata": {"labels": {"unrelated": "b"}}});
            pods.patch(
                &format!("unrelated-{i}"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .expect("relabel an unrelated pod");
        }
    })
    .await;
    let (rss2, cpu2) = settled(pid).await;
    figure(&format!(
        "{n} unrelated pods {label}: created in {:.1} s; anonymous RSS {} -> {} -> {} after one relabel (+{}); CPU {:.2} s to create, {:.2} s to relabel (+{:.2} s)",
        created.as_secs_f64(),
        mib(rss0 as i64),
        mib(rss1 as i64),
        mib(rss2 as i64),
        mib(rss2 as i64 - rss0 as i64),
        cpu1 - cpu0,
        cpu2 - cpu1,
        cpu2 - cpu0,
    ));
    pods.delete_collection(
        &DeleteParams::default().grace_period(0),
        &ListParams::default().labels("unrelated"),
    )
    .await
    .expect("delete the unrelated pods");
}

/// Deletes every object labelled `labels`. One delete of thousands of
/// objects can outlast the API server's request timeout (it goes on
/// server-side): again until none is left.
async fn delete_all<K>(
    what: &str,
    api: &Api<K>,
    params: &DeleteParams,
    labels: &str,
    wait: Duration,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let ours = ListParams::default().labels(labels);
    eventually(what, wait, || {
        let ours = ours.clone();
        async move {
            let _ = api.delete_collection(params, &ours).await;
            let left = api.list(&ours.limit(1)).await.ok()?;
            left.items.is_empty().then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_objects_cost_what_the_relay_serves() {
    let _alone = common::alone();
    let Some(env) = env() else {
        common::skip("no clusters: set RELAY_E2E_HOST_KUBECONFIG, RELAY_E2E_MEMBER_KUBECONFIG and RELAY_E2E_MEMBER_STORAGE_CLASS");
        return;
    };
    let volumes = size("RELAY_SCALE_VOLUMES", 50);
    let unrelated = size("RELAY_SCALE_PODS", 500);
    // Waits on every volume at once: 10 minutes, and a tenth of a second
    // more per volume (the member's PV controller binds them one by one).
    let bulk_wait = Duration::from_secs(600) + Duration::from_millis(100) * volumes as u32;
    let host = client(&env.host_kubeconfig).await;
    let member = client(&env.member_kubeconfig).await;
    e2e_support::install_crd(&host).await;
    let run = format!("scale-{}", std::process::id());
    // The pods' node: one of this test's own, which the member's
    // attach/detach controller does not manage (no
    // controller-managed-attach-detach annotation), so no member
    // attachment is made for PVs that stand for no storage.
    let member_node = format!("{run}-node");
    let nodes: Api<Node> = Api::all(member.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": member_node}})).unwrap(),
        )
        .await
        .expect("create the pods' node");
    let csi_driver = env
        .member_plugin
        .as_ref()
        .map(|(d, _)| d.clone())
        .unwrap_or_else(|| "hostpath.csi.k8s.io".into());

    let mut d =
        e2e_support::start_member_relay(&env, "scale-controller", &["--mode", "controller"]).await;
    let pid = d.pid().expect("controller pid");
    // The relay's own requests, as the API servers logged them.
    let audit = AuditLogs::open();
    if let Err(why) = &audit {
        figure(&format!("API requests: not counted: {why}"));
    }
    let audit = audit.ok();
    let requests = |mark: &Option<Mark>, what: &str, per: usize| {
        if let (Some(a), Some(m)) = (&audit, mark) {
            figure(&format!(
                "API requests by csi-relay, {what}: {}",
                per_unit(&a.count_since(m, AGENT), per)
            ));
        }
    };
    let mark_create = audit.as_ref().map(AuditLogs::mark);
    let (rss_empty, _) = settled(pid).await;
    figure(&format!(
        "controller with the member backend, nothing in it: anonymous RSS {}, RSS {}",
        mib(rss_empty as i64),
        mib(status_kib(pid, "VmRSS:") as i64),
    ));

    // 1. M relay volumes, bound, each used by a pod on the member node.
    let pvs: Api<PersistentVolume> = Api::all(member.clone());
    in_parallel(0..volumes, |i| {
        let pvs = pvs.clone();
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": format!("{run}-{i}"), "labels": {"bench": run}},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "storageClassName": env.storage_class,
                     "persistentVolumeReclaimPolicy": "Retain",
                     "csi": {"driver": csi_driver, "volumeHandle": format!("{run}-{i}")}}
        }))
        .unwrap();
        async move {
            pvs.create(&PostParams::default(), &pv)
                .await
                .expect("create a PV");
        }
    })
    .await;
    let start = Instant::now();
    let created: std::sync::Mutex<Vec<csi_relay::csi::Volume>> = Default::default();
    in_parallel(0..volumes, |i| {
        let req = member_create(&env, &format!("{run}-{i}"), 1 << 30);
        let controller = d.controller();
        let created = &created;
        async move {
            let vol = until_ok("CreateVolume", || {
                let mut c = controller.clone();
                let req = req.clone();
                async move { c.create_volume(req).await }
            })
            .await
            .into_inner()
            .volume
            .expect("volume");
            created.lock().unwrap().push(vol);
        }
    })
    .await;
    let created = created.into_inner().unwrap();
    let claims: BTreeMap<String, String> = created
        .iter()
        .map(|v| {
            (
                v.volume_id.clone(),
                v.volume_context
                    .get("relay.csi.dev/member-pvc")
                    .cloned()
                    .expect("member PVC name"),
            )
        })
        .collect();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(member.clone(), &env.namespace);
    // Sets: at 10,000 volumes a scan per item would cost the test seconds
    // per look.
    let claim_names: HashSet<&String> = claims.values().collect();
    eventually("every member claim to bind", bulk_wait, || {
        let pvcs = pvcs.clone();
        let claim_names = &claim_names;
        async move {
            let bound = pvcs
                .list(&ListParams::default().labels("app.kubernetes.io/managed-by=csi-relay"))
                .await
                .ok()?
                .items
                .into_iter()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
                .filter(|c| {
                    c.metadata
                        .name
                        .as_ref()
                        .is_some_and(|n| claim_names.contains(n))
                })
                .count();
            (bound == claim_names.len()).then_some(())
        }
    })
    .await;
    let (rss_bound, _) = settled(pid).await;
    figure(&format!(
        "{volumes} relay volumes, bound, no pod yet: anonymous RSS {} (+{:.1} KiB per volume)",
        mib(rss_bound as i64),
        (rss_bound as f64 - rss_empty as f64) / volumes.max(1) as f64,
    ));
    let pods: Api<Pod> = Api::namespaced(member.clone(), &env.namespace);
    in_parallel(claims.values().enumerate(), |(i, claim)| {
        let pods = pods.clone();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("{run}-{i}"), "labels": {"bench": run}},
            "spec": {"nodeName": member_node, "automountServiceAccountToken": false,
                     "containers": [{"name": "c", "image": "busybox"}],
                     "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]}
        }))
        .unwrap();
        async move {
            pods.create(&PostParams::default(), &pod)
                .await
                .expect("create a member pod");
        }
    })
    .await;
    let relay: Api<RelayVolume> = Api::all(host.clone());
    let in_phase = |want: &'static str, ids: Vec<String>| {
        let relay = relay.clone();
        async move {
            let names: HashSet<String> = ids
                .iter()
                .map(|id| csi_relay::k8s::relay_volume::object_name(id))
                .collect();
            eventually(&format!("RelayVolumes {want}"), bulk_wait, || {
                let relay = relay.clone();
                let names = &names;
                async move {
                    let list = relay.list(&ListParams::default()).await.ok()?;
                    let n = list
                        .items
                        .iter()
                        .filter(|rv| rv.metadata.name.as_ref().is_some_and(|n| names.contains(n)))
                        .filter(|rv| e2e_support::phase(rv).as_deref() == Some(want))
                        .count();
                    (n == names.len()).then_some(())
                }
            })
            .await
        }
    };
    in_phase("NODE_READY", claims.keys().cloned().collect()).await;
    let (rss_volumes, _) = settled(pid).await;
    figure(&format!(
        "{volumes} relay volumes, bound, each with a member pod: every RelayVolume NODE_READY {:.1} s after the first create; anonymous RSS {} (+{:.1} KiB per volume), RSS {}",
        start.elapsed().as_secs_f64(),
        mib(rss_volumes as i64),
        (rss_volumes as f64 - rss_empty as f64) / volumes.max(1) as f64,
        mib(status_kib(pid, "VmRSS:") as i64),
    ));
    requests(
        &mark_create,
        "per volume from CreateVolume to NODE_READY (member claim made and bound, a member pod on it)",
        volumes,
    );

    // Start-up with that many volumes: the same controller restarted on
    // its state directory, then a new one whose state directory is empty
    // (deploy/'s emptyDir lost with its pod), which rebuilds every record
    // from the RelayVolumes before Probe says ready.
    let t = Instant::now();
    d.restart().await;
    figure(&format!(
        "restart on its state directory with {volumes} volumes: Probe ready {:.2} s after SIGTERM",
        t.elapsed().as_secs_f64()
    ));
    d.stop();
    let mark_start = audit.as_ref().map(AuditLogs::mark);
    let metrics = crate::node_support::free_addr();
    let t = Instant::now();
    let mut d = e2e_support::start_member_relay(
        &env,
        "scale-controller-rebuilt",
        &["--mode", "controller", "--metrics-address", &metrics],
    )
    .await;
    let startup = t.elapsed();
    // Its member observation is whole once it holds every claim and has
    // read every claim's PV (attachments and in-use lists need them).
    loop {
        let held =
            crate::node_support::metric(&metrics, "csi_relay_member_claims{member=\"e2e\"}").await;
        let unread = crate::node_support::metric(
            &metrics,
            "csi_relay_member_unread_volumes{member=\"e2e\"}",
        )
        .await;
        if held as usize >= volumes && unread == 0.0 {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(1800),
            "member observation incomplete: {held} claims, {unread} PVs unread"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    figure(&format!(
        "a new controller, {volumes} member claims: every claim's PV read {:.2} s after start",
        t.elapsed().as_secs_f64()
    ));
    let pid = d.pid().expect("controller pid");
    let (rss_rebuilt, _) = settled(pid).await;
    figure(&format!(
        "a new controller, empty state directory, {volumes} RelayVolumes: Probe ready {:.2} s after start; anonymous RSS {} (+{:.1} KiB per volume)",
        startup.as_secs_f64(),
        mib(rss_rebuilt as i64),
        (rss_rebuilt as f64 - rss_empty as f64) / volumes.max(1) as f64,
    ));
    requests(&mark_start, "for that start-up (in all)", 1);

    // 3. One volume's member objects change at a time.
    let changes = volumes.min(20);
    let (_, cpu0) = settled(pid).await;
    let mark_changes = audit.as_ref().map(AuditLogs::mark);
    let mut latencies = Vec::new();
    for (i, id) in claims.keys().take(changes).enumerate() {
        let t = Instant::now();
        pods.patch_status(
            &format!("{run}-{i}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .expect("member pod Running");
        published(&relay, id).await;
        latencies.push(t.elapsed().as_secs_f64());
    }
    let (_, cpu1) = settled(pid).await;
    latencies.sort_by(f64::total_cmp);
    if let Some(worst) = latencies.last() {
        figure(&format!(
            "{changes} single-volume changes among {volumes}: PUBLISHED after {:.2} s median, {worst:.2} s worst; CPU {:.1} ms per change",
            latencies[latencies.len() / 2],
            (cpu1 - cpu0) * 1000.0 / changes as f64,
        ));
    }
    requests(
        &mark_changes,
        "per change (member pod Running, RelayVolume PUBLISHED)",
        changes,
    );

    // 4. Pods the relay does not serve.
    let ns = format!("{run}-unrelated");
    let namespaces: Api<Namespace> = Api::all(member.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .expect("create a namespace");
    unrelated_pods(&member, &ns, unrelated, pid, "in a namespace of their own").await;
    unrelated_pods(
        &member,
        &env.namespace,
        unrelated,
        pid,
        "in the relay's namespace",
    )
    .await;

    // States still arrive after all that.
    let id = claims.keys().nth(changes).cloned();
    if let Some(id) = id {
        pods.patch_status(
            &format!("{run}-{changes}"),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running"}})),
        )
        .await
        .expect("member pod Running");
        published(&relay, &id).await;
    }

    // Clean up: pods (no kubelet to wait for), volumes, PVs, namespace.
    // The pods' going is counted on its own: each volume goes back to
    // CREATED, and those writes are not DeleteVolume's.
    let mark_unused = audit.as_ref().map(AuditLogs::mark);
    delete_all(
        "the member pods deleted",
        &pods,
        &DeleteParams::default().grace_period(0),
        &format!("bench={run}"),
        bulk_wait,
    )
    .await;
    in_phase("CREATED", claims.keys().cloned().collect()).await;
    requests(
        &mark_unused,
        "per member pod deleted (back to CREATED)",
        volumes,
    );
    let ids: Vec<String> = claims.keys().cloned().collect();
    let mark_delete = audit.as_ref().map(AuditLogs::mark);
    in_parallel(ids, |id| {
        let controller = d.controller();
        async move {
            until_ok("DeleteVolume", || {
                let mut c = controller.clone();
                let req = csi_relay::csi::DeleteVolumeRequest {
                    volume_id: id.clone(),
                    ..Default::default()
                };
                async move { c.delete_volume(req).await }
            })
            .await;
        }
    })
    .await;
    requests(&mark_delete, "per DeleteVolume", volumes);
    delete_all(
        "the test's PVs deleted",
        &pvs,
        &DeleteParams::default(),
        &format!("bench={run}"),
        bulk_wait,
    )
    .await;
    namespaces
        .delete(&ns, &DeleteParams::default())
        .await
        .expect("delete the namespace");
    nodes
        .delete(&member_node, &DeleteParams::default())
        .await
        .expect("delete the pods' node");
    d.stop();
}
