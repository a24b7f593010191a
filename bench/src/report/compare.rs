//! The same scenario cases measured two ways, side by side: each target's throughput, p99 and CPU per operation
//! in the one and in the other, what the second added per operation, and this proxy against the Go proxy in each.
//! Medians over rounds, as the reports have them; no new measurement.
//!
//! - [`side_by_side`]: the tables, for pairs of cases: a `--tls=both` run's plaintext and TLS cases (same rounds,
//!   the fairest comparison on a shared machine), or
//! - [`markdown`]: two runs that differ in one setting (`--tls`, `--namespace`), one after the other on the same
//!   machine (`bench --compare BASE.json OTHER.json`), matched by etcd version and case.

use std::fmt::Write as _;

use crate::plan::{Scenario, Target};
use crate::results::{Report, ScenarioResult, TargetSummary, VersionResult};

/// The markdown comparing `base` with `other`.
pub fn markdown(base: &Report, other: &Report) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# `{}` against `{}`\n", other.name, base.name);
    for (label, report) in [("base", base), ("other", other)] {
        let _ = writeln!(
            out,
            "- {label}: `{}` ({}): `{}`{}",
            report.name,
            report.tls.words(),
            report.command,
            report
                .baseline_bin
                .as_ref()
                .map_or(String::new(), |bin| format!(
                    "; `baseline-proxy` is `{}`",
                    bin.display()
                ))
        );
    }
    let _ = writeln!(
        out,
        "- figures: medians over each run's rounds; CPU per op is CPU time over completed operations (for the \
         handshake scenario, per connection opened; with TLS, per full handshake)"
    );
    for version in &base.versions {
        if let Some(theirs) = other.versions.iter().find(|v| v.version == version.version) {
            version_section(&mut out, base, version, other, theirs);
        }
    }
    out
}

fn version_section(
    out: &mut String,
    base: &Report,
    ours: &VersionResult,
    other: &Report,
    theirs: &VersionResult,
) {
    let pairs: Vec<(&ScenarioResult, &ScenarioResult)> = ours
        .scenarios
        .iter()
        .filter_map(|a| Some((a, theirs.scenarios.iter().find(|b| b.same_case(a))?)))
        .collect();
    if pairs.is_empty() {
        return;
    }
    let _ = writeln!(out, "\n## etcd {}\n", ours.version);
    side_by_side(out, &pairs, &base.name, &other.name);
}

/// The two tables for `pairs` of the same case measured as `a` and as `b` (named by the first of each pair);
/// write-to-visible cases, which measure no operations per second, are left out.
pub fn side_by_side(
    out: &mut String,
    pairs: &[(&ScenarioResult, &ScenarioResult)],
    a: &str,
    b: &str,
) {
    let pairs: Vec<&(&ScenarioResult, &ScenarioResult)> = pairs
        .iter()
        .filter(|(sa, _)| sa.scenario != Scenario::WriteToVisible)
        .collect();
    let _ = writeln!(
        out,
        "| scenario | target | ops/s: {a} → {b} | p99 ms: {a} → {b} | proxy CPU µs per op: {a} → {b} | added per op \
         | etcd CPU µs per op: {a} → {b} |"
    );
    let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|");
    for (sa, sb) in &pairs {
        for target in Target::ALL {
            let (Some(x), Some(y)) = (sa.summary(target), sb.summary(target)) else {
                continue;
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} → {} ({}) | {} → {} | {} → {} | {} | {} → {} |",
                case_name(sa),
                target.label(),
                num(x.throughput, 0),
                num(y.throughput, 0),
                change(x.throughput, y.throughput),
                num(x.p99_ms, 2),
                num(y.p99_ms, 2),
                opt(x.proxy_cpu_ms_per_1k, 1),
                opt(y.proxy_cpu_ms_per_1k, 1),
                match (x.proxy_cpu_ms_per_1k, y.proxy_cpu_ms_per_1k) {
                    (Some(p), Some(q)) => format!("{:+.1} µs ({})", q - p, change(p, q)),
                    _ => "-".into(),
                },
                num(x.etcd_cpu_ms_per_1k, 1),
                num(y.etcd_cpu_ms_per_1k, 1),
            );
        }
    }
    let _ = writeln!(
        out,
        "\nThis proxy against the Go proxy, {a} and {b} (each from the same rounds, same load):\n"
    );
    let _ = writeln!(
        out,
        "| scenario | this / Go CPU per op: {a}, {b} | this / Go ops/s: {a}, {b} | this / Go p99: {a}, {b} |"
    );
    let _ = writeln!(out, "|---|--:|--:|--:|");
    for (sa, sb) in &pairs {
        let _ = writeln!(
            out,
            "| {} | {}, {} | {}, {} | {}, {} |",
            case_name(sa),
            this_over_go(sa, |s| s.proxy_cpu_ms_per_1k),
            this_over_go(sb, |s| s.proxy_cpu_ms_per_1k),
            this_over_go(sa, |s| Some(s.throughput)),
            this_over_go(sb, |s| Some(s.throughput)),
            this_over_go(sa, |s| Some(s.p99_ms)),
            this_over_go(sb, |s| Some(s.p99_ms)),
        );
    }
}

