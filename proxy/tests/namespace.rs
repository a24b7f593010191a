//! `--namespace` against real etcd: two proxies with different prefixes in front of one etcd keep their clients'
//! keys apart (KV, Watch, the Lock and Election services, etcdctl's lock and elect recipes), every key lands in etcd
//! under its proxy's prefix, and a prefix ending in `0xff` never reaches the key after its namespace.

mod support;

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, EventType, GetOptions, LockOptions, ProclaimOptions,
    Txn, TxnOp, WatchOptions,
};
use testkit::{EtcdCluster, ProxyProcess};

/// A hang guard for single calls and waits: far above what any of them takes.
const DEADLINE: Duration = Duration::from_secs(30);

async fn connect(addr: &str) -> Client {
    tokio::time::timeout(DEADLINE, Client::connect([addr], None))
        .await
        .expect("connect in time")
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

async fn within<T>(what: &str, call: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(DEADLINE, call)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {DEADLINE:?}"))
}

/// Every key and value of the whole keyspace a client sees, in key order.
async fn everything(client: &mut Client) -> Vec<(Vec<u8>, Vec<u8>)> {
    let response = within(
        "range all",
        client.get("", Some(GetOptions::new().with_all_keys())),
    )
    .await
    .unwrap();
    response
        .kvs()
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
        .collect()
}

fn pairs(list: &[(&str, &str)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    list.iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

struct Two {
    _cluster: EtcdCluster,
    direct: Client,
    a: ProxyProcess,
    b: ProxyProcess,
}

async fn two_namespaces() -> Option<Two> {
    let etcd = support::etcd()?;
    let cluster = support::cluster(&etcd, 1, &[]).await;
    let a = support::proxy::start(&cluster.endpoints(), &["--namespace=/a/"]).await;
    let b = support::proxy::start(&cluster.endpoints(), &["--namespace=/b/"]).await;
    let direct = connect(&cluster.endpoint(0)).await;
    Some(Two {
        _cluster: cluster,
        direct,
        a,
        b,
    })
}

#[tokio::test]
async fn each_namespace_is_a_whole_keyspace_stored_under_its_prefix() {
    let Some(mut two) = two_namespaces().await else {
        return;
    };
    let (mut a, mut b) = (connect(&two.a.addr()).await, connect(&two.b.addr()).await);
    within("put", a.put("k", "in a", None)).await.unwrap();
    within("put", a.put("z", "in a", None)).await.unwrap();
    within("put", b.put("k", "in b", None)).await.unwrap();

    assert_eq!(
        everything(&mut a).await,
        pairs(&[("k", "in a"), ("z", "in a")])
    );
    assert_eq!(everything(&mut b).await, pairs(&[("k", "in b")]));
    assert_eq!(
        everything(&mut two.direct).await,
        pairs(&[("/a/k", "in a"), ("/a/z", "in a"), ("/b/k", "in b")])
    );

    // A Txn's comparisons and operations are on the namespace's keys, and so are the answers' keys.
    let txn = Txn::new()
        .when([Compare::value("k", CompareOp::Equal, "in a")])
        .and_then([
            TxnOp::put("k", "again", None),
            TxnOp::get("", Some(GetOptions::new().with_from_key())),
        ]);
    let answer = within("txn", a.txn(txn)).await.unwrap();
    assert!(answer.succeeded(), "a's k holds a's value, not b's");
    let read = match &answer.op_responses()[1] {
        etcd_client::TxnOpResponse::Get(get) => get.clone(),
        other => panic!("expected a get, got {other:?}"),
    };
    let keys: Vec<_> = read.kvs().iter().map(|kv| kv.key().to_vec()).collect();
    assert_eq!(keys, [b"k".to_vec(), b"z".to_vec()]);

    // Deleting "everything" in a deletes a's keys only.
    let deleted = within(
        "delete all",
        a.delete(
            "",
            Some(DeleteOptions::new().with_all_keys().with_prev_key()),
        ),
    )
    .await
    .unwrap();
    let gone: Vec<_> = deleted
        .prev_kvs()
        .iter()
        .map(|kv| kv.key().to_vec())
        .collect();
    assert_eq!(gone, [b"k".to_vec(), b"z".to_vec()]);
    assert_eq!(
        everything(&mut two.direct).await,
        pairs(&[("/b/k", "in b")])
    );

    // An empty key is refused as etcd refuses it, not turned into the prefix.
    let refused = within("put empty", a.put("", "v", None)).await.unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("etcdserver: key is not provided"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_watch_in_one_namespace_never_sees_anothers_events() {
    let Some(two) = two_namespaces().await else {
        return;
    };
    let (mut a, mut b) = (connect(&two.a.addr()).await, connect(&two.b.addr()).await);
    let mut events = within(
        "watch",
        a.watch(
            "",
            Some(WatchOptions::new().with_all_keys().with_prev_key()),
        ),
    )
    .await
    .unwrap();
    // etcd-client returns from `watch` once the stream is open, before the watcher exists: a write made before
    // the Created answer could precede the watcher's start and never be seen.
    let created = within("watch created", events.message())
        .await
        .unwrap()
        .expect("the watch stream stays open");
    assert!(created.created(), "{created:?}");
    // b writes first: were its event passed on, it would come first (events arrive in revision order).
    within("put", b.put("k", "b1", None)).await.unwrap();
    within("put", a.put("k", "a1", None)).await.unwrap();
    within("put", a.put("k", "a2", None)).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let response = within("watch event", events.message())
            .await
            .unwrap()
            .expect("the watch stream stays open");
        for event in response.events() {
            let kv = event.kv().unwrap();
            let prev = event
                .prev_kv()
                .map(|p| (p.key().to_vec(), p.value().to_vec()));
            assert_eq!(event.event_type(), EventType::Put);
            seen.push((kv.key().to_vec(), kv.value().to_vec(), prev));
        }
    }
    assert_eq!(
        seen,
        [
            (b"k".to_vec(), b"a1".to_vec(), None),
            (
                b"k".to_vec(),
                b"a2".to_vec(),
                Some((b"k".to_vec(), b"a1".to_vec()))
            ),
        ]
    );
}

#[tokio::test]
async fn a_prefix_ending_in_ff_reaches_neither_the_next_key_nor_outside() {
    let Some(etcd) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&etcd, 1, &[]).await;
    let flag = OsString::from_vec(b"--namespace=a\xff".to_vec());
    let bin = std::path::Path::new(support::proxy::PROXY_BIN);
    let proxy = ProxyProcess::start(bin, &cluster.endpoints(), &[flag])
        .await
        .unwrap_or_else(|e| panic!("start the proxy in namespace a\\xff: {e}"));
    let mut direct = connect(&cluster.endpoint(0)).await;
    for key in [&b"a"[..], b"a\xfe", b"b", b"b\x00", b"a\xff\xff", b"a\xffk"] {
        within("put", direct.put(key, "v", None)).await.unwrap();
    }
    let mut client = connect(&proxy.addr()).await;
    let seen: Vec<_> = everything(&mut client)
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    // etcd's Go proxy ends this namespace at "b\0" and met "b" here.
    assert_eq!(seen, [b"k".to_vec(), b"\xff".to_vec()]);
    let from_x = within(
        "from key",
        client.get("\u{1}", Some(GetOptions::new().with_from_key())),
    )
    .await
    .unwrap();
    let keys: Vec<_> = from_x.kvs().iter().map(|kv| kv.key().to_vec()).collect();
    assert_eq!(keys, [b"k".to_vec(), b"\xff".to_vec()]);
}

#[tokio::test]
async fn lock_and_election_services_are_namespaced() {
    let Some(mut two) = two_namespaces().await else {
        return;
    };
    let (mut a, mut b) = (connect(&two.a.addr()).await, connect(&two.b.addr()).await);
    let lease_a = within("grant", a.lease_grant(60, None)).await.unwrap().id();
    let lease_b = within("grant", b.lease_grant(60, None)).await.unwrap().id();

    // The same lock name in two namespaces: both are held at once.
    let held_a = within(
        "lock in a",
        a.lock("l", Some(LockOptions::new().with_lease(lease_a))),
    )
    .await
    .unwrap();
    let held_b = within(
        "lock in b while a holds its own",
        b.lock("l", Some(LockOptions::new().with_lease(lease_b))),
    )
    .await
    .unwrap();
    let key_a = held_a.key().to_vec();
    assert!(
        key_a.starts_with(b"l/"),
        "{:?}",
        String::from_utf8_lossy(&key_a)
    );
    let stored: Vec<_> = everything(&mut two.direct)
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert!(
        stored.contains(&[&b"/a/"[..], &key_a].concat()),
        "{stored:?}"
    );
    assert!(
        stored.contains(&[&b"/b/"[..], held_b.key()].concat()),
        "{stored:?}"
    );
    within("unlock", a.unlock(key_a)).await.unwrap();

    // The same election in two namespaces: each has its own leader.
    let won_a = within("campaign in a", a.campaign("e", "va", lease_a))
        .await
        .unwrap();
    within("campaign in b", b.campaign("e", "vb", lease_b))
        .await
        .unwrap();
    let leader_a = won_a.leader().expect("a leader").clone();
    assert_eq!(leader_a.name(), b"e");
    assert!(leader_a.key().starts_with(b"e/"));
    let proclaimed = ProclaimOptions::new().with_leader(leader_a.clone());
    within("proclaim", a.proclaim("va2", Some(proclaimed)))
        .await
        .unwrap();
    let now_a = within("leader in a", a.leader("e")).await.unwrap();
    let kv = now_a.kv().expect("a's leader");
    assert_eq!((kv.key(), kv.value()), (leader_a.key(), &b"va2"[..]));
    let now_b = within("leader in b", b.leader("e")).await.unwrap();
    assert_eq!(now_b.kv().expect("b's leader").value(), b"vb");
    let mut observed = within("observe in b", b.observe("e")).await.unwrap();
    let first = within("observe", observed.message())
        .await
        .unwrap()
        .expect("an answer");
    let kv = first.kv().expect("b's leader");
    assert!(kv.key().starts_with(b"e/") && kv.value() == b"vb");
}

#[tokio::test]
async fn etcdctl_lock_and_elect_through_two_namespaces_do_not_contend() {
    let Some(etcd) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&etcd, 1, &[]).await;
    let a = support::proxy::start(&cluster.endpoints(), &["--namespace=/a/"]).await;
    let b = support::proxy::start(&cluster.endpoints(), &["--namespace=/b/"]).await;
    let ctl = |proxy: &ProxyProcess| etcd.etcdctl(&proxy.addr());
    let mut holders = Vec::new();
    for proxy in [&a, &b] {
        let mut lock = ctl(proxy).spawn(&["lock", "m"]).unwrap();
        // etcdctl prints the lock's key once it holds it; in b it must not wait for a's holder.
        let lines = lock.wait_lines(1, DEADLINE).await.unwrap();
        assert!(lines[0].starts_with("m/"), "{lines:?}");
        holders.push(lock);
        let mut elect = ctl(proxy).spawn(&["elect", "x", "me"]).unwrap();
        let lines = elect.wait_lines(1, DEADLINE).await.unwrap();
        assert!(lines[0].starts_with("x/"), "{lines:?}");
        holders.push(elect);
    }
    let stored = etcd
        .etcdctl(&cluster.endpoint(0))
        .ok(&["get", "", "--from-key", "--keys-only"])
        .await;
    for prefix in ["/a/m/", "/b/m/", "/a/x/", "/b/x/"] {
        assert!(
            stored.lines().any(|l| l.starts_with(prefix)),
            "{prefix} in {stored}"
        );
    }
    for holder in holders {
        holder.terminate().await;
    }
}

#[tokio::test]
async fn a_range_stream_lists_the_namespace_only() {
    use proto::etcdserverpb::RangeRequest;
    use proto::etcdserverpb::kv_client::KvClient;
    use tokio_stream::StreamExt;

    let Some(mut two) = two_namespaces().await else {
        return;
    };
    for key in ["/a/1", "/a/2", "/a0", "/b/1", "0"] {
        within("put", two.direct.put(key, "v", None)).await.unwrap();
    }
    let mut kv = KvClient::new(support::grpc::channel(&two.a.addr()).await);
    let request = RangeRequest {
        key: vec![0],
        range_end: vec![0],
        ..Default::default()
    };
    let mut chunks = within("range stream", kv.range_stream(request))
        .await
        .unwrap()
        .into_inner();
    let mut keys = Vec::new();
    while let Some(chunk) = within("a chunk", chunks.next()).await {
        let range = chunk.unwrap().range_response.expect("a range answer");
        keys.extend(range.kvs.iter().map(|kv| kv.key.to_vec()));
    }
    assert_eq!(keys, [b"1".to_vec(), b"2".to_vec()]);
}
