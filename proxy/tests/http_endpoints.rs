//! The HTTP side of the proxy's one port: `/health` says whether a linearizable read through
//! the proxy works, and `/metrics` counts gRPC calls and shows the upstreams.

mod support;

use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::{PutRequest, RangeRequest};
use support::grpc::channel;
use support::metrics;
use testkit::wait_for;

const TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_true_and_metrics_count_calls_and_show_the_upstream() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let (code, body) = proxy.health().await.expect("GET /health");
    assert_eq!(
        (code, body.trim()),
        (200, r#"{"health":"true","reason":""}"#)
    );

    let mut kv = KvClient::new(channel(&proxy.addr()).await);
    kv.put(PutRequest {
        key: b"m".to_vec(),
        value: b"1".to_vec(),
        ..Default::default()
    })
    .await
    .expect("put");
    for _ in 0..3 {
        kv.range(RangeRequest {
            key: b"m".to_vec(),
            ..Default::default()
        })
        .await
        .expect("range");
    }

    let text = proxy.metrics().await;
    let labels = |method: &'static str| {
        vec![
            ("grpc_type", "unary"),
            ("grpc_service", "etcdserverpb.KV"),
            ("grpc_method", method),
        ]
    };
    let started = metrics::value(&text, "grpc_server_started_total", &labels("Range"));
    assert!(
        started.is_some_and(|v| v >= 3.0),
        "Range calls started: {started:?} in\n{text}"
    );
    let mut ok = labels("Range");
    ok.push(("grpc_code", "OK"));
    let handled = metrics::value(&text, "grpc_server_handled_total", &ok);
    assert!(
        handled.is_some_and(|v| v >= 3.0),
        "Range calls handled OK: {handled:?} in\n{text}"
    );
    let mut put_ok = labels("Put");
    put_ok.push(("grpc_code", "OK"));
    let puts = metrics::value(&text, "grpc_server_handled_total", &put_ok);
    assert!(
        puts.is_some_and(|v| v >= 1.0),
        "Put calls handled OK: {puts:?} in\n{text}"
    );
    assert_eq!(
        metrics::active_endpoint(&text).as_deref(),
        Some(etcd.endpoint(0).as_str()),
        "{text}"
    );
    assert_eq!(
        metrics::upstream_up(&text, &etcd.endpoint(0)),
        Some(true),
        "{text}"
    );
    assert_eq!(metrics::failovers(&text), 0.0, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_503_while_no_endpoint_works_and_200_again_after() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let mut etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    etcd.kill(0);
    let body = wait_for("/health to answer 503", TIMEOUT, || async {
        match proxy.health().await {
            Ok((503, body)) => Ok(body),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(body.contains(r#""health":"false""#), "{body}");

    etcd.restart(0)
        .await
        .unwrap_or_else(|e| panic!("restart etcd: {e}"));
    wait_for("/health to answer 200 again", TIMEOUT, || async {
        match proxy.health().await {
            Ok((200, body)) if body.contains(r#""health":"true""#) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}
