//! Load generator: measures what one volume lifecycle costs with few and
//! with many existing volumes, and how parallel calls scale. It starts the
//! `csi-relay` binary built next to it on a private socket and state dir.
//!
//! `cargo run --release --bin relay-bench -- [--volumes 10,10000] [--lifecycles 200] [--parallel 16]`

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use csi_relay::csi::{self, controller_client::ControllerClient, volume_capability};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

#[derive(Parser)]
#[command(about = "Measure csi-relay lifecycle cost against the number of existing volumes")]
struct Args {
    /// Existing-volume counts to measure at.
    #[arg(long, value_delimiter = ',', default_value = "10,10000")]
    volumes: Vec<usize>,
    /// Lifecycles (create, publish, unpublish, delete) measured at each count.
    #[arg(long, default_value_t = 200)]
    lifecycles: usize,
    /// Concurrent clients for the throughput run.
    #[arg(long, default_value_t = 16)]
    parallel: usize,
}

struct Server {
    child: Child,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn cap() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(volume_capability::AccessType::Mount(Default::default())),
        access_mode: Some(volume_capability::AccessMode {
            mode: volume_capability::access_mode::Mode::SingleNodeWriter as i32,
        }),
    }
}

/// A 1 MiB single-node-writer volume named `name`.
fn create_req(name: String) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name,
        capacity_range: Some(csi::CapacityRange {
            required_bytes: 1 << 20,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![cap()],
        ..Default::default()
    }
}

async fn connect(socket: &Path) -> Result<Channel, Box<dyn std::error::Error>> {
    for _ in 0..500 {
        if socket.exists() {
            let path = socket.to_path_buf();
            let ch = Endpoint::try_from("http://[::]:50051")?
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await;
            if let Ok(ch) = ch {
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

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let exe = std::env::current_exe()?.with_file_name("csi-relay");
    let dir = std::env::temp_dir().join(format!("relay-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let socket = dir.join("csi.sock");
    let child = Command::new(&exe)
        .args(["serve", "--node-id", "bench-node", "--endpoint"])
        .arg(format!("unix://{}", socket.display()))
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
        })?;
    let _server = Server {
        child,
        dir: dir.clone(),
    };
    let channel = connect(&socket).await?;
    let mut c = ControllerClient::new(channel.clone());

    let mut existing = 0usize;
    let mut targets = args.volumes.clone();
    targets.sort_unstable();
    for target in targets {
        let started = Instant::now();
        while existing < target {
            c.create_volume(create_req(format!("fill-{existing}")))
                .await?;
            existing += 1;
        }
        println!(
            "with {existing} existing volumes (filled in {:.1} s):",
            started.elapsed().as_secs_f64()
        );
        let (mut create, mut publish, mut unpublish, mut delete, mut whole) =
            (vec![], vec![], vec![], vec![], vec![]);
        for i in 0..args.lifecycles {
            let t0 = Instant::now();
            let vol = c
                .create_volume(create_req(format!("bench-{target}-{i}")))
                .await?
                .into_inner()
                .volume
                .ok_or("no volume")?;
            let t1 = Instant::now();
            c.controller_publish_volume(csi::ControllerPublishVolumeRequest {
                volume_id: vol.volume_id.clone(),
                node_id: "bench-node".into(),
                volume_capability: Some(cap()),
                ..Default::default()
            })
            .await?;
            let t2 = Instant::now();
            c.controller_unpublish_volume(csi::ControllerUnpublishVolumeRequest {
                volume_id: vol.volume_id.clone(),
                node_id: "bench-node".into(),
                ..Default::default()
            })
            .await?;
            let t3 = Instant::now();
            c.delete_volume(csi::DeleteVolumeRequest {
                volume_id: vol.volume_id,
                ..Default::default()
            })
            .await?;
            let t4 = Instant::now();
            create.push(t1 - t0);
            publish.push(t2 - t1);
            unpublish.push(t3 - t2);
            delete.push(t4 - t3);
            whole.push(t4 - t0);
        }
        report("CreateVolume", create);
        report("ControllerPublishVolume", publish);
        report("ControllerUnpublishVolume", unpublish);
        report("DeleteVolume", delete);
        report("whole lifecycle", whole);
    }

    // Throughput: independent volumes from many clients at once.
    let per_client = args.lifecycles.max(args.parallel) / args.parallel;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..args.parallel {
        let mut c = ControllerClient::new(channel.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..per_client {
                c.create_volume(create_req(format!("par-{w}-{i}"))).await?;
            }
            Ok::<_, tonic::Status>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let n = per_client * args.parallel;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "parallel: {n} CreateVolume from {} clients in {secs:.2} s = {:.0} volumes/s",
        args.parallel,
        n as f64 / secs
    );
    Ok(())
}
