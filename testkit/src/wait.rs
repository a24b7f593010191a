//! Waiting on a condition with a deadline: the only way the kit and its users wait for anything.

use std::future::Future;
use std::time::Duration;

/// How often a condition is polled.
const POLL: Duration = Duration::from_millis(25);

/// Polls `check` until it returns `Ok`, and returns that value. After `timeout` it panics with `what` and the
/// last error `check` reported.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    match try_wait_for(timeout, check).await {
        Ok(v) => v,
        Err(last) => panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}"),
    }
}

/// Like [`wait_for`], but returns the last error instead of panicking at the deadline.
pub async fn try_wait_for<T, F, Fut>(timeout: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_first_ok_is_returned() {
        let mut n = 0;
        let got = try_wait_for(Duration::from_secs(5), || {
            n += 1;
            let seen = n;
            async move {
                if seen == 3 {
                    Ok(seen)
                } else {
                    Err(format!("{seen}"))
                }
            }
        })
        .await;
        assert_eq!(got, Ok(3));
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_error_is_returned_at_the_deadline() {
        let mut n = 0;
        let got: Result<(), String> = try_wait_for(Duration::from_secs(1), || {
            n += 1;
            let seen = n;
            async move { Err(format!("attempt {seen}")) }
        })
        .await;
        let last = got.expect_err("never ok");
        assert!(last.starts_with("attempt "), "{last}");
        assert!(n > 10, "polled only {n} times in a second");
    }
}
