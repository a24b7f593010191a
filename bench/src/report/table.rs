//! The markdown report: per etcd version, one row per scenario and target with medians over rounds, then the
//! ratios that answer "what does each proxy cost and save" (this proxy with its range cache and, where measured,
//! without it, and with `--baseline-bin` another build of it, each against direct etcd and the Go proxy), then the
//! Range load reaching etcd per client read, the
//! figures of the watch, lease, handshake and write-to-visible scenarios in their own terms, and with `--tls=both`
//! each case over TLS against itself in plaintext.

use std::fmt::Write as _;

use super::compare;
use super::targets::{self, Check};
use crate::plan::{Scenario, Target, TlsMode};
use crate::results::{Report, ScenarioResult, TargetSummary, VersionResult};

pub fn markdown(report: &Report) -> String {
    let mut out = String::new();
    let t = &report.timing;
    let _ = writeln!(out, "# Benchmark `{}`\n", report.name);
    let _ = writeln!(out, "- machine: {}", report.machine);
    let _ = writeln!(out, "- command: `{}`", report.command);
    let nocache = report
        .versions
        .iter()
        .flat_map(|v| &v.scenarios)
        .any(|s| s.summary(Target::RustProxyNoCache).is_some());
    let _ = writeln!(
        out,
        "- each run: {} s warm-up, {} s measured; {} round(s), targets alternating direct, Go proxy, this proxy{}{}; \
         medians over rounds",
        t.warmup_seconds,
        t.seconds,
        t.rounds,
        if nocache {
            " (`this-proxy`: its range cache on, `--range-cache-max-bytes=268435456`) and, for the range, mixed and write-to-visible \
             scenarios, this proxy with its range cache off (`this-proxy-nocache`, `--range-cache-max-bytes=0`, a \
             second process in front of the same etcd)"
        } else {
            ""
        },
        if nocache && report.baseline_bin.is_some() {
            " and the baseline build (`baseline-proxy`)"
        } else {
            ""
        }
    );
    if let Some(bin) = &report.baseline_bin {
        let _ = writeln!(
            out,
            "- baseline: `baseline-proxy` is the binary `{}` (another build of this proxy), in front of the same etcd \
             as `this-proxy` but with its own default range cache and without the --proxy-arg flags; visited in \
             the cases that visit `this-proxy-nocache`",
            bin.display()
        );
    }
    const MUTUAL: &str = "mutual TLS on every link: etcd serves TLS with --client-cert-auth, both proxies dial \
        it over TLS with a client certificate and serve TLS requiring one, the benchmark's clients present one (full \
        handshakes, no resumption)";
    let _ = writeln!(
        out,
        "- transport: {}",
        match report.tls {
            TlsMode::Off => "plaintext".to_string(),
            TlsMode::On => MUTUAL.to_string(),
            TlsMode::Both => format!(
                "each case twice, on a plaintext stack and on a TLS stack ({MUTUAL}); every round visits the \
                 targets in plaintext, then over TLS; cases over TLS are marked (TLS)"
            ),
        }
    );
    for version in &report.versions {
        version_section(&mut out, version, report);
    }
    out
}

