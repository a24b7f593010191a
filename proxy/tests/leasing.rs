//! `--experimental-leasing-prefix` against real etcd: a linearizable read takes ownership of its key (the ownership
//! key `P+key` under the proxy's session lease) and later reads are answered locally; a plain client's direct write
//! still reaches those reads (the key's watcher); a second proxy on the same prefix revokes the first's ownership
//! when it writes, and the first proxy's next read sees that write at once (Put and DeleteRange alike); and a session
//! that can no longer be known alive (etcd unreachable past the lease's TTL) answers nothing locally (etcd #19091)
//! and holds no key, as does a session whose lease was revoked; under auth an owned key is answered only to users
//! etcd lets read it.

mod support;

use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::{DeleteRangeRequest, LeaseRevokeRequest, PutRequest, RangeRequest};
use support::metrics;
use testkit::wait_for;
use tonic::transport::Channel;

const PREFIX: &str = "--experimental-leasing-prefix=/lease/";
/// Without the range cache, every read the protocol does not answer goes to etcd.
const NO_CACHE: &str = "--range-cache-max-bytes=0";
/// A hang guard, far above an event's delivery on loopback.
const GUARD: Duration = Duration::from_secs(20);

async fn put(client: &KvClient<Channel>, key: &str, value: &str) {
    let request = PutRequest {
        key: key.into(),
        value: value.into(),
        ..Default::default()
    };
    client.clone().put(request).await.expect("put");
}

/// A linearizable read of `key`: its value, or `None` when it does not exist.
async fn get(client: &KvClient<Channel>, key: &str) -> Option<Vec<u8>> {
    let request = RangeRequest {
        key: key.into(),
        ..Default::default()
    };
    let answer = client
        .clone()
        .range(request)
        .await
        .expect("range")
        .into_inner();
    answer.kvs.first().map(|kv| kv.value.to_vec())
}

/// The ownership key of `key` as etcd has it: its lease, or `None` when nobody owns the key.
async fn owner(direct: &KvClient<Channel>, key: &str) -> Option<i64> {
    let request = RangeRequest {
        key: format!("/lease/{key}").into(),
        ..Default::default()
    };
    let answer = direct
        .clone()
        .range(request)
        .await
        .expect("range")
        .into_inner();
    answer.kvs.first().map(|kv| kv.lease)
}

fn local_reads(text: &str) -> f64 {
    metrics::value(text, "etcd_grpc_proxy_leasing_local_reads_total", &[]).unwrap_or(0.0)
}

fn owned_keys(text: &str) -> f64 {
    metrics::value(text, "etcd_grpc_proxy_leasing_owned_keys", &[]).unwrap_or(0.0)
}

/// Reads `key` through `through` until the read is answered locally (once the session is up, the key acquired
/// and its watcher confirmed); returns the value.
async fn owned_read(
    proxy: &testkit::ProxyProcess,
    through: &KvClient<Channel>,
    key: &str,
) -> Option<Vec<u8>> {
    wait_for("a read answered locally", GUARD, || async {
        let before = local_reads(&proxy.metrics().await);
        let value = get(through, key).await;
        if local_reads(&proxy.metrics().await) > before {
            Ok(value)
        } else {
            Err("answered by etcd".to_string())
        }
    })
    .await
}

