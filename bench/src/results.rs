//! The data a run produces (serialized to `<name>.json`) and its per-target summaries: medians over rounds, costs
//! per 1,000 requests, the load that reached etcd per client request, and for the read scenarios the Range calls
//! and etcd CPU per client read.

use serde::{Deserialize, Serialize};

use crate::load::recorder::Tally;
use crate::load::visible::VisibilityStats;
use crate::load::watch::WatchStats;
use crate::meter::ServerCost;
use crate::plan::{Scenario, Sizes, Target, Timing, TlsMode};

/// One scenario run once at one target.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Run {
    pub round: usize,
    pub target: Target,
    pub client: Tally,
    pub server: ServerCost,
    /// Whether etcd's /metrics were read at the start, during and at the end of the window.
    pub etcd_metrics_read: bool,
    pub watch: Option<WatchStats>,
    /// With `--tls`, what the client's first handshake with the target negotiated (version, cipher suite, key
    /// exchange group).
    #[serde(default)]
    pub tls_session: Option<String>,
    /// Read scenarios: client reads completed in the window (all requests of the range scenarios; of the mixed
    /// workload, its requests times the share of reads it draws, see [`Scenario::read_share`]); write-to-visible:
    /// the reads made awaiting the writes.
    #[serde(default)]
    pub client_reads: Option<f64>,
    /// Write-to-visible: what the writes came to.
    #[serde(default)]
    pub visibility: Option<VisibilityStats>,
}

impl Run {
    /// Client operations the upstream load is compared with: requests, delivered events or keep-alives, and for
    /// watch fan-out the client watchers.
    pub fn client_units(&self, scenario: Scenario) -> f64 {
        match (scenario, &self.watch) {
            (Scenario::WatchFanout, Some(watch)) => watch.watchers_created as f64,
            _ => self.client.completed as f64,
        }
    }

    /// What reached etcd for those operations: KV requests, etcd watchers, or keep-alive messages.
    pub fn upstream_units(&self, scenario: Scenario) -> f64 {
        let upstream = &self.server.upstream;
        match scenario {
            Scenario::Put
            | Scenario::RangeLinearizable
            | Scenario::RangeSerializable
            | Scenario::Mixed
            | Scenario::Handshake
            | Scenario::WriteToVisible => upstream.kv_requests() as f64,
            Scenario::WatchFanout => upstream.watchers as f64,
            Scenario::LeaseKeepalive => upstream
                .stream_msgs
                .get("LeaseKeepAlive")
                .copied()
                .unwrap_or(0) as f64,
        }
    }

    /// Read scenarios: Range calls that reached etcd in the window per client read.
    pub fn range_per_read(&self) -> Option<f64> {
        let reads = self.client_reads.filter(|r| *r > 0.0)?;
        let ranges = self
            .server
            .upstream
            .requests
            .get("Range")
            .copied()
            .unwrap_or(0);
        Some(ranges as f64 / reads)
    }

    /// Read scenarios: etcd's CPU in the window per client read, µs.
    pub fn etcd_cpu_us_per_read(&self) -> Option<f64> {
        let reads = self.client_reads.filter(|r| *r > 0.0)?;
        Some(self.server.etcd_cpu_seconds * 1e6 / reads)
    }

    /// Read scenarios: the proxy's cache hits in the window per client read (None for direct, or when the proxy's
    /// metrics could not be read).
    pub fn cache_hits_per_read(&self) -> Option<f64> {
        let reads = self.client_reads.filter(|r| *r > 0.0)?;
        Some(self.server.proxy_cache?.hits / reads)
    }
}

