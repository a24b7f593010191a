//! `bench gateway`: issue 34's measurement of etcd's JSON gateway through this proxy, in one run against one etcd
//! member with the proxy (default flags) in front of it.
//!
//! 1. Watch fan-out ([`fanout`]): N watchers of one key through the proxy over the gateway (HTTP/2 streams), then,
//!    in a phase of its own, N over gRPC; for each, the watchers etcd's own gauge gains and the latency from each
//!    of P paced puts (made straight on etcd) to its arrival at every watcher. Every watcher must see every put.
//! 2. Unary calls ([`unary`]): serializable and linearizable ranges of one key and small puts from C keep-alive
//!    HTTP/1.1 clients, against etcd's own gateway and the proxy's in turn, round after round (and the proxy over
//!    gRPC for reference): calls per second, and CPU per call of the proxy, etcd and this benchmark.
//!
//! [`table`] writes `gateway.md` and `gateway.json`. The benchmark asserts nothing about speed; it measures. A run
//! where a watcher missed an event or a call failed still writes its report, and the command then fails.

pub mod client;
pub mod cpu;
pub mod fanout;
pub mod table;
pub mod unary;

use std::path::PathBuf;
use std::time::Duration;

use proto::etcdserverpb::PutRequest;
use proto::etcdserverpb::kv_client::KvClient;
use serde::{Deserialize, Serialize};
use testkit::{EtcdCluster, ProxyProcess};

use crate::load::dial::Dialer;
use crate::plan::EtcdBinary;
use cpu::CpuMeter;
use fanout::{FanoutPhase, FanoutPlan, Servers, Transport};
use unary::{Addrs, Call, Route, UnaryPlan, UnaryRun, UnarySummary};

pub use table::{render, write};

/// `bench gateway`'s flags.
#[derive(Clone, Debug, clap::Args)]
pub struct Options {
    /// The etcd to run, as VERSION=PATH to its `etcd`. Default: the newest version the test kit finds installed.
    #[arg(long = "etcd", value_parser = EtcdBinary::parse)]
    pub etcd: Option<EtcdBinary>,
    /// The `etcd-grpc-proxy` binary. Default: the test kit's (`ETCD_GRPC_PROXY_BIN`, else the release build, built
    /// or confirmed up to date by cargo).
    #[arg(long)]
    pub proxy_bin: Option<PathBuf>,
    /// Watchers of the one key in each fan-out phase (gateway, then gRPC).
    #[arg(long, default_value_t = 1000)]
    pub watchers: usize,
    /// Connections the watchers are spread over (HTTP/2 for the gateway, gRPC otherwise), one watch per stream.
    #[arg(long, default_value_t = 10)]
    pub watch_connections: usize,
    /// Puts of the watched key in each fan-out phase, made straight on etcd.
    #[arg(long, default_value_t = 200)]
    pub puts: usize,
    /// Milliseconds between two puts.
    #[arg(long, default_value_t = 10)]
    pub put_interval_ms: u64,
    /// Concurrent unary clients, each one keep-alive connection with one call in flight.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Seconds of each measured unary window.
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Seconds of calls before each window, not counted.
    #[arg(long, default_value_t = 1.0)]
    pub warmup_seconds: f64,
    /// Rounds of unary windows; each round visits every call on every route, the two gateways in alternating order.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Bytes of each put's value.
    #[arg(long, default_value_t = 64)]
    pub value_size: usize,
    /// A flag for the proxy (repeatable), e.g. `--proxy-arg=--worker-threads=0`; none by default.
    #[arg(long = "proxy-arg", value_name = "FLAG", allow_hyphen_values = true)]
    pub proxy_args: Vec<String>,
    /// Skips the proxy over gRPC in the unary windows (a reference, not the comparison).
    #[arg(long)]
    pub no_grpc_unary: bool,
    /// Where `gateway.md` and `gateway.json` go.
    #[arg(long, default_value = "target/bench-gateway")]
    pub out_dir: PathBuf,
    /// A line describing the machine, for the report.
    #[arg(long, default_value = "unspecified")]
    pub machine: String,
}

impl Options {
    fn check(&self) -> Result<(), String> {
        if self.watchers == 0 || self.watch_connections == 0 || self.puts == 0 {
            return Err("--watchers, --watch-connections and --puts must be at least 1".into());
        }
        if self.clients == 0 || self.rounds == 0 {
            return Err("--clients and --rounds must be at least 1".into());
        }
        let window_ok = self.seconds > 0.0 && self.seconds.is_finite();
        let warmup_ok = self.warmup_seconds >= 0.0 && self.warmup_seconds.is_finite();
        if !window_ok || !warmup_ok {
            return Err("--seconds must be above 0 and --warmup-seconds at least 0".into());
        }
        Ok(())
    }