fn version_section(out: &mut String, version: &VersionResult, report: &Report) {
    let _ = writeln!(out, "\n## etcd {}\n", version.version);
    if let Some(failure) = &version.failure {
        let _ = writeln!(
            out,
            "Not measured: {}\n",
            failure.lines().next().unwrap_or_default()
        );
    }
    if !version.idle_rss_mib.is_empty() {
        let idle: Vec<String> = version
            .idle_rss_mib
            .iter()
            .map(|(t, mib)| format!("{} {mib:.1} MiB", t.label()))
            .collect();
        let _ = writeln!(out, "Idle RSS right after start: {}.\n", idle.join(", "));
    }
    if report.tls != TlsMode::Off {
        let sessions: Vec<String> = Target::ALL
            .iter()
            .filter_map(|&t| {
                let session = version
                    .scenarios
                    .iter()
                    .filter(|s| s.tls)
                    .flat_map(|s| &s.runs)
                    .filter(|r| r.target == t)
                    .find_map(|r| r.tls_session.as_deref())?;
                Some(format!("{} `{session}`", t.label()))
            })
            .collect();
        if !sessions.is_empty() {
            let _ = writeln!(
                out,
                "TLS the benchmark's clients negotiated: {}.\n",
                sessions.join(", ")
            );
        }
    }
    if version.scenarios.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "| scenario | target | ops/s | p50 ms | p99 ms | max ms | errors | proxy CPU ms/1k ops | etcd CPU ms/1k ops \
         | proxy peak RSS MiB | reached etcd |"
    );
    let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|---|");
    for scenario in throughput_cases(version) {
        for s in &scenario.summaries {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                scenario.name(),
                s.target.label(),
                num(s.throughput, 0),
                num(s.p50_ms, 2),
                num(s.p99_ms, 2),
                num(s.max_ms, 1),
                s.errors,
                s.proxy_cpu_ms_per_1k.map_or("-".into(), |v| num(v, 1)),
                num(s.etcd_cpu_ms_per_1k, 1),
                s.proxy_peak_rss_mib.map_or("-".into(), |v| num(v, 1)),
                upstream_words(scenario.scenario, s),
            );
        }
    }
    let _ = writeln!(
        out,
        "\nRatios (medians; throughput: higher is better, p99 and CPU: lower is better):\n"
    );
    let _ = writeln!(
        out,
        "| scenario | this = | Go proxy / direct ops/s | this / direct ops/s | this / Go ops/s | this / Go p99 \
         | this / Go proxy CPU per op | etcd work per op: direct, Go, this |"
    );
    let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|---|");
    for scenario in throughput_cases(version) {
        for this in [
            Target::RustProxy,
            Target::RustProxyNoCache,
            Target::BaselineProxy,
        ] {
            if scenario.summary(this).is_some() {
                ratio_row(out, scenario, this);
            }
        }
    }
    range_table(out, version);
    visible_table(out, version);
    watch_table(out, version);
    lease_table(out, version);
    handshake_table(out, version);
    tls_table(out, version);
    if report.check_targets {
        targets_table(out, version);
    }
    let _ = writeln!(out, "\nSizes:\n");
    for scenario in &version.scenarios {
        let _ = writeln!(out, "- {}: {}", scenario.name(), scenario.size);
    }
    let failures: Vec<String> = version
        .scenarios
        .iter()
        .flat_map(|s| s.runs.iter().map(move |r| (s.name(), r)))
        .filter_map(|(scenario, r)| {
            r.client.error_samples.first().map(|e| {
                format!(
                    "- {} at {} (round {}): {e}",
                    scenario,
                    r.target.label(),
                    r.round + 1
                )
            })
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(
            out,
            "\nFirst error of each run that had errors:\n\n{}",
            failures.join("\n")
        );
    }
}

/// The cases measured in operations per second: all but write-to-visible.
fn throughput_cases(version: &VersionResult) -> impl Iterator<Item = &ScenarioResult> {
    version
        .scenarios
        .iter()
        .filter(|s| s.scenario != Scenario::WriteToVisible)
}

/// One row of ratios, `this` standing for this proxy with its cache (`this-proxy`), without (`this-proxy-nocache`)
/// or the baseline build (`baseline-proxy`).
fn ratio_row(out: &mut String, scenario: &ScenarioResult, this: Target) {
    let get = |t| scenario.summary(t);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() && b.is_finite() => format!("{:.2}", a / b),
        _ => "-".into(),
    };
    let tput = |t| get(t).map(|s: &TargetSummary| s.throughput);
    let p99 = |t| get(t).map(|s: &TargetSummary| s.p99_ms);
    let cpu = |t| get(t).and_then(|s: &TargetSummary| s.proxy_cpu_ms_per_1k);
    let work = |t| {
        get(t).map_or("-".into(), |s: &TargetSummary| {
            num(s.upstream_per_client, 2)
        })
    };
    let _ = writeln!(
        out,
        "| {} | {} | {} | {} | {} | {} | {} | {}, {}, {} |",
        scenario.name(),
        this.label(),
        ratio(tput(Target::GoProxy), tput(Target::Direct)),
        ratio(tput(this), tput(Target::Direct)),
        ratio(tput(this), tput(Target::GoProxy)),
        ratio(p99(this), p99(Target::GoProxy)),
        ratio(cpu(this), cpu(Target::GoProxy)),
        work(Target::Direct),
        work(Target::GoProxy),
        work(this),
    );
}

