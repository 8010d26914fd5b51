//! Blocking work (syncs, mounts, data copies) leaves the async thread, and
//! goes there once per call, not once per step.
//!
//! Every hop to another thread costs two wake-ups, and on a small VM a
//! wake-up costs more than a sync: a node call that hopped for its mount
//! and again for each store commit paid that three times. The threads work
//! goes to (tokio's blocking pool) are marked, so work that is already off
//! the async thread runs in place.
//!
//! Tokio's pool hands a job to an idle thread and counts it taken at once,
//! so a call never queues behind another that hangs in the kernel (an NFS
//! mount): it gets a thread of its own, up to the runtime's bound. An own
//! pool kept here before saved 5-7 MB of peak RSS at 64 clients, could
//! queue a call behind a hung one, and in throughput won 2 of relay-bench's
//! 4 figures by more than 5 % and lost the other 2 (docs/behaviour.md).

use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::sync::OnceLock;

use tokio::sync::Semaphore;

use crate::domain::error::{CsiError, CsiResult};

thread_local! {
    static OFF_ASYNC: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread may block (it is one `blocking` put work on).
pub fn may_block() -> bool {
    OFF_ASYNC.with(Cell::get)
}

fn mark_may_block() {
    OFF_ASYNC.with(|m| m.set(true));
}

/// Work that gave no answer: it panicked, or the runtime is shutting down.
#[derive(Debug)]
pub struct NoAnswer(String);

impl fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Runs `f` where it may block: in place on a thread that may, otherwise
/// on a blocking thread.
pub async fn blocking<T, F>(f: F) -> Result<T, NoAnswer>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    if may_block() {
        return Ok(f());
    }
    start(f).await
}

/// Starts `f` on a blocking thread now, to overlap the caller's own
/// work; its answer is awaited later.
pub fn start<T, F>(f: F) -> impl Future<Output = Result<T, NoAnswer>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let task = tokio::task::spawn_blocking(move || {
        mark_may_block();
        f()
    });
    async move {
        task.await.map_err(|e| {
            let why = if e.is_panic() {
                "it panicked; see the log"
            } else {
                "the driver is shutting down"
            };
            NoAnswer(format!("the work ended without an answer: {why}"))
        })
    }
}

/// Runs a whole call (its commits, syncs and storage steps) on one
/// blocking thread: one hop for the call instead of one per step.
/// Its awaits on the network still work there, woken by the runtime.
pub async fn call<T, F>(what: &'static str, call: F) -> CsiResult<T>
where
    T: Send + 'static,
    F: Future<Output = CsiResult<T>> + Send + 'static,
{
    call_within(IN_FLIGHT.get().map(|b| &b.turns), what, call).await
}

/// Calls on blocking threads at once, when bounded (`limit_calls`).
static IN_FLIGHT: OnceLock<Bound> = OnceLock::new();

struct Bound {
    turns: Semaphore,
    size: usize,
}

/// How many calls hold a turn on a blocking thread now (the caller's
/// included); `None` when calls are not bounded and so not counted.
pub fn calls_in_flight() -> Option<usize> {
    IN_FLIGHT.get().map(Bound::taken)
}

impl Bound {
    fn new(size: usize) -> Self {
        Bound {
            turns: Semaphore::new(size),
            size,
        }
    }

    /// Turns held now.
    fn taken(&self) -> usize {
        self.size.saturating_sub(self.turns.available_permits())
    }
}

/// Bounds the calls that run on blocking threads at once; the rest wait
/// for a turn on the async thread, where waiting costs a few bytes, not a
/// thread. Set once, at start.
///
/// Each call in flight holds a thread (its stack, its share of malloc's
/// arenas) and, past what the cores and the disk can serve, adds only
/// threads. With 64 clients on 2 cores (alternating runs): a bound of 32
/// served 383-441 lifecycles/s against 377-451 with none, at a peak RSS
/// of 26-28 MB against 28-31 MB (84 threads); a bound of 16 went down to
/// 22 MB but lost 10-15 % of the throughput, its rounds sharing fewer
/// syncs. A call cut short by its time limit gives its turn back at once,
/// even if its thread is still stuck in the kernel.
pub fn limit_calls(n: usize) {
    if IN_FLIGHT.set(Bound::new(n.max(1))).is_err() {
        tracing::warn!("the bound on calls in flight was set already");
    }
}

async fn call_within<T, F>(bound: Option<&Semaphore>, what: &'static str, call: F) -> CsiResult<T>
where
    T: Send + 'static,
    F: Future<Output = CsiResult<T>> + Send + 'static,
{
    if may_block() {
        return call.await;
    }
    let _turn = match bound {
        Some(bound) => Some(
            bound
                .acquire()
                .await
                .map_err(|e| CsiError::Internal(format!("{what} failed: {e}")))?,
        ),
        None => None,
    };
    let runtime = tokio::runtime::Handle::current();
    blocking(move || runtime.block_on(call))
        .await
        .map_err(|e| CsiError::Internal(format!("{what} failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpc::status::CsiCode;

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
    async fn a_bound_caps_the_calls_in_flight_and_a_dropped_call_gives_its_turn_back() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let bound = Semaphore::new(2);
        let (now, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let calls = (0..6).map(|_| {
            let (now, most) = (now.clone(), most.clone());
            call_within(Some(&bound), "NodeStageVolume", async move {
                let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(n, Ordering::SeqCst);
                std::thread::sleep(std::time::Duration::from_millis(30));
                now.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            })
        });
        for r in futures::future::join_all(calls).await {
            assert!(r.is_ok());
        }
        assert_eq!(most.load(Ordering::SeqCst), 2, "two at once, never more");

        // A call stuck in its thread and abandoned (a time limit) frees
        // its turn: the next call runs although that thread is still held.
        let one = Semaphore::new(1);
        let (release, stuck) = std::sync::mpsc::channel::<()>();
        let hung = call_within(Some(&one), "NodePublishVolume", async move {
            let _ = stuck.recv();
            Ok(())
        });
        let after = call_within(Some(&one), "NodePublishVolume", async { Ok(()) });
        let _ = tokio::time::timeout(std::time::Duration::from_millis(50), hung).await;
        let next = tokio::time::timeout(std::time::Duration::from_secs(5), after).await;
        assert!(
            matches!(next, Ok(Ok(()))),
            "the abandoned call's turn came back"
        );
        let _ = release.send(());
    }

    #[tokio::test]
    async fn the_calls_in_flight_are_the_turns_taken() {
        let bound = Bound::new(3);
        assert_eq!(bound.taken(), 0);
        let one = bound.turns.acquire().await.unwrap();
        let two = bound.turns.acquire().await.unwrap();
        assert_eq!(bound.taken(), 2);
        drop(one);
        assert_eq!(bound.taken(), 1);
        drop(two);
        assert_eq!(bound.taken(), 0);
    }

    // Two calls handed over back to back while one thread is idle: the
    // second must not queue behind the first, which may be a mount that
    // hangs for minutes.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_never_waits_behind_a_hung_one() {
        for _ in 0..20 {
            // Leaves a thread idle, as after any call.
            start(|| ()).await.unwrap();
            let (release, stuck) = std::sync::mpsc::channel::<()>();
            let hung = start(move || stuck.recv().is_ok());
            let next = start(|| 7);
            let answer = tokio::time::timeout(std::time::Duration::from_secs(5), next).await;
            release.send(()).unwrap();
            assert!(hung.await.unwrap());
            assert!(
                matches!(answer, Ok(Ok(7))),
                "the second call waited behind the hung one"
            );
        }
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
