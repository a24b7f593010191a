//! `bench failover`: what a member's crash, hang or partition costs the clients of this proxy, of etcd's Go proxy
//! and of `etcdctl` given the members directly, all in one run, in front of one 3-member cluster on loopback.
//!
//! For each fault kind ([`FaultKind`]) a phase starts fresh proxies (default flags, the three members as
//! `--endpoints`), runs the [`load`] through all three routes at once, and faults every member in turn, `--rounds`
//! times: in each round this proxy's active member first (read from its `/metrics`), then the others. The same
//! fault meets all three routes; the Go proxy and etcdctl spread their calls over every member, so for them every
//! member in turn is the fault; for this proxy the faults of its active member are the ones that test failover,
//! and the others show whether a fault elsewhere disturbs it. While a fault lasts, this proxy's `/metrics` is read
//! every 10 ms ([`monitor`]) for the moment another member becomes active.
//!
//! - crash: SIGKILL, then after the fault time a restart on the same data directory.
//! - hang: SIGSTOP for the fault time, then SIGCONT (sockets accept, nothing answers: a disk stall looks alike).
//! - partition: the clients' path to the member is cut by a [`relay`] and restored after the fault time; the
//!   member stays in the cluster. Network namespaces or iptables would cut the member from its peers too, but
//!   they need root, which the project's harnesses never use; the relays need nothing.
//!
//! Afterwards [`tally`] assigns each call to the fault it started in and [`table`] prints the figures. Every
//! process is the test kit's and is killed when dropped, also on an error or Ctrl-C.

pub mod load;
pub mod monitor;
pub mod relay;
pub mod table;
pub mod tally;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use testkit::{Binaries, EtcdCluster, Etcdctl, ProxyProcess, http};
use tokio::time::Instant;

use crate::load::dial::Dialer;
use crate::plan::EtcdBinary;
use crate::services::GoProxy;
use load::{Client, Load, Via};
use monitor::Monitor;
use relay::Relay;
use tally::{FailoverReport, Fault, Phase};

/// Members in the cluster.
const MEMBERS: usize = 3;

/// How long the load may take to get a first read through every route after the proxies started.
const WARMUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a proxy may take to answer `/health` with 200 again before the next fault (it is noted, not fatal).
const PROXY_HEALTHY_TIMEOUT: Duration = Duration::from_secs(20);

/// Quiet time between one fault's window and the next fault, so that windows never touch.
const GAP: Duration = Duration::from_secs(1);

/// The faults a phase injects.
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
pub enum FaultKind {
    /// SIGKILL, restarted after the fault time.
    Crash,
    /// SIGSTOP for the fault time, then SIGCONT.
    Hang,
    /// The clients' path to the member cut (a relay stops forwarding) for the fault time.
    Partition,
}

impl FaultKind {
    pub fn label(self) -> &'static str {
        match self {
            FaultKind::Crash => "crash",
            FaultKind::Hang => "hang",
            FaultKind::Partition => "partition",
        }
    }
}

/// `bench failover`'s flags.
#[derive(Clone, Debug, clap::Args)]
pub struct Options {
    /// The etcd to run, as VERSION=PATH to its `etcd` (etcdctl next to it; its `grpc-proxy start` is the Go proxy).
    /// Default: the newest version the test kit finds installed.
    #[arg(long = "etcd", value_parser = EtcdBinary::parse)]
    pub etcd: Option<EtcdBinary>,
    /// The `etcd-grpc-proxy` binary. Default: the test kit's (`ETCD_GRPC_PROXY_BIN`, else the release build, built
    /// or confirmed up to date by cargo).
    #[arg(long)]
    pub proxy_bin: Option<PathBuf>,
    /// Rounds per fault kind; each round faults every member once.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// Fault kinds to run (repeatable; all if absent).
    #[arg(long = "fault", value_enum)]
    pub faults: Vec<FaultKind>,
    /// How long each fault lasts, in seconds.
    #[arg(long, default_value_t = 6.0)]
    pub fault_seconds: f64,
    /// Every client call fails if it has not answered within this many seconds (etcdctl: `--command-timeout`).
    #[arg(long, default_value_t = 3.0)]
    pub client_timeout_seconds: f64,
    /// Each reader and writer makes a call every this many milliseconds (or right after a slower call).
    #[arg(long, default_value_t = 100)]
    pub pace_ms: u64,
    /// Where `failover.md` and `failover.json` (every fault and every call) go.
    #[arg(long, default_value = "target/bench-failover")]
    pub out_dir: PathBuf,
    /// A line describing the machine, for the report.
    #[arg(long, default_value = "unspecified")]
    pub machine: String,
}

