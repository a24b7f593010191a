//! The side-by-side run: for each etcd version a fresh [`Stack`] (etcd, its Go proxy, this proxy, and this proxy
//! with its range cache off when a scenario of the run visits it; or one per scenario case with
//! [`Plan::fresh_stack`]); for each scenario case, rounds that visit direct, Go proxy and this proxy in turn
//! (A B C A B C ...; for the read scenarios and write-to-visible also this proxy without its cache: A B C D A B C D
//! ..., see [`Scenario::targets`]; with `--baseline-bin` also the older build: A B C D E A B C D E ..., see
//! [`Plan::targets`]) so that the noise of a shared machine falls on all of them alike. With `--tls` the
//! stack and every client speak mutual TLS; with `--tls=both` a plaintext stack and a TLS stack run side by side,
//! and each round visits the targets on the one, then on the other (A B C A' B' C' ...), each transport's
//! runs making a result of their own.

use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Channel;

use crate::load::handshake::Handshake;
use crate::load::kv::{self, Mixed, Put, Range};
use crate::load::lease::LeaseKeepalive;
use crate::load::recorder::Recorder;
use crate::load::visible::{self, WriteToVisible};
use crate::load::watch::WatchFanout;
use crate::load::{Shape, drive};
use crate::meter::Meter;
use crate::plan::{Case, EtcdBinary, Plan, Scenario, Target};
use crate::results::{Report, Run, ScenarioResult, VersionResult};
use crate::services::{Extras, Service, Stack};
use crate::sys::procfs;
use crate::upstream;
use testkit::http;

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
        check_targets: plan.check_targets,
        tls: plan.tls,
        baseline_bin: plan.baseline_bin.clone(),
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
    let cases = Case::all(&plan.scenarios, &plan.sizes);
    let transports = plan.tls.transports();
    // One stack per transport, each with a channel straight to its etcd.
    let mut current: Vec<(Stack, Channel)> = Vec::new();
    for case in cases {
        if plan.fresh_stack {
            // Dropping the old stacks first: their processes end before the new ones start.
            current.clear();
        }
        if current.is_empty() {
            // This proxy without its cache runs only if a case that visits it will run on this stack.
            let visits_nocache =
                |scenario: Scenario| scenario.targets().contains(&Target::RustProxyNoCache);
            let nocache = if plan.fresh_stack {
                visits_nocache(case.scenario)
            } else {
                plan.scenarios.iter().any(|&s| visits_nocache(s))
            };
            // The baseline build runs where this proxy without its cache does (Scenario::targets_with).
            let extras = Extras {
                nocache,
                baseline: plan.baseline_bin.as_deref().filter(|_| nocache),
            };
            for &tls in transports {
                match start_stack(plan, etcd, tls, extras, &mut result).await {
                    Ok(ready) => current.push(ready),
                    Err(failure) => {
                        result.failure = Some(failure);
                        return result;
                    }
                }
            }
        }
        let variant = case.variant(&plan.sizes);
        let mut runs: Vec<Vec<Run>> = vec![Vec::new(); current.len()];
        for round in 0..plan.timing.rounds {
            for ((stack, direct), runs) in current.iter().zip(&mut runs) {
                for target in plan.targets(case.scenario) {
                    let run = run_once(plan, stack, direct, case, target, round).await;
                    eprintln!(
                        "bench: etcd {} {}{}{} round {} {}",
                        etcd.version,
                        case.scenario.label(),
                        variant
                            .as_deref()
                            .map_or(String::new(), |v| format!(" {v}")),
                        if stack.tls() { " (TLS)" } else { "" },
                        round + 1,
                        brief(&run)
                    );
                    runs.push(run);
                }
            }
        }
        for ((stack, _), runs) in current.iter().zip(runs) {
            result.scenarios.push(ScenarioResult::new(
                case.scenario,
                variant.clone(),
                stack.tls(),
                size_of(plan, case, stack.tls()),
                runs,
            ));
        }
    }
    result
}

