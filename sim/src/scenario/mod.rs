//! The scenarios: each builds a [`World`] from a seed (topology, fault plan, clients), runs it, and checks the
//! invariants that apply. [`run`] never panics: a panic or a failed check becomes a violation in the [`Report`],
//! which carries the seed, the trace digest and the trace's last lines.
//!
//! To add a scenario: add a variant to [`Scenario`], a `fn build_*` that adds clients to the world and returns
//! the checks to run, and list it in [`Scenario::ALL`]; `tests/scenarios.rs` sweeps every scenario.
//!
//! Every scenario also runs with TLS on every connection when its settings carry [`Settings::tls`] ([`run_with`];
//! `tests/tls.rs` sweeps `failover` and `watch` so): clients get their channels from [`World::dialer`], never from
//! the plaintext [`crate::topology::channel`].

pub mod auth;
pub mod cache_readers;
pub mod callers;
pub mod client_links;
pub mod fleet;
pub mod leases;
pub mod login;
pub mod logs;
pub mod scale;
pub mod watchers;
pub mod writers;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

use crate::check::auth::{check_both_kinds, check_forbidden_watcher, check_reads, permitted};
use crate::check::cache::check_cache;
use crate::check::calls::{ToleratedWriteFailure, check_calls};
use crate::check::census::check_census;
use crate::check::hygiene::check_hygiene;
use crate::check::lease::{check_leases, expected_upstream_keepalive_streams};
use crate::check::watch::{Lateness, check_delivery, check_lag, check_watcher};
use crate::fault::FaultProfile;
use crate::topology::proxy_authority;
use crate::trace::digest;
use crate::world::{Settings, World};
use logs::{Logs, now};
use watchers::{Fence, LiveWatchers, Start, StreamEnv, WatcherSpec, run_watcher};

/// How far behind the members a watcher created without a start revision may begin (behind the stalest member's
/// revision: a member cut off from the others reports the revision it had applied, as it would to a client of its
/// own). The pass-through proxy opens a fresh watcher on etcd, which reports its current revision, so nothing lags;
/// coalescing may join an existing upstream watcher, which the hub must bring up to date first.
pub const REVISION_LAG_BOUND: i64 = 0;

/// How long after the later of an event's commit and the last fault's healing a watcher may get the event. Once
/// healed, the worst left is an active member behind a connection the faults broke for good (turmoil does not
/// retransmit): the proxy replaces it within [`proxy::upstream::replacement_bound`] (1.75 s) under its defaults,
/// and its upstream watcher resumes there; a client whose stream broke re-opens it after at most
/// [`watchers::BACKOFF_MAX`]; the replay then takes a few round trips at the healed links' jitter (5 ms each; 50 ms
/// allows ten). The runs' worst is printed by `try_seeds` (`delivery`): 0.69 s over seeds 0-99 of `watch`.
pub fn delivery_bound(scenario: Scenario) -> Duration {
    let base =
        proxy::upstream::replacement_bound() + watchers::BACKOFF_MAX + Duration::from_millis(50);
    match scenario {
        // A client whose link was cut finds the hole in its connection by its keep-alive first.
        Scenario::Watch | Scenario::Auth => {
            base + client_links::CLIENT_KEEPALIVE.0 + client_links::CLIENT_KEEPALIVE.1
        }
        _ => base,
    }
}

