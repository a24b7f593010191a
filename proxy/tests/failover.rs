//! Failover: with several endpoints, clients of the proxy see no failed reads when the member
//! serving them dies, writes fail at most when they were in flight at that moment, and the
//! proxy notices the member coming back.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::maintenance_client::MaintenanceClient;
use proto::etcdserverpb::{MoveLeaderRequest, PutRequest, RangeRequest, StatusRequest};
use support::grpc::{channel, status};
use support::metrics;
use testkit::{Binaries, EtcdCluster, wait_for};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tonic::transport::Channel;

/// A hang guard for one call: far above what any call takes, even across a failover.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the whole "after the kill" phase may take.
const PHASE_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug)]
struct PutRecord {
    key: String,
    started: Instant,
    ended: Instant,
    result: Result<(), String>,
}

#[derive(Default)]
struct Log {
    read_failures: Vec<String>,
    puts: Vec<PutRecord>,
}

struct Loops {
    stop: Arc<AtomicBool>,
    killed: Arc<AtomicBool>,
    reads_ok: Arc<AtomicUsize>,
    reads_ok_after_kill: Arc<AtomicUsize>,
    log: Arc<Mutex<Log>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts a read loop (linearizable Range) and a write loop (Put of fresh keys) through the
/// proxy, each one call at a time.
fn start_loops(ch: Channel, prefix: &'static str) -> Loops {
    let loops = Loops {
        stop: Arc::default(),
        killed: Arc::default(),
        reads_ok: Arc::default(),
        reads_ok_after_kill: Arc::default(),
        log: Arc::default(),
        tasks: Vec::new(),
    };
    let mut tasks = Vec::new();
    {
        let (stop, killed, ok, ok_after, log) = (
            loops.stop.clone(),
            loops.killed.clone(),
            loops.reads_ok.clone(),
            loops.reads_ok_after_kill.clone(),
            loops.log.clone(),
        );
        let mut kv = KvClient::new(ch.clone());
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let after_kill = killed.load(Ordering::SeqCst);
                let req = RangeRequest {
                    key: prefix.as_bytes().to_vec(),
                    range_end: prefix_end(prefix),
                    count_only: true,
                    ..Default::default()
                };
                match tokio::time::timeout(CALL_TIMEOUT, kv.range(req)).await {
                    Ok(Ok(_)) => {
                        ok.fetch_add(1, Ordering::SeqCst);
                        if after_kill {
                            ok_after.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Ok(Err(e)) => log.lock().await.read_failures.push(status(&e)),
                    Err(_) => log
                        .lock()
                        .await
                        .read_failures
                        .push(format!("no answer within {CALL_TIMEOUT:?}")),
                }
            }
        }));
    }
    {
        let (stop, log) = (loops.stop.clone(), loops.log.clone());
        let mut kv = KvClient::new(ch);
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let key = format!("{prefix}{i:06}");
                i += 1;
                let req = PutRequest {
                    key: key.clone().into_bytes(),
                    value: key.clone().into_bytes(),
                    ..Default::default()
                };
                let started = Instant::now();
                let result = match tokio::time::timeout(CALL_TIMEOUT, kv.put(req)).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(status(&e)),
                    Err(_) => Err(format!("no answer within {CALL_TIMEOUT:?}")),
                };
                log.lock().await.puts.push(PutRecord {
                    key,
                    started,
                    ended: Instant::now(),
                    result,
                });
            }
        }));
    }
    Loops { tasks, ..loops }
}

fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    *end.last_mut().expect("non-empty prefix") += 1;
    end
}

impl Loops {
    async fn stop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks.drain(..) {
            tokio::time::timeout(CALL_TIMEOUT * 2, t)
                .await
                .expect("loops stop within the hang guard")
                .expect("loop task panicked");
        }
    }

    async fn puts_ok(&self) -> usize {
        self.log
            .lock()
            .await
            .puts
            .iter()
            .filter(|p| p.result.is_ok())
            .count()
    }
}

/// Every key whose put returned OK is readable with its value.
async fn assert_acknowledged_puts_readable(ch: Channel, prefix: &str, log: &Log) {
    let got = KvClient::new(ch)
        .range(RangeRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: prefix_end(prefix),
            ..Default::default()
        })
        .await
        .expect("final range")
        .into_inner();
    let stored: std::collections::HashMap<Vec<u8>, Vec<u8>> = got
        .kvs
        .into_iter()
        .map(|kv| (kv.key.to_vec(), kv.value.to_vec()))
        .collect();
    let missing: Vec<&str> = log
        .puts
        .iter()
        .filter(|p| p.result.is_ok())
        .filter(|p| stored.get(p.key.as_bytes()).map(Vec::as_slice) != Some(p.key.as_bytes()))
        .map(|p| p.key.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "acknowledged puts not readable afterwards: {missing:?}"
    );
}

