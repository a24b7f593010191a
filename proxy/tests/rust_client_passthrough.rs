//! The `etcd-client` crate gets the same results through the proxy as from etcd directly.
//!
//! Each test runs one scenario twice, against a fresh etcd used directly and against a fresh
//! etcd behind the proxy (see `support::pair`), records a transcript of everything observable
//! (keys, values, revisions, versions, counts, error codes and messages; IDs only as "same as
//! before" facts, since they differ between clusters) and asserts both transcripts are equal.

mod support;

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, Error, EventType, GetOptions,
    KeyValue, LeaseTimeToLiveOptions, LockOptions, Permission, PutOptions, SortOrder, SortTarget,
    Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use support::pair::Pair;

/// A hang guard for single calls: far above what any call here takes.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

async fn connect(endpoint: &str, user: Option<(&str, &str)>) -> Client {
    let mut opts = ConnectOptions::new().with_connect_timeout(Duration::from_secs(5));
    if let Some((name, password)) = user {
        opts = opts.with_user(name, password);
    }
    tokio::time::timeout(CALL_TIMEOUT, Client::connect([endpoint], Some(opts)))
        .await
        .unwrap_or_else(|_| panic!("connect to {endpoint}: no answer within {CALL_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("connect to {endpoint} as {user:?}: {e}"))
}

/// A gRPC error as "Code: message" (the part clients see and etcd defines).
fn err(e: &Error) -> String {
    match e {
        Error::GRpcStatus(s) => format!("error {:?}: {}", s.code(), s.message()),
        other => format!("error (not a gRPC status): {other}"),
    }
}

fn kv(kv: &KeyValue) -> String {
    format!(
        "{}={} (create {}, mod {}, version {}, lease {})",
        String::from_utf8_lossy(kv.key()),
        String::from_utf8_lossy(kv.value()),
        kv.create_revision(),
        kv.mod_revision(),
        kv.version(),
        if kv.lease() == 0 { "none" } else { "some" }
    )
}

fn kvs(list: &[KeyValue]) -> String {
    let items: Vec<String> = list.iter().map(kv).collect();
    format!("[{}]", items.join(", "))
}

/// Records `what: result` where the result is formatted by `show` or is an error.
fn rec<T>(t: &mut Vec<String>, what: &str, r: Result<T, Error>, show: impl FnOnce(&T) -> String) {
    let line = match &r {
        Ok(v) => format!("{what}: {}", show(v)),
        Err(e) => format!("{what}: {}", err(e)),
    };
    t.push(line);
}

fn revision<H>(header: Option<&H>, rev: impl Fn(&H) -> i64) -> i64 {
    header.map_or(-1, rev)
}

async fn kv_and_txn(endpoint: &str) -> Vec<String> {
    let mut c = connect(endpoint, None).await;
    let mut t = Vec::new();
    for (k, v) in [
        ("foo", "1"),
        ("foo1", "2"),
        ("foo2", "3"),
        ("zoo", "4"),
        ("foo", "5"),
    ] {
        let r = c.put(k, v, Some(PutOptions::new().with_prev_key())).await;
        rec(&mut t, &format!("put {k}={v}"), r, |r| {
            format!(
                "rev {} prev {:?}",
                revision(r.header(), |h| h.revision()),
                r.prev_key().map(kv)
            )
        });
    }
    let cases: Vec<(&str, &str, Option<GetOptions>)> = vec![
        ("get foo", "foo", None),
        ("get prefix", "foo", Some(GetOptions::new().with_prefix())),
        (
            "get from-key",
            "foo1",
            Some(GetOptions::new().with_from_key()),
        ),
        (
            "get limit",
            "foo",
            Some(GetOptions::new().with_prefix().with_limit(2)),
        ),
        (
            "get sorted",
            "",
            Some(
                GetOptions::new()
                    .with_all_keys()
                    .with_sort(SortTarget::Mod, SortOrder::Descend),
            ),
        ),
        ("get rev 2", "foo", Some(GetOptions::new().with_revision(2))),
        (
            "get keys-only",
            "foo",
            Some(GetOptions::new().with_prefix().with_keys_only()),
        ),
        (
            "get count-only",
            "foo",
            Some(GetOptions::new().with_prefix().with_count_only()),
        ),
        (
            "get serializable",
            "foo",
            Some(GetOptions::new().with_serializable()),
        ),
        ("get missing", "nope", None),
    ];
    for (what, key, opts) in cases {
        let r = c.get(key, opts).await;
        rec(&mut t, what, r, |r| {
            format!(
                "rev {} count {} more {} {}",
                revision(r.header(), |h| h.revision()),
                r.count(),
                r.more(),
                kvs(r.kvs())
            )
        });
    }
    let r = c
        .delete("foo2", Some(DeleteOptions::new().with_prev_key()))
        .await;
    rec(&mut t, "delete foo2", r, |r| {
        format!("deleted {} prev {}", r.deleted(), kvs(r.prev_kvs()))
    });
    let r = c
        .delete("foo", Some(DeleteOptions::new().with_prefix()))
        .await;
    rec(&mut t, "delete prefix foo", r, |r| {
        format!("deleted {}", r.deleted())
    });

    c.put("t1", "a", None).await.expect("put t1");
    let txn = |cmp: Vec<Compare>| {
        Txn::new()
            .when(cmp)
            .and_then([
                TxnOp::put("t2", "yes", None),
                TxnOp::get("t1", None),
                TxnOp::delete("zoo", None),
            ])
            .or_else([
                TxnOp::put("t3", "no", None),
                TxnOp::get("t", Some(GetOptions::new().with_prefix())),
            ])
    };
    let txns = [
        (
            "txn success",
            vec![
                Compare::value("t1", CompareOp::Equal, "a"),
                Compare::version("t1", CompareOp::Equal, 1),
                Compare::create_revision("t1", CompareOp::Greater, 0),
                Compare::mod_revision("t1", CompareOp::Less, 1000),
            ],
        ),
        (
            "txn failure",
            vec![Compare::value("t1", CompareOp::NotEqual, "a")],
        ),
    ];
    for (what, cmp) in txns {
        let r = c.txn(txn(cmp)).await;
        rec(&mut t, what, r, |r| {
            let ops: Vec<String> = r
                .op_responses()
                .iter()
                .map(|op| match op {
                    TxnOpResponse::Put(p) => {
                        format!("put rev {}", revision(p.header(), |h| h.revision()))
                    }
                    TxnOpResponse::Get(g) => format!("get {}", kvs(g.kvs())),
                    TxnOpResponse::Delete(d) => format!("delete {}", d.deleted()),
                    TxnOpResponse::Txn(_) => "txn".to_string(),
                })
                .collect();
            format!(
                "succeeded {} rev {} ops {ops:?}",
                r.succeeded(),
                revision(r.header(), |h| h.revision())
            )
        });
    }

    let rev = c
        .get("t1", None)
        .await
        .expect("get t1")
        .header()
        .expect("header")
        .revision();
    let r = c.compact(rev - 1, None).await;
    rec(&mut t, "compact", r, |r| {
        format!("rev {}", revision(r.header(), |h| h.revision()))
    });
    let r = c.get("t1", Some(GetOptions::new().with_revision(2))).await;
    rec(&mut t, "get compacted rev", r, |r| kvs(r.kvs()));
    let r = c
        .get("t1", Some(GetOptions::new().with_revision(rev + 50)))
        .await;
    rec(&mut t, "get future rev", r, |r| kvs(r.kvs()));
    let r = c.put("", "v", None).await;
    rec(&mut t, "put empty key", r, |_| "ok".to_string());
    let r = c.compact(rev - 1, None).await;
    rec(&mut t, "compact again", r, |_| "ok".to_string());
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_txn_and_compaction_results_match_direct_etcd() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let p = Pair::start(&binaries, &[]).await;
    let a = kv_and_txn(&p.direct).await;
    let b = kv_and_txn(&p.other).await;
    p.assert_same("kv and txn", &a, &b);
    assert!(
        a.iter()
            .any(|l| l.starts_with("get compacted rev: error OutOfRange")),
        "{a:#?}"
    );
}

async fn watch(endpoint: &str) -> Vec<String> {
    let mut c = connect(endpoint, None).await;
    let mut t = Vec::new();
    let first = c
        .put("w/a", "1", None)
        .await
        .expect("put")
        .header()
        .expect("header")
        .revision();
    let opts = WatchOptions::new()
        .with_prefix()
        .with_prev_key()
        .with_start_revision(first);
    let mut stream = c.watch("w/", Some(opts)).await.expect("watch");
    for (k, v) in [
        ("w/a", Some("2")),
        ("w/b", Some("3")),
        ("w/a", None),
        ("w/c", Some("end")),
    ] {
        match v {
            Some(v) => drop(c.put(k, v, None).await.expect("put")),
            None => drop(c.delete(k, None).await.expect("delete")),
        }
    }
    // Responses may batch events differently depending on timing; the events, their order
    // and content may not differ.
    let mut created = false;
    let mut watch_id = None;
    let mut events = 0;
    while events < 5 {
        let msg = tokio::time::timeout(CALL_TIMEOUT, stream.message())
            .await
            .expect("watch events within the hang guard")
            .expect("watch stream error")
            .expect("watch stream ended early");
        if msg.created() {
            created = true;
            watch_id = Some(msg.watch_id());
        }
        for ev in msg.events() {
            events += 1;
            let ty = match ev.event_type() {
                EventType::Put => "PUT",
                EventType::Delete => "DELETE",
            };
            t.push(format!(
                "event {ty} {} prev {}",
                ev.kv().map(kv).unwrap_or_default(),
                ev.prev_kv().map(kv).unwrap_or_default()
            ));
        }
    }
    t.push(format!("created response seen: {created}"));
    stream
        .cancel(watch_id.expect("watch id"))
        .await
        .expect("cancel");
    let msg = tokio::time::timeout(CALL_TIMEOUT, stream.message())
        .await
        .expect("cancel response within the hang guard")
        .expect("watch stream error")
        .expect("watch stream ended early");
    t.push(format!("after cancel: canceled {}", msg.canceled()));

    // A watch from a compacted revision is canceled with the compact revision.
    let rev = c
        .get("w/c", None)
        .await
        .expect("get")
        .header()
        .expect("header")
        .revision();
    c.compact(rev, None).await.expect("compact");
    let mut stream = c
        .watch(
            "w/",
            Some(WatchOptions::new().with_prefix().with_start_revision(1)),
        )
        .await
        .expect("watch");
    loop {
        let msg = tokio::time::timeout(CALL_TIMEOUT, stream.message())
            .await
            .expect("watch response within the hang guard")
            .expect("watch stream error")
            .expect("watch stream ended early");
        if msg.canceled() {
            t.push(format!(
                "compacted watch: canceled, compact revision {}, reason {:?}",
                msg.compact_revision(),
                msg.cancel_reason()
            ));
            break;
        }
    }
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_events_match_direct_etcd() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let p = Pair::start(&binaries, &[]).await;
    let a = watch(&p.direct).await;
    let b = watch(&p.other).await;
    p.assert_same("watch", &a, &b);
    assert!(
        a.iter().any(|l| l.starts_with("event DELETE w/a")),
        "{a:#?}"
    );
}

async fn leases(endpoint: &str) -> Vec<String> {
    let mut c = connect(endpoint, None).await;
    let mut t = Vec::new();
    let grant = c.lease_grant(600, None).await.expect("grant");
    let id = grant.id();
    t.push(format!(
        "grant: ttl {} id non-zero {} error {:?}",
        grant.ttl(),
        id != 0,
        grant.error()
    ));
    for k in ["lk1", "lk2"] {
        c.put(k, "v", Some(PutOptions::new().with_lease(id)))
            .await
            .expect("put with lease");
    }
    let r = c
        .lease_time_to_live(id, Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await;
    rec(&mut t, "ttl", r, |r| {
        let mut keys: Vec<String> = r
            .keys()
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        keys.sort();
        format!(
            "same id {} granted {} remaining>0 {} keys {keys:?}",
            r.id() == id,
            r.granted_ttl(),
            r.ttl() > 0
        )
    });
    let (mut keeper, mut stream) = c.lease_keep_alive(id).await.expect("keep-alive");
    for i in 0..2 {
        keeper.keep_alive().await.expect("send keep-alive");
        let msg = tokio::time::timeout(CALL_TIMEOUT, stream.message())
            .await
            .expect("keep-alive response within the hang guard");
        rec(&mut t, &format!("keep-alive {i}"), msg, |m| match m {
            Some(m) => format!("same id {} ttl {}", m.id() == id, m.ttl()),
            None => "stream ended".to_string(),
        });
    }
    drop(keeper);
    let r = c.leases().await;
    rec(&mut t, "leases", r, |r| {
        format!(
            "count {} contains {}",
            r.leases().len(),
            r.leases().iter().any(|l| l.id() == id)
        )
    });
    let r = c.lease_revoke(id).await;
    rec(&mut t, "revoke", r, |_| "ok".to_string());
    let r = c.get("lk", Some(GetOptions::new().with_prefix())).await;
    rec(&mut t, "keys after revoke", r, |r| kvs(r.kvs()));
    let r = c.lease_time_to_live(id, None).await;
    rec(&mut t, "ttl after revoke", r, |r| {
        format!("ttl {}", r.ttl())
    });
    let r = c.lease_revoke(id).await;
    rec(&mut t, "revoke again", r, |_| "ok".to_string());
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_grant_keepalive_ttl_and_revoke_match_direct_etcd() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let p = Pair::start(&binaries, &[]).await;
    let a = leases(&p.direct).await;
    let b = leases(&p.other).await;
    p.assert_same("leases", &a, &b);
    assert!(a.iter().any(|l| l == "keys after revoke: []"), "{a:#?}");
}

async fn lock_and_election(endpoint: &str) -> Vec<String> {
    let mut c = connect(endpoint, None).await;
    let mut t = Vec::new();
    let l1 = c.lease_grant(600, None).await.expect("grant").id();
    let l2 = c.lease_grant(600, None).await.expect("grant").id();

    let held = c
        .lock("mylock", Some(LockOptions::new().with_lease(l1)))
        .await
        .expect("first lock");
    let held_key = held.key().to_vec();
    t.push(format!(
        "lock 1: key has prefix {}",
        held_key.starts_with(b"mylock/")
    ));
    // A second locker queues behind the first and gets the lock only after the unlock.
    let mut c2 = connect(endpoint, None).await;
    let second = tokio::spawn(async move {
        c2.lock("mylock", Some(LockOptions::new().with_lease(l2)))
            .await
            .map(|r| r.key().to_vec())
    });
    testkit::wait_for("the second locker to queue", CALL_TIMEOUT, || {
        let mut c = c.clone();
        async move {
            let r = c
                .get(
                    "mylock",
                    Some(GetOptions::new().with_prefix().with_keys_only()),
                )
                .await
                .map_err(|e| e.to_string())?;
            if r.kvs().len() == 2 {
                Ok(())
            } else {
                Err(format!("{} lock keys", r.kvs().len()))
            }
        }
    })
    .await;
    t.push(format!(
        "second locker still waiting: {}",
        !second.is_finished()
    ));
    let r = c.unlock(held_key.clone()).await;
    rec(&mut t, "unlock 1", r, |_| "ok".to_string());
    let got = tokio::time::timeout(CALL_TIMEOUT, second)
        .await
        .expect("second lock within the hang guard")
        .expect("second lock task");
    rec(&mut t, "lock 2", got, |k| {
        format!("other key {}", *k != held_key)
    });

    // Election.
    let r = c.campaign("myelection", "v1", l1).await.expect("campaign");
    let leader = r.leader().expect("leader key").clone();
    t.push(format!(
        "campaign: name {:?}",
        leader.name_str().expect("utf8")
    ));
    let r = c.leader("myelection").await;
    rec(&mut t, "leader", r, |r| r.kv().map(kv).unwrap_or_default());
    let mut observe = c.observe("myelection").await.expect("observe");
    let first = tokio::time::timeout(CALL_TIMEOUT, observe.message())
        .await
        .expect("observe within the hang guard");
    rec(&mut t, "observe 1", first, |m| {
        m.as_ref().and_then(|m| m.kv()).map(kv).unwrap_or_default()
    });
    let r = c
        .proclaim(
            "v2",
            Some(etcd_client::ProclaimOptions::new().with_leader(leader.clone())),
        )
        .await;
    rec(&mut t, "proclaim", r, |_| "ok".to_string());
    let second = tokio::time::timeout(CALL_TIMEOUT, observe.message())
        .await
        .expect("observe within the hang guard");
    rec(&mut t, "observe 2", second, |m| {
        m.as_ref().and_then(|m| m.kv()).map(kv).unwrap_or_default()
    });
    let r = c
        .resign(Some(etcd_client::ResignOptions::new().with_leader(leader)))
        .await;
    rec(&mut t, "resign", r, |_| "ok".to_string());
    let r = c.leader("myelection").await;
    rec(&mut t, "leader after resign", r, |r| {
        r.kv().map(kv).unwrap_or_default()
    });
    // Election keys end in the campaigner's lease ID, which differs between clusters.
    t.iter()
        .map(|l| {
            l.replace(&format!("{l1:x}"), "<lease 1>")
                .replace(&format!("{l2:x}"), "<lease 2>")
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_and_election_match_direct_etcd() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let p = Pair::start(&binaries, &[]).await;
    let a = lock_and_election(&p.direct).await;
    let b = lock_and_election(&p.other).await;
    p.assert_same("lock and election", &a, &b);
    assert!(
        a.contains(&"second locker still waiting: true".to_string()),
        "{a:#?}"
    );
}

async fn cluster_and_status(endpoint: &str) -> Vec<String> {
    let mut c = connect(endpoint, None).await;
    let mut t = Vec::new();
    let r = c.member_list().await;
    rec(&mut t, "member list", r, |r| {
        let members: Vec<String> = r
            .members()
            .iter()
            .map(|m| {
                format!(
                    "{} peers {} clients {} learner {}",
                    m.name(),
                    m.peer_urls().len(),
                    m.client_urls().len(),
                    m.is_learner()
                )
            })
            .collect();
        format!("{members:?}")
    });
    let r = c.status().await;
    rec(&mut t, "status", r, |r| {
        let member = r.header().map_or(0, |h| h.member_id());
        format!(
            "version {} leader is this member {} learner {} errors {:?}",
            r.version(),
            r.leader() == member,
            r.is_learner(),
            r.errors()
        )
    });
    let r = c
        .alarm(
            etcd_client::AlarmAction::Get,
            etcd_client::AlarmType::None,
            None,
        )
        .await;
    rec(&mut t, "alarms", r, |r| format!("{}", r.alarms().len()));
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_list_and_status_match_direct_etcd() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    // MemberList passes through unchanged only without an advertised URL (by default its client URLs are the
    // proxy's: see member_ids.rs).
    let p = Pair::start(&binaries, &["--advertise-client-url="]).await;
    let a = cluster_and_status(&p.direct).await;
    let b = cluster_and_status(&p.other).await;
    p.assert_same("member list and status", &a, &b);
    assert!(a.iter().any(|l| l.contains("version 3.")), "{a:#?}");
}

async fn auth(endpoint: &str) -> Vec<String> {
    let mut c = connect(endpoint, None).await;
    let mut t = Vec::new();
    c.user_add("root", "rootpw", None).await.expect("add root");
    c.role_add("root").await.expect("add root role");
    c.user_grant_role("root", "root").await.expect("grant root");
    c.role_add("reader").await.expect("add reader");
    c.role_grant_permission("reader", Permission::read("/pub/").with_prefix())
        .await
        .expect("grant read");
    c.user_add("alice", "alicepw", None)
        .await
        .expect("add alice");
    c.user_grant_role("alice", "reader")
        .await
        .expect("grant reader");
    c.put("/pub/a", "1", None).await.expect("put");
    c.put("/secret/s", "2", None).await.expect("put");
    let r = c.auth_enable().await;
    rec(&mut t, "auth enable", r, |_| "ok".to_string());

    let mut root = connect(endpoint, Some(("root", "rootpw"))).await;
    let r = root.get("", Some(GetOptions::new().with_all_keys())).await;
    rec(&mut t, "root reads all", r, |r| kvs(r.kvs()));
    let r = root.user_list().await;
    rec(&mut t, "root lists users", r, |r| {
        format!("{:?}", r.users())
    });
    let r = root.role_get("reader").await;
    rec(&mut t, "root gets role", r, |r| {
        format!("{} permissions", r.permissions().len())
    });

    let mut alice = connect(endpoint, Some(("alice", "alicepw"))).await;
    let r = alice.get("/pub/a", None).await;
    rec(&mut t, "alice reads /pub/", r, |r| kvs(r.kvs()));
    let r = alice.get("/secret/s", None).await;
    rec(&mut t, "alice reads /secret/", r, |r| kvs(r.kvs()));
    let r = alice.put("/pub/a", "x", None).await;
    rec(&mut t, "alice writes /pub/", r, |_| "ok".to_string());
    let r = alice.user_add("mallory", "pw", None).await;
    rec(&mut t, "alice adds a user", r, |_| "ok".to_string());

    let r = c.get("/pub/a", None).await;
    rec(&mut t, "anonymous read", r, |r| kvs(r.kvs()));
    let r = Client::connect(
        [endpoint],
        Some(ConnectOptions::new().with_user("alice", "wrong")),
    )
    .await;
    rec(&mut t, "wrong password", r, |_| "connected".to_string());

    let r = root.auth_disable().await;
    rec(&mut t, "auth disable", r, |_| "ok".to_string());
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_with_authenticated_clients_matches_direct_etcd() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let p = Pair::start(&binaries, &[]).await;
    let a = auth(&p.direct).await;
    let b = auth(&p.other).await;
    p.assert_same("auth", &a, &b);
    assert!(
        a.contains(
            &"alice reads /secret/: error PermissionDenied: etcdserver: permission denied"
                .to_string()
        ),
        "{a:#?}"
    );
}
