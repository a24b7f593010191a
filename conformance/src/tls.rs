//! The certificates of a run of the `tls` profile, made in this process with `testkit::pki` into a temporary
//! directory that lives as long as the [`Pki`].
//!
//! Two CAs, one per side of the proxy, so that a proxy that checked one side against the other side's CA fails:
//!
//! | who | certificate | issued by | trusts |
//! |---|---|---|---|
//! | etcd (`--cert-file`, `--trusted-ca-file`, `--client-cert-auth`) | serverAuth + clientAuth, for `127.0.0.1`/`localhost` | etcd CA | etcd CA |
//! | etcdctl on etcd itself (direct runs, reading etcd after a run) | CN-less client | etcd CA | etcd CA |
//! | the proxy towards etcd (`--cacert`, `--cert`, `--key`) | CN-less client | etcd CA | etcd CA |
//! | the proxy towards clients (`--cert-file`, `--key-file`, `--trusted-ca-file`) | server, for `127.0.0.1`/`localhost` | proxy CA | proxy CA |
//! | etcdctl and Rust clients of the proxy | CN-less client | proxy CA | proxy CA |
//!
//! Every client certificate lacks a Common Name: etcd's `--client-cert-auth` would take one for a user name (and
//! the proxy refuses a `--cert` that has one), so without one the same requests mean the same on every target.

use testkit::etcd::EtcdTls;
use testkit::pki::{Ca, Leaf, TlsPaths};

/// The run's certificate files.
pub struct Pki {
    _dir: tempfile::TempDir,
    /// etcd's TLS, with the certificate etcdctl presents to etcd itself.
    pub etcd: EtcdTls,
    /// The proxy towards etcd: the etcd CA, and its CN-less client certificate.
    pub proxy_upstream: TlsPaths,
    /// The proxy towards its clients: its server certificate, and the CA its clients' certificates come from.
    pub proxy_server: TlsPaths,
    /// What clients of the proxy present: the proxy CA, and a CN-less client certificate of it.
    pub proxy_clients: TlsPaths,
}

impl Pki {
    /// Makes both CAs and every certificate, and writes them as PEM files into a new temporary directory.
    pub fn new() -> Result<Pki, String> {
        let dir =
            testkit::dirs::temp_dir("conformance-pki-").map_err(|e| format!("PKI dir: {e}"))?;
        let etcd_ca = Ca::new("conformance etcd CA")?;
        let proxy_ca = Ca::new("conformance proxy CA")?;
        let d = dir.path();
        // etcd presents its own certificate as a client too (its gRPC gateway dials itself), so it needs both.
        let etcd_server = etcd_ca.write_party(d, "etcd", &Leaf::server().client_auth())?;
        let etcd_clients = etcd_ca.write_party(d, "etcd-client", &Leaf::client(None))?;
        let proxy_upstream = etcd_ca.write_party(d, "proxy-upstream", &Leaf::client(None))?;
        let proxy_server = proxy_ca.write_party(d, "proxy", &Leaf::server())?;
        let proxy_clients = proxy_ca.write_party(d, "proxy-client", &Leaf::client(None))?;
        Ok(Pki {
            _dir: dir,
            etcd: EtcdTls {
                server: etcd_server,
                client_cert_auth: true,
                client: etcd_clients,
            },
            proxy_upstream,
            proxy_server,
            proxy_clients,
        })
    }

    /// The proxy's TLS flags, both sides (the names of `etcd grpc-proxy start`).
    pub fn proxy_flags(&self) -> Vec<String> {
        let path = |p: &std::path::Path| p.display().to_string();
        vec![
            format!("--cacert={}", path(&self.proxy_upstream.ca)),
            format!("--cert={}", path(&self.proxy_upstream.cert)),
            format!("--key={}", path(&self.proxy_upstream.key)),
            format!("--cert-file={}", path(&self.proxy_server.cert)),
            format!("--key-file={}", path(&self.proxy_server.key)),
            format!("--trusted-ca-file={}", path(&self.proxy_server.ca)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_the_flags_name_exists_and_the_two_sides_trust_different_cas() {
        let pki = Pki::new().unwrap();
        for flag in pki.proxy_flags() {
            let (_, path) = flag.split_once('=').unwrap();
            assert!(std::path::Path::new(path).is_file(), "{flag}");
        }
        let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(&pki.etcd.server.ca), read(&pki.proxy_upstream.ca));
        assert_eq!(read(&pki.etcd.client.ca), read(&pki.etcd.server.ca));
        assert_eq!(read(&pki.proxy_server.ca), read(&pki.proxy_clients.ca));
        assert_ne!(read(&pki.proxy_server.ca), read(&pki.etcd.server.ca));
        assert!(pki.etcd.client_cert_auth);
    }
}
