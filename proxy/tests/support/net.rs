//! Loopback sockets only these tests need: a port held busy, and whether a port accepts connections. (Free ports
//! and HTTP GET come from `testkit`.)
//!
//! The workspace's clippy.toml bans std/tokio sockets outside `proxy/src/net` so that the proxy itself only
//! reaches the network through its simulation seam. These tests are real processes on real sockets, not
//! simulated code, so the ban is lifted here, and only here.
#![allow(clippy::disallowed_types)]

use std::time::Duration;

/// A port that stays bound (and so busy) for as long as this value lives.
pub struct BusyPort {
    listener: std::net::TcpListener,
}

impl BusyPort {
    pub fn bind() -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        Self { listener }
    }

    pub fn addr(&self) -> String {
        self.listener.local_addr().expect("local_addr").to_string()
    }
}

/// Whether something accepts TCP connections at `addr` right now.
pub async fn is_listening(addr: &str) -> bool {
    tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .is_ok_and(|r| r.is_ok())
}