    /// The routes of one round: the two gateways, etcd's first in even rounds and the proxy's first in odd ones,
    /// then gRPC through the proxy unless skipped.
    fn routes(&self, round: usize) -> Vec<Route> {
        let mut routes = match round % 2 {
            0 => vec![Route::EtcdGateway, Route::ProxyGateway],
            _ => vec![Route::ProxyGateway, Route::EtcdGateway],
        };
        if !self.no_grpc_unary {
            routes.push(Route::ProxyGrpc);
        }
        routes
    }
}

/// What `bench gateway` measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct GatewayReport {
    pub etcd_version: String,
    pub command: String,
    pub machine: String,
    /// `/proc/loadavg` when the run began and when it ended: the machine's other work, for the reader.
    pub load_average: (String, String),
    /// The flags the proxy ran with beyond its endpoints and listen address.
    pub proxy_flags: Vec<String>,
    pub fanout: Vec<FanoutPhase>,
    pub clients: usize,
    pub window_seconds: f64,
    pub warmup_seconds: f64,
    pub value_size: usize,
    pub unary_runs: Vec<UnaryRun>,
    pub unary: Vec<UnarySummary>,
}

impl GatewayReport {
    /// The gateway phase's p99 fan-out latency over the gRPC phase's.
    pub fn fanout_p99_ratio(&self) -> Option<f64> {
        let p99 = |transport| {
            self.fanout
                .iter()
                .find(|p| p.transport == transport)
                .and_then(|p| p.latency.as_ref())
                .map(|l| l.p99_ms)
        };
        Some(p99(Transport::Gateway)? / p99(Transport::Grpc)?)
    }

    pub fn summary(&self, call: Call, route: Route) -> Option<&UnarySummary> {
        self.unary
            .iter()
            .find(|s| s.call == call && s.route == route)
    }

    /// What went wrong: fan-out phases where some watcher missed or repeated an event, and routes whose calls
    /// failed.
    pub fn failures(&self) -> Vec<String> {
        let phases = self.fanout.iter().filter(|p| !p.complete()).map(|p| {
            format!(
                "{}: {} of {} deliveries, {} missing, {} duplicates, {} failed streams{}",
                p.transport.label(),
                p.delivered,
                p.expected,
                p.missing,
                p.duplicates,
                p.stream_errors,
                p.error_samples
                    .first()
                    .map(|e| format!(" (first: {e})"))
                    .unwrap_or_default()
            )
        });
        let calls = self.unary.iter().filter(|s| s.errors > 0).map(|s| {
            let sample = self
                .unary_runs
                .iter()
                .filter(|r| r.call == s.call && r.route == s.route)
                .find_map(|r| r.tally.error_samples.first());
            format!(
                "{} on {}: {} failed calls{}",
                s.call.label(),
                s.route.label(),
                s.errors,
                sample.map(|e| format!(" (first: {e})")).unwrap_or_default()
            )
        });
        phases.chain(calls).collect()
    }
}

/// The first three fields of `/proc/loadavg` (1, 5 and 15 minutes), or why they could not be read.
fn load_average() -> String {
    match std::fs::read_to_string("/proc/loadavg") {
        Ok(text) => text
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        Err(e) => format!("unknown ({e})"),
    }
}

