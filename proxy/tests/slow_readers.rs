//! Slow readers of the server streams the proxy relays as bytes (Snapshot, Observe): a client that opens such a
//! stream and never reads costs the proxy a bounded amount of memory, does not keep other clients from being
//! served, and gives back what it held when it goes.
//!
//! The relay is pulled, end to end: hyper polls a response body only when the client's window has room, the body
//! polls the relay, the relay polls the upstream stream, and h2 gives etcd window back only as the relay reads. So
//! an unread stream holds at most, in bytes:
//!
//! - `UPSTREAM_STREAM_WINDOW` (2 MiB): what etcd may send ahead on the upstream stream, held by h2 until read;
//! - [`CLIENT_WINDOW`]: what the client's window let the proxy send it (the client never reads, so never
//!   releases it; h2 keeps it until then);
//! - five messages in between (a message: 32 KiB of blob or value and under 1 KiB of the rest): the one tonic's
//!   decoder is assembling, the one the relay holds, tonic's encoder buffer (its 32 KiB yield threshold, or one
//!   larger message), the chunk hyper holds while it waits for window, and the chunk h2 queued past the window;
//!
//! twice that for allocation slack (h2 keeps each received frame as a slice of the read buffer it arrived in, and
//! a buffer lives while any of its frames does; buffers grow by doubling), plus 64 KiB for the stream's and its
//! connection's own state (`idle_cost.rs` measures 16 KiB per idle connection and 21 KiB per unread Watch stream).
//! That is 4.4 MiB per stream; measured: 2.6 MiB for Snapshot and for Observe alike. A relay that read from etcd
//! as fast as etcd sends holds the whole answer instead (measured with the relay draining etcd into an unbounded
//! channel: 53 MiB per stream for the 45 MiB snapshot here, 37 MiB per Observe stream for 32 MiB proclaimed).
//!
//! The proxy sends every call to an endpoint on one HTTP/2 connection, and h2 returns connection window only as
//! data is read: with hyper's default 5 MiB connection window, three unread streams stalled every other call to
//! that endpoint. The "others are served" checks pin the fix (the largest connection window, in `upstream`).

mod support;

use std::collections::VecDeque;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::maintenance_client::MaintenanceClient;
use proto::etcdserverpb::{LeaseGrantRequest, PutRequest, RangeRequest, SnapshotRequest};
use proto::v3electionpb::election_client::ElectionClient;
use proto::v3electionpb::{CampaignRequest, LeaderKey, LeaderRequest, ProclaimRequest};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Status, Streaming};

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;

/// The HTTP/2 windows (stream and connection) a slow client advertises.
const CLIENT_WINDOW: u32 = 16 * 1024;

/// Unread streams opened at once.
const SLOW: usize = 4;

/// The size of every message the streams carry: etcd sends a snapshot in 32 KiB pieces, and the election's
/// values are made that size.
const MESSAGE: u64 = 32 * KIB;

/// What one unread stream may cost the proxy, in KiB (derived in the module doc).
fn per_stream_bound_kib() -> u64 {
    let held = u64::from(proxy::upstream::UPSTREAM_STREAM_WINDOW)
        + u64::from(CLIENT_WINDOW)
        + 5 * (MESSAGE + KIB);
    (2 * held + 64 * KIB) / KIB
}

fn rss_kib(pid: u32) -> u64 {
    support::net::proc_status_kib(pid, "VmRSS")
}

/// A stream whose answers are never read, and the connection it came on.
struct Unread<T> {
    _channel: Channel,
    _stream: Streaming<T>,
}

/// Opens `SLOW` streams through the proxy at `addr` with `open`, each on a connection of its own whose HTTP/2
/// windows are [`CLIENT_WINDOW`] (so each takes that much and no more), and never reads them.
async fn open_unread<T, F, Fut>(addr: &str, open: F) -> Vec<Unread<T>>
where
    F: Fn(Channel) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Streaming<T>>, Status>>,
{
    let mut unread = Vec::new();
    for _ in 0..SLOW {
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .expect("valid URI")
            .initial_stream_window_size(CLIENT_WINDOW)
            .initial_connection_window_size(CLIENT_WINDOW)
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        let stream = open(channel.clone())
            .await
            .expect("the stream opens")
            .into_inner();
        unread.push(Unread {
            _channel: channel,
            _stream: stream,
        });
    }
    unread
}

