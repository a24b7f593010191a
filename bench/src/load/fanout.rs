//! Per-put fan-out: how many watchers got each put's event and when the last of them got it.
//!
//! A put's fan-out latency is the time from its issue to the moment its *last* watcher received it: that is what
//! a broadcast costs the slowest client, and what issue 5 bounds. Each Watch stream keeps its own
//! [`PutDeliveries`] (no sharing on the hot path); the streams' tallies are merged once the run is over.

use std::time::Duration;

use tokio::time::Instant;

use super::recorder::{Latency, Recorder};

/// Deliveries of each put, by the put's sequence number.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PutDeliveries {
    /// Watchers that received put `seq`.
    counts: Vec<u64>,
    /// When the last of them received it.
    last: Vec<Option<Instant>>,
}

/// The fan-out of every put of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct FanoutSummary {
    /// Puts every watcher received.
    pub complete: u64,
    /// Puts some watcher never received: their fan-out never finished, so they have no latency.
    pub incomplete: u64,
    /// Deliveries that never came: over the issued puts, the watchers each put fell short of.
    pub missing: u64,
    /// Put to last delivery over the complete puts; None if none was complete.
    pub latency: Option<Latency>,
}

impl PutDeliveries {
    pub fn new(puts: usize) -> Self {
        Self {
            counts: vec![0; puts],
            last: vec![None; puts],
        }
    }

    /// One watcher received put `seq` at `at`. Sequence numbers beyond the planned puts are ignored (the caller
    /// reports them as errors).
    pub fn record(&mut self, seq: usize, at: Instant) {
        if let (Some(count), Some(last)) = (self.counts.get_mut(seq), self.last.get_mut(seq)) {
            *count += 1;
            *last = Some(last.map_or(at, |l| l.max(at)));
        }
    }

    /// Adds another stream's deliveries: counts add up, the last delivery is the later one.
    pub fn merge(&mut self, other: &PutDeliveries) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
            self.last.resize(other.last.len(), None);
        }
        for (seq, (&count, &last)) in other.counts.iter().zip(&other.last).enumerate() {
            self.counts[seq] += count;
            self.last[seq] = match (self.last[seq], last) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
    }

    /// Fan-out of the puts that were issued (`issued[seq]`): a put is complete when at least `watchers` watchers
    /// received it (callers record a watcher's first delivery of a put only, so a duplicate cannot stand in for a
    /// watcher that missed it), and its latency runs from its issue to its last delivery.
    pub fn summarize(&self, issued: &[Option<Instant>], watchers: u64) -> FanoutSummary {
        let mut latencies = Recorder::new();
        let (mut complete, mut incomplete, mut missing) = (0, 0, 0);
        for (seq, issued_at) in issued.iter().enumerate() {
            let Some(issued_at) = issued_at else {
                continue;
            };
            let count = self.counts.get(seq).copied().unwrap_or(0);
            missing += watchers.saturating_sub(count);
            match self.last.get(seq).copied().flatten() {
                Some(last) if count >= watchers && watchers > 0 => {
                    complete += 1;
                    latencies.success(last.saturating_duration_since(*issued_at));
                }
                _ => incomplete += 1,
            }
        }
        FanoutSummary {
            complete,
            incomplete,
            missing,
            latency: latencies.tally(Duration::from_secs(1)).latency,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_puts_fan_out_latency_runs_to_its_last_delivery_across_streams() {
        let t0 = Instant::now();
        let issued = vec![Some(t0), Some(t0 + ms(100))];
        // Two streams of two watchers each; put 0 reaches its last watcher 30 ms after issue (on stream b),
        // put 1 after 7 ms (on stream a).
        let mut a = PutDeliveries::new(2);
        a.record(0, t0 + ms(5));
        a.record(0, t0 + ms(10));
        a.record(1, t0 + ms(101));
        a.record(1, t0 + ms(107));
        let mut b = PutDeliveries::new(2);
        b.record(0, t0 + ms(30));
        b.record(0, t0 + ms(2));
        b.record(1, t0 + ms(103));
        b.record(1, t0 + ms(102));
        a.merge(&b);
        let summary = a.summarize(&issued, 4);
        assert_eq!((summary.complete, summary.incomplete), (2, 0));
        let latency = summary.latency.expect("two complete puts");
        assert!((latency.p50_ms - 7.0).abs() < 0.1, "{latency:?}");
        assert!((latency.max_ms - 30.0).abs() < 0.1, "{latency:?}");
    }

    #[test]
    fn a_put_some_watcher_missed_is_incomplete_and_has_no_latency() {
        let t0 = Instant::now();
        let issued = vec![Some(t0), Some(t0 + ms(10)), None];
        let mut d = PutDeliveries::new(3);
        d.record(0, t0 + ms(1));
        d.record(0, t0 + ms(2));
        d.record(1, t0 + ms(900)); // one of two watchers only
        d.record(7, t0); // beyond the planned puts: ignored
        let summary = d.summarize(&issued, 2);
        assert_eq!((summary.complete, summary.incomplete), (1, 1));
        assert_eq!(summary.missing, 1, "put 1 reached one of its two watchers");
        let latency = summary.latency.expect("put 0 is complete");
        assert!((latency.max_ms - 2.0).abs() < 0.1, "{latency:?}");
    }

    #[test]
    fn without_watchers_or_deliveries_nothing_is_complete() {
        let t0 = Instant::now();
        let summary = PutDeliveries::new(1).summarize(&[Some(t0)], 3);
        assert_eq!(
            (summary.complete, summary.incomplete, summary.latency),
            (0, 1, None)
        );
        assert_eq!(summary.missing, 3);
        let summary = PutDeliveries::new(1).summarize(&[Some(t0)], 0);
        assert_eq!((summary.complete, summary.incomplete), (0, 1));
    }

    #[test]
    fn merging_a_longer_tally_extends_the_shorter() {
        let t0 = Instant::now();
        let mut short = PutDeliveries::new(1);
        let mut long = PutDeliveries::new(2);
        long.record(1, t0 + ms(4));
        short.merge(&long);
        assert_eq!(short, long);
    }
}
