//! TLS towards the proxy's own listener, for `/proxy/health`, which checks the proxy as its clients reach it (etcd's
//! Go proxy dials itself with its listener's TLS files too). The check takes exactly the certificate the listener's
//! files hold now, and no other: not one a CA signed (an `--auto-tls` certificate chains to none), so a listener
//! that presents anything else fails the check. When the listener requires client certificates
//! (`--trusted-ca-file`), the proxy presents its own, as the Go proxy does: that certificate must then be one the
//! CA signed and one fit for client authentication.

use std::io;
use std::path::Path;
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::ClientCertVerifier;

use super::client::{UncheckedChain, host_of};
use super::{ServerSettings, ServerTls, TlsError, pem};
use crate::net::{BoxFuture, Conn, Handshake};

/// The client configuration that connects to the listener whose certificate is `chain` with key `key` (read from
/// the `files`, named in errors).
/// `client_verifier` is the listener's check of client certificates, when it requires them: the proxy's own
/// certificate is put through it here, so that a certificate the listener will refuse (one without extended key usage
/// clientAuth, or from another CA) is reported at start rather than only as a failing `/proxy/health`.
pub(super) fn client_config(
    settings: &ServerSettings,
    provider: Arc<CryptoProvider>,
    (chain, key): (&[CertificateDer<'static>], &PrivateKeyDer<'static>),
    client_verifier: Option<&dyn ClientCertVerifier>,
    files: (&Path, &Path),
) -> Result<ClientConfig, TlsError> {
    if let Some(verifier) = client_verifier
        && let Err(refused) = verifier.verify_client_cert(&chain[0], &chain[1..], UnixTime::now())
    {
        tracing::warn!(
            cert = %files.0.display(),
            %refused,
            "/proxy/health will fail: it checks the proxy through its listener, which requires client certificates \
             (--trusted-ca-file), presenting --cert-file as etcd's Go proxy does, and the listener does not accept \
             that certificate from a client: it must have extended key usage clientAuth too and chain to that CA"
        );
    }
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&settings.versions)
        .map_err(|e| TlsError(format!("TLS versions: {e}")))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(UncheckedChain {
            provider,
            only: chain.first().cloned(),
        }));
    let mut config = match client_verifier {
        Some(_) => builder
            .with_client_auth_cert(chain.to_vec(), key.clone_key())
            .map_err(|e| pem::identity_error(files.0, files.1, e))?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// The handshake a client of the listener with `ServerTls` runs, as the proxy runs it to check itself.
pub struct OwnListener(pub Arc<ServerTls>);

impl Handshake for OwnListener {
    fn handshake<'a>(&'a self, conn: Conn, authority: &'a str) -> BoxFuture<'a, io::Result<Conn>> {
        Box::pin(async move {
            let name = ServerName::try_from(host_of(authority).to_string())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            let connector = tokio_rustls::TlsConnector::from(self.0.own_client_config());
            let tls = connector.connect(name, conn).await?;
            Ok(Box::new(tls) as Conn)
        })
    }
}
