//! Free loopback ports for etcd processes and containers.
//!
//! The workspace's clippy.toml bans std sockets so that the proxy reaches the network only through its `Net`
//! seam. This crate starts real processes on real ports and must probe for a free one, which needs a socket: the
//! ban is lifted here, and only here.
#![allow(clippy::disallowed_types)]

use std::collections::HashSet;
use std::sync::Mutex;

/// Ports already handed out by this process: never handed out twice, so parallel starts cannot collide between
/// the probe and the use.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback port nothing listens on now (the kernel's choice for `127.0.0.1:0`, released at once).
pub fn free_port() -> u16 {
    let mut guard = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let handed = guard.get_or_insert_with(HashSet::new);
    loop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        if handed.insert(port) {
            return port;
        }
    }
}