/// A case's name without its transport (the columns say which side is which).
fn case_name(scenario: &ScenarioResult) -> String {
    ScenarioResult {
        tls: false,
        runs: Vec::new(),
        summaries: Vec::new(),
        ..scenario.clone()
    }
    .name()
}

/// This proxy's figure over the Go proxy's, in one run.
fn this_over_go(scenario: &ScenarioResult, f: fn(&TargetSummary) -> Option<f64>) -> String {
    let get = |t| scenario.summary(t).and_then(f);
    match (get(Target::RustProxy), get(Target::GoProxy)) {
        (Some(this), Some(go)) if go > 0.0 && this.is_finite() => format!("{:.2}", this / go),
        _ => "-".into(),
    }
}

/// `+12%`: from `a` to `b`.
fn change(a: f64, b: f64) -> String {
    if a > 0.0 && a.is_finite() && b.is_finite() {
        format!("{:+.0}%", (b / a - 1.0) * 100.0)
    } else {
        "-".into()
    }
}

fn opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or("-".into(), |v| num(v, decimals))
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
    use crate::plan::{Scenario, Sizes, Timing, TlsMode};
    use crate::results::Run;

    fn run(target: Target, throughput: f64, proxy_cpu: Option<f64>) -> Run {
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
                    p99_ms: 2.0,
                    max_ms: 3.0,
                }),
            },
            server: ServerCost {
                etcd_cpu_seconds: 0.1,
                proxy_cpu_seconds: proxy_cpu,
                ..Default::default()
            },
            etcd_metrics_read: true,
            watch: None,
            tls_session: None,
            client_reads: None,
            visibility: None,
        }
    }

    fn report(name: &str, tls: bool, go_cpu: f64, this_cpu: f64) -> Report {
        let mode = if tls { TlsMode::On } else { TlsMode::Off };
        let runs = vec![
            run(Target::Direct, 10_000.0, None),
            run(Target::GoProxy, 5_000.0, Some(go_cpu)),
            run(Target::RustProxy, 6_000.0, Some(this_cpu)),
        ];
        Report {
            name: name.into(),
            machine: "m".into(),
            command: format!("bench --name {name}"),
            sizes: Sizes::quick(),
            timing: Timing::quick(),
            seed: 1,
            check_targets: false,
            tls: mode,
            baseline_bin: None,
            versions: vec![VersionResult {
                version: "3.5.1".into(),
                idle_rss_mib: vec![],
                scenarios: vec![ScenarioResult::new(
                    Scenario::Put,
                    None,
                    tls,
                    "size".into(),
                    runs,
                )],
                failure: None,
            }],
        }
    }

    #[test]
    fn each_target_is_shown_in_both_runs_with_what_the_setting_added_and_this_proxy_against_go_in_each()
     {
        // CPU per op: 1 s over 1000 ops is 1000 µs. Go 0.2 → 0.3 s, this 0.1 → 0.12 s.
        let text = markdown(
            &report("off", false, 0.2, 0.1),
            &report("on", true, 0.3, 0.12),
        );
        assert!(
            text.contains("- other: `on` (TLS): `bench --name on`"),
            "{text}"
        );
        assert!(
            text.contains(
                "| put | go-proxy | 5000 → 5000 (+0%) | 2.00 → 2.00 | 200.0 → 300.0 | +100.0 µs (+50%) | 100.0 → 100.0 |"
            ),
            "{text}"
        );
        assert!(
            text.contains("| put | this-proxy | 6000 → 6000 (+0%) | 2.00 → 2.00 | 100.0 → 120.0 | +20.0 µs (+20%) |"),
            "{text}"
        );
        assert!(
            text.contains("| put | 0.50, 0.40 | 1.20, 1.20 | 1.00, 1.00 |"),
            "{text}"
        );
        assert!(!text.contains("baseline"), "{text}");
    }

    #[test]
    fn the_baseline_build_is_compared_like_every_target_and_each_run_names_its_binary() {
        let with_baseline = |name: &str, cpu: f64| {
            let mut report = report(name, false, 0.2, 0.1);
            report.baseline_bin = Some(format!("/tmp/proxy-{name}").into());
            let scenario = &mut report.versions[0].scenarios[0];
            let mut runs = std::mem::take(&mut scenario.runs);
            runs.push(run(Target::BaselineProxy, 4_000.0, Some(cpu)));
            *scenario = ScenarioResult::new(Scenario::Put, None, false, "size".into(), runs);
            report
        };
        let text = markdown(&with_baseline("a", 0.15), &with_baseline("b", 0.3));
        assert!(
            text.contains(
                "- base: `a` (plaintext): `bench --name a`; `baseline-proxy` is `/tmp/proxy-a`"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "| put | baseline-proxy | 4000 → 4000 (+0%) | 2.00 → 2.00 | 150.0 → 300.0 | +150.0 µs (+100%) |"
            ),
            "{text}"
        );
    }
}