/// The Prometheus text at `path` of `addr`: `/metrics` of etcd, `/proxy/metrics` of the proxy (whose `/metrics`
/// is etcd's, relayed).
async fn metrics_of(addr: &str, path: &str) -> String {
    match testkit::http::get(addr, path).await {
        Ok((200, text)) => text,
        other => panic!("GET {path} on {addr}: {other:?}"),
    }
}

/// `etcd_network_client_grpc_sent_bytes_total` of the etcd at `addr`: the bytes of the messages etcd has handed
/// to gRPC for its clients.
async fn etcd_sent_bytes(addr: &str) -> u64 {
    let text = metrics_of(addr, "/metrics").await;
    support::metrics::value(&text, "etcd_network_client_grpc_sent_bytes_total", &[])
        .unwrap_or_else(|| panic!("no etcd_network_client_grpc_sent_bytes_total in etcd's metrics"))
        as u64
}

/// Calls of `method` started and not yet ended, by go-grpc-prometheus' counters (etcd and the proxy both have
/// them).
fn open_calls(metrics: &str, method: &str) -> i64 {
    let label = format!("grpc_method=\"{method}\"");
    let sum = |name: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(name) && l.contains(&label))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum()
    };
    (sum("grpc_server_started_total{") - sum("grpc_server_handled_total{")) as i64
}

/// Snapshot streams open in etcd (its go-grpc-prometheus counters).
fn snapshots_in_etcd(metrics: &str) -> i64 {
    open_calls(metrics, "Snapshot")
}

/// Watchers in etcd: each Observe stream is one (etcd counts no gRPC calls of its Election service).
fn watchers_in_etcd(metrics: &str) -> i64 {
    support::metrics::value(metrics, "etcd_debugging_mvcc_watcher_total", &[])
        .expect("etcd_debugging_mvcc_watcher_total in etcd's metrics") as i64
}

/// Waits until no call of `method` is open in the proxy at `proxy`, and none of its upstream streams in the etcd
/// at `etcd`, as `in_etcd` counts them there.
async fn wait_released(proxy: &str, etcd: &str, method: &str, in_etcd: fn(&str) -> i64) {
    testkit::wait_for(
        &format!("the {method} streams to end in the proxy and in etcd"),
        Duration::from_secs(10),
        || async {
            let (in_proxy, in_etcd) = (
                open_calls(&metrics_of(proxy, "/proxy/metrics").await, method),
                in_etcd(&metrics_of(etcd, "/metrics").await),
            );
            if in_proxy == 0 && in_etcd == 0 {
                Ok(())
            } else {
                Err(format!("{in_proxy} open in the proxy, {in_etcd} in etcd"))
            }
        },
    )
    .await;
}

/// Waits until the relays have moved all that flow control lets them move: over the last second neither etcd's
/// count of bytes sent nor the proxy's RSS (by more than 256 KiB) has changed. Returns the proxy's RSS then.
async fn settle(proxy_pid: u32, etcd_addr: &str, what: &str) -> u64 {
    const SAMPLE: Duration = Duration::from_millis(100);
    const STEADY: usize = 10;
    const LIMIT: Duration = Duration::from_secs(20);
    let deadline = Instant::now() + LIMIT;
    let mut seen: VecDeque<(u64, u64)> = VecDeque::new();
    loop {
        seen.push_back((rss_kib(proxy_pid), etcd_sent_bytes(etcd_addr).await));
        if seen.len() > STEADY {
            seen.pop_front();
            let rss = || seen.iter().map(|(rss, _)| *rss);
            let (low, high) = (rss().min().unwrap_or(0), rss().max().unwrap_or(0));
            if high - low <= 256 && seen.iter().all(|(_, sent)| *sent == seen[0].1) {
                return high;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what}: the proxy's RSS (KiB) and etcd's sent bytes still moved after {LIMIT:?}: {seen:?}"
        );
        tokio::time::sleep(SAMPLE).await;
    }
}

/// Asserts the proxy's RSS grew by at most the bound for `SLOW` unread streams.
fn assert_bounded(what: &str, before: u64, with_slow: u64) {
    let bound = SLOW as u64 * per_stream_bound_kib();
    let growth = with_slow.saturating_sub(before);
    eprintln!(
        "{SLOW} unread {what} streams: proxy RSS {before} -> {with_slow} KiB, {} KiB each (bound {} KiB each)",
        growth / SLOW as u64,
        per_stream_bound_kib()
    );
    assert!(
        growth <= bound,
        "{SLOW} unread {what} streams grew the proxy's RSS by {growth} KiB, more than the {bound} KiB flow \
         control allows: the relay reads from etcd while its client does not read"
    );
}

