//! Part of the binary (declared in `main.rs`, not in the library): what the `--discovery-srv` lookup made at start,
//! before `proxy::run` and its `Net` exist, takes from the system: /etc/resolv.conf, and tokio's sockets for
//! hickory-resolver. The lookup itself is `proxy::cli::srv::discover`.

use std::io;

use hickory_resolver::net::runtime::TokioRuntimeProvider;
use proxy::cli::srv::resolver::{HickoryLookup, Servers};
use proxy::cli::srv::{self, Request};
use proxy::config::Endpoint;

/// Where the system's DNS servers are listed.
const RESOLV_CONF: &str = "/etc/resolv.conf";

/// Looks up the endpoints `request` asks for: through `--discovery-srv-dns`, or the servers of /etc/resolv.conf
/// (a missing file means the local host, as for Go's resolver).
pub async fn discover(request: &Request) -> Result<Vec<Endpoint>, String> {
    let servers = match request.dns {
        Some(server) => Servers::only(server),
        None => match std::fs::read(RESOLV_CONF) {
            Ok(text) => Servers::from_resolv_conf(Some(&text)),
            Err(err) if err.kind() == io::ErrorKind::NotFound => Servers::from_resolv_conf(None),
            Err(err) => return Err(format!("--discovery-srv: read {RESOLV_CONF}: {err}")),
        },
    };
    tracing::info!(servers = %servers.describe(), domain = %request.domain, "looking up SRV records");
    let lookup = HickoryLookup::new(servers, TokioRuntimeProvider::default())
        .map_err(|e| format!("--discovery-srv={}: {e}", request.domain))?;
    srv::discover(request, &lookup).await
}
