//! TLS on both sides of the proxy, over turmoil: the members serve TLS and require client certificates, the proxy
//! serves TLS (requiring client certificates) and dials the members over TLS with a certificate without a Common
//! Name, and the clients dial the proxy over TLS (server name `proxy`). The certificates are made here, per test,
//! with `testkit::pki`, into a temporary directory.
//!
//! - a quiet world shows that TLS is really on: TLS clients with a certificate get through, plaintext clients and
//!   clients without a certificate do not, at the proxy and at a member;
//! - the `failover` scenario (crashes, partitions both ways and one way, held links, latency) and the `watch`
//!   scenario (the same, plus proxy restarts and writers straight to the members) run over TLS, so every failover
//!   and restart redials through a fresh handshake, and must pass every check they pass in plaintext;
//! - one seed gives one trace digest over TLS too, although TLS draws its randomness from aws-lc, not the seed.
//!
//! Seeds: `SIM_SEED` / `SIM_SEEDS` as in `tests/scenarios.rs` (default [`TLS_SEEDS`]), plus the `failover-tls`
//! lines of `testdata/sim/regressions.txt`.

use std::path::Path;
use std::time::{Duration, Instant};

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::{PutRequest, RangeRequest};
use proxy::tls::{ClientSettings, ClientTls};
use sim::check::hygiene::check_hygiene;
use sim::scenario::{self, Report, Scenario};
use sim::seeds;
use sim::tls::{CertKey, TlsFiles};
use sim::topology::{Dialer, member_authority, proxy_authority};
use sim::world::{Settings, World};
use testkit::pki::{Ca, KeyAlg, Leaf};

const REGRESSIONS: &str = include_str!("../../testdata/sim/regressions.txt");

/// Seeds of the TLS sweep in a default run: a handshake per connection costs more than plaintext, and the sweep
/// is there to exercise TLS reconnects under faults, which the plaintext sweeps already cover for the workload.
const TLS_SEEDS: u64 = 24;

/// The key type of every certificate: ECDSA P-256, as most deployments have. Its signatures are random and their
/// DER length varies (70 to 72 bytes), so the handshakes' bytes, and even their lengths, differ from run to run;
/// [`one_seed_gives_one_trace_digest_over_tls`] shows that the runs do not.
const KEY_ALG: KeyAlg = KeyAlg::P256;

/// A fresh PKI for `members` members in `dir`: one CA, server certificates for `m0..` and `proxy`, the proxy's
/// client certificate without a Common Name, and the clients' certificate.
fn pki(dir: &Path, members: usize) -> TlsFiles {
    let ca = Ca::with_alg("sim-ca", KEY_ALG).expect("CA");
    let issue = |leaf: Leaf, name: &str| -> CertKey {
        ca.issue(&leaf.alg(KEY_ALG))
            .unwrap_or_else(|e| panic!("issue {name}: {e}"))
            .write(dir, name)
            .unwrap_or_else(|e| panic!("write {name}: {e}"))
            .into()
    };
    TlsFiles {
        ca: ca.write(dir, "ca").expect("write the CA"),
        members: (0..members)
            .map(|m| {
                let host = format!("m{m}");
                issue(Leaf::server().name(&host), &host)
            })
            .collect(),
        proxy: issue(Leaf::server().name("proxy"), "proxy"),
        proxy_upstream: issue(Leaf::client(None), "proxy-upstream"),
        client: issue(Leaf::client(Some("sim-client")), "client"),
    }
}

fn tls_settings(scenario: Scenario, seed: u64, files: &TlsFiles) -> Settings {
    let mut settings = scenario::settings(scenario, seed);
    settings.tls = Some(files.clone());
    settings
}

