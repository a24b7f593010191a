//! TLS towards clients: the certificate the proxy presents, which client certificates it requires, and the accept
//! step every connection on a TLS port goes through (deadline, plaintext clients told what went wrong).

use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ServerConfig, SupportedCipherSuite, SupportedProtocolVersion};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use super::reload::Reloading;
use super::{TlsError, pem};
use crate::net::Conn;

/// How long a client may take from connecting to finishing its handshake: etcd's listener deadline since
/// GHSA-6vch-q96h-7gc3, so that silent connections cannot pile up.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a plaintext HTTP client on a TLS port reads: Go's servers answer the same.
const PLAINTEXT_ANSWER: &[u8] =
    b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Where the proxy's own certificate comes from.
#[derive(Clone, Debug)]
pub enum Certificate {
    /// `--cert-file` and `--key-file`.
    Files { cert: PathBuf, key: PathBuf },
    /// `--auto-tls`: made at start under `dir` unless a pair is already there (see [`super::auto`]).
    Auto {
        dir: PathBuf,
        validity_years: u32,
        host: String,
    },
}

/// The client-facing TLS flags, checked.
#[derive(Clone, Debug)]
pub struct ServerSettings {
    pub certificate: Certificate,
    /// `--trusted-ca-file`: clients must present a certificate it signed.
    pub trusted_ca: Option<PathBuf>,
    /// `--client-crl-file`: client certificates it revokes are refused.
    pub crl: Option<PathBuf>,
    /// `--listen-cipher-suites` (TLS 1.2 suites; TLS 1.3's are always on).
    pub cipher_suites: Vec<SupportedCipherSuite>,
    /// `--tls-min-version` to `--tls-max-version`.
    pub versions: Vec<&'static SupportedProtocolVersion>,
    pub handshake_timeout: Duration,
}

/// The accept step of a TLS port, with its configuration kept current with the files.
pub struct ServerTls {
    config: Reloading<Configs>,
    handshake_timeout: Duration,
}

/// What one version of the files gives: the listener's configuration, and the one the proxy's own check of its
/// listener connects with ([`super::own`]), so that both always hold the same certificate.
struct Configs {
    accept: Arc<ServerConfig>,
    own: Arc<rustls::ClientConfig>,
}

impl ServerTls {
    /// Loads (or for `--auto-tls`, makes) the files; an error names the file and the reason.
    pub fn new(settings: &ServerSettings) -> Result<Self, TlsError> {
        let (cert, key) = match &settings.certificate {
            Certificate::Files { cert, key } => (cert.clone(), key.clone()),
            Certificate::Auto {
                dir,
                validity_years,
                host,
            } => super::auto::ensure(dir, *validity_years, host)?,
        };
        let files = [
            Some(&cert),
            Some(&key),
            settings.trusted_ca.as_ref(),
            settings.crl.as_ref(),
        ]
        .into_iter()
        .flatten()
        .cloned()
        .collect();
        let timeout = settings.handshake_timeout;
        let settings = settings.clone();
        let config = Reloading::new("TLS towards clients", files, move || {
            build(&settings, &cert, &key)
        })?;
        Ok(Self {
            config,
            handshake_timeout: timeout,
        })
    }

    /// Completes the handshake of a new connection within the deadline. A client whose first byte is not a TLS
    /// handshake record is a plaintext client: it is told so in HTTP (what a person with curl reads) and closed.
    pub async fn accept(&self, conn: Conn) -> io::Result<Conn> {
        let config = self.config.current().accept.clone();
        let handshake = async move {
            let mut conn = conn;
            let mut first = [0u8; 1];
            if conn.read(&mut first).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "closed before the TLS handshake",
                ));
            }
            if first[0] != TLS_HANDSHAKE_RECORD {
                let _ = conn.write_all(PLAINTEXT_ANSWER).await;
                let _ = conn.shutdown().await;
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a plaintext client on the TLS port (answered 400)",
                ));
            }
            let rewound = Rewind {
                first: Some(first[0]),
                inner: conn,
            };
            let tls = tokio_rustls::TlsAcceptor::from(config)
                .accept(rewound)
                .await?;
            Ok(Box::new(tls) as Conn)
        };
        tokio::time::timeout(self.handshake_timeout, handshake)
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "TLS handshake not finished within {:?}",
                        self.handshake_timeout
                    ),
                )
            })?
    }

    /// The client side of a handshake with this listener, for the proxy's check of itself ([`super::own`]).
    pub(super) fn own_client_config(&self) -> Arc<rustls::ClientConfig> {
        self.config.current().own.clone()
    }
}

fn build(
    settings: &ServerSettings,
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<Configs, TlsError> {
    let provider = Arc::new(CryptoProvider {
        cipher_suites: settings.cipher_suites.clone(),
        ..(*super::provider()).clone()
    });
    let chain = pem::certificates(cert)?;
    pem::check_validity(cert, &chain[0])?;
    let private_key = pem::private_key(key)?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&settings.versions)
        .map_err(|e| TlsError(format!("TLS versions: {e}")))?;
    let verifier = match &settings.trusted_ca {
        Some(ca) => {
            let roots = Arc::new(pem::trust_anchors(ca)?);
            let mut verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone());
            if let Some(crl) = &settings.crl {
                // As Go's listener: the client's own certificate is looked up in the CRL; a CRL from another
                // issuer says nothing about it.
                verifier = verifier
                    .with_crls(pem::crls(crl)?)
                    .only_check_end_entity_revocation()
                    .allow_unknown_revocation_status();
            }
            Some(
                verifier
                    .build()
                    .map_err(|e| TlsError(format!("{}: {e}", ca.display())))?,
            )
        }
        None => None,
    };
    let own = super::own::client_config(
        settings,
        provider,
        (&chain, &private_key),
        verifier.as_deref(),
        (cert, key),
    )?;
    let builder = match verifier {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, private_key)
        .map_err(|e| pem::identity_error(cert, key, e))?;
    config.alpn_protocols = super::ALPN_SERVER.iter().map(|p| p.to_vec()).collect();
    Ok(Configs {
        accept: Arc::new(config),
        own: Arc::new(own),
    })
}

/// A connection whose first byte was read to tell TLS from plaintext, handed back before the rest.
struct Rewind {
    first: Option<u8>,
    inner: Conn,
}

impl AsyncRead for Rewind {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if buf.remaining() > 0
            && let Some(byte) = self.first.take()
        {
            buf.put_slice(&[byte]);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Rewind {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
