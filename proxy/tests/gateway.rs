//! etcd's JSON gateway through the proxy, against real etcd: gateway watchers and keep-alives are coalesced as gRPC
//! ones are (etcd's own metrics count them), calls are namespaced, counted under their gRPC method and authorized
//! by the token in `Authorization`, and errors read exactly as the etcd behind writes them.

mod support;

use serde_json::{Value, json};
use support::gateway::{JsonLines, b64, post, post_raw};

/// etcd's gauge of its watchers.
async fn etcd_watchers(etcd: &str) -> i64 {
    etcd_metric(etcd, |l| {
        l.starts_with("etcd_debugging_mvcc_watcher_total ")
    })
    .await as i64
}

/// etcd's count of LeaseKeepAlive streams it has started.
async fn etcd_keepalive_streams(etcd: &str) -> i64 {
    etcd_metric(etcd, |l| {
        l.starts_with("grpc_server_started_total") && l.contains("grpc_method=\"LeaseKeepAlive\"")
    })
    .await as i64
}

async fn etcd_metric(etcd: &str, wanted: impl Fn(&str) -> bool) -> f64 {
    let (_, body) = testkit::http::get(etcd, "/metrics")
        .await
        .expect("etcd /metrics");
    body.lines()
        .filter(|l| wanted(l))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn text(value: &Value) -> &str {
    value
        .as_str()
        .unwrap_or_else(|| panic!("not a string: {value}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_gateway_watchers_of_one_key_are_one_watcher_on_etcd_and_all_see_the_put() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    const CONNECTIONS: usize = 10;
    const PER_CONNECTION: usize = 100;
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let before = etcd_watchers(&etcd.addr(0)).await;

    let create = json!({"create_request": {"key": b64("hot")}});
    let mut watchers = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut connection = support::net::http2(&proxy.addr()).await;
        for _ in 0..PER_CONNECTION {
            watchers.push(JsonLines::open(&mut connection, "/v3/watch", &create).await);
        }
    }
    for watcher in &mut watchers {
        let created = watcher.next().await;
        assert_eq!(created["result"]["created"], true, "{created}");
    }
    testkit::wait_for(
        "etcd to hold only the proxy's watcher",
        support::gateway::DEADLINE,
        || async {
            match etcd_watchers(&etcd.addr(0)).await - before {
                0 | 1 => Ok(()),
                more => Err(format!("{more} watchers on etcd")),
            }
        },
    )
    .await;

    let (status, put) = post(
        &etcd.addr(0),
        "/v3/kv/put",
        &json!({"key": b64("hot"), "value": b64("v")}),
        None,
    )
    .await;
    assert_eq!(status, 200, "{put}");
    let revision = text(&put["header"]["revision"]).to_string();
    for watcher in &mut watchers {
        let event = watcher.next().await;
        let kv = &event["result"]["events"][0]["kv"];
        assert_eq!(text(&kv["key"]), b64("hot"), "{event}");
        assert_eq!(text(&kv["mod_revision"]), revision, "{event}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_keep_alives_of_many_clients_are_one_stream_on_etcd() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    const CLIENTS: usize = 20;
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let (status, grant) = post(
        &proxy.addr(),
        "/v3/lease/grant",
        &json!({"TTL": "60"}),
        None,
    )
    .await;
    assert_eq!(status, 200, "{grant}");
    let id = text(&grant["ID"]).to_string();
    let before = etcd_keepalive_streams(&etcd.addr(0)).await;

    let mut connection = support::net::http2(&proxy.addr()).await;
    for _ in 0..CLIENTS {
        // As on etcd, the answer stream ends after the request body has ended and its requests are answered.
        let mut renewal =
            JsonLines::open(&mut connection, "/v3/lease/keepalive", &json!({"ID": id})).await;
        let renewed = renewal.next().await;
        assert_eq!(text(&renewed["result"]["ID"]), id, "{renewed}");
        assert_eq!(text(&renewed["result"]["TTL"]), "60", "{renewed}");
    }
    let started = etcd_keepalive_streams(&etcd.addr(0)).await - before;
    assert!(
        started <= 1,
        "etcd started {started} LeaseKeepAlive streams for {CLIENTS} gateway clients"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_calls_are_namespaced_counted_under_their_grpc_method_and_not_on_the_metrics_port()
{
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let metrics_addr = format!("127.0.0.1:{}", testkit::free_port());
    let proxy = support::proxy::start(
        &etcd.endpoints(),
        &[
            "--namespace=/tenant/",
            &format!("--metrics-addr=http://{metrics_addr}"),
        ],
    )
    .await;

    let put = json!({"key": b64("k"), "value": b64("v")});
    let (status, answer) = post(&proxy.addr(), "/v3/kv/put", &put, None).await;
    assert_eq!(status, 200, "{answer}");

    let (_, direct) = post(
        &etcd.addr(0),
        "/v3/kv/range",
        &json!({"key": b64("/tenant/k")}),
        None,
    )
    .await;
    assert_eq!(text(&direct["kvs"][0]["value"]), b64("v"), "{direct}");
    let (_, through) = post(
        &proxy.addr(),
        "/v3beta/kv/range",
        &json!({"key": b64("k")}),
        None,
    )
    .await;
    assert_eq!(text(&through["kvs"][0]["key"]), b64("k"), "{through}");

    let (_, metrics) = testkit::http::get(&proxy.addr(), "/proxy/metrics")
        .await
        .expect("/proxy/metrics");
    let puts = support::metrics::value(
        &metrics,
        "grpc_server_handled_total",
        &[
            ("grpc_type", "unary"),
            ("grpc_service", "etcdserverpb.KV"),
            ("grpc_method", "Put"),
            ("grpc_code", "OK"),
        ],
    );
    assert_eq!(
        puts,
        Some(1.0),
        "gateway Put counted as etcdserverpb.KV/Put"
    );

    // Not on --metrics-addr: etcd serves its gateway on its client port only.
    let (status, answer) = post(&metrics_addr, "/v3/kv/range", &json!({}), None).await;
    assert_eq!((status, answer), (404, json!("404 page not found\n")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_errors_and_auth_read_as_the_etcd_behind_writes_them() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let (direct, through) = (etcd.addr(0), proxy.addr());

    // Errors: etcd's own, a body cut short, and a wrong type, each in the version's form with its status.
    // Errors on every version, then paths that differ by version: HashKV's own (3.5.10 on), AuthStatus and
    // Downgrade (3.5 on).
    let errors = [
        ("/v3/lease/revoke", json!({"ID": "99"})),
        ("/v3/kv/range", json!({"key": b64("k"), "revision": "1000"})),
        ("/v3/kv/range", json!({})),
        ("/v3/kv/nope", json!({})),
    ];
    let by_version = [
        ("/v3/maintenance/hashkv", json!({"revision": "1000"})),
        ("/v3/auth/status", json!({"nope": 1})),
        ("/v3/maintenance/downgrade", json!({"action": "VALIDATE"})),
    ];
    for (path, body) in errors.iter().chain(&by_version) {
        let want = post(&direct, path, body, None).await;
        if errors.iter().any(|(error_path, _)| error_path == path) {
            assert_ne!(want.0, 200, "{path} {body}: an error on etcd");
        }
        assert_eq!(
            post(&through, path, body, None).await,
            want,
            "{path} {body}"
        );
    }

    // Bodies that are not their request's JSON: etcd's code and HTTP status; the message is the JSON parser's, whose
    // wording differs from Go's (testdata/gateway/differences.txt), except where it is etcd's own.
    for body in ["hello", "[]", r#"{"key":5}"#, r#"{"key":"!!"}"#] {
        let want = post_raw(&direct, "/v3/kv/range", body, None).await;
        let got = post_raw(&through, "/v3/kv/range", body, None).await;
        assert_eq!(want.0, 400, "{body}: refused by etcd: {}", want.1);
        assert_eq!(
            (got.0, &got.1["code"]),
            (want.0, &want.1["code"]),
            "{body}: {}",
            got.1
        );
    }
    // Bodies read as etcd reads them: cut short, an unknown field, trailing text, none, a number for an int64.
    for body in [
        r#"{"key":"#,
        r#"{"key":"aw==","bogus":1}"#,
        r#"{"key":"aw=="} trailing"#,
        "",
        r#"{"key":"aw==","limit":2}"#,
    ] {
        let want = post_raw(&direct, "/v3/kv/range", body, None).await;
        let got = post_raw(&through, "/v3/kv/range", body, None).await;
        assert_eq!(got, want, "{body}");
    }

    // Auth: the token from Authenticate, sent in `Authorization`, is what etcd checks.
    for (path, body) in [
        (
            "/v3/auth/user/add",
            json!({"name": "root", "password": "pw"}),
        ),
        (
            "/v3/auth/user/grant",
            json!({"user": "root", "role": "root"}),
        ),
        ("/v3/auth/enable", json!({})),
    ] {
        let (status, answer) = post(&direct, path, &body, None).await;
        assert_eq!(status, 200, "{path}: {answer}");
    }
    let (status, login) = post(
        &through,
        "/v3/auth/authenticate",
        &json!({"name": "root", "password": "pw"}),
        None,
    )
    .await;
    assert_eq!(status, 200, "{login}");
    let token = text(&login["token"]).to_string();
    let range = json!({"key": b64("k")});
    let (status, answer) = post(&through, "/v3/kv/range", &range, Some(&token)).await;
    assert_eq!(status, 200, "with the token: {answer}");
    let without = post(&through, "/v3/kv/range", &range, None).await;
    assert_eq!(without, post(&direct, "/v3/kv/range", &range, None).await);
    assert_ne!(without.0, 200, "without a token: {}", without.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_gateway_bodies_are_refused_and_the_proxy_keeps_serving() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &["--max-send-bytes=1024"]).await;
    let addr = proxy.addr();

    // A Txn nested 100,000 deep as JSON: refused by the JSON reader's depth bound, never a crash.
    let deep = format!(
        "{}{}",
        r#"{"success":[{"request_txn":"#.repeat(100_000),
        "}]}".repeat(100_000)
    );
    let (status, answer) = post_raw(&addr, "/v3/kv/txn", deep, None).await;
    assert_eq!(status, 400, "{answer}");
    // More JSON than 4 × --max-send-bytes: refused unread.
    let big = json!({"key": b64("k"), "value": "A".repeat(8 * 1024)});
    let (status, answer) = post(&addr, "/v3/kv/put", &big, None).await;
    assert_eq!(status, 400, "{answer}");
    // Within the JSON bound but over --max-send-bytes once encoded: etcd's own size refusal.
    let over = json!({"key": b64("k"), "value": b64(&"v".repeat(2000))});
    let (status, answer) = post(&addr, "/v3/kv/put", &over, None).await;
    assert_eq!((status, &answer["code"]), (429, &json!(8)), "{answer}");

    let (status, answer) = post(&addr, "/v3/kv/put", &json!({"key": b64("k")}), None).await;
    assert_eq!(status, 200, "still serving: {answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_shutdown_a_gateway_watch_ends_with_unavailable_and_the_proxy_exits() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let mut proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let mut connection = support::net::http2(&proxy.addr()).await;
    let create = json!({"create_request": {"key": b64("k")}});
    let mut watch = JsonLines::open(&mut connection, "/v3/watch", &create).await;
    assert_eq!(watch.next().await["result"]["created"], true);

    proxy.terminate();
    let last = watch.last().await;
    // The form of the etcd behind: `grpc_code` for etcd 3.4 and 3.5.1, `code` from 3.5.30.
    let code = last["error"].get("code").or(last["error"].get("grpc_code"));
    assert_eq!(code, Some(&json!(14)), "Unavailable: {last}");
    support::proxy::wait_exited(&mut proxy, support::gateway::DEADLINE).await;
}
