//! Unary throughput: C clients, each one keep-alive connection making one call after another (closed loop), for a
//! warm-up and then a measured window, on one route: etcd's own gateway, the proxy's gateway (both HTTP/1.1, JSON)
//! or the proxy over gRPC (tonic, for reference). Every answer is checked (HTTP 200 and JSON of the call's shape;
//! for gRPC, OK and the same shape); the rest count as errors. CPU of the proxy, etcd and this process is read at
//! the window's edges.

use std::time::Duration;

use bytes::Bytes;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::{PutRequest, RangeRequest};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;
use tonic::transport::Channel;

use super::client::{Http1, b64};
use super::cpu::{CpuMeter, CpuUsed};
use crate::load::dial::Dialer;
use crate::load::recorder::{Recorder, Tally};

/// The key every range reads (put before the first window).
pub const RANGE_KEY: &[u8] = b"gw-bench/range";
/// Keys each client's puts cycle through.
const PUT_KEYS_PER_CLIENT: usize = 100;

/// The calls measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Call {
    /// `range` of one existing key, `serializable: true`.
    RangeSerializable,
    /// `range` of one existing key, linearizable.
    RangeLinearizable,
    /// `put` of a small value.
    Put,
}

impl Call {
    pub const ALL: [Call; 3] = [Call::RangeSerializable, Call::RangeLinearizable, Call::Put];

    pub fn label(self) -> &'static str {
        match self {
            Call::RangeSerializable => "range (serializable)",
            Call::RangeLinearizable => "range (linearizable)",
            Call::Put => "put",
        }
    }
}

/// Where the calls go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Route {
    /// etcd's own gateway, on its client port.
    EtcdGateway,
    /// The proxy's gateway, in front of the same etcd.
    ProxyGateway,
    /// The proxy over gRPC.
    ProxyGrpc,
}

impl Route {
    pub fn label(self) -> &'static str {
        match self {
            Route::EtcdGateway => "etcd's gateway (direct)",
            Route::ProxyGateway => "proxy's gateway",
            Route::ProxyGrpc => "proxy, gRPC",
        }
    }

    pub fn through_proxy(self) -> bool {
        !matches!(self, Route::EtcdGateway)
    }
}

/// How each window is driven.
#[derive(Clone, Debug)]
pub struct UnaryPlan {
    pub clients: usize,
    pub warmup: Duration,
    pub window: Duration,
    pub value_size: usize,
}

/// Where the routes lead.
pub struct Addrs<'a> {
    pub etcd: &'a str,
    pub proxy: &'a str,
}

/// One measured window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnaryRun {
    pub call: Call,
    pub route: Route,
    pub round: usize,
    pub tally: Tally,
    pub cpu: CpuUsed,
}

/// One client's connection.
enum Connection {
    Http(Http1),
    Grpc(KvClient<Channel>),
}

impl Connection {
    async fn open(route: Route, addrs: &Addrs<'_>) -> Result<Self, String> {
        match route {
            Route::EtcdGateway => Http1::connect(addrs.etcd).await.map(Connection::Http),
            Route::ProxyGateway => Http1::connect(addrs.proxy).await.map(Connection::Http),
            Route::ProxyGrpc => Dialer::new(addrs.proxy, None)
                .dial()
                .await
                .map(|channel| Connection::Grpc(KvClient::new(channel))),
        }
    }

