//! Real etcd with TLS on its client URLs and `--client-cert-auth`, with certificates of `testkit::pki`: every
//! version as a process, and every imaged version in a container, serves etcdctl presenting a client certificate
//! without a Common Name, and refuses clients without a certificate, with a certificate of another CA, or in the
//! clear; with auth enabled, a certificate's Common Name is its user, and a certificate without one is nobody.
//! Under `CI=true` a missing version or backend fails; elsewhere it is a skip.

use std::path::Path;

use testkit::etcd::EtcdTls;
use testkit::pki::{Ca, KeyAlg, Leaf, TlsPaths};
use testkit::{Backend, Etcd, EtcdCluster, Version};

/// One CA (of `alg`), etcd's certificate and a CN-less client certificate, written into `dir`.
fn etcd_tls(dir: &Path, alg: KeyAlg) -> (Ca, EtcdTls) {
    let ca = Ca::with_alg("testkit-tls-test-ca", alg).expect("CA");
    let server = ca
        .write_party(dir, "etcd", &Leaf::server().client_auth().alg(alg))
        .expect("etcd's certificate");
    let client = ca
        .write_party(dir, "client", &Leaf::client(None).alg(alg))
        .expect("client certificate");
    let tls = EtcdTls {
        server,
        client_cert_auth: true,
        client,
    };
    (ca, tls)
}

/// A client certificate of another CA, with the first CA to verify etcd by.
fn stranger(dir: &Path, tls: &EtcdTls) -> TlsPaths {
    let other = Ca::new("testkit-tls-test-other-ca").expect("other CA");
    let issued = other.client(None).expect("stranger's certificate");
    let (cert, key) = issued.write(dir, "stranger").expect("write");
    TlsPaths {
        ca: tls.client.ca.clone(),
        cert,
        key,
    }
}

/// What a client with `ctl` gets for a put: refused (and the output says so), or a panic.
async fn assert_refused(ctl: &testkit::Etcdctl, who: &str) {
    let out = ctl
        .run(
            &["put", "k", who, "--dial-timeout=1s", "--command-timeout=2s"],
            None,
        )
        .await;
    assert!(!out.success(), "etcd accepted {who}:\n{out}");
    assert!(!out.hung, "{who}: etcdctl hung:\n{out}");
}

