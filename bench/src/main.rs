//! Load generator: the full lifecycle a pod makes a driver go through
//! (CreateVolume, ControllerPublish, NodeStage, NodePublish and back down,
//! volumes of `--size` (1 MiB) with `--backing`: a directory, or the
//! driver's default, a block file with ext4) over the real socket, at several client counts
//! and with few and many existing volumes. It prints lifecycles/s, per-call
//! p50/p99 and the driver's RSS. It starts the `csi-relay` binary built
//! next to it on a private socket and state dir (root: it mounts).
//!
//! `cargo run --release --bin relay-bench -- [--clients 1,16,64] [--volumes 0,10000] [--lifecycles 400]`
//! `cargo run --release --bin relay-bench -- --snapshots` times snapshot and
//! clone of a 10 GiB sparse block volume holding 1 MiB of data.
//! `--endpoint SOCKET --node-id ID [--pid PID]` drives another, already
//! running CSI driver the same way, for a side-by-side comparison.
//! At the end it restarts its own csi-relay over the volumes it made and
//! prints start → Probe ready and the RSS then (and `--idle-secs` later).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use csi_relay::csi::{self, controller_client::ControllerClient, volume_capability};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

#[derive(Parser)]
#[command(about = "Measure csi-relay's full volume lifecycle over its socket")]
struct Args {
    /// Existing-volume counts to measure at.
    #[arg(long, value_delimiter = ',', default_value = "0,10000")]
    volumes: Vec<usize>,
    /// Concurrent clients to measure with.
    #[arg(long, value_delimiter = ',', default_value = "1,16,64")]
    clients: Vec<usize>,
    /// Lifecycles measured at each point (spread over the clients).
    #[arg(long, default_value_t = 400)]
    lifecycles: usize,
    /// The StorageClass parameter `backing` of the lifecycles' volumes:
    /// `directory` (what the figures in docs/behaviour.md were taken with)
    /// or `block` (a file on a loop device, ext4 made at the first stage:
    /// the driver's default). Other drivers (--endpoint) get none.
    #[arg(long, default_value = "directory")]
    backing: String,
    /// Size of the lifecycles' volumes.
    #[arg(long, default_value_t = 1 << 20)]
    size: i64,
    /// Instead: time snapshot, restore and clone of a sparse block volume.
    #[arg(long)]
    snapshots: bool,
    /// Size of the volume for --snapshots.
    #[arg(long, default_value_t = 10 << 30)]
    snapshot_volume_bytes: i64,
    /// Drive an already running CSI driver at this unix socket instead of
    /// starting csi-relay (e.g. the reference hostpath driver, side by side).
    #[arg(long)]
    endpoint: Option<PathBuf>,
    /// The node id the driver reports (ControllerPublishVolume's node_id).
    #[arg(long, default_value = "bench-node")]
    node_id: String,
    /// With --endpoint: the driver's pid, for its RSS.
    #[arg(long)]
    pid: Option<u32>,
    /// After the restart, also print the RSS once the driver has been idle
    /// this long (it releases memory after 30 s without a call).
    #[arg(long, default_value_t = 0)]
    idle_secs: u64,
}

fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map_or(0, |m| m.blocks() * 512)
}

