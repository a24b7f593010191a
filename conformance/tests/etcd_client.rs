//! The second real client: the core scenarios through the `etcd-client` crate (KV, txn, lease, the keep-alive API,
//! watch), on etcd directly (in the clear, and over TLS when the `tls` profile runs: the crate's own TLS), through
//! the proxy under every profile and on the sim's model etcd, for every etcd version installed as a process. All
//! transcripts (keys without the target's prefix, revisions relative to the start) must be identical.

use std::time::Duration;

use testkit::{Backend, Spec};

use conformance::profile::{self, Endpoint, Setup};
use conformance::target;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, DeleteOptions, EventType, GetOptions,
    Identity, LeaseKeepAliveStream, LeaseTimeToLiveOptions, PutOptions, SortOrder, SortTarget,
    TlsOptions, Txn, TxnOp, WatchOptions,
};

/// The model's seed, as in the scenario suite.
const MODEL_SEED: u64 = 7;

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

/// A client of `at`, over TLS with its files when it has them.
async fn connect(at: &Endpoint) -> Result<Client, etcd_client::Error> {
    let options = match &at.tls {
        None => None,
        Some(tls) => {
            let read = |p: &std::path::Path| {
                std::fs::read(p).map_err(|e| {
                    etcd_client::Error::InvalidArgs(format!("read {}: {e}", p.display()))
                })
            };
            let tls = TlsOptions::new()
                .ca_certificate(Certificate::from_pem(read(&tls.ca)?))
                .identity(Identity::from_pem(read(&tls.cert)?, read(&tls.key)?));
            Some(ConnectOptions::new().with_tls(tls))
        }
    };
    Client::connect([at.url()], options).await
}

async fn core_scenarios(at: &Endpoint, prefix: &str) -> Result<Vec<String>, etcd_client::Error> {
    let mut c = connect(at).await?;
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
    // Nine events: four puts, the txn's put and delete, the delete of b, the leased put and its delete on revoke
    // (etcd sends this history in one response, the model one response per revision).
    while seen < 9 && tokio::time::Instant::now() < deadline {
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

    lease_keep_alives(&mut c, &mut log).await?;
    Ok(log.lines)
}

/// The next answer on a keep-alive stream, or what came instead (its end, an error, nothing in time).
async fn keep_alive_answer(stream: &mut LeaseKeepAliveStream) -> String {
    match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
        Err(_) => "no answer within 10s".into(),
        Ok(Ok(Some(r))) => format!("ttl={} id={}", r.ttl(), r.id()),
        Ok(Ok(None)) => "end of stream".into(),
        Ok(Err(e)) => format!("error: {e}"),
    }
}

/// The crate's keep-alive API: `lease_keep_alive` sends one keep-alive and reads its answer (an answer with TTL 0,
/// as etcd gives for a lease it does not know, is the crate's "lease not found"); the keeper then sends more on the
/// same stream, each answered with the lease's TTL; dropping the keeper (the request side) ends the stream.
async fn lease_keep_alives(c: &mut Client, log: &mut Log) -> Result<(), etcd_client::Error> {
    let lease = c.lease_grant(600, None).await?;
    let id = lease.id();
    let same = |line: String| line.replace(&format!("id={id}"), "id=<granted>");
    let (mut keeper, mut answers) = c.lease_keep_alive(id).await?;
    log.push(format!(
        "keep-alive once: keeper for the granted lease: {}",
        keeper.id() == id
    ));
    for i in 1..=3 {
        keeper.keep_alive().await?;
        log.push(same(format!(
            "keep-alive {i} more: {}",
            keep_alive_answer(&mut answers).await
        )));
    }
    drop(keeper);
    log.push(same(format!(
        "keeper dropped: {}",
        keep_alive_answer(&mut answers).await
    )));
    let ttl = c.lease_time_to_live(id, None).await?;
    log.push(format!(
        "timetolive after keep-alives: granted={} remaining in 1..=600: {}",
        ttl.granted_ttl(),
        (1..=600).contains(&ttl.ttl())
    ));
    c.lease_revoke(id).await?;
    // An id no lease here has (granted ids are large and server-chosen).
    for (what, lease) in [("unknown", 0x0bad_1ea5e), ("revoked", id)] {
        match c.lease_keep_alive(lease).await {
            Ok((keeper, _)) => log.push(format!(
                "{what} lease keep-alive: a keeper (same id {})",
                keeper.id() == lease
            )),
            Err(e) => log.push(format!("{what} lease keep-alive: {e}")),
        }
    }
    Ok(())
}

async fn compare_on(spec: &Spec, setup: &Setup, profiles: &[profile::Profile]) {
    let mut plain: Option<Vec<String>> = None;
    for transport in profile::transports(profiles) {
        let etcd = setup
            .start_etcd(spec, transport, &[])
            .await
            .unwrap_or_else(|e| panic!("{} ({}): {e}", spec.label(), transport.name()));
        let direct = core_scenarios(&Endpoint::etcd(&etcd), "/ec/direct/").await;
        let direct = direct
            .unwrap_or_else(|e| panic!("{} direct ({}): {e}", spec.label(), transport.name()));
        assert!(
            direct.len() > 20,
            "the transcript is too short to mean anything: {direct:#?}"
        );
        if let Some(reference) = &plain {
            assert_eq!(
                reference,
                &direct,
                "etcd-client answers from etcd {} over {} differ from those in the clear",
                spec.version,
                transport.name()
            );
        }
        for p in profiles.iter().filter(|p| p.transport == transport) {
            let proxy = setup
                .start_proxy(p, &etcd, &[])
                .await
                .expect("start the proxy");
            let prefix = format!("/ec/proxy-{}/", p.name);
            let through = core_scenarios(&Endpoint::proxy(&proxy), &prefix).await;
            drop(proxy);
            let through = through.unwrap_or_else(|e| {
                panic!(
                    "{} through the proxy ({} profile): {e}",
                    spec.label(),
                    p.name
                )
            });
            assert_eq!(
                direct, through,
                "etcd-client answers through the proxy ({} profile) differ from etcd {}",
                p.name, spec.version
            );
        }
        etcd.stop().await;
        plain.get_or_insert(direct);
    }
    let direct = plain.expect("direct in the clear ran");
    let model = target::start_model(MODEL_SEED, spec.version)
        .await
        .expect("start the model");
    let on_model = core_scenarios(&Endpoint::plain(model.addr()), "/ec/model/").await;
    model.stop().await;
    let on_model = on_model.unwrap_or_else(|e| panic!("{} on the model: {e}", spec.label()));
    assert_eq!(
        direct, on_model,
        "etcd-client answers from the sim's model etcd differ from etcd {}",
        spec.version
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_client_sees_the_same_answers_through_the_proxy_as_from_etcd() {
    let profiles = profile::selected().unwrap_or_else(|e| panic!("{e}"));
    let setup = Setup::new(&profiles).unwrap_or_else(|e| panic!("setting the profiles up: {e}"));
    let mut ran = 0;
    for spec in testkit::etcd::discover()
        .await
        .iter()
        .filter(|s| s.backend == Backend::Process)
    {
        match spec.missing() {
            Some(why) if testkit::ci() => panic!("{} missing under CI=true: {why}", spec.label()),
            Some(why) => eprintln!("SKIPPED {}: {why}", spec.label()),
            None => {
                compare_on(spec, &setup, &profiles).await;
                ran += 1;
            }
        }
    }
    eprintln!("etcd-client comparison ran on {ran} etcd version(s)");
}