/// Write failures the failover check accepts beyond etcd's own codes. It once held the proxy's defect of reporting
/// a write cut off by a broken connection as `Unknown: transport error` (etcd's clients get `Unavailable`); the
/// proxy now maps it, so nothing is tolerated and the checker holds the proxy to etcd's codes.
pub const TOLERATED_WRITE_FAILURES: &[ToleratedWriteFailure] = &[];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// Watchers through the proxy while writers hit the members directly; members crash, links break, messages
    /// are held, the proxy restarts. Checks watch completeness and revision lag.
    Watch,
    /// Reads and writes through the proxy (tonic and etcd-client) while members crash and links break. Checks
    /// failover transparency.
    Failover,
    /// Lease keep-alives through the proxy across failovers and proxy restarts; one client stops. Checks lease
    /// fan-out, no early expiry, and prompt expiry.
    Lease,
    /// Hundreds of watchers multiplexed on a few streams per connection, created, cancelled and re-created, under
    /// the same faults as `watch`. Checks watch completeness, progress, revision lag, and one upstream watcher per
    /// distinct range at a quiet point.
    WatchScale,
    /// Thousands of leases kept alive by hundreds of client streams, some stopping. Checks what `lease` checks.
    LeaseScale,
    /// The range cache on (`--range-cache-max-bytes=67108864`): readers repeat serializable and linearizable Range
    /// calls through the proxy while writers write on the members and through the proxy, members fail and a
    /// compactor compacts on a member. Checks that every answer is the model's state at its revision, that a
    /// client's revisions never go back, that linearizable answers hold every acknowledged write, and that the
    /// cache answered reads ([`cache_readers`], [`crate::check::cache`]).
    Cache,
    /// etcd's auth on, tokens expiring after two seconds unused, `watch`'s faults: watchers through the proxy as
    /// users who may read some ranges and not others, the proxy with `--user` on even seeds ([`auth`]). Checks
    /// watch completeness and timeliness for permitted watchers, and that forbidden ones are refused with etcd's
    /// reason and see nothing.
    Auth,
    /// Ten proxies in a tree (a top-level proxy, leaves in front of it, leaves in front of those), with
    /// `watch-scale`'s watchers and `lease-scale`'s keepers on the leaves ([`fleet`]). Checks what those two check:
    /// coalescing composes, so the members still see one upstream watcher per distinct range and one keep-alive
    /// stream.
    Fleet,
}

