//! Part of the binary (declared in `main.rs`, not in the library): the sockets of the `--discovery-srv` lookup made
//! at start, before `proxy::run` and its `Net` exist. UDP with a socket of its own; TCP (for truncated answers)
//! through `TokioNet`. The lookup itself is `proxy::cli::srv::discover`.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use proxy::cli::srv::lookup::Transport;
use proxy::cli::srv::resolv_conf::ResolvConf;
use proxy::cli::srv::{self, Request};
use proxy::config::Endpoint;
use proxy::net::{BoxFuture, Conn, Net, TokioNet};
use tokio::net::UdpSocket;

/// Where the system's DNS servers are listed.
const RESOLV_CONF: &str = "/etc/resolv.conf";

/// Looks up the endpoints `request` asks for: through `--discovery-srv-dns`, or the servers of /etc/resolv.conf
/// (a missing file means the defaults, as for Go's resolver).
pub async fn discover(request: &Request) -> Result<Vec<Endpoint>, String> {
    let conf = match request.dns {
        Some(server) => ResolvConf::with_server(server),
        None => match std::fs::read_to_string(RESOLV_CONF) {
            Ok(text) => ResolvConf::parse(&text),
            Err(err) if err.kind() == io::ErrorKind::NotFound => ResolvConf::parse(""),
            Err(err) => return Err(format!("--discovery-srv: read {RESOLV_CONF}: {err}")),
        },
    };
    tracing::info!(servers = ?conf.servers, domain = %request.domain, "looking up SRV records");
    let mut id = [0u8; 2];
    getrandom::fill(&mut id).map_err(|e| format!("--discovery-srv: random query ID: {e}"))?;
    srv::discover(request, &conf, &Sockets, u16::from_ne_bytes(id)).await
}

/// The operating system's sockets.
struct Sockets;

impl Transport for Sockets {
    fn udp<'a>(
        &'a self,
        server: SocketAddr,
        query: &'a [u8],
        accept: &'a (dyn Fn(&[u8]) -> bool + Send + Sync),
    ) -> BoxFuture<'a, io::Result<Vec<u8>>> {
        Box::pin(async move {
            let local: SocketAddr = match server {
                SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
                SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
            };
            let socket = UdpSocket::bind(local).await?;
            // Connected: datagrams from other addresses are dropped, and an ICMP "port unreachable" becomes an
            // error instead of a wait for the timeout.
            socket.connect(server).await?;
            socket.send(query).await?;
            let mut buf = vec![0u8; usize::from(u16::MAX)];
            loop {
                let len = socket.recv(&mut buf).await?;
                if accept(&buf[..len]) {
                    buf.truncate(len);
                    return Ok(buf);
                }
            }
        })
    }

    fn tcp(&self, server: SocketAddr) -> BoxFuture<'static, io::Result<Conn>> {
        TokioNet.connect(server.to_string())
    }
}