/// The read scenarios: the Range calls that reached etcd and etcd's CPU, per client read, each target against
/// direct etcd and the Go proxy.
fn range_table(out: &mut String, version: &VersionResult) {
    // Reports written before these figures were measured have none: no table then.
    let cases: Vec<&ScenarioResult> = version
        .scenarios
        .iter()
        .filter(|s| s.scenario.reads())
        .filter(|s| s.summaries.iter().any(|t| t.range_per_read.is_some()))
        .collect();
    if cases.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nRange load reaching etcd (medians; over the measured window: etcd's own \
         `grpc_server_handled_total{{grpc_service=\"etcdserverpb.KV\",grpc_method=\"Range\"}}` from its /metrics and \
         etcd's CPU from /proc, each divided by the client reads; a mixed run's reads are its requests times the \
         share of reads it draws, and its etcd CPU includes its puts'; cache hits from each proxy's own `etcd_grpc_proxy_cache_hits_total`: the Go proxy counts serializable \
         reads only, and etcd 3.4's does not serve its own metrics, hence -):\n"
    );
    let _ = writeln!(
        out,
        "| case | target | client reads/s | Range calls on etcd per client read | etcd CPU µs per client read \
         | etcd CPU per read / direct | etcd CPU per read / Go | cache hits per client read |"
    );
    let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|--:|");
    for case in cases {
        let cpu_of = |t| {
            case.summary(t)
                .and_then(|s: &TargetSummary| s.etcd_cpu_us_per_read)
        };
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 && a.is_finite() => num(a / b, 2),
            _ => "-".into(),
        };
        for s in &case.summaries {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                case.name(),
                s.target.label(),
                opt(s.reads_per_second, 0),
                opt(s.range_per_read, 3),
                opt(s.etcd_cpu_us_per_read, 1),
                ratio(s.etcd_cpu_us_per_read, cpu_of(Target::Direct)),
                ratio(s.etcd_cpu_us_per_read, cpu_of(Target::GoProxy)),
                opt(s.cache_hits_per_read, 3),
            );
        }
    }
}

/// Write-to-visible: how long a write made directly on etcd takes to show in serializable reads through each target.
fn visible_table(out: &mut String, version: &VersionResult) {
    let cases = scenarios_of(version, Scenario::WriteToVisible);
    if cases.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nWrite to visible (a client writes a key directly on etcd, then reads it through the target, serializable, \
         back to back until a read returns the new value; latency from the write's acknowledgement to that read's \
         answer, over the writes seen, medians over rounds; writes summed over rounds):\n"
    );
    let _ = writeln!(
        out,
        "| case | target | writes | seen | never seen | not attempted | write to visible p50 / p99 / max ms \
         | reads per write | cache hits per read | Range calls on etcd per read |"
    );
    let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|");
    for case in cases {
        for s in &case.summaries {
            let Some(v) = &s.visibility else {
                continue;
            };
            let latency = if v.seen == 0 {
                format!("never within {} s", v.wait_seconds)
            } else {
                format!(
                    "{} / {} / {}",
                    num(s.p50_ms, 2),
                    num(s.p99_ms, 2),
                    num(s.max_ms, 2)
                )
            };
            let not_attempted = if v.not_attempted > 0 {
                format!("{} (gave up)", v.not_attempted)
            } else {
                "0".into()
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} within {} s | {} | {} | {} | {} | {} |",
                case.name(),
                s.target.label(),
                v.writes,
                v.seen,
                v.never,
                v.wait_seconds,
                not_attempted,
                latency,
                num(v.reads_per_write, 1),
                opt(s.cache_hits_per_read, 3),
                opt(s.range_per_read, 3),
            );
        }
    }
}

fn scenarios_of(version: &VersionResult, scenario: Scenario) -> Vec<&ScenarioResult> {
    version
        .scenarios
        .iter()
        .filter(|s| s.scenario == scenario)
        .collect()
}

