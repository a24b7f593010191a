//! The benchmark's quick mode, end to end, so that it cannot rot: real etcd 3.4.23 (Debian), etcd's Go proxy from
//! the same binary and this proxy (the release build, as `ci/bench.sh` runs it; with its range cache, and for the
//! read scenarios and write-to-visible without it too), every scenario at tiny sizes. It asserts that every target
//! produced results (completions, latencies, no errors, etcd's metrics read, the report written), never a speed.
//!
//! One etcd version keeps it short; `ci/bench.sh` runs every version. A second test runs a few scenarios with
//! `--tls=both`: on a plaintext stack and on a stack with mutual TLS on every link, in the same rounds.

use std::path::Path;

use bench::plan::{EtcdBinary, Plan, Scenario, Sizes, Target, Timing, TlsMode};
use bench::results::Report;
use testkit::{Binaries, Version};

fn quick_plan(etcd: Binaries, out_dir: &Path) -> Plan {
    Plan {
        name: "quick-test".into(),
        out_dir: out_dir.to_path_buf(),
        etcds: vec![EtcdBinary {
            version: etcd.version.name().into(),
            path: etcd.etcd,
        }],
        // The release build, built (or confirmed up to date) by cargo first, so the test never runs a stale proxy.
        proxy_bin: testkit::proxy::binary().expect("the proxy's release binary"),
        namespace: String::new(),
        // Two workers whatever the machine has: every scenario is served with connections on both.
        proxy_args: vec!["--worker-threads=2".into()],
        baseline_bin: None,
        tls: TlsMode::Off,
        scenarios: Scenario::ALL.to_vec(),
        sizes: Sizes::quick(),
        timing: Timing::quick(),
        seed: 7,
        machine: "test".into(),
        command: "cargo test -p bench --test quick".into(),
        fresh_stack: false,
        check_targets: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_mode_measures_every_scenario_at_every_target_and_writes_the_report() {
    let Some(etcd) = Version::V3_4_23.require() else {
        return;
    };
    let out = testkit::dirs::temp_dir("bench-quick-").expect("temporary output directory");
    let plan = quick_plan(etcd, out.path());
    let report = bench::runner::run(&plan).await;

    assert_eq!(report.versions.len(), 1);
    let version = &report.versions[0];
    assert_eq!(version.failure, None, "the stack did not start");
    let idle: Vec<Target> = version.idle_rss_mib.iter().map(|(t, _)| *t).collect();
    assert_eq!(
        idle,
        vec![Target::GoProxy, Target::RustProxy, Target::RustProxyNoCache],
        "idle RSS of every proxy"
    );

    let measured: Vec<Scenario> = version.scenarios.iter().map(|s| s.scenario).collect();
    assert_eq!(measured, Scenario::ALL.to_vec());
    for scenario in &version.scenarios {
        let name = scenario.scenario.label();
        let targets = scenario.scenario.targets();
        assert_eq!(
            targets.contains(&Target::RustProxyNoCache),
            matches!(
                scenario.scenario,
                Scenario::RangeLinearizable
                    | Scenario::RangeSerializable
                    | Scenario::Mixed
                    | Scenario::WriteToVisible
            ),
            "{name}: this proxy without its cache is visited exactly where the cache matters"
        );
        for &target in targets {
            let runs: Vec<_> = scenario
                .runs
                .iter()
                .filter(|r| r.target == target)
                .collect();
            assert_eq!(runs.len(), 1, "{name} at {target:?}: one round");
            let run = runs[0];
            let what = format!("{name} at {}: {run:#?}", target.label());
            let client = &run.client;
            assert_eq!(client.errors, 0, "errors: {what}");
            if scenario.scenario == Scenario::WriteToVisible {
                let visible = run
                    .visibility
                    .as_ref()
                    .unwrap_or_else(|| panic!("no write-to-visible stats: {what}"));
                assert!(visible.writes > 0, "{what}");
                assert_eq!(visible.seen, client.completed, "{what}");
                assert_eq!(visible.seen + visible.never, visible.writes, "{what}");
                match target {
                    // etcd's Go proxy serves its cached value until a write through itself: whatever it shows, the
                    // run ends (it gives up after a few writes in a row never seen).
                    Target::GoProxy => {}
                    // One member: a serializable read after the write's acknowledgement sees it.
                    Target::Direct | Target::RustProxyNoCache => {
                        assert_eq!(visible.seen, visible.writes, "{what}")
                    }
                    // The cache's copy follows its watch: the writes show.
                    Target::RustProxy => assert!(visible.seen > 0, "{what}"),
                    // Not run here: the run names no baseline build.
                    Target::BaselineProxy => {}
                }
                if visible.seen == 0 {
                    assert_eq!(client.latency, None, "{what}");
                    assert!(run.etcd_metrics_read, "etcd /metrics not read: {what}");
                    continue;
                }
            }
            assert!(client.completed > 0, "nothing completed: {what}");
            let latency = client
                .latency
                .as_ref()
                .unwrap_or_else(|| panic!("no latencies: {what}"));
            assert!(
                0.0 < latency.p50_ms
                    && latency.p50_ms <= latency.p99_ms
                    && latency.p99_ms <= latency.max_ms,
                "latency quantiles out of order: {what}"
            );
            assert!(run.etcd_metrics_read, "etcd /metrics not read: {what}");
            assert_eq!(
                run.server.proxy_cpu_seconds.is_some(),
                target != Target::Direct,
                "{what}"
            );
            assert_eq!(
                run.server.proxy_peak_rss_kib.is_some(),
                target != Target::Direct,
                "{what}"
            );
            // Whatever a proxy saves, direct etcd must see its own load.
            if target == Target::Direct {
                assert!(
                    run.upstream_units(scenario.scenario) > 0.0,
                    "etcd saw no load: {what}"
                );
            }
            match scenario.scenario {
                // A put cannot be cached or coalesced: it reaches etcd through every target.
                Scenario::Put => {
                    assert!(
                        run.server
                            .upstream
                            .requests
                            .get("Put")
                            .is_some_and(|n| *n > 0),
                        "{what}"
                    )
                }
                Scenario::WatchFanout => {
                    let watch = run
                        .watch
                        .as_ref()
                        .unwrap_or_else(|| panic!("no watch stats: {what}"));
                    assert_eq!(watch.watchers_created, watch.watchers, "{what}");
                    assert!(watch.puts > 0, "{what}");
                    assert_eq!(
                        watch.delivered, watch.expected,
                        "lost or duplicated events: {what}"
                    );
                    // 6 watchers, 3 per stream: two multiplexed Watch streams.
                    assert_eq!(watch.streams, 2, "{what}");
                    assert_eq!(watch.puts_complete, watch.puts, "{what}");
                    let fanout = watch
                        .fanout
                        .as_ref()
                        .unwrap_or_else(|| panic!("no fan-out latency: {what}"));
                    // Every put complete: the slowest put's last delivery is the slowest delivery.
                    assert_eq!(fanout.max_ms, latency.max_ms, "{what}");
                    assert!(fanout.p50_ms <= fanout.p99_ms, "{what}");
                    assert_eq!(
                        watch.idle_memory.is_some(),
                        target != Target::Direct,
                        "idle memory is read from proxies only: {what}"
                    );
                }
                Scenario::RangeSerializable | Scenario::RangeLinearizable | Scenario::Mixed => {
                    assert!(
                        run.client_reads.is_some_and(|r| r > 0.0),
                        "client reads: {what}"
                    );
                    assert!(run.range_per_read().is_some(), "{what}");
                    assert!(run.etcd_cpu_us_per_read().is_some(), "{what}");
                    let hits = run.server.proxy_cache.map(|c| c.hits);
                    match target {
                        Target::Direct => assert_eq!(hits, None, "{what}"),
                        // etcd 3.4's Go proxy does not serve its own metrics (its /metrics relays etcd's).
                        Target::GoProxy => {}
                        // This proxy's cache answers serializable reads.
                        Target::RustProxy => {
                            if scenario.scenario == Scenario::RangeSerializable {
                                assert!(hits.is_some_and(|h| h > 0.0), "no cache hit: {what}");
                            }
                        }
                        Target::RustProxyNoCache => {
                            assert!(hits.is_none_or(|h| h == 0.0), "cache hits: {what}")
                        }
                        // Not run here: the run names no baseline build.
                        Target::BaselineProxy => {}
                    }
                }
                Scenario::LeaseKeepalive => {
                    assert!(run.server.window_seconds > 0.0, "{what}");
                    if target == Target::Direct {
                        assert!(
                            run.server
                                .upstream
                                .streams_open
                                .get("LeaseKeepAlive")
                                .is_some_and(|n| *n >= 1),
                            "direct keep-alive streams are open on etcd: {what}"
                        );
                    }
                }
                _ => {}
            }
        }
        assert_eq!(
            scenario.summaries.len(),
            targets.len(),
            "{name}: a summary per target"
        );
    }

    let written = bench::report::write(&report, out.path()).expect("write the report");
    let names: Vec<String> = written
        .iter()
        .map(|p| {
            p.file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    for expected in [
        "quick-test.json",
        "quick-test.md",
        "quick-test-3.4.23-throughput.svg",
        "quick-test-3.4.23-p99.svg",
        "quick-test-3.4.23-upstream.svg",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not written: {names:?}"
        );
    }
    for path in &written {
        let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
        assert!(len > 0, "{} is empty", path.display());
    }
    let json =
        std::fs::read_to_string(out.path().join("quick-test.json")).expect("read the JSON report");
    let parsed: Report = serde_json::from_str(&json).expect("the JSON report parses back");
    assert_eq!(parsed.versions[0].scenarios.len(), Scenario::ALL.len());
    let markdown = std::fs::read_to_string(out.path().join("quick-test.md"))
        .expect("read the markdown report");
    for scenario in Scenario::ALL {
        assert!(
            markdown.contains(scenario.label()),
            "{} missing from the table",
            scenario.label()
        );
    }
    for section in [
        "Watch fan-out (medians",
        "Lease keep-alive (medians",
        "Handshakes (medians",
        "Range load reaching etcd (medians",
        "Write to visible (",
        "| range-serializable | this-proxy-nocache |",
        "| write-to-visible | go-proxy |",
        "- transport: plaintext",
    ] {
        assert!(markdown.contains(section), "{section} missing: {markdown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quick_tls_mode_runs_each_case_in_plaintext_and_over_mutual_tls_and_counts_handshakes() {
    let Some(etcd) = Version::V3_4_23.require() else {
        return;
    };
    let out = testkit::dirs::temp_dir("bench-quick-tls-").expect("temporary output directory");
    let scenarios = vec![Scenario::Put, Scenario::WatchFanout, Scenario::Handshake];
    let plan = Plan {
        name: "quick-tls".into(),
        tls: TlsMode::Both,
        scenarios: scenarios.clone(),
        ..quick_plan(etcd, out.path())
    };
    let report = bench::runner::run(&plan).await;

    let version = &report.versions[0];
    assert_eq!(version.failure, None, "a stack did not start");
    let measured: Vec<(Scenario, bool)> = version
        .scenarios
        .iter()
        .map(|s| (s.scenario, s.tls))
        .collect();
    let expected: Vec<(Scenario, bool)> = scenarios
        .iter()
        .flat_map(|&s| [(s, false), (s, true)])
        .collect();
    assert_eq!(measured, expected, "each case in plaintext, then over TLS");
    for scenario in &version.scenarios {
        assert_eq!(
            scenario.runs.len(),
            3,
            "{}: a run per target",
            scenario.name()
        );
        for run in &scenario.runs {
            let what = format!("{} at {}: {run:#?}", scenario.name(), run.target.label());
            assert!(run.client.completed > 0, "nothing completed: {what}");
            assert_eq!(run.client.errors, 0, "errors: {what}");
            assert!(run.etcd_metrics_read, "etcd /metrics not read: {what}");
            match (&run.tls_session, scenario.tls) {
                (Some(session), true) => assert!(session.starts_with("TLSv1_"), "{what}"),
                (None, false) => {}
                _ => panic!("a TLS session exactly on the TLS stack: {what}"),
            }
            if scenario.scenario == Scenario::Handshake {
                // Each connection made one range, and the range reached etcd through every target.
                assert!(run.server.upstream.kv_requests() > 0, "{what}");
                assert_eq!(
                    run.server.proxy_cpu_seconds.is_some(),
                    run.target != Target::Direct,
                    "{what}"
                );
            }
        }
    }
    let markdown = bench::report::table::markdown(&report);
    for section in [
        "- transport: each case twice, on a plaintext stack and on a TLS stack",
        "TLS the benchmark's clients negotiated: direct `TLSv1_",
        "| handshake (TLS) | this-proxy |",
        "| handshake | this-proxy |",
        "TLS against plaintext (same rounds",
        "| put | this-proxy | ",
    ] {
        assert!(markdown.contains(section), "{section} missing: {markdown}");
    }
}