    /// Makes call number `i` of client `client`; an error unless it succeeded with an answer of the right shape.
    async fn call(
        &mut self,
        call: Call,
        client: usize,
        i: usize,
        value: &[u8],
    ) -> Result<(), String> {
        let put_key = || format!("gw-bench/put/{client}/{}", i % PUT_KEYS_PER_CLIENT).into_bytes();
        match self {
            Connection::Http(http) => {
                let (path, body) = match call {
                    Call::RangeSerializable => (
                        "/v3/kv/range",
                        format!(r#"{{"key":"{}","serializable":true}}"#, b64(RANGE_KEY)),
                    ),
                    Call::RangeLinearizable => {
                        ("/v3/kv/range", format!(r#"{{"key":"{}"}}"#, b64(RANGE_KEY)))
                    }
                    Call::Put => (
                        "/v3/kv/put",
                        format!(
                            r#"{{"key":"{}","value":"{}"}}"#,
                            b64(&put_key()),
                            b64(value)
                        ),
                    ),
                };
                let (status, answer) = http.post(path, Bytes::from(body)).await?;
                check_json(call, status, &answer)
            }
            Connection::Grpc(kv) => {
                let status = |s: tonic::Status| format!("{:?}: {}", s.code(), s.message());
                match call {
                    Call::RangeSerializable | Call::RangeLinearizable => {
                        let answer = kv
                            .range(RangeRequest {
                                key: RANGE_KEY.to_vec(),
                                serializable: call == Call::RangeSerializable,
                                ..Default::default()
                            })
                            .await
                            .map_err(status)?
                            .into_inner();
                        match answer.kvs.len() {
                            1 => Ok(()),
                            n => Err(format!("range answered {n} keys, not 1")),
                        }
                    }
                    Call::Put => kv
                        .put(PutRequest {
                            key: put_key(),
                            value: value.to_vec(),
                            ..Default::default()
                        })
                        .await
                        .map(drop)
                        .map_err(status),
                }
            }
        }
    }
}

/// Whether a gateway answer is what the call should get: HTTP 200 and a JSON object with a header, holding one
/// key for a range.
fn check_json(call: Call, status: u16, body: &[u8]) -> Result<(), String> {
    let text = || {
        String::from_utf8_lossy(body)
            .chars()
            .take(200)
            .collect::<String>()
    };
    if status != 200 {
        return Err(format!("HTTP {status}: {}", text()));
    }
    let json: Value =
        serde_json::from_slice(body).map_err(|e| format!("not JSON ({e}): {}", text()))?;
    if !json["header"].is_object() {
        return Err(format!("no header: {}", text()));
    }
    match call {
        Call::Put => Ok(()),
        Call::RangeSerializable | Call::RangeLinearizable => {
            match json["kvs"].as_array().map(Vec::len) {
                Some(1) => Ok(()),
                n => Err(format!("range answered {n:?} keys, not 1: {}", text())),
            }
        }
    }
}

/// One client's closed loop until `end`: successes that complete from `measured_from` on are recorded, failures
/// at any time. A failed connection is replaced.
async fn drive(
    mut connection: Connection,
    route: Route,
    addrs: (String, String),
    call: Call,
    client: usize,
    value: Vec<u8>,
    (measured_from, end): (Instant, Instant),
) -> Recorder {
    let mut recorder = Recorder::new();
    let mut i = 0;
    while Instant::now() < end {
        let started = Instant::now();
        let outcome = connection.call(call, client, i, &value).await;
        let done = Instant::now();
        i += 1;
        match outcome {
            Ok(()) if done >= measured_from => recorder.success(done - started),
            Ok(()) => {}
            Err(e) => {
                recorder.failure(e);
                let addrs = Addrs {
                    etcd: &addrs.0,
                    proxy: &addrs.1,
                };
                match Connection::open(route, &addrs).await {
                    Ok(fresh) => connection = fresh,
                    Err(e) => {
                        recorder.failure(format!("reconnect: {e}"));
                        break;
                    }
                }
            }
        }
    }
    recorder
}

/// Measures `call` on `route` for one window.
pub async fn measure(
    call: Call,
    route: Route,
    round: usize,
    plan: &UnaryPlan,
    addrs: &Addrs<'_>,
    cpu: &CpuMeter,
) -> Result<UnaryRun, String> {
    let mut connections = Vec::with_capacity(plan.clients);
    for _ in 0..plan.clients {
        connections.push(Connection::open(route, addrs).await?);
    }
    let measured_from = Instant::now() + plan.warmup;
    let end = measured_from + plan.window;
    let clients: Vec<_> = connections
        .into_iter()
        .enumerate()
        .map(|(client, connection)| {
            tokio::spawn(drive(
                connection,
                route,
                (addrs.etcd.to_string(), addrs.proxy.to_string()),
                call,
                client,
                vec![b'v'; plan.value_size],
                (measured_from, end),
            ))
        })
        .collect();
    tokio::time::sleep_until(measured_from).await;
    let start = cpu.read()?;
    tokio::time::sleep_until(end).await;
    let used = cpu.read()?.since(&start);
    let mut recorder = Recorder::new();
    for client in clients {
        let tally = client
            .await
            .map_err(|e| format!("a client's task failed: {e}"))?;
        recorder.merge(&tally);
    }
    Ok(UnaryRun {
        call,
        route,
        round,
        tally: recorder.tally(plan.window),
        cpu: used,
    })
}

/// Every window of one call on one route, added up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UnarySummary {
    pub call: Call,
    pub route: Route,
    pub rounds: usize,
    pub calls: u64,
    pub errors: u64,
    pub seconds: f64,
    /// Calls per second of each window, in the order run.
    pub calls_per_second_by_round: Vec<f64>,
    /// All calls over all windows' seconds.
    pub calls_per_second: f64,
    /// CPU microseconds per call, over all windows (the proxy's also where it was idle, for the direct route).
    pub proxy_cpu_us_per_call: f64,
    pub etcd_cpu_us_per_call: f64,
    pub bench_cpu_us_per_call: f64,
    /// Latency percentiles of the window with the median throughput (p50/p99/max, ms).
    pub median_window_p50_ms: Option<f64>,
    pub median_window_p99_ms: Option<f64>,
}

/// The summary of the windows of `call` on `route` among `runs`; None when there were none.
pub fn summarize(runs: &[UnaryRun], call: Call, route: Route) -> Option<UnarySummary> {
    let windows: Vec<&UnaryRun> = runs
        .iter()
        .filter(|r| r.call == call && r.route == route)
        .collect();
    if windows.is_empty() {
        return None;
    }
    let calls: u64 = windows.iter().map(|r| r.tally.completed).sum();
    let seconds: f64 = windows.iter().map(|r| r.tally.seconds).sum();
    let mut cpu = CpuUsed::default();
    windows.iter().for_each(|r| cpu.add(&r.cpu));
    let per_call = |seconds: f64| match calls {
        0 => f64::NAN,
        n => seconds * 1e6 / n as f64,
    };
    let mut by_throughput = windows.clone();
    by_throughput.sort_by(|a, b| a.tally.throughput.total_cmp(&b.tally.throughput));
    let median = by_throughput[by_throughput.len() / 2];
    Some(UnarySummary {
        call,
        route,
        rounds: windows.len(),
        calls,
        errors: windows.iter().map(|r| r.tally.errors).sum(),
        seconds,
        calls_per_second_by_round: windows.iter().map(|r| r.tally.throughput).collect(),
        calls_per_second: calls as f64 / seconds.max(1e-9),
        proxy_cpu_us_per_call: per_call(cpu.proxy_seconds),
        etcd_cpu_us_per_call: per_call(cpu.etcd_seconds),
        bench_cpu_us_per_call: per_call(cpu.bench_seconds),
        median_window_p50_ms: median.tally.latency.as_ref().map(|l| l.p50_ms),
        median_window_p99_ms: median.tally.latency.as_ref().map(|l| l.p99_ms),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_answers_are_checked_for_status_json_and_shape() {
        let range = br#"{"header":{"revision":"3"},"kvs":[{"key":"aw=="}],"count":"1"}"#;
        assert_eq!(check_json(Call::RangeLinearizable, 200, range), Ok(()));
        assert_eq!(check_json(Call::Put, 200, br#"{"header":{}}"#), Ok(()));
        let missing = br#"{"header":{"revision":"3"}}"#;
        assert!(check_json(Call::RangeSerializable, 200, missing).is_err());
        assert!(check_json(Call::Put, 404, br#"{"code":5}"#).is_err());
        assert!(check_json(Call::Put, 200, b"<html>").is_err());
        assert!(check_json(Call::Put, 200, br#"{"code":5}"#).is_err());
    }

    fn run(route: Route, round: usize, completed: u64, proxy_cpu: f64) -> UnaryRun {
        UnaryRun {
            call: Call::Put,
            route,
            round,
            tally: Tally {
                completed,
                errors: round as u64,
                error_samples: Vec::new(),
                seconds: 10.0,
                throughput: completed as f64 / 10.0,
                latency: None,
            },
            cpu: CpuUsed {
                proxy_seconds: proxy_cpu,
                etcd_seconds: 1.0,
                bench_seconds: 0.0,
            },
        }
    }

    #[test]
    fn a_summary_adds_up_the_windows_of_its_call_and_route_only() {
        let runs = [
            run(Route::ProxyGateway, 0, 10_000, 0.5),
            run(Route::EtcdGateway, 0, 99, 0.0),
            run(Route::ProxyGateway, 1, 30_000, 1.5),
        ];
        let summary = summarize(&runs, Call::Put, Route::ProxyGateway).expect("two windows");
        assert_eq!(
            (summary.rounds, summary.calls, summary.errors),
            (2, 40_000, 1)
        );
        assert_eq!(summary.calls_per_second, 2000.0);
        assert_eq!(summary.calls_per_second_by_round, vec![1000.0, 3000.0]);
        assert!(
            (summary.proxy_cpu_us_per_call - 50.0).abs() < 1e-9,
            "{summary:?}"
        );
        assert!(
            (summary.etcd_cpu_us_per_call - 50.0).abs() < 1e-9,
            "{summary:?}"
        );
        assert_eq!(
            summarize(&runs, Call::RangeLinearizable, Route::ProxyGateway),
            None
        );
    }
}
