//! How often a client may ping: grpc-go's keep-alive enforcement, which etcd and etcd's proxy apply to every client
//! connection (`--grpc-keepalive-min-time`, clients' pings never permitted without a stream).
//!
//! A ping that comes sooner than allowed after the previous one is a strike; the third strike ends the connection
//! with GOAWAY `ENHANCE_YOUR_CALM` "too_many_pings" (grpc-go clients then double their keep-alive time). Sending
//! the client headers or data forgives the strikes: a client's BDP and keep-alive pings that answer traffic are
//! not abuse.

use std::time::Duration;

use tokio::time::Instant;

/// grpc-go's `maxPingStrikes`: strikes beyond this many end the connection.
const MAX_STRIKES: u8 = 2;
/// Without an open stream a client should not need to ping at all; grpc-go allows one ping per two hours.
const WITHOUT_STREAMS: Duration = Duration::from_secs(2 * 60 * 60);
/// What grpc-go enforces when no minimum is configured, as etcd does with `--grpc-keepalive-min-time=0`.
pub const GRPC_DEFAULT_MIN_TIME: Duration = Duration::from_secs(5 * 60);

#[derive(Debug)]
pub struct PingPolicy {
    min_time: Duration,
    last_ping: Option<Instant>,
    strikes: u8,
    /// Headers or data went to the client since the last ping.
    forgiven: bool,
}

impl PingPolicy {
    /// `min_time` zero means grpc-go's default, as in etcd.
    pub fn new(min_time: Duration) -> Self {
        Self {
            min_time: if min_time.is_zero() {
                GRPC_DEFAULT_MIN_TIME
            } else {
                min_time
            },
            last_ping: None,
            strikes: 0,
            forgiven: false,
        }
    }

    /// The proxy sent the client headers or data.
    pub fn sent_to_client(&mut self) {
        self.forgiven = true;
    }

    /// A ping (not an acknowledgement) arrived at `now`; `streams_open` says whether any call is in progress on the
    /// connection. Returns true when the client has pinged too often and the connection must end.
    pub fn ping(&mut self, now: Instant, streams_open: bool) -> bool {
        let previous = self.last_ping.replace(now);
        if std::mem::take(&mut self.forgiven) {
            self.strikes = 0;
            return false;
        }
        let allowed = if streams_open {
            self.min_time
        } else {
            WITHOUT_STREAMS
        };
        if previous.is_some_and(|previous| now.duration_since(previous) < allowed) {
            self.strikes += 1;
        }
        self.strikes > MAX_STRIKES
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(5);

    /// Pings at the given offsets (from the first) with streams open; the index of the ping that ends the
    /// connection, if any.
    fn ends_at(policy: &mut PingPolicy, offsets_ms: &[u64], streams_open: bool) -> Option<usize> {
        let start = Instant::now();
        offsets_ms
            .iter()
            .position(|&ms| policy.ping(start + Duration::from_millis(ms), streams_open))
    }

    #[test]
    fn the_third_early_ping_after_the_first_ends_the_connection() {
        let mut policy = PingPolicy::new(MIN);
        assert_eq!(ends_at(&mut policy, &[0, 1, 2, 3, 4], true), Some(3));
    }

    #[test]
    fn pings_at_the_minimum_interval_are_fine_forever() {
        let mut policy = PingPolicy::new(MIN);
        let offsets: Vec<u64> = (0..100).map(|i| i * 5_000).collect();
        assert_eq!(ends_at(&mut policy, &offsets, true), None);
    }

    #[test]
    fn strikes_accumulate_across_well_spaced_pings_as_in_grpc_go() {
        // grpc-go never decays strikes by time, only by sending the client something.
        let mut policy = PingPolicy::new(MIN);
        assert_eq!(
            ends_at(&mut policy, &[0, 1, 10_000, 10_001, 20_000, 20_001], true),
            Some(5)
        );
    }

    #[test]
    fn sending_to_the_client_forgives_strikes() {
        let mut policy = PingPolicy::new(MIN);
        let start = Instant::now();
        for i in 0..50 {
            policy.sent_to_client();
            assert!(
                !policy.ping(start + Duration::from_millis(i), true),
                "ping {i}"
            );
        }
    }

    #[test]
    fn without_streams_even_slow_pings_strike() {
        let mut policy = PingPolicy::new(MIN);
        assert_eq!(
            ends_at(&mut policy, &[0, 60_000, 120_000, 180_000], false),
            Some(3)
        );
    }

    #[test]
    fn zero_means_grpc_gos_default_of_five_minutes() {
        let mut policy = PingPolicy::new(Duration::ZERO);
        assert_eq!(
            ends_at(&mut policy, &[0, 299_000, 598_000, 897_000], true),
            Some(3)
        );
        let mut policy = PingPolicy::new(Duration::ZERO);
        assert_eq!(
            ends_at(&mut policy, &[0, 300_000, 600_000, 900_000], true),
            None
        );
    }
}