/// Sweeps `scenario` over TLS: the seeds from the environment (default [`TLS_SEEDS`]) and the regression seeds
/// listed as `<scenario>-tls`; every run must pass every check. A failure prints its seed and how to reproduce it.
fn sweep(scenario: Scenario) {
    let dir = tempfile::tempdir().expect("temp dir");
    let files = pki(dir.path(), scenario::settings(scenario, 0).members);
    let mut seeds = seeds::sweep_or(TLS_SEEDS);
    if std::env::var_os("SIM_SEED").is_none() {
        let name = format!("{}-tls", scenario.name());
        for seed in seeds::regressions(REGRESSIONS, &name) {
            if !seeds.contains(&seed) {
                seeds.push(seed);
            }
        }
    }
    // Wall-clock time is only reported, never asserted.
    #[allow(clippy::disallowed_methods)]
    let started = Instant::now();
    let reports: Vec<Report> = seeds
        .iter()
        .map(|&seed| scenario::run_with(scenario, tls_settings(scenario, seed, &files)))
        .collect();
    let failures: Vec<&Report> = reports.iter().filter(|r| !r.passed()).collect();
    let calls: usize = reports.iter().map(|r| r.calls).sum();
    let watchers: usize = reports.iter().map(|r| r.watchers).sum();
    let revisions: i64 = reports.iter().map(|r| r.revisions).sum();
    println!(
        "sim {} over TLS: {} seeds, {} failed, {watchers} watchers, {calls} checked calls, {revisions} revisions, \
         {:.1?} wall",
        scenario.name(),
        reports.len(),
        failures.len(),
        started.elapsed()
    );
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n{}",
        failures.len(),
        reports.len(),
        failures
            .iter()
            .map(|r| r.failure_text())
            .collect::<Vec<_>>()
            .join("\n\n")
    );
    assert!(revisions > 0, "nothing was written");
}

#[test]
fn failover_scenario_over_tls_reads_never_fail_and_writes_fail_only_as_unknown() {
    sweep(Scenario::Failover);
}

#[test]
fn watch_scenario_over_tls_every_watcher_sees_exactly_the_models_events() {
    sweep(Scenario::Watch);
}

#[test]
fn one_seed_gives_one_trace_digest_over_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let scenario = Scenario::Failover;
    let files = pki(dir.path(), scenario::settings(scenario, 0).members);
    let seed = seeds::sweep_or(TLS_SEEDS)[0];
    let first = scenario::run_with(scenario, tls_settings(scenario, seed, &files));
    let second = scenario::run_with(scenario, tls_settings(scenario, seed, &files));
    // Certificates made afresh (new keys, new signatures) must not change the run either.
    let other_dir = tempfile::tempdir().expect("temp dir");
    let other_files = pki(other_dir.path(), scenario::settings(scenario, 0).members);
    let third = scenario::run_with(scenario, tls_settings(scenario, seed, &other_files));
    let plain = scenario::run(scenario, seed);
    println!(
        "sim {} over TLS seed {seed}: digests {:016x} {:016x} {:016x} (plaintext {:016x})",
        scenario.name(),
        first.digest,
        second.digest,
        third.digest,
        plain.digest
    );
    for report in [&first, &second, &third] {
        assert!(report.passed(), "{}", report.failure_text());
    }
    assert_ne!(first.digest, 0, "a digest of nothing");
    assert_eq!(
        first.digest,
        second.digest,
        "{} over TLS seed {seed} is not reproducible",
        scenario.name()
    );
    assert_eq!(
        first.digest,
        third.digest,
        "{} over TLS seed {seed} depends on the certificates' keys",
        scenario.name()
    );
    assert_ne!(
        first.digest, plain.digest,
        "the TLS run should differ from the plaintext one (handshakes are messages too)"
    );
}

fn quiet_settings(seed: u64, files: &TlsFiles) -> Settings {
    Settings {
        tls: Some(files.clone()),
        ..Settings::quiet(seed, 3)
    }
}

