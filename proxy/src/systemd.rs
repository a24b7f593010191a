//! Part of the binary (declared in `main.rs`, not in the library, whose sockets all go through the `Net` seam):
//! systemd's readiness protocol. A `Type=notify` service finds in `NOTIFY_SOCKET` the unix datagram socket systemd
//! listens on, a path or, after `@`, an abstract name; the proxy sends `READY=1` there once it serves and
//! `STOPPING=1` when its shutdown begins. Without `NOTIFY_SOCKET` nothing is sent, and the variable is left set, as
//! etcd's Go proxy does (`daemon.SdNotify(false, ...)`). A failed notification is logged, and the proxy carries on.

use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// The variable systemd sets for a `Type=notify` service.
const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// The proxy serves clients.
pub const READY: &str = "READY=1";
/// The proxy has begun to shut down.
pub const STOPPING: &str = "STOPPING=1";

/// Tells systemd `state` if it asked to be told (`NOTIFY_SOCKET` set and not empty).
pub fn notify(state: &str) {
    let Some(socket) = std::env::var_os(NOTIFY_SOCKET).filter(|s| !s.is_empty()) else {
        return;
    };
    match send(&socket, state) {
        Ok(()) => tracing::info!(state, "notified systemd"),
        Err(err) => tracing::error!(
            state,
            socket = %socket.to_string_lossy(),
            %err,
            "cannot notify systemd"
        ),
    }
}

/// Sends `state` as one datagram to `socket` (`NOTIFY_SOCKET`'s value).
fn send(socket: &OsStr, state: &str) -> io::Result<()> {
    let addr = address(socket)?;
    UnixDatagram::unbound()?.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

/// `@name` is an abstract socket (Linux); anything else a path, as Go's `net` package reads it.
fn address(socket: &OsStr) -> io::Result<SocketAddr> {
    match socket.as_bytes().strip_prefix(b"@") {
        Some(name) => abstract_address(name),
        None => SocketAddr::from_pathname(socket),
    }
}

#[cfg(target_os = "linux")]
fn abstract_address(name: &[u8]) -> io::Result<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name)
}

#[cfg(not(target_os = "linux"))]
fn abstract_address(_: &[u8]) -> io::Result<SocketAddr> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract unix sockets (@name) exist only on Linux",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn received(listener: &UnixDatagram) -> String {
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).expect("a datagram");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[test]
    fn a_path_receives_the_state_as_one_datagram() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).expect("bind");
        send(path.as_os_str(), READY).expect("send");
        assert_eq!(received(&listener), "READY=1");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn an_at_sign_names_an_abstract_socket() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("etcd-grpc-proxy-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract address");
        let listener = UnixDatagram::bind_addr(&addr).expect("bind");
        send(OsStr::new(&format!("@{name}")), STOPPING).expect("send");
        assert_eq!(received(&listener), "STOPPING=1");
    }

    #[test]
    fn a_socket_nobody_listens_on_is_an_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("nobody.sock");
        assert!(send(missing.as_os_str(), READY).is_err());
    }
}
