//! One client must not stop the proxy, nor grow it without bound. Against real etcd and the proxy binary:
//!
//! - a Txn nested 1,000 or 100,000 deep gets etcd's own answer (InvalidArgument "too many operations in txn
//!   request"; etcd 3.7's decoder refuses the deeper one first, with other words), with and without `--namespace`,
//!   and the proxy goes on serving;
//! - calls given up while the only member hangs (20,000 reads cancelled by their deadline; 2,000 each of Watch and
//!   LeaseKeepAlive streams dropped, and of RangeStreams cancelled) leave nothing behind: a second such round, once
//!   the member resumes, leaves the proxy's RSS within [`RSS_GROWTH_BOUND_KIB`] of where the first left it, and
//!   etcd's answers to the calls the proxy gave up do not make it drop its connection to etcd;
//! - sockets that never finish their connection setup (silent, or a preface cut short) hold their places among
//!   `--max-client-connections` only until `--client-setup-timeout`, on the client port and on `--metrics-addr`,
//!   while a client already in is served throughout.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::{PutRequest, RangeRequest};
use proxy::upstream::codec::RawCodec;
use tokio::time::Instant;
use tonic::transport::Channel;

/// Deadline of every wait for a condition; a hang guard, never a bound on what is measured.
const PATIENCE: Duration = Duration::from_secs(60);

/// What a round of 26,000 cancelled calls may leave in the proxy's RSS once etcd answers again (the target
/// for 20,000 reads; etcd's Go proxy 3.5.30 grew by 20 MiB, this proxy by 337 MiB before the fix). Anything a
/// cancelled call left behind, at a KiB a call, would exceed it.
const RSS_GROWTH_BOUND_KIB: u64 = 16 * 1024;

/// A Txn as bytes, sent as they are.
async fn raw_txn(addr: &str, bytes: Vec<u8>) -> Result<Bytes, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(support::grpc::channel(addr).await)
        .max_encoding_message_size(usize::MAX);
    grpc.ready().await.expect("ready");
    grpc.unary(
        tonic::Request::new(Bytes::from(bytes)),
        PathAndQuery::from_static("/etcdserverpb.KV/Txn"),
        RawCodec,
    )
    .await
    .map(tonic::Response::into_inner)
}

/// etcd 3.7's answer to a message nested deeper than its decoder's limit (protobuf-go: 10,000 messages, a Txn about
/// 5,000 levels deep), which it gives before it looks at the Txn. protobuf-go puts a space or, chosen per binary, a
/// no-break space after "proto:"; this is the answer with a space.
const DECODER_TOO_DEEP: (tonic::Code, &str) = (
    tonic::Code::Internal,
    "grpc: error unmarshalling request: proto: exceeded maximum recursion depth",
);

#[tokio::test]
async fn a_txn_nested_100000_deep_gets_etcds_answer_and_the_proxy_serves_on() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let range = RangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    };
    let range = prost::Message::encode_to_vec(&range);
    // 1,000 levels: past the proxy's own bound (255), within every etcd's decoder. 100,000: past etcd 3.7's decoder,
    // which answers DECODER_TOO_DEEP; the proxy answers what every etcd answers to a Txn over its bound and before 3.7
    // to any deeper one (README, "Differences").
    for levels in [1_000, 100_000] {
        let deep = testkit::hostile::nested_txn(levels, &range);
        let direct = raw_txn(&etcd.addr(0), deep.clone())
            .await
            .expect_err("etcd refuses it");
        let direct = (direct.code(), direct.message().replace('\u{a0}', " "));
        let expected = if direct.0 == DECODER_TOO_DEEP.0 && direct.1 == DECODER_TOO_DEEP.1 {
            assert!(
                levels > 4_999 && binaries.version >= testkit::Version::V3_7_3,
                "{levels} levels: etcd {} answered {direct:?}",
                binaries.version
            );
            let too_many = proxy::error::txn_too_deep();
            (too_many.code(), too_many.message().to_string())
        } else {
            direct
        };
        for flags in [&[][..], &["--namespace=/app/"]] {
            let mut proxy = support::proxy::start(&etcd.endpoints(), flags).await;
            let through = raw_txn(&proxy.addr(), deep.clone())
                .await
                .expect_err("the proxy refuses it");
            assert_eq!(
                (through.code(), through.message().to_string()),
                expected,
                "{levels} levels, {flags:?}: etcd {}'s answer",
                binaries.version
            );
            assert!(proxy.is_running(), "{flags:?}: {}", proxy.log_tail(20));
            let mut kv = KvClient::new(support::grpc::channel(&proxy.addr()).await);
            kv.put(PutRequest {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("{flags:?}: served after it: {s:?}"));
        }
    }
}