async fn client(addr: &str) -> KvClient<Channel> {
    KvClient::new(support::grpc::channel(addr).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owned_key_is_read_locally_and_a_plain_writers_write_still_reaches_it() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&cluster.endpoints(), &[PREFIX, NO_CACHE]).await;
    let direct = client(&cluster.addr(0)).await;
    let through = client(&proxy.addr()).await;

    put(&direct, "k", "v1").await;
    assert_eq!(
        owned_read(&proxy, &through, "k").await.as_deref(),
        Some(&b"v1"[..])
    );
    assert!(
        owner(&direct, "k").await.is_some_and(|lease| lease != 0),
        "the ownership key is under the proxy's session lease"
    );
    let before = local_reads(&proxy.metrics().await);
    for _ in 0..10 {
        assert_eq!(get(&through, "k").await.as_deref(), Some(&b"v1"[..]));
    }
    assert_eq!(
        local_reads(&proxy.metrics().await) - before,
        10.0,
        "every read of the owned key is answered without etcd"
    );

    // A client that knows nothing of leasing writes on etcd directly: the key's watcher brings the write.
    put(&direct, "k", "v2").await;
    wait_for("the plain write through the owned key", GUARD, || async {
        match get(&through, "k").await {
            Some(v) if v == b"v2" => Ok(()),
            other => Err(format!("still {other:?}")),
        }
    })
    .await;
    assert_eq!(owned_keys(&proxy.metrics().await), 1.0, "still owned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_proxy_on_the_prefix_revokes_the_first_when_it_writes() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    let first = support::proxy::start(&cluster.endpoints(), &[PREFIX, NO_CACHE]).await;
    let second = support::proxy::start(&cluster.endpoints(), &[PREFIX, NO_CACHE]).await;
    let direct = client(&cluster.addr(0)).await;
    let (a, b) = (client(&first.addr()).await, client(&second.addr()).await);

    put(&direct, "k", "v1").await;
    assert_eq!(
        owned_read(&first, &a, "k").await.as_deref(),
        Some(&b"v1"[..])
    );
    // The second proxy's write revokes the first's ownership and waits for it to go before it writes.
    put(&b, "k", "v2").await;
    assert_eq!(
        get(&a, "k").await.as_deref(),
        Some(&b"v2"[..]),
        "the first proxy's next read sees the write at once"
    );
    assert_ne!(owner(&direct, "k").await, Some(0));

    // And the other way round, with a delete of a range holding the owned key.
    assert_eq!(
        owned_read(&second, &b, "k").await.as_deref(),
        Some(&b"v2"[..])
    );
    let delete = DeleteRangeRequest {
        key: "j".into(),
        range_end: "l".into(),
        ..Default::default()
    };
    a.clone().delete_range(delete).await.expect("delete");
    assert_eq!(get(&b, "k").await, None, "the deletion is seen at once");
    assert_eq!(
        owned_keys(&second.metrics().await),
        0.0,
        "the revoked key is given up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_not_known_alive_answers_nothing_locally_and_holds_nothing() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(
        &cluster.endpoints(),
        &[PREFIX, NO_CACHE, "--experimental-leasing-ttl=3"],
    )
    .await;
    let direct = client(&cluster.addr(0)).await;
    let through = client(&proxy.addr()).await;

    // The session's lease revoked behind the proxy's back: its keys are no longer owned.
    put(&direct, "k", "v1").await;
    owned_read(&proxy, &through, "k").await;
    let lease = owner(&direct, "k").await.expect("owned");
    let mut leases = LeaseClient::new(support::grpc::channel(&cluster.addr(0)).await);
    leases
        .lease_revoke(LeaseRevokeRequest { id: lease })
        .await
        .expect("revoke");
    wait_for("the key given up", GUARD, || async {
        match owned_keys(&proxy.metrics().await) {
            0.0 => Ok(()),
            n => Err(format!("{n} owned")),
        }
    })
    .await;

    // A new session owns it again; then etcd stops answering (etcd #19091): once the lease can no longer be known
    // alive, no read is answered locally.
    assert_eq!(
        owned_read(&proxy, &through, "k").await.as_deref(),
        Some(&b"v1"[..])
    );
    cluster.pause(0);
    wait_for("the session given up", GUARD, || async {
        match owned_keys(&proxy.metrics().await) {
            0.0 => Ok(()),
            n => Err(format!("{n} owned")),
        }
    })
    .await;
    let before = local_reads(&proxy.metrics().await);
    let mut read = tonic::Request::new(RangeRequest {
        key: "k".into(),
        ..Default::default()
    });
    read.set_timeout(Duration::from_secs(1));
    let refused = through.clone().range(read).await;
    assert!(
        refused.is_err(),
        "answered while etcd is unreachable: {refused:?}"
    );
    assert_eq!(local_reads(&proxy.metrics().await), before);
    cluster.resume(0);
}

async fn authenticate(addr: &str, name: &str, password: &str) -> String {
    let request = proto::etcdserverpb::AuthenticateRequest {
        name: name.into(),
        password: password.into(),
    };
    proto::etcdserverpb::auth_client::AuthClient::new(support::grpc::channel(addr).await)
        .authenticate(request)
        .await
        .expect("authenticate")
        .into_inner()
        .token
}

async fn get_as(
    client: &KvClient<Channel>,
    token: &str,
    key: &str,
) -> Result<Option<Vec<u8>>, tonic::Status> {
    let request = RangeRequest {
        key: key.into(),
        ..Default::default()
    };
    let request = support::grpc::with_meta(request, "token", token);
    let answer = client.clone().range(request).await?.into_inner();
    Ok(answer.kvs.first().map(|kv| kv.value.to_vec()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_auth_an_owned_key_is_answered_only_to_users_etcd_lets_read_it() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    let ep = cluster.endpoint(0);
    let direct = client(&cluster.addr(0)).await;
    put(&direct, "s/1", "secret").await;
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "reader:readerpw"],
        &["user", "add", "other:otherpw"],
        &["role", "add", "reads"],
        &["role", "grant-permission", "reads", "read", "s/", "s0"],
        // Taking ownership writes the ownership key with the reader's token.
        &[
            "role",
            "grant-permission",
            "reads",
            "readwrite",
            "/lease/",
            "/lease0",
        ],
        &["user", "grant-role", "reader", "reads"],
        &["auth", "enable"],
    ] {
        cluster.etcdctl(0).ok(args).await;
    }
    let proxy = support::proxy::start(
        &cluster.endpoints(),
        &[PREFIX, NO_CACHE, "--user=root:rootpw"],
    )
    .await;
    let through = client(&proxy.addr()).await;
    let reader = authenticate(&proxy.addr(), "reader", "readerpw").await;
    let other = authenticate(&proxy.addr(), "other", "otherpw").await;
    let refused = get_as(&direct, &authenticate(&ep, "other", "otherpw").await, "s/1")
        .await
        .expect_err("etcd refuses a user without the permission");

    wait_for("the reader answered locally", GUARD, || async {
        let before = local_reads(&proxy.metrics().await);
        let value = get_as(&through, &reader, "s/1")
            .await
            .expect("the reader reads");
        assert_eq!(value.as_deref(), Some(&b"secret"[..]));
        match local_reads(&proxy.metrics().await) > before {
            true => Ok(()),
            false => Err("answered by etcd".to_string()),
        }
    })
    .await;
    let before = local_reads(&proxy.metrics().await);
    for _ in 0..3 {
        let status = get_as(&through, &other, "s/1")
            .await
            .expect_err("the other user must not read the owned key");
        assert_eq!(
            (status.code(), status.message()),
            (refused.code(), refused.message())
        );
    }
    let anonymous = through
        .clone()
        .range(RangeRequest {
            key: "s/1".into(),
            ..Default::default()
        })
        .await
        .expect_err("a read without a token is refused as etcd refuses it");
    assert_eq!(
        anonymous.code(),
        tonic::Code::InvalidArgument,
        "{anonymous:?}"
    );
    assert_eq!(
        local_reads(&proxy.metrics().await),
        before,
        "nothing more answered locally"
    );
}
