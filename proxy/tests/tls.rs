//! TLS on both sides, against real etcd serving TLS with `--client-cert-auth`: etcdctl and the `etcd-client` crate
//! through the proxy with mutual TLS towards it and mutual TLS from it to etcd; what etcd's certificate-based
//! identity means behind a proxy; rotation of every file on both sides without a restart; CRLs; the handshake
//! deadline; plaintext clients on the TLS port; `/health` and `/metrics` over HTTPS with HTTP/1.1 and HTTP/2;
//! `--metrics-addr`; `--auto-tls`.
//!
//! Two CAs, as in production: etcd's (it signs etcd's certificate and the client certificates etcd accepts, the
//! proxy's own among them) and the proxy's (it signs the proxy's certificate and its clients' certificates).

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use testkit::pki::{Ca, KeyAlg, Leaf, TlsPaths};
use testkit::{EtcdCluster, ProxyProcess, wait_for};

use support::proxy::PROXY_BIN;

const WAIT: Duration = Duration::from_secs(30);

/// The certificates of one test, in a directory of its own.
struct Pki {
    dir: tempfile::TempDir,
    etcd_ca: Ca,
    proxy_ca: Ca,
    /// What etcd serves with, and what the kit presents to it.
    etcd: testkit::etcd::EtcdTls,
    /// The proxy's CN-less certificate towards etcd, and etcd's CA.
    upstream: TlsPaths,
    /// The proxy's own certificate, and the CA its clients' certificates must chain to.
    listener: TlsPaths,
    /// A client of the proxy: the proxy's CA, and a certificate it signed.
    client: TlsPaths,
}

