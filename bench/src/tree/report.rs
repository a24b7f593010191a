//! What `bench tree` measured, as written to `tree.json`: the run's settings, and per tree its fan-out (from the
//! watch load), etcd's watchers and each tier's CPU and memory (from the probe); and the ratios of this proxy's
//! tree to the Go proxy's that the report leads with.

use serde::{Deserialize, Serialize};

use super::TreeTarget;
use super::probe::Measured;
use super::usage::ByTier;
use crate::load::recorder::Tally;
use crate::load::watch::WatchStats;

/// The whole run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TreeReport {
    pub etcd_version: String,
    pub command: String,
    pub machine: String,
    pub leaves: usize,
    pub watchers: usize,
    pub watchers_per_stream: usize,
    pub connections_per_leaf: usize,
    pub put_rate: f64,
    pub measure_seconds: f64,
    pub value_size: usize,
    /// `getconf CLK_TCK`, which `/proc/PID/stat`'s CPU times count in (100 assumed when it cannot be read).
    pub clock_ticks_per_second: f64,
    /// The machine's 1-minute load average at the start and at the end of the run.
    pub load_average: (Option<f64>, Option<f64>),
    pub trees: Vec<TreeRun>,
}

/// One tree's run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TreeRun {
    pub target: TreeTarget,
    /// Why the tree could not be measured, if it could not.
    pub failure: Option<String>,
    /// Deliveries: watchers created and warmed up, puts, missing and duplicate events, put-to-last-delivery latency.
    pub watch: Option<WatchStats>,
    /// Every delivery's latency from its put's issue, and the load's errors.
    pub deliveries: Option<Tally>,
    /// etcd's watchers and watch streams once the tree was up, before the clients' watchers.
    pub etcd_watchers_before: Option<f64>,
    pub etcd_watch_streams_before: Option<f64>,
    pub measured: Measured,
    /// Proxies not healthy after the run.
    pub unhealthy: Vec<String>,
    /// The machine's 1-minute load average when this tree started and when its run ended.
    pub load_average: (Option<f64>, Option<f64>),
}

impl TreeRun {
    pub fn failed(
        target: TreeTarget,
        failure: String,
        load_average: (Option<f64>, Option<f64>),
    ) -> Self {
        Self {
            target,
            failure: Some(failure),
            watch: None,
            deliveries: None,
            etcd_watchers_before: None,
            etcd_watch_streams_before: None,
            measured: Measured::default(),
            unhealthy: Vec::new(),
            load_average,
        }
    }

    /// What went wrong with the clients' view of the tree, one line each: watchers not created or not warmed up,
    /// events missing or received twice, fewer than the `planned_puts` acknowledged, errors of the load, proxies
    /// unhealthy afterwards. Empty for a clean run.
    pub fn losses(&self, planned_puts: u64) -> Vec<String> {
        let mut losses = Vec::new();
        if let Some(failure) = &self.failure {
            losses.push(format!("not measured: {failure}"));
        }
        let Some(w) = &self.watch else {
            return losses;
        };
        if w.watchers_created < w.watchers {
            losses.push(format!(
                "only {} of {} watchers were created",
                w.watchers_created, w.watchers
            ));
        }
        if let Some(warmed) = w.warmed.filter(|&warmed| warmed < w.watchers_created) {
            losses.push(format!(
                "only {warmed} of {} watchers received the warm-up event",
                w.watchers_created
            ));
        }
        if w.missing > 0 {
            losses.push(format!(
                "{} events missing ({} of {} puts did not reach every watcher)",
                w.missing,
                w.puts.saturating_sub(w.puts_complete),
                w.puts
            ));
        }
        if w.duplicates > 0 {
            losses.push(format!(
                "{} events received twice (or out of order)",
                w.duplicates
            ));
        }
        if w.puts < planned_puts {
            losses.push(format!(
                "only {} of {planned_puts} puts were acknowledged",
                w.puts
            ));
        }
        if let Some(tally) = self.deliveries.as_ref().filter(|t| t.errors > 0) {
            losses.push(format!(
                "{} errors in the load (first: {})",
                tally.errors,
                tally.error_samples.join("; ")
            ));
        }
        losses.extend(self.unhealthy.iter().cloned());
        losses
    }

    /// Put to last delivery, p99, ms.
    pub fn fanout_p99_ms(&self) -> Option<f64> {
        self.watch.as_ref()?.fanout.as_ref().map(|l| l.p99_ms)
    }

    /// Put to each delivery, p99, ms.
    pub fn delivery_p99_ms(&self) -> Option<f64> {
        self.deliveries.as_ref()?.latency.as_ref().map(|l| l.p99_ms)
    }
}

impl TreeReport {
    /// The puts each tree's writer was to make: `put_rate` for `measure_seconds`, at least one.
    pub fn planned_puts(&self) -> u64 {
        (self.put_rate * self.measure_seconds).ceil().max(1.0) as u64
    }
}

/// This proxy's tree against the Go proxy's: each figure of this tree divided by the same of the Go tree (below 1:
/// this tree is faster or cheaper). None where either figure is missing or the Go tree's is zero.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ratios {
    pub fanout_p99: Option<f64>,
    pub delivery_p99: Option<f64>,
    pub cpu: Tiers<Option<f64>>,
}

/// [`ByTier`]'s fields, holding anything.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tiers<T> {
    pub etcd: T,
    pub mid: T,
    pub leaves_sum: T,
    pub leaf_max: T,
}

fn ratio(this: Option<f64>, go: Option<f64>) -> Option<f64> {
    match (this, go) {
        (Some(this), Some(go)) if go > 0.0 => Some(this / go),
        _ => None,
    }
}

impl Ratios {
    /// Of the first run of each tree in `report`; None unless both were measured.
    pub fn of(report: &TreeReport) -> Option<Self> {
        let measured = |target| {
            report
                .trees
                .iter()
                .find(|t| t.target == target && t.failure.is_none())
        };
        let (this, go) = (measured(TreeTarget::This)?, measured(TreeTarget::Go)?);
        let cpu = |f: fn(&ByTier) -> f64| {
            ratio(
                this.measured.cpu.as_ref().map(f),
                go.measured.cpu.as_ref().map(f),
            )
        };
        Some(Self {
            fanout_p99: ratio(this.fanout_p99_ms(), go.fanout_p99_ms()),
            delivery_p99: ratio(this.delivery_p99_ms(), go.delivery_p99_ms()),
            cpu: Tiers {
                etcd: cpu(|t| t.etcd),
                mid: cpu(|t| t.mid),
                leaves_sum: cpu(|t| t.leaves_sum),
                leaf_max: cpu(|t| t.leaf_max),
            },
        })
    }
}
