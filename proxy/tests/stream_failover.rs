//! Watch and keep-alive streams across a failover, against a real 3-member etcd cluster: when the member serving
//! the proxy dies, a watcher sees every event exactly once and in order, and a lease kept alive through the proxy
//! never expires, while the client's streams see no error.

mod support;

use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{
    LeaseGrantRequest, LeaseKeepAliveRequest, LeaseTimeToLiveRequest, PutRequest,
    WatchCreateRequest, WatchRequest,
};
use support::grpc::channel;
use support::metrics;
use testkit::{EtcdCluster, ProxyProcess, wait_for};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

const DEADLINE: Duration = Duration::from_secs(60);
const PUTS_BEFORE: usize = 20;
const PUTS_AFTER: usize = 40;

/// Puts `key` until etcd accepts it (a write may fail while the cluster elects a new leader).
async fn put_until_accepted(channel: &Channel, key: &str, value: String) -> i64 {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let request = PutRequest {
            key: key.into(),
            value: value.clone().into(),
            ..Default::default()
        };
        match KvClient::new(channel.clone()).put(request).await {
            Ok(response) => return response.into_inner().header.unwrap().revision,
            Err(status) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "put never accepted: {status:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Index of the member the proxy uses now.
async fn active_member(proxy: &ProxyProcess, etcd: &EtcdCluster) -> usize {
    let active = metrics::active_endpoint(&proxy.metrics().await).expect("an active endpoint");
    (0..etcd.len())
        .find(|&i| etcd.endpoint(i) == active)
        .expect("active endpoint is a member")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchers_and_keepalives_survive_the_death_of_the_active_member() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let mut etcd = support::cluster(&binaries, 3, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let through_proxy = channel(&proxy.addr()).await;
    let active = active_member(&proxy, &etcd).await;
    let writer = channel(&etcd.endpoint((active + 1) % 3)).await;

    // A watcher through the proxy, on a prefix.
    let (watch_tx, watch_rx) = mpsc::channel(4);
    let create = WatchCreateRequest {
        key: b"f/".to_vec(),
        range_end: b"f0".to_vec(),
        ..Default::default()
    };
    watch_tx
        .send(WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(create)),
        })
        .await
        .unwrap();
    let mut watch = WatchClient::new(through_proxy.clone())
        .watch(ReceiverStream::new(watch_rx))
        .await
        .unwrap()
        .into_inner();
    let created = watch.next().await.unwrap().unwrap();
    assert!(created.created);

    // A lease kept alive through the proxy on one long-lived stream, one request a second.
    let ttl = 4;
    let lease = LeaseClient::new(through_proxy.clone())
        .lease_grant(LeaseGrantRequest { ttl, id: 0 })
        .await
        .unwrap()
        .into_inner()
        .id;
    let (keep_tx, keep_rx) = mpsc::channel(4);
    keep_tx
        .send(LeaseKeepAliveRequest { id: lease })
        .await
        .unwrap();
    let mut answers = LeaseClient::new(through_proxy.clone())
        .lease_keep_alive(ReceiverStream::new(keep_rx))
        .await
        .unwrap()
        .into_inner();
    let answered_total = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = answered_total.clone();
    let keeper = tokio::spawn(async move {
        let mut answered = 0;
        loop {
            match tokio::time::timeout(DEADLINE, answers.next()).await {
                Ok(Some(Ok(answer))) => {
                    assert_eq!(
                        answer.ttl, ttl,
                        "answer {answered}: the lease must never run out"
                    );
                    answered += 1;
                    counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                Ok(Some(Err(status))) => {
                    panic!("keep-alive stream failed after {answered} answers: {status:?}")
                }
                Ok(None) => return answered,
                Err(_) => panic!("no keep-alive answer within {DEADLINE:?}"),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            if keep_tx
                .send(LeaseKeepAliveRequest { id: lease })
                .await
                .is_err()
            {
                return answered;
            }
        }
    });

    let mut revisions = Vec::new();
    for i in 0..PUTS_BEFORE {
        revisions.push(put_until_accepted(&writer, &format!("f/{i}"), format!("v{i}")).await);
    }
    etcd.kill(active);
    let answered_at_kill = answered_total.load(std::sync::atomic::Ordering::SeqCst);
    for i in PUTS_BEFORE..PUTS_BEFORE + PUTS_AFTER {
        revisions.push(put_until_accepted(&writer, &format!("f/{i}"), format!("v{i}")).await);
    }

    let mut seen = Vec::new();
    while seen.len() < revisions.len() {
        let response = tokio::time::timeout(DEADLINE, watch.next())
            .await
            .expect("events keep coming")
            .expect("stream open")
            .unwrap_or_else(|s| {
                panic!("the watch stream failed: {s:?} after {} events", seen.len())
            });
        assert!(!response.canceled, "{response:?}");
        seen.extend(
            response
                .events
                .iter()
                .map(|e| e.kv.as_ref().unwrap().mod_revision),
        );
    }
    assert_eq!(seen, revisions, "every event exactly once, in order");
    let text = proxy.metrics().await;
    assert!(metrics::failovers(&text) >= 1.0, "{text}");
    assert_ne!(active_member(&proxy, &etcd).await, active);

    // The keeper goes on for twice the TTL past the kill without an error or a short TTL...
    wait_for(
        "keep-alive answers for twice the TTL after the kill",
        DEADLINE,
        || async {
            if keeper.is_finished() {
                return Ok(());
            }
            let answered = answered_total.load(std::sync::atomic::Ordering::SeqCst);
            if answered >= answered_at_kill + 2 * ttl as usize {
                Ok(())
            } else {
                Err(format!("{answered} answers"))
            }
        },
    )
    .await;
    assert!(
        !keeper.is_finished(),
        "the keep-alive stream ended: {:?}",
        keeper.await
    );
    // ...and etcd still has the lease.
    wait_for("the lease to be alive on etcd", DEADLINE, || async {
        let ttl_left = LeaseClient::new(writer.clone())
            .lease_time_to_live(LeaseTimeToLiveRequest {
                id: lease,
                keys: false,
            })
            .await
            .map_err(|s| format!("{s:?}"))?
            .into_inner()
            .ttl;
        if ttl_left > 0 {
            Ok(())
        } else {
            Err(format!("lease ttl {ttl_left}"))
        }
    })
    .await;
    keeper.abort();
    let _ = keeper.await.map_err(|e| {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic())
        }
    });
}