/// The watch fan-out's figures of issue 5, per case and target.
fn watch_table(out: &mut String, version: &VersionResult) {
    let cases = scenarios_of(version, Scenario::WatchFanout);
    if cases.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nWatch fan-out (medians; fan-out = from a put to its last watcher's delivery, over puts):\n"
    );
    let _ = writeln!(
        out,
        "| case | target | client streams | etcd watchers | puts | delivered | incomplete puts | delivery p50 / p99 ms \
         | fan-out p50 / p99 ms | proxy CPU µs per event | proxy KiB per idle watcher | proxy peak RSS MiB |"
    );
    let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for case in cases {
        for s in &case.summaries {
            let unsettled = if s.idle_memory_settled == Some(false) {
                " (unsettled)"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} | {} | {}{unsettled} | {} |",
                case.name(),
                s.target.label(),
                opt(s.client_streams, 0),
                num(s.upstream_watchers, 0),
                puts(case, s.target),
                s.watch_completeness
                    .map_or("-".into(), |c| format!("{:.2}%", c * 100.0)),
                s.puts_incomplete,
                num(s.p50_ms, 1),
                num(s.p99_ms, 1),
                opt(s.fanout_p50_ms, 1),
                opt(s.fanout_p99_ms, 1),
                opt(s.proxy_cpu_ms_per_1k, 2),
                opt(s.idle_kib_per_watcher, 2),
                opt(s.proxy_peak_rss_mib, 1),
            );
        }
    }
}

/// The lease keep-alive's figures of issue 6, per target, with the renewals reaching etcd against direct.
fn lease_table(out: &mut String, version: &VersionResult) {
    let cases = scenarios_of(version, Scenario::LeaseKeepalive);
    if cases.is_empty() {
        return;
    }
    let _ = writeln!(out, "\nLease keep-alive (medians):\n");
    let _ = writeln!(
        out,
        "| case | target | keep-alives answered /s | renewals reaching etcd /s | of direct's | LeaseKeepAlive streams \
         on etcd: opened, open | answer p50 / p99 ms | proxy CPU µs per keep-alive | proxy peak RSS MiB |"
    );
    let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|--:|--:|");
    for case in cases {
        let direct = case
            .summary(Target::Direct)
            .and_then(|s| s.upstream_msgs_per_second);
        for s in &case.summaries {
            let of_direct = match (s.upstream_msgs_per_second, direct) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                _ => "-".into(),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {}, {} | {} / {} | {} | {} |",
                case.name(),
                s.target.label(),
                num(s.throughput, 0),
                opt(s.upstream_msgs_per_second, 0),
                of_direct,
                num(s.upstream_streams, 0),
                num(s.upstream_streams_open, 0),
                num(s.p50_ms, 2),
                num(s.p99_ms, 2),
                opt(s.proxy_cpu_ms_per_1k, 2),
                opt(s.proxy_peak_rss_mib, 1),
            );
        }
    }
}

/// The handshake scenario in its own terms: connections (over TLS, full handshakes) per second and what each cost.
fn handshake_table(out: &mut String, version: &VersionResult) {
    let cases = scenarios_of(version, Scenario::Handshake);
    if cases.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nHandshakes (medians; each connection is dialed (TCP; over TLS a full handshake; HTTP/2), carries one \
         linearizable range and is closed; latency from dialing to the range's answer):\n"
    );
    let _ = writeln!(
        out,
        "| case | target | connections/s | p50 / p99 ms | errors | proxy CPU µs per connection | etcd CPU µs per \
         connection | this / Go: connections/s, CPU per connection |"
    );
    let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|---|");
    for case in cases {
        let this = case.summary(Target::RustProxy);
        let go = case.summary(Target::GoProxy);
        let ratio = |f: fn(&TargetSummary) -> Option<f64>| match (this.and_then(f), go.and_then(f))
        {
            (Some(a), Some(b)) if b > 0.0 => num(a / b, 2),
            _ => "-".into(),
        };
        for s in &case.summaries {
            let ratios = if s.target == Target::RustProxy {
                format!(
                    "{}, {}",
                    ratio(|s| Some(s.throughput)),
                    ratio(|s| s.proxy_cpu_ms_per_1k)
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} / {} | {} | {} | {} | {ratios} |",
                case.name(),
                s.target.label(),
                num(s.throughput, 0),
                num(s.p50_ms, 2),
                num(s.p99_ms, 2),
                s.errors,
                opt(s.proxy_cpu_ms_per_1k, 1),
                num(s.etcd_cpu_ms_per_1k, 1),
            );
        }
    }
}

