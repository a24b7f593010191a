//! One simulated world: the model members, the production proxy (`proxy::run` over [`TurmoilNet`]; or several,
//! each on its own host with its own configuration), the clients a scenario adds, and the fault plan; in plaintext,
//! or with [`Settings::tls`] mutual TLS on every connection (members, proxy and clients; see [`crate::tls`]).
//! [`World::run`] steps virtual time, applies faults when due, and at the end shuts the proxies down and checks that
//! they stopped cleanly with no task left behind.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::fault::{self, Fault, FaultPlan, FaultProfile, Scheduled};
use crate::model::{self, Cluster};
use crate::net::{HostSockets, TurmoilNet};
use crate::tls::TlsFiles;
use crate::topology::{self, Dialer, MEMBER_PORT, PROXY_HOST, PROXY_PORT, member_host};
use crate::trace::Trace;
use proxy::net::Net;

/// The knobs of one world.
#[derive(Clone, Debug)]
pub struct Settings {
    pub seed: u64,
    pub members: usize,
    pub faults: FaultProfile,
    /// A fault plan to use instead of drawing one from the seed and `faults` (proptest builds its own).
    pub plan: Option<FaultPlan>,
    /// Hard limit of virtual time; a run still going then has hung.
    pub limit: Duration,
    /// Mutual TLS everywhere: the members serve TLS and require client certificates, the default proxy
    /// ([`World::new`]) serves and dials TLS, and [`World::dialer`] gives clients that dial TLS. `None`: plaintext.
    pub tls: Option<TlsFiles>,
}

impl Settings {
    /// A quiet world of `members` members (no faults), in plaintext, with 20 s of virtual time: what tests of one
    /// behaviour start from, changing the fields they need.
    pub fn quiet(seed: u64, members: usize) -> Self {
        Self {
            seed,
            members,
            faults: crate::fault::FaultProfile::quiet(members),
            plan: None,
            limit: Duration::from_secs(20),
            tls: None,
        }
    }
}

/// How one proxy process ended (the proxy host records it when `run` returns).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProxyExit {
    pub result: Result<(), String>,
    /// Tasks still alive on the proxy host's runtime [`TASK_REAP_GRACE`] after `run` returned.
    pub tasks_left: usize,
}

/// A world being built and then run.
pub struct World<'a> {
    pub sim: turmoil::Sim<'a>,
    pub cluster: Cluster,
    pub trace: Trace,
    pub settings: Settings,
    plan: FaultPlan,
    stop_proxy: watch::Sender<bool>,
    proxy_exits: Arc<Mutex<Vec<ProxyExit>>>,
    /// How many proxy hosts the world has (each reports one exit at the end).
    proxies: usize,
    dialer: Dialer,
    /// The connections of each host that can crash (members and proxies), by host name.
    sockets: BTreeMap<String, HostSockets>,
    /// Faults due but held for a step behind a crash whose host was asked to close its connections (`true`: this
    /// one's host was asked).
    crashing: Vec<(Scheduled, bool)>,
    /// When the last fault was applied (zero: none yet).
    last_fault_at: Duration,
}

/// What a finished run leaves for the checkers.
pub struct Finished {
    pub cluster: Cluster,
    pub trace: Trace,
    /// One per proxy host, in the order they stopped (a restarted proxy reports only its last run).
    pub proxy_exits: Vec<ProxyExit>,
    pub elapsed: Duration,
    /// When the last fault of the plan was applied (zero if the plan had none): every plan ends healed, so from
    /// then on nothing impairs the world.
    pub healed_at: Duration,
    /// Why the simulation itself failed (a client error, a panic, the time limit), if it did.
    pub sim_error: Option<String>,
}

/// Virtual time per simulation step: coarse enough to keep a debug-build run around a second of real time, fine
/// enough that keep-alive intervals and timeouts (hundreds of milliseconds) are many steps long.
const TICK: Duration = Duration::from_millis(3);

/// Members ping their clients (etcd's server keep-alive, shortened as the proxy's own is). turmoil does not
/// retransmit: a one-way partition leaves a connection whose direction towards the member has a hole for good, so
/// the member never hears that the proxy left it (its RST_STREAM and FIN are stuck behind the hole) and would keep
/// serving the proxy's abandoned watchers forever. Unanswered pings close such a connection, as TCP's
/// retransmissions would eventually on a real network.
pub const MEMBER_KEEPALIVE: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_millis(500));

/// How long the proxy may take to shut down gracefully (its grace period is shortened for the simulation).
const SHUTDOWN_LIMIT: Duration = Duration::from_secs(5);

/// How long the proxy's tasks may outlive `run`: a probe of a failed endpoint may be sleeping in its backoff
/// (at most 5 s in the proxy) and holds the upstream channels, and their tasks, until it wakes up.
pub const TASK_REAP_GRACE: Duration = Duration::from_secs(6);

