//! Test harness: a real `csi-relay serve` process on a unix socket in a
//! unique temp dir, driven by tonic clients. Dropping the harness stops the
//! process by PID (SIGTERM, then SIGKILL) and checks it cleaned its socket.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use csi_relay::csi::{
    controller_client::ControllerClient, group_controller_client::GroupControllerClient,
    identity_client::IdentityClient, node_client::NodeClient,
};
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

pub mod report;

pub const NODE: &str = "node-a";

pub struct Driver {
    pub dir: tempfile::TempDir,
    pub state_dir: PathBuf,
    pub socket: PathBuf,
    pub extra_args: Vec<String>,
    child: Option<Child>,
    pub channel: Channel,
}

impl Driver {
    pub async fn start(extra: &[&str]) -> Driver {
        Self::start_on("csi.sock", extra).await
    }

    /// Like `start`, listening on `socket` (relative to the test's temp dir,
    /// e.g. `plugins/<driver>/csi.sock` to stand in kubelet's plugins dir).
    pub async fn start_on(socket: &str, extra: &[&str]) -> Driver {
        let dir = test_dir();
        let state_dir = dir.path().join("state");
        let socket = dir.path().join(socket);
        std::fs::create_dir_all(socket.parent().expect("socket dir")).expect("create socket dir");
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        if !args.iter().any(|a| a == "--node-id") {
            args.extend(["--node-id".to_string(), NODE.to_string()]);
        }
        Self::start_in(dir, state_dir, socket, args).await
    }

    /// Starts a driver whose node id is `node_id`.
    pub async fn start_as(node_id: &str, extra: &[&str]) -> Driver {
        let mut args = vec!["--node-id", node_id];
        args.extend_from_slice(extra);
        Self::start_on("csi.sock", &args).await
    }

    /// A driver on a copy of the state directory `fixture`, as a node
    /// upgraded in place would find it.
    pub async fn start_from_state(fixture: &Path, extra: &[&str]) -> Driver {
        let dir = test_dir();
        let state_dir = dir.path().join("state");
        let copied = Command::new("cp")
            .arg("-a")
            .arg(fixture)
            .arg(&state_dir)
            .status()
            .expect("cp");
        assert!(copied.success(), "copy {}", fixture.display());
        let socket = dir.path().join("csi.sock");
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        args.extend(["--node-id".to_string(), NODE.to_string()]);
        Self::start_in(dir, state_dir, socket, args).await
    }

    /// A controller that may stand by (`--leader-election`): its
    /// `--probe-endpoint` (`probe.sock`) answers ready from the start,
    /// `csi.sock` ready only once it leads. The handle's channel is the probe
    /// socket's; see [`Driver::serving`].
    pub async fn start_standby(node_id: &str, extra: &[&str]) -> Driver {
        let dir = test_dir();
        let state_dir = dir.path().join("state");
        let socket = dir.path().join("csi.sock");
        let probe = dir.path().join("probe.sock");
        let mut args: Vec<String> = vec![
            "--node-id".into(),
            node_id.into(),
            "--probe-endpoint".into(),
            format!("unix://{}", probe.display()),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let child = spawn(&socket, &state_dir, &args);
        let channel = connect(&probe).await;
        Driver {
            dir,
            state_dir,
            socket,
            extra_args: args,
            child: Some(child),
            channel,
        }
    }

    /// A channel to the driver's CSI socket once it answers Probe ready.
    pub async fn serving(&self) -> Channel {
        connect(&self.socket).await
    }

    /// SIGSTOP or SIGCONT to the process: a frozen node, then a healed one.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(child) = &self.child {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            nix::sys::signal::kill(pid, signal).expect("signal the driver");
        }
    }

    /// Waits up to `within` for the process to end by itself.
    pub async fn exited_within(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            let status = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = status {
                self.child = None;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A handle on a driver process the test started (and stops) itself.
    pub fn attach(
        dir: tempfile::TempDir,
        state_dir: PathBuf,
        socket: PathBuf,
        channel: Channel,
    ) -> Driver {
        Driver {
            dir,
            state_dir,
            socket,
            extra_args: Vec::new(),
            child: None,
            channel,
        }
    }

    async fn start_in(
        dir: tempfile::TempDir,
        state_dir: PathBuf,
        socket: PathBuf,
        extra_args: Vec<String>,
    ) -> Driver {
        let child = spawn(&socket, &state_dir, &extra_args);
        let channel = connect(&socket).await;
        Driver {
            dir,
            state_dir,
            socket,
            extra_args,
            child: Some(child),
            channel,
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Stops the process with SIGTERM and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    _ if Instant::now() > deadline => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    _ => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    }

    /// Kills the process with SIGKILL: a crash, no clean-up.
    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, then waits without blocking the runtime, so this test's
    /// client connections can answer the server's graceful shutdown.
    pub async fn stop_gracefully(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        assert!(
                            status.success(),
                            "csi-relay exited with {status} on SIGTERM"
                        );
                        break;
                    }
                    _ if Instant::now() > deadline => {
                        let _ = child.kill();
                        let _ = child.wait();
                        panic!("csi-relay did not stop within 10 s of SIGTERM");
                    }
                    _ => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        }
    }

    /// Starts a new process on the same state dir and socket.
    pub async fn restart(&mut self) {
        self.stop_gracefully().await;
        self.start_again().await;
    }

    pub async fn start_again(&mut self) {
        let child = spawn(&self.socket, &self.state_dir, &self.extra_args);
        self.child = Some(child);
        self.channel = connect(&self.socket).await;
    }

    pub fn identity(&self) -> IdentityClient<Channel> {
        IdentityClient::new(self.channel.clone())
    }
    pub fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(self.channel.clone())
    }
    pub fn node(&self) -> NodeClient<Channel> {
        NodeClient::new(self.channel.clone())
    }
    pub fn group(&self) -> GroupControllerClient<Channel> {
        GroupControllerClient::new(self.channel.clone())
    }

    /// Every volume ListVolumes reports (one page: the tests' few).
    pub async fn volumes(&self) -> Vec<csi_relay::csi::Volume> {
        self.controller()
            .list_volumes(csi_relay::csi::ListVolumesRequest::default())
            .await
            .expect("ListVolumes")
            .into_inner()
            .entries
            .into_iter()
            .filter_map(|e| e.volume)
            .collect()
    }

    /// Everything the driver logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("driver.log")).unwrap_or_default()
    }

    /// A fresh path under the test's temp dir (not created).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A driver's own temp dir (state, socket, log), gone with the test.