impl Scenario {
    pub const ALL: [Scenario; 8] = [
        Scenario::Watch,
        Scenario::Failover,
        Scenario::Lease,
        Scenario::WatchScale,
        Scenario::LeaseScale,
        Scenario::Cache,
        Scenario::Fleet,
        Scenario::Auth,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::Watch => "watch",
            Scenario::Failover => "failover",
            Scenario::Lease => "lease",
            Scenario::WatchScale => "watch-scale",
            Scenario::LeaseScale => "lease-scale",
            Scenario::Cache => "cache",
            Scenario::Fleet => "fleet",
            Scenario::Auth => "auth",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// The result of one run.
#[derive(Clone, Debug)]
pub struct Report {
    pub scenario: Scenario,
    pub seed: u64,
    /// The run had TLS on every connection ([`Settings::tls`]; swept by `tests/tls.rs`).
    pub tls: bool,
    pub digest: u64,
    pub violations: Vec<String>,
    pub worst_lag: Option<i64>,
    /// The latest event delivery to a watcher, past the later of its commit and the last fault's healing.
    pub worst_delivery: Option<Lateness>,
    /// Known proxy defects the checks accepted in this run (see [`TOLERATED_WRITE_FAILURES`]).
    pub tolerated: Vec<String>,
    pub watchers: usize,
    pub calls: usize,
    pub revisions: i64,
    pub trace_tail: Vec<String>,
    pub virtual_time: Duration,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// What a failing run prints: how to reproduce it, what broke, and how the run ended.
    pub fn failure_text(&self) -> String {
        let (over, test) = match self.tls {
            true => (" over TLS", "tls"),
            false => ("", "scenarios"),
        };
        format!(
            "scenario {}{over} seed {} FAILED (reproduce: SIM_SEED={} cargo test -p sim --test {test} {})\n  digest {:016x}\n  violations:\n    {}\n  last trace lines:\n    {}",
            self.scenario.name(),
            self.seed,
            self.seed,
            test_filter(self.scenario),
            self.digest,
            self.violations.join("\n    "),
            self.trace_tail.join("\n    ")
        )
    }
}

/// The name filter of `scenario`'s test functions (`watch_scale_scenario_...` for `watch-scale`): the scenario's name
/// alone would match no test of a scenario whose name has a hyphen.
fn test_filter(scenario: Scenario) -> String {
    format!("{}_scenario", scenario.name().replace('-', "_"))
}

/// Phases of a run, in virtual time.
const FAULTS_FROM: Duration = Duration::from_millis(300);
pub const QUIET_FROM: Duration = Duration::from_millis(3500);
pub const FENCE_AT: Duration = Duration::from_millis(4500);
const WATCH_GIVE_UP: Duration = Duration::from_secs(9);
const LIMIT: Duration = Duration::from_secs(20);

/// The fault profile of a scenario (public so that proptest can build plans with the same phases).
pub fn profile(scenario: Scenario, members: usize) -> FaultProfile {
    FaultProfile {
        members,
        start: FAULTS_FROM,
        quiet_from: QUIET_FROM,
        crashes: true,
        hangs: true,
        partitions: true,
        isolations: true,
        holds: true,
        latency: true,
        // Restarting the proxy breaks its clients' calls, which failover transparency does not excuse.
        proxy_restarts: scenario != Scenario::Failover,
        mean_gap: Duration::from_millis(500),
        max_outage: Duration::from_millis(1500),
    }
}

/// The settings `run` uses for a seed.
pub fn settings(scenario: Scenario, seed: u64) -> Settings {
    let members = 3;
    Settings {
        seed,
        members,
        faults: profile(scenario, members),
        plan: None,
        limit: LIMIT,
        tls: None,
    }
}

/// Runs one scenario with one seed and checks it.
pub fn run(scenario: Scenario, seed: u64) -> Report {
    run_with(scenario, settings(scenario, seed))
}

/// Runs one scenario in the given settings (proptest supplies its own fault plans through these).
pub fn run_with(scenario: Scenario, settings: Settings) -> Report {
    let (seed, tls) = (settings.seed, settings.tls.is_some());
    let outcome = catch_unwind(AssertUnwindSafe(|| run_inner(scenario, settings)));
    match outcome {
        Ok(report) => report,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".to_string());
            Report {
                scenario,
                seed,
                tls,
                digest: 0,
                violations: vec![format!("panicked: {message}")],
                worst_lag: None,
                worst_delivery: None,
                tolerated: Vec::new(),
                watchers: 0,
                calls: 0,
                revisions: 0,
                trace_tail: Vec::new(),
                virtual_time: Duration::ZERO,
            }
        }
    }
}

fn run_inner(scenario: Scenario, settings: Settings) -> Report {
    let (seed, tls) = (settings.seed, settings.tls.is_some());
    let members = settings.members;
    let mut world = match scenario {
        Scenario::Cache => cache_readers::world(settings),
        Scenario::Watch => watch_world(settings),
        Scenario::Fleet => fleet::world(settings),
        Scenario::Auth => auth::world(settings),
        Scenario::Failover => failover_world(settings),
        _ => World::new(settings),
    };
    let logs = Logs::default();
    let mut rng = StdRng::seed_from_u64(seed ^ 0x636c_6965_6e74);
    let mut cache_logs = None;
    match scenario {
        Scenario::Watch => build_watch(&mut world, &logs, &mut rng, members),
        Scenario::Failover => build_failover(&mut world, &logs, &mut rng),
        Scenario::Lease => build_lease(&mut world, &logs, &mut rng),
        Scenario::WatchScale => scale::build_watch_scale(&mut world, &logs, &mut rng, members),
        Scenario::LeaseScale => scale::build_lease_scale(&mut world, &logs, &mut rng),
        Scenario::Fleet => fleet::build_fleet(&mut world, &logs, &mut rng, members),
        Scenario::Auth => auth::build_auth(&mut world, &logs, &mut rng, members),
        Scenario::Cache => {
            cache_logs = Some(cache_readers::build_cache(&mut world, &mut rng, members));
        }
    }
    let finished = world.run();
    let history = finished.cluster.history();
    let mut violations = check_hygiene(&finished);
    let watcher_logs = logs.watchers();
    let mut worst_lag = None;
    let mut worst_delivery = None;
    let mut tolerated = Vec::new();
    match scenario {
        Scenario::Watch | Scenario::WatchScale | Scenario::Fleet | Scenario::Auth => {
            // Under auth, a watcher its user may not read must have been refused; the others are checked.
            let (watcher_logs, forbidden): (Vec<_>, Vec<_>) = watcher_logs
                .iter()
                .cloned()
                .partition(|log| permitted(&finished.cluster, log));
            for log in &forbidden {
                violations.extend(check_forbidden_watcher(log).err());
            }
            if scenario == Scenario::Auth {
                violations.extend(check_both_kinds(watcher_logs.len(), forbidden.len()).err());
                violations.extend(check_reads(&finished.cluster, &history, &logs.user_reads()));
            }
            for log in &watcher_logs {
                if let Err(violation) = check_watcher(&history, log) {
                    violations.push(violation);
                }
            }
            let (worst, lag_violations) = check_lag(&watcher_logs, REVISION_LAG_BOUND);
            worst_lag = worst;
            violations.extend(lag_violations);
            let (latest, late) = check_delivery(
                &history,
                &watcher_logs,
                finished.healed_at,
                delivery_bound(scenario),
            );
            worst_delivery = latest;
            violations.extend(late);
            violations.extend(logs.stream_problems());
            if !matches!(scenario, Scenario::Watch | Scenario::Auth) {
                let censuses = logs.censuses();
                if censuses.is_empty() {
                    violations.push("no census was taken".into());
                }
                for census in &censuses {
                    violations.extend(check_census(census));
                }
            }
        }
        Scenario::Failover => {
            let verdict = check_calls(
                &history,
                &logs.calls(),
                callers::CALL_BOUND,
                TOLERATED_WRITE_FAILURES,
            );
            violations.extend(verdict.violations);
            tolerated = verdict.tolerated;
        }
        // Checked below, with the fleet's.
        Scenario::Lease | Scenario::LeaseScale => {}
        Scenario::Cache => {
            let cache_logs = cache_logs.as_ref().expect("built above");
            let verdict = check_cache(
                &history,
                &cache_logs.reads(),
                &cache_logs.writes(),
                cache_logs.metrics().as_ref(),
                &cache_readers::MINIMUMS,
            );
            violations.extend(verdict.violations);
        }
    }
    if matches!(
        scenario,
        Scenario::Lease | Scenario::LeaseScale | Scenario::Fleet
    ) {
        let leases = logs.leases();
        violations.extend(check_leases(
            &history,
            &leases,
            expected_upstream_keepalive_streams(leases.len()),
            finished.elapsed,
        ));
    }
    let lines = finished.trace.lines();
    Report {
        scenario,
        seed,
        tls,
        digest: digest(&lines, &history),
        violations,
        worst_lag,
        worst_delivery,
        tolerated,
        watchers: watcher_logs.len(),
        calls: logs.calls().len()
            + logs.user_reads().len()
            + cache_logs.map_or(0, |l| l.reads().len()),
        revisions: history.revisions.last().map_or(1, |r| r.revision),
        trace_tail: finished.trace.tail(
            std::env::var("SIM_TRACE_TAIL")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(25),
        ),
        virtual_time: finished.elapsed,
    }
}

/// Keys and ranges the watchers pick from; every one covers at least one key of the keyspace (for the fence).
pub(crate) fn watch_ranges() -> Vec<(&'static str, &'static str)> {
    vec![
        ("k/", "k0"),
        ("k/1", ""),
        ("k/2", "k/5"),
        ("k/4", "\0"),
        ("\0", "\0"),
    ]
}

/// The watch scenario's client hosts.
pub(crate) fn watch_clients() -> Vec<String> {
    (0..WATCH_CLIENTS).map(|c| format!("watcher{c}")).collect()
}
pub(crate) const WATCH_CLIENTS: usize = 3;

/// The watch scenario's world: the shared plan plus cuts of the watchers' links with the proxy
/// ([`client_links`]), and the proxy with `--grpc-keepalive-min-time=500ms`, so that it allows the pings of
/// clients that keep their connections alive every 500 ms.
fn watch_world<'a>(settings: Settings) -> World<'a> {
    watch_world_with(settings, None)
}

/// How many workers the failover scenario's proxy runs (`--worker-threads=2`); every other scenario runs one, as on
/// a host (or container) with one core. The workers share the simulated host's runtime, but each serves its share
/// of the client connections and calls the members on connections of its own, as in the binary (`proxy::workers`):
/// the faults break and hang each worker's connections as they come, and the heartbeat and the probes must find a
/// member that hangs one worker's calls while the other's answer (seeds 45719, 47296 and 47403 hung calls when
/// they asked on one connection). Failover, the revision floor and the cache are shared. What one runtime does not
/// show is two threads' timing.
pub const FAILOVER_WORKERS: usize = 2;

/// The failover scenario's world: [`World::new`]'s proxy with [`FAILOVER_WORKERS`] workers.
fn failover_world<'a>(settings: Settings) -> World<'a> {
    let mut config = crate::world::proxy_config(settings.seed, settings.members);
    config.workers = FAILOVER_WORKERS;
    World::with_proxy(settings, config)
}

/// [`watch_world`], with the proxy's `--user` when `user` is given.
pub(crate) fn watch_world_with<'a>(
    settings: Settings,
    user: Option<proxy::config::Credentials>,
) -> World<'a> {
    let settings = client_links::with_client_cuts(settings, &watch_clients());
    let mut config = crate::world::proxy_config(settings.seed, settings.members);
    config.client_ping_min_time = client_links::CLIENT_KEEPALIVE.0;
    config.user = user;
    World::with_proxy(settings, config)
}