impl Pki {
    fn new() -> Self {
        let dir = testkit::dirs::temp_dir("proxy-tls-").expect("temp dir");
        let etcd_ca = Ca::new("etcd-ca").expect("etcd CA");
        let proxy_ca = Ca::new("proxy-ca").expect("proxy CA");
        let party = |ca: &Ca, name: &str, leaf: Leaf| {
            ca.write_party(dir.path(), name, &leaf)
                .unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let etcd = testkit::etcd::EtcdTls {
            // etcd's own gRPC gateway dials etcd with its server certificate, so that one is a client's too.
            server: party(&etcd_ca, "etcd-server", Leaf::server().client_auth()),
            client_cert_auth: true,
            client: party(&etcd_ca, "kit", Leaf::client(None)),
        };
        let upstream = party(&etcd_ca, "proxy-upstream", Leaf::client(None));
        // The proxy checks itself (`/proxy/health`) presenting its listener's certificate to its listener, which
        // requires client certificates here, as etcd's Go proxy does: so that one is a client's too.
        let listener = party(&proxy_ca, "proxy-server", Leaf::server().client_auth());
        let client = party(&proxy_ca, "client", Leaf::client(None));
        Self {
            dir,
            etcd_ca,
            proxy_ca,
            etcd,
            upstream,
            listener,
            client,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The proxy's flags for TLS on both sides.
    fn flags(&self) -> Vec<String> {
        let mut flags = self.upstream_flags();
        flags.extend(self.listener_flags());
        flags
    }

    fn upstream_flags(&self) -> Vec<String> {
        vec![
            flag("cacert", &self.upstream.ca),
            flag("cert", &self.upstream.cert),
            flag("key", &self.upstream.key),
        ]
    }

    fn listener_flags(&self) -> Vec<String> {
        vec![
            flag("cert-file", &self.listener.cert),
            flag("key-file", &self.listener.key),
            flag("trusted-ca-file", &self.listener.ca),
        ]
    }
}

fn flag(name: &str, path: &Path) -> String {
    format!("--{name}={}", path.display())
}

async fn tls_etcd(pki: &Pki, extra: &[&str]) -> Option<EtcdCluster> {
    let binaries = support::etcd()?;
    Some(
        EtcdCluster::start_tls(&binaries, 1, extra, &pki.etcd)
            .await
            .unwrap_or_else(|e| panic!("start etcd with TLS: {e}")),
    )
}

async fn tls_proxy(endpoints: &[String], flags: &[String], client: &TlsPaths) -> ProxyProcess {
    ProxyProcess::start_tls(Path::new(PROXY_BIN), endpoints, flags, &[], client)
        .await
        .unwrap_or_else(|e| panic!("start the proxy with TLS: {e}"))
}

/// The `etcd-client` crate connected to the proxy with `client`'s CA and certificate.
async fn rust_client(
    addr: &str,
    client: &TlsPaths,
) -> Result<etcd_client::Client, etcd_client::Error> {
    let read = |p: &Path| std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    let tls = TlsOptions::new()
        .ca_certificate(Certificate::from_pem(read(&client.ca)))
        .identity(Identity::from_pem(read(&client.cert), read(&client.key)));
    let options = ConnectOptions::new()
        .with_tls(tls)
        .with_connect_timeout(Duration::from_secs(5))
        .with_timeout(Duration::from_secs(30));
    etcd_client::Client::connect([format!("https://{addr}")], Some(options)).await
}

#[tokio::test]
async fn etcdctl_and_a_rust_client_work_through_mutual_tls_on_both_sides() {
    let pki = Pki::new();
    let Some(etcd) = tls_etcd(&pki, &[]).await else {
        return;
    };
    let proxy = tls_proxy(&etcd.endpoints(), &pki.flags(), &pki.client).await;
    let through = etcd
        .binaries()
        .etcdctl(&format!("https://{}", proxy.addr()))
        .with_tls(&pki.client);
    through.ok(&["put", "k", "v1"]).await;
    assert_eq!(
        through.ok(&["get", "k", "--print-value-only"]).await.trim(),
        "v1"
    );
    // What went through the proxy is in etcd, read directly.
    assert_eq!(
        etcd.etcdctl(0)
            .ok(&["get", "k", "--print-value-only"])
            .await
            .trim(),
        "v1"
    );

    let mut client = rust_client(&proxy.addr(), &pki.client)
        .await
        .expect("connect");
    let mut events = client.watch("w", None).await.expect("watch");
    // The watcher exists once its creation is answered; a write before that would not be seen.
    let created = tokio::time::timeout(WAIT, events.message())
        .await
        .expect("the watcher's creation within the deadline")
        .expect("watch stream")
        .expect("an answer");
    assert!(created.created(), "{created:?}");
    client.put("w", "x", None).await.expect("put");
    let next_event = async {
        loop {
            let answer = events
                .message()
                .await
                .expect("watch stream")
                .expect("an answer");
            let values: Vec<Vec<u8>> = answer
                .events()
                .iter()
                .filter_map(|e| e.kv())
                .map(|kv| kv.value().to_vec())
                .collect();
            if !values.is_empty() {
                return values;
            }
        }
    };
    let values = tokio::time::timeout(WAIT, next_event)
        .await
        .expect("a watch event within the deadline");
    assert_eq!(values, [b"x".to_vec()]);
    let lease = client.lease_grant(30, None).await.expect("lease grant");
    let (mut keeper, mut renewals) = client
        .lease_keep_alive(lease.id())
        .await
        .expect("keep-alive");
    keeper.keep_alive().await.expect("send a renewal");
    let renewed = tokio::time::timeout(WAIT, renewals.message())
        .await
        .expect("a renewal answer within the deadline")
        .expect("keep-alive stream")
        .expect("an answer");
    assert_eq!(renewed.id(), lease.id());
    assert!(renewed.ttl() > 0, "{renewed:?}");
}

#[tokio::test]
async fn clients_without_a_certificate_the_proxy_trusts_are_refused() {
    let pki = Pki::new();
    let Some(etcd) = tls_etcd(&pki, &[]).await else {
        return;
    };
    let proxy = tls_proxy(&etcd.endpoints(), &pki.flags(), &pki.client).await;
    let url = format!("https://{}", proxy.addr());
    // No certificate at all.
    let anonymous = etcd.binaries().etcdctl(&url).with_cacert(&pki.client.ca);
    let out = anonymous.run(&["get", "k"], None).await;
    assert!(
        !out.success(),
        "a client without a certificate was served: {out:?}"
    );
    // A certificate from etcd's CA, which etcd would take but the proxy does not trust.
    let stranger = TlsPaths {
        ca: pki.client.ca.clone(),
        ..pki.etcd.client.clone()
    };
    let out = etcd
        .binaries()
        .etcdctl(&url)
        .with_tls(&stranger)
        .run(&["get", "k"], None)
        .await;
    assert!(
        !out.success(),
        "a client with an untrusted certificate was served: {out:?}"
    );
    // The trusted client is served.
    let trusted = etcd.binaries().etcdctl(&url).with_tls(&pki.client);
    trusted.ok(&["get", "k"]).await;
}

/// With `--client-cert-auth`, etcd runs a request without a token as the user its certificate's Common Name names.
/// The proxy's certificate has none, so a token-less client of the proxy gets no one's rights; a token still
/// works.
#[tokio::test]
async fn behind_the_proxy_a_caller_without_a_token_is_nobody() {
    let pki = Pki::new();
    let Some(etcd) = tls_etcd(&pki, &[]).await else {
        return;
    };
    // The kit's own certificate is CN-less too: enable auth as root with a password.
    let direct = etcd.etcdctl(0);
    direct.ok(&["user", "add", "root:rootpw"]).await;
    direct.ok(&["auth", "enable"]).await;
    let proxy = tls_proxy(&etcd.endpoints(), &pki.flags(), &pki.client).await;
    let through = etcd
        .binaries()
        .etcdctl(&format!("https://{}", proxy.addr()))
        .with_tls(&pki.client);
    let out = through.run(&["put", "k", "v"], None).await;
    assert!(
        !out.success(),
        "a token-less put through the proxy succeeded: {out:?}"
    );
    through.ok(&["--user=root:rootpw", "put", "k", "v"]).await;
    assert_eq!(
        through
            .ok(&["--user=root:rootpw", "get", "k", "--print-value-only"])
            .await
            .trim(),
        "v"
    );
}

/// The serial number of the certificate a TLS server at `addr` presents, read by `openssl s_client`.
async fn served_serial(addr: &str) -> Result<String, String> {
    let script = format!(
        "openssl s_client -connect {addr} </dev/null 2>/dev/null | openssl x509 -noout -serial"
    );
    let out = tokio::process::Command::new("sh")
        .args(["-c", &script])
        .output()
        .await
        .map_err(|e| format!("run openssl: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    text.strip_prefix("serial=")
        .map(|s| s.to_ascii_lowercase())
        .ok_or_else(|| format!("no serial from openssl: {text:?}"))
}

fn hex_serial(serial: u64) -> String {
    let hex = format!("{serial:x}");
    if hex.len() % 2 == 1 {
        format!("0{hex}")
    } else {
        hex
    }
}

/// Certificates and keys replaced on disk, on both sides, while clients keep calling: new connections use the new
/// files, calls on open connections and new ones never fail, and nothing restarts.
#[tokio::test]
async fn rotated_certificates_take_effect_for_new_connections_without_a_failed_call() {
    let pki = Pki::new();
    let Some(etcd) = tls_etcd(&pki, &[]).await else {
        return;
    };
    let proxy = tls_proxy(&etcd.endpoints(), &pki.flags(), &pki.client).await;
    let pid = proxy.pid();
    let before = served_serial(&proxy.addr()).await.expect("served serial");

    // Load on one long-lived connection while files change under it.
    let mut long_lived = rust_client(&proxy.addr(), &pki.client)
        .await
        .expect("connect");
    long_lived.put("load", "0", None).await.expect("put");

    // The proxy's certificate towards clients, and its certificate towards etcd, replaced by new ones.
    let new_listener = pki.proxy_ca.issue(&Leaf::server()).expect("issue");
    testkit::pki::replace(&pki.listener.key, &new_listener.key_pem).expect("replace key");
    // Between the two replacements the pair does not match: the last good pair must stay in use.
    let mut during = rust_client(&proxy.addr(), &pki.client)
        .await
        .expect("connect while half replaced");
    during
        .put("load", "1", None)
        .await
        .expect("put while half replaced");
    testkit::pki::replace(&pki.listener.cert, &new_listener.cert_pem).expect("replace cert");
    let new_upstream = pki.etcd_ca.issue(&Leaf::client(None)).expect("issue");
    testkit::pki::replace(&pki.upstream.cert, &new_upstream.cert_pem).expect("replace");
    testkit::pki::replace(&pki.upstream.key, &new_upstream.key_pem).expect("replace");

    let want = hex_serial(new_listener.serial);
    assert_ne!(before, want);
    wait_for("the proxy to present its new certificate", WAIT, || async {
        match served_serial(&proxy.addr()).await {
            Ok(serial) if serial == want => Ok(()),
            other => Err(format!("serving {other:?}, want {want}")),
        }
    })
    .await;
    for i in 2..20 {
        let value = i.to_string();
        long_lived
            .put("load", value.as_str(), None)
            .await
            .expect("put on the old connection");
        let mut fresh = rust_client(&proxy.addr(), &pki.client)
            .await
            .expect("connect anew");
        let got = fresh
            .get("load", None)
            .await
            .expect("get on a new connection");
        assert_eq!(got.kvs()[0].value(), value.as_bytes());
    }
    assert_eq!(proxy.pid(), pid);
}

/// `--cacert` replaced on disk takes effect for new connections to etcd: a proxy started trusting the wrong CA
/// answers `Unavailable` with the reason, then serves once the right CA is in the file, without a restart.
#[tokio::test]
async fn a_wrong_ca_towards_etcd_is_unavailable_with_the_reason_until_the_file_is_fixed() {
    let pki = Pki::new();
    let Some(etcd) = tls_etcd(&pki, &[]).await else {
        return;
    };
    let cacert = pki.path("rotating-ca.pem");
    std::fs::write(&cacert, pki.proxy_ca.cert_pem()).expect("write the wrong CA");
    let mut flags = pki.listener_flags();
    flags.extend([
        flag("cacert", &cacert),
        flag("cert", &pki.upstream.cert),
        flag("key", &pki.upstream.key),
    ]);
    // Not `tls_proxy`: that waits for a healthy proxy, and this one cannot reach etcd yet.
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let mut command = std::process::Command::new(PROXY_BIN);
    command
        .arg("start")
        .arg(format!("--endpoints={}", etcd.endpoints_arg()))
        .arg(format!("--listen-addr={addr}"))
        .args(&flags);
    let log = pki.path("proxy.log");
    let mut proxy = testkit::process::Process::spawn("proxy", command, &log).expect("spawn");
    proxy
        .wait_http_with(&addr, "/health", Some(&pki.client), WAIT, |code, _| {
            code == 503
        })
        .await
        .expect("an unhealthy proxy");
    let mut client = rust_client(&addr, &pki.client).await.expect("connect");
    let err = client
        .get("k", None)
        .await
        .expect_err("etcd's certificate is not trusted");
    let etcd_client::Error::GRpcStatus(status) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("certificate") || status.message().contains("UnknownIssuer"),
        "the reason is not given: {status:?}"
    );
    let logged = std::fs::read_to_string(&log).expect("read the log");
    assert_eq!(
        logged.matches("TLS handshake with etcd failed").count(),
        1,
        "one log line per endpoint, however often it is dialled:\n{logged}"
    );
    testkit::pki::replace(&cacert, pki.etcd_ca.cert_pem()).expect("replace the CA");
    wait_for("a read through the proxy", WAIT, || {
        let mut client = client.clone();
        async move {
            client
                .get("k", None)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    })
    .await;
}

/// Waits until `client`'s `get` is refused: the proxy looks at its TLS files every `proxy::tls::reload::POLL`, so a
/// file replaced on disk decides from its next look on.
async fn refused_from_the_next_look(who: &str, client: &testkit::Etcdctl) {
    wait_for(&format!("{who} refused"), WAIT, || async {
        let out = client.run(&["get", "k"], None).await;
        if out.success() {
            Err(format!("served: {out:?}"))
        } else {
            Ok(())
        }
    })
    .await;
}

/// A certificate revoked in `--client-crl-file` is refused once the proxy has looked at the CRL file again.
#[tokio::test]
async fn a_revoked_client_certificate_is_refused_once_the_crl_file_is_read_again() {
    let pki = Pki::new();
    let Some(etcd) = tls_etcd(&pki, &[]).await else {
        return;
    };
    let crl = pki.path("clients.crl");
    std::fs::write(&crl, pki.proxy_ca.crl(&[]).expect("empty CRL")).expect("write CRL");
    let revoked_client = pki
        .proxy_ca
        .write_party(pki.dir.path(), "revoked-client", &Leaf::client(None))
        .expect("client");
    let serial = {
        let der = std::fs::read_to_string(&revoked_client.cert).expect("read");
        serial_of(&der)
    };
    let mut flags = pki.flags();
    flags.push(flag("client-crl-file", &crl));
    let proxy = tls_proxy(&etcd.endpoints(), &flags, &pki.client).await;
    let url = format!("https://{}", proxy.addr());
    let revoked = etcd.binaries().etcdctl(&url).with_tls(&revoked_client);
    revoked.ok(&["put", "k", "before"]).await;
    testkit::pki::replace(&crl, &pki.proxy_ca.crl(&[serial]).expect("CRL")).expect("replace CRL");
    refused_from_the_next_look("the revoked certificate", &revoked).await;
    // Everyone else still is.
    etcd.binaries()
        .etcdctl(&url)
        .with_tls(&pki.client)
        .ok(&["get", "k"])
        .await;
}

/// The serial number of a PEM certificate, as `openssl x509` reads it.
fn serial_of(pem: &str) -> u64 {
    let out = std::process::Command::new("sh")
        .args(["-c", "openssl x509 -noout -serial"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(pem.as_bytes())?;
            child.wait_with_output()
        })
        .expect("run openssl");
    let text = String::from_utf8_lossy(&out.stdout);
    let hex = text.trim().strip_prefix("serial=").expect("a serial");
    u64::from_str_radix(hex, 16).expect("a serial that fits u64")
}

/// A client that opens TCP and never starts its handshake is disconnected at the deadline; a plaintext HTTP client
/// is told what went wrong; and the proxy keeps serving.
#[tokio::test]
async fn silent_and_plaintext_clients_on_the_tls_port_are_closed_cleanly() {
    let pki = Pki::new();
    let Some(etcd) = tls_etcd(&pki, &[]).await else {
        return;
    };
    let proxy = tls_proxy(&etcd.endpoints(), &pki.flags(), &pki.client).await;
    let (code, body) = testkit::http::get(&proxy.addr(), "/health")
        .await
        .expect("an answer");
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("HTTP request to an HTTPS server"), "{body}");

    assert!(
        support::net::silent_connection_closed_within(&proxy.addr(), Duration::from_secs(60)).await,
        "a silent connection was kept open for a minute"
    );
    etcd.binaries()
        .etcdctl(&format!("https://{}", proxy.addr()))
        .with_tls(&pki.client)
        .ok(&["get", "k"])
        .await;
}

/// `curl` to `/health` and `/metrics` over HTTPS, speaking HTTP/1.1 and HTTP/2: the HTTP version it used, the status
/// and the body.
async fn curl(url: &str, http: &str, client: &TlsPaths) -> (String, String) {
    curl_with(url, http, client, &[]).await
}

/// [`curl`] with more arguments (`-d BODY` for a POST).
async fn curl_with(url: &str, http: &str, client: &TlsPaths, extra: &[&str]) -> (String, String) {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "10", http])
        .args(extra)
        .arg("--cacert")
        .arg(&client.ca)
        .arg("--cert")
        .arg(&client.cert)
        .arg("--key")
        .arg(&client.key)
        .args(["-w", "\n%{http_version} %{http_code}", url])
        .output()
        .await
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    (
        status.to_string(),
        format!("{body}{}", String::from_utf8_lossy(&out.stderr)),
    )
}

/// Every admin route over HTTPS, HTTP/1.1 and HTTP/2: `/health` (etcd through the proxy), `/proxy/health` (the
/// proxy through its own TLS listener, which requires client certificates here), `/metrics` (etcd's, relayed from
/// the TLS member over HTTP/2) and `/proxy/metrics` (the proxy's own).
#[tokio::test]
async fn health_and_metrics_answer_over_https_with_http1_and_http2() {
    let pki = Pki::new();
    let Some(etcd) = tls_etcd(&pki, &[]).await else {
        return;
    };
    let proxy = tls_proxy(&etcd.endpoints(), &pki.flags(), &pki.client).await;
    for (http, version) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let get = |path: &'static str| {
            let url = format!("https://{}{path}", proxy.addr());
            let client = &pki.client;
            async move { curl(&url, http, client).await }
        };
        for path in ["/health", "/proxy/health"] {
            let (status, body) = get(path).await;
            assert_eq!(status, format!("{version} 200"), "{path}: {body}");
            assert!(body.contains("\"health\":\"true\""), "{path}: {body}");
        }
        let (status, body) = get("/metrics").await;
        assert_eq!(status, format!("{version} 200"), "{body}");
        assert!(body.contains("etcd_server_has_leader"), "etcd's: {body}");
        assert!(
            !body.contains("etcd_grpc_proxy_upstream_up"),
            "not the proxy's: {body}"
        );
        let (status, body) = get("/proxy/metrics").await;
        assert_eq!(status, format!("{version} 200"), "{body}");
        assert!(body.contains("etcd_grpc_proxy_upstream_up"), "{body}");
    }
}

