//! What idle clients cost the proxy: memory per idle HTTP/2 connection, and per open Watch stream that never
//! reads, measured from the proxy's RSS with a thousand of each open, with default flags (one worker per core).
//! The bounds are the ones README.md documents (measured on 2 cores: about 19 KiB per idle connection, most of it
//! h2's per-connection buffers, and 29 to 33 KiB per stream with one watcher); they fail when a change makes
//! either cost grow by a quarter. (A bound of half again, 32 KiB over the 21 KiB first measured, let the stream's
//! cost grow to 30 KiB in steps of under half each, and then failed now and then on the spread between runs.)

mod support;

use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::{WatchCreateRequest, WatchRequest, watch_request::RequestUnion};

/// How many of each: `IDLE_CLIENTS` (default 1,000) measures at another scale, e.g. 10,000 (each connection is a
/// file descriptor in this process and in the proxy).
fn how_many() -> usize {
    std::env::var("IDLE_CLIENTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000)
}

fn rss_kib(pid: u32) -> u64 {
    support::net::proc_status_kib(pid, "VmRSS")
}

/// An HTTP/2 connection to `addr` that has done its handshake and then does nothing.
async fn idle_connection(
    addr: &str,
) -> hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>> {
    let mut sender = support::net::http2(addr).await;
    sender.ready().await.expect("ready");
    sender
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_and_unread_streams_cost_little_memory() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let addr = proxy.addr();
    let connections = how_many();
    let before = rss_kib(proxy.pid());
    let mut idle = Vec::new();
    for _ in 0..connections {
        idle.push(idle_connection(&addr).await);
    }
    let with_connections = rss_kib(proxy.pid());
    let per_connection = (with_connections.saturating_sub(before)) as f64 / connections as f64;
    eprintln!(
        "idle connections: {before} KiB -> {with_connections} KiB, {per_connection:.2} KiB each"
    );
    assert!(
        per_connection < 24.0,
        "{per_connection:.1} KiB per idle connection, README.md says under 24"
    );

    let streams_wanted = how_many();
    let channel = support::grpc::channel(&addr).await;
    let mut streams = Vec::new();
    for i in 0..streams_wanted {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tx.send(WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: format!("w{i}").into_bytes(),
                ..Default::default()
            })),
        })
        .await
        .unwrap();
        let mut responses = WatchClient::new(channel.clone())
            .watch(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        // Its Created answer says the watcher exists in the proxy before it is measured; nothing is read after.
        let created = tokio::time::timeout(std::time::Duration::from_secs(30), responses.message())
            .await
            .expect("a Created answer in time")
            .expect("the stream is open")
            .expect("an answer");
        assert!(created.created, "{created:?}");
        streams.push((tx, responses));
    }
    let with_streams = rss_kib(proxy.pid());
    let per_stream = (with_streams.saturating_sub(with_connections)) as f64 / streams_wanted as f64;
    eprintln!(
        "unread watch streams: {with_connections} KiB -> {with_streams} KiB, {per_stream:.2} KiB each"
    );
    assert!(
        per_stream < 38.0,
        "{per_stream:.1} KiB per unread watch stream, README.md says under 38"
    );
    // Both kinds of client are still there (and the proxy serves them) when measured.
    assert_eq!(idle.len(), connections);
    assert_eq!(proxy.health().await.map(|(code, _)| code), Ok(200));
}