/// Member ID of each endpoint, and the leader's member ID as each endpoint sees it.
async fn member_ids_and_leader(endpoints: &[String]) -> Result<(Vec<u64>, u64), String> {
    let mut ids = Vec::new();
    let mut leaders = Vec::new();
    for ep in endpoints {
        let r = MaintenanceClient::new(channel(ep).await)
            .status(StatusRequest {})
            .await
            .map_err(|e| format!("status of {ep}: {}", status(&e)))?
            .into_inner();
        ids.push(r.header.map_or(0, |h| h.member_id));
        leaders.push(r.leader);
    }
    match leaders.as_slice() {
        [first, rest @ ..] if *first != 0 && rest.iter().all(|l| l == first) => Ok((ids, *first)),
        _ => Err(format!("members disagree on the leader: {leaders:?}")),
    }
}

/// Moves raft leadership to member `target` (or, with `away`, to any member but `target`)
/// and waits until every member agrees.
async fn place_leader(cluster: &EtcdCluster, target: usize, away: bool) {
    let eps = cluster.endpoints();
    let (ids, leader) = wait_for("a leader", CALL_TIMEOUT, || member_ids_and_leader(&eps)).await;
    let leader_index = ids
        .iter()
        .position(|&id| id == leader)
        .expect("leader is a member");
    let want = if away {
        if leader_index != target {
            return;
        }
        (target + 1) % ids.len()
    } else {
        if leader_index == target {
            return;
        }
        target
    };
    MaintenanceClient::new(channel(&eps[leader_index]).await)
        .move_leader(MoveLeaderRequest {
            target_id: ids[want],
        })
        .await
        .unwrap_or_else(|e| panic!("move leader to member {want}: {}", status(&e)));
    wait_for("the leader to move", CALL_TIMEOUT, || async {
        let (_, l) = member_ids_and_leader(&eps).await?;
        if l == ids[want] {
            Ok(())
        } else {
            Err(format!("leader is {l:x}"))
        }
    })
    .await;
}