/// One kind of call a storm is made of: the call numbered `i`, given up after `deadline` (it must not be answered
/// while the member hangs).
type Call =
    fn(Channel, usize, Duration) -> futures::future::BoxFuture<'static, Result<(), tonic::Status>>;

/// A serializable read of its own key.
fn read(
    channel: Channel,
    i: usize,
    deadline: Duration,
) -> futures::future::BoxFuture<'static, Result<(), tonic::Status>> {
    Box::pin(async move {
        let mut request = tonic::Request::new(RangeRequest {
            key: format!("storm/read/{i}").into_bytes(),
            serializable: true,
            ..Default::default()
        });
        request.set_timeout(deadline);
        KvClient::new(channel).range(request).await.map(drop)
    })
}

/// A Watch stream creating one watcher on its own key, dropped (a client going away) at the deadline.
fn watch(
    channel: Channel,
    i: usize,
    deadline: Duration,
) -> futures::future::BoxFuture<'static, Result<(), tonic::Status>> {
    use proto::etcdserverpb::watch_client::WatchClient;
    use proto::etcdserverpb::{WatchCreateRequest, WatchRequest, watch_request::RequestUnion};
    Box::pin(async move {
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: format!("storm/watch/{i}").into_bytes(),
                ..Default::default()
            })),
        };
        abandoned(deadline, create, move |requests| async move {
            let mut answers = WatchClient::new(channel)
                .watch(requests)
                .await?
                .into_inner();
            answers.message().await.map(drop)
        })
        .await
    })
}

/// A bidirectional call that sends `first` and gives up on the answer after `deadline`, as a client that goes away
/// does: its request side ends and its stream is reset (RST_STREAM). A request stream that never ended would keep
/// the HTTP/2 stream open in the client library, and so in the proxy, after the call was dropped.
async fn abandoned<Req, Fut>(
    deadline: Duration,
    first: Req,
    call: impl FnOnce(tokio_stream::wrappers::ReceiverStream<Req>) -> Fut,
) -> Result<(), tonic::Status>
where
    Fut: std::future::Future<Output = Result<(), tonic::Status>>,
{
    let (requests, receiver) = tokio::sync::mpsc::channel(1);
    requests
        .send(first)
        .await
        .expect("the call's request stream");
    let answered = tokio::time::timeout(
        deadline,
        call(tokio_stream::wrappers::ReceiverStream::new(receiver)),
    )
    .await;
    drop(requests);
    match answered {
        Ok(answered) => answered,
        Err(_) => Err(tonic::Status::cancelled("given up at the deadline")),
    }
}

/// A LeaseKeepAlive stream renewing a lease of its own, dropped at the deadline.
fn keep_alive(
    channel: Channel,
    i: usize,
    deadline: Duration,
) -> futures::future::BoxFuture<'static, Result<(), tonic::Status>> {
    use proto::etcdserverpb::LeaseKeepAliveRequest;
    use proto::etcdserverpb::lease_client::LeaseClient;
    Box::pin(async move {
        let renew = LeaseKeepAliveRequest {
            id: 1_000_000 + i as i64,
        };
        abandoned(deadline, renew, move |requests| async move {
            let mut answers = LeaseClient::new(channel)
                .lease_keep_alive(requests)
                .await?
                .into_inner();
            answers.message().await.map(drop)
        })
        .await
    })
}