fn build_watch(world: &mut World<'_>, logs: &Logs, rng: &mut StdRng, members: usize) {
    let (fence_tx, fence_rx) = watch::channel(None);
    let ranges = watch_ranges();
    for (client, host) in watch_clients().into_iter().enumerate() {
        let mut specs = Vec::new();
        for index in 0..2 {
            let (key, range_end) = ranges[rng.random_range(0..ranges.len())];
            let start = match rng.random_bool(0.3) {
                true => Start::Revision(rng.random_range(1..4)),
                false => Start::Now,
            };
            let mut spec = WatcherSpec::simple(format!("w{client}.{index}"), key, range_end, start);
            spec.prev_kv = rng.random_bool(0.5);
            spec.no_delete = rng.random_bool(0.2);
            specs.push(spec);
        }
        let delay = Duration::from_millis(rng.random_range(0..1500));
        spawn_watch_client(world, logs, &host, specs, delay, &fence_rx, None);
    }
    spawn_direct_writers(world, rng, members, None);
    spawn_fence(world, members, fence_tx, None);
}

/// A watch client on `host`: after `delay`, one connection to the proxy (kept alive by pings, so that a cut of the
/// client's link is found: [`client_links`]) and one stream per watcher of `specs`, as `login`'s user if given.
/// Its watchers may go as soon as they are complete (no census).
pub(crate) fn spawn_watch_client(
    world: &mut World<'_>,
    logs: &Logs,
    host: &str,
    specs: Vec<WatcherSpec>,
    delay: Duration,
    fence: &watch::Receiver<Option<Fence>>,
    login: Option<login::Login>,
) {
    let (_released_tx, released) = watch::channel(true);
    let env_parts = (
        world.cluster.clone(),
        world.trace.clone(),
        fence.clone(),
        released,
        world.dialer(),
    );
    let logs = logs.clone();
    world.client(host, async move {
        tokio::time::sleep(delay).await;
        let (cluster, trace, fence, released, dialer) = env_parts;
        let env = StreamEnv {
            channel: dialer
                .channel_with_keepalive(&proxy_authority(), client_links::CLIENT_KEEPALIVE),
            cluster,
            fence,
            released,
            live: LiveWatchers::default(),
            give_up_at: WATCH_GIVE_UP,
            trace,
            login,
        };
        let running: Vec<_> = specs
            .into_iter()
            .map(|spec| tokio::spawn(run_watcher(spec, env.clone())))
            .collect();
        for handle in running {
            logs.push_watcher(handle.await?);
        }
        Ok(())
    });
}

