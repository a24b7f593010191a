//! `gateway.md` (the figures as tables) and `gateway.json` (the whole report) of a `bench gateway` run.

use std::path::{Path, PathBuf};

use super::GatewayReport;
use super::unary::{Call, Route, UnarySummary};

fn ms(value: Option<f64>) -> String {
    value.map_or("—".into(), |v| format!("{v:.2}"))
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "—".into(),
    }
}

fn fanout_section(report: &GatewayReport) -> String {
    let mut out = String::from(
        "## Watch fan-out: one key, every watcher through the proxy\n\n\
         | transport | watchers (connections) | etcd watchers added | puts (every) | delivered / expected | missing | \
         duplicates | failed streams | latency p50 / p99 / max (ms) | CPU s: proxy / etcd / bench | created in (s) |\n\
         |---|---|--:|---|--:|--:|--:|--:|---|---|--:|\n",
    );
    for p in &report.fanout {
        let latency = p.latency.as_ref();
        out.push_str(&format!(
            "| {} | {} ({}) | {} | {} ({} ms) | {} / {} | {} | {} | {} | {} / {} / {} | {:.2} / {:.2} / {:.2} | {:.2} |\n",
            p.transport.label(),
            p.watchers,
            p.connections,
            p.etcd_watchers_added,
            p.puts,
            p.put_interval_ms,
            p.delivered,
            p.expected,
            p.missing,
            p.duplicates,
            p.stream_errors,
            ms(latency.map(|l| l.p50_ms)),
            ms(latency.map(|l| l.p99_ms)),
            ms(latency.map(|l| l.max_ms)),
            p.cpu.proxy_seconds,
            p.cpu.etcd_seconds,
            p.cpu.bench_seconds,
            p.create_seconds,
        ));
    }
    out.push_str(
        "\n| transport | put to its last delivery (ms): first put | 25% | 50% | 75% | last put |\n\
         |---|--:|--:|--:|--:|--:|\n",
    );
    for p in &report.fanout {
        let by_put = &p.last_delivery_ms_by_put;
        let at = |fraction: f64| {
            by_put
                .get(((by_put.len().saturating_sub(1)) as f64 * fraction).round() as usize)
                .map_or("—".into(), |ms| format!("{ms:.2}"))
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            p.transport.label(),
            at(0.0),
            at(0.25),
            at(0.5),
            at(0.75),
            at(1.0)
        ));
    }
    out.push_str(&format!(
        "\nLatency: from a put's send (straight to etcd) to its event's arrival at a watcher, over every watcher and \
         every put. CPU: used from the first put to the last delivery. Gateway / gRPC p99: {}.\n\n",
        report
            .fanout_p99_ratio()
            .map_or("—".into(), |r| format!("{r:.2}x"))
    ));
    out
}

fn unary_row(s: &UnarySummary) -> String {
    let rounds = s
        .calls_per_second_by_round
        .iter()
        .map(|c| format!("{c:.0}"))
        .collect::<Vec<_>>()
        .join(", ");
    let proxy_cpu = if s.route.through_proxy() {
        format!("{:.1}", s.proxy_cpu_us_per_call)
    } else {
        "—".into()
    };
    format!(
        "| {} | {} | {:.0} | {} | {} | {} | {:.1} | {:.1} | {} / {} |\n",
        s.call.label(),
        s.route.label(),
        s.calls_per_second,
        rounds,
        s.errors,
        proxy_cpu,
        s.etcd_cpu_us_per_call,
        s.bench_cpu_us_per_call,
        ms(s.median_window_p50_ms),
        ms(s.median_window_p99_ms),
    )
}

fn unary_section(report: &GatewayReport) -> String {
    let rounds = report.unary.first().map_or(0, |s| s.rounds);
    let mut out = format!(
        "## Unary calls: the proxy's gateway against etcd's own\n\n\
         {clients} clients, each one keep-alive connection (HTTP/1.1 for the gateways, HTTP/2 for gRPC) with one call \
         in flight; rounds: {rounds}, each with a {warmup} s warm-up and a {window} s window per call and route, the two \
         gateways in alternating order. Range: one existing key; put: {value} bytes over 100 keys per client. Every \
         answer checked (HTTP 200, JSON with a header, one key for a range). CPU per call: utime + stime over the \
         windows / calls.\n\n\
         | call | route | calls/s | calls/s by round | errors | proxy CPU µs/call | etcd CPU µs/call | bench CPU \
         µs/call | p50 / p99 ms (median window) |\n|---|---|--:|---|--:|--:|--:|--:|---|\n",
        clients = report.clients,
        warmup = report.warmup_seconds,
        window = report.window_seconds,
        value = report.value_size,
    );
    for call in Call::ALL {
        for route in [Route::EtcdGateway, Route::ProxyGateway, Route::ProxyGrpc] {
            if let Some(s) = report.summary(call, route) {
                out.push_str(&unary_row(s));
            }
        }
    }
    out.push_str("\nThe proxy's gateway against etcd's: ");
    let lines: Vec<String> = Call::ALL
        .iter()
        .map(|&call| {
            let direct = report.summary(call, Route::EtcdGateway);
            let proxy = report.summary(call, Route::ProxyGateway);
            format!(
                "{} {} the calls/s, etcd CPU per call {}",
                call.label(),
                ratio(
                    proxy.map(|s| s.calls_per_second),
                    direct.map(|s| s.calls_per_second)
                ),
                ratio(
                    proxy.map(|s| s.etcd_cpu_us_per_call),
                    direct.map(|s| s.etcd_cpu_us_per_call)
                ),
            )
        })
        .collect();
    out.push_str(&lines.join("; "));
    out.push_str(".\n\n");
    out
}

