//! The targets of issues 5 (watch coalescing) and 6 (lease coalescing), judged on a scenario's summaries: this
//! proxy against absolute bounds, and against etcd's Go proxy measured in the same run.

use crate::plan::{Scenario, Target};
use crate::results::{ScenarioResult, TargetSummary};

/// Issue 5: p99 from a put to its last delivery.
pub const FANOUT_P99_MS: f64 = 50.0;
/// Issue 5: proxy memory per idle client watcher.
pub const IDLE_KIB_PER_WATCHER: f64 = 2.0;
/// Issue 6: p99 keep-alive answer.
pub const KEEPALIVE_P99_MS: f64 = 10.0;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Met,
    NotMet,
    /// Nothing to judge (not measured, or the measurement cannot tell).
    Unknown,
}

impl Verdict {
    fn of(met: bool) -> Self {
        if met { Verdict::Met } else { Verdict::NotMet }
    }

    pub fn words(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::NotMet => "**not met**",
            Verdict::Unknown => "unknown",
        }
    }
}

/// One target judged on one scenario case.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    pub target: String,
    /// This proxy's figure.
    pub this_proxy: String,
    /// The Go proxy's figure, for comparison.
    pub go_proxy: String,
    pub verdict: Verdict,
}

/// The checks of issue 5 (watch fan-out) or issue 6 (lease keep-alive); none for other scenarios or when this
/// proxy was not measured.
pub fn checks(scenario: &ScenarioResult) -> Vec<Check> {
    let Some(this) = scenario.summary(Target::RustProxy) else {
        return Vec::new();
    };
    let go = scenario.summary(Target::GoProxy);
    match scenario.scenario {
        Scenario::WatchFanout => watch_checks(this, go),
        Scenario::LeaseKeepalive => lease_checks(this, go),
        _ => Vec::new(),
    }
}

fn figure(value: Option<f64>, decimals: usize, unit: &str) -> String {
    match value.filter(|v| v.is_finite()) {
        Some(v) => format!("{v:.decimals$}{unit}"),
        None => "-".into(),
    }
}

/// Lower is better: this proxy's value against the Go proxy's.
fn lower_than_go(this: Option<f64>, go: Option<f64>) -> Verdict {
    match (this, go) {
        (Some(a), Some(b)) if a.is_finite() && b.is_finite() => Verdict::of(a < b),
        _ => Verdict::Unknown,
    }
}

fn below(value: Option<f64>, bound: f64, inclusive: bool) -> Verdict {
    match value.filter(|v| v.is_finite()) {
        Some(v) => Verdict::of(if inclusive { v <= bound } else { v < bound }),
        None => Verdict::NotMet,
    }
}

fn watch_checks(this: &TargetSummary, go: Option<&TargetSummary>) -> Vec<Check> {
    let on_go = |f: &dyn Fn(&TargetSummary) -> String| go.map_or("-".into(), f);
    let lost = |s: &TargetSummary| {
        format!(
            "{} delivered, {} incomplete puts, {} errors",
            figure(s.watch_completeness.map(|c| c * 100.0), 2, "%"),
            s.puts_incomplete,
            s.errors
        )
    };
    let memory = |s: &TargetSummary| {
        let unsettled = if s.idle_memory_settled == Some(false) {
            " (unsettled)"
        } else {
            ""
        };
        format!("{}{unsettled}", figure(s.idle_kib_per_watcher, 2, " KiB"))
    };
    let cpu = |s: &TargetSummary| figure(s.proxy_cpu_ms_per_1k, 2, " µs");
    vec![
        Check {
            target: "1 upstream watcher on etcd".into(),
            this_proxy: format!("{:.0}", this.upstream_watchers),
            go_proxy: on_go(&|s| format!("{:.0}", s.upstream_watchers)),
            verdict: Verdict::of(this.upstream_watchers == 1.0),
        },
        Check {
            target: "nothing lost".into(),
            this_proxy: lost(this),
            go_proxy: on_go(&lost),
            verdict: Verdict::of(
                this.watch_completeness == Some(1.0)
                    && this.puts_incomplete == 0
                    && this.errors == 0,
            ),
        },
        Check {
            target: format!("p99 put to last delivery < {FANOUT_P99_MS} ms"),
            this_proxy: figure(this.fanout_p99_ms, 1, " ms"),
            go_proxy: on_go(&|s| figure(s.fanout_p99_ms, 1, " ms")),
            verdict: below(this.fanout_p99_ms, FANOUT_P99_MS, false),
        },
        Check {
            target: format!("≤ {IDLE_KIB_PER_WATCHER} KiB proxy memory per idle watcher"),
            this_proxy: memory(this),
            go_proxy: on_go(&memory),
            verdict: below(this.idle_kib_per_watcher, IDLE_KIB_PER_WATCHER, true),
        },
        Check {
            target: "less proxy CPU per delivered event than the Go proxy".into(),
            this_proxy: cpu(this),
            go_proxy: on_go(&cpu),
            verdict: lower_than_go(
                this.proxy_cpu_ms_per_1k,
                go.and_then(|s| s.proxy_cpu_ms_per_1k),
            ),
        },
    ]
}

