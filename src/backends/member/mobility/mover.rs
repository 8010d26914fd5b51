//! The mover: `csi-relay mover`, a pod in each member of a move that
//! mounts the volume's claim there (read-only on the source) and answers
//! the controller's sessions. It listens on the pod's loopback only: the
//! one way in is a port-forward through its member's API server (the
//! `pods/portforward` right), and the session needs the move's key besides.

use std::path::PathBuf;
use std::time::Duration;

use tokio::net::TcpListener;

use super::channel::{self, Channel, End, KEY_LEN};
use super::tree::Place;
use super::wire::Msg;
use super::{source, target};

/// The mover's port inside its pod.
pub const PORT: u16 = 7443;
/// A connection that has not finished its handshake by then is dropped:
/// nobody holds the mover with a silent stream.
const HANDSHAKE: Duration = Duration::from_secs(20);

/// `csi-relay mover`: listens on the pod's loopback and serves.
pub async fn run(
    role: &str,
    move_id: &str,
    key_file: &std::path::Path,
    path: PathBuf,
    block: bool,
    port: u16,
) -> Result<(), String> {
    let role =
        Role::parse(role).ok_or_else(|| format!("--role {role:?} is not source or target"))?;
    let mover = Mover::new(role, move_id.to_string(), key_file, path, block)?;
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .map_err(|e| format!("listening on 127.0.0.1:{port}: {e}"))?;
    tracing::info!(role = role.as_str(), move_id, port, "mover ready");
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

    /// Serves sessions one at a time until the process is stopped.
    pub async fn serve(&self, listener: TcpListener) -> std::io::Result<()> {
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            let opened = tokio::time::timeout(
                HANDSHAKE,
                Channel::open(
                    stream,
                    End::Mover,
                    &self.key,
                    &self.move_id,
                    self.role.as_str(),
                ),
            )
            .await;
            let mut ch = match opened {
                Ok(Ok(ch)) => ch,
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "mover: a session was refused");
                    continue;
                }
                Err(_) => {
                    tracing::warn!("mover: a connection sent no handshake in time");
                    continue;
                }
            };
            if let Err(why) = self.session(&mut ch).await {
                tracing::warn!(error = %why, "mover: session ended");
                let _ = ch.send(&Msg::Failed { why }).await;
            }
        }
    }

    async fn session<S>(&self, ch: &mut Channel<S>) -> Result<(), String>
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
            match (self.role, msg) {
                (Role::Target, Msg::Index) => target::index(ch, &self.place).await?,
                (Role::Target, Msg::Apply) => target::apply(ch, &self.place).await?,
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
}
