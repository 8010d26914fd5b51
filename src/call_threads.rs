//! The threads work off the async thread runs on: whole calls and single
//! blocking steps (see `offload`).
//!
//! Tokio's blocking pool counts a thread idle only once it is back waiting
//! for work, after the call it ran has woken the async thread. Under load
//! the next call is handed over in between, finds no idle thread and starts
//! one more: with at most 32 local calls in flight, 64 clients kept 70-85
//! threads, whose stacks and malloc caches took the peak resident memory
//! with 10,000 volumes from 30 to 33-34 MB. A thread here counts itself
//! idle before it hands its answer back, so the caller's next call finds
//! it.
//!
//! Threads are made as calls need them, so a call stuck in the kernel keeps
//! its thread and the next call gets another, up to a bound past which calls
//! wait for a thread; one idle for its keep-alive ends.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::unpoisoned::lock;

/// Hands a finished call's answer to its caller.
type Answer = Box<dyn FnOnce() + Send>;
type Job = Box<dyn FnOnce() -> Answer + Send>;

pub struct CallThreads {
    name: &'static str,
    /// Threads at most; more calls wait in the queue.
    max: usize,
    keep_alive: Duration,
    state: Mutex<State>,
    work: Condvar,
    /// Makes the next thread starts fail, as when the process is out of
    /// threads or memory.
    #[cfg(test)]
    refuse_threads: std::sync::atomic::AtomicBool,
}

struct State {
    queue: VecDeque<Job>,
    threads: usize,
    /// Threads that will look at the queue again without being woken
    /// (they hand an answer over) or that wait to be woken.
    idle: usize,
}

/// A call that gave no answer: its thread could not be started, or the
/// call panicked.
#[derive(Debug)]
pub struct NoAnswer(String);