/// Medians over a target's rounds in one scenario.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TargetSummary {
    pub target: Target,
    pub rounds: usize,
    pub throughput: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub p50_ms: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub p99_ms: f64,
    #[serde(deserialize_with = "nan_if_null")]
    pub max_ms: f64,
    /// Failed requests summed over all rounds.
    pub errors: u64,
    pub proxy_cpu_ms_per_1k: Option<f64>,
    #[serde(deserialize_with = "nan_if_null")]
    pub etcd_cpu_ms_per_1k: f64,
    pub proxy_peak_rss_mib: Option<f64>,
    /// Upstream units per client unit (1.0: etcd sees everything; below: the proxy saved etcd work).
    #[serde(deserialize_with = "nan_if_null")]
    pub upstream_per_client: f64,
    /// Keep-alive streams opened on etcd (lease scenario) or watch streams open on etcd (watch scenario).
    pub upstream_streams: f64,
    /// Watchers registered in etcd with the load in place, beyond those before the run (watch scenario).
    #[serde(default)]
    pub upstream_watchers: f64,
    /// Client Watch streams the watchers were multiplexed on (watch scenario).
    #[serde(default)]
    pub client_streams: Option<f64>,
    pub watch_completeness: Option<f64>,
    /// Watch fan-out: put to last delivery, p50 and p99 over the complete puts.
    #[serde(default)]
    pub fanout_p50_ms: Option<f64>,
    #[serde(default)]
    pub fanout_p99_ms: Option<f64>,
    /// Watch fan-out: puts some watcher never received, summed over rounds.
    #[serde(default)]
    pub puts_incomplete: u64,
    /// Watch fan-out: proxy memory per idle client watcher, KiB (None for direct etcd).
    #[serde(default)]
    pub idle_kib_per_watcher: Option<f64>,
    /// Whether every idle-memory reading had settled (see `memory`).
    #[serde(default)]
    pub idle_memory_settled: Option<bool>,
    /// Stream messages reaching etcd per second of the window (LeaseKeepAlive for the lease scenario).
    #[serde(default)]
    pub upstream_msgs_per_second: Option<f64>,
    /// Streams open on etcd with the load in place, beyond those open before the run (LeaseKeepAlive for the
    /// lease scenario, Watch for the watch scenario).
    #[serde(default)]
    pub upstream_streams_open: f64,
    /// Read scenarios: client reads per second.
    #[serde(default)]
    pub reads_per_second: Option<f64>,
    /// Read scenarios: Range calls reaching etcd per client read.
    #[serde(default)]
    pub range_per_read: Option<f64>,
    /// Read scenarios: etcd CPU per client read, µs.
    #[serde(default)]
    pub etcd_cpu_us_per_read: Option<f64>,
    /// Read scenarios: the proxy's range cache hits per client read.
    #[serde(default)]
    pub cache_hits_per_read: Option<f64>,
    /// Write-to-visible: what the writes came to, summed over rounds (None for other scenarios).
    #[serde(default)]
    pub visibility: Option<VisibilitySummary>,
}

/// Write-to-visible at one target: counts summed over rounds, latency quantiles as medians over rounds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct VisibilitySummary {
    pub writes: u64,
    pub seen: u64,
    pub never: u64,
    pub not_attempted: u64,
    pub wait_seconds: f64,
    /// Reads through the target per write made.
    #[serde(deserialize_with = "nan_if_null")]
    pub reads_per_write: f64,
}

/// Reads a figure that may be NaN (nothing measured), which JSON writes as null.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
}

/// The middle value (mean of the two middle ones for an even count); None for no values.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

