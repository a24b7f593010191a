//! Free loopback ports for the processes the benchmark starts.
//!
//! The workspace's clippy.toml bans std/tokio sockets so that the proxy reaches the network only through its
//! simulation seam. The benchmark is not simulated: it starts real processes on real ports and must ask the kernel
//! for a free one, so the ban is lifted here, in this one function.

use std::collections::HashSet;
use std::sync::Mutex;

/// Ports handed out by this process, never handed out twice, so two services started back to back cannot both be
/// given a port the kernel recycled in between.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A loopback port nothing listens on right now (bind port 0, read the port, close).
#[allow(clippy::disallowed_types)]
pub fn free_port() -> std::io::Result<u16> {
    let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let handed = handed.get_or_insert_with(HashSet::new);
    loop {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        if handed.insert(port) {
            return Ok(port);
        }
    }
}
