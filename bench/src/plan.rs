//! What one benchmark run does: which etcd versions, which scenarios at what sizes, how long and how often.
//!
//! Every size is a flag (clap), so `ci/bench.sh` and the quick-mode test describe their runs the same way. The
//! handshake scenario uses the unary sizes: `connections` x `inflight` clients, each opening connection after
//! connection.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The things the same load is driven at, in the order every round visits them. Every scenario visits the first
/// three ([`Target::BASE`]); the read scenarios also visit this proxy with its range cache off
/// ([`Scenario::targets`]), and with `--baseline-bin` an older build of it ([`Scenario::targets_with`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Target {
    /// etcd itself, no proxy.
    Direct,
    /// `etcd grpc-proxy start`, etcd's own Go proxy, from the same etcd binary.
    GoProxy,
    /// `etcd-grpc-proxy start --range-cache-max-bytes=268435456`: this project with its range cache on (256 MiB).
    RustProxy,
    /// `etcd-grpc-proxy start --range-cache-max-bytes=0`: this project with its range cache off, a second process
    /// in front of the same etcd, started only when a scenario of the run visits it.
    RustProxyNoCache,
    /// `--baseline-bin`: another build of this proxy (an older commit, to measure a change against), started as
    /// [`Target::RustProxy`] is but with its own default range cache and without `--proxy-arg`; visited wherever
    /// [`Target::RustProxyNoCache`] is, and only when the run names the binary.
    BaselineProxy,
}

impl Target {
    /// Every target, in the order a round visits them.
    pub const ALL: [Target; 5] = [
        Target::Direct,
        Target::GoProxy,
        Target::RustProxy,
        Target::RustProxyNoCache,
        Target::BaselineProxy,
    ];

    /// The targets every scenario visits.
    pub const BASE: [Target; 3] = [Target::Direct, Target::GoProxy, Target::RustProxy];

    /// The targets of the scenarios where what the range cache changes is measured (without `--baseline-bin`).
    pub const WITH_NOCACHE: [Target; 4] = [
        Target::Direct,
        Target::GoProxy,
        Target::RustProxy,
        Target::RustProxyNoCache,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::GoProxy => "go-proxy",
            Target::RustProxy => "this-proxy",
            Target::RustProxyNoCache => "this-proxy-nocache",
            Target::BaselineProxy => "baseline-proxy",
        }
    }

    /// This project's proxy, with or without its range cache.
    pub fn is_this_proxy(self) -> bool {
        matches!(self, Target::RustProxy | Target::RustProxyNoCache)
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
    /// A new connection per request (with --tls, a full TLS handshake), one linearizable range on it, closed.
    Handshake,
    /// How long a write made directly on etcd takes to show in serializable reads through the target, while a client
    /// keeps reading the key (`load::visible`): not a throughput scenario.
    WriteToVisible,
}

impl Scenario {
    pub const ALL: [Scenario; 8] = [
        Scenario::Put,
        Scenario::RangeLinearizable,
        Scenario::RangeSerializable,
        Scenario::WatchFanout,
        Scenario::LeaseKeepalive,
        Scenario::Mixed,
        Scenario::Handshake,
        Scenario::WriteToVisible,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Scenario::Put => "put",
            Scenario::RangeLinearizable => "range-linearizable",
            Scenario::RangeSerializable => "range-serializable",
            Scenario::WatchFanout => "watch-fanout",
            Scenario::LeaseKeepalive => "lease-keepalive",
            Scenario::Mixed => "mixed",
            Scenario::Handshake => "handshake",
            Scenario::WriteToVisible => "write-to-visible",
        }
    }

    /// The targets each round visits for this scenario: this proxy without its range cache too where what the cache
    /// changes is measured (reads, and how soon a write shows in them); the other scenarios stay at three targets,
    /// their cost unchanged.
    pub fn targets(self) -> &'static [Target] {
        if self.reads() || self == Scenario::WriteToVisible {
            &Target::WITH_NOCACHE
        } else {
            &Target::BASE
        }
    }

    /// [`Scenario::targets`], and with `baseline` (`--baseline-bin`) the older build after them wherever this proxy
    /// without its cache is visited: the cases where a change to this proxy shows, while the others keep their cost.
    pub fn targets_with(self, baseline: bool) -> Vec<Target> {
        let targets = self.targets();
        let visits_baseline = baseline && targets.contains(&Target::RustProxyNoCache);
        targets
            .iter()
            .copied()
            .chain(visits_baseline.then_some(Target::BaselineProxy))
            .collect()
    }

    /// Whether the scenario's load is (mostly) Range calls a range cache can answer: its reports show the Range
    /// calls that reached etcd, and etcd's CPU, per client read.
    pub fn reads(self) -> bool {
        matches!(
            self,
            Scenario::RangeLinearizable | Scenario::RangeSerializable | Scenario::Mixed
        )
    }

    /// The share of the scenario's client requests that are reads ([`Scenario::reads`]): all of them for the range
    /// scenarios, the drawn percentages for the mixed workload (drawn uniformly from a seeded RNG, so the share of
    /// thousands of requests is within a percent of it); None for the others.
    pub fn read_share(self, sizes: &Sizes) -> Option<f64> {
        match self {
            Scenario::RangeLinearizable | Scenario::RangeSerializable => Some(1.0),
            Scenario::Mixed => Some(
                (f64::from(sizes.mixed_serializable_pct) + f64::from(sizes.mixed_linearizable_pct))
                    .min(100.0)
                    / 100.0,
            ),
            _ => None,
        }
    }
}