/// Kills the member the proxy is using while reads and writes run through the proxy, keeps
/// them running until 200 more reads succeeded, restarts the member and waits until the proxy
/// sees it up again. With `kill_leader`, that member is made raft leader first (the cluster
/// then has no leader until the survivors elect one), otherwise leadership is moved away.
async fn failover_scenario(binaries: &Binaries, kill_leader: bool, prefix: &'static str) {
    let mut cluster = support::cluster(binaries, 3, &[]).await;
    let proxy = support::proxy::start(&cluster.endpoints(), &[]).await;
    let active = wait_for("an active upstream in /metrics", CALL_TIMEOUT, || async {
        let m = proxy.metrics().await;
        metrics::active_endpoint(&m).ok_or(m)
    })
    .await;
    let victim = cluster
        .endpoints()
        .iter()
        .position(|e| *e == active)
        .unwrap_or_else(|| {
            panic!(
                "active endpoint {active} is not one of {:?}",
                cluster.endpoints()
            )
        });
    place_leader(&cluster, victim, !kill_leader).await;

    let mut loops = start_loops(channel(&proxy.addr()).await, prefix);
    wait_for("the loops to warm up", PHASE_TIMEOUT, || async {
        let (r, p) = (loops.reads_ok.load(Ordering::SeqCst), loops.puts_ok().await);
        if r >= 20 && p >= 20 {
            Ok(())
        } else {
            Err(format!("{r} reads and {p} puts succeeded"))
        }
    })
    .await;

    let kill_started = Instant::now();
    cluster.kill(victim);
    let kill_done = Instant::now();
    loops.killed.store(true, Ordering::SeqCst);
    // Until the survivors have a leader, etcd itself may fail writes sent to them (e.g.
    // "request timed out, possibly due to previous leader failure"); clients of etcd see that
    // too, and a write that may have been applied must not be retried by the proxy.
    let survivors: Vec<String> = (0..cluster.len())
        .filter(|&i| i != victim)
        .map(|i| cluster.endpoint(i))
        .collect();
    // A leader among them: until their election timeout passes, the survivors still name the killed leader.
    wait_for(
        "the survivors to agree on a leader",
        PHASE_TIMEOUT,
        || async {
            let (ids, leader) = member_ids_and_leader(&survivors).await?;
            match ids.contains(&leader) {
                true => Ok(()),
                false => Err(format!(
                    "the survivors still name {leader:x}, which is not one of them"
                )),
            }
        },
    )
    .await;
    let leader_back = Instant::now();

    let metrics_after = wait_for(
        "the proxy to fail over to another endpoint",
        PHASE_TIMEOUT,
        || async {
            let m = proxy.metrics().await;
            match metrics::active_endpoint(&m) {
                Some(a) if a != active && metrics::failovers(&m) >= 1.0 => Ok(m),
                other => Err(format!(
                    "active {other:?}, failovers {}",
                    metrics::failovers(&m)
                )),
            }
        },
    )
    .await;
    wait_for(
        "200 more reads to succeed after the kill",
        PHASE_TIMEOUT,
        || async {
            let n = loops.reads_ok_after_kill.load(Ordering::SeqCst);
            if n >= 200 {
                Ok(())
            } else {
                Err(format!("{n} reads"))
            }
        },
    )
    .await;
    let puts_so_far = loops.puts_ok().await;
    wait_for(
        "puts to keep succeeding after the kill",
        PHASE_TIMEOUT,
        || async {
            let n = loops.puts_ok().await;
            if n >= puts_so_far + 20 {
                Ok(())
            } else {
                Err(format!("{} more puts", n - puts_so_far))
            }
        },
    )
    .await;

    cluster
        .restart(victim)
        .await
        .unwrap_or_else(|e| panic!("restart member {victim}: {e}"));
    wait_for(
        "the restarted member to show up again in /metrics",
        PHASE_TIMEOUT,
        || async {
            let m = proxy.metrics().await;
            if metrics::upstream_up(&m, &active) == Some(true) {
                Ok(())
            } else {
                Err(m
                    .lines()
                    .filter(|l| l.starts_with("etcd_grpc_proxy_upstream"))
                    .collect::<Vec<_>>()
                    .join("\n"))
            }
        },
    )
    .await;
    loops.stop().await;

    let log = loops.log.lock().await;
    assert!(
        log.read_failures.is_empty(),
        "reads through the proxy failed ({} of them): {:?}",
        log.read_failures.len(),
        log.read_failures
    );
    // A put may fail only if it was in flight at the kill, or (when the leader was killed)
    // while the cluster had no leader.
    let window_end = if kill_leader { leader_back } else { kill_done };
    let in_window = |p: &PutRecord| p.started <= window_end && p.ended >= kill_started;
    let failed: Vec<&PutRecord> = log.puts.iter().filter(|p| p.result.is_err()).collect();
    let outside: Vec<&&PutRecord> = failed.iter().filter(|p| !in_window(p)).collect();
    assert!(
        outside.is_empty(),
        "puts failed that were not in flight at the kill{}: {outside:?}",
        if kill_leader {
            " or while there was no leader"
        } else {
            ""
        }
    );
    let in_flight = log.puts.iter().filter(|p| in_window(p)).count();
    assert!(
        failed.len() <= in_flight,
        "{} failed puts but only {in_flight} were in flight: {failed:?}",
        failed.len()
    );
    assert_acknowledged_puts_readable(channel(&proxy.addr()).await, prefix, &log).await;
    assert!(metrics::failovers(&metrics_after) >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_active_follower_fails_over_without_failed_reads() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    failover_scenario(&binaries, false, "fo-follower/").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_active_leader_fails_over_without_failed_reads() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    failover_scenario(&binaries, true, "fo-leader/").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_first_endpoint_never_fails_reads_or_writes() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    let dead = format!("127.0.0.1:{}", testkit::free_port());
    let endpoints = vec![dead.clone(), cluster.endpoint(0)];
    // The provisional starting endpoint is drawn from the seed; several seeds draw the dead one. At start the
    // proxy asks every endpoint's Status and serves from the first that answers with a leader, so whatever the
    // seed, the live endpoint serves from the first call, with no failover.
    for seed in 0..6 {
        let proxy = support::proxy::start(&endpoints, &[&format!("--seed={seed}")]).await;
        let mut kv = KvClient::new(channel(&proxy.addr()).await);
        for i in 0..30 {
            let key = format!("dead-first/{seed}/{i}");
            tokio::time::timeout(
                CALL_TIMEOUT,
                kv.put(PutRequest {
                    key: key.clone().into_bytes(),
                    value: b"v".to_vec(),
                    ..Default::default()
                }),
            )
            .await
            .unwrap_or_else(|_| panic!("seed {seed}: put {key}: no answer within {CALL_TIMEOUT:?}"))
            .unwrap_or_else(|e| panic!("seed {seed}: put {key} failed: {}", status(&e)));
            let got = tokio::time::timeout(
                CALL_TIMEOUT,
                kv.range(RangeRequest {
                    key: key.clone().into_bytes(),
                    ..Default::default()
                }),
            )
            .await
            .unwrap_or_else(|_| panic!("seed {seed}: get {key}: no answer within {CALL_TIMEOUT:?}"))
            .unwrap_or_else(|e| panic!("seed {seed}: get {key} failed: {}", status(&e)))
            .into_inner();
            assert_eq!(
                got.kvs.len(),
                1,
                "seed {seed}: {key} not readable after its put"
            );
        }
        let m = proxy.metrics().await;
        assert_eq!(
            metrics::active_endpoint(&m).as_deref(),
            Some(cluster.endpoint(0).as_str()),
            "seed {seed}: the live endpoint serves"
        );
        assert_eq!(
            metrics::failovers(&m),
            0.0,
            "seed {seed}: the live endpoint was chosen at start, not failed over to"
        );
    }
}