fn test_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("csi-relay-test-")
        .tempdir()
        .expect("tempdir")
}

fn spawn(socket: &Path, state_dir: &Path, extra: &[String]) -> Child {
    let _ = std::fs::remove_file(socket);
    // The driver's log goes to a file next to the state dir, for tests
    // that check what is (and is not) logged.
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(state_dir.with_file_name("driver.log"))
        .expect("open driver log");
    // RELAY_TEST_BINARY runs the tests against another build (e.g. a
    // release one, for figures).
    let binary = std::env::var_os("RELAY_TEST_BINARY")
        .unwrap_or_else(|| env!("CARGO_BIN_EXE_csi-relay").into());
    // These tests look at volumes' data in the state dir, which plain
    // mount access keeps as a directory only when asked to; tests of the
    // default (a block file with its own filesystem) say so.
    let backing: &[&str] = if extra
        .iter()
        .any(|a| a.starts_with("--default-mount-backing"))
    {
        &[]
    } else {
        &["--default-mount-backing", "directory"]
    };
    Command::new(binary)
        .arg("serve")
        .arg("--endpoint")
        .arg(format!("unix://{}", socket.display()))
        .arg("--state-dir")
        .arg(state_dir)
        .args(backing)
        .args(extra)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "csi_relay=debug,info".into()),
        )
        .stdin(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn csi-relay")
}

/// One attempt to open a channel to the unix socket `socket`.
async fn dial(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = socket.to_path_buf();
    Endpoint::try_from("http://[::]:50051")
        .expect("endpoint")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
}

