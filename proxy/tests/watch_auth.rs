//! Watches under etcd auth. Without `--user`, upstream watch streams are shared only between callers with the
//! same token, so a caller's watch never depends on another caller's token staying valid (the Go proxy's shared
//! stream fails once the token of whoever opened it expires). With `--user`, the proxy holds the upstream streams
//! with its own token, renews it when etcd refuses it, and admits each caller's watcher by a check of the
//! caller's own token.

mod support;

use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{
    PutRequest, RangeRequest, WatchCreateRequest, WatchRequest, WatchResponse,
};
use support::grpc::{channel, token, with_meta};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

const DEADLINE: Duration = Duration::from_secs(30);

/// Opens a Watch stream with `token` (none if empty) and creates one watcher on `key`; returns the stream and the
/// create answer.
async fn watch_with(
    addr: &str,
    token: &str,
    key: &str,
) -> (
    mpsc::Sender<WatchRequest>,
    Streaming<WatchResponse>,
    WatchResponse,
) {
    watch_range_with(addr, token, key, b"").await
}

/// [`watch_with`] on the range from `key` to `range_end`.
async fn watch_range_with(
    addr: &str,
    token: &str,
    key: &str,
    range_end: &[u8],
) -> (
    mpsc::Sender<WatchRequest>,
    Streaming<WatchResponse>,
    WatchResponse,
) {
    let (tx, rx) = mpsc::channel(4);
    let create = WatchCreateRequest {
        key: key.into(),
        range_end: range_end.to_vec(),
        ..Default::default()
    };
    tx.send(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(create)),
    })
    .await
    .unwrap();
    let requests = ReceiverStream::new(rx);
    let request = if token.is_empty() {
        tonic::Request::new(requests)
    } else {
        with_meta(requests, "token", token)
    };
    let mut responses = WatchClient::new(channel(addr).await)
        .watch(request)
        .await
        .unwrap()
        .into_inner();
    let answer = next(&mut responses).await;
    (tx, responses, answer)
}

async fn put_as(ep: &str, token: &str, key: &str, value: &str) {
    KvClient::new(channel(ep).await)
        .put(with_meta(
            PutRequest {
                key: key.into(),
                value: value.into(),
                ..Default::default()
            },
            "token",
            token,
        ))
        .await
        .unwrap();
}

/// Checks, with one read (a use would renew it), that etcd no longer knows `token`.
async fn assert_expired(ep: &str, token: &str) {
    let read = KvClient::new(channel(ep).await)
        .range(with_meta(
            RangeRequest {
                key: b"k".to_vec(),
                ..Default::default()
            },
            "token",
            token,
        ))
        .await;
    assert!(
        matches!(&read, Err(status) if status.message().contains("invalid auth token")),
        "the token should have expired: {read:?}"
    );
}

/// The parts of a refusal a client reads.
fn refusal_shape(r: &WatchResponse) -> (i64, bool, bool, String) {
    (r.watch_id, r.created, r.canceled, r.cancel_reason.clone())
}

