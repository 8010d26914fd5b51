//! Node calls run off the async workers, bounded in time. A node call
//! stats, mounts and unmounts paths that may sit on a dead NFS server, and
//! such a syscall can block its thread for minutes; on a tokio worker it
//! would stall Probe and every call on other volumes. Each node call
//! therefore runs on a blocking-pool thread, and its answer is awaited for
//! at most a bound: past it the CO gets UNAVAILABLE (retryable) while the
//! stuck call keeps its volume's guard, so retries meet ABORTED instead of
//! piling up threads on the same hung path.

use std::future::Future;
use std::time::Duration;

use crate::domain::error::{CsiError, CsiResult};

/// Longer than any bounded step inside (mkfs: 120 s, mount.nfs: 60 s).
pub const NODE_CALL_LIMIT: Duration = Duration::from_secs(150);

pub async fn off_workers<T, F>(what: &'static str, limit: Duration, call: F) -> CsiResult<T>
where
    T: Send + 'static,
    F: Future<Output = CsiResult<T>> + Send + 'static,
{
    // Dropped at the bound, the blocking thread still runs the call out.
    match tokio::time::timeout(limit, crate::rt::offload::call(what, call)).await {
        Ok(answer) => answer,
        Err(_) => Err(CsiError::Unavailable(format!(
            "{what} did not finish within {limit:?} (a filesystem that does not answer?); it goes on in the background and a retry is refused while it does"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    // One worker thread, and a call that blocks its thread: other work on
    // the runtime still runs, and the caller gets its answer at the bound.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_hung_call_stalls_neither_the_runtime_nor_its_caller() {
        let started = Instant::now();
        let hung = tokio::spawn(off_workers(
            "NodePublishVolume",
            Duration::from_millis(300),
            async {
                std::thread::sleep(Duration::from_secs(2));
                Ok(())
            },
        ));
        // Meanwhile the single worker serves other work promptly.
        let beat = Instant::now();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(beat.elapsed() < Duration::from_millis(250));
        let answer = hung
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        let e = answer.err().unwrap_or_default();
        assert!(e.contains("did not finish"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(1));
        // An ordinary call answers as it would inline.
        let v = off_workers("NodeGetVolumeStats", NODE_CALL_LIMIT, async {
            tokio::time::sleep(Duration::from_millis(5)).await;
            Ok(7)
        })
        .await;
        assert_eq!(v.ok(), Some(7));
    }
}
