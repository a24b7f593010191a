//! `--discovery-srv`: the proxy finds etcd's endpoints in DNS SRV records, asked of a DNS server this test runs on
//! loopback (`--discovery-srv-dns`, so the system's resolver is never involved), and serves reads and writes
//! through them; plaintext records need `--insecure-discovery`, and `https` ones turn TLS towards etcd on. Lookups
//! that find nothing stop the proxy at start with a message naming the domain and the SRV names looked up.
//!
//! Targets are `localhost`, which the connector resolves from /etc/hosts, as it resolves any host name.

mod support;

use std::path::Path;

use testkit::dns::{FakeDns, RunningDns};
use testkit::pki::{Ca, Leaf};
use testkit::{EtcdCluster, ProxyProcess};

use support::proxy::PROXY_BIN;

const DOMAIN: &str = "example.test";

/// One SRV record: priority, weight, port, target.
type Record = (u16, u16, u16, &'static str);

/// A DNS server on 127.0.0.1 answering SRV questions for `table`'s names (priority, weight, port, target); other
/// names get NXDOMAIN.
async fn start_dns(table: &[(&str, Vec<Record>)]) -> RunningDns {
    let server = table
        .iter()
        .fold(FakeDns::new(), |server, (name, records)| {
            server.srv(name, records)
        });
    server.start().await.expect("start the DNS server")
}

/// The client port of member `i`.
fn port(cluster: &EtcdCluster, i: usize) -> u16 {
    let addr = cluster.addr(i);
    addr.rsplit_once(':').unwrap().1.parse().unwrap()
}

async fn start_proxy(flags: &[String]) -> ProxyProcess {
    ProxyProcess::start(Path::new(PROXY_BIN), &[], flags)
        .await
        .unwrap_or_else(|e| panic!("start the proxy with {flags:?}: {e}"))
}

/// A Put and a Get through the proxy at `addr`.
async fn put_get(addr: &str) {
    let mut client = etcd_client::Client::connect([addr], None)
        .await
        .expect("connect to the proxy");
    client.put("srv-key", "srv-value", None).await.expect("put");
    let got = client.get("srv-key", None).await.expect("get");
    assert_eq!(got.kvs()[0].value_str().unwrap(), "srv-value");
}

#[tokio::test]
async fn the_members_named_by_srv_records_serve_reads_and_writes() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 3, &[]).await;
    let records: Vec<Record> = (0..3)
        .map(|i| (10, 1, port(&cluster, i), "localhost."))
        .collect();
    let dns = start_dns(&[("_etcd-client-east._tcp.example.test", records)]).await;
    let flags = [
        format!("--discovery-srv={DOMAIN}"),
        "--discovery-srv-name=east".into(),
        "--insecure-discovery".into(),
        dns.flag(),
    ];
    let proxy = start_proxy(&flags).await;
    put_get(&proxy.addr()).await;
    let mut asked = dns.names_asked();
    asked.sort();
    assert_eq!(
        asked,
        [
            "_etcd-client-east._tcp.example.test",
            "_etcd-client-ssl-east._tcp.example.test"
        ]
    );
    // Every member is an endpoint of the proxy, under the name the record gave.
    let metrics = proxy.metrics().await;
    for i in 0..3 {
        let endpoint = format!("localhost:{}", port(&cluster, i));
        assert!(
            support::metrics::upstream_up(&metrics, &endpoint).is_some(),
            "{endpoint} not in\n{metrics}"
        );
    }
}