/// Every case measured in plaintext and over TLS in the same rounds (`--tls=both`), side by side.
fn tls_table(out: &mut String, version: &VersionResult) {
    let pairs: Vec<(&ScenarioResult, &ScenarioResult)> = version
        .scenarios
        .iter()
        .filter(|s| !s.tls)
        .filter_map(|plain| {
            let tls = version
                .scenarios
                .iter()
                .find(|s| s.tls && s.same_case(plain))?;
            Some((plain, tls))
        })
        .collect();
    if pairs.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nTLS against plaintext (same rounds; medians; for the handshake scenario an op is a connection, over TLS \
         a full handshake):\n"
    );
    compare::side_by_side(out, &pairs, "plaintext", "TLS");
}

/// "Target met / not met" for every check of issues 5 and 6.
fn targets_table(out: &mut String, version: &VersionResult) {
    let rows: Vec<(String, Check)> = version
        .scenarios
        .iter()
        .flat_map(|s| targets::checks(s).into_iter().map(move |c| (s.name(), c)))
        .collect();
    if rows.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "\nTargets of issues 5 (watch) and 6 (lease), judged on this proxy (medians over rounds):\n"
    );
    let _ = writeln!(out, "| case | target | this proxy | Go proxy | verdict |");
    let _ = writeln!(out, "|---|---|--:|--:|---|");
    for (case, check) in rows {
        let _ = writeln!(
            out,
            "| {case} | {} | {} | {} | {} |",
            check.target,
            check.this_proxy,
            check.go_proxy,
            check.verdict.words()
        );
    }
}

/// Puts of a watch case at one target, summed over rounds (the fan-out quantiles are over these).
fn puts(case: &ScenarioResult, target: Target) -> u64 {
    case.runs
        .iter()
        .filter(|r| r.target == target)
        .filter_map(|r| r.watch.as_ref())
        .map(|w| w.puts)
        .sum()
}

fn opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or("-".into(), |v| num(v, decimals))
}

/// What reached etcd, in the scenario's own terms.
fn upstream_words(scenario: Scenario, s: &TargetSummary) -> String {
    match scenario {
        Scenario::WatchFanout => format!(
            "{} etcd watchers per client watcher, {} watch streams; {} delivered",
            num(s.upstream_per_client, 3),
            num(s.upstream_streams, 0),
            s.watch_completeness
                .map_or("-".into(), |c| format!("{:.1}%", c * 100.0)),
        ),
        Scenario::LeaseKeepalive => format!(
            "{} keep-alives per client keep-alive, {} streams opened",
            num(s.upstream_per_client, 3),
            num(s.upstream_streams, 0)
        ),
        _ => format!(
            "{} KV requests per client request",
            num(s.upstream_per_client, 3)
        ),
    }
}