/// Snapshot and clone of a big sparse volume with a little data: what the
/// copy costs in time and in disk.
async fn snapshots(
    c: &mut ControllerClient<Channel>,
    state: &Path,
    bytes: i64,
) -> Result<(), Box<dyn std::error::Error>> {
    use std::os::unix::fs::FileExt;
    let block = csi::VolumeCapability {
        access_type: Some(volume_capability::AccessType::Block(Default::default())),
        ..cap()
    };
    let mut req = create_req(
        "snap-src".into(),
        &Kind {
            bytes,
            backing: None,
        },
    );
    req.volume_capabilities = vec![block];
    let src = c
        .create_volume(req.clone())
        .await?
        .into_inner()
        .volume
        .ok_or("no volume")?;
    let file = state.join("volumes").join(format!("{}.img", src.volume_id));
    let f = std::fs::OpenOptions::new().write(true).open(&file)?;
    // 1 MiB of data: half at the start, half at the end.
    f.write_all_at(&[0xa5; 512 << 10], 0)?;
    f.write_all_at(&[0x5a; 512 << 10], bytes as u64 - (512 << 10))?;
    f.sync_all()?;
    println!(
        "source: {} GiB volume, {} bytes allocated",
        bytes >> 30,
        allocated(&file)
    );
    let t = Instant::now();
    let snap = c
        .create_snapshot(csi::CreateSnapshotRequest {
            source_volume_id: src.volume_id.clone(),
            name: "snap".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .snapshot
        .ok_or("no snapshot")?;
    let snap_secs = t.elapsed().as_secs_f64();
    let snap_file = state
        .join("snapshots")
        .join(format!("{}.img", snap.snapshot_id));
    println!(
        "  CreateSnapshot            {snap_secs:>8.3} s   {:>12} bytes allocated",
        allocated(&snap_file)
    );
    for (name, source) in [
        (
            "restore",
            csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: snap.snapshot_id.clone(),
                },
            ),
        ),
        (
            "clone",
            csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource {
                volume_id: src.volume_id.clone(),
            }),
        ),
    ] {
        let mut r = req.clone();
        r.name = name.into();
        r.volume_content_source = Some(csi::VolumeContentSource {
            r#type: Some(source),
        });
        let t = Instant::now();
        let v = c
            .create_volume(r)
            .await?
            .into_inner()
            .volume
            .ok_or("no volume")?;
        let secs = t.elapsed().as_secs_f64();
        let path = state.join("volumes").join(format!("{}.img", v.volume_id));
        println!(
            "  CreateVolume ({name:<7})    {secs:>8.3} s   {:>12} bytes allocated",
            allocated(&path)
        );
    }
    Ok(())
}

struct Server {
    child: Child,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Server {
    fn spawn(exe: &Path, node_id: &str, dir: &Path) -> Result<Self, String> {
        Ok(Server {
            child: start_driver(exe, node_id, dir)?,
            dir: dir.to_path_buf(),
        })
    }

    /// Stops the driver as an operator would (SIGTERM) and waits for it.
    fn stop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

fn start_driver(exe: &Path, node_id: &str, dir: &Path) -> Result<Child, String> {
    Command::new(exe)
        .args(["serve", "--node-id", node_id, "--endpoint"])
        .arg(format!("unix://{}", dir.join("csi.sock").display()))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| {
            format!(
                "starting {}: {e} (build it first: cargo build --release)",
                exe.display()
            )
        })
}

/// Restarts the driver over its state and times exec → the first Probe
/// that answers ready, polling every 100 µs (connecting included, as a
/// sidecar would).
async fn restart(
    server: &mut Server,
    exe: &Path,
    node_id: &str,
) -> Result<Duration, Box<dyn std::error::Error>> {
    server.stop();
    let socket = server.dir.join("csi.sock");
    let _ = std::fs::remove_file(&socket);
    let started = Instant::now();
    server.child = start_driver(exe, node_id, &server.dir)?;
    while started.elapsed() < Duration::from_secs(30) {
        if let Ok(ch) = try_connect(&socket).await {
            let mut id = csi::identity_client::IdentityClient::new(ch);
            if let Ok(r) = id.probe(csi::ProbeRequest {}).await {
                if r.into_inner().ready == Some(true) {
                    return Ok(started.elapsed());
                }
            }
        }
        tokio::time::sleep(Duration::from_micros(100)).await;
    }
    Err("csi-relay did not answer ready within 30 s of a restart".into())
}

fn cap() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(Default::default())),
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    }
}

/// What each lifecycle's volume is.
#[derive(Clone)]
struct Kind {
    bytes: i64,
    /// The `backing` parameter, when the driver is csi-relay.
    backing: Option<String>,
}

/// A single-node-writer volume named `name`.
fn create_req(name: String, kind: &Kind) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name,
        capacity_range: Some(csi::CapacityRange {
            required_bytes: kind.bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap()],
        parameters: kind
            .backing
            .iter()
            .map(|b| ("backing".to_string(), b.clone()))
            .collect(),
        ..Default::default()
    }
}

