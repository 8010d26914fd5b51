//! Pod-start benchmark on a real cluster: what users feel, from the apply of
//! a claim and a pod that mounts it to the pod Running. Each pod gets a
//! fresh claim. Several StorageClasses are measured in turn, wave by wave
//! (one class's wave, then the next class's), so a slow minute of the
//! machine falls on all of them alike.
//!
//! For each class and wave size it prints p50/p90/p95/max/best of apply →
//! Running and, to show where the time goes, the median time from the apply
//! to each milestone the API shows: claim Bound, pod scheduled (nodeName
//! set), VolumeAttachment attached (when the driver attaches), Running.
//! With `--metrics CLASS=URL` it also prints the mean latency of each CSI
//! call the driver served during that class's waves (csi-relay's
//! `csi_relay_rpc_duration_seconds`), to split the kubelet's wait from the
//! driver's work.
//!
//! `relay-pod-start --kubeconfig K --image IMG --class A --class B
//!  [--node NODE] [--pods 20] [--parallel 1,10] [--metrics A=http://127.0.0.1:PORT/metrics]`
//!
//! A class may be `CLASS@NODE` or `CLASS@NODE@KUBECONFIG`: its pods go to
//! that node of that cluster, so a pod on a host node using a member volume
//! can be set against the same pod run in the member itself. With
//! `--scheduler CLASS=NAME` a class's pods go through another scheduler
//! (Kosmos's own, beside the stock one).
//!
//! It creates one namespace per cluster for the run and deletes it, with
//! every claim it made, at the end; between waves it waits until the wave's claims and
//! their PVs are gone, so each wave starts from the same number of volumes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Client, Config};

type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser)]
#[command(
    about = "Time from the apply of a claim and its pod to the pod Running, per StorageClass"
)]
struct Args {
    /// Kubeconfig of the cluster the pods run in.
    #[arg(long)]
    kubeconfig: std::path::PathBuf,
    /// StorageClasses to compare, measured in turn (repeat the flag):
    /// CLASS, CLASS@NODE or CLASS@NODE@KUBECONFIG.
    #[arg(long = "class", required = true)]
    classes: Vec<String>,
    /// Image of the pods' one container; it must already be on the node
    /// (pulled with IfNotPresent), so no registry is in the figure.
    #[arg(long)]
    image: String,
    /// Node the pods are pinned to (nodeSelector kubernetes.io/hostname)
    /// when their class names none; the scheduler still runs, as
    /// WaitForFirstConsumer needs.
    #[arg(long)]
    node: Option<String>,
    /// Tolerate every taint (virtual nodes carry theirs).
    #[arg(long)]
    tolerate_all: bool,
    /// CLASS=NAME: the pods of CLASS name scheduler NAME (schedulerName),
    /// so classes meant for different schedulers (Kosmos's and the stock
    /// one) run side by side in one run. Others get the cluster's default.
    #[arg(long = "scheduler")]
    schedulers: Vec<String>,
    /// CLASS: a wave of CLASS is cleared once its PVs are Released, not
    /// gone. Kosmos's own flow copies the member PV's attacher finalizer
    /// onto the host PV, where no attacher of that driver removes it: the
    /// host PV stays Released after its member PV is deleted.
    #[arg(long = "released-ok")]
    released_ok: Vec<String>,
    /// Pods measured per class and wave size.
    #[arg(long, default_value_t = 20)]
    pods: usize,
    /// Wave sizes: how many pods are applied at once.
    #[arg(long, value_delimiter = ',', default_value = "1,10")]
    parallel: Vec<usize>,
    /// Size of each claim.
    #[arg(long, default_value = "1Gi")]
    size: String,
    /// CLASS=URL: a Prometheus endpoint of the csi-relay behind CLASS
    /// (repeat for its controller and its node plugin).
    #[arg(long = "metrics")]
    metrics: Vec<String>,
    /// Each wave starts after a pause drawn evenly from 0 to this many
    /// seconds. A kubelet starts the attach check of a pod's volume only
    /// after its next node status update (every nodeStatusUpdateFrequency,
    /// 10 s by default), and the wait between waves (detaches) follows
    /// that same beat: without the pause every wave would land at the same
    /// point of one kubelet's cycle, and two kubelets would differ by their
    /// phase, not by their drivers. 0: no pause.
    #[arg(long, default_value_t = 10.0)]
    jitter_secs: f64,
    /// Print every pod's milestones as its wave ends (seconds from the
    /// apply), to find where a slow round's time went in the logs.
    #[arg(long)]
    each: bool,
    /// How long one wave may take before the run is abandoned.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
}

