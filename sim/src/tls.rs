//! TLS in a world ([`crate::world::Settings::tls`]): which PEM files each party uses, and the proxy's, the members'
//! and the clients' TLS settings made from them. The files are made by the test (`testkit::pki` in
//! `tests/tls.rs`); this module only names who uses which.
//!
//! With TLS on, every connection is mutual TLS with one CA: the members serve TLS and require a client certificate
//! it signed; the proxy serves TLS to its clients (also requiring one) and dials the members over TLS with a client
//! certificate that has no Common Name (the proxy refuses one with a CN); the clients dial with their own. Server
//! certificates name their simulated host (`m0`, `m1`, ..., `proxy`) as a DNS SAN, which is what the dialling side
//! checks. The handshakes run above the `Net` seam ([`proxy::tls`]), so they go over turmoil like everything else.

use std::path::PathBuf;
use std::sync::Arc;

use proxy::tls::server::{Certificate, HANDSHAKE_TIMEOUT};
use proxy::tls::{ClientSettings, ClientTls, ServerSettings, ServerTls};

/// A certificate and its private key, PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertKey {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl From<(PathBuf, PathBuf)> for CertKey {
    fn from((cert, key): (PathBuf, PathBuf)) -> Self {
        Self { cert, key }
    }
}

/// The PEM files of a world with TLS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signed every certificate below; every party trusts it, and only it.
    pub ca: PathBuf,
    /// Member `i`'s server certificate: DNS SAN `m<i>`.
    pub members: Vec<CertKey>,
    /// The proxy's server certificate towards its clients: DNS SAN `proxy`.
    pub proxy: CertKey,
    /// The proxy's client certificate towards the members: no Common Name.
    pub proxy_upstream: CertKey,
    /// The certificate every simulated client presents (to the proxy, and to the members it writes to directly).
    pub client: CertKey,
}

impl TlsFiles {
    fn server(&self, own: &CertKey) -> ServerSettings {
        ServerSettings {
            certificate: Certificate::Files {
                cert: own.cert.clone(),
                key: own.key.clone(),
            },
            trusted_ca: Some(self.ca.clone()),
            crl: None,
            cipher_suites: proxy::tls::provider().cipher_suites.clone(),
            versions: vec![&rustls::version::TLS12, &rustls::version::TLS13],
            handshake_timeout: HANDSHAKE_TIMEOUT,
        }
    }

    fn client_of(&self, own: &CertKey, allow_common_name: bool) -> ClientSettings {
        ClientSettings {
            ca: Some(self.ca.clone()),
            identity: Some((own.cert.clone(), own.key.clone())),
            insecure_skip_verify: false,
            allow_common_name,
        }
    }

    /// What member `member` serves with: its certificate, client certificates required.
    pub fn member_server(&self, member: usize) -> ServerSettings {
        let own = self.members.get(member).unwrap_or_else(|| {
            panic!(
                "TLS files for {} members, not for member {member}",
                self.members.len()
            )
        });
        self.server(own)
    }

    /// The proxy's `server_tls`: its certificate, client certificates required.
    pub fn proxy_server(&self) -> ServerSettings {
        self.server(&self.proxy)
    }

    /// The proxy's `upstream_tls`: the CA and its client certificate, which must have no Common Name (the proxy's
    /// default: `--allow-cert-common-name` off).
    pub fn proxy_upstream(&self) -> ClientSettings {
        self.client_of(&self.proxy_upstream, false)
    }

    /// What the simulated clients dial with (the proxy's TLS client code, which the clients borrow; a Common Name
    /// is the clients' business, so it is allowed).
    pub fn client(&self) -> ClientSettings {
        self.client_of(&self.client, true)
    }

    /// Turns TLS on in a proxy configuration, on both sides: the flags a user sets for it, `--cert-file`,
    /// `--key-file` and `--trusted-ca-file` towards clients, `https://` endpoints with `--cacert`, `--cert` and
    /// `--key` towards etcd.
    pub fn configure_proxy(&self, config: &mut proxy::Config) {
        config.server_tls = Some(self.proxy_server());
        config.upstream_tls = Some(self.proxy_upstream());
    }

    /// The members' accept steps (loaded now: a file that does not load is a panic naming it).
    pub fn member_acceptors(&self, members: usize) -> Vec<Arc<ServerTls>> {
        (0..members)
            .map(|m| {
                let tls = ServerTls::new(&self.member_server(m))
                    .unwrap_or_else(|e| panic!("TLS of member m{m}: {e}"));
                Arc::new(tls)
            })
            .collect()
    }

    /// The clients' handshake (loaded now: a file that does not load is a panic naming it).
    pub fn client_connector(&self) -> Arc<ClientTls> {
        Arc::new(
            ClientTls::new(&self.client()).unwrap_or_else(|e| panic!("TLS of the clients: {e}")),
        )
    }
}
