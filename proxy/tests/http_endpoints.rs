//! The HTTP side of the proxy's one port: `/health` says whether a linearizable read through the proxy works,
//! `/proxy/health` whether the proxy serves a client that connects to it, `/proxy/metrics` counts gRPC calls and
//! shows the upstreams, and `/metrics` is etcd's own, relayed from the active member.

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

/// The `etcd_server_id` etcd's `/metrics` text names (each member's own ID, hex).
fn server_id(metrics_text: &str) -> Option<String> {
    metrics_text
        .lines()
        .find_map(|line| line.strip_prefix("etcd_server_id{server_id=\""))
        .and_then(|rest| rest.split('"').next())
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_etcds_from_the_active_member_and_follow_a_failover() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let mut etcd = support::cluster(&binaries, 3, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let mut ids = Vec::new();
    for member in 0..3 {
        let (_, text) = testkit::http::get(&etcd.addr(member), "/metrics")
            .await
            .expect("etcd's /metrics");
        ids.push(server_id(&text).expect("etcd_server_id in etcd's /metrics"));
    }
    let relayed = || async {
        let (code, text) = testkit::http::get(&proxy.addr(), "/metrics")
            .await
            .map_err(|e| e.to_string())?;
        if code != 200 {
            return Err(format!("{code}: {text}"));
        }
        server_id(&text).ok_or(format!("no etcd_server_id in\n{text}"))
    };
    let endpoints = etcd.endpoints();
    let active = |text: &str| {
        let endpoint = metrics::active_endpoint(text).expect("one active endpoint");
        (0..3)
            .find(|&m| endpoints[m] == endpoint)
            .expect("an endpoint of the cluster")
    };
    let first = active(&proxy.metrics().await);
    assert_eq!(relayed().await.expect("relayed"), ids[first]);

    etcd.kill(first);
    let next = wait_for("the proxy to fail over", TIMEOUT, || async {
        match active(&proxy.metrics().await) {
            m if m == first => Err("still on the killed member".to_string()),
            m => Ok(m),
        }
    })
    .await;
    assert_eq!(
        relayed().await.expect("relayed after the failover"),
        ids[next],
        "from the member now active"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_health_checks_the_proxy_through_its_own_listener() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let mut etcd = support::cluster(&binaries, 1, &[]).await;
    // Room for one held connection and the GET that asks: none for the check's own connection to the listener.
    let proxy = support::proxy::start(&etcd.endpoints(), &["--max-client-connections=2"]).await;
    let held = support::grpc::channel(&proxy.addr()).await;
    KvClient::new(held.clone())
        .range(RangeRequest {
            key: b"a".to_vec(),
            ..Default::default()
        })
        .await
        .expect("the held connection is served");
    let (code, body) = testkit::http::get(&proxy.addr(), "/health")
        .await
        .expect("GET /health");
    assert_eq!(
        (code, body.trim()),
        (200, r#"{"health":"true","reason":""}"#)
    );
    let (code, body) = testkit::http::get(&proxy.addr(), "/proxy/health")
        .await
        .expect("GET /proxy/health");
    assert_eq!(code, 503, "the listener takes no new client: {body}");
    assert!(body.contains(r#""health":"false""#), "{body}");

    drop(held);
    wait_for(
        "/proxy/health to pass once a place is free",
        TIMEOUT,
        || async {
            match testkit::http::get(&proxy.addr(), "/proxy/health").await {
                Ok((200, body)) if body.contains(r#""health":"true""#) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;

    etcd.kill(0);
    let body = wait_for("/proxy/health to fail without etcd", TIMEOUT, || async {
        match testkit::http::get(&proxy.addr(), "/proxy/health").await {
            Ok((503, body)) => Ok(body),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert!(body.contains("GET ERROR:"), "{body}");
}