#[tokio::test]
async fn metrics_addr_serves_over_http_and_https_but_not_grpc() {
    let pki = Pki::new();
    let Some(etcd) = tls_etcd(&pki, &[]).await else {
        return;
    };
    for scheme in ["http", "https"] {
        let metrics_addr = format!("127.0.0.1:{}", testkit::free_port());
        let mut flags = pki.flags();
        flags.push(format!("--metrics-addr={scheme}://{metrics_addr}"));
        let proxy = tls_proxy(&etcd.endpoints(), &flags, &pki.client).await;
        let tls = (scheme == "https").then_some(&pki.client);
        let get = |path: &'static str| {
            let addr = &metrics_addr;
            async move {
                testkit::http::get_with(addr, path, tls)
                    .await
                    .unwrap_or_else(|e| panic!("{scheme}: GET {path}: {e}"))
            }
        };
        let (code, body) = get("/proxy/metrics").await;
        assert_eq!(code, 200, "{scheme}: {body}");
        assert!(
            body.contains("etcd_grpc_proxy_upstream_up"),
            "{scheme}: {body}"
        );
        let (code, body) = get("/metrics").await;
        assert_eq!(code, 200, "{scheme}: {body}");
        assert!(body.contains("etcd_server_has_leader"), "{scheme}: {body}");
        for path in ["/health", "/proxy/health"] {
            let (code, body) = get(path).await;
            assert_eq!(code, 200, "{scheme} {path}: {body}");
        }
        // gRPC is served on the main port only.
        let ctl = etcd
            .binaries()
            .etcdctl(&format!("{scheme}://{metrics_addr}"));
        let ctl = if scheme == "https" {
            ctl.with_tls(&pki.client)
        } else {
            ctl
        };
        let out = ctl.run(&["get", "k", "--command-timeout=3s"], None).await;
        assert!(!out.success(), "gRPC answered on --metrics-addr: {out:?}");
        drop(proxy);
    }
}