/// The report as markdown.
pub fn render(report: &GatewayReport) -> String {
    let failures = report.failures();
    let verdict = match failures.is_empty() {
        true => String::new(),
        false => format!(
            "**This run FAILED:**\n\n{}\n\n",
            failures
                .iter()
                .map(|f| format!("- {f}"))
                .collect::<Vec<_>>()
                .join("\n")
        ),
    };
    let flags = match report.proxy_flags.is_empty() {
        true => "default flags: one worker thread, range cache on".to_string(),
        false => format!("`{}`", report.proxy_flags.join(" ")),
    };
    format!(
        "# etcd's JSON gateway through the proxy, etcd {version}\n\n\
         One etcd member and this proxy ({flags}) in front of it, all on loopback.\n\n{verdict}{fanout}{unary}\
         Machine: {machine}; load average (1, 5, 15 min) {load_before} at the start, {load_after} at the end. \
         Command: `{command}`.\n",
        version = report.etcd_version,
        fanout = fanout_section(report),
        unary = unary_section(report),
        machine = report.machine,
        load_before = report.load_average.0,
        load_after = report.load_average.1,
        command = report.command,
    )
}

/// Writes `gateway.md` and `gateway.json` into `dir`; returns their paths.
pub fn write(report: &GatewayReport, dir: &Path) -> Result<Vec<PathBuf>, String> {
    crate::report::write_md_json(dir, "gateway", render(report), report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::cpu::CpuUsed;
    use crate::gateway::fanout::{FanoutPhase, Transport};
    use crate::load::recorder::Latency;

    fn phase(transport: Transport, p99_ms: f64, missing: u64) -> FanoutPhase {
        FanoutPhase {
            transport,
            watchers: 10,
            connections: 2,
            puts: 3,
            put_interval_ms: 10.0,
            create_seconds: 0.1,
            etcd_watchers_before: 0.0,
            etcd_watchers_added: 1.0,
            warmed: 10,
            expected: 30,
            delivered: 30 - missing,
            missing,
            duplicates: 0,
            stream_errors: 0,
            error_samples: Vec::new(),
            latency: Some(Latency {
                p50_ms: 1.0,
                p99_ms,
                max_ms: p99_ms,
            }),
            last_delivery_ms_by_put: vec![1.0, 2.0, p99_ms],
            window_seconds: 0.05,
            cpu: CpuUsed::default(),
        }
    }

    fn report(missing: u64) -> GatewayReport {
        GatewayReport {
            etcd_version: "3.7.3".into(),
            command: "bench gateway".into(),
            machine: "test".into(),
            load_average: ("1.00 0.50 0.25".into(), "2.00 1.00 0.50".into()),
            proxy_flags: Vec::new(),
            fanout: vec![
                phase(Transport::Gateway, 3.0, missing),
                phase(Transport::Grpc, 2.0, 0),
            ],
            clients: 1,
            window_seconds: 1.0,
            warmup_seconds: 0.0,
            value_size: 64,
            unary_runs: Vec::new(),
            unary: Vec::new(),
        }
    }

    #[test]
    fn the_report_gives_the_p99_ratio_and_no_verdict_when_complete() {
        let text = render(&report(0));
        assert!(text.contains("Gateway / gRPC p99: 1.50x."), "{text}");
        assert!(!text.contains("FAILED"), "{text}");
    }

    #[test]
    fn a_missed_event_fails_the_run_loudly() {
        let report = report(1);
        assert_eq!(report.failures().len(), 1, "{:?}", report.failures());
        let text = render(&report);
        assert!(text.contains("**This run FAILED:**"), "{text}");
        assert!(text.contains("29 of 30 deliveries, 1 missing"), "{text}");
    }
}
