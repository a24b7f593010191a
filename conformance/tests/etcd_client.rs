//! The second real client: the core scenarios through the `etcd-client` crate, on etcd directly and through the
//! proxy, for every etcd version installed as a process. Both transcripts (keys without the target's prefix,
//! revisions relative to the start) must be identical.

use std::time::Duration;

use conformance::backend::{self, Etcd, Kind, Spec};
use conformance::target;
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, EventType, GetOptions, LeaseTimeToLiveOptions,
    PutOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions,
};

/// Writes one line per observation, keys with `prefix` cut off and revisions relative to `base`.
struct Log {
    prefix: String,
    base: i64,
    lines: Vec<String>,
}

impl Log {
    fn key(&self, k: &[u8]) -> String {
        let k = String::from_utf8_lossy(k);
        k.strip_prefix(&self.prefix).unwrap_or(&k).to_string()
    }
    fn rev(&self, r: i64) -> String {
        if r == 0 {
            "0".into()
        } else {
            format!("+{}", r - self.base)
        }
    }
    fn kv(&self, kv: &etcd_client::KeyValue) -> String {
        format!(
            "{}={} create={} mod={} ver={} lease={}",
            self.key(kv.key()),
            String::from_utf8_lossy(kv.value()),
            self.rev(kv.create_revision()),
            self.rev(kv.mod_revision()),
            kv.version(),
            kv.lease() != 0
        )
    }
    fn push(&mut self, line: String) {
        self.lines.push(line);
    }
}