/// `--auto-tls` makes a certificate under `<data-dir>/fixtures/proxy`; a P-521 pair already there (what Go's
/// proxy and etcd's own `--auto-tls` make) is reused as it is.
#[tokio::test]
async fn auto_tls_serves_a_p521_pair_left_in_the_data_dir() {
    let pki = Pki::new();
    let Some(etcd) = tls_etcd(&pki, &[]).await else {
        return;
    };
    let data_dir = pki.path("data");
    let fixtures = data_dir.join("fixtures").join("proxy");
    std::fs::create_dir_all(&fixtures).expect("mkdir");
    let go_ca = Ca::with_alg("go-proxy-auto", KeyAlg::P521).expect("P-521 CA");
    let left = go_ca
        .issue(&Leaf::server().alg(KeyAlg::P521))
        .expect("P-521 certificate");
    std::fs::write(fixtures.join("cert.pem"), &left.cert_pem).expect("write");
    std::fs::write(fixtures.join("key.pem"), &left.key_pem).expect("write");
    let mut flags = pki.upstream_flags();
    flags.extend([
        "--auto-tls".to_string(),
        format!("--data-dir={}", data_dir.display()),
    ]);
    let client = TlsPaths {
        ca: go_ca
            .write(pki.dir.path(), "go-proxy-auto-ca")
            .expect("write"),
        ..pki.client.clone()
    };
    let proxy = tls_proxy(&etcd.endpoints(), &flags, &client).await;
    assert_eq!(
        served_serial(&proxy.addr()).await.expect("serial"),
        hex_serial(left.serial)
    );
    etcd.binaries()
        .etcdctl(&format!("https://{}", proxy.addr()))
        .with_cacert(&client.ca)
        .ok(&["put", "auto", "tls"])
        .await;
}

