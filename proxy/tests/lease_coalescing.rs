//! Lease keep-alive coalescing against real etcd: many client keep-alive streams through one proxy become one
//! upstream stream on etcd, every request is answered, and a lease whose client stops expires within its TTL.

mod support;

use std::time::Duration;

use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest, LeaseTimeToLiveRequest};
use support::grpc::channel;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// etcd's own count of LeaseKeepAlive streams it has started (from its /metrics).
async fn etcd_keepalive_streams_started(etcd: &str) -> u64 {
    let (_, body) = testkit::http::get(etcd, "/metrics")
        .await
        .expect("etcd /metrics");
    body.lines()
        .filter(|l| {
            l.starts_with("grpc_server_started_total")
                && l.contains("grpc_method=\"LeaseKeepAlive\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// The value of an unlabelled metric in Prometheus text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' '))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("metric {name} missing in:\n{text}"))
}

/// Sends `rounds` keep-alives for `id` on one stream, half-closes, and returns every answer until the end.
async fn keep_alive_rounds(
    channel: Channel,
    id: i64,
    rounds: usize,
) -> Result<Vec<(i64, i64)>, tonic::Status> {
    let (tx, rx) = mpsc::channel(rounds);
    for _ in 0..rounds {
        tx.send(LeaseKeepAliveRequest { id }).await.unwrap();
    }
    drop(tx);
    let mut answers = LeaseClient::new(channel)
        .lease_keep_alive(ReceiverStream::new(rx))
        .await?
        .into_inner();
    let mut seen = Vec::new();
    while let Some(answer) = answers.next().await {
        let answer = answer?;
        seen.push((answer.id, answer.ttl));
    }
    Ok(seen)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_client_streams_make_one_upstream_stream_and_all_get_answers() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    const STREAMS: usize = 200;
    const ROUNDS: usize = 3;
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let before = etcd_keepalive_streams_started(&etcd.endpoint(0)).await;

    let through_proxy = channel(&proxy.addr()).await;
    let mut tasks = Vec::new();
    for _ in 0..STREAMS {
        let lease = LeaseClient::new(through_proxy.clone())
            .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
            .await
            .unwrap()
            .into_inner();
        let channel = through_proxy.clone();
        tasks.push(tokio::spawn(async move {
            (lease.id, keep_alive_rounds(channel, lease.id, ROUNDS).await)
        }));
    }
    for task in tasks {
        let (id, answers) = task.await.unwrap();
        let answers = answers.unwrap_or_else(|s| panic!("lease {id:x}: stream failed: {s:?}"));
        assert_eq!(
            answers,
            vec![(id, 60); ROUNDS],
            "lease {id:x}: one answer per request, then a clean end after the half-close"
        );
    }

    let after = etcd_keepalive_streams_started(&etcd.endpoint(0)).await;
    assert!(
        after - before <= 1,
        "etcd started {} LeaseKeepAlive streams for {STREAMS} client streams",
        after - before
    );
    let metrics = proxy.metrics().await;
    let forwarded = metric(&metrics, "etcd_grpc_proxy_lease_renewals_forwarded_total");
    let shared = metric(&metrics, "etcd_grpc_proxy_lease_renewals_shared_total");
    assert_eq!(
        forwarded + shared,
        (STREAMS * ROUNDS) as f64,
        "every request was either forwarded or shared a renewal"
    );
    assert_eq!(
        metric(&metrics, "etcd_grpc_proxy_lease_keepalive_upstream_streams"),
        1.0
    );
    assert_eq!(
        metric(&metrics, "etcd_grpc_proxy_lease_keepalive_client_streams"),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_client_stops_expires_within_its_ttl() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    const TTL: i64 = 3;
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let through_proxy = channel(&proxy.addr()).await;
    let direct = channel(&etcd.endpoint(0)).await;
    let lease = LeaseClient::new(through_proxy.clone())
        .lease_grant(LeaseGrantRequest { ttl: TTL, id: 0 })
        .await
        .unwrap()
        .into_inner();

    // Keep it alive past its TTL through the proxy, as a client renewing every second would.
    let mut last_answer = Instant::now();
    for _ in 0..(TTL + 2) {
        let answers = keep_alive_rounds(through_proxy.clone(), lease.id, 1)
            .await
            .unwrap();
        assert_eq!(answers, vec![(lease.id, TTL)]);
        last_answer = Instant::now();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    // Then stop: etcd must drop the lease within TTL of the last renewal (plus etcd's own expiry tick).
    let gone_by = last_answer + Duration::from_secs(TTL as u64) + Duration::from_millis(1500);
    loop {
        let ttl = LeaseClient::new(direct.clone())
            .lease_time_to_live(LeaseTimeToLiveRequest {
                id: lease.id,
                keys: false,
            })
            .await
            .unwrap()
            .into_inner()
            .ttl;
        if ttl == -1 {
            break;
        }
        assert!(
            Instant::now() < gone_by,
            "lease still alive (ttl {ttl}) more than its TTL after the client stopped: the proxy kept renewing it"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // An expired lease answers TTL 0, as etcd does (not -1 like etcd's Go proxy).
    let answers = keep_alive_rounds(through_proxy, lease.id, 1).await.unwrap();
    assert_eq!(answers, vec![(lease.id, 0)]);
}
