//! The movers' channel: Noise `NNpsk0` (X25519, ChaCha20-Poly1305,
//! BLAKE2s) over any byte stream, here a port-forward through a member's
//! API server and kubelet. Both ends hold the move's 32-byte key (the
//! controller made it; the mover reads it from its Secret), so a party
//! without it cannot complete the handshake, read or alter a byte; the
//! ephemeral keys give each session keys of its own. The prologue binds
//! the move and the mover's role: a key or a stream of one move, or of the
//! other end, is refused.
//!
//! Messages are postcard-encoded values, length-prefixed and cut into
//! Noise messages of at most 64 KiB.

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

const PATTERN: &str = "Noise_NNpsk0_25519_ChaChaPoly_BLAKE2s";
/// Noise's own bound on one message, its 16-byte tag included.
const NOISE_MAX: usize = 65535;
const TAG: usize = 16;
const PLAIN_MAX: usize = NOISE_MAX - TAG;
/// The largest message taken: a chunk (`tree::CHUNK`) and its framing.
pub const MESSAGE_MAX: usize = 4 << 20;
pub const KEY_LEN: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("the other end is not this move's mover or controller (wrong key, move or role): {0}")]
    Handshake(String),
    #[error("a message failed authentication: {0}")]
    Crypto(String),
    #[error("malformed message: {0}")]
    Malformed(String),
}

pub type ChannelResult<T> = Result<T, ChannelError>;

/// Which end of a session: the controller starts it, a mover answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    Controller,
    Mover,
}

/// An established session over `S`.
pub struct Channel<S> {
    io: S,
    noise: snow::TransportState,
    /// Decrypted bytes not yet taken as messages.
    inbox: Vec<u8>,
    buf: Vec<u8>,
}

fn prologue(move_id: &str, role: &str) -> Vec<u8> {
    format!("csi-relay mover 1\0{move_id}\0{role}").into_bytes()
}

impl<S: AsyncRead + AsyncWrite + Unpin> Channel<S> {
    /// The handshake, as `end`, for the mover of `role` in move `move_id`.
    pub async fn open(
        mut io: S,
        end: End,
        key: &[u8; KEY_LEN],
        move_id: &str,
        role: &str,
    ) -> ChannelResult<Self> {
        let params = PATTERN
            .parse()
            .map_err(|e| ChannelError::Handshake(format!("{e:?}")))?;
        let prologue = prologue(move_id, role);
        let builder = snow::Builder::new(params).psk(0, key).prologue(&prologue);
        let hs = |e: snow::Error| ChannelError::Handshake(format!("{e}"));
        let mut buf = vec![0u8; NOISE_MAX];
        let mut payload = vec![0u8; NOISE_MAX];
        let mut state = match end {
            End::Controller => builder.build_initiator(),
            End::Mover => builder.build_responder(),
        }
        .map_err(hs)?;
        if end == End::Controller {
            let n = state.write_message(&[], &mut buf).map_err(hs)?;
            write_frame(&mut io, &buf[..n]).await?;
            let n = read_frame(&mut io, &mut buf).await?;
            state.read_message(&buf[..n], &mut payload).map_err(hs)?;
        } else {
            let n = read_frame(&mut io, &mut buf).await?;
            state.read_message(&buf[..n], &mut payload).map_err(hs)?;
            let n = state.write_message(&[], &mut buf).map_err(hs)?;
            write_frame(&mut io, &buf[..n]).await?;
        }
        let noise = state.into_transport_mode().map_err(hs)?;
        Ok(Channel {
            io,
            noise,
            inbox: Vec::new(),
            // A frame's 2-byte length, then the frame.
            buf: vec![0u8; NOISE_MAX + 2],
        })
    }

    pub async fn send<T: Serialize>(&mut self, msg: &T) -> ChannelResult<()> {
        let body = postcard::to_stdvec(msg).map_err(|e| ChannelError::Malformed(e.to_string()))?;
        if body.len() > MESSAGE_MAX {
            return Err(ChannelError::Malformed(format!(
                "a message of {} bytes is more than {MESSAGE_MAX}",
                body.len()
            )));
        }
        let mut plain = Vec::with_capacity(body.len() + 4);
        plain.extend_from_slice(&(body.len() as u32).to_be_bytes());
        plain.extend_from_slice(&body);
        for piece in plain.chunks(PLAIN_MAX) {
            // The frame's length goes before it in one write: one segment
            // (or port-forward message) a frame, not two.
            let n = self
                .noise
                .write_message(piece, &mut self.buf[2..])
                .map_err(|e| ChannelError::Crypto(e.to_string()))?;
            self.buf[..2].copy_from_slice(&(n as u16).to_be_bytes());
            self.io.write_all(&self.buf[..n + 2]).await?;
        }
        self.io.flush().await?;
        Ok(())
    }