impl Options {
    fn kinds(&self) -> Vec<FaultKind> {
        if self.faults.is_empty() {
            vec![FaultKind::Crash, FaultKind::Hang, FaultKind::Partition]
        } else {
            self.faults.clone()
        }
    }

    fn fault_time(&self) -> Duration {
        Duration::from_secs_f64(self.fault_seconds)
    }

    fn client_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.client_timeout_seconds)
    }

    /// The etcd binaries: the ones named, or the newest version installed.
    fn binaries(&self) -> Result<Binaries, String> {
        crate::plan::named_or_newest(self.etcd.as_ref())
    }

    fn proxy_bin(&self) -> Result<PathBuf, String> {
        crate::plan::proxy_binary(self.proxy_bin.as_ref())
    }
}

/// Runs every phase and returns what was measured. An error is returned only when the cluster cannot start; a
/// phase that fails is reported in its [`Phase::failure`] and the next phase runs.
pub async fn run(options: &Options, command: String) -> Result<FailoverReport, String> {
    let binaries = options.binaries()?;
    let proxy_bin = options.proxy_bin()?;
    eprintln!(
        "failover: etcd {} ({}), this proxy {}",
        binaries.version,
        binaries.etcd.display(),
        proxy_bin.display()
    );
    let mut cluster = EtcdCluster::start(&binaries, MEMBERS, &["--log-level=warn"]).await?;
    let mut phases = Vec::new();
    for kind in options.kinds() {
        let mut phase = Phase {
            kind,
            endpoints: Vec::new(),
            faults: Vec::new(),
            calls: Vec::new(),
            failure: None,
            proxy_log: String::new(),
            load_average: (load_average(), None),
        };
        let mut bench = Bench {
            options,
            binaries: &binaries,
            proxy_bin: &proxy_bin,
            cluster: &mut cluster,
        };
        if let Err(failure) = bench.phase(&mut phase).await {
            eprintln!("failover: the {} phase failed: {failure}", kind.label());
            phase.failure = Some(failure);
        }
        phase.load_average.1 = load_average();
        phases.push(phase);
    }
    Ok(FailoverReport {
        etcd_version: binaries.version.to_string(),
        command,
        machine: options.machine.clone(),
        rounds: options.rounds,
        fault_seconds: options.fault_seconds,
        client_timeout_seconds: options.client_timeout_seconds,
        pace_ms: options.pace_ms,
        phases,
    })
}

/// Writes `failover.md` and `failover.json` into `dir`; returns their paths.
pub fn write(report: &FailoverReport, dir: &Path) -> Result<Vec<PathBuf>, String> {
    crate::report::write_md_json(dir, "failover", table::render(report), report)
}

/// What one phase works with.
struct Bench<'a> {
    options: &'a Options,
    binaries: &'a Binaries,
    proxy_bin: &'a Path,
    cluster: &'a mut EtcdCluster,
}

/// The three routes of a phase: both proxies (running) and etcdctl, all given the same `--endpoints`.
/// Fields drop in order: this proxy, then the Go proxy.
struct Routes {
    this_proxy: ProxyProcess,
    go_proxy: GoProxy,
    etcdctl: Etcdctl,
}

/// What the faults of a running phase work with: the routes under load, the relays (partition only), the
/// endpoints the routes were given, and the instant call and fault times count from.
struct Stage<'s> {
    kind: FaultKind,
    routes: &'s Routes,
    relays: &'s [Relay],
    endpoints: &'s [String],
    epoch: Instant,
}

