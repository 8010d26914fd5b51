//! The write fence: until when this process may write to the clusters.
//!
//! Without `--leader-election` it is always open. With it, it opens only
//! for the time a renewal of the leader Lease has bought: a renewal sent at
//! instant `t` keeps it open until `t + lease − margin`, and nothing else
//! extends it. A standby computes the Lease's expiry from when it *saw*
//! the renewal (never earlier than `t`), on its own clock, so the old
//! leader's last write is sent at least `margin` before anyone else can
//! lead, whatever the wall clocks of the two nodes say. Once it has been
//! open and closes, it stays closed: the process steps down and exits.
//!
//! Every kube client of the process goes through [`FenceLayer`] (see
//! `k8s::connect`), so the rule holds for every write, host and member,
//! whichever module makes it; the Lease's own client does not.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

pub struct Fence {
    base: Instant,
    /// Milliseconds after `base` until which writes are allowed;
    /// `u64::MAX` while no election is asked for.
    until_ms: AtomicU64,
    /// Set once the fence closes after having been open: never reopens.
    stepped_down: AtomicBool,
    /// The leader term this process writes under (-1: no election). The
    /// RelayVolume CRD refuses a write whose term is older than the last
    /// one: the API server's half of the fence, for writes sent in time
    /// but delivered late.
    term: AtomicI64,
}

static FENCE: OnceLock<Fence> = OnceLock::new();

/// The process's fence.
pub fn fence() -> &'static Fence {
    FENCE.get_or_init(Fence::open)
}

/// Why a write was refused: what the refused call reports.
pub const REFUSED: &str = "this csi-relay replica does not hold a fresh leader Lease (it could not renew it in time, or another replica leads): the write was not sent";

impl Fence {
    fn open() -> Self {
        Fence {
            base: Instant::now(),
            until_ms: AtomicU64::new(u64::MAX),
            stepped_down: AtomicBool::new(false),
            term: AtomicI64::new(-1),
        }
    }

    /// A fence that is closed until [`Fence::extend_to`]: a process that
    /// elects itself before writing.
    pub fn closed() -> Self {
        let f = Self::open();
        f.until_ms.store(0, Ordering::Release);
        f
    }

    /// Makes the process fence closed until a Lease renewal extends it.
    /// Called once, before any client is made.
    pub fn require_lease(&self) {
        self.until_ms.store(0, Ordering::Release);
    }

    fn at(&self, ms: u64) -> Option<Instant> {
        (ms != u64::MAX).then(|| self.base + Duration::from_millis(ms))
    }

    /// Extends writes to `until` (never shortens them); ignored once
    /// stepped down.
    pub fn extend_to(&self, until: Instant) {
        if self.stepped_down.load(Ordering::Acquire) {
            return;
        }
        let ms = until.saturating_duration_since(self.base).as_millis() as u64;
        self.until_ms
            .fetch_max(ms.min(u64::MAX - 1), Ordering::AcqRel);
    }

    /// The term this process leads in (the leader Lease's transitions once
    /// it took it); set before the fence first opens.
    pub fn set_term(&self, term: i64) {
        self.term.store(term.max(0), Ordering::Release);
    }

    /// The term writes carry; `None` without an election.
    pub fn term(&self) -> Option<i64> {
        let t = self.term.load(Ordering::Acquire);
        (t >= 0).then_some(t)
    }

    /// Closes for good: the Lease is lost or given up.
    pub fn step_down(&self) {
        self.stepped_down.store(true, Ordering::Release);
        self.until_ms.store(0, Ordering::Release);
    }

    pub fn stepped_down(&self) -> bool {
        self.stepped_down.load(Ordering::Acquire)
    }

    /// Until when writes are allowed; `None` without an election.
    pub fn until(&self) -> Option<Instant> {
        self.at(self.until_ms.load(Ordering::Acquire))
    }

    /// Whether a write may be sent now.
    pub fn allows(&self) -> bool {
        match self.until() {
            None => true,
            Some(until) => Instant::now() < until,
        }
    }

    /// Resolves once writes are no longer allowed, following extensions
    /// made meanwhile; never, without an election.
    pub async fn expired(&self) {
        loop {
            match self.until() {
                None => std::future::pending::<()>().await,
                Some(until) if Instant::now() >= until => return,
                Some(until) => tokio::time::sleep_until(until).await,
            }
        }
    }
}

/// Puts a fence before a kube client's service: requests that change
/// something (every method but GET, HEAD and OPTIONS) are refused when the
/// fence is closed, and cut when it closes while they are in flight, so a
/// write held somewhere (a partition) is not delivered once another replica
/// may lead. Reads and watches pass: a standby keeps its views warm.
#[derive(Clone, Copy)]
pub struct FenceLayer {
    fence: &'static Fence,
}

impl FenceLayer {
    pub fn new(fence: &'static Fence) -> Self {
        FenceLayer { fence }
    }
}

impl<S> tower::Layer<S> for FenceLayer {
    type Service = Fenced<S>;
    fn layer(&self, inner: S) -> Fenced<S> {
        Fenced {
            inner,
            fence: self.fence,
        }
    }
}

#[derive(Clone)]
pub struct Fenced<S> {
    inner: S,
    fence: &'static Fence,
}

/// What a fenced request fails with.
#[derive(Debug)]
pub struct FencedOff {
    pub in_flight: bool,
}