/// Starts etcd and the proxy, runs both fan-out phases and every unary window.
pub async fn run(options: &Options, command: String) -> Result<GatewayReport, String> {
    options.check()?;
    let load_before = load_average();
    let binaries = crate::plan::named_or_newest(options.etcd.as_ref())?;
    let proxy_bin = crate::plan::proxy_binary(options.proxy_bin.as_ref())?;
    eprintln!(
        "gateway: etcd {} ({}), this proxy {}",
        binaries.version,
        binaries.etcd.display(),
        proxy_bin.display()
    );
    let etcd = EtcdCluster::start(&binaries, 1, &["--log-level=warn"]).await?;
    let proxy_flags = options.proxy_args.clone();
    let proxy = ProxyProcess::start(&proxy_bin, &etcd.endpoints(), &proxy_flags).await?;
    let (etcd_addr, proxy_addr) = (etcd.addr(0), proxy.addr());
    let cpu = CpuMeter {
        proxy: proxy.pid(),
        etcd: etcd.pid(0).ok_or("etcd has no pid")?,
        bench: std::process::id(),
    };
    let direct = Dialer::new(&etcd_addr, None).dial().await?;

    let mut fanout = Vec::new();
    for transport in [Transport::Gateway, Transport::Grpc] {
        let plan = FanoutPlan {
            transport,
            watchers: options.watchers,
            connections: options.watch_connections,
            puts: options.puts,
            put_interval: Duration::from_millis(options.put_interval_ms),
            key: format!("gw-bench/watch/{transport:?}").into_bytes(),
        };
        let servers = Servers {
            proxy_addr: &proxy_addr,
            etcd_addr: &etcd_addr,
            etcd: &direct,
            cpu: &cpu,
        };
        let phase = fanout::run(&plan, &servers)
            .await
            .map_err(|e| format!("{} fan-out: {e}", transport.label()))?;
        eprintln!(
            "gateway: {} fan-out: {} of {} delivered, etcd watchers +{}, p99 {:?} ms",
            transport.label(),
            phase.delivered,
            phase.expected,
            phase.etcd_watchers_added,
            phase.latency.as_ref().map(|l| l.p99_ms)
        );
        fanout.push(phase);
    }

    KvClient::new(direct.clone())
        .put(PutRequest {
            key: unary::RANGE_KEY.to_vec(),
            value: vec![b'r'; options.value_size],
            ..Default::default()
        })
        .await
        .map_err(|s| format!("put the ranged key: {:?}: {}", s.code(), s.message()))?;
    let plan = UnaryPlan {
        clients: options.clients,
        warmup: Duration::from_secs_f64(options.warmup_seconds),
        window: Duration::from_secs_f64(options.seconds),
        value_size: options.value_size,
    };
    let addrs = Addrs {
        etcd: &etcd_addr,
        proxy: &proxy_addr,
    };
    let mut unary_runs = Vec::new();
    for round in 0..options.rounds {
        for call in Call::ALL {
            for route in options.routes(round) {
                let run = unary::measure(call, route, round, &plan, &addrs, &cpu).await?;
                eprintln!(
                    "gateway: round {} {} on {}: {:.0} calls/s, {} errors",
                    round + 1,
                    call.label(),
                    route.label(),
                    run.tally.throughput,
                    run.tally.errors
                );
                unary_runs.push(run);
            }
        }
    }
    let unary = Call::ALL
        .iter()
        .flat_map(|&call| {
            [Route::EtcdGateway, Route::ProxyGateway, Route::ProxyGrpc]
                .into_iter()
                .map(move |route| (call, route))
        })
        .filter_map(|(call, route)| unary::summarize(&unary_runs, call, route))
        .collect();
    Ok(GatewayReport {
        etcd_version: binaries.version.to_string(),
        command,
        machine: options.machine.clone(),
        load_average: (load_before, load_average()),
        proxy_flags,
        fanout,
        clients: options.clients,
        window_seconds: options.seconds,
        warmup_seconds: options.warmup_seconds,
        value_size: options.value_size,
        unary_runs,
        unary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Line {
        #[command(flatten)]
        options: Options,
    }

    fn parse(flags: &[&str]) -> Result<Options, clap::Error> {
        Line::try_parse_from(std::iter::once("gateway").chain(flags.iter().copied()))
            .map(|l| l.options)
    }

    #[test]
    fn defaults_are_the_issues_sizes() {
        let options = parse(&[]).expect("no flags needed");
        assert_eq!(
            (options.watchers, options.watch_connections, options.puts),
            (1000, 10, 200)
        );
        assert_eq!(
            (options.clients, options.seconds, options.rounds),
            (32, 10.0, 2)
        );
        assert!(options.check().is_ok());
    }

    #[test]
    fn sizes_of_zero_are_refused() {
        let refused = |flags: &[&str]| parse(flags).expect("parses").check().is_err();
        assert!(refused(&["--watchers", "0"]));
        assert!(refused(&["--clients", "0"]));
        assert!(refused(&["--seconds", "0"]));
        assert!(refused(&["--warmup-seconds=-1"]));
        assert!(!refused(&["--warmup-seconds", "0", "--puts", "1"]));
    }

    #[test]
    fn rounds_alternate_which_gateway_goes_first_and_grpc_can_be_skipped() {
        let options = parse(&[]).expect("defaults");
        assert_eq!(
            options.routes(0),
            vec![Route::EtcdGateway, Route::ProxyGateway, Route::ProxyGrpc]
        );
        assert_eq!(
            options.routes(1),
            vec![Route::ProxyGateway, Route::EtcdGateway, Route::ProxyGrpc]
        );
        let skipped =
            parse(&["--no-grpc-unary", "--proxy-arg", "--worker-threads=0"]).expect("flags");
        assert_eq!(skipped.proxy_args, vec!["--worker-threads=0".to_string()]);
        assert_eq!(
            skipped.routes(0),
            vec![Route::EtcdGateway, Route::ProxyGateway]
        );
    }
}
