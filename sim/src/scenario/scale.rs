//! The scenarios at scale: hundreds of client watchers multiplexed over a few connections (`watch-scale`), and
//! thousands of leases kept alive by hundreds of client streams (`lease-scale`), through one proxy, under the same
//! fault plans as the small scenarios.
//!
//! `watch-scale` also takes a census at a quiet point: faults healed at [`QUIET_FROM`](super::QUIET_FROM), creates
//! and cancels over by [`CHURN_UNTIL`], writes over, the fence written (its revisions reach every member-side
//! stream, so a stream the proxy abandoned during a partition gets an RST and ends), and progress notifications
//! flowing. At [`CENSUS_AT`] the model's live watchers are compared with the ranges the clients watch.

use std::collections::BTreeSet;
use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;
use tokio::sync::watch;

use super::leases::{self, LeaseSpec, Library};
use super::logs::{Logs, now};
use super::watchers::{LiveWatchers, Start, StreamEnv, WatcherSpec, run_watch_stream};
use super::{FENCE_AT, QUIET_FROM, WATCH_GIVE_UP, watch_ranges, writers};
use crate::check::census::CensusLog;
use crate::topology::proxy_authority;
use crate::world::World;

/// Client connections (hosts) of `watch-scale`, Watch streams per connection, and watchers first created per stream.
pub const WATCH_CLIENTS: usize = 6;
pub const STREAMS_PER_CLIENT: usize = 2;
pub const WATCHERS_PER_STREAM: usize = 25;

/// Creates and cancels happen before this; the census waits for everything to settle after it.
pub const CHURN_UNTIL: Duration = Duration::from_millis(3000);
/// The quiet point: a second after the fence's last revision was written.
pub const CENSUS_AT: Duration = Duration::from_millis(5500);
/// Progress notifications in `watch-scale` (etcd's default is ten minutes).
const PROGRESS_INTERVAL: Duration = Duration::from_millis(800);

/// Ranges of `watch-scale`: the small scenario's, plus more that overlap them. Each covers a key of the keyspace.
fn scale_ranges() -> Vec<(&'static str, &'static str)> {
    let mut ranges = watch_ranges();
    ranges.extend([("k/0", "k/3"), ("k/3", ""), ("k/", "k/4"), ("k/5", "k0")]);
    ranges
}

fn random_start(rng: &mut StdRng) -> Start {
    match rng.random_range(0..100) {
        0..55 => Start::Now,
        55..80 => Start::Behind(rng.random_range(1..=12)),
        80..90 => Start::Revision(rng.random_range(1..=3)),
        _ => Start::Ahead(rng.random_range(1..=60)),
    }
}

/// The plan of one Watch stream: watchers created over the first part of the run, some cancelled and followed by
/// another (reusing a client-chosen ID), with mixed ranges, starts and options.
fn stream_plan(rng: &mut StdRng, name: &str) -> Vec<WatcherSpec> {
    let ranges = scale_ranges();
    let mut plan = Vec::new();
    for index in 0..WATCHERS_PER_STREAM {
        let (key, range_end) = ranges[rng.random_range(0..ranges.len())];
        let mut spec = WatcherSpec::simple(
            format!("{name}.w{index}"),
            key,
            range_end,
            random_start(rng),
        );
        spec.prev_kv = rng.random_bool(0.5);
        match rng.random_range(0..100) {
            0..15 => spec.no_put = true,
            15..30 => spec.no_delete = true,
            _ => {}
        }
        spec.progress_notify = rng.random_bool(0.25);
        // Client-chosen IDs stay far above the server's automatic ones (0, 1, ...) on the stream.
        spec.watch_id = rng.random_bool(0.4).then_some(1000 + index as i64);
        spec.create_at = Duration::from_millis(rng.random_range(0..1500));
        if rng.random_bool(0.2) {
            let cancel_at = spec.create_at + Duration::from_millis(rng.random_range(300..1300));
            spec.cancel_at = Some(cancel_at);
            let mut next = spec.clone();
            next.name = format!("{name}.w{index}b");
            if rng.random_bool(0.5) {
                let (key, range_end) = ranges[rng.random_range(0..ranges.len())];
                next.key = key.as_bytes().to_vec();
                next.range_end = range_end.as_bytes().to_vec();
            }
            next.start = if rng.random_bool(0.5) {
                Start::Now
            } else {
                Start::Behind(rng.random_range(1..=6))
            };
            next.create_at = cancel_at + Duration::from_millis(rng.random_range(20..200));
            next.cancel_at = None;
            next.after = Some(plan.len());
            plan.push(spec);
            plan.push(next);
        } else {
            plan.push(spec);
        }
    }
    debug_assert!(
        plan.iter()
            .all(|s| s.create_at < CHURN_UNTIL && s.cancel_at.is_none_or(|c| c < CHURN_UNTIL))
    );
    plan
}

pub(super) fn build_watch_scale(
    world: &mut World<'_>,
    logs: &Logs,
    rng: &mut StdRng,
    members: usize,
) {
    build_watchers(
        world,
        logs,
        rng,
        members,
        WATCH_CLIENTS,
        &[proxy_authority()],
    );
}