/// Two writers straight on the members until [`QUIET_FROM`] (the first also compacts), as `login`'s user if given.
pub(crate) fn spawn_direct_writers(
    world: &mut World<'_>,
    rng: &mut StdRng,
    members: usize,
    login: Option<login::Login>,
) {
    for writer in 0..2 {
        let seed = rng.random();
        let cluster = world.cluster.clone();
        let (trace, dialer) = (world.trace.clone(), world.dialer());
        let login = login.clone();
        world.client(&format!("writer{writer}"), async move {
            let mut clients = writers::MemberClients::new(members, &dialer);
            if let Some(login) = login {
                clients = clients.as_user(login);
            }
            writers::direct_writer(
                format!("writer{writer}"),
                seed,
                clients,
                QUIET_FROM,
                writer == 0,
                cluster,
                trace,
            )
            .await;
            Ok(())
        });
    }
}

/// The fence at [`FENCE_AT`], straight on the members, as `login`'s user if given; announced on `fence_tx`.
pub(crate) fn spawn_fence(
    world: &mut World<'_>,
    members: usize,
    fence_tx: watch::Sender<Option<Fence>>,
    login: Option<login::Login>,
) {
    let (trace, dialer) = (world.trace.clone(), world.dialer());
    world.client("fence", async move {
        tokio::time::sleep(FENCE_AT.saturating_sub(now())).await;
        let mut clients = writers::MemberClients::new(members, &dialer);
        if let Some(login) = login {
            clients = clients.as_user(login);
        }
        let revision = writers::fence_by(clients, trace).await;
        let _ = fence_tx.send(Some(Fence {
            puts: revision,
            last: revision,
        }));
        Ok(())
    });
}

