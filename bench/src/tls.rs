//! `--tls`: the certificates of a TLS stack, made by the test kit ([`testkit::pki`]), one CA signing them all, in a
//! temporary directory that lives as long as the stack.
//!
//! - etcd serves its clients over TLS with `--client-cert-auth` ([`EtcdTls`]). Its certificate carries clientAuth
//!   as well as serverAuth: etcd 3.5's gRPC gateway dials etcd itself presenting it, and Go refuses a certificate
//!   without clientAuth there ("incompatible key usage"); [`Leaf::server`] alone has serverAuth only.
//! - Both proxies take the same flags: towards etcd `--cacert`, `--cert`, `--key` (a client certificate without a
//!   Common Name: both proxies refuse one with a CN, under which etcd would run their clients' requests), towards
//!   their clients `--cert-file`, `--key-file` and `--trusted-ca-file` (a client certificate is required).
//! - The benchmark's own clients (the load, etcd's `/metrics`, readiness checks) present one client certificate
//!   without a Common Name, to etcd and to both proxies alike.

use testkit::etcd::EtcdTls;
use testkit::pki::{Ca, Leaf, TlsPaths};

/// The certificates of one TLS stack, on disk.
pub struct Pki {
    etcd: EtcdTls,
    proxy_upstream: TlsPaths,
    proxy_server: TlsPaths,
    _dir: tempfile::TempDir,
}

impl Pki {
    /// A fresh CA and every certificate of the stack, written into a new temporary directory.
    pub fn new() -> Result<Self, String> {
        let dir = testkit::dirs::temp_dir("bench-pki-")
            .map_err(|e| format!("a directory for certificates: {e}"))?;
        let ca = Ca::new("bench CA")?;
        let party = |name: &str, leaf: Leaf| ca.write_party(dir.path(), name, &leaf);
        let etcd = EtcdTls {
            server: party("etcd", Leaf::server().client_auth())?,
            client_cert_auth: true,
            client: party("client", Leaf::client(None))?,
        };
        Ok(Self {
            etcd,
            proxy_upstream: party("proxy-upstream", Leaf::client(None))?,
            proxy_server: party("proxy-server", Leaf::server())?,
            _dir: dir,
        })
    }

    /// etcd's TLS (its `client` is the benchmark's client certificate).
    pub fn etcd(&self) -> &EtcdTls {
        &self.etcd
    }

    /// What the benchmark's clients present to etcd and to both proxies, and the CA they trust.
    pub fn client(&self) -> &TlsPaths {
        &self.etcd.client
    }

    /// The TLS flags of both proxies, towards etcd and towards their clients.
    pub fn proxy_flags(&self) -> Vec<String> {
        let (up, server) = (&self.proxy_upstream, &self.proxy_server);
        [
            ("--cacert", &up.ca),
            ("--cert", &up.cert),
            ("--key", &up.key),
            ("--cert-file", &server.cert),
            ("--key-file", &server.key),
            ("--trusted-ca-file", &server.ca),
        ]
        .into_iter()
        .map(|(flag, path)| format!("{flag}={}", path.display()))
        .collect()
    }
}