#[tokio::test]
async fn ssl_records_turn_tls_towards_etcd_on_and_plaintext_ones_are_left_out() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let dir = testkit::dirs::temp_dir("proxy-srv-").expect("temp dir");
    let ca = Ca::new("etcd-ca").expect("CA");
    let party = |name: &str, leaf: Leaf| {
        ca.write_party(dir.path(), name, &leaf)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let tls = testkit::etcd::EtcdTls {
        server: party("etcd-server", Leaf::server().client_auth()),
        client_cert_auth: false,
        client: party("kit", Leaf::client(None)),
    };
    // etcd asks every client for a certificate once it has a CA to check them against.
    let upstream = party("proxy-upstream", Leaf::client(None));
    let cluster = EtcdCluster::start_tls(&binaries, 1, &[], &tls)
        .await
        .unwrap_or_else(|e| panic!("start etcd with TLS: {e}"));
    let dns = start_dns(&[
        (
            "_etcd-client-ssl._tcp.example.test",
            vec![(0, 0, port(&cluster, 0), "localhost.")],
        ),
        // Plaintext: without --insecure-discovery it is not used (nothing listens there).
        (
            "_etcd-client._tcp.example.test",
            vec![(0, 0, 1, "localhost.")],
        ),
    ])
    .await;
    let flags = [
        format!("--discovery-srv={DOMAIN}"),
        format!("--cacert={}", upstream.ca.display()),
        format!("--cert={}", upstream.cert.display()),
        format!("--key={}", upstream.key.display()),
        dns.flag(),
    ];
    let proxy = start_proxy(&flags).await;
    put_get(&proxy.addr()).await;
    let metrics = proxy.metrics().await;
    assert!(support::metrics::upstream_up(&metrics, "localhost:1").is_none());
}

/// Runs the proxy with `flags` (after `start`), expects it to exit at start with an error, and returns its stderr.
async fn refused(flags: &[String]) -> String {
    let mut args = vec![
        "start".to_string(),
        format!("--listen-addr=127.0.0.1:{}", testkit::free_port()),
    ];
    args.extend_from_slice(flags);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let exited = support::proxy::try_start(&args).await;
    assert!(!exited.status.success(), "{args:?} should fail: {exited:?}");
    exited.stderr
}

fn assert_contains(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
}

#[tokio::test]
async fn no_records_stop_the_proxy_naming_the_domain_and_the_names_looked_up() {
    let dns = start_dns(&[]).await;
    let err = refused(&[format!("--discovery-srv={DOMAIN}"), dns.flag()]).await;
    let server = dns.addr.to_string();
    assert_contains(
        &err,
        &[
            "--discovery-srv=example.test: dns lookup errors:",
            &format!("lookup _etcd-client-ssl._tcp.example.test on {server}: no such host"),
            &format!("lookup _etcd-client._tcp.example.test on {server}: no such host"),
        ],
    );
}

#[tokio::test]
async fn records_that_resolve_to_no_usable_endpoint_stop_the_proxy() {
    // "." says the service is not offered (RFC 2782).
    let dns = start_dns(&[("_etcd-client._tcp.example.test", vec![(0, 0, 2379, ".")])]).await;
    let err = refused(&[
        format!("--discovery-srv={DOMAIN}"),
        "--insecure-discovery".into(),
        dns.flag(),
    ])
    .await;
    assert_contains(
        &err,
        &[
            "dns lookup errors",
            "lookup _etcd-client._tcp.example.test: no usable target",
        ],
    );
}

#[tokio::test]
async fn plaintext_records_alone_need_insecure_discovery() {
    let dns = start_dns(&[(
        "_etcd-client._tcp.example.test",
        vec![(0, 0, 2379, "localhost.")],
    )])
    .await;
    let err = refused(&[format!("--discovery-srv={DOMAIN}"), dns.flag()]).await;
    assert_contains(
        &err,
        &[
            "--discovery-srv=example.test: no secure endpoint",
            "_etcd-client-ssl._tcp.example.test",
            "http://localhost:2379",
            "--insecure-discovery",
        ],
    );
}

#[tokio::test]
async fn a_dns_server_that_does_not_answer_stops_the_proxy() {
    let port = testkit::free_port();
    let err = refused(&[
        format!("--discovery-srv={DOMAIN}"),
        format!("--discovery-srv-dns=127.0.0.1:{port}"),
    ])
    .await;
    assert_contains(
        &err,
        &[
            "dns lookup errors",
            &format!("lookup _etcd-client-ssl._tcp.example.test on 127.0.0.1:{port}"),
            &format!("lookup _etcd-client._tcp.example.test on 127.0.0.1:{port}"),
        ],
    );
}

#[tokio::test]
async fn endpoints_and_discovery_are_exclusive() {
    let err = refused(&[
        format!("--discovery-srv={DOMAIN}"),
        "--endpoints=127.0.0.1:2379".into(),
    ])
    .await;
    assert_contains(&err, &["--endpoints and --discovery-srv are exclusive"]);
}
