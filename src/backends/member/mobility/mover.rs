//! The mover: `csi-relay mover`, a pod in each member of a move that
//! mounts the volume's claim there (read-only on the source) and answers
//! the controller's sessions. The way in is a port-forward through its
//! member's API server (the `pods/portforward` right) to the pod's
//! loopback; a source mover the controller lets be reached on the pod
//! network (`--listen=0.0.0.0`) also takes the target mover's session
//! there, where the members' pod networks reach each other. Either way the
//! session needs the move's key, and is bound to the move and the role.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Mutex, Semaphore};

use super::channel::{self, Channel, End, KEY_LEN};
use super::tree::Place;
use super::wire::Msg;
use super::{pass, source, target};

/// The mover's port inside its pod.
pub const PORT: u16 = 7443;
/// A connection that has not finished its handshake by then is dropped:
/// nobody holds the mover with a silent stream.
const HANDSHAKE: Duration = Duration::from_secs(20);
/// Handshakes under way at once; a connection past them is dropped.
const HANDSHAKES: usize = 8;
/// How long a target mover tries to reach the source mover on the pod
/// network before it says `Unreachable` (the controller's way then).
pub const PEER_REACH: Duration = Duration::from_secs(5);

/// `csi-relay mover`: listens on `listen` (the pod's loopback unless told
/// otherwise) and serves.
pub async fn run(
    role: &str,
    move_id: &str,
    key_file: &std::path::Path,
    path: PathBuf,
    block: bool,
    listen: IpAddr,
    port: u16,
) -> Result<(), String> {
    let role =
        Role::parse(role).ok_or_else(|| format!("--role {role:?} is not source or target"))?;
    let mover = Mover::new(role, move_id.to_string(), key_file, path, block)?;
    let listener = TcpListener::bind((listen, port))
        .await
        .map_err(|e| format!("listening on {listen}:{port}: {e}"))?;
    tracing::info!(role = role.as_str(), move_id, %listen, port, "mover ready");
    mover.serve(listener).await.map_err(|e| e.to_string())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Source,
    Target,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Source => "source",
            Role::Target => "target",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "source" => Some(Role::Source),
            "target" => Some(Role::Target),
            _ => None,
        }
    }
}

pub struct Mover {
    pub role: Role,
    pub move_id: String,
    pub key: [u8; KEY_LEN],
    pub place: Place,
}

impl Mover {
    /// From the command line: the key file's hex, the place's kind.
    pub fn new(
        role: Role,
        move_id: String,
        key_file: &std::path::Path,
        path: PathBuf,
        block: bool,
    ) -> Result<Self, String> {
        let text = std::fs::read_to_string(key_file)
            .map_err(|e| format!("reading the key file {}: {e}", key_file.display()))?;
        let key = channel::key_from_hex(&text)?;
        let place = if block {
            Place::Device(path, None)
        } else {
            Place::Tree(path)
        };
        Ok(Mover {
            role,
            move_id,
            key,
            place,
        })
    }

    /// Serves until the process is stopped: each connection's handshake
    /// on its own (a silent one holds nothing but itself, at most
    /// `HANDSHAKES` at once), and one operation at a time (`Index`,
    /// `Apply`, `Pass`, `Pull`), whatever the session: a session left open
    /// between passes (the controller's) holds no other.
    pub async fn serve(self, listener: TcpListener) -> std::io::Result<()> {
        let me = Arc::new(self);
        let ops = Arc::new(Mutex::new(()));
        let handshakes = Arc::new(Semaphore::new(HANDSHAKES));
        loop {
            let (stream, from) = listener.accept().await?;
            let Ok(permit) = handshakes.clone().try_acquire_owned() else {
                tracing::warn!(%from, "mover: too many handshakes under way; a connection dropped");
                continue;
            };
            let _ = stream.set_nodelay(true);
            let (me, ops) = (me.clone(), ops.clone());
            tokio::spawn(async move {
                let opened = tokio::time::timeout(
                    HANDSHAKE,
                    Channel::open(stream, End::Mover, &me.key, &me.move_id, me.role.as_str()),
                )
                .await;
                drop(permit);
                let mut ch = match opened {
                    Ok(Ok(ch)) => ch,
                    Ok(Err(e)) => {
                        tracing::warn!(%from, error = %e, "mover: a session was refused");
                        return;
                    }
                    Err(_) => {
                        tracing::warn!(%from, "mover: a connection sent no handshake in time");
                        return;
                    }
                };
                if let Err(why) = me.session(&mut ch, &ops).await {
                    tracing::warn!(error = %why, "mover: session ended");
                    let _ = ch.send(&Msg::Failed { why }).await;
                }
            });
        }
    }

