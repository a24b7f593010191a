//! Meters a tree during a fan-out run, as the run's [`FanoutMeter`]: every process's CPU time when measuring starts
//! and when it ends, etcd's watcher gauges sampled every [`GAUGE_EVERY`] in between (and once more when the load
//! is in place), and every process's peak resident set at the end. A reading that fails is kept as a problem, so
//! the report shows it instead of a silent zero.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::etcd_gauges::{self, EtcdGauges, GaugesDuring};
use super::usage::{self, ByTier, PerProcess, Pids};
use crate::load::watch::FanoutMeter;
use crate::memory::RssReading;

/// How often etcd's gauges are read during the window.
const GAUGE_EVERY: Duration = Duration::from_millis(500);

/// What the probe saw over the measured window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// From the start of measuring (the first put is next) to its end (every delivery in, or the drain gave up).
    pub window_seconds: f64,
    /// CPU seconds per second of the window, by tier.
    pub cpu: Option<ByTier>,
    /// Peak resident set (`VmHWM`) of each process since it started, MiB, by tier.
    pub peak_rss_mib: Option<ByTier>,
    /// etcd's watchers and watch streams during the window.
    pub etcd: Option<GaugesDuring>,
    /// Readings that failed.
    pub problems: Vec<String>,
}

#[derive(Default)]
struct State {
    cpu_start: Option<(Instant, PerProcess<f64>)>,
    sampler: Option<JoinHandle<()>>,
    measured: Option<Measured>,
    problems: Vec<String>,
}

/// Meters etcd at `etcd_addr` and the processes of `pids`.
pub struct TreeProbe {
    etcd_addr: String,
    pids: Pids,
    state: Mutex<State>,
    gauges: Arc<Mutex<Vec<Result<EtcdGauges, String>>>>,
}

impl TreeProbe {
    pub fn new(etcd_addr: &str, pids: Pids) -> Self {
        Self {
            etcd_addr: etcd_addr.to_string(),
            pids,
            state: Mutex::new(State::default()),
            gauges: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record_gauges(
        gauges: &Mutex<Vec<Result<EtcdGauges, String>>>,
        reading: Result<EtcdGauges, String>,
    ) {
        gauges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(reading);
    }

    /// What the window measured; a probe whose window never ended says so in its problems.
    pub fn measured(&self) -> Measured {
        let state = self.state();
        state.measured.clone().unwrap_or_else(|| Measured {
            problems: [
                state.problems.clone(),
                vec!["the measured window never ended".into()],
            ]
            .concat(),
            ..Measured::default()
        })
    }
}

impl FanoutMeter for TreeProbe {
    /// Idle memory per watcher is the side-by-side benchmark's measurement, not this one's.
    async fn settled_proxy_rss(&self) -> Option<RssReading> {
        None
    }

    async fn start(&self) {
        let cpu = usage::cpu_seconds(&self.pids);
        let at = Instant::now();
        let gauges = Arc::clone(&self.gauges);
        let addr = self.etcd_addr.clone();
        let sampler = tokio::spawn(async move {
            loop {
                Self::record_gauges(&gauges, etcd_gauges::read(&addr).await);
                tokio::time::sleep(GAUGE_EVERY).await;
            }
        });
        let mut state = self.state();
        match cpu {
            Ok(cpu) => state.cpu_start = Some((at, cpu)),
            Err(e) => state.problems.push(format!("at start: {e}")),
        }
        state.sampler = Some(sampler);
    }

    async fn in_place(&self) {
        Self::record_gauges(&self.gauges, etcd_gauges::read(&self.etcd_addr).await);
    }

    async fn end(&self) {
        let cpu = usage::cpu_seconds(&self.pids);
        let at = Instant::now();
        let peak_rss = usage::peak_rss_mib(&self.pids);
        let mut state = self.state();
        if let Some(sampler) = state.sampler.take() {
            sampler.abort();
        }
        let mut problems = std::mem::take(&mut state.problems);
        let (readings, failures): (Vec<_>, Vec<_>) = self
            .gauges
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .partition(Result::is_ok);
        if let Some(Err(first)) = failures.first() {
            problems.push(format!(
                "{} of {} readings of etcd's gauges failed (first: {first})",
                failures.len(),
                failures.len() + readings.len()
            ));
        }
        let readings: Vec<EtcdGauges> = readings.into_iter().filter_map(Result::ok).collect();
        let window = state
            .cpu_start
            .as_ref()
            .map_or(0.0, |(start, _)| at.duration_since(*start).as_secs_f64());
        let cpu = match (&state.cpu_start, cpu) {
            (Some((_, start)), Ok(end)) => usage::cpu_rate(start, &end, window),
            (_, Err(e)) => {
                problems.push(format!("at end: {e}"));
                None
            }
            (None, Ok(_)) => None,
        };
        let peak_rss_mib = match peak_rss {
            Ok(rss) => Some(ByTier::of(&rss)),
            Err(e) => {
                problems.push(format!("at end: {e}"));
                None
            }
        };
        state.measured = Some(Measured {
            window_seconds: window,
            cpu,
            peak_rss_mib,
            etcd: GaugesDuring::of(&readings),
            problems,
        });
    }
}

impl Drop for TreeProbe {
    fn drop(&mut self) {
        if let Some(sampler) = self.state().sampler.take() {
            sampler.abort();
        }
    }
}
