//! Who is where in the simulated network: member hosts `m0..`, the `proxy` host, client hosts; and how clients
//! reach them (tonic channels and `etcd-client` over [`TurmoilNet`], in plaintext or, with a [`Dialer`] from a
//! world with TLS, over TLS with the clients' certificate).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use proxy::net::Connector;
use proxy::tls::ClientTls;
use tonic::transport::{Channel, Endpoint};

use crate::net::TurmoilNet;

/// The port members serve etcd's client API on.
pub const MEMBER_PORT: u16 = 2379;
/// The proxy's host name and port.
pub const PROXY_HOST: &str = "proxy";
pub const PROXY_PORT: u16 = 23790;

pub fn member_host(member: usize) -> String {
    format!("m{member}")
}

pub fn member_authority(member: usize) -> String {
    format!("{}:{MEMBER_PORT}", member_host(member))
}

pub fn proxy_authority() -> String {
    format!("{PROXY_HOST}:{PROXY_PORT}")
}

/// Where a simulated server binds: every address of its host.
pub fn listen_addr(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
}

/// How a world's clients dial its servers: plaintext, or TLS towards every host (the server's certificate must name
/// the host of the authority dialled, and the client presents its own). Cheap to clone; get a world's from
/// [`crate::world::World::dialer`].
#[derive(Clone, Default)]
pub struct Dialer {
    tls: Option<Arc<ClientTls>>,
}

impl Dialer {
    /// Plaintext.
    pub fn plain() -> Self {
        Self::default()
    }

    /// TLS with `tls` on every connection.
    pub fn tls(tls: Arc<ClientTls>) -> Self {
        Self { tls: Some(tls) }
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// A lazily connected tonic channel to `authority` over the simulated network. Must be created inside the sim.
    pub fn channel(&self, authority: &str) -> Channel {
        self.connect(Self::endpoint(authority))
    }

    /// [`Dialer::channel`] with HTTP/2 keep-alive `(interval, timeout)`, as clientv3's `DialKeepAliveTime` and
    /// `DialKeepAliveTimeout` set it: a connection whose ping goes unanswered is closed, and the next call dials
    /// again.
    pub fn channel_with_keepalive(
        &self,
        authority: &str,
        (interval, timeout): (Duration, Duration),
    ) -> Channel {
        let endpoint = Self::endpoint(authority)
            .http2_keep_alive_interval(interval)
            .keep_alive_timeout(timeout)
            .keep_alive_while_idle(true);
        self.connect(endpoint)
    }

    fn endpoint(authority: &str) -> Endpoint {
        // The scheme stays `http`: the connector runs the TLS handshake itself, above the simulated TCP.
        Endpoint::from_shared(format!("http://{authority}"))
            .expect("simulated authorities form valid URIs")
            .connect_timeout(Duration::from_secs(1))
    }

    fn connect(&self, endpoint: Endpoint) -> Channel {
        endpoint.connect_with_connector_lazy(Connector::with_tls(
            Arc::new(TurmoilNet::default()),
            self.tls.clone(),
        ))
    }

    /// An `etcd-client` client over a simulated channel (its `raw-channel` feature).
    pub async fn etcd_client(
        &self,
        authority: &str,
    ) -> Result<etcd_client::Client, etcd_client::Error> {
        etcd_client::Client::from_channel(
            etcd_client::Channel::Tonic(self.channel(authority)),
            None,
        )
        .await
    }
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dialer")
            .field("tls", &self.is_tls())
            .finish()
    }
}

/// A lazily connected plaintext tonic channel to `authority` over the simulated network. Must be created inside
/// the sim.
pub fn channel(authority: &str) -> Channel {
    Dialer::plain().channel(authority)
}

/// A plaintext `etcd-client` client over a simulated channel (its `raw-channel` feature).
pub async fn etcd_client(authority: &str) -> Result<etcd_client::Client, etcd_client::Error> {
    Dialer::plain().etcd_client(authority).await
}