/// Which links a run secures with TLS (`--tls`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum TlsMode {
    /// Plaintext everywhere.
    #[default]
    Off,
    /// Mutual TLS on every link: etcd (`--client-cert-auth`), both proxies towards etcd and towards their clients.
    On,
    /// Both in one run: a plaintext stack and a TLS stack, each round visiting the targets on one, then the other.
    Both,
}

impl TlsMode {
    /// In words, for reports.
    pub fn words(self) -> &'static str {
        match self {
            TlsMode::Off => "plaintext",
            TlsMode::On => "TLS",
            TlsMode::Both => "plaintext and TLS",
        }
    }

    /// The stacks a run uses, by whether each is TLS, in the order each round visits them.
    pub fn transports(self) -> &'static [bool] {
        match self {
            TlsMode::Off => &[false],
            TlsMode::On => &[true],
            TlsMode::Both => &[false, true],
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
    /// Parses `VERSION=PATH` (for example `3.5.1=/usr/local/lib/etcd-3.5.1/etcd`); refuses a version the test kit
    /// does not know.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let (version, path) = raw
            .split_once('=')
            .ok_or_else(|| format!("expected VERSION=PATH, got {raw:?}"))?;
        let binary = Self {
            version: version.to_string(),
            path: PathBuf::from(path),
        };
        binary.binaries()?;
        Ok(binary)
    }

    /// The test kit's view of it: its version, its `etcd` and the `etcdctl` next to it.
    pub fn binaries(&self) -> Result<testkit::Binaries, String> {
        let version = testkit::Version::parse(&self.version).ok_or_else(|| {
            format!(
                "etcd version {:?} is not one the benchmark knows (known: {})",
                self.version,
                testkit::Version::ALL.map(testkit::Version::name).join(", ")
            )
        })?;
        Ok(testkit::Binaries {
            version,
            etcd: self.path.clone(),
            etcdctl: self.path.with_file_name("etcdctl"),
        })
    }
}

/// The etcd a single-version run uses: `named` if given, else the newest version the test kit finds installed.
pub fn named_or_newest(named: Option<&EtcdBinary>) -> Result<testkit::Binaries, String> {
    if let Some(etcd) = named {
        return etcd.binaries();
    }
    testkit::Version::ALL
        .iter()
        .rev()
        .find_map(|v| v.binaries().ok())
        .ok_or_else(|| {
            "no etcd version the test kit knows is installed; run ci/install-conformance-deps.sh"
                .into()
        })
}

