//! A TCP relay in front of one etcd member that can be cut: the partition fault without root.
//!
//! Clients (both proxies, etcdctl) are given the relay's address instead of the member's. While the relay is
//! partitioned it forwards nothing in either direction and keeps every connection open, as a network that drops
//! packets does: bytes already sent wait (TCP's buffers fill, as they would with retransmits), a new connection is
//! accepted but never reaches the member, and nobody sees a reset. When it heals, held bytes flow again and the
//! connections carry on. The member itself stays in the cluster and keeps talking to its peers: this cuts the
//! clients' path to one member, not the member from the cluster.
//!
//! Two differences from a real packet-dropping network, both named in the report: a connection opened during the
//! partition completes its TCP handshake (the relay's kernel answers the SYN) and then hangs, where a real
//! partition would leave the SYN unanswered; and when the member is down, a new connection is accepted and then
//! closed rather than refused. Only the partition phase goes through relays, so crash and hang see the members'
//! own sockets.
// The relay serves real sockets to real processes; the `Net` seam belongs to the proxy, not to its benchmark.
#![allow(clippy::disallowed_types)]

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// A relay from a free loopback port to one member's client address. Dropping it closes every connection.
pub struct Relay {
    addr: String,
    cut: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Relay {
    /// Listens on a free loopback port and forwards each connection to `upstream` (`127.0.0.1:PORT`).
    ///
    /// The port is the kernel's choice, bound at once and held: a port probed free and bound later can be taken
    /// in between (CI saw "address already in use" that way).
    pub async fn start(upstream: &str) -> Result<Self, String> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| format!("relay bind 127.0.0.1:0: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("relay address: {e}"))?
            .to_string();
        let (cut, gate) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, upstream.to_string(), gate));
        Ok(Self { addr, cut, task })
    }

    /// `127.0.0.1:PORT` clients are given instead of the member's address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Stops forwarding, both ways, on every connection, old and new.
    pub fn partition(&self) {
        self.cut.send_replace(true);
    }

    /// Forwards again, held bytes first.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        // The accept loop owns the connections' JoinSet: aborting it aborts them, which closes their sockets.
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, upstream: String, gate: watch::Receiver<bool>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((client, _)) = accepted {
                    connections.spawn(relay(client, upstream.clone(), gate.clone()));
                }
            }
            // Reaps finished connections so the set does not grow over a long run.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// One client connection: dialled through to the member once the link is up, then pumped both ways until either
/// side ends (gRPC does not half-close TCP, so the first end is the end).
async fn relay(client: TcpStream, upstream: String, mut gate: watch::Receiver<bool>) {
    // A partition drops the first packets of a new connection too: nothing reaches the member until it heals.
    wait_open(&mut gate).await;
    let Ok(server) = TcpStream::connect(&upstream).await else {
        // The member is down: the client's connection closes (a real client would have been refused).
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        _ = pump(client_read, server_write, gate.clone()) => {}
        _ = pump(server_read, client_write, gate) => {}
    }
}

/// Copies `from` to `to`, holding each chunk while the link is cut. Holding one chunk stops reading, so the
/// sender's buffers fill and it stalls, as behind a network that drops its packets.
async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut gate: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        wait_open(&mut gate).await;
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Returns once the link is not cut (at once if it is not); also when the relay is gone.
async fn wait_open(gate: &mut watch::Receiver<bool>) {
    let _ = gate.wait_for(|cut| !*cut).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// An echo server on a free port; returns its address.
    async fn echo_server() -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
        let addr = listener.local_addr().expect("echo address").to_string();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = socket.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn echo(
        stream: &mut TcpStream,
        text: &[u8],
    ) -> Result<Vec<u8>, tokio::time::error::Elapsed> {
        stream.write_all(text).await.expect("write");
        let mut back = vec![0u8; text.len()];
        tokio::time::timeout(Duration::from_millis(300), stream.read_exact(&mut back))
            .await
            .map(|read| {
                read.expect("read");
                back
            })
    }

    #[tokio::test]
    async fn a_partition_holds_bytes_on_open_and_new_connections_until_it_heals() {
        let relay = Relay::start(&echo_server().await).await.expect("relay");
        let mut open = TcpStream::connect(relay.addr()).await.expect("connect");
        assert_eq!(echo(&mut open, b"one").await.expect("echoed"), b"one");

        relay.partition();
        assert!(
            echo(&mut open, b"two").await.is_err(),
            "nothing crosses a partition"
        );
        let mut new = TcpStream::connect(relay.addr()).await.expect("accepted");
        assert!(
            echo(&mut new, b"new").await.is_err(),
            "a new connection hangs too"
        );

        relay.heal();
        let mut held = vec![0u8; 3];
        tokio::time::timeout(Duration::from_secs(5), open.read_exact(&mut held))
            .await
            .expect("the held bytes arrive after healing")
            .expect("read");
        assert_eq!(held, b"two");
        let mut late = vec![0u8; 3];
        tokio::time::timeout(Duration::from_secs(5), new.read_exact(&mut late))
            .await
            .expect("the new connection reaches the server after healing")
            .expect("read");
        assert_eq!(late, b"new");
    }
}