fn lease_checks(this: &TargetSummary, go: Option<&TargetSummary>) -> Vec<Check> {
    let on_go = |f: &dyn Fn(&TargetSummary) -> String| go.map_or("-".into(), f);
    let streams = |s: &TargetSummary| {
        format!(
            "{:.0} opened, {:.0} open",
            s.upstream_streams, s.upstream_streams_open
        )
    };
    // Opened for the run, or open while it ran: either sees the proxy's stream if it was not already open
    // before the run (a fresh stack per scenario makes sure of that).
    let (opened, open) = (this.upstream_streams, this.upstream_streams_open);
    let one_stream = if opened > 1.0 || open > 1.0 {
        Verdict::NotMet
    } else if opened == 1.0 || open == 1.0 {
        Verdict::Met
    } else {
        Verdict::Unknown
    };
    let p99 = |s: &TargetSummary| figure(Some(s.p99_ms), 2, " ms");
    let cpu = |s: &TargetSummary| figure(s.proxy_cpu_ms_per_1k, 2, " µs");
    vec![
        Check {
            target: "1 upstream LeaseKeepAlive stream on etcd".into(),
            this_proxy: streams(this),
            go_proxy: on_go(&streams),
            verdict: one_stream,
        },
        Check {
            target: format!("p99 keep-alive answer < {KEEPALIVE_P99_MS} ms"),
            this_proxy: p99(this),
            go_proxy: on_go(&p99),
            verdict: below(Some(this.p99_ms), KEEPALIVE_P99_MS, false),
        },
        Check {
            target: "less proxy CPU per keep-alive than the Go proxy".into(),
            this_proxy: cpu(this),
            go_proxy: on_go(&cpu),
            verdict: lower_than_go(
                this.proxy_cpu_ms_per_1k,
                go.and_then(|s| s.proxy_cpu_ms_per_1k),
            ),
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(target: Target) -> TargetSummary {
        TargetSummary {
            target,
            rounds: 1,
            throughput: 1000.0,
            p50_ms: 1.0,
            p99_ms: 5.0,
            max_ms: 9.0,
            errors: 0,
            proxy_cpu_ms_per_1k: Some(10.0),
            etcd_cpu_ms_per_1k: 1.0,
            proxy_peak_rss_mib: Some(50.0),
            upstream_per_client: 0.0001,
            upstream_streams: 1.0,
            upstream_watchers: 1.0,
            client_streams: Some(100.0),
            watch_completeness: Some(1.0),
            fanout_p50_ms: Some(10.0),
            fanout_p99_ms: Some(40.0),
            puts_incomplete: 0,
            idle_kib_per_watcher: Some(1.5),
            idle_memory_settled: Some(true),
            upstream_msgs_per_second: Some(1000.0),
            upstream_streams_open: 1.0,
            reads_per_second: None,
            range_per_read: None,
            etcd_cpu_us_per_read: None,
            cache_hits_per_read: None,
            visibility: None,
        }
    }

    fn scenario(scenario: Scenario, this: TargetSummary, go: TargetSummary) -> ScenarioResult {
        let mut result = ScenarioResult::new(scenario, None, false, "size".into(), vec![]);
        result.summaries = vec![go, this];
        result
    }

    fn verdicts(checks: &[Check]) -> Vec<Verdict> {
        checks.iter().map(|c| c.verdict).collect()
    }

    #[test]
    fn a_watch_run_within_every_bound_and_cheaper_than_go_meets_every_target() {
        let go = TargetSummary {
            proxy_cpu_ms_per_1k: Some(12.0),
            ..summary(Target::GoProxy)
        };
        let checks = checks(&scenario(
            Scenario::WatchFanout,
            summary(Target::RustProxy),
            go,
        ));
        assert_eq!(verdicts(&checks), vec![Verdict::Met; 5], "{checks:#?}");
        assert_eq!(checks[4].this_proxy, "10.00 µs");
        assert_eq!(checks[4].go_proxy, "12.00 µs");
    }

    #[test]
    fn each_watch_target_fails_on_its_own_figure() {
        let go = summary(Target::GoProxy);
        let this = TargetSummary {
            upstream_watchers: 2.0,
            watch_completeness: Some(0.999),
            fanout_p99_ms: Some(50.0),
            idle_kib_per_watcher: Some(2.01),
            idle_memory_settled: Some(false),
            proxy_cpu_ms_per_1k: Some(10.0), // equal to Go's: not less
            ..summary(Target::RustProxy)
        };
        let checks = checks(&scenario(Scenario::WatchFanout, this, go));
        assert_eq!(verdicts(&checks), vec![Verdict::NotMet; 5], "{checks:#?}");
        assert_eq!(checks[3].this_proxy, "2.01 KiB (unsettled)");
        let no_fanout = TargetSummary {
            fanout_p99_ms: None,
            ..summary(Target::RustProxy)
        };
        let checks = super::checks(&scenario(
            Scenario::WatchFanout,
            no_fanout,
            summary(Target::GoProxy),
        ));
        assert_eq!(checks[2].verdict, Verdict::NotMet, "no complete put");
    }

    #[test]
    fn lease_targets_judge_streams_latency_and_cpu() {
        let go = TargetSummary {
            p99_ms: 2000.0,
            proxy_cpu_ms_per_1k: Some(20.0),
            upstream_streams: 1.0,
            ..summary(Target::GoProxy)
        };
        let checks = checks(&scenario(
            Scenario::LeaseKeepalive,
            summary(Target::RustProxy),
            go.clone(),
        ));
        assert_eq!(verdicts(&checks), vec![Verdict::Met; 3], "{checks:#?}");
        assert_eq!(checks[0].this_proxy, "1 opened, 1 open");

        let slow = TargetSummary {
            p99_ms: 10.0,
            upstream_streams: 3.0,
            ..summary(Target::RustProxy)
        };
        let checks = super::checks(&scenario(Scenario::LeaseKeepalive, slow, go.clone()));
        assert_eq!(
            verdicts(&checks),
            vec![Verdict::NotMet, Verdict::NotMet, Verdict::Met]
        );

        let unseen = TargetSummary {
            upstream_streams: 0.0,
            upstream_streams_open: 0.0,
            ..summary(Target::RustProxy)
        };
        let checks = super::checks(&scenario(Scenario::LeaseKeepalive, unseen, go));
        assert_eq!(checks[0].verdict, Verdict::Unknown, "opened before the run");
    }

    #[test]
    fn other_scenarios_have_no_targets() {
        let s = scenario(
            Scenario::Put,
            summary(Target::RustProxy),
            summary(Target::GoProxy),
        );
        assert!(checks(&s).is_empty());
    }
}