/// `--trusted-ca-file` replaced on disk decides which clients new connections accept: clients of the old CA are
/// refused, clients of the new one served, without a restart.
#[tokio::test]
async fn a_replaced_client_ca_bundle_decides_who_may_connect() {
    let pki = Pki::new();
    let Some(etcd) = tls_etcd(&pki, &[]).await else {
        return;
    };
    let trusted = pki.path("trusted-clients.pem");
    std::fs::write(&trusted, pki.proxy_ca.cert_pem()).expect("write the client CA");
    let mut flags = pki.upstream_flags();
    flags.extend([
        flag("cert-file", &pki.listener.cert),
        flag("key-file", &pki.listener.key),
        flag("trusted-ca-file", &trusted),
    ]);
    let proxy = tls_proxy(&etcd.endpoints(), &flags, &pki.client).await;
    let url = format!("https://{}", proxy.addr());
    let old_client = etcd.binaries().etcdctl(&url).with_tls(&pki.client);
    old_client.ok(&["put", "k", "v"]).await;

    let new_ca = Ca::new("new-client-ca").expect("CA");
    let new_client = TlsPaths {
        ca: pki.client.ca.clone(),
        ..new_ca
            .write_party(pki.dir.path(), "new-client", &Leaf::client(None))
            .expect("client")
    };
    testkit::pki::replace(&trusted, new_ca.cert_pem()).expect("replace the client CA");
    refused_from_the_next_look("a client of the replaced CA", &old_client).await;
    let served = etcd.binaries().etcdctl(&url).with_tls(&new_client);
    assert_eq!(
        served.ok(&["get", "k", "--print-value-only"]).await.trim(),
        "v"
    );
}