impl std::fmt::Display for FencedOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.in_flight {
            write!(f, "{REFUSED} (cut while in flight)")
        } else {
            f.write_str(REFUSED)
        }
    }
}

impl std::error::Error for FencedOff {}

fn writes(method: &http::Method) -> bool {
    !matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    )
}

impl<S, B> tower::Service<http::Request<B>> for Fenced<S>
where
    S: tower::Service<http::Request<B>>,
    S::Error: Into<tower::BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = tower::BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<S::Response, tower::BoxError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let fence = self.fence;
        if !writes(req.method()) || fence.until().is_none() {
            let call = self.inner.call(req);
            return Box::pin(async move { call.await.map_err(Into::into) });
        }
        if !fence.allows() {
            return Box::pin(async { Err(FencedOff { in_flight: false }.into()) });
        }
        let call = self.inner.call(req);
        Box::pin(async move {
            // The fence first: a process thawed after its fence closed drops
            // the request before it is polled again, and hyper does not
            // write a request whose caller has gone.
            tokio::select! {
                biased;
                () = fence.expired() => Err(FencedOff { in_flight: true }.into()),
                done = call => done.map_err(Into::into),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    fn leaked(f: Fence) -> &'static Fence {
        Box::leak(Box::new(f))
    }

    /// A service that answers after `delay`, counting what reached it.
    fn slow(
        delay: Duration,
        reached: std::sync::Arc<AtomicU64>,
    ) -> impl tower::Service<
        http::Request<()>,
        Response = &'static str,
        Error = tower::BoxError,
        Future = impl Send + 'static,
    > + Clone {
        tower::service_fn(move |_req: http::Request<()>| {
            let reached = reached.clone();
            async move {
                reached.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                Ok::<_, tower::BoxError>("done")
            }
        })
    }

    fn req(method: http::Method) -> http::Request<()> {
        http::Request::builder()
            .method(method)
            .uri("/api/v1/namespaces/x/persistentvolumeclaims")
            .body(())
            .unwrap_or_default()
    }

    #[tokio::test(start_paused = true)]
    async fn a_closed_fence_sends_no_write_and_lets_reads_pass() {
        let fence = leaked(Fence::closed());
        let reached = std::sync::Arc::new(AtomicU64::new(0));
        let mut svc = FenceLayer::new(fence).layer(slow(Duration::ZERO, reached.clone()));
        let refused = svc.ready().await.map(|s| s.call(req(http::Method::POST)));
        let err = match refused {
            Ok(f) => f.await.err(),
            Err(e) => Some(e),
        };
        let err = err.map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("does not hold a fresh leader Lease"), "{err}");
        assert_eq!(reached.load(Ordering::SeqCst), 0, "the write was sent");
        for read in [http::Method::GET, http::Method::HEAD] {
            let got = svc.ready().await.map(|s| s.call(req(read)));
            assert!(got.is_ok());
            if let Ok(f) = got {
                assert_eq!(f.await.ok(), Some("done"));
            }
        }
        assert_eq!(reached.load(Ordering::SeqCst), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_in_flight_is_cut_when_the_fence_closes_and_not_when_it_is_extended() {
        let fence = leaked(Fence::closed());
        fence.extend_to(Instant::now() + Duration::from_secs(2));
        let reached = std::sync::Arc::new(AtomicU64::new(0));
        let mut svc = FenceLayer::new(fence).layer(slow(Duration::from_secs(5), reached.clone()));
        // Extended while in flight (a renewal): the write completes.
        let long = svc.ready().await.map(|s| s.call(req(http::Method::PATCH)));
        let renew = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            fence.extend_to(Instant::now() + Duration::from_secs(10));
        };
        let (got, ()) = tokio::join!(
            async {
                match long {
                    Ok(f) => f.await.ok(),
                    Err(_) => None,
                }
            },
            renew
        );
        assert_eq!(got, Some("done"));
        // No more renewals: a write longer than what is left is cut at the
        // deadline (11 s after the start; 5 s have passed).
        let mut svc = FenceLayer::new(fence).layer(slow(Duration::from_secs(20), reached.clone()));
        let started = Instant::now();
        let cut = svc.ready().await.map(|s| s.call(req(http::Method::DELETE)));
        let err = match cut {
            Ok(f) => f.await.err().map(|e| e.to_string()),
            Err(e) => Some(e.to_string()),
        };
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("cut while in flight")),
            "{err:?}"
        );
        assert_eq!(started.elapsed(), Duration::from_secs(6));
        assert!(!fence.allows());
    }

    #[tokio::test(start_paused = true)]
    async fn a_fence_that_stepped_down_never_reopens() {
        let fence = leaked(Fence::closed());
        assert!(!fence.allows());
        fence.extend_to(Instant::now() + Duration::from_secs(5));
        assert!(fence.allows());
        // An extension never shortens.
        fence.extend_to(Instant::now() + Duration::from_secs(1));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(fence.allows());
        fence.step_down();
        assert!(!fence.allows());
        fence.extend_to(Instant::now() + Duration::from_secs(60));
        assert!(
            !fence.allows(),
            "a late renewal reopened a stepped-down fence"
        );
        // Without an election: always open.
        assert!(leaked(Fence::open()).allows());
    }
}