fn num(value: f64, decimals: usize) -> String {
    if value.is_finite() {
        format!("{value:.decimals$}")
    } else {
        "-".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::recorder::{Latency, Tally};
    use crate::meter::ServerCost;
    use crate::plan::{Sizes, Timing};
    use crate::results::{Run, ScenarioResult};

    fn run(target: Target, throughput: f64, p99_ms: f64, proxy_cpu: Option<f64>) -> Run {
        let mut server = ServerCost {
            etcd_cpu_seconds: 1.0,
            proxy_cpu_seconds: proxy_cpu,
            ..Default::default()
        };
        server.upstream.requests.insert("Put".into(), 1000);
        Run {
            round: 0,
            target,
            client: Tally {
                completed: 1000,
                errors: 0,
                error_samples: vec![],
                seconds: 1000.0 / throughput,
                throughput,
                latency: Some(Latency {
                    p50_ms: 1.0,
                    p99_ms,
                    max_ms: p99_ms * 2.0,
                }),
            },
            server,
            etcd_metrics_read: true,
            watch: None,
            tls_session: None,
            client_reads: None,
            visibility: None,
        }
    }

    #[test]
    fn the_ratio_row_compares_each_proxy_with_direct_and_this_proxy_with_the_go_proxy() {
        let runs = vec![
            run(Target::Direct, 10_000.0, 2.0, None),
            run(Target::GoProxy, 5_000.0, 8.0, Some(2.0)),
            run(Target::RustProxy, 6_000.0, 4.0, Some(1.0)),
        ];
        let report = Report {
            name: "t".into(),
            machine: "m".into(),
            command: "c".into(),
            sizes: Sizes::quick(),
            timing: Timing::quick(),
            seed: 1,
            check_targets: false,
            tls: TlsMode::Off,
            baseline_bin: None,
            versions: vec![VersionResult {
                version: "3.5.1".into(),
                idle_rss_mib: vec![(Target::RustProxy, 7.0)],
                scenarios: vec![ScenarioResult::new(
                    Scenario::Put,
                    None,
                    false,
                    "size".into(),
                    runs,
                )],
                failure: None,
            }],
        };
        let text = markdown(&report);
        // Go/direct 0.50, this/direct 0.60, this/Go 1.20, p99 this/Go 0.50, CPU per op this/Go 0.50.
        assert!(
            text.contains(
                "| put | this-proxy | 0.50 | 0.60 | 1.20 | 0.50 | 0.50 | 1.00, 1.00, 1.00 |"
            ),
            "{text}"
        );
        // CPU per 1,000 ops: 1 s of proxy CPU over 1000 ops is 1000 ms per 1k.
        assert!(
            text.contains("| put | this-proxy | 6000 | 1.00 | 4.00 | 8.0 | 0 | 1000.0 |"),
            "{text}"
        );
        assert!(text.contains("this-proxy 7.0 MiB"), "{text}");
    }

    fn report_of(scenarios: Vec<ScenarioResult>) -> Report {
        Report {
            name: "t".into(),
            machine: "m".into(),
            command: "c".into(),
            sizes: Sizes::quick(),
            timing: Timing::quick(),
            seed: 1,
            check_targets: false,
            tls: TlsMode::Off,
            baseline_bin: None,
            versions: vec![VersionResult {
                version: "3.5.30".into(),
                idle_rss_mib: vec![],
                scenarios,
                failure: None,
            }],
        }
    }

    /// A read run: 1000 client reads, `ranges` of them reaching etcd, `etcd_cpu` seconds of etcd CPU.
    fn read_run(target: Target, throughput: f64, ranges: u64, etcd_cpu: f64) -> Run {
        let mut run = run(
            target,
            throughput,
            2.0,
            (target != Target::Direct).then_some(0.5),
        );
        run.server.upstream.requests.clear();
        run.server.upstream.requests.insert("Range".into(), ranges);
        run.server.etcd_cpu_seconds = etcd_cpu;
        run.client_reads = Some(1000.0);
        if target.is_this_proxy() || target == Target::GoProxy {
            run.server.proxy_cache = Some(crate::meter::CacheCounts {
                hits: 1000.0 - ranges as f64,
                misses: ranges as f64,
            });
        }
        run
    }

    #[test]
    fn range_runs_show_both_variants_of_this_proxy_and_the_range_load_per_read_against_direct_and_go()
     {
        let runs = vec![
            read_run(Target::Direct, 10_000.0, 1000, 0.1),
            read_run(Target::GoProxy, 5_000.0, 1000, 0.1),
            read_run(Target::RustProxy, 20_000.0, 10, 0.01),
            read_run(Target::RustProxyNoCache, 8_000.0, 1000, 0.1),
        ];
        let report = report_of(vec![ScenarioResult::new(
            Scenario::RangeSerializable,
            None,
            false,
            "size".into(),
            runs,
        )]);
        let text = markdown(&report);
        for row in [
            "| range-serializable | this-proxy | 0.50 | 2.00 | 4.00 | 1.00 | 1.00 | 1.00, 1.00, 0.01 |",
            "| range-serializable | this-proxy-nocache | 0.50 | 0.80 | 1.60 | 1.00 | 1.00 | 1.00, 1.00, 1.00 |",
            // 100 µs of etcd CPU per read direct, 10 µs with the cache.
            "| range-serializable | this-proxy | 20000 | 0.010 | 10.0 | 0.10 | 0.10 | 0.990 |",
            "| range-serializable | this-proxy-nocache | 8000 | 1.000 | 100.0 | 1.00 | 1.00 | 0.000 |",
            "| range-serializable | direct | 10000 | 1.000 | 100.0 | 1.00 | 1.00 | - |",
        ] {
            assert!(text.contains(row), "{row} missing: {text}");
        }
    }

    #[test]
    fn the_baseline_build_has_the_rows_of_this_proxy_without_its_cache_and_the_header_names_its_binary()
     {
        let runs = vec![
            read_run(Target::Direct, 10_000.0, 1000, 0.1),
            read_run(Target::GoProxy, 5_000.0, 1000, 0.1),
            read_run(Target::RustProxy, 20_000.0, 10, 0.01),
            read_run(Target::RustProxyNoCache, 8_000.0, 1000, 0.1),
            read_run(Target::BaselineProxy, 7_000.0, 1000, 0.1),
        ];
        let mut report = report_of(vec![ScenarioResult::new(
            Scenario::RangeSerializable,
            None,
            false,
            "size".into(),
            runs,
        )]);
        let without = markdown(&report);
        report.baseline_bin = Some("/tmp/proxy-77cfd39".into());
        let text = markdown(&report);
        for row in [
            "- baseline: `baseline-proxy` is the binary `/tmp/proxy-77cfd39` (another build of this proxy)",
            "write-to-visible scenarios, this proxy with its range cache off (`this-proxy-nocache`, \
             `--range-cache-max-bytes=0`, a second process in front of the same etcd) and the baseline build \
             (`baseline-proxy`); medians over rounds",
            "| range-serializable | baseline-proxy | 7000 | 1.00 | 2.00 | 4.0 | 0 | 500.0 |",
            "| range-serializable | baseline-proxy | 0.50 | 0.70 | 1.40 | 1.00 | 1.00 | 1.00, 1.00, 1.00 |",
            "| range-serializable | baseline-proxy | 7000 | 1.000 | 100.0 | 1.00 | 1.00 | - |",
        ] {
            assert!(text.contains(row), "{row} missing: {text}");
        }
        assert!(
            !without.contains("- baseline:") && !without.contains("and the baseline build"),
            "the header names a binary only when the run had one: {without}"
        );
    }

    #[test]
    fn write_to_visible_has_a_table_of_its_own_and_a_target_that_never_shows_a_write_says_so() {
        use crate::load::visible::VisibilityStats;
        let visible = |target, seen: u64, never: u64, not_attempted: u64| {
            let mut run = run(target, 100.0, 3.0, None);
            run.client.completed = seen;
            if seen == 0 {
                run.client.latency = None;
            }
            run.visibility = Some(VisibilityStats {
                writes: seen + never,
                seen,
                never,
                not_attempted,
                wait_seconds: 2.0,
                reads: (seen + never) * 4,
                stale_reads: 0,
            });
            run
        };
        let runs = vec![
            visible(Target::Direct, 200, 0, 0),
            visible(Target::GoProxy, 0, 5, 195),
            visible(Target::RustProxy, 200, 0, 0),
            visible(Target::RustProxyNoCache, 200, 0, 0),
            visible(Target::BaselineProxy, 200, 0, 0),
        ];
        let report = report_of(vec![ScenarioResult::new(
            Scenario::WriteToVisible,
            None,
            false,
            "size".into(),
            runs,
        )]);
        let text = markdown(&report);
        for row in [
            "| write-to-visible | go-proxy | 5 | 0 | 5 within 2 s | 195 (gave up) | never within 2 s | 4.0 | - | - |",
            "| write-to-visible | this-proxy | 200 | 200 | 0 within 2 s | 0 | 1.00 / 3.00 / 6.00 | 4.0 | - | - |",
            "| write-to-visible | baseline-proxy | 200 | 200 | 0 within 2 s | 0 | 1.00 / 3.00 / 6.00 | 4.0 | - | - |",
        ] {
            assert!(text.contains(row), "{row} missing: {text}");
        }
        assert!(
            !text.contains("| write-to-visible | direct | 100 |"),
            "no ops/s row: {text}"
        );
    }
}