async fn try_connect(socket: &Path) -> Result<Channel, Box<dyn std::error::Error>> {
    let path = socket.to_path_buf();
    Ok(Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await?)
}

async fn connect(socket: &Path) -> Result<Channel, Box<dyn std::error::Error>> {
    for _ in 0..500 {
        if socket.exists() {
            if let Ok(ch) = try_connect(socket).await {
                return Ok(ch);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err("csi-relay did not start".into())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len().max(1) as u32;
    println!(
        "  {name:<26} mean {:>8.3} ms   p50 {:>8.3} ms   p99 {:>8.3} ms",
        mean.as_secs_f64() * 1e3,
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3
    );
}

/// Per-call latencies of the runs.
#[derive(Default)]
struct Samples {
    calls: Vec<(&'static str, Vec<Duration>)>,
}

impl Samples {
    fn add(&mut self, name: &'static str, d: Duration) {
        match self.calls.iter_mut().find(|(n, _)| *n == name) {
            Some((_, v)) => v.push(d),
            None => self.calls.push((name, vec![d])),
        }
    }

    fn merge(&mut self, other: Samples) {
        for (name, v) in other.calls {
            for d in v {
                self.add(name, d);
            }
        }
    }
}

/// VmRSS and VmHWM of `pid`, in KiB.
fn rss_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// One full lifecycle, as kubelet and the sidecars drive it.
async fn lifecycle(
    channel: &Channel,
    node_id: &str,
    base: &Path,
    name: &str,
    kind: &Kind,
    s: &mut Samples,
) -> BenchResult<()> {
    use csi_relay::csi::node_client::NodeClient;
    let mut c = ControllerClient::new(channel.clone());
    let mut n = NodeClient::new(channel.clone());
    let staging = base.join(name).join("staging");
    let target = base.join(name).join("target");
    std::fs::create_dir_all(&staging)?;
    let t = Instant::now();
    let vol = c
        .create_volume(create_req(name.to_string(), kind))
        .await?
        .into_inner()
        .volume
        .ok_or("no volume")?;
    s.add("CreateVolume", t.elapsed());
    let id = vol.volume_id;
    let t = Instant::now();
    let published = c
        .controller_publish_volume(csi::ControllerPublishVolumeRequest {
            volume_id: id.clone(),
            node_id: node_id.to_string(),
            volume_capability: Some(cap()),
            ..Default::default()
        })
        .await?
        .into_inner();
    s.add("ControllerPublishVolume", t.elapsed());
    let t = Instant::now();
    n.node_stage_volume(csi::NodeStageVolumeRequest {
        volume_id: id.clone(),
        publish_context: published.publish_context.clone(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(cap()),
        ..Default::default()
    })
    .await?;
    s.add("NodeStageVolume", t.elapsed());
    let t = Instant::now();
    n.node_publish_volume(csi::NodePublishVolumeRequest {
        volume_id: id.clone(),
        publish_context: published.publish_context,
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(cap()),
        ..Default::default()
    })
    .await?;
    s.add("NodePublishVolume", t.elapsed());
    let t = Instant::now();
    n.node_unpublish_volume(csi::NodeUnpublishVolumeRequest {
        volume_id: id.clone(),
        target_path: target.display().to_string(),
    })
    .await?;
    s.add("NodeUnpublishVolume", t.elapsed());
    let t = Instant::now();
    n.node_unstage_volume(csi::NodeUnstageVolumeRequest {
        volume_id: id.clone(),
        staging_target_path: staging.display().to_string(),
    })
    .await?;
    s.add("NodeUnstageVolume", t.elapsed());
    let t = Instant::now();
    c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
        volume_id: id.clone(),
        node_id: node_id.to_string(),
        ..Default::default()
    })
    .await?;
    s.add("ControllerUnpublishVolume", t.elapsed());
    let t = Instant::now();
    c.delete_volume(csi::DeleteVolumeRequest {
        volume_id: id,
        ..Default::default()
    })
    .await?;
    s.add("DeleteVolume", t.elapsed());
    let _ = std::fs::remove_dir(&staging);
    let _ = std::fs::remove_dir(base.join(name));
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let exe = std::env::current_exe()?.with_file_name("csi-relay");
    let dir = std::env::temp_dir().join(format!("relay-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (socket, mut server) = match &args.endpoint {
        Some(endpoint) => (endpoint.clone(), None),
        None => (
            dir.join("csi.sock"),
            Some(Server::spawn(&exe, &args.node_id, &dir)?),
        ),
    };
    let channel = connect(&socket).await?;
    let mut c = ControllerClient::new(channel.clone());
    if args.snapshots {
        if server.is_none() {
            return Err("--snapshots reads csi-relay's own state dir: not with --endpoint".into());
        }
        return snapshots(&mut c, &dir.join("state"), args.snapshot_volume_bytes).await;
    }
    let pid = match &server {
        Some(s) => Some(s.child.id()),
        None => args.pid,
    };
    let rss = |pid: Option<u32>| pid.map_or((0, 0), rss_kib);
    let kind = Kind {
        bytes: args.size,
        backing: server.as_ref().map(|_| args.backing.clone()),
    };
    println!("driver idle RSS: {} KiB", rss(pid).0);
    // The floor every call pays: a round trip that does no work.
    let mut n = csi_relay::csi::node_client::NodeClient::new(channel.clone());
    let mut floor = Vec::new();
    for _ in 0..500 {
        let t = Instant::now();
        n.node_get_info(csi::NodeGetInfoRequest {}).await?;
        floor.push(t.elapsed());
    }
    report("NodeGetInfo (no work)", floor);
    let mut existing = 0usize;
    let mut targets = args.volumes.clone();
    targets.sort_unstable();
    let mut run = 0;
    for target in targets {
        let started = Instant::now();
        while existing < target {
            c.create_volume(create_req(format!("fill-{existing}"), &kind))
                .await?;
            existing += 1;
        }
        if target > 0 {
            println!(
                "filled {existing} volumes in {:.1} s; RSS {} KiB",
                started.elapsed().as_secs_f64(),
                rss(pid).0
            );
        }
        for &clients in &args.clients {
            run += 1;
            let per_client = args.lifecycles.div_ceil(clients.max(1));
            let started = Instant::now();
            let mut tasks = Vec::new();
            for w in 0..clients {
                let channel = channel.clone();
                let node_id = args.node_id.clone();
                let base = dir.join(format!("r{run}-c{w}"));
                let kind = kind.clone();
                tasks.push(tokio::spawn(async move {
                    let mut samples = Samples::default();
                    for i in 0..per_client {
                        let name = format!("r{run}-c{w}-{i}");
                        lifecycle(&channel, &node_id, &base, &name, &kind, &mut samples).await?;
                    }
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(samples)
                }));
            }
            let mut all = Samples::default();
            for t in tasks {
                all.merge(t.await?.map_err(|e| e.to_string())?);
            }
            let secs = started.elapsed().as_secs_f64();
            let n = per_client * clients;
            let (rss, hwm) = rss(pid);
            println!(
                "{existing:>6} existing, {clients:>3} clients: {:>7.1} lifecycles/s ({n} in {secs:.2} s), RSS {rss} KiB (peak {hwm} KiB)",
                n as f64 / secs
            );
            for (name, samples) in all.calls {
                report(name, samples);
            }
        }
    }
    // Closed, so that the driver's graceful stop has no call to wait for.
    drop((channel, c, n));
    match server.as_mut() {
        Some(server) => {
            let ready = restart(server, &exe, &args.node_id).await?;
            let pid = Some(server.child.id());
            println!(
                "restart over {existing} volumes: start -> Probe ready {:.1} ms, RSS {} KiB",
                ready.as_secs_f64() * 1e3,
                rss(pid).0
            );
            if args.idle_secs > 0 {
                tokio::time::sleep(Duration::from_secs(args.idle_secs)).await;
                println!("after {} s idle: RSS {} KiB", args.idle_secs, rss(pid).0);
            }
        }
        // Our staging and target directories (a started server's go with it).
        None => {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    Ok(())
}