/// `watch-scale`'s workload with `clients` client connections, client `i` dialing `targets[i % targets.len()]`.
pub(super) fn build_watchers(
    world: &mut World<'_>,
    logs: &Logs,
    rng: &mut StdRng,
    members: usize,
    clients: usize,
    targets: &[String],
) {
    world.cluster.set_progress_interval(PROGRESS_INTERVAL);
    let (fence_tx, fence_rx) = watch::channel(None);
    let (released_tx, released_rx) = watch::channel(false);
    let live = LiveWatchers::default();
    for client in 0..clients {
        let target = targets[client % targets.len()].clone();
        let plans: Vec<(String, Vec<WatcherSpec>)> = (0..STREAMS_PER_CLIENT)
            .map(|stream| {
                let name = format!("c{client}s{stream}");
                let plan = stream_plan(rng, &name);
                (name, plan)
            })
            .collect();
        let (cluster, trace, logs) = (world.cluster.clone(), world.trace.clone(), logs.clone());
        let (fence, released, live) = (fence_rx.clone(), released_rx.clone(), live.clone());
        let dialer = world.dialer();
        world.client(&format!("watchers{client}"), async move {
            // One connection per client, several Watch streams on it.
            let env = StreamEnv {
                channel: dialer.channel(&target),
                cluster,
                fence,
                released,
                live,
                give_up_at: WATCH_GIVE_UP,
                trace,
                login: None,
            };
            let running: Vec<_> = plans
                .into_iter()
                .map(|(name, plan)| tokio::spawn(run_watch_stream(name, plan, env.clone())))
                .collect();
            for handle in running {
                let log = handle.await?;
                for watcher in log.watchers {
                    logs.push_watcher(watcher);
                }
                logs.push_stream_problems(log.problems);
            }
            Ok(())
        });
    }
    for writer in 0..2 {
        let seed = rng.random();
        let (cluster, trace, dialer) = (world.cluster.clone(), world.trace.clone(), world.dialer());
        world.client(&format!("writer{writer}"), async move {
            writers::direct_writer(
                format!("writer{writer}"),
                seed,
                writers::MemberClients::new(members, &dialer),
                QUIET_FROM,
                writer == 0,
                cluster,
                trace,
            )
            .await;
            Ok(())
        });
    }
    let (trace, dialer) = (world.trace.clone(), world.dialer());
    world.client("fence", async move {
        tokio::time::sleep(FENCE_AT.saturating_sub(now())).await;
        let fence = writers::fence_with_deletes(members, dialer, trace).await;
        let _ = fence_tx.send(Some(fence));
        Ok(())
    });
    let (cluster, trace, logs) = (world.cluster.clone(), world.trace.clone(), logs.clone());
    world.client("census", async move {
        tokio::time::sleep(CENSUS_AT.saturating_sub(now())).await;
        let census = cluster.watch_census();
        let client_ranges: BTreeSet<_> = live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        trace.record(format!(
            "census: {} upstream watcher(s) on {} stream(s); clients watch {} distinct range(s)",
            census.total(),
            census.streams.len(),
            client_ranges.len()
        ));
        logs.push_census(CensusLog {
            at: now(),
            census,
            client_ranges,
        });
        let _ = released_tx.send(true);
        Ok(())
    });
}

/// `lease-scale`: client hosts, keep-alive streams per host (each its own connection), leases per stream: 2000
/// leases on 200 streams, the "thousands of leases over hundreds of streams" of the lease coalescing issue (~3 s of
/// CPU per seed in a debug build).
pub const LEASE_HOSTS: usize = 4;
pub const STREAMS_PER_LEASE_HOST: usize = 50;
pub const LEASES_PER_STREAM: usize = 10;
/// One request per lease per second: a third of the TTL, as etcd's clients renew.
const SCALE_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);

pub(super) fn build_lease_scale(world: &mut World<'_>, logs: &Logs, rng: &mut StdRng) {
    build_lease_keepers(world, logs, rng, LEASE_HOSTS, &[proxy_authority()]);
}

/// `lease-scale`'s workload on `hosts` client hosts, host `h` dialing `targets[h % targets.len()]`.
pub(super) fn build_lease_keepers(
    world: &mut World<'_>,
    logs: &Logs,
    rng: &mut StdRng,
    hosts: usize,
    targets: &[String],
) {
    for host in 0..hosts {
        let target = targets[host % targets.len()].clone();
        let specs: Vec<LeaseSpec> = (0..STREAMS_PER_LEASE_HOST)
            .map(|stream| LeaseSpec {
                name: format!("h{host}s{stream}"),
                library: Library::Tonic,
                ttl: super::LEASE_TTL,
                interval: SCALE_KEEPALIVE_INTERVAL,
                leases: LEASES_PER_STREAM,
                // About one stream in ten stops keeping its leases alive mid-run.
                stop_at: rng
                    .random_bool(0.1)
                    .then(|| Duration::from_millis(rng.random_range(1000..2500))),
                until: super::LEASE_UNTIL,
            })
            .collect();
        let (logs, trace, cluster) = (logs.clone(), world.trace.clone(), world.cluster.clone());
        let dialer = world.dialer();
        world.client(&format!("leases{host}"), async move {
            let running: Vec<_> = specs
                .into_iter()
                .map(|spec| {
                    // Each stream on its own connection, as separate client processes would.
                    let channel = dialer.channel(&target);
                    tokio::spawn(leases::lease_client(
                        spec,
                        channel,
                        dialer.clone(),
                        Some(cluster.clone()),
                        logs.clone(),
                        trace.clone(),
                    ))
                })
                .collect();
            for handle in running {
                handle.await?;
            }
            Ok(())
        });
    }
}
