//! How long etcd usually takes to answer, learnt from the answers the proxy gets, and from that the bound past
//! which a wait is no longer usual.
//!
//! The estimate is TCP's retransmission timer (RFC 6298): a smoothed mean and a smoothed mean deviation, the bound
//! being the mean plus four deviations. Like TCP's, it adapts to a slow cluster (no spurious hedges or failovers
//! on a loaded link) and to a fast one (a hung member is noticed in a few of its usual answer times), and the
//! caller clamps it to a floor and a ceiling of its own.

use std::sync::Mutex;
use std::time::Duration;

/// A learnt answer time. Thread-safe: every call that completes may feed it.
#[derive(Debug, Default)]
pub struct LatencyEstimate {
    state: Mutex<Option<Smoothed>>,
}

#[derive(Clone, Copy, Debug)]
struct Smoothed {
    mean: Duration,
    deviation: Duration,
}

impl LatencyEstimate {
    /// Feeds one answer time.
    pub fn observe(&self, sample: Duration) {
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *state = Some(match *state {
            // RFC 6298 §2.2: the first sample sets the mean, and half of it the deviation.
            None => Smoothed {
                mean: sample,
                deviation: sample / 2,
            },
            // §2.3, with its gains of 1/8 for the mean and 1/4 for the deviation.
            Some(Smoothed { mean, deviation }) => {
                let error = mean.abs_diff(sample);
                Smoothed {
                    mean: mean * 7 / 8 + sample / 8,
                    deviation: deviation * 3 / 4 + error / 4,
                }
            }
        });
    }

    /// The mean plus four deviations, within `[floor, ceiling]`; `ceiling` before any answer was seen.
    pub fn bound(&self, floor: Duration, ceiling: Duration) -> Duration {
        let state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match *state {
            None => ceiling,
            Some(Smoothed { mean, deviation }) => (mean + deviation * 4).clamp(floor, ceiling),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLOOR: Duration = Duration::from_millis(10);
    const CEILING: Duration = Duration::from_secs(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn before_any_answer_the_bound_is_the_ceiling() {
        assert_eq!(LatencyEstimate::default().bound(FLOOR, CEILING), CEILING);
    }

    #[test]
    fn steady_answers_bring_the_bound_down_to_a_few_answer_times() {
        let estimate = LatencyEstimate::default();
        for _ in 0..100 {
            estimate.observe(ms(20));
        }
        let bound = estimate.bound(FLOOR, CEILING);
        assert!(bound >= ms(20) && bound <= ms(25), "{bound:?}");
    }

    #[test]
    fn the_floor_holds_for_very_fast_answers() {
        let estimate = LatencyEstimate::default();
        for _ in 0..100 {
            estimate.observe(Duration::from_micros(200));
        }
        assert_eq!(estimate.bound(FLOOR, CEILING), FLOOR);
    }

    #[test]
    fn varied_answers_widen_the_bound() {
        let steady = LatencyEstimate::default();
        let varied = LatencyEstimate::default();
        for i in 0..100 {
            steady.observe(ms(50));
            varied.observe(if i % 2 == 0 { ms(10) } else { ms(90) });
        }
        assert!(varied.bound(FLOOR, CEILING) > steady.bound(FLOOR, CEILING) + ms(100));
    }

    #[test]
    fn a_slow_cluster_raises_the_bound_to_the_ceiling_and_no_further() {
        let estimate = LatencyEstimate::default();
        for _ in 0..100 {
            estimate.observe(ms(3000));
        }
        assert_eq!(estimate.bound(FLOOR, CEILING), CEILING);
    }
}
