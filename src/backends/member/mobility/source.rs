//! The source mover's side of a pass: read what the target holds (its
//! chunk hashes), walk the volume, send every entry and the chunks the
//! target lacks, and the digest of all it read. The walk runs on a
//! blocking thread; the async side only moves messages.

use std::collections::HashMap;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

use super::channel::Channel;
use super::tree::{self, Digest, Entry, Hash, Place, Visit};
use super::wire::{self, Msg};

/// The most files a target may announce: bounds the source's memory.
const MAX_HAVES: usize = 10_000_000;

/// One pass, after `Pass` came: the target's `Have`s, then the stream.
pub async fn pass<S: AsyncRead + AsyncWrite + Unpin>(
    ch: &mut Channel<S>,
    place: &Place,
) -> Result<(), String> {
    let mut have: HashMap<Vec<u8>, Vec<Hash>> = HashMap::new();
    loop {
        match ch.recv::<Msg>().await.map_err(|e| e.to_string())? {
            Msg::Have { path, chunks, .. } => {
                if have.len() >= MAX_HAVES {
                    return Err(format!("the target announced more than {MAX_HAVES} files"));
                }
                have.insert(path, chunks);
            }
            Msg::HaveEnd => break,
            other => {
                return Err(format!(
                    "{} where the target's index was expected",
                    other.name()
                ))
            }
        }
    }
    let at = place.clone();
    let bytes = tokio::task::spawn_blocking(move || tree::total_bytes(&at))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("reading the volume's size: {e}"))?;
    ch.send(&Msg::Total { bytes })
        .await
        .map_err(|e| e.to_string())?;
    let (tx, mut rx) = mpsc::channel::<Msg>(8);
    let at = place.clone();
    let walker = tokio::task::spawn_blocking(move || {
        let mut v = Sender {
            tx,
            have,
            digest: Digest::default(),
            theirs: None,
        };
        let walked = at.walk(&mut v);
        let msg = match walked {
            Ok(()) => Msg::End {
                digest: v.digest.finish(),
                entries: v.digest.entries,
                bytes: v.digest.bytes,
            },
            Err(e) => Msg::Failed {
                why: format!("reading the source volume: {e}"),
            },
        };
        let _ = v.tx.blocking_send(msg);
    });
    while let Some(msg) = rx.recv().await {
        let last = matches!(msg, Msg::End { .. } | Msg::Failed { .. });
        ch.send(&msg).await.map_err(|e| e.to_string())?;
        if last {
            break;
        }
    }
    walker.await.map_err(|e| e.to_string())
}

struct Sender {
    tx: mpsc::Sender<Msg>,
    have: HashMap<Vec<u8>, Vec<Hash>>,
    digest: Digest,
    /// The target's chunk hashes of the current file.
    theirs: Option<Vec<Hash>>,
}

impl Sender {
    fn send(&self, msg: Msg) -> std::io::Result<()> {
        self.tx
            .blocking_send(msg)
            .map_err(|_| std::io::Error::other("the session ended"))
    }
}

impl Visit for Sender {
    fn entry(&mut self, e: &Entry) -> std::io::Result<()> {
        self.digest.entry(e);
        self.theirs = e.has_chunks().and_then(|_| self.have.remove(&e.path));
        self.send(Msg::Entry(e.clone()))
    }

    fn chunk(&mut self, index: u64, hash: &Hash, bytes: &[u8]) -> std::io::Result<()> {
        self.digest.chunk(hash, bytes.len());
        let same = self
            .theirs
            .as_ref()
            .and_then(|t| t.get(index as usize))
            .is_some_and(|h| h == hash);
        if same {
            return Ok(());
        }
        if bytes.iter().all(|b| *b == 0) {
            return self.send(Msg::Zero {
                index,
                len: bytes.len() as u32,
            });
        }
        self.send(wire::pack(index, bytes))
    }
}