    async fn session<S>(&self, ch: &mut Channel<S>, ops: &Mutex<()>) -> Result<(), String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        loop {
            let msg: Msg = match ch.recv().await {
                Ok(m) => m,
                // The controller closing its end is how a session ends.
                Err(channel::ChannelError::Io(e))
                    if e.kind() == std::io::ErrorKind::UnexpectedEof =>
                {
                    return Ok(())
                }
                Err(e) => return Err(e.to_string()),
            };
            let _one = ops.lock().await;
            match (self.role, msg) {
                (Role::Target, Msg::Index) => target::index(ch, &self.place).await?,
                (Role::Target, Msg::Apply) => target::apply(ch, &self.place).await?,
                (Role::Target, Msg::Pull { peer }) => self.pull(ch, &peer).await?,
                (Role::Source, Msg::Pass) => source::pass(ch, &self.place).await?,
                (role, other) => {
                    return Err(format!(
                        "{} is not for the {} mover",
                        other.name(),
                        role.as_str()
                    ))
                }
            }
        }
    }

    /// `Pull`: the target runs the pass with the source mover at `peer`
    /// itself (`pass::run`, the controller's part), its own side in
    /// process over an in-memory session, and tells the controller the
    /// progress and the report. `Unreachable` when the peer gives no
    /// session within `PEER_REACH`: nothing was written then.
    async fn pull<S>(&self, ch: &mut Channel<S>, peer: &str) -> Result<(), String>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    {
        let mut source = match self.reach(peer).await {
            Ok(source) => source,
            Err(why) => {
                tracing::info!(peer, error = %why, "mover: the source mover is not reachable on the pod network");
                return ch
                    .send(&Msg::Unreachable { why })
                    .await
                    .map_err(|e| e.to_string());
            }
        };
        let (near, far) = tokio::io::duplex(1 << 20);
        let local_target = async {
            let mut ch = Channel::open(far, End::Mover, &self.key, &self.move_id, "target")
                .await
                .map_err(|e| e.to_string())?;
            loop {
                match ch.recv::<Msg>().await {
                    Ok(Msg::Index) => target::index(&mut ch, &self.place).await?,
                    Ok(Msg::Apply) => target::apply(&mut ch, &self.place).await?,
                    Ok(other) => return Err(format!("{} in a pull's own session", other.name())),
                    // The pass is over: its end of the session went.
                    Err(_) => return Ok::<(), String>(()),
                }
            }
        };
        let (tx, mut rx) = watch::channel((0u64, 0u64, 0u64));
        let driven = async {
            let mut near = Channel::open(near, End::Controller, &self.key, &self.move_id, "target")
                .await
                .map_err(|e| e.to_string())?;
            let mut progress = move |done: u64, total: u64, sent: u64| {
                let _ = tx.send((done, total, sent));
            };
            let pass = pass::run(&mut source, &mut near, &mut progress);
            tokio::pin!(pass);
            let report = loop {
                tokio::select! {
                    report = &mut pass => break report,
                    Ok(()) = rx.changed() => {
                        let (done, total, sent) = *rx.borrow_and_update();
                        ch.send(&Msg::Progress { done, total, sent })
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                }
            };
            // The pass's last word on progress (its end) goes too.
            if rx.has_changed().unwrap_or(false) {
                let (done, total, sent) = *rx.borrow_and_update();
                ch.send(&Msg::Progress { done, total, sent })
                    .await
                    .map_err(|e| e.to_string())?;
            }
            report
        };
        let (report, served) = tokio::join!(driven, local_target);
        let report = report?;
        served?;
        ch.send(&Msg::Pulled(report))
            .await
            .map_err(|e| e.to_string())
    }

    /// A session with the source mover at `peer` (`ip:port`), as the
    /// controller opens one: the move's key, its id, the source's role.
    async fn reach(&self, peer: &str) -> Result<Channel<TcpStream>, String> {
        let addr: SocketAddr = peer
            .parse()
            .map_err(|e| format!("peer {peer:?} is not ip:port: {e}"))?;
        let opened = tokio::time::timeout(PEER_REACH, async {
            let stream = TcpStream::connect(addr)
                .await
                .map_err(|e| format!("connecting to {addr}: {e}"))?;
            let _ = stream.set_nodelay(true);
            Channel::open(stream, End::Controller, &self.key, &self.move_id, "source")
                .await
                .map_err(|e| format!("handshake with {addr}: {e}"))
        })
        .await;
        opened.unwrap_or_else(|_| {
            Err(format!(
                "no session with {addr} in {} s",
                PEER_REACH.as_secs()
            ))
        })
    }
}