/// When each milestone was first seen, by object name.
#[derive(Default)]
struct Seen {
    bound: HashMap<String, (Instant, String)>,
    scheduled: HashMap<String, Instant>,
    running: HashMap<String, Instant>,
    /// By PV name.
    attached: HashMap<String, Instant>,
}

type Shared = Arc<Mutex<Seen>>;

/// One column of the comparison: a class, the node its pods go to, and
/// the cluster (its client, the run's namespace there, what the watches saw).
struct Target {
    label: String,
    class: String,
    node: Option<String>,
    scheduler: Option<String>,
    client: Client,
    ns: String,
    seen: Shared,
}

async fn client(kubeconfig: &std::path::Path) -> Result<Client, Error> {
    let config = Config::from_custom_kubeconfig(
        Kubeconfig::read_from(kubeconfig)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    Ok(Client::try_from(config)?)
}

fn note(seen: &Shared, f: impl FnOnce(&mut Seen)) {
    if let Ok(mut s) = seen.lock() {
        f(&mut s);
    }
}

/// Watches claims and pods of the namespace and every VolumeAttachment,
/// stamping each milestone the moment the watch delivers it.
fn watch(client: &Client, ns: &str, seen: &Shared) {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let s = seen.clone();
    tokio::spawn(async move {
        let mut w = watcher(pvcs, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Ok(Some(c)) = w.try_next().await {
            let phase = c.status.as_ref().and_then(|s| s.phase.as_deref());
            let pv = c.spec.as_ref().and_then(|s| s.volume_name.clone());
            if let (Some("Bound"), Some(pv), Some(name)) = (phase, pv, c.metadata.name) {
                note(&s, |s| {
                    s.bound.entry(name).or_insert((Instant::now(), pv));
                });
            }
        }
    });
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let s = seen.clone();
    tokio::spawn(async move {
        let mut w = watcher(pods, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Ok(Some(p)) = w.try_next().await {
            let Some(name) = p.metadata.name else {
                continue;
            };
            let scheduled = p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some();
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            let now = Instant::now();
            note(&s, |s| {
                if scheduled {
                    s.scheduled.entry(name.clone()).or_insert(now);
                }
                if running {
                    s.running.entry(name).or_insert(now);
                }
            });
        }
    });
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let s = seen.clone();
    tokio::spawn(async move {
        let mut w = watcher(vas, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Ok(Some(va)) = w.try_next().await {
            let attached = va.status.as_ref().is_some_and(|s| s.attached);
            if let (true, Some(pv)) = (attached, va.spec.source.persistent_volume_name) {
                note(&s, |s| {
                    s.attached.entry(pv).or_insert_with(Instant::now);
                });
            }
        }
    });
}

fn claim(name: &str, class: &str, size: &str) -> Result<PersistentVolumeClaim, Error> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": class,
            "resources": {"requests": {"storage": size}},
        },
    }))?)
}

fn pod(t: &Target, name: &str, args: &Args) -> Result<Pod, Error> {
    let mut spec = serde_json::json!({
        "terminationGracePeriodSeconds": 0,
        "containers": [{
            "name": "c",
            "image": args.image,
            "imagePullPolicy": "IfNotPresent",
            "volumeMounts": [{"name": "data", "mountPath": "/data"}],
        }],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": name}}],
    });
    if let Some(node) = &t.node {
        spec["nodeSelector"] = serde_json::json!({"kubernetes.io/hostname": node});
    }
    if let Some(scheduler) = &t.scheduler {
        spec["schedulerName"] = serde_json::json!(scheduler);
    }
    if args.tolerate_all {
        spec["tolerations"] = serde_json::json!([{"operator": "Exists"}]);
    }
    Ok(serde_json::from_value(
        serde_json::json!({"metadata": {"name": name}, "spec": spec}),
    )?)
}