impl TargetSummary {
    pub fn of(scenario: Scenario, target: Target, runs: &[Run]) -> Option<Self> {
        let runs: Vec<&Run> = runs.iter().filter(|r| r.target == target).collect();
        if runs.is_empty() {
            return None;
        }
        let med =
            |f: &dyn Fn(&Run) -> Option<f64>| median(runs.iter().filter_map(|r| f(r)).collect());
        let per_1k = |cpu: f64, run: &Run| {
            (run.client.completed > 0).then(|| cpu * 1e6 / run.client.completed as f64)
        };
        Some(Self {
            target,
            rounds: runs.len(),
            throughput: med(&|r| Some(r.client.throughput)).unwrap_or(0.0),
            p50_ms: med(&|r| r.client.latency.as_ref().map(|l| l.p50_ms)).unwrap_or(f64::NAN),
            p99_ms: med(&|r| r.client.latency.as_ref().map(|l| l.p99_ms)).unwrap_or(f64::NAN),
            max_ms: med(&|r| r.client.latency.as_ref().map(|l| l.max_ms)).unwrap_or(f64::NAN),
            errors: runs.iter().map(|r| r.client.errors).sum(),
            proxy_cpu_ms_per_1k: med(&|r| r.server.proxy_cpu_seconds.and_then(|c| per_1k(c, r))),
            etcd_cpu_ms_per_1k: med(&|r| per_1k(r.server.etcd_cpu_seconds, r)).unwrap_or(f64::NAN),
            proxy_peak_rss_mib: med(&|r| r.server.proxy_peak_rss_kib.map(|k| k as f64 / 1024.0)),
            upstream_per_client: med(&|r| {
                let client = r.client_units(scenario);
                (client > 0.0).then(|| r.upstream_units(scenario) / client)
            })
            .unwrap_or(f64::NAN),
            upstream_streams: med(&|r| {
                Some(match scenario {
                    Scenario::LeaseKeepalive => r
                        .server
                        .upstream
                        .streams_started
                        .get("LeaseKeepAlive")
                        .copied()
                        .unwrap_or(0) as f64,
                    _ => r.server.upstream.watch_streams as f64,
                })
            })
            .unwrap_or(0.0),
            watch_completeness: med(&|r| r.watch.as_ref().map(|w| w.completeness)),
            upstream_watchers: med(&|r| Some(r.server.upstream.watchers as f64)).unwrap_or(0.0),
            client_streams: med(&|r| r.watch.as_ref().map(|w| w.streams as f64)),
            fanout_p50_ms: med(&|r| r.watch.as_ref()?.fanout.as_ref().map(|l| l.p50_ms)),
            fanout_p99_ms: med(&|r| r.watch.as_ref()?.fanout.as_ref().map(|l| l.p99_ms)),
            puts_incomplete: runs
                .iter()
                .filter_map(|r| r.watch.as_ref())
                .map(|w| w.puts.saturating_sub(w.puts_complete))
                .sum(),
            idle_kib_per_watcher: med(&|r| r.watch.as_ref()?.idle_memory?.kib_per_watcher()),
            idle_memory_settled: runs
                .iter()
                .filter_map(|r| r.watch.as_ref()?.idle_memory)
                .map(|m| m.settled())
                .reduce(|a, b| a && b),
            upstream_msgs_per_second: med(&|r| {
                let msgs = r
                    .server
                    .upstream
                    .stream_msgs
                    .get(stream_method(scenario)?)?;
                (r.server.window_seconds > 0.0).then(|| *msgs as f64 / r.server.window_seconds)
            }),
            upstream_streams_open: med(&|r| {
                let method = stream_method(scenario)?;
                Some(
                    r.server
                        .upstream
                        .streams_open
                        .get(method)
                        .copied()
                        .unwrap_or(0) as f64,
                )
            })
            .unwrap_or(0.0),
            reads_per_second: med(&|r| {
                let reads = r.client_reads?;
                (r.client.seconds > 0.0).then(|| reads / r.client.seconds)
            }),
            range_per_read: med(&|r| r.range_per_read()),
            etcd_cpu_us_per_read: med(&|r| r.etcd_cpu_us_per_read()),
            cache_hits_per_read: med(&|r| r.cache_hits_per_read()),
            visibility: VisibilitySummary::of(&runs),
        })
    }
}

impl VisibilitySummary {
    /// Sums over the runs that have write-to-visible stats; None when none has.
    fn of(runs: &[&Run]) -> Option<Self> {
        let stats: Vec<&VisibilityStats> =
            runs.iter().filter_map(|r| r.visibility.as_ref()).collect();
        let first = stats.first()?;
        let mut summary = VisibilitySummary {
            wait_seconds: first.wait_seconds,
            ..Default::default()
        };
        let mut reads = 0;
        for s in &stats {
            summary.writes += s.writes;
            summary.seen += s.seen;
            summary.never += s.never;
            summary.not_attempted += s.not_attempted;
            reads += s.reads;
        }
        summary.reads_per_write = if summary.writes > 0 {
            reads as f64 / summary.writes as f64
        } else {
            f64::NAN
        };
        Some(summary)
    }
}

