//! The raw etcd v3 gRPC API through the proxy, at the level of streams, metadata and status
//! codes, compared with the same calls made to etcd directly.

mod support;

use prost::Message as _;
use proto::etcdserverpb::auth_client::AuthClient;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::{
    AuthenticateRequest, CompactionRequest, LeaseGrantRequest, LeaseKeepAliveRequest,
    LeaseRevokeRequest, PutRequest, RangeRequest, WatchCreateRequest, WatchRequest,
    watch_request::RequestUnion,
};
use std::time::Duration;
use support::grpc::{channel, status, with_meta};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// A hang guard for single stream reads: far above what any of them takes.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// One keep-alive request on a stream that is then half-closed: what comes back, message by
/// message, until the end (`Ok(None)`) or an error.
async fn keep_alive_once(addr: &str, id: i64) -> Vec<String> {
    let mut lease = LeaseClient::new(channel(addr).await);
    let requests = tokio_stream::iter(vec![LeaseKeepAliveRequest { id }]);
    let mut stream = lease
        .lease_keep_alive(requests)
        .await
        .unwrap_or_else(|e| panic!("{addr}: LeaseKeepAlive: {e}"))
        .into_inner();
    let mut seen = Vec::new();
    loop {
        let next = tokio::time::timeout(READ_TIMEOUT, stream.message())
            .await
            .unwrap_or_else(|_| {
                panic!("{addr}: no response or end of stream within {READ_TIMEOUT:?}; saw {seen:?}")
            });
        match next {
            Ok(Some(r)) => seen.push(format!(
                "response: same id {}, ttl > 0 {}",
                r.id == id,
                r.ttl > 0
            )),
            Ok(None) => {
                seen.push("end of stream".to_string());
                return seen;
            }
            Err(e) => {
                seen.push(format!("error {}", status(&e)));
                return seen;
            }
        }
        assert!(seen.len() < 10, "{addr}: too many responses: {seen:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_keepalive_half_close_gets_one_answer_then_clean_end_like_etcd() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let mut lease = LeaseClient::new(channel(&etcd.endpoint(0)).await);
    let id = lease
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
        .await
        .expect("grant")
        .into_inner()
        .id;

    let direct = keep_alive_once(&etcd.endpoint(0), id).await;
    let through = keep_alive_once(&proxy.addr(), id).await;
    assert_eq!(
        direct,
        vec!["response: same id true, ttl > 0 true", "end of stream"],
        "direct etcd"
    );
    assert_eq!(through, direct, "through the proxy vs direct etcd");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_over_max_recv_bytes_is_resource_exhausted_and_proxy_keeps_serving() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(
        &etcd.endpoints(),
        // Like etcd's grpc-proxy, the proxy refuses a recv limit below the send limit.
        &["--max-recv-bytes=1024", "--max-send-bytes=1024"],
    )
    .await;
    let mut kv = KvClient::new(channel(&proxy.addr()).await);

    let big = PutRequest {
        key: b"big".to_vec(),
        value: vec![b'x'; 2000],
        ..Default::default()
    };
    let size = big.encoded_len();
    let err = kv
        .put(big)
        .await
        .expect_err("a request larger than --max-recv-bytes must fail");
    assert_eq!(
        status(&err),
        format!("ResourceExhausted: grpc: received message larger than max ({size} vs. 1024)")
    );

    // The same connection and a new one both keep working.
    let small = PutRequest {
        key: b"small".to_vec(),
        value: b"ok".to_vec(),
        ..Default::default()
    };
    kv.put(small.clone())
        .await
        .expect("a small put on the same connection after the oversized one");
    let mut kv2 = KvClient::new(channel(&proxy.addr()).await);
    let got = kv2
        .range(RangeRequest {
            key: b"small".to_vec(),
            ..Default::default()
        })
        .await
        .expect("range on a new connection")
        .into_inner();
    assert_eq!(got.kvs.len(), 1);
    assert_eq!(got.kvs[0].value, &b"ok"[..]);
    let mut direct = KvClient::new(channel(&etcd.endpoint(0)).await);
    let big_direct = direct
        .range(RangeRequest {
            key: b"big".to_vec(),
            ..Default::default()
        })
        .await
        .expect("range direct")
        .into_inner();
    assert!(
        big_direct.kvs.is_empty(),
        "the oversized put must not have reached etcd"
    );
    assert_eq!(proxy.health().await.map(|(code, _)| code), Ok(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_token_metadata_reaches_etcd_and_errors_match_direct() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let ep = etcd.endpoint(0);
    let ctl = etcd.etcdctl(0);
    ctl.ok(&["put", "k", "v"]).await;
    ctl.ok(&["user", "add", "root:rootpw"]).await;
    ctl.ok(&["auth", "enable"]).await;

    let range = || RangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    };
    let token_via = |addr: String| async move {
        AuthClient::new(channel(&addr).await)
            .authenticate(AuthenticateRequest {
                name: "root".into(),
                password: "rootpw".into(),
            })
            .await
            .unwrap_or_else(|e| panic!("authenticate via {addr}: {e}"))
            .into_inner()
            .token
    };
    let token = token_via(proxy.addr()).await;
    assert!(
        !token.is_empty(),
        "Authenticate through the proxy gave no token"
    );

    let mut via_proxy = KvClient::new(channel(&proxy.addr()).await);
    let mut direct = KvClient::new(channel(&ep).await);
    let ok = via_proxy
        .range(with_meta(range(), "token", &token))
        .await
        .expect("range with a valid token through the proxy")
        .into_inner();
    assert_eq!(ok.kvs.len(), 1);
    assert_eq!(ok.kvs[0].value, &b"v"[..]);

    for (what, token) in [("no token", None), ("a bogus token", Some("bogus.1"))] {
        let req = |r| match token {
            Some(t) => with_meta(r, "token", t),
            None => tonic::Request::new(r),
        };
        let d = direct
            .range(req(range()))
            .await
            .expect_err("direct etcd must refuse");
        let p = via_proxy
            .range(req(range()))
            .await
            .expect_err("the proxy must refuse");
        assert_eq!(status(&p), status(&d), "range with {what}");
    }
    let d = direct
        .range(tonic::Request::new(range()))
        .await
        .expect_err("refused");
    assert_eq!(
        status(&d),
        "InvalidArgument: etcdserver: user name is empty"
    );

    // A put with the token (a write, forwarded once) also works.
    let put = PutRequest {
        key: b"k2".to_vec(),
        value: b"v2".to_vec(),
        ..Default::default()
    };
    via_proxy
        .put(with_meta(put, "token", &token))
        .await
        .expect("put with a valid token through the proxy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_with_hasleader_metadata_works_through_proxy() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let mut watch = WatchClient::new(channel(&proxy.addr()).await);
    let (tx, rx) = mpsc::channel(4);
    tx.send(create_hl_watch()).await.expect("queue create");
    let mut stream = watch
        .watch(with_meta(ReceiverStream::new(rx), "hasleader", "true"))
        .await
        .expect("watch with hasleader through the proxy")
        .into_inner();
    let created = tokio::time::timeout(READ_TIMEOUT, stream.message())
        .await
        .expect("created response within the hang guard")
        .expect("watch stream error")
        .expect("watch stream ended");
    assert!(
        created.created,
        "first response must be 'created': {created:?}"
    );

    let mut kv = KvClient::new(channel(&proxy.addr()).await);
    kv.put(PutRequest {
        key: b"hl".to_vec(),
        value: b"1".to_vec(),
        ..Default::default()
    })
    .await
    .expect("put");
    let event = tokio::time::timeout(READ_TIMEOUT, stream.message())
        .await
        .expect("event within the hang guard")
        .expect("watch stream error")
        .expect("watch stream ended");
    assert_eq!(event.events.len(), 1, "{event:?}");
    let kv = event.events[0].kv.as_ref().expect("event kv");
    assert_eq!(
        (kv.key.as_ref(), kv.value.as_ref()),
        (&b"hl"[..], &b"1"[..])
    );
    drop(tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_status_codes_and_messages_pass_unchanged() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let ep = etcd.endpoint(0);
    let mut direct = KvClient::new(channel(&ep).await);
    let mut via_proxy = KvClient::new(channel(&proxy.addr()).await);
    let mut rev = 0;
    for i in 0..4 {
        rev = direct
            .put(PutRequest {
                key: b"c".to_vec(),
                value: format!("{i}").into_bytes(),
                ..Default::default()
            })
            .await
            .expect("put")
            .into_inner()
            .header
            .expect("header")
            .revision;
    }
    direct
        .compact(CompactionRequest {
            revision: rev - 1,
            physical: true,
        })
        .await
        .expect("compact");

    let compacted = RangeRequest {
        key: b"c".to_vec(),
        revision: 2,
        ..Default::default()
    };
    let future = RangeRequest {
        key: b"c".to_vec(),
        revision: rev + 100,
        ..Default::default()
    };
    let empty_key = PutRequest {
        key: vec![],
        value: b"v".to_vec(),
        ..Default::default()
    };
    let cases: Vec<(&str, String, String)> = vec![
        (
            "range at a compacted revision",
            status(&direct.range(compacted.clone()).await.expect_err("direct")),
            status(&via_proxy.range(compacted).await.expect_err("proxy")),
        ),
        (
            "range at a future revision",
            status(&direct.range(future.clone()).await.expect_err("direct")),
            status(&via_proxy.range(future).await.expect_err("proxy")),
        ),
        (
            "put with an empty key",
            status(&direct.put(empty_key.clone()).await.expect_err("direct")),
            status(&via_proxy.put(empty_key).await.expect_err("proxy")),
        ),
        (
            "compact at the compacted revision",
            status(
                &direct
                    .compact(CompactionRequest {
                        revision: rev - 1,
                        physical: false,
                    })
                    .await
                    .expect_err("direct"),
            ),
            status(
                &via_proxy
                    .compact(CompactionRequest {
                        revision: rev - 1,
                        physical: false,
                    })
                    .await
                    .expect_err("proxy"),
            ),
        ),
    ];
    let mut lease_direct = LeaseClient::new(channel(&ep).await);
    let mut lease_proxy = LeaseClient::new(channel(&proxy.addr()).await);
    let revoke_missing = (
        "revoke of an unknown lease",
        status(
            &lease_direct
                .lease_revoke(LeaseRevokeRequest { id: 12345 })
                .await
                .expect_err("direct"),
        ),
        status(
            &lease_proxy
                .lease_revoke(LeaseRevokeRequest { id: 12345 })
                .await
                .expect_err("proxy"),
        ),
    );
    for (what, d, p) in cases.iter().chain(std::iter::once(&revoke_missing)) {
        assert_eq!(p, d, "{what}: through the proxy vs direct etcd");
    }
    assert_eq!(
        cases[0].1,
        "OutOfRange: etcdserver: mvcc: required revision has been compacted"
    );
    assert_eq!(
        cases[2].1,
        "InvalidArgument: etcdserver: key is not provided"
    );
}

/// `Ok` once an opened stream answers, or the status it was refused or ended with.
async fn first_answer<T>(
    opened: Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>,
) -> Result<(), String> {
    let answer = match opened {
        Ok(response) => tokio::time::timeout(READ_TIMEOUT, response.into_inner().message())
            .await
            .expect("an answer within the hang guard")
            .map(|_| ()),
        Err(e) => Err(e),
    };
    answer.map_err(|e| status(&e))
}

/// A create of a watcher on key `hl`, for the hasleader tests.
fn create_hl_watch() -> WatchRequest {
    WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
            key: b"hl".to_vec(),
            ..Default::default()
        })),
    }
}

/// How a Watch and a LeaseKeepAlive stream that require a leader start (see [`first_answer`]).
async fn open_requiring_leader(addr: &str) -> Vec<Result<(), String>> {
    let mut outcomes = Vec::new();
    let (tx, rx) = mpsc::channel(1);
    tx.send(create_hl_watch()).await.expect("queue create");
    let watch = WatchClient::new(channel(addr).await)
        .watch(with_meta(ReceiverStream::new(rx), "hasleader", "true"))
        .await;
    outcomes.push(first_answer(watch).await);
    let requests = tokio_stream::iter(vec![LeaseKeepAliveRequest { id: 1 }]);
    let keep_alive = LeaseClient::new(channel(addr).await)
        .lease_keep_alive(with_meta(requests, "hasleader", "true"))
        .await;
    outcomes.push(first_answer(keep_alive).await);
    outcomes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_calls_that_require_a_leader_are_refused_as_etcd_refuses_them_when_there_is_none()
 {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let mut etcd = support::cluster(&binaries, 3, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    assert_eq!(
        open_requiring_leader(&proxy.addr()).await,
        vec![Ok(()), Ok(())],
        "with a leader, both streams open"
    );
    // Two of three members gone: the survivor loses its leader (after its election timeout) and keeps none.
    etcd.kill(1);
    etcd.kill(2);
    let survivor = etcd.endpoint(0);
    testkit::wait_for("the survivor to report no leader", READ_TIMEOUT, || {
        let survivor = survivor.clone();
        async move {
            let mut maintenance = proto::etcdserverpb::maintenance_client::MaintenanceClient::new(
                channel(&survivor).await,
            );
            let status = maintenance
                .status(proto::etcdserverpb::StatusRequest {})
                .await
                .map_err(|e| e.to_string())?;
            match status.into_inner().leader {
                0 => Ok(()),
                leader => Err(format!("leader is still {leader:x}")),
            }
        }
    })
    .await;
    let direct = open_requiring_leader(&survivor).await;
    assert!(
        direct
            .iter()
            .all(|o| o.as_ref().is_err_and(|e| e.contains("no leader"))),
        "etcd refuses both: {direct:?}"
    );
    assert_eq!(open_requiring_leader(&proxy.addr()).await, direct);

    // A unary call that requires a leader: etcd refuses it at once. The proxy asks each of its endpoints once (one
    // of them might have a leader) and then gives etcd's answer, rather than retrying for its whole retry window.
    let direct = range_requiring_leader(&survivor).await;
    assert_eq!(
        direct,
        Err("Unavailable: etcdserver: no leader".to_string())
    );
    let failovers_before = support::metrics::failovers(&proxy.metrics().await);
    assert_eq!(range_requiring_leader(&proxy.addr()).await, direct);
    let failovers = support::metrics::failovers(&proxy.metrics().await) - failovers_before;
    assert!(
        failovers <= etcd.len() as f64,
        "{failovers} failovers for one call: each endpoint should be asked once"
    );
}

/// A Range that requires a leader (`hasleader: true`), as its status.
async fn range_requiring_leader(addr: &str) -> Result<(), String> {
    let request = with_meta(
        RangeRequest {
            key: b"hl".to_vec(),
            ..Default::default()
        },
        "hasleader",
        "true",
    );
    KvClient::new(channel(addr).await)
        .range(request)
        .await
        .map(|_| ())
        .map_err(|e| status(&e))
}

/// One gRPC call made of raw bytes: the length-prefixed frame as given, whatever it says. Returns what came back
/// as "grpc-status: message", from the trailers or a trailers-only answer.
async fn raw_call(addr: &str, path: &str, frame: Vec<u8>) -> String {
    use http_body_util::BodyExt;
    let mut sender = support::net::http2(addr).await;
    let request = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(bytes::Bytes::from(frame)))
        .unwrap();
    let response = tokio::time::timeout(READ_TIMEOUT, sender.send_request(request))
        .await
        .expect("an answer in time")
        .expect("a response");
    let headers = response.headers().clone();
    let collected = tokio::time::timeout(READ_TIMEOUT, response.into_body().collect())
        .await
        .expect("the body in time")
        .expect("the body");
    let trailers = collected.trailers().cloned().unwrap_or(headers);
    let code = trailers
        .get("grpc-status")
        .map_or("-", |v| v.to_str().unwrap());
    let message = trailers
        .get("grpc-message")
        .map_or("", |v| v.to_str().unwrap());
    format!("{code}: {}", percent_decoded(message))
}

/// A `grpc-message` as clients read it: grpc-go sends spaces as they are, tonic as `%20`; both mean the same.
fn percent_decoded(message: &str) -> String {
    let bytes = message.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn frame(message: &[u8]) -> Vec<u8> {
    let mut frame = vec![0];
    frame.extend_from_slice(&(message.len() as u32).to_be_bytes());
    frame.extend_from_slice(message);
    frame
}

/// Bytes that are not a valid message reach etcd as they are, and the client gets etcd's answer; a message with a
/// field etcd does not know works as it does at etcd; a frame cut short gets etcd's error, not a hang or a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_unknown_bytes_get_etcds_answer() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let direct = etcd.endpoint(0);
    let through = proxy.addr();

    let mut put_with_unknown_field = PutRequest {
        key: b"u".to_vec(),
        value: b"v".to_vec(),
        ..Default::default()
    }
    .encode_to_vec();
    put_with_unknown_field.extend_from_slice(&[0x98, 0x06, 0x2a]);
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "a Range whose key runs past the end",
            "/etcdserverpb.KV/Range",
            frame(&[0x0a, 0x05, b'a']),
        ),
        (
            "a Txn whose operation runs past the end",
            "/etcdserverpb.KV/Txn",
            frame(&[0x12, 0x09, 0x0a]),
        ),
        (
            "a Put with a field etcd does not know",
            "/etcdserverpb.KV/Put",
            frame(&put_with_unknown_field),
        ),
        (
            "a Range with wire type 7",
            "/etcdserverpb.KV/Range",
            frame(&[0x0f, 0x00]),
        ),
    ];
    for (what, path, bytes) in cases {
        let at_etcd = raw_call(&direct, path, bytes.clone()).await;
        let at_proxy = raw_call(&through, path, bytes).await;
        assert_eq!(at_proxy, at_etcd, "{what}");
    }

    // RangeStream, which etcd before 3.7 lacks and the proxy serves, answers malformed bytes as etcd 3.7.3 does
    // (what 3.7.3 answers is checked on 3.7.3, where the proxy relays).
    let malformed = frame(&[0x0a, 0x05, b'a']);
    let path = "/etcdserverpb.KV/RangeStream";
    // Go's protobuf errors put a space or, chosen per binary, a no-break space after "proto:" (relayed from 3.7.3
    // as it chose); the emulation puts the space.
    let at_proxy = raw_call(&through, path, malformed.clone())
        .await
        .replace('\u{a0}', " ");
    assert_eq!(
        at_proxy,
        "13: grpc: failed to unmarshal the received message: proto: cannot parse invalid wire-format data"
    );
    if binaries.version >= testkit::Version::V3_7_3 {
        let at_etcd = raw_call(&direct, path, malformed).await;
        assert_eq!(at_proxy, at_etcd.replace('\u{a0}', " "));
    }

    // A frame that promises 10 bytes and carries 3.
    let cut_short = vec![0, 0, 0, 0, 10, 0x0a, 0x01, b'a'];
    let at_etcd = raw_call(&direct, "/etcdserverpb.KV/Range", cut_short.clone()).await;
    let at_proxy = raw_call(&through, "/etcdserverpb.KV/Range", cut_short).await;
    assert_eq!(at_proxy, at_etcd, "a frame cut short");
    // And the proxy still serves.
    let mut kv = KvClient::new(channel(&through).await);
    kv.range(RangeRequest {
        key: b"u".to_vec(),
        ..Default::default()
    })
    .await
    .expect("a Range after the bad frames");
}

