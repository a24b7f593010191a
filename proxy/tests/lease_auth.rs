//! Lease keep-alives under etcd auth. etcd 3.5.30 (and every later release) checks each renewal's token: a renewal
//! without one is refused with "user name is empty", and a user may renew only leases whose keys it may write. So
//! the proxy's coalesced keep-alive must carry each caller's own token upstream and answer each caller as etcd
//! answers that caller directly. (Older etcd renews any lease for anyone; the comparison holds there too.)

mod support;

use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest, PutRequest};
use support::grpc::{channel, status, token, with_meta};
use tokio_stream::StreamExt;

const DEADLINE: Duration = Duration::from_secs(20);

/// `request` with `token` attached, or none if it is empty.
fn as_caller<T>(request: T, token: &str) -> tonic::Request<T> {
    if token.is_empty() {
        tonic::Request::new(request)
    } else {
        with_meta(request, "token", token)
    }
}

/// Opens a keep-alive stream to `addr` with `token` and renews `lease` once: the TTL etcd answered, or the status
/// the stream ended with, as "Code: message".
async fn renew_once(addr: &str, token: &str, lease: i64) -> Result<i64, String> {
    let requests =
        tokio_stream::iter([LeaseKeepAliveRequest { id: lease }]).chain(tokio_stream::pending());
    let call = async {
        let mut answers = LeaseClient::new(channel(addr).await)
            .lease_keep_alive(as_caller(requests, token))
            .await
            .map_err(|s| status(&s))?
            .into_inner();
        match answers.next().await {
            Some(Ok(answer)) => Ok(answer.ttl),
            Some(Err(s)) => Err(status(&s)),
            None => Err("the stream ended without an answer".to_string()),
        }
    };
    tokio::time::timeout(DEADLINE, call)
        .await
        .unwrap_or_else(|_| panic!("no answer to a renewal on {addr} within {DEADLINE:?}"))
}

/// Adds root and `writer`, who may read and write `w/...`, then runs `more` (etcdctl arguments) and enables auth.
async fn enable_auth_with_writer(etcd: &testkit::EtcdCluster, more: &[&[&str]]) {
    let writer: [&[&str]; 5] = [
        &["user", "add", "root:rootpw"],
        &["user", "add", "writer:writerpw"],
        &["role", "add", "write-w"],
        &[
            "role",
            "grant-permission",
            "write-w",
            "readwrite",
            "w/",
            "--prefix",
        ],
        &["user", "grant-role", "writer", "write-w"],
    ];
    for args in writer
        .iter()
        .chain(more)
        .chain([&["auth", "enable"][..]].iter())
    {
        etcd.etcdctl(0).ok(args).await;
    }
}

/// Grants a lease of 60 seconds as `token` on `addr` and attaches `key` to it.
async fn lease_with_key(addr: &str, token: &str, key: &str) -> i64 {
    let ch = channel(addr).await;
    let lease = LeaseClient::new(ch.clone())
        .lease_grant(as_caller(LeaseGrantRequest { ttl: 60, id: 0 }, token))
        .await
        .unwrap()
        .into_inner()
        .id;
    KvClient::new(ch)
        .put(as_caller(
            PutRequest {
                key: key.into(),
                value: b"v".to_vec(),
                lease,
                ..Default::default()
            },
            token,
        ))
        .await
        .unwrap();
    lease
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_caller_renews_through_the_proxy_exactly_as_etcd_lets_it_renew_directly() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let ep = etcd.endpoint(0);
    let reader: [&[&str]; 4] = [
        &["user", "add", "reader:readerpw"],
        &["role", "add", "read-w"],
        &[
            "role",
            "grant-permission",
            "read-w",
            "read",
            "w/",
            "--prefix",
        ],
        &["user", "grant-role", "reader", "read-w"],
    ];
    enable_auth_with_writer(&etcd, &reader).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let addr = proxy.addr();

    let writer = token(&ep, "writer", "writerpw").await;
    let reader = token(&ep, "reader", "readerpw").await;
    let lease = lease_with_key(&ep, &writer, "w/1").await;

    // The writer may write the lease's key; the reader may not; a caller without a token is nobody.
    let callers = [
        ("writer", &writer[..]),
        ("reader", &reader[..]),
        ("no token", ""),
    ];
    let mut renewed_by_writer = false;
    for (who, token) in callers {
        let direct = renew_once(&ep, token, lease).await;
        let proxied = renew_once(&addr, token, lease).await;
        assert_eq!(
            proxied.as_ref().map(|ttl| *ttl > 0),
            direct.as_ref().map(|ttl| *ttl > 0),
            "{who}: through the proxy {proxied:?}, directly {direct:?}"
        );
        if let Err(direct) = &direct {
            assert_eq!(proxied.as_ref().unwrap_err(), direct, "{who}");
        }
        renewed_by_writer |= who == "writer" && direct.is_ok();
    }
    assert!(
        renewed_by_writer,
        "etcd refused the lease's own writer a renewal"
    );
}