async fn next(responses: &mut Streaming<WatchResponse>) -> WatchResponse {
    tokio::time::timeout(DEADLINE, responses.next())
        .await
        .unwrap_or_else(|_| panic!("no watch answer within {DEADLINE:?}"))
        .expect("open")
        .expect("ok")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_token_can_watch_after_another_callers_token_expired() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &["--auth-token-ttl=2"]).await;
    let ep = etcd.endpoint(0);
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "reader:readerpw"],
        &["role", "add", "readk"],
        &["role", "grant-permission", "readk", "read", "k"],
        &["user", "grant-role", "reader", "readk"],
        &["auth", "enable"],
    ] {
        etcd.etcdctl(0).ok(args).await;
    }
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let addr = proxy.addr();

    let first = token(&addr, "reader", "readerpw").await;
    let (_keep_a, mut stream_a, created_a) = watch_with(&addr, &first, "k").await;
    assert!(created_a.created && !created_a.canceled, "{created_a:?}");

    // etcd forgets a simple token after `--auth-token-ttl` seconds without use; every use renews it, so the only
    // way to let it expire is to leave it alone that long. Then check, once, that it is gone.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_expired(&ep, &first).await;

    // Another caller, with a valid token, watches the same key: it must work.
    let second = token(&addr, "reader", "readerpw").await;
    let (_keep_b, mut stream_b, created_b) = watch_with(&addr, &second, "k").await;
    assert!(
        created_b.created && !created_b.canceled,
        "watch with a valid token refused: {created_b:?}"
    );

    // The expired token is refused for a new watcher exactly as etcd refuses it.
    let (_d, _ds, direct_refusal) = watch_with(&ep, &first, "k").await;
    let (_p, _ps, proxy_refusal) = watch_with(&addr, &first, "k").await;
    assert_eq!(
        refusal_shape(&proxy_refusal),
        refusal_shape(&direct_refusal)
    );

    let root = token(&ep, "root", "rootpw").await;
    KvClient::new(channel(&ep).await)
        .put(with_meta(
            PutRequest {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            },
            "token",
            &root,
        ))
        .await
        .unwrap();
    for (who, stream) in [
        ("second caller", &mut stream_b),
        ("first caller, created before expiry", &mut stream_a),
    ] {
        let event = next(stream).await;
        assert_eq!(event.events.len(), 1, "{who}: {event:?}");
        assert_eq!(
            event.events[0].kv.as_ref().unwrap().value,
            &b"v"[..],
            "{who}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_proxy_user_watchers_survive_an_etcd_restart_that_forgets_every_token() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let mut etcd = support::cluster(&binaries, 1, &["--auth-token-ttl=2"]).await;
    let ep = etcd.endpoint(0);
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "proxy:proxypw"],
        &["role", "add", "watch-all"],
        &[
            "role",
            "grant-permission",
            "watch-all",
            "read",
            "--from-key",
            "a",
        ],
        &["user", "grant-role", "proxy", "watch-all"],
        &["user", "add", "reader:readerpw"],
        &["role", "add", "readk"],
        &["role", "grant-permission", "readk", "read", "k"],
        &["user", "grant-role", "reader", "readk"],
        &["user", "add", "nobody:nobodypw"],
        &["auth", "enable"],
    ] {
        etcd.etcdctl(0).ok(args).await;
    }
    let proxy = support::proxy::start(&etcd.endpoints(), &["--user=proxy:proxypw"]).await;
    let addr = proxy.addr();

    let reader = token(&addr, "reader", "readerpw").await;
    let (_keep, mut watching, created) = watch_with(&addr, &reader, "k").await;
    assert!(created.created && !created.canceled, "{created:?}");

    // Callers are admitted by their own permissions, not the proxy's: refused exactly as etcd refuses them.
    let nobody = token(&addr, "nobody", "nobodypw").await;
    for (who, token, key) in [
        ("no role", nobody.as_str(), "k"),
        ("a key the role does not cover", &reader, "l"),
        ("no token at all", "", "k"),
    ] {
        let (_d, _ds, direct) = watch_with(&ep, token, key).await;
        let (_p, _ps, proxied) = watch_with(&addr, token, key).await;
        assert!(direct.canceled, "{who}: etcd should refuse: {direct:?}");
        assert_eq!(refusal_shape(&proxied), refusal_shape(&direct), "{who}");
    }

    let root = token(&ep, "root", "rootpw").await;
    put_as(&ep, &root, "k", "before").await;
    let event = next(&mut watching).await;
    assert_eq!(event.events[0].kv.as_ref().unwrap().value, &b"before"[..]);

    // Leave every token unused past `--auth-token-ttl` (each use renews it, so waiting is the only way): the
    // reader's and the proxy's expire alike; check the reader's once. Then restart etcd: the proxy must re-create
    // its upstream watcher, with a new token of its own, from the next revision: no cancel, no gap.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_expired(&ep, &reader).await;
    etcd.kill(0);
    etcd.restart(0)
        .await
        .unwrap_or_else(|e| panic!("restart etcd: {e}"));
    let root = token(&ep, "root", "rootpw").await;
    put_as(&ep, &root, "k", "after").await;
    put_as(&ep, &root, "k", "again").await;
    let mut values = Vec::new();
    while values.len() < 2 {
        let response = next(&mut watching).await;
        assert!(
            !response.canceled,
            "the watcher was cancelled by the restart: {response:?}"
        );
        values.extend(
            response
                .events
                .iter()
                .map(|e| e.kv.as_ref().unwrap().value.clone()),
        );
    }
    assert_eq!(
        values,
        [&b"after"[..], &b"again"[..]],
        "no gap, no duplicate"
    );
    let metrics = proxy.metrics().await;
    let tokens = support::metrics::value(
        &metrics,
        "etcd_grpc_proxy_watch_identity_authentications_total",
        &[("result", "token")],
    );
    assert_eq!(
        tokens,
        Some(2.0),
        "one token at start, a new one after etcd refused it"
    );

    // The reader's own token died with the restart: a new watcher with it is refused, as etcd refuses it.
    let (_d, _ds, direct) = watch_with(&ep, &reader, "k").await;
    let (_p, _ps, proxied) = watch_with(&addr, &reader, "k").await;
    assert!(
        direct.canceled,
        "etcd should refuse a forgotten token: {direct:?}"
    );
    assert_eq!(refusal_shape(&proxied), refusal_shape(&direct));
}

