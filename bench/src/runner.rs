//! The side-by-side run: for each etcd version a fresh [`Stack`] (etcd, its Go proxy, this proxy); for each
//! scenario, rounds that visit direct, Go proxy and this proxy in turn (A B C A B C ...) so that the noise of a
//! shared machine falls on all three alike.

use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Channel;

use crate::load::kv::{self, Mixed, Put, Range};
use crate::load::lease::LeaseKeepalive;
use crate::load::recorder::Recorder;
use crate::load::watch::WatchFanout;
use crate::load::{Shape, connect, drive};
use crate::meter::Meter;
use crate::plan::{EtcdBinary, Plan, Scenario, Target};
use crate::results::{Report, Run, ScenarioResult, VersionResult};
use crate::services::Stack;
use crate::sys::{http, procfs};
use crate::upstream;

/// How long etcd may take to drop the watchers of a finished run before the next run starts anyway.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn run(plan: &Plan) -> Report {
    let mut versions = Vec::new();
    for etcd in &plan.etcds {
        versions.push(run_version(plan, etcd).await);
    }
    Report {
        name: plan.name.clone(),
        machine: plan.machine.clone(),
        command: plan.command.clone(),
        sizes: plan.sizes.clone(),
        timing: plan.timing.clone(),
        seed: plan.seed,
        versions,
    }
}

async fn run_version(plan: &Plan, etcd: &EtcdBinary) -> VersionResult {
    let mut result = VersionResult {
        version: etcd.version.clone(),
        idle_rss_mib: Vec::new(),
        scenarios: Vec::new(),
        failure: None,
    };
    eprintln!(
        "bench: etcd {}: starting etcd, its Go proxy and this proxy",
        etcd.version
    );
    let stack = match Stack::start(etcd, &plan.proxy_bin).await {
        Ok(stack) => stack,
        Err(e) => {
            result.failure = Some(e.to_string());
            return result;
        }
    };
    for target in [Target::GoProxy, Target::RustProxy] {
        if let Some(pid) = stack.proxy(target).map(|p| p.pid())
            && let Ok(memory) = procfs::memory(pid)
        {
            result
                .idle_rss_mib
                .push((target, memory.rss_kib as f64 / 1024.0));
        }
    }
    let direct = match connect(stack.etcd.addr(), 1).await {
        Ok(mut channels) => channels.remove(0),
        Err(e) => {
            result.failure = Some(format!("cannot connect to etcd: {e}"));
            return result;
        }
    };
    if let Err(status) =
        kv::populate_hot_set(direct.clone(), plan.sizes.hot_keys, plan.sizes.value_size).await
    {
        result.failure = Some(format!("cannot write the hot set: {status}"));
        return result;
    }
    for &scenario in &plan.scenarios {
        let mut runs = Vec::new();
        for round in 0..plan.timing.rounds {
            for target in Target::ALL {
                let run = run_once(plan, &stack, &direct, scenario, target, round).await;
                eprintln!(
                    "bench: etcd {} {} round {} {}",
                    etcd.version,
                    scenario.label(),
                    round + 1,
                    brief(&run)
                );
                runs.push(run);
            }
        }
        result
            .scenarios
            .push(ScenarioResult::new(scenario, size_of(plan, scenario), runs));
    }
    result
}