/// etcd's JSON gateway over HTTPS, HTTP/1.1 and HTTP/2, with mutual TLS on both sides: a put and a range through the
/// proxy, and an error written as the etcd behind writes it (its form learned over TLS from etcd's own gateway).
#[tokio::test]
async fn the_json_gateway_answers_over_https_with_http1_and_http2() {
    let pki = Pki::new();
    let Some(etcd) = tls_etcd(&pki, &[]).await else {
        return;
    };
    let proxy = tls_proxy(&etcd.endpoints(), &pki.flags(), &pki.client).await;
    let json = |text: &str| -> serde_json::Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    };
    for (http, version) in [("--http1.1", "1.1"), ("--http2", "2")] {
        let post = |path: &'static str, body: &'static str| {
            let url = format!("https://{}{path}", proxy.addr());
            let client = &pki.client;
            async move { curl_with(&url, http, client, &["-d", body]).await }
        };
        let (status, _) = post("/v3/kv/put", r#"{"key":"Zm9v","value":"YmFy"}"#).await;
        assert_eq!(status, format!("{version} 200"));
        let (status, body) = post("/v3/kv/range", r#"{"key":"Zm9v"}"#).await;
        assert_eq!(status, format!("{version} 200"), "{body}");
        assert_eq!(json(&body)["kvs"][0]["value"], "YmFy", "{body}");

        let revoke = r#"{"ID":"99"}"#;
        let (status, through) = post("/v3/lease/revoke", revoke).await;
        let direct_url = format!("https://{}/v3/lease/revoke", etcd.addr(0));
        // etcd hands HTTP/2 to its gRPC server, so its own gateway is asked over HTTP/1.1.
        let (direct_status, direct) =
            curl_with(&direct_url, "--http1.1", &pki.etcd.client, &["-d", revoke]).await;
        assert_eq!(status, format!("{version} 404"), "{through}");
        assert_eq!(direct_status, "1.1 404", "{direct}");
        assert_eq!(json(&through), json(&direct));
    }
}