impl Bench<'_> {
    /// One fault kind, start to end; faults and calls are written into `phase` as they happen, so a failure
    /// midway keeps what was measured.
    async fn phase(&mut self, phase: &mut Phase) -> Result<(), String> {
        let kind = phase.kind;
        self.heal_cluster().await?;
        let relays = match kind {
            FaultKind::Partition => self.start_relays().await?,
            _ => Vec::new(),
        };
        phase.endpoints = match kind {
            FaultKind::Partition => relays.iter().map(|r| r.addr().to_string()).collect(),
            _ => self.cluster.endpoints(),
        };
        eprintln!(
            "failover: {}: starting both proxies in front of {}",
            kind.label(),
            phase.endpoints.join(",")
        );
        let routes = self.start_routes(kind, &phase.endpoints).await?;
        let clients = self.clients(&routes).await?;
        let timeout = self.options.client_timeout();
        for (via, client) in &clients {
            client
                .seed(*via, timeout)
                .await
                .map_err(|e| format!("writing the keys through {}: {e}", via.label()))?;
        }
        let epoch = Instant::now();
        let pace = Duration::from_millis(self.options.pace_ms);
        let load = Load::start(&clients, epoch, pace, timeout);
        let warm = testkit::try_wait_for(WARMUP_TIMEOUT, || async {
            load.each_has_read(&Via::ALL, 0.0)
        })
        .await;
        let outcome = match warm {
            Ok(()) => {
                let stage = Stage {
                    kind,
                    routes: &routes,
                    relays: &relays,
                    endpoints: &phase.endpoints,
                    epoch,
                };
                self.faults(&stage, &mut phase.faults).await
            }
            Err(last) => Err(format!(
                "the load did not get going within {WARMUP_TIMEOUT:?}: {last}"
            )),
        };
        phase.calls = load.stop().await;
        phase.proxy_log = routes.this_proxy.log_tail(40);
        outcome
    }

    /// Every member that is down is restarted, every paused one resumed, and all are waited for: a phase starts
    /// on a whole cluster even if the previous one failed midway.
    async fn heal_cluster(&mut self) -> Result<(), String> {
        for i in 0..MEMBERS {
            if self.cluster.is_running(i) {
                self.cluster.resume(i);
                self.cluster.wait_healthy(i).await?;
            } else {
                self.cluster.restart(i).await?;
            }
        }
        Ok(())
    }

    async fn start_relays(&self) -> Result<Vec<Relay>, String> {
        let mut relays = Vec::new();
        for i in 0..MEMBERS {
            relays.push(Relay::start(&self.cluster.addr(i)).await?);
        }
        Ok(relays)
    }

    /// Both proxies with default flags in front of `endpoints`, and etcdctl given them.
    async fn start_routes(&self, kind: FaultKind, endpoints: &[String]) -> Result<Routes, String> {
        let dir = self.cluster.scratch_dir().join(kind.label());
        std::fs::create_dir_all(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
        let go_proxy =
            GoProxy::start(&self.binaries.etcd, &endpoints.join(","), &dir, &[], None).await?;
        let no_flags: [&str; 0] = [];
        // Warnings only, as the benchmark runs it: failovers and silent members are warnings.
        let this_proxy = ProxyProcess::start_with_env(
            self.proxy_bin,
            endpoints,
            &no_flags,
            &[("RUST_LOG", "warn")],
        )
        .await?;
        let etcdctl = Etcdctl::new(&self.binaries.etcdctl, endpoints.join(","));
        Ok(Routes {
            this_proxy,
            go_proxy,
            etcdctl,
        })
    }

    /// A client per route: one gRPC connection per proxy, etcdctl as is.
    async fn clients(&self, routes: &Routes) -> Result<Vec<(Via, Client)>, String> {
        let this = Dialer::new(&routes.this_proxy.addr(), None).dial().await?;
        let go = Dialer::new(routes.go_proxy.addr(), None).dial().await?;
        Ok(vec![
            (Via::ThisProxy, Client::Grpc(this)),
            (Via::GoProxy, Client::Grpc(go)),
            (Via::Etcdctl, Client::Etcdctl(routes.etcdctl.clone())),
        ])
    }

    /// `rounds` rounds, each faulting every member once: this proxy's active member first while it is one not yet
    /// faulted this round, then the rest in order.
    async fn faults(&mut self, stage: &Stage<'_>, faults: &mut Vec<Fault>) -> Result<(), String> {
        for round in 0..self.options.rounds {
            let mut left: Vec<usize> = (0..MEMBERS).collect();
            while !left.is_empty() {
                let notes = self.settle(stage.routes).await?;
                let before = monitor::read(&stage.routes.this_proxy.addr(), stage.epoch).await;
                let active = before
                    .active
                    .as_deref()
                    .and_then(|a| stage.endpoints.iter().position(|e| e == a));
                let member = active.filter(|a| left.contains(a)).unwrap_or(left[0]);
                left.retain(|&m| m != member);
                let mut fault = self.fault(stage, member, active == Some(member)).await?;
                fault.round = round;
                fault.notes.splice(0..0, notes);
                eprintln!(
                    "failover: {} round {} {}",
                    stage.kind.label(),
                    round + 1,
                    brief(&fault)
                );
                faults.push(fault);
            }
        }
        Ok(())
    }

    /// Before a fault: every member healthy, each proxy answering `/health` (noted if one does not within
    /// [`PROXY_HEALTHY_TIMEOUT`]), then a short quiet gap.
    async fn settle(&mut self, routes: &Routes) -> Result<Vec<String>, String> {
        for i in 0..MEMBERS {
            self.cluster.wait_healthy(i).await?;
        }
        let mut notes = Vec::new();
        for (name, addr) in [
            ("this proxy", routes.this_proxy.addr()),
            ("Go proxy", routes.go_proxy.addr().to_string()),
        ] {
            let healthy = testkit::try_wait_for(PROXY_HEALTHY_TIMEOUT, || async {
                match http::get(&addr, "/health").await {
                    Ok((200, _)) => Ok(()),
                    Ok((code, body)) => Err(format!("HTTP {code}: {}", body.trim())),
                    Err(e) => Err(e),
                }
            })
            .await;
            if let Err(last) = healthy {
                notes.push(format!("{name} not healthy before the fault ({last})"));
            }
        }
        tokio::time::sleep(GAP).await;
        Ok(notes)
    }

    /// Faults `member` as `kind` says for the fault time, lifts the fault, waits until the member is healthy and
    /// one client timeout more (calls made during the fault end by then), watching this proxy throughout.
    async fn fault(
        &mut self,
        stage: &Stage<'_>,
        member: usize,
        was_active: bool,
    ) -> Result<Fault, String> {
        let leader = is_leader(&self.cluster.addr(member)).await;
        let now = || stage.epoch.elapsed().as_secs_f64();
        let monitor = Monitor::start(&stage.routes.this_proxy.addr(), stage.epoch);
        let start_s = now();
        self.inject(stage, member);
        tokio::time::sleep(self.options.fault_time()).await;
        let lifted_s = now();
        self.lift(stage, member).await?;
        let recovered_s = now();
        tokio::time::sleep(self.options.client_timeout()).await;
        let samples = monitor.stop().await;
        let replaced_after_s = was_active
            .then(|| monitor::replaced_at(&samples, &stage.endpoints[member], start_s))
            .flatten()
            .map(|at| at - start_s);
        Ok(Fault {
            round: 0,
            member,
            leader,
            this_proxys_active: was_active,
            start_s,
            lifted_s,
            recovered_s,
            replaced_after_s,
            failovers: monitor::failovers(&samples),
            notes: Vec::new(),
        })
    }

    fn inject(&mut self, stage: &Stage<'_>, member: usize) {
        match stage.kind {
            FaultKind::Crash => self.cluster.kill(member),
            FaultKind::Hang => self.cluster.pause(member),
            FaultKind::Partition => stage.relays[member].partition(),
        }
    }

    /// Ends the fault and waits (with the kit's deadline) until the member is healthy, asked directly.
    async fn lift(&mut self, stage: &Stage<'_>, member: usize) -> Result<(), String> {
        match stage.kind {
            FaultKind::Crash => return self.cluster.restart(member).await,
            FaultKind::Hang => self.cluster.resume(member),
            FaultKind::Partition => stage.relays[member].heal(),
        }
        self.cluster.wait_healthy(member).await
    }
}

/// Whether the member at `addr` leads the cluster, from its `/metrics` (`etcd_server_is_leader`).
async fn is_leader(addr: &str) -> Option<bool> {
    let (code, body) = http::get(addr, "/metrics").await.ok()?;
    if code != 200 {
        return None;
    }
    body.lines()
        .find_map(|line| line.strip_prefix("etcd_server_is_leader "))
        .map(|value| value.trim() == "1")
}

/// The machine's 1-minute load average (`/proc/loadavg`).
pub(crate) fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// A fault in one line, for the progress log.
fn brief(fault: &Fault) -> String {
    format!(
        "member {}{}{}: {:.1} s{}",
        fault.member,
        if fault.leader == Some(true) {
            " (leader)"
        } else {
            ""
        },
        if fault.this_proxys_active {
            " (this proxy's active)"
        } else {
            ""
        },
        fault.seconds(),
        fault.replaced_after_s.map_or(String::new(), |s| format!(
            ", replaced after {:.0} ms",
            s * 1000.0
        )),
    )
}