/// The streaming method a scenario's load travels on, if any.
fn stream_method(scenario: Scenario) -> Option<&'static str> {
    match scenario {
        Scenario::WatchFanout => Some("Watch"),
        Scenario::LeaseKeepalive => Some("LeaseKeepAlive"),
        _ => None,
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScenarioResult {
    pub scenario: Scenario,
    /// Which setting of the scenario this is, when a run has several (the watch fan-out's put rates).
    #[serde(default)]
    pub variant: Option<String>,
    /// Measured on the TLS stack.
    #[serde(default)]
    pub tls: bool,
    /// Its size in words, for the report.
    pub size: String,
    pub runs: Vec<Run>,
    pub summaries: Vec<TargetSummary>,
}

impl ScenarioResult {
    pub fn new(
        scenario: Scenario,
        variant: Option<String>,
        tls: bool,
        size: String,
        runs: Vec<Run>,
    ) -> Self {
        let summaries = Target::ALL
            .iter()
            .filter_map(|t| TargetSummary::of(scenario, *t, &runs))
            .collect();
        Self {
            scenario,
            variant,
            tls,
            size,
            runs,
            summaries,
        }
    }

    /// The scenario's label, with its variant if it has one, and "(TLS)" on the TLS stack (`watch-fanout 5
    /// puts/s (TLS)`).
    pub fn name(&self) -> String {
        let mut name = self.scenario.label().to_string();
        if let Some(variant) = &self.variant {
            name.push(' ');
            name.push_str(variant);
        }
        if self.tls {
            name.push_str(" (TLS)");
        }
        name
    }

    /// The same case as `other` (scenario and setting), whatever the transport of either.
    pub fn same_case(&self, other: &ScenarioResult) -> bool {
        self.scenario == other.scenario && self.variant == other.variant
    }

    pub fn summary(&self, target: Target) -> Option<&TargetSummary> {
        self.summaries.iter().find(|s| s.target == target)
    }
}

/// Everything measured against one etcd version.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VersionResult {
    pub version: String,
    /// Resident memory of each proxy right after it started, before any load, MiB.
    pub idle_rss_mib: Vec<(Target, f64)>,
    pub scenarios: Vec<ScenarioResult>,
    /// Why this version could not be measured (its processes did not start), if so.
    pub failure: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Report {
    pub name: String,
    pub machine: String,
    pub command: String,
    pub sizes: Sizes,
    pub timing: Timing,
    pub seed: u64,
    /// Whether the report judges the watch and lease scenarios against the targets of issues 5 and 6.
    #[serde(default)]
    pub check_targets: bool,
    /// Which links were mutual TLS (`--tls`).
    #[serde(default)]
    pub tls: TlsMode,
    /// The binary of [`Target::BaselineProxy`] as given (`--baseline-bin`); none in a run without it, and in
    /// reports written before the flag (the field is then absent, and left out again when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline_bin: Option<std::path::PathBuf>,
    pub versions: Vec<VersionResult>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_without_latencies_parses_back_from_its_json() {
        let runs = vec![Run {
            round: 0,
            target: Target::GoProxy,
            client: crate::load::recorder::Recorder::new().tally(std::time::Duration::from_secs(1)),
            server: Default::default(),
            etcd_metrics_read: true,
            watch: None,
            tls_session: None,
            client_reads: None,
            visibility: Some(VisibilityStats {
                never: 3,
                ..Default::default()
            }),
        }];
        let result = ScenarioResult::new(Scenario::WriteToVisible, None, false, "s".into(), runs);
        let json = serde_json::to_string(&result).expect("serializes");
        let parsed: ScenarioResult = serde_json::from_str(&json).expect("parses back");
        let summary = parsed.summary(Target::GoProxy).expect("a summary");
        assert!(summary.p99_ms.is_nan() && summary.max_ms.is_nan());
        assert!(
            summary
                .visibility
                .as_ref()
                .expect("stats")
                .reads_per_write
                .is_nan()
        );
    }

    fn report(baseline_bin: Option<&str>) -> Report {
        Report {
            name: "r".into(),
            machine: "m".into(),
            command: "c".into(),
            sizes: Sizes::quick(),
            timing: Timing::quick(),
            seed: 1,
            check_targets: false,
            tls: TlsMode::Off,
            baseline_bin: baseline_bin.map(Into::into),
            versions: vec![],
        }
    }

    #[test]
    fn a_report_without_a_baseline_build_writes_no_field_for_it_and_an_older_one_without_the_field_loads()
     {
        let json = serde_json::to_value(report(None)).expect("serializes");
        assert!(
            json.get("baseline_bin").is_none(),
            "no new field without the flag: {json}"
        );
        let older: Report = serde_json::from_value(json).expect("a report without the field loads");
        assert_eq!(older.baseline_bin, None);
        let with = serde_json::to_string(&report(Some("/tmp/proxy-77cfd39"))).expect("serializes");
        let parsed: Report = serde_json::from_str(&with).expect("parses back");
        assert_eq!(
            parsed.baseline_bin.as_deref(),
            Some(std::path::Path::new("/tmp/proxy-77cfd39"))
        );
    }

    #[test]
    fn median_takes_the_middle_or_the_mean_of_the_middle_two() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(vec![f64::NAN, 7.0]), Some(7.0));
        assert_eq!(median(vec![]), None);
    }
}
