//! A rolling upgrade from etcd 3.5.1 to 3.5.30, one member upgraded and two not yet: the proxy began on the upgraded
//! member, whose progress answers mean that every watcher of the stream is synced, and its streams move to a member
//! not yet upgraded, whose progress answers do not (it answers at once, while a watcher resumed there from an older
//! revision is still catching up). Linearizable reads from the range cache reflect every acknowledged write across
//! the move. Runs the two versions it names, whatever `TESTKIT_ETCD_VERSION` says.

mod support;

use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::maintenance_client::MaintenanceClient;
use proto::etcdserverpb::{RangeRequest, StatusRequest, StatusResponse};
use support::metrics;
use testkit::{Version, wait_for};
use tonic::transport::Channel;

const CACHE_ON: &str = "--range-cache-max-bytes=67108864";
/// How often the proxy asks the members it knows for the cluster's members: it starts on the upgraded member
/// alone, and learns the others this way.
const AUTO_SYNC: &str = "--endpoints-auto-sync-interval=1s";
/// A hang guard for setting up, far above what each step takes on loopback.
const SETUP_GUARD: Duration = Duration::from_secs(30);
/// How long reads go on after the proxy has moved to a member not yet upgraded: the cache's watchers resumed there
/// catch up within etcd's 100 ms sync, and a read waits at most 1 s for a copy before going to etcd.
const READS_AFTER_THE_MOVE: Duration = Duration::from_secs(3);

/// The value of `key`, read linearizably.
async fn read(client: &mut KvClient<Channel>, key: &str) -> Vec<u8> {
    let request = RangeRequest {
        key: key.into(),
        ..Default::default()
    };
    let answer = client.range(request).await.expect("range").into_inner();
    answer
        .kvs
        .first()
        .map(|kv| kv.value.to_vec())
        .unwrap_or_default()
}

async fn status_of(cluster: &testkit::EtcdCluster, i: usize) -> StatusResponse {
    let channel = support::grpc::channel(&cluster.addr(i)).await;
    let answer = MaintenanceClient::new(channel)
        .status(StatusRequest {})
        .await;
    answer.expect("status").into_inner()
}

fn cache_hits(text: &str) -> f64 {
    metrics::value(text, "etcd_grpc_proxy_cache_hits_total", &[]).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_reads_from_the_cache_stay_current_when_an_upgrade_moves_the_proxy_to_an_older_member()
 {
    let (Some(old), Some(new)) = (Version::V3_5_1.require(), Version::V3_5_30.require()) else {
        return;
    };
    let mut cluster = support::cluster(&old, 3, &[]).await;
    // A follower is upgraded first: stopping it leaves the others their leader, and it rejoins as a follower, so
    // that hanging it below leaves a leader to acknowledge the write at once.
    let mut followers = Vec::new();
    for i in 0..3 {
        let answer = status_of(&cluster, i).await;
        if answer.leader != answer.header.expect("header").member_id {
            followers.push(i);
        }
    }
    let (upgraded, other) = (followers[0], followers[1]);
    cluster
        .upgrade(upgraded, &new)
        .await
        .unwrap_or_else(|e| panic!("upgrade member {upgraded} to {}: {e}", new.version));
    let answer = status_of(&cluster, upgraded).await;
    assert_eq!(answer.version, "3.5.30");
    assert_ne!(
        answer.leader,
        answer.header.expect("header").member_id,
        "the upgraded member rejoined as a follower"
    );

    let proxy = support::proxy::start(&[cluster.endpoint(upgraded)], &[CACHE_ON, AUTO_SYNC]).await;
    wait_for("the proxy to know every member", SETUP_GUARD, || async {
        let text = proxy.metrics().await;
        let known = (0..3)
            .filter(|&i| metrics::upstream_up(&text, &cluster.endpoint(i)) == Some(true))
            .count();
        if known == 3 { Ok(()) } else { Err(text) }
    })
    .await;
    let mut through = KvClient::new(support::grpc::channel(&proxy.addr()).await);
    let direct = support::grpc::channel(&cluster.addr(other)).await;
    support::grpc::put(&direct, "k", "before").await;
    // The copy of `k`, filled from a read and kept by a watcher on the upgraded member, answers linearizable
    // reads there (etcd 3.5.30's progress answers move it).
    wait_for("a linearizable read from the cache", SETUP_GUARD, || {
        let (mut through, proxy) = (through.clone(), &proxy);
        async move {
            let hits = cache_hits(&proxy.metrics().await);
            assert_eq!(read(&mut through, "k").await, b"before");
            if cache_hits(&proxy.metrics().await) > hits {
                Ok(())
            } else {
                Err(format!("{hits} hits"))
            }
        }
    })
    .await;
    assert_eq!(
        metrics::active_endpoint(&proxy.metrics().await).as_deref(),
        Some(cluster.endpoint(upgraded).as_str())
    );

    // The upgraded member hangs; the write is acknowledged by the two others, and the proxy moves to one of them.
    // The cache's watcher resumes there from before the write: until etcd 3.5.1 has synced it, its progress answer
    // says a revision whose event the watcher has not delivered.
    cluster.pause(upgraded);
    support::grpc::put(&direct, "k", "after").await;
    let failovers_before = metrics::failovers(&proxy.metrics().await);
    let hung_at = tokio::time::Instant::now();
    let mut moved_at = None;
    let mut reads = 0;
    while moved_at.is_none_or(|at: tokio::time::Instant| at.elapsed() < READS_AFTER_THE_MOVE) {
        assert!(
            moved_at.is_some() || hung_at.elapsed() < SETUP_GUARD,
            "the proxy did not move off the hung member"
        );
        assert_eq!(
            String::from_utf8_lossy(&read(&mut through, "k").await),
            "after",
            "read {reads}: a read after the write was acknowledged"
        );
        reads += 1;
        if moved_at.is_none() && metrics::failovers(&proxy.metrics().await) > failovers_before {
            moved_at = Some(tokio::time::Instant::now());
        }
    }
    cluster.resume(upgraded);
}
