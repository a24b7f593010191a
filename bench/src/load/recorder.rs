//! Per-worker tallies of one run: a latency histogram (microseconds), completed and failed requests, and the
//! first few error messages (so a report says what failed, not just how often).

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

/// Error messages kept per run; the rest are only counted.
const ERROR_SAMPLES: usize = 5;

pub struct Recorder {
    latency_us: Histogram<u64>,
    errors: u64,
    error_samples: Vec<String>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    pub fn new() -> Self {
        Self {
            // 1 us to 10 min at 3 significant digits (0.1% resolution). Every recorder has the same bounds, so
            // they add up without resizing.
            latency_us: Histogram::new_with_bounds(1, 600_000_000, 3)
                .expect("valid histogram bounds"),
            errors: 0,
            error_samples: Vec::new(),
        }
    }

    /// One request that succeeded after `latency`.
    pub fn success(&mut self, latency: Duration) {
        let us = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .max(1);
        self.latency_us.saturating_record(us);
    }

    /// One request that failed.
    pub fn failure(&mut self, what: impl std::fmt::Display) {
        self.errors += 1;
        if self.error_samples.len() < ERROR_SAMPLES {
            self.error_samples.push(what.to_string());
        }
    }

    pub fn merge(&mut self, other: &Recorder) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.latency_us.add(&other.latency_us);
        self.errors += other.errors;
        for sample in &other.error_samples {
            if self.error_samples.len() < ERROR_SAMPLES {
                self.error_samples.push(sample.clone());
            }
        }
    }

    pub fn completed(&self) -> u64 {
        self.latency_us.len()
    }

    /// What the run showed, with throughput over the measured `window`.
    pub fn tally(&self, window: Duration) -> Tally {
        let ms = |us: u64| us as f64 / 1000.0;
        let completed = self.completed();
        let latency = (completed > 0).then(|| Latency {
            p50_ms: ms(self.latency_us.value_at_quantile(0.50)),
            p99_ms: ms(self.latency_us.value_at_quantile(0.99)),
            max_ms: ms(self.latency_us.max()),
        });
        Tally {
            completed,
            errors: self.errors,
            error_samples: self.error_samples.clone(),
            seconds: window.as_secs_f64(),
            throughput: completed as f64 / window.as_secs_f64().max(1e-9),
            latency,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// The client's view of one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tally {
    /// Requests (or delivered watch events) that succeeded in the measured window.
    pub completed: u64,
    pub errors: u64,
    pub error_samples: Vec<String>,
    /// Length of the measured window.
    pub seconds: f64,
    /// `completed` per second.
    pub throughput: f64,
    /// None when nothing completed.
    pub latency: Option<Latency>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_throughput_come_from_the_recorded_latencies() {
        let mut a = Recorder::new();
        let mut b = Recorder::new();
        for ms in 1..=50 {
            a.success(Duration::from_millis(ms));
        }
        for ms in 51..=100 {
            b.success(Duration::from_millis(ms));
        }
        b.failure("Unavailable: connection reset");
        a.merge(&b);
        let tally = a.tally(Duration::from_secs(2));
        assert_eq!((tally.completed, tally.errors), (100, 1));
        assert_eq!(tally.throughput, 50.0);
        let latency = tally.latency.expect("latencies were recorded");
        assert!((latency.p50_ms - 50.0).abs() < 0.1, "{latency:?}");
        assert!((latency.p99_ms - 99.0).abs() < 0.1, "{latency:?}");
        assert!((latency.max_ms - 100.0).abs() < 0.1, "{latency:?}");
        assert_eq!(
            tally.error_samples,
            vec!["Unavailable: connection reset".to_string()]
        );
    }

    #[test]
    fn latencies_of_seconds_are_not_clipped() {
        let mut r = Recorder::new();
        r.success(Duration::from_millis(1500));
        let latency = r
            .tally(Duration::from_secs(1))
            .latency
            .expect("one latency");
        assert!((latency.max_ms - 1500.0).abs() < 2.0, "{latency:?}");
    }

    #[test]
    fn a_run_without_completions_has_no_latency() {
        let tally = Recorder::new().tally(Duration::from_secs(1));
        assert_eq!((tally.completed, tally.latency), (0, None));
    }
}