/// One etcd member with auth on and its root user (password `rootpw`).
async fn one_member_with_root(binaries: &testkit::Binaries) -> testkit::EtcdCluster {
    let etcd = support::cluster(binaries, 1, &[]).await;
    for args in [&["user", "add", "root:rootpw"][..], &["auth", "enable"]] {
        etcd.etcdctl(0).ok(args).await;
    }
    etcd
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_user_etcd_refuses_ends_watchers_with_etcds_reason() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = one_member_with_root(&binaries).await;
    let ep = etcd.endpoint(0);
    let proxy = support::proxy::start(&etcd.endpoints(), &["--user=root:wrong"]).await;
    let root = token(&ep, "root", "rootpw").await;
    let (_keep, _stream, answer) = watch_with(&proxy.addr(), &root, "k").await;
    assert!(answer.canceled, "{answer:?}");
    assert!(
        answer.cancel_reason.contains("--user")
            && answer.cancel_reason.contains("authentication failed"),
        "the reason should name the flag and etcd's refusal: {answer:?}"
    );
}

/// The proxy's password kept off its command line: from a file, or from the environment. With the password right,
/// the proxy's own token opens the upstream watch; with it wrong, the proxy says so in the cancel reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxy_password_can_come_from_a_file_or_the_environment() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = one_member_with_root(&binaries).await;
    let ep = etcd.endpoint(0);
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("password");
    std::fs::write(&file, "rootpw\n").expect("write the password file");
    let from_file = format!("--password-file={}", file.display());
    let bin = std::path::Path::new(support::proxy::PROXY_BIN);
    let start = |flags: Vec<String>, env: &'static [(&'static str, &'static str)]| {
        let endpoints = etcd.endpoints();
        async move {
            testkit::ProxyProcess::start_with_env(bin, &endpoints, &flags, env)
                .await
                .expect("the proxy starts")
        }
    };
    let root = token(&ep, "root", "rootpw").await;
    for (proxy, right) in [
        (
            start(vec!["--user=root".into(), from_file], &[]).await,
            true,
        ),
        (
            start(
                vec!["--user=root".into()],
                &[("ETCD_GRPC_PROXY_PASSWORD", "rootpw")],
            )
            .await,
            true,
        ),
        (
            start(
                vec!["--user=root".into()],
                &[("ETCD_GRPC_PROXY_PASSWORD", "wrong")],
            )
            .await,
            false,
        ),
    ] {
        let (_keep, _stream, answer) = watch_with(&proxy.addr(), &root, "k").await;
        assert_eq!(answer.created && !answer.canceled, right, "{answer:?}");
        if !right {
            assert!(
                answer.cancel_reason.contains("authentication failed"),
                "{answer:?}"
            );
        }
    }
}

