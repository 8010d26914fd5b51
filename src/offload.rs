//! Blocking work (syncs, mounts, data copies) leaves the async thread, and
//! goes there once per call, not once per step.
//!
//! Every hop to a blocking-pool thread costs two wake-ups, and on a small
//! VM a wake-up costs more than a sync: a node call that hopped for its
//! mount and again for each store commit paid that three times. A thread
//! of the blocking pool marks itself, so work that is already off the
//! async thread runs in place.

use std::cell::Cell;
use std::future::Future;

use crate::error::{CsiError, CsiResult};

thread_local! {
    static OFF_ASYNC: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread may block (it is one `blocking` put work on).
pub fn may_block() -> bool {
    OFF_ASYNC.with(Cell::get)
}

/// Runs `f` where it may block: in place on a thread that may, otherwise
/// on the blocking pool.
pub async fn blocking<T, F>(f: F) -> Result<T, tokio::task::JoinError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    if may_block() {
        return Ok(f());
    }
    tokio::task::spawn_blocking(move || {
        OFF_ASYNC.with(|m| m.set(true));
        f()
    })
    .await
}

/// Runs a whole call (its commits, syncs and storage steps) on one
/// blocking-pool thread: one hop for the call instead of one per step.
/// Its awaits on the network still work there, woken by the runtime.
pub async fn call<T, F>(what: &'static str, call: F) -> CsiResult<T>
where
    T: Send + 'static,
    F: Future<Output = CsiResult<T>> + Send + 'static,
{
    if may_block() {
        return call.await;
    }
    let runtime = tokio::runtime::Handle::current();
    blocking(move || runtime.block_on(call))
        .await
        .map_err(|e| CsiError::Internal(format!("{what} failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_hops_once_and_nested_work_stays_on_its_thread() {
        assert!(!may_block());
        let here = std::thread::current().id();
        let (outer, inner) = blocking(|| {
            let outer = std::thread::current().id();
            let rt = tokio::runtime::Builder::new_current_thread().build();
            let inner =
                rt.map(|rt| rt.block_on(blocking(|| (may_block(), std::thread::current().id()))));
            (outer, inner)
        })
        .await
        .unwrap();
        assert_ne!(outer, here, "blocking work must leave the async thread");
        let (marked, inner) = inner.unwrap().unwrap();
        assert!(marked);
        assert_eq!(inner, outer, "nested blocking work must not hop again");
        assert!(!may_block(), "the async thread stays unmarked");
    }

    #[tokio::test]
    async fn a_call_that_panics_is_an_internal_error_naming_it() {
        let answer: CsiResult<()> = call("CreateVolume", async { panic!("a bug") }).await;
        let e = answer.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal, "{e}");
        assert!(e.to_string().contains("CreateVolume failed"), "{e}");
        // The async thread is unharmed and the next call runs.
        assert_eq!(call("CreateVolume", async { Ok(7) }).await.ok(), Some(7));
    }
}
