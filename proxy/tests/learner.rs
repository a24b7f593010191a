//! A learner among `--endpoints`: etcd refuses it every write and linearizable read ("rpc not supported for
//! learner": Unavailable up to 3.5, FailedPrecondition from 3.6), yet its Status names a leader. The proxy must not
//! serve from it while a voting member with a leader answers: not at start (the learner listed first), and not when
//! the active member dies.

mod support;

use std::sync::Mutex;
use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::maintenance_client::MaintenanceClient;
use proto::etcdserverpb::{MoveLeaderRequest, PutRequest, RangeRequest, StatusRequest};
use support::grpc::{channel, status};
use support::metrics;
use testkit::{EtcdCluster, ProxyProcess, try_wait_for, wait_for};
use tonic::transport::Channel;

/// A hang guard for one call, and the deadline of each wait: far above what anything takes, failovers included.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Puts and reads in a row that must all succeed.
const ROUNDS: usize = 20;
/// etcd's words for what a learner refuses.
const NOT_FOR_LEARNER: &str = "etcdserver: rpc not supported for learner";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_learner_among_the_endpoints_never_serves_while_a_voter_with_a_leader_answers() {
    let Some(etcd) = support::etcd() else { return };
    // Three voters, so that one killed leaves a quorum.
    let mut cluster = support::cluster(&etcd, 3, &[]).await;
    let learner = cluster
        .add_learner(0)
        .await
        .unwrap_or_else(|e| panic!("add a learner: {e}"));
    let voters: Vec<usize> = (0..learner).collect();
    let mut endpoints = vec![cluster.endpoint(learner)];
    endpoints.extend(voters.iter().map(|&i| cluster.endpoint(i)));
    let proxy = support::proxy::start(&endpoints, &[]).await;
    let through = channel(&proxy.addr()).await;

    // At start every member answers Status, the learner with the leader's ID: it must not be chosen.
    for round in 0..ROUNDS {
        let key = format!("/learner/start/{round}");
        put(&through, &key)
            .await
            .unwrap_or_else(|e| panic!("put {key} through the proxy at start: {e}"));
        get(&through, &key)
            .await
            .unwrap_or_else(|e| panic!("linearizable get {key} through the proxy at start: {e}"));
    }
    let active = active_member(&proxy, &cluster).await;
    assert_ne!(active, learner, "the proxy chose the learner at start");

    // The member killed leads: until the others elect a leader, neither has one, while the learner still names
    // the dead one. That is when a choice that believes the learner's Status picks it.
    let victim = lead_with_active(&proxy, &cluster).await;
    cluster.kill(victim);

    // The survivors elect a leader; meanwhile writes may fail as etcd fails them in an election, and are
    // tried again here. A linearizable read the learner refused is the proxy's to repeat elsewhere: it must never
    // reach the client.
    let refused_reads = Mutex::new(Vec::new());
    let served = try_wait_for(CALL_TIMEOUT, || async {
        put(&through, "/learner/after-kill")
            .await
            .map_err(|e| format!("put: {e}"))?;
        let read = get(&through, "/learner/after-kill").await;
        if let Err(e) = &read
            && e.contains(NOT_FOR_LEARNER)
        {
            refused_reads.lock().unwrap().push(e.clone());
        }
        read.map_err(|e| format!("linearizable get: {e}"))
    })
    .await;
    let seen = proxy.metrics().await;
    if let Err(last) = served {
        panic!(
            "nothing served through the proxy within {CALL_TIMEOUT:?} of killing member {victim}: {last}; \
             active: {:?}",
            metrics::active_endpoint(&seen)
        );
    }
    let refused_reads = refused_reads.into_inner().unwrap();
    assert!(
        refused_reads.is_empty(),
        "linearizable reads reached the client with the learner's refusal: {refused_reads:?}"
    );

    for round in 0..ROUNDS {
        let key = format!("/learner/after-kill/{round}");
        put(&through, &key)
            .await
            .unwrap_or_else(|e| panic!("put {key} through the proxy after the kill: {e}"));
        get(&through, &key)
            .await
            .unwrap_or_else(|e| panic!("linearizable get {key} after the kill: {e}"));
    }
    let active = active_member(&proxy, &cluster).await;
    assert!(
        voters.contains(&active) && active != victim,
        "the proxy serves from member {active} (the learner is {learner}, the killed member {victim})"
    );
}