/// Starts etcd and both proxies (and the `extras`: this proxy with its range cache off, the baseline build; with
/// mutual TLS on every link if `tls`), records the proxies' idle memory (of the first stack of the version only)
/// and writes the hot set; returns the stack and a channel straight to etcd.
async fn start_stack(
    plan: &Plan,
    etcd: &EtcdBinary,
    tls: bool,
    extras: Extras<'_>,
    result: &mut VersionResult,
) -> Result<(Stack, Channel), String> {
    eprintln!(
        "bench: etcd {}: starting etcd, its Go proxy and this proxy{}{}{}",
        etcd.version,
        if extras.nocache {
            " (with its range cache, and a second one without)"
        } else {
            ""
        },
        extras.baseline.map_or(String::new(), |bin| format!(
            ", and the baseline build {}",
            bin.display()
        )),
        if tls {
            ", mutual TLS on every link"
        } else {
            ""
        }
    );
    let stack = Stack::start(
        etcd,
        &plan.proxy_bin,
        &plan.namespace,
        &plan.proxy_args,
        tls,
        extras,
    )
    .await?;
    if result.idle_rss_mib.is_empty() {
        for target in Target::ALL.into_iter().filter(|&t| t != Target::Direct) {
            if let Some(pid) = stack.proxy(target).map(|p| p.pid())
                && let Ok(memory) = procfs::memory(pid)
            {
                result
                    .idle_rss_mib
                    .push((target, memory.rss_kib as f64 / 1024.0));
            }
        }
    }
    let direct = match stack.etcd().dialer().dial().await {
        Ok(channel) => channel,
        Err(e) => return Err(format!("cannot connect to etcd: {e}")),
    };
    // Once where direct etcd's clients read it, and once where the proxies' namespace keeps it.
    let mut prefixes = vec![""];
    if !plan.namespace.is_empty() {
        prefixes.push(&plan.namespace);
    }
    for prefix in prefixes {
        kv::populate_hot_set(
            direct.clone(),
            prefix,
            plan.sizes.hot_keys,
            plan.sizes.value_size,
        )
        .await
        .map_err(|status| format!("cannot write the hot set: {status}"))?;
    }
    Ok((stack, direct))
}

