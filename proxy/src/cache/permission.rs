//! Whether a caller's read may be answered from a copy without asking etcd first. A copy holds whatever etcd let
//! the reader that filled it read, and etcd's auth can be turned on, and permissions revoked, directly on etcd at
//! any time: so a read is checked with etcd (a `count_only`, `limit 1` read of its range with its token) whenever
//! auth may be on. Auth may be on once a caller presented a token or etcd refused one for want of rights; until
//! then a read without a token is checked at most once per [`ANONYMOUS_CHECK_EVERY`], which bounds how long auth
//! turned on directly on etcd goes unnoticed.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;

/// How often a read without a token is checked with etcd while auth has not been seen.
pub const ANONYMOUS_CHECK_EVERY: Duration = Duration::from_secs(1);

/// What the cache knows of etcd's auth.
#[derive(Default)]
pub struct Permissions {
    auth_seen: AtomicBool,
    anonymous_checked_at: Mutex<Option<Instant>>,
}

impl Permissions {
    /// Whether a read with `token` must be checked with etcd before a copy answers it.
    pub fn must_check(&self, token: Option<&str>) -> bool {
        if token.is_some() {
            self.auth_seen.store(true, Ordering::Release);
            return true;
        }
        if self.auth_seen.load(Ordering::Acquire) {
            return true;
        }
        let checked = self
            .anonymous_checked_at
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        checked.is_none_or(|at| at.elapsed() >= ANONYMOUS_CHECK_EVERY)
    }

    /// Records the outcome of a check made for a read with `token`.
    pub fn checked(&self, token: Option<&str>, outcome: &Result<i64, Status>) {
        match outcome {
            Err(status) if crate::error::is_auth_refusal(status) => {
                self.auth_seen.store(true, Ordering::Release);
            }
            Ok(_) if token.is_none() => {
                *self
                    .anonymous_checked_at
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn reads_without_a_token_are_checked_once_a_second_until_auth_is_seen() {
        let permissions = Permissions::default();
        assert!(permissions.must_check(None), "never checked yet");
        permissions.checked(None, &Ok(5));
        assert!(!permissions.must_check(None));
        tokio::time::advance(ANONYMOUS_CHECK_EVERY).await;
        assert!(permissions.must_check(None));
        permissions.checked(None, &Ok(6));
        assert!(!permissions.must_check(None));
        permissions.checked(
            None,
            &Err(Status::invalid_argument("etcdserver: user name is empty")),
        );
        assert!(permissions.must_check(None), "auth is on: every read");
        permissions.checked(None, &Ok(7));
        assert!(permissions.must_check(None), "and it stays so");
    }

    #[test]
    fn a_token_means_auth_may_be_on() {
        let permissions = Permissions::default();
        permissions.checked(None, &Ok(5));
        assert!(!permissions.must_check(None));
        assert!(permissions.must_check(Some("t")));
        assert!(permissions.must_check(None));
    }
}