/// Index of the member /metrics names active.
async fn active_member(proxy: &ProxyProcess, cluster: &EtcdCluster) -> usize {
    wait_for("one active endpoint in /metrics", CALL_TIMEOUT, || async {
        let text = proxy.metrics().await;
        let active = metrics::active_endpoint(&text).ok_or("no single active endpoint")?;
        (0..cluster.len())
            .find(|&i| cluster.endpoint(i) == active)
            .ok_or(format!("active endpoint {active} is no member"))
    })
    .await
}

/// Makes the member the proxy uses the raft leader, and returns it. Moving leadership makes the members leaderless
/// for a moment, which may move the proxy: then the member it moved to is made leader in turn.
async fn lead_with_active(proxy: &ProxyProcess, cluster: &EtcdCluster) -> usize {
    wait_for(
        "the proxy's active member to lead",
        CALL_TIMEOUT,
        || async {
            let active = active_member(proxy, cluster).await;
            place_leader(cluster, active).await?;
            let now = active_member(proxy, cluster).await;
            if now == active {
                Ok(active)
            } else {
                Err(format!("the proxy moved from member {active} to {now}"))
            }
        },
    )
    .await
}

/// Moves raft leadership to voting member `target` (unless it leads) and waits until every voting member agrees.
async fn place_leader(cluster: &EtcdCluster, target: usize) -> Result<(), String> {
    let (ids, leader) = voters_and_leader(cluster).await?;
    let Some(from) = ids.iter().position(|&id| id == leader) else {
        return Err(format!("the leader {leader:x} is no voting member"));
    };
    if from != target {
        MaintenanceClient::new(channel(&cluster.endpoint(from)).await)
            .move_leader(MoveLeaderRequest {
                target_id: ids[target],
            })
            .await
            .map_err(|e| format!("move the leader to member {target}: {}", status(&e)))?;
    }
    try_wait_for(CALL_TIMEOUT, || async {
        match voters_and_leader(cluster).await? {
            (_, leader) if leader == ids[target] => Ok(()),
            (_, leader) => Err(format!("the leader is {leader:x}")),
        }
    })
    .await
}

/// The member ID of each voting member (the members before the learner, the last one), and the leader they agree
/// on.
async fn voters_and_leader(cluster: &EtcdCluster) -> Result<(Vec<u64>, u64), String> {
    let (mut ids, mut leaders) = (Vec::new(), Vec::new());
    for i in 0..cluster.len() - 1 {
        let answer = MaintenanceClient::new(channel(&cluster.endpoint(i)).await)
            .status(StatusRequest {})
            .await
            .map_err(|e| format!("Status of member {i}: {}", status(&e)))?
            .into_inner();
        ids.push(answer.header.map_or(0, |h| h.member_id));
        leaders.push(answer.leader);
    }
    match leaders.as_slice() {
        [first, rest @ ..] if *first != 0 && rest.iter().all(|l| l == first) => Ok((ids, *first)),
        _ => Err(format!(
            "the voting members disagree on the leader: {leaders:?}"
        )),
    }
}

async fn put(through: &Channel, key: &str) -> Result<(), String> {
    let request = PutRequest {
        key: key.into(),
        value: key.into(),
        ..Default::default()
    };
    match tokio::time::timeout(CALL_TIMEOUT, KvClient::new(through.clone()).put(request)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(status(&e)),
        Err(_) => Err(format!("no answer within {CALL_TIMEOUT:?}")),
    }
}

/// A linearizable get of `key`, which must find the value [`put`] gave it.
async fn get(through: &Channel, key: &str) -> Result<(), String> {
    let request = RangeRequest {
        key: key.into(),
        ..Default::default()
    };
    let answer =
        tokio::time::timeout(CALL_TIMEOUT, KvClient::new(through.clone()).range(request)).await;
    match answer {
        Ok(Ok(found)) => match found.into_inner().kvs.as_slice() {
            [kv] if kv.value == key.as_bytes() => Ok(()),
            other => Err(format!("{key} read as {other:?}")),
        },
        Ok(Err(e)) => Err(status(&e)),
        Err(_) => Err(format!("no answer within {CALL_TIMEOUT:?}")),
    }
}
