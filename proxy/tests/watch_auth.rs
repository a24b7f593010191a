//! Watches under etcd auth: upstream watch streams are shared only between callers with the same token, so a
//! caller's watch never depends on another caller's token staying valid (the Go proxy's shared stream fails once
//! the token of whoever opened it expires).

mod support;

use std::time::Duration;

use proto::etcdserverpb::auth_client::AuthClient;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::watch_request::RequestUnion;
use proto::etcdserverpb::{
    AuthenticateRequest, PutRequest, RangeRequest, WatchCreateRequest, WatchRequest, WatchResponse,
};
use support::ctl::etcdctl_ok;
use support::grpc::{channel, with_meta};
use support::{EtcdCluster, Proxy};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;

const DEADLINE: Duration = Duration::from_secs(30);

async fn token(addr: &str, name: &str, password: &str) -> String {
    let request = AuthenticateRequest {
        name: name.into(),
        password: password.into(),
    };
    AuthClient::new(channel(addr).await)
        .authenticate(request)
        .await
        .unwrap()
        .into_inner()
        .token
}

/// Opens a Watch stream with `token` and creates one watcher on `key`; returns the stream and the create answer.
async fn watch_with(
    addr: &str,
    token: &str,
    key: &str,
) -> (
    mpsc::Sender<WatchRequest>,
    Streaming<WatchResponse>,
    WatchResponse,
) {
    let (tx, rx) = mpsc::channel(4);
    let create = WatchCreateRequest {
        key: key.into(),
        ..Default::default()
    };
    tx.send(WatchRequest {
        request_union: Some(RequestUnion::CreateRequest(create)),
    })
    .await
    .unwrap();
    let mut responses = WatchClient::new(channel(addr).await)
        .watch(with_meta(ReceiverStream::new(rx), "token", token))
        .await
        .unwrap()
        .into_inner();
    let answer = next(&mut responses).await;
    (tx, responses, answer)
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
    if !support::etcd_available() {
        return;
    }
    let etcd = EtcdCluster::start_with_args(1, &["--auth-token-ttl=2"]).await;
    let ep = etcd.endpoint(0);
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "reader:readerpw"],
        &["role", "add", "readk"],
        &["role", "grant-permission", "readk", "read", "k"],
        &["user", "grant-role", "reader", "readk"],
        &["auth", "enable"],
    ] {
        etcdctl_ok(&ep, args).await;
    }
    let proxy = Proxy::start(&etcd.endpoints(), &[]).await;
    let addr = proxy.addr();

    let first = token(&addr, "reader", "readerpw").await;
    let (_keep_a, mut stream_a, created_a) = watch_with(&addr, &first, "k").await;
    assert!(created_a.created && !created_a.canceled, "{created_a:?}");

    // etcd forgets a simple token after `--auth-token-ttl` seconds without use; every use renews it, so the only
    // way to let it expire is to leave it alone that long. Then check, once, that it is gone.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let read = KvClient::new(channel(&ep).await)
        .range(with_meta(
            RangeRequest {
                key: b"k".to_vec(),
                ..Default::default()
            },
            "token",
            &first,
        ))
        .await;
    assert!(
        matches!(&read, Err(status) if status.message().contains("invalid auth token")),
        "the first token should have expired: {read:?}"
    );

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
    let shape = |r: &WatchResponse| (r.created, r.canceled, r.cancel_reason.clone());
    assert_eq!(shape(&proxy_refusal), shape(&direct_refusal));

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
