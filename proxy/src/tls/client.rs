//! TLS towards etcd: which servers the proxy trusts, the certificate it presents, and the handshake on every new
//! connection to an endpoint, checked against the endpoint's host name or IP address as clientv3 checks it.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use super::reload::Reloading;
use super::{TlsError, pem};
use crate::net::Conn;

/// The TLS flags towards etcd, checked.
#[derive(Clone, Debug, Default)]
pub struct ClientSettings {
    /// `--cacert`: the CAs etcd's certificates must chain to (none: the system's).
    pub ca: Option<PathBuf>,
    /// `--cert` and `--key`: the certificate the proxy presents to etcd.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// `--insecure-skip-tls-verify`: etcd's certificate is not checked (the handshake's signatures still are).
    pub insecure_skip_verify: bool,
    /// `--allow-cert-common-name`: accept a `--cert` with a Common Name (see [`check_no_common_name`]).
    pub allow_common_name: bool,
}

/// The handshake towards etcd, with its configuration kept current with the files.
pub struct ClientTls {
    config: Reloading<ClientConfig>,
    /// The last handshake failure logged per endpoint, so that a failing endpoint is logged once, not per dial.
    logged: Mutex<HashMap<String, String>>,
}

impl ClientTls {
    pub fn new(settings: &ClientSettings) -> Result<Self, TlsError> {
        let mut files: Vec<PathBuf> = settings.ca.iter().cloned().collect();
        if let Some((cert, key)) = &settings.identity {
            files.extend([cert.clone(), key.clone()]);
        }
        let settings = settings.clone();
        Ok(Self {
            config: Reloading::new("TLS towards etcd", files, move || build(&settings))?,
            logged: Mutex::new(HashMap::new()),
        })
    }

    /// Runs the handshake on a new connection to `authority` (`host:port`).
    pub async fn connect(&self, conn: Conn, authority: &str) -> io::Result<Conn> {
        let host = host_of(authority);
        let name = ServerName::try_from(host.to_string()).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{host:?} is not a valid TLS server name: {e}"),
            )
        })?;
        let connector = tokio_rustls::TlsConnector::from(self.config.current());
        match connector.connect(name, conn).await {
            Ok(tls) => {
                self.forget_failure(authority);
                Ok(Box::new(tls) as Conn)
            }
            Err(err) => {
                self.log_failure(authority, &err);
                Err(io::Error::new(err.kind(), format!("TLS handshake: {err}")))
            }
        }
    }

    fn log_failure(&self, authority: &str, err: &io::Error) {
        let text = err.to_string();
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged.get(authority) != Some(&text) {
            tracing::warn!(endpoint = authority, err = %text, "TLS handshake with etcd failed");
            logged.insert(authority.to_string(), text);
        }
    }

    fn forget_failure(&self, authority: &str) {
        let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged.remove(authority).is_some() {
            tracing::info!(
                endpoint = authority,
                "TLS handshake with etcd succeeds again"
            );
        }
    }
}

impl crate::net::Handshake for ClientTls {
    fn handshake<'a>(
        &'a self,
        conn: Conn,
        authority: &'a str,
    ) -> crate::net::BoxFuture<'a, io::Result<Conn>> {
        Box::pin(self.connect(conn, authority))
    }
}

/// The host of `host:port` or `[v6]:port`, as the certificate must name it.
pub(super) fn host_of(authority: &str) -> &str {
    let host = match authority.rsplit_once(':') {
        Some((host, _port)) => host,
        None => authority,
    };
    host.trim_start_matches('[').trim_end_matches(']')
}

fn build(settings: &ClientSettings) -> Result<ClientConfig, TlsError> {
    let provider = super::provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS12, &rustls::version::TLS13])
        .map_err(|e| TlsError(format!("TLS versions: {e}")))?;
    let builder = if settings.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(UncheckedChain {
                provider,
                only: None,
            }))
    } else {
        let roots = match &settings.ca {
            Some(ca) => pem::trust_anchors(ca)?,
            None => system_roots()?,
        };
        builder.with_root_certificates(roots)
    };
    let mut config = match &settings.identity {
        Some((cert, key)) => {
            let chain = pem::certificates(cert)?;
            pem::check_validity(cert, &chain[0])?;
            if !settings.allow_common_name {
                check_no_common_name(cert, &chain[0])?;
            }
            builder
                .with_client_auth_cert(chain, pem::private_key(key)?)
                .map_err(|e| pem::identity_error(cert, key, e))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// With `--client-cert-auth`, etcd runs a request that carries no token as the user the client certificate's
/// Common Name names. Every client of the proxy that sends no token would then get that user's rights, so a
/// certificate with a Common Name is refused unless the operator says that is intended.
fn check_no_common_name(path: &Path, cert: &CertificateDer<'_>) -> Result<(), TlsError> {
    match pem::common_name(path, cert)? {
        None => Ok(()),
        Some(cn) => Err(TlsError(format!(
            "{}: the certificate has Common Name {cn:?}: with --client-cert-auth, etcd runs every request without a \
             token as user {cn:?}, so every client of the proxy would get that user's rights; use a certificate \
             without a Common Name, or pass --allow-cert-common-name if that is intended",
            path.display()
        ))),
    }
}

fn system_roots() -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        return Err(TlsError(
            "TLS towards etcd without --cacert uses the system's CA certificates, and none were found; give --cacert"
                .into(),
        ));
    }
    Ok(roots)
}

/// A server certificate taken without checking its chain or names: any one (`--insecure-skip-tls-verify`), or
/// exactly one known in advance (the proxy's own, when it connects to itself: see `super::own`). The handshake's
/// signatures are still checked, so the connection is encrypted to whoever holds that certificate's key.
#[derive(Debug)]
pub(super) struct UncheckedChain {
    pub(super) provider: Arc<rustls::crypto::CryptoProvider>,
    /// `Some`: the only certificate taken.
    pub(super) only: Option<CertificateDer<'static>>,
}

impl ServerCertVerifier for UncheckedChain {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match &self.only {
            Some(only) if only.as_ref() != end_entity.as_ref() => Err(rustls::Error::General(
                "not the certificate the listener's files hold".into(),
            )),
            _ => Ok(ServerCertVerified::assertion()),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_name_is_the_endpoint_host() {
        assert_eq!(host_of("127.0.0.1:2379"), "127.0.0.1");
        assert_eq!(host_of("etcd-0.example:2379"), "etcd-0.example");
        assert_eq!(host_of("[::1]:2379"), "::1");
    }
}