/// A RangeStream of its own prefix, with a deadline.
fn range_stream(
    channel: Channel,
    i: usize,
    deadline: Duration,
) -> futures::future::BoxFuture<'static, Result<(), tonic::Status>> {
    Box::pin(async move {
        let range = RangeRequest {
            key: format!("storm/stream/{i}/").into_bytes(),
            range_end: format!("storm/stream/{i}0").into_bytes(),
            ..Default::default()
        };
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut request = tonic::Request::new(Bytes::from(prost::Message::encode_to_vec(&range)));
        request.set_timeout(deadline);
        let mut answers = grpc
            .server_streaming(
                request,
                PathAndQuery::from_static("/etcdserverpb.KV/RangeStream"),
                RawCodec,
            )
            .await?
            .into_inner();
        while answers.message().await?.is_some() {}
        Ok(())
    })
}

/// `total` calls, `at_once` at a time, each given up after `deadline`; how many ended without an answer.
async fn storm(
    channel: &Channel,
    call: Call,
    total: usize,
    at_once: usize,
    deadline: Duration,
) -> usize {
    let mut cancelled = 0;
    for wave in 0..total.div_ceil(at_once) {
        let calls = (0..at_once).map(|i| call(channel.clone(), wave * at_once + i, deadline));
        for result in futures::future::join_all(calls).await {
            match result {
                Err(s)
                    if matches!(
                        s.code(),
                        tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
                    ) =>
                {
                    cancelled += 1
                }
                other => panic!("a call while the member hangs: {other:?}"),
            }
        }
    }
    cancelled
}

/// How many calls of a storm are in flight at once (`AT_ONCE`, default 500).
fn at_once() -> usize {
    std::env::var("AT_ONCE").map_or(500, |n| n.parse().expect("AT_ONCE is a number"))
}

