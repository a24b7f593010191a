//! `--experimental-enable-grpc-logging`: one line per call when it ends (a stream at its end), with the fields of
//! the Go interceptors (`grpc.service`, `grpc.method`, `grpc.code`, `grpc.time_ms`, `peer.address`), and nothing
//! of the messages: no password of Authenticate or UserAdd, no token, no key, no value ever reaches the log.
//! Without the flag there are no such lines.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use proto::etcdserverpb::auth_client::AuthClient;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::{AuthUserAddRequest, PutRequest, RangeRequest};
use support::grpc::{channel, token, with_meta};
use testkit::wait_for;
use tokio_stream::StreamExt;

const TIMEOUT: Duration = Duration::from_secs(30);
const ROOT_PASSWORD: &str = "root-pw-never-logged-4a7c";
const NEW_USER_PASSWORD: &str = "bob-pw-never-logged-91e2";
const KEY: &str = "logged-key-name-never-logged";
const VALUE: &str = "value-never-logged-5d0b";

/// The fields of each call line in `log` (JSON lines as etcd's zap logger writes them), numbers as their text.
fn call_lines(log: &str) -> Vec<HashMap<String, String>> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|line| line.as_object().cloned())
        .filter(|fields| {
            let msg = fields.get("msg").and_then(|m| m.as_str()).unwrap_or("");
            msg.starts_with("finished unary call ") || msg.starts_with("finished streaming call ")
        })
        .map(|fields| {
            fields
                .into_iter()
                .map(|(k, v)| match v {
                    serde_json::Value::String(text) => (k, text),
                    other => (k, other.to_string()),
                })
                .collect()
        })
        .collect()
}

/// The line of the first call of `method` in `log`.
fn line_of(log: &str, method: &str) -> Result<HashMap<String, String>, String> {
    call_lines(log)
        .into_iter()
        .find(|fields| fields.get("grpc.method").map(String::as_str) == Some(method))
        .ok_or_else(|| format!("no line for {method}"))
}

/// As root: adds a user with a password, puts, reads, and watches `KEY` until the watcher is created, then drops
/// the stream (the client cancels it).
async fn calls(addr: &str) {
    let root = token(addr, "root", ROOT_PASSWORD).await;
    let ch = channel(addr).await;
    AuthClient::new(ch.clone())
        .user_add(with_meta(
            AuthUserAddRequest {
                name: "bob".into(),
                password: NEW_USER_PASSWORD.into(),
                ..Default::default()
            },
            "token",
            &root,
        ))
        .await
        .expect("UserAdd");
    let mut kv = KvClient::new(ch.clone());
    kv.put(with_meta(
        PutRequest {
            key: KEY.into(),
            value: VALUE.into(),
            ..Default::default()
        },
        "token",
        &root,
    ))
    .await
    .expect("Put");
    kv.range(with_meta(
        RangeRequest {
            key: KEY.into(),
            ..Default::default()
        },
        "token",
        &root,
    ))
    .await
    .expect("Range");
    let (requests, rx) = tokio::sync::mpsc::channel(1);
    requests
        .send(support::watch::create(KEY, 0))
        .await
        .expect("queue the create request");
    let mut watch = WatchClient::new(ch)
        .watch(with_meta(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            "token",
            &root,
        ))
        .await
        .expect("Watch")
        .into_inner();
    let created = tokio::time::timeout(TIMEOUT, watch.next())
        .await
        .expect("the watcher is created in time")
        .expect("an answer")
        .expect("created");
    assert!(created.created, "{created:?}");
    // Both halves dropped: the client resets the stream (CANCEL).
    drop(requests);
    drop(watch);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_is_one_line_with_method_code_and_duration_and_no_secret() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let root = format!("root:{ROOT_PASSWORD}");
    for args in [&["user", "add", root.as_str()][..], &["auth", "enable"]] {
        etcd.etcdctl(0).ok(args).await;
    }
    let proxy =
        support::proxy::start(&etcd.endpoints(), &["--experimental-enable-grpc-logging"]).await;
    calls(&proxy.addr()).await;

    let log = wait_for("the line of each call", TIMEOUT, || async {
        let log = proxy.log_tail(100_000);
        for method in ["Authenticate", "UserAdd", "Put", "Range", "Watch"] {
            line_of(&log, method)?;
        }
        Ok(log)
    })
    .await;
    for (service, method, code) in [
        ("etcdserverpb.Auth", "Authenticate", "OK"),
        ("etcdserverpb.Auth", "UserAdd", "OK"),
        ("etcdserverpb.KV", "Put", "OK"),
        ("etcdserverpb.KV", "Range", "OK"),
        // The client ended the stream by dropping it.
        ("etcdserverpb.Watch", "Watch", "Canceled"),
    ] {
        let fields = line_of(&log, method).unwrap();
        assert_eq!(fields["grpc.service"], service, "{fields:?}");
        assert_eq!(fields["grpc.code"], code, "{fields:?}");
        // A JSON number, as the Go interceptor writes it.
        let ms: f64 = fields["grpc.time_ms"].parse().unwrap_or(-1.0);
        assert!(ms >= 0.0, "grpc.time_ms of {method}: {fields:?}");
        let peer: std::net::SocketAddr = fields["peer.address"]
            .parse()
            .unwrap_or_else(|e| panic!("peer.address of {method}: {e}: {fields:?}"));
        assert!(peer.ip().is_loopback(), "{fields:?}");
    }
    for line in log.lines().filter(|l| l.contains("\"grpc.time_ms\"")) {
        let fields: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(fields["grpc.time_ms"].is_f64(), "a number: {line}");
    }
    let watch = line_of(&log, "Watch").unwrap();
    assert_eq!(
        watch["msg"], "finished streaming call with code Canceled",
        "{watch:?}"
    );
    let put = line_of(&log, "Put").unwrap();
    assert_eq!(put["msg"], "finished unary call with code OK", "{put:?}");
    assert_eq!(put["level"], "info", "{put:?}");
    assert_eq!(
        call_lines(&log)
            .iter()
            .filter(|fields| fields["grpc.method"] == "Put")
            .count(),
        1,
        "one line per call:\n{log}"
    );

    let root_token = token(&proxy.addr(), "root", ROOT_PASSWORD).await;
    let log = proxy.log_tail(100_000);
    for secret in [
        ROOT_PASSWORD,
        NEW_USER_PASSWORD,
        KEY,
        VALUE,
        root_token.as_str(),
    ] {
        assert!(!log.contains(secret), "{secret:?} is in the log:\n{log}");
    }
}

#[tokio::test]
async fn without_the_flag_calls_are_not_logged() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    support::grpc::put(&channel(&proxy.addr()).await, KEY, VALUE).await;
    // The metrics count a call where the flag would log it: once counted, its line would be written.
    wait_for("the Put counted", TIMEOUT, || async {
        let text = proxy.metrics().await;
        let labels = [
            ("grpc_type", "unary"),
            ("grpc_service", "etcdserverpb.KV"),
            ("grpc_method", "Put"),
            ("grpc_code", "OK"),
        ];
        match support::metrics::value(&text, "grpc_server_handled_total", &labels) {
            Some(n) if n >= 1.0 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let log = proxy.log_tail(100_000);
    assert!(call_lines(&log).is_empty(), "{log}");
    assert!(!log.contains("grpc.method"), "{log}");
}
