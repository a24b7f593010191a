//! `--grpc-keepalive-min-time` against the real binary: a client that pings more often than allowed gets HTTP/2
//! GOAWAY `ENHANCE_YOUR_CALM` "too_many_pings" and the end of its connection, as grpc-go servers (etcd, etcd's
//! proxy) send it; one that keeps to the interval is answered for as long as it likes; other clients never notice.

mod support;

use std::time::Duration;

use proto::etcdserverpb::RangeRequest;
use proto::etcdserverpb::kv_client::KvClient;
use support::net::{RawFrame, RawHttp2};

const ACK: u8 = 0x1;
const ENHANCE_YOUR_CALM: u32 = 0xb;
/// Generous: each frame here is answered by the proxy at once; this only stops a broken proxy hanging the test.
const PATIENCE: Duration = Duration::from_secs(10);

async fn next(conn: &mut RawHttp2) -> Option<RawFrame> {
    tokio::time::timeout(PATIENCE, conn.next_frame())
        .await
        .expect("the proxy answers within the deadline")
}

/// Frames until the acknowledgement of ping `data`; panics on GOAWAY or the end of the connection.
async fn await_pong(conn: &mut RawHttp2, data: u64) {
    loop {
        let frame = next(conn).await.expect("connection still open");
        assert_ne!(frame.kind, RawHttp2::GOAWAY, "unexpected GOAWAY: {frame:?}");
        if frame.kind == RawHttp2::PING && frame.flags & ACK != 0 {
            assert_eq!(frame.payload, data.to_be_bytes());
            return;
        }
    }
}

async fn still_serves(addr: &str) {
    let mut kv = KvClient::new(support::grpc::channel(addr).await);
    kv.range(RangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    })
    .await
    .expect("another client is served");
}

#[tokio::test]
async fn a_ping_flood_gets_goaway_too_many_pings_under_default_flags() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let mut flood = RawHttp2::connect(&proxy.addr()).await;
    for i in 0..4 {
        flood.ping(i).await;
    }
    // The first ping is answered; the fourth is the third strike (grpc-go's limit is two).
    let goaway = loop {
        let frame = next(&mut flood).await.expect("a GOAWAY before the end");
        if frame.kind == RawHttp2::GOAWAY {
            break frame;
        }
    };
    assert_eq!(goaway.stream, 0);
    let code = u32::from_be_bytes(goaway.payload[4..8].try_into().unwrap());
    assert_eq!(code, ENHANCE_YOUR_CALM);
    assert_eq!(&goaway.payload[8..], b"too_many_pings");
    assert!(next(&mut flood).await.is_none(), "GOAWAY is the last frame");
    still_serves(&proxy.addr()).await;
}

#[tokio::test]
async fn pings_at_the_minimum_interval_during_a_call_are_answered() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let min_time = Duration::from_millis(100);
    let proxy = support::proxy::start(
        &etcd.endpoints(),
        &[&format!(
            "--grpc-keepalive-min-time={}ms",
            min_time.as_millis()
        )],
    )
    .await;
    let mut conn = RawHttp2::connect(&proxy.addr()).await;
    conn.open_call(1, "/etcdserverpb.Watch/Watch").await;
    // Four times the minimum apart as sent, so that they still arrive more than the minimum apart.
    for i in 0..6 {
        conn.ping(i).await;
        await_pong(&mut conn, i).await;
        tokio::time::sleep(min_time * 4).await;
    }
}

#[tokio::test]
async fn the_same_pings_without_a_call_are_too_many() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy =
        support::proxy::start(&etcd.endpoints(), &["--grpc-keepalive-min-time=100ms"]).await;
    let mut conn = RawHttp2::connect(&proxy.addr()).await;
    for i in 0..3 {
        conn.ping(i).await;
        await_pong(&mut conn, i).await;
    }
    conn.ping(3).await;
    let mut saw_goaway = false;
    while let Some(frame) = next(&mut conn).await {
        saw_goaway |= frame.kind == RawHttp2::GOAWAY && frame.payload.ends_with(b"too_many_pings");
    }
    assert!(
        saw_goaway,
        "grpc-go allows one ping in two hours without a call"
    );
}