/// This proxy's binary: `named` if given, else the test kit's (`ETCD_GRPC_PROXY_BIN`, else the release build,
/// built or confirmed up to date by cargo).
pub fn proxy_binary(named: Option<&PathBuf>) -> Result<PathBuf, String> {
    match named {
        Some(bin) => Ok(bin.clone()),
        None => testkit::proxy::binary(),
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
    /// Watchers in the watch fan-out scenario.
    #[arg(long, default_value_t = 1000)]
    pub watchers: usize,
    /// Watchers multiplexed on one Watch stream, as etcd's clients do for the watchers of one context (1: a
    /// stream per watcher). Streams are spread over the connections in turn.
    #[arg(long, default_value_t = 1)]
    #[serde(default = "one")]
    pub watchers_per_stream: usize,
    /// Connections the watchers are spread over.
    #[arg(long, default_value_t = 10)]
    pub watch_connections: usize,
    /// Puts per second on the watched key; a comma-separated list runs the scenario once per rate.
    #[arg(long = "watch-put-rate", value_delimiter = ',', default_values_t = [50.0])]
    #[serde(alias = "watch_put_rate", deserialize_with = "one_or_many")]
    pub watch_put_rates: Vec<f64>,
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
    /// Write-to-visible: writes made directly on etcd per run, each awaited in serializable reads through the target.
    #[arg(long, default_value_t = 200)]
    #[serde(default = "visible_writes")]
    pub visible_writes: usize,
    /// Write-to-visible: how long each write is awaited in reads through the target before it counts as never seen.
    #[arg(long, default_value_t = 2.0)]
    #[serde(default = "visible_wait_seconds")]
    pub visible_wait_seconds: f64,
    /// Write-to-visible: a run stops after this many writes in a row were never seen (the Go proxy's cache serves a
    /// stale value forever: 200 writes would cost it 400 s), the writes left counting as not attempted.
    #[arg(long, default_value_t = 5)]
    #[serde(default = "visible_give_up_after")]
    pub visible_give_up_after: usize,
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
            watchers_per_stream: 3,
            watch_connections: 2,
            watch_put_rates: vec![20.0],
            leases: 6,
            lease_streams: 2,
            lease_ttl: 3,
            mixed_serializable_pct: 60,
            mixed_linearizable_pct: 20,
            visible_writes: 20,
            visible_wait_seconds: 0.5,
            visible_give_up_after: 3,
        }
    }

    /// The sizes of issues 5 and 6: 10,000 watchers on one key over 100 connections (one stream of 100 watchers
    /// each) at 1, 5 and 20 puts/s (up to 200,000 deliveries/s); 10,000 leases over 1,000 keep-alive streams on
    /// 100 connections, TTL 15 s (the issue names none): each lease refreshed every 5 s, 2,000 keep-alives/s,
    /// which two shared cores carry for etcd and a proxy alike.
    pub fn scale() -> Self {
        Self {
            connections: 100,
            watchers: 10_000,
            watchers_per_stream: 100,
            watch_connections: 100,
            watch_put_rates: vec![1.0, 5.0, 20.0],
            leases: 10_000,
            lease_streams: 1_000,
            lease_ttl: 15,
            ..Self::quick()
        }
    }
}

fn one() -> usize {
    1
}

fn visible_writes() -> usize {
    200
}

fn visible_wait_seconds() -> f64 {
    2.0
}

fn visible_give_up_after() -> usize {
    5
}

/// Reads a list of rates, or a single rate as reports written before rates became a list have it.
fn one_or_many<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<f64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(f64),
        Many(Vec<f64>),
    }
    Ok(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(rate) => vec![rate],
        OneOrMany::Many(rates) => rates,
    })
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
    /// Rounds: each round runs the scenario once at every target, in the order direct, Go proxy, this proxy (and,
    /// for the read scenarios, this proxy with its range cache off, then the --baseline-bin build if given).
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

    /// One round of 10 s: the scale scenarios are long enough to measure in one go, and a fresh stack per
    /// scenario (see [`Plan::fresh_stack`]) makes a second round of the same proxy process a different thing.
    pub fn scale() -> Self {
        Self {
            seconds: 10.0,
            warmup_seconds: 0.5,
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
    /// A fresh etcd and fresh proxies for every scenario case, so that each proxy's memory and upstream streams
    /// are measured from a clean start rather than after earlier scenarios.
    pub fresh_stack: bool,
    /// `--namespace` for both proxies (none when empty): what a namespace costs each of them.
    pub namespace: String,
    /// Flags for this proxy only (`--proxy-arg`), after the benchmark's own.
    pub proxy_args: Vec<String>,
    /// Another build of this proxy (`--baseline-bin`), the [`Target::BaselineProxy`] of the cases that visit this
    /// proxy without its cache; none by default.
    pub baseline_bin: Option<PathBuf>,
    /// Mutual TLS everywhere (see [`crate::tls`]): etcd with `--client-cert-auth`, both proxies towards etcd and
    /// towards their clients, and the benchmark's clients: what TLS costs each proxy.
    pub tls: TlsMode,
    /// Judge the watch and lease scenarios against the targets of issues 5 and 6 in the report.
    pub check_targets: bool,
}

impl Plan {
    /// The targets each round of `scenario` visits in this run, in order ([`Scenario::targets_with`]).
    pub fn targets(&self, scenario: Scenario) -> Vec<Target> {
        scenario.targets_with(self.baseline_bin.is_some())
    }
}

/// One scenario at one setting: the watch fan-out runs once per put rate, everything else once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Case {
    pub scenario: Scenario,
    /// The put rate of a watch fan-out case.
    pub watch_put_rate: Option<f64>,
}