    pub async fn recv<T: DeserializeOwned>(&mut self) -> ChannelResult<T> {
        loop {
            if self.inbox.len() >= 4 {
                let mut len = [0u8; 4];
                len.copy_from_slice(&self.inbox[..4]);
                let len = u32::from_be_bytes(len) as usize;
                if len > MESSAGE_MAX {
                    return Err(ChannelError::Malformed(format!(
                        "a message of {len} bytes announced, more than {MESSAGE_MAX}"
                    )));
                }
                if self.inbox.len() >= 4 + len {
                    let msg = postcard::from_bytes(&self.inbox[4..4 + len])
                        .map_err(|e| ChannelError::Malformed(e.to_string()));
                    self.inbox.drain(..4 + len);
                    return msg;
                }
            }
            let n = read_frame(&mut self.io, &mut self.buf).await?;
            let mut plain = vec![0u8; n];
            let m = self
                .noise
                .read_message(&self.buf[..n], &mut plain)
                .map_err(|e| ChannelError::Crypto(e.to_string()))?;
            self.inbox.extend_from_slice(&plain[..m]);
        }
    }
}

async fn write_frame<S: AsyncWrite + Unpin>(io: &mut S, frame: &[u8]) -> std::io::Result<()> {
    io.write_all(&(frame.len() as u16).to_be_bytes()).await?;
    io.write_all(frame).await
}

async fn read_frame<S: AsyncRead + Unpin>(io: &mut S, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut len = [0u8; 2];
    io.read_exact(&mut len).await?;
    let len = u16::from_be_bytes(len) as usize;
    io.read_exact(&mut buf[..len]).await?;
    Ok(len)
}

/// A fresh random key (the OS's generator, as uuid's v4 draws it).
pub fn new_key() -> [u8; KEY_LEN] {
    let mut key = [0u8; KEY_LEN];
    key[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
    key
}

/// The key as a Secret holds it (hex), and back; anything else is refused.
pub fn key_from_hex(text: &str) -> Result<[u8; KEY_LEN], String> {
    let bytes = hex::decode(text.trim()).map_err(|e| format!("the key is not hex: {e}"))?;
    bytes
        .try_into()
        .map_err(|b: Vec<u8>| format!("the key is {} bytes, not {KEY_LEN}", b.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, serde::Deserialize, Debug, PartialEq)]
    struct Big(#[serde(with = "serde_bytes")] Vec<u8>);

    #[tokio::test]
    async fn messages_cross_and_a_wrong_key_role_or_move_is_refused() {
        let key = new_key();
        let (a, b) = tokio::io::duplex(1 << 16);
        let mover = tokio::spawn(async move {
            let mut ch = Channel::open(b, End::Mover, &key, "m1", "source").await?;
            let got: Big = ch.recv().await?;
            ch.send(&Big(got.0.iter().rev().copied().collect())).await?;
            Ok::<_, ChannelError>(got.0.len())
        });
        let mut ch = Channel::open(a, End::Controller, &key, "m1", "source")
            .await
            .expect("handshake");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        ch.send(&Big(data.clone())).await.expect("send");
        let back: Big = ch.recv().await.expect("recv");
        assert_eq!(back.0, data.iter().rev().copied().collect::<Vec<_>>());
        assert_eq!(mover.await.expect("join").expect("mover"), data.len());

        for (k, m, r) in [
            (new_key(), "m1", "source"),
            (key, "m2", "source"),
            (key, "m1", "target"),
        ] {
            let (a, b) = tokio::io::duplex(1 << 16);
            let mover = tokio::spawn(async move {
                Channel::open(b, End::Mover, &key, "m1", "source")
                    .await
                    .map(|_| ())
            });
            let ours = Channel::open(a, End::Controller, &k, m, r).await;
            let theirs = mover.await.expect("join");
            assert!(
                ours.is_err() || theirs.is_err(),
                "a session opened with key/move/role {m} {r}"
            );
        }
    }

    #[test]
    fn keys_round_trip_through_hex_and_bad_ones_are_named() {
        let key = new_key();
        assert_eq!(key_from_hex(&hex::encode(key)), Ok(key));
        assert!(key_from_hex("zz").unwrap_err().contains("not hex"));
        assert!(key_from_hex("abcd").unwrap_err().contains("2 bytes"));
        assert_ne!(new_key(), new_key());
    }
}
