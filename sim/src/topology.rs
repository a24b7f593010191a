//! Who is where in the simulated network: member hosts `m0..`, the `proxy` host, client hosts; and how clients
//! reach them (tonic channels and `etcd-client` over [`TurmoilNet`]).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use proxy::net::Connector;
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

/// A lazily connected tonic channel to `authority` over the simulated network. Must be created inside the sim.
pub fn channel(authority: &str) -> Channel {
    Endpoint::from_shared(format!("http://{authority}"))
        .expect("simulated authorities form valid URIs")
        .connect_timeout(Duration::from_secs(1))
        .connect_with_connector_lazy(Connector::new(Arc::new(TurmoilNet)))
}

/// An `etcd-client` client over a simulated channel (its `raw-channel` feature).
pub async fn etcd_client(authority: &str) -> Result<etcd_client::Client, etcd_client::Error> {
    etcd_client::Client::from_channel(etcd_client::Channel::Tonic(channel(authority)), None).await
}
