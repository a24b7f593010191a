//! What one benchmark run does: which etcd versions, which scenarios at what sizes, how long and how often.
//!
//! Every size is a flag (clap), so `ci/bench.sh` and the quick-mode test describe their runs the same way.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The three things the same load is driven at, in the order every round visits them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Target {
    /// etcd itself, no proxy.
    Direct,
    /// `etcd grpc-proxy start`, etcd's own Go proxy, from the same etcd binary.
    GoProxy,
    /// `etcd-grpc-proxy start`, this project.
    RustProxy,
}

impl Target {
    pub const ALL: [Target; 3] = [Target::Direct, Target::GoProxy, Target::RustProxy];

    pub fn label(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::GoProxy => "go-proxy",
            Target::RustProxy => "this-proxy",
        }
    }
}

/// The workloads. Each is driven identically at every target.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum Scenario {
    /// Puts of 256-byte values over a key space.
    Put,
    /// Linearizable single-key ranges over the hot key set.
    RangeLinearizable,
    /// Serializable single-key ranges over the hot key set: what a range cache saves.
    RangeSerializable,
    /// W watchers on one key over C connections while puts arrive at a steady rate.
    WatchFanout,
    /// L leases kept alive over S bidirectional streams.
    LeaseKeepalive,
    /// Serializable ranges, linearizable ranges and puts, mixed from a seeded RNG.
    Mixed,
}

impl Scenario {
    pub const ALL: [Scenario; 6] = [
        Scenario::Put,
        Scenario::RangeLinearizable,
        Scenario::RangeSerializable,
        Scenario::WatchFanout,
        Scenario::LeaseKeepalive,
        Scenario::Mixed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Scenario::Put => "put",
            Scenario::RangeLinearizable => "range-linearizable",
            Scenario::RangeSerializable => "range-serializable",
            Scenario::WatchFanout => "watch-fanout",
            Scenario::LeaseKeepalive => "lease-keepalive",
            Scenario::Mixed => "mixed",
        }
    }
}

/// An etcd server binary and the version it reports; its `grpc-proxy start` is the Go proxy of that version.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EtcdBinary {
    pub version: String,
    pub path: PathBuf,
}

impl EtcdBinary {
    /// Parses `VERSION=PATH` (for example `3.5.1=target/etcd-3.5.1/etcd`).
    pub fn parse(raw: &str) -> Result<Self, String> {
        let (version, path) = raw
            .split_once('=')
            .ok_or_else(|| format!("expected VERSION=PATH, got {raw:?}"))?;
        Ok(Self {
            version: version.to_string(),
            path: PathBuf::from(path),
        })
    }
}

/// The sizes of every scenario and the shape of the load. Defaults are the full run's sizes.
#[derive(Clone, Debug, Serialize, Deserialize, clap::Args)]
pub struct Sizes {
    /// gRPC connections (HTTP/2) per target for the unary scenarios.
    #[arg(long, default_value_t = 10)]
    pub connections: usize,
    /// Requests in flight on each connection (closed loop).
    #[arg(long, default_value_t = 5)]
    pub inflight: usize,
    /// Fixed total request rate per target (open loop, latency from the scheduled start); closed loop if absent.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Bytes per value written by put and mixed (and the hot set).
    #[arg(long, default_value_t = 256)]
    pub value_size: usize,
    /// Keys the put scenario cycles through.
    #[arg(long, default_value_t = 10_000)]
    pub put_keys: usize,
    /// Keys in the hot set read by the range and mixed scenarios.
    #[arg(long, default_value_t = 100)]
    pub hot_keys: usize,
    /// Watchers in the watch fan-out scenario (one Watch stream each).
    #[arg(long, default_value_t = 1000)]
    pub watchers: usize,
    /// Connections the watchers are spread over.
    #[arg(long, default_value_t = 10)]
    pub watch_connections: usize,
    /// Puts per second on the watched key.
    #[arg(long, default_value_t = 50.0)]
    pub watch_put_rate: f64,
    /// Leases in the keep-alive scenario.
    #[arg(long, default_value_t = 1000)]
    pub leases: usize,
    /// Keep-alive streams the leases are spread over.
    #[arg(long, default_value_t = 50)]
    pub lease_streams: usize,
    /// TTL of the leases, seconds; each is refreshed every TTL/3, as etcd's Go client does.
    #[arg(long, default_value_t = 6)]
    pub lease_ttl: i64,
    /// Mixed workload, percent of serializable ranges (the rest after linearizable ranges are puts).
    #[arg(long, default_value_t = 60)]
    pub mixed_serializable_pct: u32,
    /// Mixed workload, percent of linearizable ranges.
    #[arg(long, default_value_t = 20)]
    pub mixed_linearizable_pct: u32,
}

impl Sizes {
    /// Tiny sizes for the quick mode: enough to exercise every scenario at every target, too small to measure.
    pub fn quick() -> Self {
        Self {
            connections: 2,
            inflight: 2,
            rate: None,
            value_size: 256,
            put_keys: 50,
            hot_keys: 10,
            watchers: 6,
            watch_connections: 2,
            watch_put_rate: 20.0,
            leases: 6,
            lease_streams: 2,
            lease_ttl: 3,
            mixed_serializable_pct: 60,
            mixed_linearizable_pct: 20,
        }
    }
}

/// Durations and repetitions.
#[derive(Clone, Debug, Serialize, Deserialize, clap::Args)]
pub struct Timing {
    /// Measured seconds of each run (one scenario at one target).
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Seconds of load before measuring starts (connections warm, caches filled).
    #[arg(long, default_value_t = 0.5)]
    pub warmup_seconds: f64,
    /// Rounds: each round runs the scenario once at every target, in the order direct, Go proxy, this proxy.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

impl Timing {
    /// One short round: the quick mode checks that everything runs, not how fast.
    pub fn quick() -> Self {
        Self {
            seconds: 0.5,
            warmup_seconds: 0.2,
            rounds: 1,
        }
    }

    pub fn measured(&self) -> Duration {
        Duration::from_secs_f64(self.seconds)
    }

    pub fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.warmup_seconds)
    }
}

/// Everything a run needs.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Names the output files: `<out_dir>/<name>.json`, `.md`, `-*.svg`.
    pub name: String,
    pub out_dir: PathBuf,
    pub etcds: Vec<EtcdBinary>,
    pub proxy_bin: PathBuf,
    pub scenarios: Vec<Scenario>,
    pub sizes: Sizes,
    pub timing: Timing,
    /// Seeds the mixed workload's choices.
    pub seed: u64,
    /// A line describing the machine, for the report.
    pub machine: String,
    /// The command that reproduces the run, for the report.
    pub command: String,
}