/// A channel to `socket` once it accepts, ready or not.
pub async fn channel_to(socket: &Path) -> Channel {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match dial(socket).await {
            Ok(channel) => return channel,
            Err(e) if Instant::now() > deadline => panic!("connect {}: {e}", socket.display()),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

pub async fn connect(socket: &Path) -> Channel {
    // A controller rebuilding thousands of RelayVolumes (member_scale_e2e)
    // answers Probe ready only once they are read.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if socket.exists() {
            if let Ok(channel) = dial(socket).await {
                // As a CO does: calls start once Probe says ready (the node
                // reconciles its volumes first).
                let mut identity = IdentityClient::new(channel.clone());
                let ready = identity
                    .probe(csi_relay::csi::ProbeRequest {})
                    .await
                    .is_ok_and(|r| r.into_inner().ready == Some(true));
                if ready {
                    return channel;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "csi-relay did not come up on {}",
            socket.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// True when this process may mount and use loop devices. Tests that need it
/// print "skipped: ..." loudly when it is missing.
pub fn can_mount() -> Result<(), String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err("not running as root".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Err("no /dev/loop-control".into());
    }
    Ok(())
}

/// Says "skipped: <why>" on the real stderr (libtest captures `eprintln!`
/// of passing tests, and a skip must never pass silently), and counts the
/// test: the binary names every skipped test again when it exits.
pub fn skip(why: &str) {
    use std::io::Write;
    let test = std::thread::current()
        .name()
        .unwrap_or("(unnamed test)")
        .to_string();
    let _ = writeln!(std::io::stderr(), "skipped: {test}: {why}");
    let mut skipped = SKIPPED.lock().unwrap_or_else(|p| p.into_inner());
    if skipped.is_empty() {
        // SAFETY: `report_skips` is an `extern "C" fn` without arguments
        // that does not unwind (it catches nothing and cannot panic: it
        // only writes to stderr and ignores the result).
        unsafe { nix::libc::atexit(report_skips) };
    }
    skipped.push(format!("{test}: {why}"));
}

static SKIPPED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// libtest's summary counts a skipped test as passed; this line, printed
/// when the binary exits, says how many of them did not really run.
extern "C" fn report_skips() {
    use std::io::Write;
    let skipped = match SKIPPED.try_lock() {
        Ok(s) => s,
        Err(_) => return,
    };
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "\nskipped at run time: {} test(s) (counted as passed above)",
        skipped.len()
    );
    for line in skipped.iter() {
        let _ = writeln!(err, "  skipped: {line}");
    }
}

/// Tests run two at a time in this one binary. The ones on real control
/// planes and kubelets, and the fuzz campaign that compares the whole
/// mount table before and after, run alone (`alone`), as they did in
/// binaries of their own: the clusters are shared, and their timeouts
/// assume the machine's two cores. The mount tests hold this lock shared.
static ALONE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Held by a test that must run with no other test, for its duration.
/// Its outcome and time go to the suite report (`report`) when it ends.
pub struct Alone {
    // Declared first, dropped first: the report is written while the lock
    // is still held, so the time counted is the test's own.
    _timed: report::Timed,
    _lock: std::sync::RwLockWriteGuard<'static, ()>,
}

pub fn alone() -> Alone {
    let lock = ALONE.write().unwrap_or_else(|p| p.into_inner());
    Alone {
        _timed: report::Timed::start(),
        _lock: lock,
    }
}

/// Why the test named `test` said it was skipped, if it did.
pub fn skipped_because(test: &str) -> Option<String> {
    let prefix = format!("{test}: ");
    SKIPPED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .find_map(|line| line.strip_prefix(&prefix).map(str::to_string))
}

/// Held by a test that mounts and uses loop devices, for its duration.
pub struct Shared(#[allow(dead_code)] std::sync::RwLockReadGuard<'static, ()>);

pub fn shared() -> Shared {
    Shared(ALONE.read().unwrap_or_else(|p| p.into_inner()))
}

#[macro_export]
macro_rules! require_mounts {
    () => {
        if let Err(why) = $crate::common::can_mount() {
            $crate::common::skip(&format!(
                "{why}: this test needs real mount(2) and loop devices"
            ));
            return;
        }
        let _shared = $crate::common::shared();
    };
}

pub mod req {
    //! Request builders.
    use std::collections::HashMap;

    use csi_relay::csi::{self, volume_capability};

    pub fn mount_cap(mode: volume_capability::access_mode::Mode) -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_type: Some(volume_capability::AccessType::Mount(
                volume_capability::MountVolume::default(),
            )),
            access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
        }
    }

    pub fn fs_cap(
        mode: volume_capability::access_mode::Mode,
        fs: &str,
        flags: &[&str],
    ) -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_type: Some(volume_capability::AccessType::Mount(
                volume_capability::MountVolume {
                    fs_type: fs.into(),
                    mount_flags: flags.iter().map(|s| s.to_string()).collect(),
                    volume_mount_group: String::new(),
                },
            )),
            access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
        }
    }

    pub fn block_cap(mode: volume_capability::access_mode::Mode) -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_type: Some(volume_capability::AccessType::Block(
                volume_capability::BlockVolume {},
            )),
            access_mode: Some(volume_capability::AccessMode { mode: mode as i32 }),
        }
    }

    pub fn snw() -> csi::VolumeCapability {
        mount_cap(volume_capability::access_mode::Mode::SingleNodeWriter)
    }

    pub fn create(name: &str, bytes: i64, cap: csi::VolumeCapability) -> csi::CreateVolumeRequest {
        csi::CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(csi::CapacityRange {
                required_bytes: bytes,
                limit_bytes: 0,
            }),
            volume_capabilities: vec![cap],
            ..Default::default()
        }
    }

    pub fn secrets() -> HashMap<String, String> {
        [(
            "password".to_string(),
            "hunter2-must-never-be-logged".to_string(),
        )]
        .into()
    }
}