async fn core_scenarios(endpoint: &str, prefix: &str) -> Result<Vec<String>, etcd_client::Error> {
    let mut c = Client::connect([endpoint], None).await?;
    let p = |k: &str| format!("{prefix}{k}");
    let base = c
        .get(p("none"), None)
        .await?
        .header()
        .map(|h| h.revision())
        .unwrap_or(0);
    let mut log = Log {
        prefix: prefix.to_string(),
        base,
        lines: Vec::new(),
    };

    // KV: put with prev_kv, ranges with prefix, limit, sort, keys-only, count-only, historical read.
    for (k, v) in [("a", "1"), ("b", "2"), ("c", "3"), ("a", "4")] {
        let r = c
            .put(p(k), v, Some(PutOptions::new().with_prev_key()))
            .await?;
        let prev = r
            .prev_key()
            .map(|kv| log.kv(kv))
            .unwrap_or_else(|| "none".into());
        log.push(format!(
            "put {k}={v} rev={} prev={prev}",
            log.rev(r.header().map(|h| h.revision()).unwrap_or(0))
        ));
    }
    let opts = GetOptions::new()
        .with_prefix()
        .with_limit(2)
        .with_sort(SortTarget::Value, SortOrder::Descend);
    let r = c.get(prefix, Some(opts)).await?;
    log.push(format!(
        "get prefix limit=2 sort=value desc: count={} more={}",
        r.count(),
        r.more()
    ));
    for kv in r.kvs() {
        log.push(format!("  {}", log.kv(kv)));
    }
    let r = c
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_keys_only()),
        )
        .await?;
    let keys: Vec<String> = r.kvs().iter().map(|kv| log.key(kv.key())).collect();
    log.push(format!("keys-only: {keys:?}"));
    let r = c
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await?;
    log.push(format!("count-only: {} kvs={}", r.count(), r.kvs().len()));
    let r = c
        .get(p("a"), Some(GetOptions::new().with_revision(base + 1)))
        .await?;
    log.push(format!(
        "get a at +1: {:?}",
        r.kvs().iter().map(|kv| log.kv(kv)).collect::<Vec<_>>()
    ));
    match c
        .get(p("a"), Some(GetOptions::new().with_revision(base + 1000)))
        .await
    {
        Ok(_) => log.push("future revision: ok".into()),
        Err(e) => log.push(format!("future revision: {e}")),
    }

    // Txn: compare on value and version, both branches, nested ops.
    let txn = Txn::new()
        .when([
            Compare::value(p("a"), CompareOp::Equal, "4"),
            Compare::version(p("b"), CompareOp::Greater, 0),
        ])
        .and_then([TxnOp::put(p("t"), "yes", None), TxnOp::get(p("a"), None)])
        .or_else([TxnOp::put(p("t"), "no", None)]);
    let r = c.txn(txn).await?;
    log.push(format!(
        "txn succeeded={} responses={}",
        r.succeeded(),
        r.op_responses().len()
    ));
    let txn = Txn::new()
        .when([Compare::value(p("a"), CompareOp::NotEqual, "4")])
        .and_then([TxnOp::put(p("t"), "again", None)])
        .or_else([TxnOp::delete(p("t"), None)]);
    let r = c.txn(txn).await?;
    log.push(format!("txn succeeded={}", r.succeeded()));
    let dup = Txn::new().and_then([TxnOp::put(p("d"), "1", None), TxnOp::put(p("d"), "2", None)]);
    match c.txn(dup).await {
        Ok(_) => log.push("duplicate key txn: ok".into()),
        Err(e) => log.push(format!("duplicate key txn: {e}")),
    }

    // Delete with prev_kv over a prefix.
    let r = c
        .delete(
            p("b"),
            Some(DeleteOptions::new().with_prefix().with_prev_key()),
        )
        .await?;
    log.push(format!(
        "delete b*: deleted={} prev={:?}",
        r.deleted(),
        r.prev_kvs().iter().map(|kv| log.kv(kv)).collect::<Vec<_>>()
    ));

    // Lease: grant, attach, time-to-live with keys, revoke deletes the key.
    let lease = c.lease_grant(600, None).await?;
    log.push(format!("lease grant ttl={}", lease.ttl()));
    c.put(p("l"), "x", Some(PutOptions::new().with_lease(lease.id())))
        .await?;
    let ttl = c
        .lease_time_to_live(lease.id(), Some(LeaseTimeToLiveOptions::new().with_keys()))
        .await?;
    let keys: Vec<String> = ttl.keys().iter().map(|k| log.key(k)).collect();
    log.push(format!(
        "timetolive granted={} keys={keys:?}",
        ttl.granted_ttl()
    ));
    c.lease_revoke(lease.id()).await?;
    let r = c.get(p("l"), None).await?;
    log.push(format!("after revoke: count={}", r.count()));

    // Watch: history from the first revision, with prev_kv.
    let mut stream = c
        .watch(
            prefix,
            Some(
                WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(base + 1)
                    .with_prev_key(),
            ),
        )
        .await?;
    let mut seen = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen < 8 && tokio::time::Instant::now() < deadline {
        let Ok(Ok(Some(resp))) =
            tokio::time::timeout(Duration::from_secs(10), stream.message()).await
        else {
            break;
        };
        for ev in resp.events() {
            seen += 1;
            let kind = if ev.event_type() == EventType::Put {
                "PUT"
            } else {
                "DELETE"
            };
            let kv = ev.kv().map(|kv| log.kv(kv)).unwrap_or_default();
            let prev = ev
                .prev_kv()
                .map(|kv| log.kv(kv))
                .unwrap_or_else(|| "none".into());
            log.push(format!("watch {kind} {kv} prev={prev}"));
        }
    }
    Ok(log.lines)
}

async fn compare_on(spec: &Spec) {
    let etcd = Etcd::start(spec)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", spec.label()));
    let proxy = target::start_proxy(&etcd.endpoint())
        .await
        .expect("start the proxy");
    let direct = core_scenarios(&etcd.endpoint(), "/ec/direct/").await;
    let through = core_scenarios(&proxy.addr(), "/ec/proxy/").await;
    proxy.stop().await;
    etcd.stop().await;
    let direct = direct.unwrap_or_else(|e| panic!("{} direct: {e}", spec.label()));
    let through = through.unwrap_or_else(|e| panic!("{} through the proxy: {e}", spec.label()));
    assert!(
        direct.len() > 20,
        "the transcript is too short to mean anything: {direct:#?}"
    );
    assert_eq!(
        direct, through,
        "etcd-client answers through the proxy differ from etcd {}",
        spec.version.name
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_client_sees_the_same_answers_through_the_proxy_as_from_etcd() {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let mut ran = 0;
    for spec in backend::discover()
        .await
        .iter()
        .filter(|s| s.kind == Kind::Process)
    {
        match &spec.missing {
            Some(why) if ci => panic!("{} missing under CI=true: {why}", spec.label()),
            Some(why) => eprintln!("SKIPPED {}: {why}", spec.label()),
            None => {
                compare_on(spec).await;
                ran += 1;
            }
        }
    }
    eprintln!("etcd-client comparison ran on {ran} etcd version(s)");
}
