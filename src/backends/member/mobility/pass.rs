//! One pass, driven by the controller between its sessions with the two
//! movers: the target's index to the source, the source's stream to the
//! target, and the two digests compared. The controller sees each message
//! (it counts bytes for the move's progress) and is the one that judges
//! the copy: a pass verifies only when the digest of what the source read
//! equals the digest of what the target then read back from its disk.

use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite};

use super::channel::Channel;
// The report travels too (`Msg::Pulled`), so it is the wire's.
use super::wire::Msg;
pub use super::wire::PassReport;

/// Progress as the pass goes: bytes read by the source so far (sent or
/// found equal), of the total.
pub trait Progress: Send {
    fn at(&mut self, done: u64, total: u64, sent: u64);
}

impl<F: FnMut(u64, u64, u64) + Send> Progress for F {
    fn at(&mut self, done: u64, total: u64, sent: u64) {
        self(done, total, sent)
    }
}

pub async fn run<A, B>(
    source: &mut Channel<A>,
    target: &mut Channel<B>,
    progress: &mut dyn Progress,
) -> Result<PassReport, String>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let started = Instant::now();
    let mut report = PassReport::default();
    let t = |e: super::channel::ChannelError| format!("target mover: {e}");
    let s = |e: super::channel::ChannelError| format!("source mover: {e}");
    target.send(&Msg::Index).await.map_err(t)?;
    source.send(&Msg::Pass).await.map_err(s)?;
    loop {
        let msg: Msg = target.recv().await.map_err(t)?;
        match msg {
            Msg::Have { .. } => source.send(&msg).await.map_err(s)?,
            Msg::HaveEnd => {
                source.send(&msg).await.map_err(s)?;
                break;
            }
            Msg::Failed { why } => return Err(format!("target mover: {why}")),
            other => return Err(format!("target mover sent {} in its index", other.name())),
        }
    }
    target.send(&Msg::Apply).await.map_err(t)?;
    let mut done = 0u64;
    let mut last_report = Instant::now();
    loop {
        let msg: Msg = source.recv().await.map_err(s)?;
        match &msg {
            Msg::Total { bytes } => report.total = *bytes,
            Msg::Entry(e) => {
                report.entries += 1;
                if let Some(size) = e.has_chunks() {
                    done += size;
                }
            }
            Msg::Chunk { data, lz4, .. } => {
                report.wire += data.len() as u64;
                report.sent += match (lz4, data.get(..4)) {
                    (true, Some(n)) => u64::from(u32::from_le_bytes([n[0], n[1], n[2], n[3]])),
                    _ => data.len() as u64,
                };
            }
            Msg::Zero { .. } => {}
            Msg::End { digest, .. } => report.source_digest = *digest,
            Msg::Failed { why } => {
                let _ = target.send(&msg).await;
                return Err(format!("source mover: {why}"));
            }
            other => return Err(format!("source mover sent {} in a pass", other.name())),
        }
        let end = matches!(msg, Msg::End { .. });
        if let Err(e) = target.send(&msg).await {
            return Err(why_target_stopped(target, e).await);
        }
        if last_report.elapsed().as_millis() >= 500 || end {
            progress.at(done.min(report.total), report.total, report.sent);
            last_report = Instant::now();
        }
        if end {
            break;
        }
    }
    match target.recv::<Msg>().await.map_err(t)? {
        Msg::Applied { digest, .. } => {
            report.target_digest = digest;
            report.verified = digest == report.source_digest;
        }
        Msg::Failed { why } => return Err(format!("target mover: {why}")),
        other => return Err(format!("target mover answered {} to a pass", other.name())),
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// A target that stopped taking messages said why before it closed.
async fn why_target_stopped<B: AsyncRead + AsyncWrite + Unpin>(
    target: &mut Channel<B>,
    e: super::channel::ChannelError,
) -> String {
    let said = tokio::time::timeout(std::time::Duration::from_secs(2), target.recv::<Msg>()).await;
    match said {
        Ok(Ok(Msg::Failed { why })) => format!("target mover: {why}"),
        _ => format!("target mover: {e}"),
    }
}

/// How a pass over the pod network (`pull`) did not happen.
#[derive(Debug)]
pub enum PullError {
    /// The target mover did not reach the source mover: nothing was
    /// written, and the same pass may go through the controller instead.
    Unreachable(String),
    /// The pass started and failed, as `run` fails.
    Failed(String),
}

/// One pass the target mover runs itself with the source mover at `peer`
/// (their pod networks reach each other): the bytes go mover to mover,
/// and the controller hears the progress and the report. The report's
/// digests are the two movers' own, compared by the target as `run`
/// compares them.
pub async fn pull<B>(
    target: &mut Channel<B>,
    peer: &str,
    progress: &mut dyn Progress,
) -> Result<PassReport, PullError>
where
    B: AsyncRead + AsyncWrite + Unpin,
{
    let t = |e: super::channel::ChannelError| PullError::Failed(format!("target mover: {e}"));
    target
        .send(&Msg::Pull {
            peer: peer.to_string(),
        })
        .await
        .map_err(t)?;
    loop {
        match target.recv::<Msg>().await.map_err(t)? {
            Msg::Progress { done, total, sent } => progress.at(done, total, sent),
            Msg::Pulled(report) => return Ok(report),
            Msg::Unreachable { why } => return Err(PullError::Unreachable(why)),
            Msg::Failed { why } => return Err(PullError::Failed(format!("target mover: {why}"))),
            other => {
                return Err(PullError::Failed(format!(
                    "target mover answered {} to a pull",
                    other.name()
                )))
            }
        }
    }
}
