//! How the load's clients reach a target: a [`Dialer`] is its address and, with `--tls`, the client side of mutual
//! TLS ([`ClientTls`]). In the clear a connection is tonic's own. Over TLS it is a TCP stream with the tokio-rustls
//! handshake (aws-lc-rs) on top, handed to tonic by `connect_with_connector` (tonic's own TLS is not built), as the
//! proxy dials etcd: ALPN `h2`, and no session resumption, so every connection makes a full handshake, as etcd's
//! Go clients do by default.
// The benchmark is a client of real sockets; the proxy's `Net` seam is the proxy's, not its load generator's.
#![allow(clippy::disallowed_types)]

use std::io;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use testkit::pki::TlsPaths;
use tonic::transport::{Channel, Endpoint, Uri};

/// How long a connection (TCP and, over TLS, the handshake) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The client side of mutual TLS: the certificate presented, the CA trusted, and the rustls configuration built
/// from them once.
#[derive(Clone)]
pub struct ClientTls {
    paths: TlsPaths,
    config: Arc<rustls::ClientConfig>,
}

impl ClientTls {
    /// Reads `paths` (the test kit's configuration: aws-lc-rs, trusting `paths.ca` only, presenting `paths.cert`)
    /// and asks for `h2`, without resumption.
    pub fn load(paths: &TlsPaths) -> Result<Self, String> {
        let mut config = testkit::pki::client_config(paths)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        config.resumption = rustls::client::Resumption::disabled();
        Ok(Self {
            paths: paths.clone(),
            config: Arc::new(config),
        })
    }

    /// The files, for the test kit's HTTP GETs (`/metrics`, `/health`).
    pub fn paths(&self) -> &TlsPaths {
        &self.paths
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("paths", &self.paths)
            .finish()
    }
}

/// Opens connections to one target, in the clear or over TLS. Clones share what the first TLS handshake
/// negotiated ([`Dialer::negotiated`]).
#[derive(Clone, Debug)]
pub struct Dialer {
    addr: String,
    tls: Option<ClientTls>,
    negotiated: Arc<OnceLock<String>>,
}

impl Dialer {
    /// Dials `addr` (`127.0.0.1:PORT`), over TLS when `tls` is given.
    pub fn new(addr: &str, tls: Option<ClientTls>) -> Self {
        Self {
            addr: addr.to_string(),
            tls,
            negotiated: Arc::new(OnceLock::new()),
        }
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// One new HTTP/2 connection (dropping the last clone of the channel closes it).
    pub async fn dial(&self) -> Result<Channel, String> {
        // The URI names the authority only: over TLS the connector below makes the stream, and tonic, built without
        // TLS, would refuse an https:// URI.
        let endpoint = Endpoint::from_shared(format!("http://{}", self.addr))
            .map_err(|e| format!("{}: {}", self.addr, chain(&e)))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true);
        let connected = match &self.tls {
            None => endpoint.connect().await,
            Some(tls) => {
                let config = Arc::clone(&tls.config);
                let negotiated = Arc::clone(&self.negotiated);
                endpoint
                    .connect_with_connector(tower::service_fn(move |uri: Uri| {
                        handshake(uri, Arc::clone(&config), Arc::clone(&negotiated))
                    }))
                    .await
            }
        };
        connected.map_err(|e| format!("connect to {}: {}", self.addr, chain(&e)))
    }

    /// `n` separate connections (each dialed on its own; clones of one channel would share one).
    pub async fn connect(&self, n: usize) -> Result<Vec<Channel>, String> {
        let mut channels = Vec::with_capacity(n);
        for _ in 0..n.max(1) {
            channels.push(self.dial().await?);
        }
        Ok(channels)
    }

    /// What the first TLS handshake negotiated: version, cipher suite, key exchange group (None in the clear).
    pub fn negotiated(&self) -> Option<String> {
        self.negotiated.get().cloned()
    }
}

/// TCP to the URI's authority, then the TLS handshake, checking the server's certificate for the host's name (an
/// IP address here).
async fn handshake(
    uri: Uri,
    config: Arc<rustls::ClientConfig>,
    negotiated: Arc<OnceLock<String>>,
) -> io::Result<TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>> {
    let authority = uri
        .authority()
        .ok_or_else(|| io::Error::other(format!("no authority in {uri}")))?;
    let tcp = tokio::net::TcpStream::connect(authority.as_str()).await?;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(authority.host().to_string())
        .map_err(|e| io::Error::other(format!("server name {}: {e}", authority.host())))?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await?;
    if negotiated.get().is_none() {
        let _ = negotiated.set(describe(tls.get_ref().1));
    }
    Ok(TokioIo::new(tls))
}

/// "TLSv1_3 TLS13_AES_128_GCM_SHA256 X25519": what a connection negotiated.
fn describe(conn: &rustls::ClientConnection) -> String {
    let unknown = || "?".to_string();
    [
        conn.protocol_version()
            .map_or_else(unknown, |v| format!("{v:?}")),
        conn.negotiated_cipher_suite()
            .map_or_else(unknown, |s| format!("{:?}", s.suite())),
        conn.negotiated_key_exchange_group()
            .map_or_else(unknown, |g| format!("{:?}", g.name())),
    ]
    .join(" ")
}

/// An error with its sources (tonic's transport error says only "transport error" by itself).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}