/// A range of `key` on `authority` with `dialer`, within two seconds: the value, or why it failed.
async fn get(dialer: &Dialer, authority: &str, key: &[u8]) -> Result<Vec<u8>, String> {
    let mut kv = KvClient::new(dialer.channel(authority));
    let mut request = tonic::Request::new(RangeRequest {
        key: key.to_vec(),
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(2));
    let response = kv.range(request).await.map_err(|s| format!("{s:?}"))?;
    Ok(response
        .into_inner()
        .kvs
        .first()
        .map(|kv| kv.value.to_vec())
        .unwrap_or_default())
}

#[test]
fn tls_is_on_at_the_proxy_and_at_the_members_and_a_client_needs_a_certificate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let files = pki(dir.path(), 3);
    let mut world = World::new(quiet_settings(1, &files));
    assert!(world.dialer().is_tls());
    let dialer = world.dialer();
    let cluster = world.cluster.clone();
    let anonymous = ClientTls::new(&ClientSettings {
        ca: Some(files.ca.clone()),
        ..Default::default()
    })
    .expect("a TLS client without a certificate");
    let anonymous = Dialer::tls(anonymous.into());
    world.client("c0", async move {
        let mut kv = KvClient::new(dialer.channel(&proxy_authority()));
        let put = kv
            .put(PutRequest {
                key: b"greeting".to_vec(),
                value: b"hello".to_vec(),
                ..Default::default()
            })
            .await?
            .into_inner();
        assert_eq!(put.header.expect("header").cluster_id, cluster.cluster_id());
        assert_eq!(
            get(&dialer, &proxy_authority(), b"greeting").await?,
            b"hello"
        );
        assert_eq!(
            get(&dialer, &member_authority(1), b"greeting").await?,
            b"hello"
        );
        let mut client = dialer.etcd_client(&proxy_authority()).await?;
        assert_eq!(
            client.get("greeting", None).await?.kvs()[0].value(),
            b"hello"
        );
        for authority in [proxy_authority(), member_authority(0)] {
            let plain = get(&Dialer::plain(), &authority, b"greeting").await;
            assert!(
                plain.is_err(),
                "a plaintext client got through to {authority}"
            );
            let no_cert = get(&anonymous, &authority, b"greeting").await;
            assert!(
                no_cert.is_err(),
                "a client without a certificate got through to {authority}"
            );
        }
        Ok(())
    });
    let finished = world.run();
    assert_eq!(finished.sim_error, None);
    assert_eq!(check_hygiene(&finished), Vec::<String>::new());
}

#[test]
fn the_proxy_refuses_an_upstream_certificate_with_a_common_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut files = pki(dir.path(), 1);
    let ca = Ca::with_alg("sim-ca-2", KEY_ALG).expect("CA");
    files.proxy_upstream = ca
        .issue(&Leaf::client(Some("root")).alg(KEY_ALG))
        .expect("issue")
        .write(dir.path(), "proxy-upstream-cn")
        .expect("write")
        .into();
    let err = ClientTls::new(&files.proxy_upstream())
        .err()
        .expect("refused");
    assert!(err.to_string().contains("Common Name"), "{err}");
}

/// A client that connects to the proxy's TLS port and stalls mid-handshake (one byte of a ClientHello, then
/// nothing, the connection left open), then the world stops the proxy: it must stop within its shutdown grace, as
/// `proxy::server::serve` promises for every connection, not after the handshake deadline. (Before the handshake
/// raced the shutdown signal, the proxy stopped 10.07 s after it, when `HANDSHAKE_TIMEOUT` ended the handshake.)
#[test]
fn a_stalled_handshake_does_not_hold_up_the_proxys_shutdown() {
    let dir = tempfile::tempdir().expect("temp dir");
    let files = pki(dir.path(), 3);
    let mut world = World::new(quiet_settings(2, &files));
    let dialer = world.dialer();
    let done_at = std::sync::Arc::new(std::sync::Mutex::new(Duration::ZERO));
    let done = done_at.clone();
    world.client("stalled", async move {
        use tokio::io::AsyncWriteExt;
        let mut stream = turmoil::net::TcpStream::connect(proxy_authority().as_str()).await?;
        stream.write_all(&[0x16]).await?;
        // The proxy accepts in order: once a later connection is served, the stalled one is in its handshake.
        get(&dialer, &proxy_authority(), b"k").await?;
        // Kept open past the end of this client: a finished client host is no longer run, its sockets stay.
        std::mem::forget(stream);
        *done.lock().unwrap() = turmoil::sim_elapsed().unwrap_or_default();
        Ok(())
    });
    let finished = world.run();
    assert_eq!(finished.sim_error, None);
    assert_eq!(check_hygiene(&finished), Vec::<String>::new());
    let grace = sim::world::proxy_config(2, 3).shutdown_grace;
    // The exit is recorded once the proxy's tasks are gone, looked at every 100 ms.
    let stopping = finished.elapsed - *done_at.lock().unwrap();
    assert!(
        stopping <= grace + Duration::from_millis(500),
        "the proxy took {stopping:?} to stop (grace {grace:?})"
    );
}