/// One pod's figures, each from its apply.
struct Sample {
    running: Duration,
    bound: Option<Duration>,
    scheduled: Option<Duration>,
    attached: Option<Duration>,
}

/// Applies `names` at once (claim, then pod, as `kubectl apply` of one
/// file does) and waits until every pod runs.
async fn wave(t: &Target, names: &[String], args: &Args) -> Result<Vec<Sample>, Error> {
    let (ns, class, seen) = (&t.ns, &t.class, &t.seen);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(t.client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), ns);
    let starts = futures::future::try_join_all(names.iter().map(|n| {
        let (pvcs, pods) = (pvcs.clone(), pods.clone());
        async move {
            let t0 = Instant::now();
            pvcs.create(&PostParams::default(), &claim(n, class, &args.size)?)
                .await?;
            pods.create(&PostParams::default(), &pod(t, n, args)?)
                .await?;
            Ok::<_, Error>(t0)
        }
    }))
    .await?;
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    loop {
        let done = seen
            .lock()
            .map(|s| names.iter().all(|n| s.running.contains_key(n)))
            .unwrap_or(false);
        if done {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "class {class}: not every pod of {names:?} ran within {} s; see kubectl -n {ns} describe pod",
                args.timeout_secs
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let s = seen.lock().map_err(|_| "watch state poisoned")?;
    Ok(names
        .iter()
        .zip(starts)
        .map(|(n, t0)| {
            let bound = s.bound.get(n);
            Sample {
                running: s.running[n] - t0,
                bound: bound.map(|(t, _)| *t - t0),
                scheduled: s.scheduled.get(n).map(|t| *t - t0),
                attached: bound
                    .and_then(|(_, pv)| s.attached.get(pv))
                    .map(|t| *t - t0),
            }
        })
        .collect())
}

/// Deletes the wave's pods and claims and waits until their attachments
/// and PVs are gone (not timed): the next wave starts from the same place.
async fn clear(t: &Target, names: &[String], args: &Args) -> Result<(), Error> {
    let released_ok = args.released_ok.contains(&t.class);
    let (ns, seen) = (&t.ns, &t.seen);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(t.client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(t.client.clone(), ns);
    let pvs: Api<PersistentVolume> = Api::all(t.client.clone());
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    for n in names {
        pods.delete(n, &now).await?;
        pvcs.delete(n, &DeleteParams::default()).await?;
    }
    let volumes: Vec<String> = seen
        .lock()
        .map(|s| {
            names
                .iter()
                .filter_map(|n| s.bound.get(n).map(|(_, pv)| pv.clone()))
                .collect()
        })
        .unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(300);
    for n in names {
        while pods.get_opt(n).await?.is_some() || pvcs.get_opt(n).await?.is_some() {
            if Instant::now() > deadline {
                return Err(format!("pod or claim {ns}/{n} still there after 300 s").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // The kubelet unmounts after the pod object is gone; the detach and the
    // PV's deletion come after that, so both gone means the node is clear.
    let vas: Api<VolumeAttachment> = Api::all(t.client.clone());
    loop {
        let left = vas
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .any(|va| {
                va.spec
                    .source
                    .persistent_volume_name
                    .is_some_and(|pv| volumes.contains(&pv))
            });
        if !left {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("attachments of {volumes:?} still there after 300 s").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for pv in &volumes {
        while let Some(left) = pvs.get_opt(pv).await? {
            let phase = left.status.and_then(|s| s.phase);
            if released_ok && phase.as_deref() == Some("Released") {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("PV {pv} still there after 300 s (its claim is gone)").into());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// Sleeps for a time drawn evenly from [0, max_secs): the clock's
/// nanoseconds are random enough to spread waves over a kubelet's cycle.
async fn pause(max_secs: f64) {
    if max_secs <= 0.0 {
        return;
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let fraction = f64::from(nanos % 1_000_000) / 1_000_000.0;
    tokio::time::sleep(Duration::from_secs_f64(max_secs * fraction)).await;
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn median(v: impl Iterator<Item = Duration>) -> Option<Duration> {
    let mut v: Vec<Duration> = v.collect();
    v.sort();
    (!v.is_empty()).then(|| percentile(&v, 0.5))
}

fn secs(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".to_string(), |d| format!("{:.2}", d.as_secs_f64()))
}

/// Sum and count of `csi_relay_rpc_duration_seconds` by method, over the
/// endpoints of one class's driver (a controller's and a node plugin's).
async fn rpc_figures(urls: &[String]) -> Result<BTreeMap<String, (f64, f64)>, Error> {
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for url in urls {
        add_rpc_figures(&scrape(url).await?, &mut out);
    }
    Ok(out)
}

fn add_rpc_figures(body: &str, out: &mut BTreeMap<String, (f64, f64)>) {
    for line in body.lines() {
        let (sum, rest) = if let Some(r) = line.strip_prefix("csi_relay_rpc_duration_seconds_sum{")
        {
            (true, r)
        } else if let Some(r) = line.strip_prefix("csi_relay_rpc_duration_seconds_count{") {
            (false, r)
        } else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Some(method) = labels
            .split(',')
            .find_map(|l| l.strip_prefix("method=\""))
            .and_then(|m| m.strip_suffix('"'))
        else {
            continue;
        };
        let v: f64 = value.trim().parse().unwrap_or(0.0);
        let e = out.entry(method.to_string()).or_default();
        if sum {
            e.0 += v;
        } else {
            e.1 += v;
        }
    }
}

/// A plain HTTP/1.0 GET of a loopback metrics endpoint.
async fn scrape(url: &str) -> Result<String, Error> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("metrics URL {url:?} must start with http://"))?;
    let (host, path) = rest.split_once('/').unwrap_or((rest, "metrics"));
    let mut conn =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(host))
            .await
            .map_err(|_| format!("metrics {url}: no connection within 5 s"))??;
    conn.write_all(format!("GET /{path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await?;
    let mut body = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut body))
        .await
        .map_err(|_| format!("metrics {url}: no full answer within 10 s"))??;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = Args::parse();
    let mut metrics: HashMap<String, Vec<String>> = HashMap::new();
    for m in &args.metrics {
        let (class, url) = m
            .split_once('=')
            .ok_or_else(|| format!("--metrics {m:?}: expected CLASS=URL"))?;
        metrics
            .entry(class.to_string())
            .or_default()
            .push(url.to_string());
    }
    let mut schedulers: HashMap<String, String> = HashMap::new();
    for m in &args.schedulers {
        let (class, name) = m
            .split_once('=')
            .ok_or_else(|| format!("--scheduler {m:?}: expected CLASS=NAME"))?;
        schedulers.insert(class.to_string(), name.to_string());
    }
    let ns = format!("pod-start-{}", std::process::id());
    let mut clusters: BTreeMap<std::path::PathBuf, (Client, Shared)> = BTreeMap::new();
    let mut targets = Vec::new();
    for spec in &args.classes {
        let mut parts = spec.splitn(3, '@');
        let class = parts.next().unwrap_or_default().to_string();
        let node = parts
            .next()
            .map(str::to_string)
            .or_else(|| args.node.clone());
        let kubeconfig = parts
            .next()
            .map_or_else(|| args.kubeconfig.clone(), Into::into);
        if !clusters.contains_key(&kubeconfig) {
            let c = client(&kubeconfig).await?;
            let namespaces: Api<Namespace> = Api::all(c.clone());
            namespaces
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?,
                )
                .await?;
            let seen: Shared = Arc::default();
            watch(&c, &ns, &seen);
            clusters.insert(kubeconfig.clone(), (c, seen));
        }
        let (c, seen) = &clusters[&kubeconfig];
        let class_at_node = spec.split('@').take(2).collect::<Vec<_>>().join("@");
        targets.push(Target {
            label: match schedulers.get(&class) {
                Some(s) => format!("{class_at_node} [{s}]"),
                None => class_at_node,
            },
            scheduler: schedulers.get(&class).cloned(),
            class,
            node,
            client: c.clone(),
            ns: ns.clone(),
            seen: seen.clone(),
        });
    }
    let result = run(&targets, &args, &metrics).await;
    for (c, _) in clusters.values() {
        let _ = Api::<Namespace>::all(c.clone())
            .delete(&ns, &DeleteParams::default())
            .await;
    }
    result
}

async fn run(
    targets: &[Target],
    args: &Args,
    metrics: &HashMap<String, Vec<String>>,
) -> Result<(), Error> {
    let mut serial = 0usize;
    for &width in &args.parallel {
        let width = width.clamp(1, args.pods.max(1));
        let mut samples: BTreeMap<&str, Vec<Sample>> = BTreeMap::new();
        let mut calls: BTreeMap<&str, BTreeMap<String, (f64, f64)>> = BTreeMap::new();
        let waves = args.pods.div_ceil(width);
        for w in 0..waves {
            let count = width.min(args.pods - w * width);
            for t in targets {
                let class = t.label.as_str();
                let names: Vec<String> = (0..count)
                    .map(|_| {
                        serial += 1;
                        format!("p{serial}")
                    })
                    .collect();
                let before = match metrics.get(&t.class) {
                    Some(url) => Some(rpc_figures(url).await?),
                    None => None,
                };
                pause(args.jitter_secs).await;
                let got = wave(t, &names, args).await?;
                if args.each {
                    for (name, s) in names.iter().zip(&got) {
                        println!(
                            "  sample {class} {name} at {}: bound {} scheduled {} attached {} running {}",
                            k8s_openapi::jiff::Timestamp::now(),
                            secs(s.bound),
                            secs(s.scheduled),
                            secs(s.attached),
                            secs(Some(s.running)),
                        );
                    }
                }
                if let (Some(url), Some(before)) = (metrics.get(&t.class), before) {
                    let acc = calls.entry(class).or_default();
                    for (m, (s, c)) in rpc_figures(url).await? {
                        let (s0, c0) = before.get(&m).copied().unwrap_or_default();
                        let e = acc.entry(m).or_default();
                        e.0 += s - s0;
                        e.1 += c - c0;
                    }
                }
                samples.entry(class).or_default().extend(got);
                clear(t, &names, args).await?;
            }
        }
        println!(
            "\n{} pods per class, {width} at once (seconds from the apply)",
            args.pods
        );
        println!(
            "  {:<50} {:>6} {:>6} {:>6} {:>6} {:>6}   median to: {:>6} {:>9} {:>8} {:>7}",
            "class",
            "p50",
            "p90",
            "p95",
            "max",
            "best",
            "bound",
            "scheduled",
            "attached",
            "running"
        );
        for (class, v) in &samples {
            let mut running: Vec<Duration> = v.iter().map(|s| s.running).collect();
            running.sort();
            println!(
                "  {:<50} {:>6} {:>6} {:>6} {:>6} {:>6}   {:>17} {:>9} {:>8} {:>7}",
                class,
                secs(Some(percentile(&running, 0.5))),
                secs(Some(percentile(&running, 0.9))),
                secs(Some(percentile(&running, 0.95))),
                secs(running.last().copied()),
                secs(running.first().copied()),
                secs(median(v.iter().filter_map(|s| s.bound))),
                secs(median(v.iter().filter_map(|s| s.scheduled))),
                secs(median(v.iter().filter_map(|s| s.attached))),
                secs(median(v.iter().map(|s| s.running))),
            );
        }
        for (class, m) in &calls {
            let line: Vec<String> = m
                .iter()
                .filter(|(_, (_, c))| *c > 0.0)
                .map(|(name, (s, c))| format!("{name} {c:.0}× {:.1} ms", s / c * 1e3))
                .collect();
            println!("  {class} driver calls (count, mean): {}", line.join(", "));
        }
    }
    Ok(())
}