/// Asserts that new unread streams, opened after the first ones closed, fit in what those gave back: the RSS
/// grows by at most half of what the first ones took (memory they kept would be taken again in full).
fn assert_reused(before: u64, with_slow: u64, after: u64, with_again: u64) {
    let (first, again) = (
        with_slow.saturating_sub(before),
        with_again.saturating_sub(after),
    );
    eprintln!(
        "after closing: {after} KiB; {SLOW} new unread streams: {with_again} KiB (+{again} KiB)"
    );
    assert!(
        again <= first / 2,
        "{SLOW} new unread streams grew the RSS by {again} KiB after the first {SLOW} (+{first} KiB) closed: \
         what those held was not given back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_snapshot_streams_hold_a_bounded_amount_and_block_no_one() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let started = Instant::now();
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let etcd_addr = etcd.addr(0);
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let addr = proxy.addr();

    // A database of about 45 MiB: 40 values of 1 MiB, written directly.
    let direct = support::grpc::channel(&etcd_addr).await;
    let value = vec![b'v'; MIB as usize];
    futures::stream::iter(0..40)
        .for_each_concurrent(8, |i| {
            let (mut kv, value) = (KvClient::new(direct.clone()), value.clone());
            async move {
                let key = format!("big/{i:02}").into_bytes();
                let put = PutRequest {
                    key,
                    value,
                    ..Default::default()
                };
                kv.put(put).await.expect("put");
            }
        })
        .await;

    let before = settle(proxy.pid(), &etcd_addr, "before any snapshot").await;
    let sent_before = etcd_sent_bytes(&etcd_addr).await;
    let snapshot = |channel| async move {
        MaintenanceClient::new(channel)
            .snapshot(SnapshotRequest {})
            .await
    };
    let unread = open_unread(&addr, snapshot).await;
    let with_slow = settle(proxy.pid(), &etcd_addr, "unread snapshots").await;
    assert_eq!(
        snapshots_in_etcd(&metrics_of(&etcd_addr, "/metrics").await),
        SLOW as i64,
        "each unread snapshot is a stream in etcd"
    );
    let sent = (etcd_sent_bytes(&etcd_addr).await - sent_before) / KIB;
    // etcd hands gRPC one 32 KiB piece after another, and gRPC takes at most 64 KiB (grpc-go's write quota) and
    // the piece that overdraws it ahead of the proxy's window before it blocks etcd: 96 KiB per stream past the
    // window; 256 KiB leaves room.
    let sent_bound =
        SLOW as u64 * (u64::from(proxy::upstream::UPSTREAM_STREAM_WINDOW) + 256 * KIB) / KIB;
    eprintln!("etcd sent {sent} KiB on them (bound {sent_bound} KiB)");
    assert_bounded("Snapshot", before, with_slow);
    assert!(
        sent <= sent_bound,
        "etcd sent {sent} KiB on {SLOW} unread snapshot streams: the relay reads what its client does not"
    );

    // Others are served meanwhile: a Range, and a whole snapshot.
    let other = support::grpc::channel(&addr).await;
    let served = tokio::time::timeout(Duration::from_secs(15), async {
        let range = RangeRequest {
            key: b"big/00".to_vec(),
            keys_only: true,
            ..Default::default()
        };
        let found = KvClient::new(other.clone()).range(range).await?;
        assert_eq!(found.into_inner().count, 1);
        let mut snapshot = MaintenanceClient::new(other.clone())
            .snapshot(SnapshotRequest {})
            .await?
            .into_inner();
        let (mut size, mut read) = (None, 0);
        while let Some(piece) = snapshot.message().await? {
            size.get_or_insert(piece.remaining_bytes + piece.blob.len() as u64);
            read += piece.blob.len() as u64;
        }
        Ok::<_, Status>((size, read))
    })
    .await;
    let (size, read) = match served {
        Ok(Ok(sizes)) => sizes,
        Ok(Err(status)) => panic!("another client's calls failed: {status}"),
        Err(_) => panic!(
            "another client was not served in 15 s while {SLOW} snapshot streams were unread"
        ),
    };
    // Whole: the size etcd announced, then the 32 bytes of its SHA-256.
    assert_eq!(
        size.map(|s| s + 32),
        Some(read),
        "the other client's snapshot is whole"
    );
    eprintln!(
        "another client read a {} MiB snapshot meanwhile",
        read / MIB
    );
    // What was measured is what flow control allows: every upstream window filled.
    assert!(
        sent >= SLOW as u64 * u64::from(proxy::upstream::UPSTREAM_STREAM_WINDOW) / KIB,
        "etcd sent only {sent} KiB on {SLOW} unread snapshot streams, less than their upstream windows: the \
         upstream connection's window ran out first"
    );

    // Closing the slow streams ends them upstream too, and what they held is given back for reuse: as many new
    // unread streams fit in it.
    drop(unread);
    wait_released(&addr, &etcd_addr, "Snapshot", snapshots_in_etcd).await;
    let after = settle(proxy.pid(), &etcd_addr, "after closing").await;
    let again = open_unread(&addr, snapshot).await;
    let with_again = settle(proxy.pid(), &etcd_addr, "unread snapshots again").await;
    assert_reused(before, with_slow, after, with_again);
    drop(again);
    wait_released(&addr, &etcd_addr, "Snapshot", snapshots_in_etcd).await;
    eprintln!("took {:?}", started.elapsed());
}

/// Proclaims `count` values of [`MESSAGE`] bytes as `leader`, eight at a time.
async fn proclaim(channel: &Channel, leader: &LeaderKey, count: usize) {
    let value = vec![b'p'; MESSAGE as usize];
    futures::stream::iter(0..count)
        .for_each_concurrent(8, |_| {
            let mut election = ElectionClient::new(channel.clone());
            let request = ProclaimRequest {
                leader: Some(leader.clone()),
                value: value.clone(),
            };
            async move {
                election.proclaim(request).await.expect("proclaim");
            }
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_observe_streams_hold_a_bounded_amount_and_block_no_one() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let started = Instant::now();
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let etcd_addr = etcd.addr(0);
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let addr = proxy.addr();

    let direct = support::grpc::channel(&etcd_addr).await;
    let lease = LeaseClient::new(direct.clone())
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
        .await
        .expect("lease grant")
        .into_inner()
        .id;
    let campaign = CampaignRequest {
        name: b"slow".to_vec(),
        lease,
        value: b"first".to_vec(),
    };
    let leader = ElectionClient::new(direct.clone())
        .campaign(campaign)
        .await
        .expect("campaign")
        .into_inner()
        .leader
        .expect("a leader key");

    let before = settle(proxy.pid(), &etcd_addr, "before any observer").await;
    let observe = |channel| async move {
        ElectionClient::new(channel)
            .observe(LeaderRequest {
                name: b"slow".to_vec(),
            })
            .await
    };
    let unread = open_unread(&addr, observe).await;
    // 32 MiB of new values for each observer, proclaimed directly.
    proclaim(&direct, &leader, 1000).await;
    let with_slow = settle(proxy.pid(), &etcd_addr, "unread observers").await;
    assert_bounded("Observe", before, with_slow);
    assert_eq!(
        watchers_in_etcd(&metrics_of(&etcd_addr, "/metrics").await),
        SLOW as i64,
        "each unread observer is a watcher in etcd"
    );

    // Others are served meanwhile: an observer that reads sees a value proclaimed through the proxy.
    let other = support::grpc::channel(&addr).await;
    let served = tokio::time::timeout(Duration::from_secs(10), async {
        let mut observer = observe(other.clone()).await?.into_inner();
        let last = ProclaimRequest {
            leader: Some(leader.clone()),
            value: b"last".to_vec(),
        };
        ElectionClient::new(other.clone()).proclaim(last).await?;
        while let Some(answer) = observer.message().await? {
            if answer.kv.is_some_and(|kv| kv.value.as_ref() == b"last") {
                return Ok(());
            }
        }
        Err(Status::internal("the observer's stream ended"))
    })
    .await;
    match served {
        Ok(Ok(())) => {}
        Ok(Err(status)) => panic!("another client's calls failed: {status}"),
        Err(_) => {
            panic!("another client was not served in 10 s while {SLOW} observers were unread")
        }
    }

    drop(unread);
    wait_released(&addr, &etcd_addr, "Observe", watchers_in_etcd).await;
    let after = settle(proxy.pid(), &etcd_addr, "after closing").await;
    let again = open_unread(&addr, observe).await;
    proclaim(&direct, &leader, 200).await;
    let with_again = settle(proxy.pid(), &etcd_addr, "unread observers again").await;
    assert_reused(before, with_slow, after, with_again);
    drop(again);
    wait_released(&addr, &etcd_addr, "Observe", watchers_in_etcd).await;
    eprintln!("took {:?}", started.elapsed());
}