/// Calls on paths etcd does not have share one set of metric labels: however many made-up paths a client tries,
/// `/metrics` stays the same size (each path used to become label values of its own, with histogram buckets).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn made_up_paths_do_not_grow_metrics() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let addr = proxy.addr();
    let get = RangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    }
    .encode_to_vec();
    // The first made-up paths create the shared `unknown` series; later ones must add nothing.
    for path in ["/etcdserverpb.KV/Scan", "/made.Up/First"] {
        let answer = raw_call(&addr, path, frame(&get)).await;
        assert!(answer.starts_with("12: "), "{path}: {answer}");
    }
    let lines_before = proxy.metrics().await.lines().count();
    for i in 0..300 {
        let path = format!("/made.Up{i}/Method{i}");
        let answer = raw_call(&addr, &path, frame(&get)).await;
        assert_eq!(answer, format!("12: unknown service made.Up{i}"));
    }
    let metrics = proxy.metrics().await;
    assert_eq!(metrics.lines().count(), lines_before, "{metrics}");
    assert!(
        metrics.contains("grpc_method=\"unknown\""),
        "the calls are counted, under one label"
    );
}

/// A request whose length prefix is over what the proxy could send on is refused by that prefix, before its
/// bytes are read: eight at once, each carrying 4 MiB of a claimed 128 MiB, leave the proxy's peak RSS where it
/// was (it used to read them whole before refusing them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_are_refused_by_their_length_prefix() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let addr = proxy.addr();
    let peak = |pid: u32| support::net::proc_status_kib(pid, "VmHWM");
    let before_kib = peak(proxy.pid());
    let claimed: u32 = 128 << 20;
    let mut frame = vec![0];
    frame.extend_from_slice(&claimed.to_be_bytes());
    frame.resize(5 + (4 << 20), b'x');
    let calls = (0..8).map(|_| raw_call(&addr, "/etcdserverpb.KV/Put", frame.clone()));
    for answer in futures::future::join_all(calls).await {
        // --max-send-bytes' default (1.5 MiB) bounds what a client may send, --max-recv-bytes being larger.
        assert_eq!(
            answer,
            format!("8: grpc: received message larger than max ({claimed} vs. 1572864)")
        );
    }
    let grown_kib = peak(proxy.pid()).saturating_sub(before_kib);
    eprintln!("peak RSS grew by {grown_kib} KiB while refusing 8 requests claiming 128 MiB");
    assert!(
        grown_kib < 16 * 1024,
        "peak RSS grew by {grown_kib} KiB while refusing 8 oversized requests"
    );
    let mut kv = KvClient::new(channel(&addr).await);
    kv.put(PutRequest {
        key: b"after".to_vec(),
        value: b"v".to_vec(),
        ..Default::default()
    })
    .await
    .expect("the proxy serves after refusing them");
}