impl Case {
    /// Every case of `scenarios` in order, the watch fan-out expanded over `sizes.watch_put_rates`.
    pub fn all(scenarios: &[Scenario], sizes: &Sizes) -> Vec<Case> {
        scenarios
            .iter()
            .flat_map(|&scenario| match scenario {
                Scenario::WatchFanout => sizes
                    .watch_put_rates
                    .iter()
                    .map(|&rate| Case {
                        scenario,
                        watch_put_rate: Some(rate),
                    })
                    .collect::<Vec<_>>(),
                _ => vec![Case {
                    scenario,
                    watch_put_rate: None,
                }],
            })
            .collect()
    }

    /// Names the case in reports: the scenario, and its put rate when the run has several.
    pub fn variant(&self, sizes: &Sizes) -> Option<String> {
        self.watch_put_rate
            .filter(|_| sizes.watch_put_rates.len() > 1)
            .map(|rate| format!("{rate} puts/s"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_fanout_expands_to_one_case_per_put_rate_named_by_its_rate() {
        let sizes = Sizes::scale();
        let cases = Case::all(&[Scenario::Put, Scenario::WatchFanout], &sizes);
        let rates: Vec<_> = cases
            .iter()
            .map(|c| (c.scenario, c.watch_put_rate))
            .collect();
        assert_eq!(
            rates,
            vec![
                (Scenario::Put, None),
                (Scenario::WatchFanout, Some(1.0)),
                (Scenario::WatchFanout, Some(5.0)),
                (Scenario::WatchFanout, Some(20.0)),
            ]
        );
        assert_eq!(cases[0].variant(&sizes), None);
        assert_eq!(cases[2].variant(&sizes).as_deref(), Some("5 puts/s"));
        let single = Case::all(&[Scenario::WatchFanout], &Sizes::quick());
        assert_eq!(
            single[0].variant(&Sizes::quick()),
            None,
            "one rate needs no name"
        );
    }

    #[test]
    fn the_baseline_is_visited_exactly_where_this_proxy_without_its_cache_is_and_only_with_the_flag()
     {
        for scenario in Scenario::ALL {
            let nocache = scenario.targets().contains(&Target::RustProxyNoCache);
            assert_eq!(
                scenario.targets_with(false),
                scenario.targets(),
                "{}: without the flag nothing changes",
                scenario.label()
            );
            let with = scenario.targets_with(true);
            assert_eq!(
                with.contains(&Target::BaselineProxy),
                nocache,
                "{}",
                scenario.label()
            );
            assert_eq!(
                with.iter()
                    .filter(|&&t| t != Target::BaselineProxy)
                    .copied()
                    .collect::<Vec<_>>(),
                scenario.targets(),
                "{}: the other targets, in their order",
                scenario.label()
            );
            if nocache {
                assert_eq!(with.last(), Some(&Target::BaselineProxy), "visited last");
            }
        }
        assert!(
            Scenario::Mixed
                .targets_with(true)
                .contains(&Target::BaselineProxy)
                && !Scenario::Put
                    .targets_with(true)
                    .contains(&Target::BaselineProxy)
        );
    }

    #[test]
    fn an_etcd_is_a_known_version_and_a_path_with_etcdctl_beside_it() {
        let etcd = EtcdBinary::parse("3.5.30=/opt/etcd/etcd").expect("a known version");
        let binaries = etcd.binaries().expect("a known version");
        assert_eq!(binaries.version, testkit::Version::V3_5_30);
        assert_eq!(binaries.etcdctl, PathBuf::from("/opt/etcd/etcdctl"));
        let unknown = EtcdBinary::parse("3.6.0=/opt/etcd/etcd").expect_err("not a known version");
        assert!(
            unknown.contains("\"3.6.0\"") && unknown.contains("3.4.23, 3.5.1, 3.5.30"),
            "{unknown}"
        );
        assert!(EtcdBinary::parse("/opt/etcd/etcd").is_err());
    }

    #[test]
    fn a_single_put_rate_of_an_older_report_reads_as_a_list() {
        let mut json = serde_json::to_value(Sizes::quick()).expect("sizes serialize");
        let map = json.as_object_mut().expect("an object");
        map.remove("watch_put_rates");
        map.remove("watchers_per_stream");
        map.insert("watch_put_rate".into(), serde_json::json!(50.0));
        let sizes: Sizes = serde_json::from_value(json).expect("older sizes parse");
        assert_eq!(
            (sizes.watch_put_rates, sizes.watchers_per_stream),
            (vec![50.0], 1)
        );
    }
}