fn build_failover(world: &mut World<'_>, logs: &Logs, rng: &mut StdRng) {
    for client in 0..2 {
        let (seed, logs, trace) = (rng.random(), logs.clone(), world.trace.clone());
        let dialer = world.dialer();
        world.client(&format!("tonic{client}"), async move {
            let name = format!("tonic{client}");
            callers::tonic_caller(name, seed, QUIET_FROM, dialer, logs, trace).await;
            Ok(())
        });
    }
    let (seed, logs, trace) = (rng.random(), logs.clone(), world.trace.clone());
    let dialer = world.dialer();
    world.client("etcdclient", async move {
        let name = "etcdclient".to_string();
        callers::etcd_client_caller(name, seed, QUIET_FROM, dialer, logs, trace).await;
        Ok(())
    });
}

/// Lease timing: long enough TTL to ride out a failover, short enough to see the stopped lease expire.
pub const LEASE_TTL: Duration = Duration::from_secs(3);
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_millis(700);
pub const LEASE_UNTIL: Duration = Duration::from_millis(6500);

fn build_lease(world: &mut World<'_>, logs: &Logs, rng: &mut StdRng) {
    let clients = 3;
    let stopper = rng.random_range(0..clients);
    for client in 0..clients {
        let spec = leases::LeaseSpec {
            name: format!("lease{client}"),
            library: if client % 2 == 0 {
                leases::Library::Tonic
            } else {
                leases::Library::EtcdClient
            },
            ttl: LEASE_TTL,
            interval: KEEPALIVE_INTERVAL,
            leases: 1,
            stop_at: (client == stopper)
                .then(|| Duration::from_millis(rng.random_range(1000..2500))),
            until: LEASE_UNTIL,
        };
        let (logs, trace, dialer) = (logs.clone(), world.trace.clone(), world.dialer());
        world.client(&format!("lease{client}"), async move {
            let channel = dialer.channel(&proxy_authority());
            leases::lease_client(spec, channel, dialer, None, logs, trace).await;
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The printed command runs the failing scenario's test: its filter is the start of that test's name
    /// (`sim/tests/scenarios.rs`, `sim/tests/tls.rs`).
    #[test]
    fn the_printed_filter_is_the_start_of_the_scenarios_test_name() {
        assert_eq!(test_filter(Scenario::WatchScale), "watch_scale_scenario");
        assert_eq!(test_filter(Scenario::Watch), "watch_scenario");
        for scenario in Scenario::ALL {
            assert!(!test_filter(scenario).contains('-'), "{scenario:?}");
        }
    }
}