async fn run_once(
    plan: &Plan,
    stack: &Stack,
    direct: &Channel,
    scenario: Scenario,
    target: Target,
    round: usize,
) -> Run {
    let sizes = &plan.sizes;
    let entry = stack.entry(target);
    let meter = Meter::new(
        stack.etcd.addr(),
        stack.etcd.pid(),
        stack.proxy(target).map(|p| p.pid()),
    );
    let connections = match scenario {
        Scenario::WatchFanout => sizes.watch_connections,
        _ => sizes.connections,
    };
    let channels = match connect(entry.addr(), connections).await {
        Ok(channels) => channels,
        Err(e) => {
            let mut failed = Recorder::new();
            failed.failure(format!("connect to {}: {e}", entry.addr()));
            return Run {
                round,
                target,
                client: failed.tally(plan.timing.measured()),
                server: Default::default(),
                etcd_metrics_read: false,
                watch: None,
            };
        }
    };
    meter.baseline().await;
    let shape = Shape {
        inflight_per_connection: sizes.inflight,
        rate: sizes.rate,
        warmup: plan.timing.warmup(),
        measured: plan.timing.measured(),
        seed: plan.seed,
    };
    let value = Arc::new(vec![b'p'; sizes.value_size]);
    let range = |serializable| Range {
        hot_keys: sizes.hot_keys,
        serializable,
    };
    let mut watch = None;
    let client = match scenario {
        Scenario::Put => {
            let op = Put {
                keys: sizes.put_keys,
                value,
            };
            drive(&channels, &shape, Arc::new(op), &meter).await
        }
        Scenario::RangeLinearizable => {
            drive(&channels, &shape, Arc::new(range(false)), &meter).await
        }
        Scenario::RangeSerializable => {
            drive(&channels, &shape, Arc::new(range(true)), &meter).await
        }
        Scenario::Mixed => {
            let op = Mixed {
                serializable_pct: sizes.mixed_serializable_pct,
                linearizable_pct: sizes.mixed_linearizable_pct,
                serializable: range(true),
                linearizable: range(false),
                put: Put {
                    keys: sizes.put_keys,
                    value,
                },
            };
            drive(&channels, &shape, Arc::new(op), &meter).await
        }
        Scenario::WatchFanout => {
            let fanout = WatchFanout {
                watchers: sizes.watchers,
                put_rate: sizes.watch_put_rate,
                measured: plan.timing.measured(),
                value_size: sizes.value_size,
            };
            let (tally, stats) = fanout.run(&channels, direct.clone(), &meter).await;
            watch = Some(stats);
            tally
        }
        Scenario::LeaseKeepalive => {
            let keepalive = LeaseKeepalive {
                leases: sizes.leases,
                streams: sizes.lease_streams,
                ttl_seconds: sizes.lease_ttl,
                measured: plan.timing.measured(),
            };
            keepalive.run(&channels, direct.clone(), &meter).await
        }
    };
    drop(channels);
    if let (Scenario::WatchFanout, Some(baseline)) = (scenario, meter.baseline_watchers()) {
        settle_watchers(stack.etcd.addr(), baseline).await;
    }
    Run {
        round,
        target,
        client,
        server: meter.cost(),
        etcd_metrics_read: meter.read_etcd_metrics(),
        watch,
    }
}

/// Waits (bounded) until etcd holds no more watchers than before the run (the Go proxy keeps a couple of its
/// own), so that one run's watchers do not linger into the next.
async fn settle_watchers(etcd_addr: &str, baseline: f64) {
    let deadline = tokio::time::Instant::now() + SETTLE_TIMEOUT;
    loop {
        let watchers = match http::get(etcd_addr, "/metrics").await {
            Ok((200, body)) => upstream::parse(&body).watchers,
            _ => f64::NAN,
        };
        if watchers <= baseline {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            eprintln!(
                "bench: etcd still holds {watchers} watchers {SETTLE_TIMEOUT:?} after a watch run"
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn brief(run: &Run) -> String {
    let c = &run.client;
    let p99 = c.latency.as_ref().map_or(f64::NAN, |l| l.p99_ms);
    let mut line = format!(
        "{:<10} {:>9.0}/s p99 {:>7.2} ms errors {}",
        run.target.label(),
        c.throughput,
        p99,
        c.errors
    );
    if let Some(first) = c.error_samples.first() {
        line.push_str(&format!(" (first: {first})"));
    }
    if !run.server.problems.is_empty() {
        line.push_str(&format!(" [metrics: {}]", run.server.problems.join("; ")));
    }
    line
}

/// The scenario's size in words.
pub fn size_of(plan: &Plan, scenario: Scenario) -> String {
    let s = &plan.sizes;
    let load = match s.rate {
        Some(rate) => format!("{} conns, fixed {rate} req/s", s.connections),
        None => format!("{} conns x {} in flight", s.connections, s.inflight),
    };
    match scenario {
        Scenario::Put => format!("{load}, {} B values over {} keys", s.value_size, s.put_keys),
        Scenario::RangeLinearizable | Scenario::RangeSerializable => {
            format!("{load}, {} hot keys of {} B", s.hot_keys, s.value_size)
        }
        Scenario::Mixed => format!(
            "{load}, {}% serializable / {}% linearizable range, rest put",
            s.mixed_serializable_pct, s.mixed_linearizable_pct
        ),
        Scenario::WatchFanout => format!(
            "{} watchers on 1 key over {} conns, {} puts/s",
            s.watchers, s.watch_connections, s.watch_put_rate
        ),
        Scenario::LeaseKeepalive => format!(
            "{} leases of TTL {} s over {} streams ({} conns), each refreshed every TTL/3",
            s.leases, s.lease_ttl, s.lease_streams, s.connections
        ),
    }
}