async fn run_once(
    plan: &Plan,
    stack: &Stack,
    direct: &Channel,
    case: Case,
    target: Target,
    round: usize,
) -> Run {
    let scenario = case.scenario;
    let sizes = &plan.sizes;
    let failed = |e: String, tls_session: Option<String>| {
        let mut failed = Recorder::new();
        failed.failure(e);
        Run {
            round,
            target,
            client: failed.tally(plan.timing.measured()),
            server: Default::default(),
            etcd_metrics_read: false,
            watch: None,
            tls_session,
            client_reads: None,
            visibility: None,
        }
    };
    let dialer = match stack.entry(target) {
        Ok(entry) => entry.dialer(),
        Err(e) => return failed(e, None),
    };
    let meter = Meter::new(&stack.etcd(), stack.proxy(target));
    let connected = match scenario {
        // Its clients open their own connections.
        Scenario::Handshake => Ok(Vec::new()),
        Scenario::WatchFanout => dialer.connect(sizes.watch_connections).await,
        // One client reading through the target.
        Scenario::WriteToVisible => dialer.connect(1).await,
        _ => dialer.connect(sizes.connections).await,
    };
    let channels = match connected {
        Ok(channels) => channels,
        Err(e) => return failed(e, dialer.negotiated()),
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
    let mut visibility = None;
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
        Scenario::Handshake => {
            let clients = vec![dialer.clone(); sizes.connections.max(1)];
            let op = Handshake { call: range(false) };
            drive(&clients, &shape, Arc::new(op), &meter).await
        }
        Scenario::WatchFanout => {
            let fanout = WatchFanout {
                watchers: sizes.watchers,
                watchers_per_stream: sizes.watchers_per_stream,
                put_rate: case.watch_put_rate.unwrap_or(1.0),
                measured: plan.timing.measured(),
                value_size: sizes.value_size,
                etcd_prefix: match target {
                    Target::Direct => Vec::new(),
                    _ => plan.namespace.as_bytes().to_vec(),
                },
                warmup_event: false,
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
        Scenario::WriteToVisible => {
            let key = visible::key(target.label());
            let run = WriteToVisible {
                etcd_key: match target {
                    Target::Direct => key.clone(),
                    _ => [plan.namespace.as_bytes(), &key].concat(),
                },
                key,
                writes: sizes.visible_writes,
                wait: Duration::from_secs_f64(sizes.visible_wait_seconds.max(0.0)),
                give_up_after: sizes.visible_give_up_after,
                warmup: plan.timing.warmup(),
                value_size: sizes.value_size,
                tag: format!("{} round {}", target.label(), round + 1),
            };
            let (tally, stats) = run.run(channels[0].clone(), direct.clone(), &meter).await;
            visibility = Some(stats);
            tally
        }
    };
    let client_reads = match &visibility {
        Some(stats) => Some(stats.reads as f64),
        None => scenario
            .read_share(sizes)
            .map(|share| client.completed as f64 * share),
    };
    drop(channels);
    if let (Scenario::WatchFanout, Some(baseline)) = (scenario, meter.baseline_watchers()) {
        settle_watchers(&stack.etcd(), baseline).await;
    }
    Run {
        round,
        target,
        client,
        server: meter.cost(),
        etcd_metrics_read: meter.read_etcd_metrics(),
        watch,
        tls_session: dialer.negotiated(),
        client_reads,
        visibility,
    }
}

/// Waits (bounded) until etcd holds no more watchers than before the run (the Go proxy keeps a couple of its
/// own), so that one run's watchers do not linger into the next.
async fn settle_watchers(etcd: &Service, baseline: f64) {
    let deadline = tokio::time::Instant::now() + SETTLE_TIMEOUT;
    loop {
        let watchers = match http::get_with(etcd.addr(), "/metrics", etcd.http_tls()).await {
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
        "{:<18} {:>9.0}/s p99 {:>7.2} ms errors {}",
        run.target.label(),
        c.throughput,
        p99,
        c.errors
    );
    if let Some(v) = &run.visibility {
        line.push_str(&format!(
            " (write to visible: {} of {} writes seen, {} never within {} s, {} not attempted)",
            v.seen, v.writes, v.never, v.wait_seconds, v.not_attempted
        ));
    }
    if let Some(first) = c.error_samples.first() {
        line.push_str(&format!(" (first: {first})"));
    }
    if !run.server.problems.is_empty() {
        line.push_str(&format!(" [metrics: {}]", run.server.problems.join("; ")));
    }
    line
}

/// The case's size in words (`tls`: on the TLS stack).
pub fn size_of(plan: &Plan, case: Case, tls: bool) -> String {
    let s = &plan.sizes;
    let load = match s.rate {
        Some(rate) => format!("{} conns, fixed {rate} req/s", s.connections),
        None => format!("{} conns x {} in flight", s.connections, s.inflight),
    };
    match case.scenario {
        Scenario::Put => format!("{load}, {} B values over {} keys", s.value_size, s.put_keys),
        Scenario::RangeLinearizable | Scenario::RangeSerializable => {
            format!("{load}, {} hot keys of {} B", s.hot_keys, s.value_size)
        }
        Scenario::Mixed => format!(
            "{load}, {}% serializable / {}% linearizable range, rest put",
            s.mixed_serializable_pct, s.mixed_linearizable_pct
        ),
        Scenario::WatchFanout => format!(
            "{} watchers on 1 key, {} per Watch stream, over {} conns, {} puts/s",
            s.watchers,
            s.watchers_per_stream,
            s.watch_connections,
            case.watch_put_rate.unwrap_or(f64::NAN)
        ),
        Scenario::LeaseKeepalive => format!(
            "{} leases of TTL {} s over {} streams ({} conns), each refreshed every TTL/3",
            s.leases, s.lease_ttl, s.lease_streams, s.connections
        ),
        Scenario::Handshake => {
            let clients = match s.rate {
                Some(rate) => format!("{} clients, fixed {rate} connections/s", s.connections),
                None => format!("{} clients", s.connections * s.inflight.max(1)),
            };
            let setup = if tls {
                "TCP, full TLS handshake (no resumption) and HTTP/2"
            } else {
                "TCP and HTTP/2 (in the clear)"
            };
            format!(
                "{clients}, each opening connection after connection: {setup}, one linearizable range of one of {} \
                 hot keys, close",
                s.hot_keys
            )
        }
        Scenario::WriteToVisible => format!(
            "1 client: {} writes of {} B made directly on etcd, each awaited up to {} s in serializable reads of the \
             key through the target, back to back on 1 conn; a run stops after {} writes in a row never seen",
            s.visible_writes, s.value_size, s.visible_wait_seconds, s.visible_give_up_after
        ),
    }
}