/// Waits until no task is left on this host's runtime, or [`TASK_REAP_GRACE`] passed; returns how many are left.
async fn wait_for_tasks_to_end() -> usize {
    let started = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let alive = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        if alive == 0 || started.elapsed() >= TASK_REAP_GRACE {
            return alive;
        }
    }
}

/// The proxy configuration the simulation runs: the defaults `etcd-grpc-proxy start --endpoints=m0:2379,...`
/// gets, nothing else (no shortened dial timeout, no upstream keep-alive): a hung or cut-off member must be found
/// out the way a user's proxy finds it out. A scenario that needs a flag sets it on the result and names the flag.
pub fn proxy_config(seed: u64, members: usize) -> proxy::Config {
    let endpoints = (0..members)
        .map(|m| proxy::Endpoint::parse(&topology::member_authority(m)).expect("valid endpoint"))
        .collect();
    let mut config = proxy::Config::new(endpoints, topology::listen_addr(PROXY_PORT), seed);
    // Not a flag: no user can set it (the binary always waits 10 s). It bounds only how long the stop at the end
    // of a run waits for calls still in flight, so it must fit in SHUTDOWN_LIMIT; nothing a checker judges
    // happens after the clients are done.
    config.shutdown_grace = Duration::from_secs(2);
    config
}

impl<'a> World<'a> {
    /// A world with one proxy on [`PROXY_HOST`], configured by [`proxy_config`] (with TLS on both sides when
    /// [`Settings::tls`] is set).
    pub fn new(settings: Settings) -> Self {
        let config = proxy_config(settings.seed, settings.members);
        Self::with_proxy(settings, config)
    }

    /// A world with one proxy on [`PROXY_HOST`], configured by `config` (a scenario's flags on [`proxy_config`]),
    /// with TLS on both sides when [`Settings::tls`] is set.
    pub fn with_proxy(settings: Settings, mut config: proxy::Config) -> Self {
        if let Some(tls) = &settings.tls {
            tls.configure_proxy(&mut config);
        }
        Self::with_proxies(settings, vec![(PROXY_HOST.to_string(), config)])
    }

    /// A world with the given proxies (host name, configuration; each listens on its own host) instead of the one
    /// default proxy. The fault plan's link faults and proxy restarts act on [`PROXY_HOST`] only. The proxies'
    /// configurations are used as given: with [`Settings::tls`], give them TLS too ([`TlsFiles::configure_proxy`]).
    pub fn with_proxies(settings: Settings, proxies: Vec<(String, proxy::Config)>) -> Self {
        let sim = turmoil::Builder::new()
            .rng_seed(settings.seed)
            .tick_duration(TICK)
            .simulation_duration(
                settings.limit + SHUTDOWN_LIMIT + TASK_REAP_GRACE + Duration::from_secs(1),
            )
            .min_message_latency(fault::MIN_LATENCY)
            .max_message_latency(fault::DEFAULT_JITTER)
            .tcp_capacity(4096)
            .build();
        let cluster = Cluster::new(settings.members, settings.seed);
        let (stop_proxy, _) = watch::channel(false);
        let dialer = match &settings.tls {
            Some(tls) => Dialer::tls(tls.client_connector()),
            None => Dialer::plain(),
        };
        let acceptors = match &settings.tls {
            Some(tls) => tls.member_acceptors(settings.members),
            None => Vec::new(),
        };
        let mut world = Self {
            sim,
            cluster,
            trace: Trace::default(),
            plan: settings
                .plan
                .clone()
                .unwrap_or_else(|| FaultPlan::generate(settings.seed, &settings.faults)),
            settings,
            stop_proxy,
            proxy_exits: Arc::default(),
            proxies: proxies.len(),
            dialer,
            sockets: BTreeMap::new(),
            crashing: Vec::new(),
            last_fault_at: Duration::ZERO,
        };
        for member in 0..world.settings.members {
            world.add_member(member, acceptors.get(member).cloned());
        }
        for (host, config) in proxies {
            world.add_proxy(&host, config);
        }
        world
    }

    /// How this world's clients dial the proxy and the members: over TLS with the clients' certificate when
    /// [`Settings::tls`] is set, plaintext otherwise. Scenarios hand it to every client they add.
    pub fn dialer(&self) -> Dialer {
        self.dialer.clone()
    }

    /// The connections of a new host the world may crash.
    fn host_sockets(&mut self, host: &str) -> HostSockets {
        self.sockets.entry(host.to_string()).or_default().clone()
    }