/// A keep-alive stream through `addr` as `token`, fed one request at a time.
struct KeepAlive {
    requests: tokio::sync::mpsc::Sender<LeaseKeepAliveRequest>,
    answers: tonic::Streaming<proto::etcdserverpb::LeaseKeepAliveResponse>,
}

impl KeepAlive {
    async fn open(addr: &str, token: &str) -> Self {
        let (requests, rx) = tokio::sync::mpsc::channel(4);
        let answers = LeaseClient::new(channel(addr).await)
            .lease_keep_alive(as_caller(
                tokio_stream::wrappers::ReceiverStream::new(rx),
                token,
            ))
            .await
            .expect("a keep-alive stream through the proxy")
            .into_inner();
        Self { requests, answers }
    }

    async fn send(&self, lease: i64) {
        self.requests
            .send(LeaseKeepAliveRequest { id: lease })
            .await
            .expect("the stream takes requests");
    }

    /// The next answer's TTL, or the status the stream ended with, as "Code: message".
    async fn answer(&mut self) -> Result<i64, String> {
        match tokio::time::timeout(DEADLINE, self.answers.next()).await {
            Err(_) => panic!("no answer through the proxy within {DEADLINE:?}"),
            Ok(Some(Ok(answer))) => Ok(answer.ttl),
            Ok(Some(Err(s))) => Err(status(&s)),
            Ok(None) => Err("the stream ended without an answer".to_string()),
        }
    }
}

/// The renewals the proxy has sent upstream.
async fn forwarded(proxy: &testkit::ProxyProcess) -> f64 {
    let text = proxy.metrics().await;
    support::metrics::value(&text, "etcd_grpc_proxy_lease_renewals_forwarded_total", &[])
        .expect("the proxy counts forwarded renewals")
}

/// One client's two keep-alive streams share its token, so the proxy renews for both on one upstream stream. One
/// renews a lease whose key the client may not write, which etcd 3.5.30 refuses by ending the stream; the other a
/// lease of its own. Both renewals are in flight upstream when etcd answers (etcd is paused while they go out).
/// Each stream is answered as etcd answers it directly: the refused one ends with etcd's error, the other is
/// renewed. (Before 3.5.30 etcd renews both; the comparison holds there too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_renewal_ends_only_its_own_stream_not_another_stream_with_the_same_token() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let ep = etcd.endpoint(0);
    enable_auth_with_writer(&etcd, &[]).await;
    let root = token(&ep, "root", "rootpw").await;
    let writer = token(&ep, "writer", "writerpw").await;
    // Granted first, so its ID is the lower: sent in one batch with the other, it goes first, and etcd, which
    // answers a stream's requests in order, refuses it before it reads the other.
    let forbidden = lease_with_key(&ep, &root, "x/1").await;
    let own = lease_with_key(&ep, &writer, "w/1").await;
    let direct_forbidden = renew_once(&ep, &writer, forbidden).await;
    let direct_own = renew_once(&ep, &writer, own).await;
    assert!(
        direct_own.is_ok(),
        "etcd refused the writer its own lease: {direct_own:?}"
    );

    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let addr = proxy.addr();
    let mut refused = KeepAlive::open(&addr, &writer).await;
    let mut renewed = KeepAlive::open(&addr, &writer).await;
    // The upstream stream is open before etcd pauses.
    renewed.send(own).await;
    assert!(renewed.answer().await.is_ok_and(|ttl| ttl > 0));
    let before = forwarded(&proxy).await;

    etcd.pause(0);
    refused.send(forbidden).await;
    testkit::wait_for("the refused renewal to go upstream", DEADLINE, || async {
        let sent = forwarded(&proxy).await;
        (sent > before)
            .then_some(())
            .ok_or(format!("{sent} forwarded"))
    })
    .await;
    renewed.send(own).await;
    testkit::wait_for("both renewals to go upstream", DEADLINE, || async {
        let sent = forwarded(&proxy).await;
        (sent > before + 1.0)
            .then_some(())
            .ok_or(format!("{sent} forwarded"))
    })
    .await;
    etcd.resume(0);

    let through_refused = refused.answer().await;
    let through_renewed = renewed.answer().await;
    assert_eq!(
        through_refused.as_ref().map(|ttl| *ttl > 0),
        direct_forbidden.as_ref().map(|ttl| *ttl > 0),
        "the stream renewing the forbidden lease: through the proxy {through_refused:?}, directly {direct_forbidden:?}"
    );
    if let Err(direct) = &direct_forbidden {
        assert_eq!(through_refused.as_ref().unwrap_err(), direct);
    }
    assert!(
        through_renewed.as_ref().is_ok_and(|ttl| *ttl > 0),
        "the other stream with the same token, renewing the writer's own lease: {through_renewed:?}"
    );
}
