//! Retry delays that double after each failure, up to a ceiling: work that
//! failed for a reason that may pass (a full disk, an API server away) is
//! tried again without hammering what failed.

use std::future::Future;
use std::time::Duration;

/// The delay before retry number `failures` (1 = the first): `base`,
/// doubled per further failure, at most `max`.
pub fn doubling(failures: u32, base: Duration, max: Duration) -> Duration {
    let exponent = failures.saturating_sub(1).min(16);
    base.saturating_mul(1u32 << exponent).min(max)
}

/// Runs `attempt` until it succeeds, sleeping [`doubling`] delays between
/// failures, and logs each failure with `what` and the wait before the next
/// try.
pub async fn until_ok<T, E, F, Fut>(what: &str, base: Duration, max: Duration, mut attempt: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut failures = 0u32;
    loop {
        match attempt().await {
            Ok(done) => return done,
            Err(e) => {
                failures = failures.saturating_add(1);
                let delay = doubling(failures, base, max);
                tracing::error!(error = %e, failures, retry_in_secs = delay.as_secs_f64(), "{what} failed; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_the_base_up_to_the_ceiling() {
        let ms: Vec<u128> = [0, 1, 2, 3, 4, u32::MAX]
            .into_iter()
            .map(|n| doubling(n, Duration::from_millis(250), Duration::from_secs(1)).as_millis())
            .collect();
        assert_eq!(ms, [250, 250, 500, 1000, 1000, 1000]);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_retried_after_growing_waits_until_one_succeeds() {
        let started = tokio::time::Instant::now();
        let mut tries = 0;
        let value = until_ok(
            "test work",
            Duration::from_secs(1),
            Duration::from_secs(3),
            || {
                tries += 1;
                let n = tries;
                async move {
                    if n <= 4 {
                        Err(format!("attempt {n} refused"))
                    } else {
                        Ok(n * 10)
                    }
                }
            },
        )
        .await;
        assert_eq!((value, tries), (50, 5), "four failures, then a success");
        // 1 + 2 + 3 + 3 s of waits: doubled, then held at the ceiling.
        assert_eq!(started.elapsed(), Duration::from_secs(9));
    }
}