    fn add_member(&mut self, member: usize, tls: Option<Arc<proxy::tls::ServerTls>>) {
        let cluster = self.cluster.clone();
        let sockets = self.host_sockets(&member_host(member));
        self.sim.host(member_host(member), move || {
            let cluster = cluster.clone();
            let tls = tls.clone();
            let sockets = sockets.clone();
            async move {
                let net = TurmoilNet::tracking(sockets.clone());
                let serve = async move {
                    let listener = net.bind(topology::listen_addr(MEMBER_PORT)).await?;
                    let options = model::ServeOptions {
                        keepalive: Some(MEMBER_KEEPALIVE),
                        tls,
                    };
                    model::serve_with(cluster, member, listener, std::future::pending(), options)
                        .await?;
                    turmoil::Result::Ok(())
                };
                tokio::select! {
                    biased;
                    served = serve => served?,
                    () = sockets.close_when_asked() => {}
                }
                Ok(())
            }
        });
    }

    fn add_proxy(&mut self, host: &str, config: proxy::Config) {
        let stop = self.stop_proxy.subscribe();
        let exits = self.proxy_exits.clone();
        let sockets = self.host_sockets(host);
        self.sim.host(host, move || {
            let config = config.clone();
            let mut stop = stop.clone();
            let exits = exits.clone();
            let sockets = sockets.clone();
            async move {
                let shutdown = async move {
                    let _ = stop.wait_for(|stopped| *stopped).await;
                };
                let net = Arc::new(TurmoilNet::tracking(sockets.clone()));
                let run = async move {
                    let result = proxy::run(config, net, shutdown).await;
                    let tasks_left = wait_for_tasks_to_end().await;
                    exits
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(ProxyExit {
                            result: result.map_err(|e| e.to_string()),
                            tasks_left,
                        });
                };
                tokio::select! {
                    biased;
                    () = run => {}
                    () = sockets.close_when_asked() => {}
                }
                Ok(())
            }
        });
    }

    /// Adds a client host running `body` (a scenario's workload).
    pub fn client<F>(&mut self, name: &str, body: F)
    where
        F: std::future::Future<Output = turmoil::Result> + 'static,
    {
        self.sim.client(name, body);
    }

    /// Runs until every client finished, then shuts the proxies down.
    pub fn run(mut self) -> Finished {
        let sim_error = self.drive().err();
        Finished {
            cluster: self.cluster.clone(),
            trace: self.trace.clone(),
            proxy_exits: self
                .proxy_exits
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            elapsed: self.sim.elapsed(),
            healed_at: self.last_fault_at,
            sim_error,
        }
    }

    /// The connections to close before `fault` crashes or restarts a host that is running.
    fn sockets_to_close(&mut self, fault: &Fault) -> Option<HostSockets> {
        let host = match fault {
            Fault::Crash(m) | Fault::Restart(m) => member_host(*m),
            Fault::RestartProxy => PROXY_HOST.to_string(),
            _ => return None,
        };
        let sockets = self.sockets.get(&host)?.clone();
        self.sim.is_host_running(host.as_str()).then_some(sockets)
    }

    fn drive(&mut self) -> Result<(), String> {
        // Dependencies that read std's clock (h2) read simulated time too: see `sim_clock`.
        let clock = sim_clock::Simulated::start();
        loop {
            let now = self.sim.elapsed();
            clock.at(now);
            let mut due = std::mem::take(&mut self.crashing);
            due.extend(self.plan.take_due(now).into_iter().map(|s| (s, false)));
            let mut waiting = false;
            for (scheduled, prepared) in due {
                // A crash of a running host waits one step, while the host closes its connections in order (see
                // `net`); the faults after it wait with it, so that they keep their order.
                if waiting {
                    self.crashing.push((scheduled, prepared));
                    continue;
                }
                if !prepared && let Some(sockets) = self.sockets_to_close(&scheduled.fault) {
                    sockets.request_close();
                    self.crashing.push((scheduled, true));
                    waiting = true;
                    continue;
                }
                // A crash or hang also moves the model's leader (a new term) if it led.
                let line = fault::apply(&mut self.sim, &self.cluster, &scheduled.fault);
                self.last_fault_at = now;
                if scheduled.fault == Fault::RestartProxy {
                    self.cluster.proxy_restarted(now);
                }
                // Also a log event, so that `RUST_LOG=proxy=debug,sim=info` interleaves faults with the proxy's logs.
                tracing::info!(at = format!("{:.3}s", now.as_secs_f64()), "{line}");
                self.trace.record_at(now, line);
            }
            if self.sim.step().map_err(|e| e.to_string())? {
                break;
            }
        }
        self.trace
            .record_at(self.sim.elapsed(), "clients done; stopping the proxy");
        let _ = self.stop_proxy.send(true);
        let deadline = self.sim.elapsed() + SHUTDOWN_LIMIT + TASK_REAP_GRACE;
        while self
            .proxy_exits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
            < self.proxies
        {
            if self.sim.elapsed() >= deadline {
                return Err(format!(
                    "the proxy did not stop within {SHUTDOWN_LIMIT:?} of its shutdown signal"
                ));
            }
            clock.at(self.sim.elapsed());
            self.sim.step().map_err(|e| e.to_string())?;
        }
        self.trace.record_at(self.sim.elapsed(), "proxy stopped");
        Ok(())
    }
}
