//! relay-move: the copy of a volume move without Kubernetes in the way. Two
//! real movers (`csi-relay mover`'s code) on loopback TCP and the
//! controller's pass between them, over real files: what the movers and the
//! controller can do on this machine, to set beside the same move through
//! port-forward streams of two API servers and two kubelets
//! (tests/suite/mobility_e2e.rs) and beside a plain `cp` of the same data.
//!
//! Prints, for N MiB of random data: the first pass (everything sent), a
//! pass with nothing changed, and one after 1 % of the chunks was
//! rewritten, each in MB/s of data read, with the bytes sent. `--pull`:
//! the pod network's way, the target mover running the pass with the
//! source mover itself (no controller between the two).

use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Parser;
use tokio::net::{TcpListener, TcpStream};

use csi_relay::backends::member::mobility::channel::{new_key, Channel, End, KEY_LEN};
use csi_relay::backends::member::mobility::mover::{Mover, Role};
use csi_relay::backends::member::mobility::pass::{self, PassReport};
use csi_relay::backends::member::mobility::tree::Place;

#[derive(Parser)]
struct Args {
    /// MiB of random data in the source volume.
    #[arg(long, default_value_t = 1024)]
    mib: u64,
    /// Where the source and target trees are made (and removed after).
    #[arg(long, default_value = "/tmp")]
    dir: PathBuf,
    /// Mover to mover (`Pull`), as on a pod network both members reach.
    #[arg(long)]
    pull: bool,
}

const CHUNK: u64 = 1 << 20;

/// xorshift64*: random bytes faster than the disk takes them, with no
/// dependency for it.
fn fill_random(path: &Path, bytes: u64, mut seed: u64) -> std::io::Result<()> {
    use std::io::Write;
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
    let mut buf = vec![0u8; 1 << 16];
    let mut left = bytes;
    while left > 0 {
        for word in buf.chunks_exact_mut(8) {
            seed ^= seed >> 12;
            seed ^= seed << 25;
            seed ^= seed >> 27;
            word.copy_from_slice(&seed.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        let n = left.min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        left -= n as u64;
    }
    f.into_inner().map_err(|e| e.into_error())?.sync_all()
}

/// Rewrites one chunk in a hundred, in place.
fn rewrite_one_percent(path: &Path, bytes: u64) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom, Write};
    let mut f = std::fs::OpenOptions::new().write(true).open(path)?;
    let chunks = bytes / CHUNK;
    let mut changed = 0;
    for c in (0..chunks).step_by(100) {
        f.seek(SeekFrom::Start(c * CHUNK))?;
        f.write_all(&vec![(c % 251) as u8 + 1; CHUNK as usize])?;
        changed += CHUNK;
    }
    f.sync_all()?;
    Ok(changed)
}

async fn start(role: Role, key: [u8; KEY_LEN], place: Place) -> std::io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let mover = Mover {
        role,
        move_id: "bench".into(),
        key,
        place,
    };
    tokio::spawn(async move {
        let _ = mover.serve(listener).await;
    });
    Ok(port)
}

async fn connect(port: u16, key: &[u8; KEY_LEN], role: Role) -> Result<Channel<TcpStream>, String> {
    let s = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    Channel::open(s, End::Controller, key, "bench", role.as_str())
        .await
        .map_err(|e| e.to_string())
}

async fn one_pass(src: &Path, dst: &Path, pull: bool) -> Result<PassReport, String> {
    let key = new_key();
    let sp = start(Role::Source, key, Place::Tree(src.to_path_buf()))
        .await
        .map_err(|e| e.to_string())?;
    let tp = start(Role::Target, key, Place::Tree(dst.to_path_buf()))
        .await
        .map_err(|e| e.to_string())?;
    let mut t = connect(tp, &key, Role::Target).await?;
    let mut progress = |_: u64, _: u64, _: u64| {};
    if pull {
        return pass::pull(&mut t, &format!("127.0.0.1:{sp}"), &mut progress)
            .await
            .map_err(|e| format!("{e:?}"));
    }
    let mut s = connect(sp, &key, Role::Source).await?;
    pass::run(&mut s, &mut t, &mut progress).await
}

fn line(what: &str, r: &PassReport) {
    println!(
        "{what:<28} {:>8.1} MB/s  read {:>7.1} MiB  sent {:>7.1} MiB  wire {:>7.1} MiB  {:>6.2} s  verified {}",
        r.total as f64 / r.seconds.max(1e-9) / 1e6,
        r.total as f64 / CHUNK as f64,
        r.sent as f64 / CHUNK as f64,
        r.wire as f64 / CHUNK as f64,
        r.seconds,
        r.verified
    );
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    let root = args
        .dir
        .join(format!("relay-move-bench-{}", std::process::id()));
    let (src, dst, copy) = (root.join("src"), root.join("dst"), root.join("cp"));
    for d in [&src, &dst, &copy] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let result = run(&args, &src, &dst, &copy).await;
    let _ = std::fs::remove_dir_all(&root);
    result
}

async fn run(args: &Args, src: &Path, dst: &Path, copy: &Path) -> Result<(), String> {
    let bytes = args.mib * CHUNK;
    let data = src.join("data");
    fill_random(&data, bytes, 0x9E37_79B9_7F4A_7C15).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let cp = std::process::Command::new("cp")
        .arg(&data)
        .arg(copy.join("data"))
        .status()
        .map_err(|e| e.to_string())?;
    let cp_seconds = started.elapsed().as_secs_f64();
    if !cp.success() {
        return Err(format!("cp failed: {cp}"));
    }
    let _ = std::fs::remove_file(copy.join("data"));
    println!(
        "relay-move: {} MiB of random data, movers on loopback TCP, {} ({} build)",
        args.mib,
        if args.pull {
            "mover to mover (--pull)"
        } else {
            "the controller between them"
        },
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
    );
    println!(
        "{:<28} {:>8.1} MB/s  {:>6.2} s",
        "cp (the floor)",
        bytes as f64 / cp_seconds / 1e6,
        cp_seconds
    );
    let first = one_pass(src, dst, args.pull).await?;
    line("first pass (all sent)", &first);
    let again = one_pass(src, dst, args.pull).await?;
    line("nothing changed", &again);
    let changed = rewrite_one_percent(&data, bytes).map_err(|e| e.to_string())?;
    let delta = one_pass(src, dst, args.pull).await?;
    line(
        &format!("{:.0} MiB rewritten (1 %)", changed as f64 / CHUNK as f64),
        &delta,
    );
    println!(
        "ratio to cp: first pass {:.2}",
        (first.total as f64 / first.seconds.max(1e-9)) / (bytes as f64 / cp_seconds)
    );
    if !(first.verified && again.verified && delta.verified) {
        return Err("a pass did not verify".into());
    }
    Ok(())
}