impl fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl CallThreads {
    pub const fn new(name: &'static str, max: usize, keep_alive: Duration) -> Self {
        CallThreads {
            name,
            max,
            keep_alive,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                threads: 0,
                idle: 0,
            }),
            work: Condvar::new(),
            #[cfg(test)]
            refuse_threads: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Runs `f` on one of these threads; the answer is awaited on the
    /// caller's.
    pub fn run<T, F>(&'static self, f: F) -> impl Future<Output = Result<T, NoAnswer>>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move || {
            let out = f();
            Box::new(move || {
                let _ = tx.send(out);
            })
        });
        let submitted = self.submit(job);
        async move {
            submitted?;
            rx.await.map_err(|_| {
                NoAnswer("the call ended without an answer (it panicked, or no thread could run it); see the log".into())
            })
        }
    }

    fn submit(&'static self, job: Job) -> Result<(), NoAnswer> {
        let mut st = lock(&self.state);
        st.queue.push_back(job);
        if st.idle > 0 {
            self.work.notify_one();
            return Ok(());
        }
        if st.threads >= self.max {
            return Ok(());
        }
        st.threads += 1;
        drop(st);
        let Err(e) = self.start() else {
            return Ok(());
        };
        let mut st = lock(&self.state);
        st.threads -= 1;
        let running = st.threads;
        if running > 0 {
            // The call is queued and a running thread will take it, as
            // past the bound. Failing its caller now would leave the call
            // to run after the CO was told it failed.
            drop(st);
            tracing::warn!(threads = running, error = %e,
                "cannot start another call thread; the call waits for a running one");
            return Ok(());
        }
        // Nobody would ever take what waits: each caller hears.
        let orphans = std::mem::take(&mut st.queue);
        drop(st);
        drop(orphans);
        Err(NoAnswer(format!(
            "cannot start a thread for the call: {e}; the process is out of threads or memory"
        )))
    }

    fn start(&'static self) -> std::io::Result<()> {
        #[cfg(test)]
        if self
            .refuse_threads
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(nix::errno::Errno::EAGAIN.into());
        }
        std::thread::Builder::new()
            .name(self.name.into())
            .spawn(move || self.serve())
            .map(drop)
    }

    fn serve(&self) {
        crate::offload::mark_may_block();
        let mut st = lock(&self.state);
        loop {
            if let Some(job) = st.queue.pop_front() {
                drop(st);
                // A panic drops the answer's sender: its caller hears.
                let answer = catch_unwind(AssertUnwindSafe(job));
                st = lock(&self.state);
                if let Ok(answer) = answer {
                    st.idle += 1;
                    drop(st);
                    answer();
                    st = lock(&self.state);
                    st.idle -= 1;
                }
                continue;
            }
            st.idle += 1;
            let (guard, waited) = self
                .work
                .wait_timeout(st, self.keep_alive)
                .unwrap_or_else(|p| p.into_inner());
            st = guard;
            st.idle -= 1;
            if waited.timed_out() && st.queue.is_empty() {
                st.threads -= 1;
                return;
            }
        }
    }

    /// Threads alive now.
    #[cfg(test)]
    fn threads(&self) -> usize {
        lock(&self.state).threads
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    fn pool(max: usize, keep_alive_ms: u64) -> &'static CallThreads {
        Box::leak(Box::new(CallThreads::new(
            "test-call",
            max,
            Duration::from_millis(keep_alive_ms),
        )))
    }

    // What tokio's pool did not do: the next call, handed over as soon as
    // the previous answer arrives, finds the thread that gave it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_call_after_another_takes_the_same_thread() {
        let calls = pool(64, 10_000);
        let first = calls.run(|| std::thread::current().id()).await.unwrap();
        for _ in 0..500 {
            let id = calls.run(|| std::thread::current().id()).await.unwrap();
            assert_eq!(id, first);
        }
        assert_eq!(calls.threads(), 1);
        assert!(calls.run(crate::offload::may_block).await.unwrap());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_calls_get_threads_and_a_stuck_one_blocks_no_other() {
        let calls = pool(64, 10_000);
        let (release, stuck) = mpsc::channel::<()>();
        let hung = calls.run(move || stuck.recv().is_ok());
        // Eight at once, each waiting for all: only eight threads can
        // answer them, beside the stuck one.
        let gate = std::sync::Arc::new(std::sync::Barrier::new(8));
        let many = (0..8).map(|i| {
            let gate = gate.clone();
            calls.run(move || {
                gate.wait();
                i
            })
        });
        let answers = futures::future::join_all(many).await;
        let answers: Vec<usize> = answers.into_iter().map(Result::unwrap).collect();
        assert_eq!(answers, (0..8).collect::<Vec<_>>());
        assert_eq!(calls.threads(), 9);
        release.send(()).unwrap();
        assert!(hung.await.unwrap());
    }

    #[tokio::test]
    async fn a_panic_is_an_answer_and_the_thread_serves_on() {
        let calls = pool(1, 10_000);
        let e = calls.run(|| -> () { panic!("a bug") }).await.unwrap_err();
        assert!(e.to_string().contains("panicked"), "{e}");
        assert_eq!(calls.run(|| 7).await.unwrap(), 7);
        assert_eq!(calls.threads(), 1);
    }

    fn refuse_threads(calls: &CallThreads, refuse: bool) {
        calls
            .refuse_threads
            .store(refuse, std::sync::atomic::Ordering::Relaxed);
    }

    #[tokio::test]
    async fn a_call_no_thread_can_run_fails_without_running_later() {
        let calls = pool(4, 10_000);
        refuse_threads(calls, true);
        let ran = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let r = ran.clone();
        let e = calls
            .run(move || r.store(true, std::sync::atomic::Ordering::SeqCst))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("cannot start a thread"), "{e}");
        refuse_threads(calls, false);
        assert_eq!(calls.run(|| 3).await.unwrap(), 3, "threads start again");
        assert!(
            !ran.load(std::sync::atomic::Ordering::SeqCst),
            "the failed call was dropped, not run by the next thread"
        );
    }

    // Told it failed, the CO retries; the call must not also run later.
    #[tokio::test]
    async fn a_call_that_gets_no_new_thread_waits_for_a_running_one() {
        let calls = pool(4, 10_000);
        let (release, stuck) = mpsc::channel::<()>();
        let hung = calls.run(move || stuck.recv().is_ok());
        tokio::time::sleep(Duration::from_millis(20)).await;
        refuse_threads(calls, true);
        let second = tokio::spawn(calls.run(|| 5));
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!second.is_finished(), "it waits for the running thread");
        release.send(()).unwrap();
        assert!(hung.await.unwrap());
        assert_eq!(second.await.unwrap().unwrap(), 5);
        assert_eq!(calls.threads(), 1);
    }

    #[tokio::test]
    async fn past_the_bound_calls_wait_and_idle_threads_end() {
        let calls = pool(1, 50);
        let (release, stuck) = mpsc::channel::<()>();
        let order = std::sync::Arc::new(Mutex::new(Vec::new()));
        let o = order.clone();
        let first = calls.run(move || {
            let _ = stuck.recv();
            o.lock().unwrap().push(1);
        });
        let o = order.clone();
        let second = calls.run(move || o.lock().unwrap().push(2));
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(calls.threads(), 1, "no second thread past the bound");
        assert!(order.lock().unwrap().is_empty(), "the second waits");
        release.send(()).unwrap();
        first.await.unwrap();
        second.await.unwrap();
        assert_eq!(*order.lock().unwrap(), vec![1, 2]);
        let mut waited = 0;
        while calls.threads() > 0 && waited < 100 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            waited += 1;
        }
        assert_eq!(
            calls.threads(),
            0,
            "an idle thread ends after its keep-alive"
        );
        assert_eq!(calls.run(|| 1).await.unwrap(), 1, "and one is made again");
    }
}