/// GHSA-xg4h-6gfc-h4m8: etcd before 3.5.33 (here 3.4.23, 3.5.1 and 3.5.30) checks a watch whose `range_end` is
/// `"\0"` (every key from `key` on) as if it covered `key` alone, so a user who may read only `a` receives writes
/// to `b`; 3.6.16 and 3.7.3 have the fix. Directly on etcd the hole shows where it is; through the proxy, in both
/// modes and on every version, that watch is refused as etcd refuses any watch its caller may not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_ended_watch_is_checked_on_the_range_it_really_covers() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let ep = etcd.endpoint(0);
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "reader:readerpw"],
        &["role", "add", "reada"],
        &["role", "grant-permission", "reada", "read", "a"],
        &["user", "grant-role", "reader", "reada"],
        &["auth", "enable"],
    ] {
        etcd.etcdctl(0).ok(args).await;
    }
    let per_token = support::proxy::start(&etcd.endpoints(), &[]).await;
    let own_user = support::proxy::start(&etcd.endpoints(), &["--user=root:rootpw"]).await;

    // How etcd refuses a watch the reader may not make: the watch of `b` alone.
    let reader = token(&ep, "reader", "readerpw").await;
    let (_d, _ds, forbidden) = watch_with(&ep, &reader, "b").await;
    assert!(forbidden.canceled, "{forbidden:?}");
    let (_keep, mut direct, created) = watch_range_with(&ep, &reader, "a", b"\0").await;
    if created.canceled {
        // A fixed etcd checks the range an open-ended watch really covers, and refuses it as it refuses `b`.
        assert!(
            binaries.version >= testkit::Version::V3_6_16,
            "etcd {} refused it: {created:?}",
            binaries.version
        );
        assert_eq!(refusal_shape(&created), refusal_shape(&forbidden));
    } else {
        // Before the fix the open-ended watch is created, and a write to `b` reaches a user who may not read `b`.
        let root = token(&ep, "root", "rootpw").await;
        put_as(&ep, &root, "b", "secret").await;
        let leaked = next(&mut direct).await;
        assert_eq!(leaked.events[0].kv.as_ref().unwrap().key, &b"b"[..]);
    }
    for proxy in [&per_token, &own_user] {
        let addr = proxy.addr();
        let reader = token(&addr, "reader", "readerpw").await;
        let (_keep, _stream, answer) = watch_range_with(&addr, &reader, "a", b"\0").await;
        assert_eq!(
            refusal_shape(&answer),
            refusal_shape(&forbidden),
            "through the proxy the open-ended watch is refused"
        );
        // The watch the reader may make still works through the proxy.
        let (_keep, _stream, allowed) = watch_with(&addr, &reader, "a").await;
        assert!(allowed.created && !allowed.canceled, "{allowed:?}");
    }
}

/// The proxy's own calls (here the check of a caller's permission to watch, made with `--user`) end at the
/// proxy's deadline for its own calls when the member hangs, instead of holding the caller (and whatever waits
/// behind the call) until the member answers: the caller gets `Unavailable` naming the deadline, which etcd's
/// clients retry; once the member answers again, a watcher is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_proxys_own_calls_to_a_hung_member_end_at_their_deadline() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = one_member_with_root(&binaries).await;
    let ep = etcd.endpoint(0);
    let proxy = support::proxy::start(&etcd.endpoints(), &["--user=root:rootpw"]).await;
    let root = token(&ep, "root", "rootpw").await;
    let addr = proxy.addr();
    etcd.pause(0);
    let (requests, rx) = mpsc::channel(1);
    requests
        .send(WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: b"k".to_vec(),
                ..Default::default()
            })),
        })
        .await
        .unwrap();
    let asked = tokio::time::Instant::now();
    let mut responses = WatchClient::new(channel(&addr).await)
        .watch(with_meta(ReceiverStream::new(rx), "token", &root))
        .await
        .expect("the stream opens")
        .into_inner();
    let bound = proxy::upstream::OWN_CALL_DEADLINE + DEADLINE;
    let first = tokio::time::timeout(bound, responses.next())
        .await
        .unwrap_or_else(|_| panic!("no answer within {bound:?} while the member hangs"))
        .expect("an answer");
    let status = first.expect_err("no watcher can be created while the member hangs");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("did not answer"), "{status:?}");
    assert!(
        asked.elapsed() >= proxy::upstream::OWN_CALL_DEADLINE,
        "not before the deadline: {:?}",
        asked.elapsed()
    );
    etcd.resume(0);
    let (_keep, _stream, created) = watch_with(&addr, &root, "k").await;
    assert!(created.created && !created.canceled, "{created:?}");
}