/// Stops the only member, gives up on a storm of every kind of call, resumes the member and waits until a read is
/// served again; what was cancelled.
async fn hang_and_storm(etcd: &testkit::EtcdCluster, channel: &Channel) -> String {
    etcd.pause(0);
    let deadline = Duration::from_millis(200);
    let storms: [(&str, Call, usize); 4] = [
        ("reads", read, 20_000),
        ("watch streams", watch, 2_000),
        ("keep-alive streams", keep_alive, 2_000),
        ("RangeStreams", range_stream, 2_000),
    ];
    let mut cancelled = Vec::new();
    for (what, call, total) in storms {
        let ended = storm(channel, call, total, at_once(), deadline).await;
        assert_eq!(ended, total, "{what}: every call ended unanswered");
        cancelled.push(format!("{total} {what}"));
    }
    etcd.resume(0);
    let mut kv = KvClient::new(channel.clone());
    let start = Instant::now();
    loop {
        let answered = kv
            .range(RangeRequest {
                key: b"after".to_vec(),
                serializable: true,
                ..Default::default()
            })
            .await;
        if answered.is_ok() {
            break;
        }
        assert!(start.elapsed() < PATIENCE, "served again: {answered:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cancelled.join(", ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_cancelled_while_the_member_hangs_leave_nothing_behind() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    // The release build, as users run it: what a call holds is what is measured.
    let binary = testkit::proxy::binary().expect("the release build of the proxy");
    let proxy = testkit::ProxyProcess::start(&binary, &etcd.endpoints(), &[] as &[&str])
        .await
        .expect("the proxy starts");
    // A client that, like grpc-go's, keeps its connection however many of its calls it cancels (the Rust HTTP/2
    // library would close it itself after 1024 answers to calls it had already reset).
    let channel = Channel::from_shared(format!("http://{}", proxy.addr()))
        .expect("a URI")
        .http2_max_local_error_reset_streams(None)
        .connect()
        .await
        .expect("connect to the proxy");
    let rss = || support::net::proc_status_kib(proxy.pid(), "VmRSS");
    // Warm up with etcd answering, so that what one-time growth there is (buffers, the allocator's arenas, the
    // client's connection, range cache copies) is in the baseline.
    let mut kv = KvClient::new(channel.clone());
    for i in 0..2000 {
        kv.range(RangeRequest {
            key: format!("warm/{i}").into_bytes(),
            serializable: true,
            ..Default::default()
        })
        .await
        .expect("served");
    }
    // The first round raises the proxy's RSS by what its calls in flight at once hold (the allocator keeps that
    // memory for reuse: about 26 KiB per call in flight, so it grows with `AT_ONCE`, not with the number of calls);
    // the second must add nothing: anything a cancelled call left behind would grow with every call.
    let base = rss();
    let first = hang_and_storm(&etcd, &channel).await;
    let before = rss();
    let second = hang_and_storm(&etcd, &channel).await;
    let after = rss();
    println!(
        "RSS: {base} KiB at start; {before} KiB after a first round of cancelling {first} while the member hung \
         (+{} KiB); {after} KiB after a second (+{} KiB)",
        before.saturating_sub(base),
        after.saturating_sub(before)
    );
    // etcd answers the calls the proxy reset after it resumes: that must not make the proxy's own HTTP/2 library
    // close the connection under calls still on it.
    let metrics = proxy.metrics().await;
    let exhausted: f64 = metrics
        .lines()
        .filter(|l| {
            l.starts_with("grpc_server_handled_total{")
                && l.contains("grpc_code=\"ResourceExhausted\"")
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert_eq!(
        exhausted, 0.0,
        "no call answered ResourceExhausted:\n{metrics}"
    );
    assert!(
        after < before + RSS_GROWTH_BOUND_KIB,
        "RSS grew from {before} KiB to {after} KiB in the second round ({second})"
    );
}

#[tokio::test]
async fn sockets_that_never_finish_their_setup_free_their_places_at_the_deadline() {
    use support::net::{closed_within, connect};
    use tokio::io::AsyncWriteExt;
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let metrics_addr = format!("127.0.0.1:{}", testkit::ports::free_port());
    let metrics_flag = format!("--metrics-addr=http://{metrics_addr}");
    // Long enough that the newcomers below see every place taken before the held sockets' deadline frees them,
    // however late a loaded machine lets the proxy accept the held sockets (with 2 s, a CI run once missed it).
    let setup_timeout = Duration::from_secs(10);
    let setup_flag = format!("--client-setup-timeout={}s", setup_timeout.as_secs());
    let proxy = support::proxy::start(
        &etcd.endpoints(),
        &["--max-client-connections=3", &setup_flag, &metrics_flag],
    )
    .await;
    let addr = proxy.addr();
    // A client already in: served before, while and after the places are held.
    let mut kv = KvClient::new(support::grpc::channel(&addr).await);
    let read = || RangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    };
    kv.range(read()).await.expect("served");
    // Two places held by sockets that never finish their setup: one silent on the metrics port, one that sends
    // half of HTTP/2's preface to the client port.
    let held_at = Instant::now();
    let mut silent = connect(&metrics_addr).await;
    let mut half = connect(&addr).await;
    half.write_all(b"PRI * HTTP/2.0\r\n").await.expect("write");
    // Every place is taken: a newcomer is closed at once.
    let start = Instant::now();
    let refused = loop {
        let mut newcomer = connect(&addr).await;
        if closed_within(&mut newcomer, Duration::from_millis(500)).await {
            break true;
        }
        // The proxy may not have counted the held sockets yet; this newcomer took a place: free it and retry.
        drop(newcomer);
        if start.elapsed() > PATIENCE {
            break false;
        }
    };
    assert!(
        refused,
        "a fourth connection is refused while three are open"
    );
    kv.range(read())
        .await
        .expect("the client already in is served");
    assert!(
        closed_within(&mut silent, PATIENCE).await,
        "the silent socket is closed"
    );
    assert!(
        closed_within(&mut half, PATIENCE).await,
        "the half preface is closed"
    );
    let freed_after = held_at.elapsed();
    // The places are back: new clients are served, on both ports.
    let channel = support::grpc::channel(&addr).await;
    KvClient::new(channel)
        .range(read())
        .await
        .expect("a newcomer is served once the places are back");
    let (status, _) = testkit::http::get(&metrics_addr, "/proxy/metrics")
        .await
        .expect("/metrics on the metrics port");
    assert_eq!(status, 200);
    kv.range(read())
        .await
        .expect("the client already in is served");
    println!(
        "places held by sockets that never set up came back {freed_after:?} after they connected"
    );
    assert!(
        freed_after >= setup_timeout,
        "not before --client-setup-timeout: {freed_after:?}"
    );
}
