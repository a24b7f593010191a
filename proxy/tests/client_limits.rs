//! `--max-client-connections` and `--max-client-calls` against the real binary: past either bound the newcomer is
//! refused at once (the connection closed, the call answered `ResourceExhausted` naming the flag), the clients
//! already in are served as before, and a place freed is taken by the next newcomer.

mod support;

use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::{RangeRequest, WatchCreateRequest, WatchRequest, watch_request};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Generous deadline for what the proxy does at once; it only keeps a broken proxy from hanging the test.
const PATIENCE: Duration = Duration::from_secs(10);

async fn eventually<T, F: Future<Output = Option<T>>>(
    what: &str,
    mut attempt: impl FnMut() -> F,
) -> T {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Some(value) = attempt().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what} within {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn metric(text: &str, name: &str) -> f64 {
    support::metrics::value(text, name, &[])
        .unwrap_or_else(|| panic!("{name} not in /metrics:\n{text}"))
}

#[tokio::test]
async fn connections_past_the_limit_are_closed_at_once_and_a_freed_place_is_taken() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &["--max-client-connections=3"]).await;
    let addr = proxy.addr();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut sender = support::net::http2::<http_body_util::Empty<bytes::Bytes>>(&addr).await;
        sender.ready().await.expect("served");
        held.push(sender);
    }
    // A place is freed when the proxy notices its connection end (the start's health checks, each /metrics below),
    // a moment after the client closed it: hence the retries.
    eventually("/metrics counting the two held and its own", || async {
        let (_, text) = testkit::http::get(&addr, "/proxy/metrics").await.ok()?;
        (metric(&text, "etcd_grpc_proxy_client_connections") == 3.0).then_some(())
    })
    .await;
    let channel = eventually("a third connection", || async {
        tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .ok()?
            .connect()
            .await
            .ok()
    })
    .await;
    let mut kv = KvClient::new(channel);
    kv.range(RangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    })
    .await
    .expect("the third connection is served");
    assert!(
        support::net::silent_connection_closed_within(&addr, PATIENCE).await,
        "a fourth connection is closed at once"
    );
    kv.range(RangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    })
    .await
    .expect("the connections already in are still served");
    drop(kv);
    drop(held.pop());
    let metrics = eventually("a freed place serves /metrics", || async {
        testkit::http::get(&addr, "/proxy/metrics").await.ok()
    })
    .await;
    assert!(
        metric(
            &metrics.1,
            "etcd_grpc_proxy_client_connections_refused_total"
        ) >= 1.0
    );
}

#[tokio::test]
async fn calls_past_the_limit_get_resource_exhausted_naming_the_flag() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &["--max-client-calls=2"]).await;
    let channel = support::grpc::channel(&proxy.addr()).await;
    let mut streams = Vec::new();
    for key in ["a", "b"] {
        let (tx, rx) = mpsc::channel(1);
        tx.send(WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: key.into(),
                    ..Default::default()
                },
            )),
        })
        .await
        .unwrap();
        let mut responses = WatchClient::new(channel.clone())
            .watch(ReceiverStream::new(rx))
            .await
            .expect("a watch within the limit")
            .into_inner();
        let created = responses
            .message()
            .await
            .expect("created")
            .expect("created");
        assert!(created.created);
        streams.push((tx, responses));
    }
    let mut kv = KvClient::new(channel.clone());
    let refused = kv
        .range(RangeRequest {
            key: b"k".to_vec(),
            ..Default::default()
        })
        .await
        .expect_err("a third call is refused");
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    assert!(
        refused.message().contains("--max-client-calls=2"),
        "{refused:?}"
    );
    drop(streams.pop());
    eventually("a call in the freed place", || {
        let mut kv = kv.clone();
        async move {
            kv.range(RangeRequest {
                key: b"k".to_vec(),
                ..Default::default()
            })
            .await
            .ok()
        }
    })
    .await;
    let metrics = proxy.metrics().await;
    assert!(metric(&metrics, "etcd_grpc_proxy_client_calls_refused_total") >= 1.0);
}