/// The behaviour every TLS etcd must show, whatever runs it: put/get with the CN-less client certificate; no
/// certificate, a stranger's certificate and a plaintext connection are refused; `/health` answers over TLS only;
/// under auth a certificate named `root` (of `ca`) is root and the CN-less one is nobody.
async fn check(etcd: &Etcd, ca: &Ca, binaries: &testkit::Binaries, dir: &Path, label: &str) {
    let tls = etcd.tls().expect("a TLS etcd");
    assert_eq!(etcd.endpoint(), format!("https://{}", etcd.addr()));
    let ctl = etcd.etcdctl(binaries);
    assert_eq!(ctl.ok(&["put", "k", "v"]).await, "OK\n", "{label}");
    assert_eq!(
        ctl.ok(&["get", "k", "--print-value-only"]).await,
        "v\n",
        "{label}"
    );
    let status = ctl.ok(&["endpoint", "status", "-w", "json"]).await;
    assert!(
        status.contains(binaries.version.name()),
        "{label}: {status}"
    );

    let endpoint = etcd.endpoint();
    let no_cert = binaries.etcdctl(&endpoint).with_cacert(&tls.client.ca);
    assert_refused(&no_cert, "a client without a certificate").await;
    let other = binaries.etcdctl(&endpoint).with_tls(&stranger(dir, tls));
    assert_refused(&other, "a certificate of another CA").await;
    let plain = binaries.etcdctl(&format!("http://{}", etcd.addr()));
    assert_refused(&plain, "a plaintext client").await;
    assert_eq!(
        ctl.ok(&["get", "k", "--print-value-only"]).await,
        "v\n",
        "{label}: a refused client changed the key"
    );

    let (code, body) = testkit::http::get_tls(&etcd.addr(), "/health", &tls.client)
        .await
        .unwrap_or_else(|e| panic!("{label}: GET /health over TLS: {e}"));
    assert_eq!(code, 200, "{label}: {body}");
    assert!(body.contains("\"health\":\"true\""), "{label}: {body}");
    let plain = testkit::http::get(&etcd.addr(), "/health").await;
    assert!(
        !matches!(plain, Ok((200, _))),
        "{label}: /health answered in the clear: {plain:?}"
    );

    // With auth on, --client-cert-auth takes a certificate's Common Name as the user of a request without a
    // token: a certificate named `root` is root, one without a name is the user "", who is denied (in the clear
    // etcd says "user name is empty" instead). Why the proxy's certificate towards etcd must have no name.
    ctl.ok(&["user", "add", "root", "--new-user-password=rootpw"])
        .await;
    ctl.ok(&["auth", "enable"]).await;
    let anonymous = ctl.run(&["put", "k", "anonymous"], None).await;
    assert!(
        !anonymous.success() && anonymous.stderr.contains("permission denied"),
        "{label}: a CN-less certificate under auth:\n{anonymous}"
    );
    let root = ca
        .write_party(dir, "root", &Leaf::client(Some("root")))
        .expect("root's certificate");
    let as_root = binaries.etcdctl(&endpoint).with_tls(&root);
    assert_eq!(as_root.ok(&["put", "k", "root"]).await, "OK\n", "{label}");
    assert_eq!(
        as_root.ok(&["get", "k", "--print-value-only"]).await,
        "root\n",
        "{label}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_version_serves_tls_clients_with_a_certificate_and_refuses_the_others() {
    for version in Version::ALL {
        let Some(binaries) = version.require() else {
            continue;
        };
        let dir = testkit::dirs::temp_dir("testkit-tls-").expect("temp dir");
        let (ca, tls) = etcd_tls(dir.path(), KeyAlg::P256);
        let cluster = EtcdCluster::start_tls(&binaries, 1, &[], &tls)
            .await
            .unwrap_or_else(|e| panic!("etcd {version} with TLS: {e}"));
        assert_eq!(cluster.endpoint(0), format!("https://{}", cluster.addr(0)));
        let etcd = Etcd::Process(Box::new(cluster));
        check(
            &etcd,
            &ca,
            &binaries,
            dir.path(),
            &format!("etcd {version}"),
        )
        .await;
        etcd.stop().await;
    }
}

/// etcd's `--auto-tls` makes P-521 certificates; etcd serves with one of ours as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_serves_tls_with_p521_certificates() {
    let version = Version::from_env();
    let Some(binaries) = version.require() else {
        return;
    };
    let dir = testkit::dirs::temp_dir("testkit-tls-").expect("temp dir");
    let (_ca, tls) = etcd_tls(dir.path(), KeyAlg::P521);
    let cluster = EtcdCluster::start_tls(&binaries, 1, &[], &tls)
        .await
        .unwrap_or_else(|e| panic!("etcd {version} with P-521 TLS: {e}"));
    let ctl = cluster.etcdctl(0);
    assert_eq!(ctl.ok(&["put", "k", "p521"]).await, "OK\n");
    assert_eq!(ctl.ok(&["get", "k", "--print-value-only"]).await, "p521\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_of_each_imaged_version_serve_tls_the_same_way() {
    for spec in testkit::etcd::discover()
        .await
        .into_iter()
        .filter(|s| s.backend == Backend::Container)
    {
        if let Some(why) = spec.missing() {
            assert!(
                !testkit::ci(),
                "{} missing under CI=true: {why}",
                spec.label()
            );
            eprintln!("SKIPPED {}: {why}", spec.label());
            continue;
        }
        let binaries = spec.binaries.clone().expect("binaries");
        let dir = testkit::dirs::temp_dir("testkit-tls-").expect("temp dir");
        let (ca, tls) = etcd_tls(dir.path(), KeyAlg::P256);
        let etcd = Etcd::start_tls(&spec, &[], &tls)
            .await
            .unwrap_or_else(|e| panic!("{} with TLS: {e}", spec.label()));
        check(&etcd, &ca, &binaries, dir.path(), &spec.label()).await;
        etcd.stop().await;
    }
}
