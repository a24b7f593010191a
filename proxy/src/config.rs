//! The proxy's configuration, independent of how it was obtained (flags in production, code in tests).

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

pub use crate::upstream::identity::Credentials;

/// One etcd client endpoint, normalised to `host:port`, with the scheme it was given with.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    authority: String,
    scheme: Scheme,
}

/// How an endpoint was written: the scheme decides TLS, and a bare `host:port` follows the TLS flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scheme {
    /// `host:port`: TLS when any TLS flag towards etcd is given, as clientv3 does.
    Bare,
    /// `http://`: plaintext.
    Http,
    /// `https://`: TLS.
    Https,
}

impl Endpoint {
    /// Parses `host:port`, `http://host:port` or `https://host:port` (a trailing `/` is allowed). Other schemes are
    /// errors.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let trimmed = raw.trim();
        let (scheme, rest) = if let Some(rest) = trimmed.strip_prefix("http://") {
            (Scheme::Http, rest)
        } else if let Some(rest) = trimmed.strip_prefix("https://") {
            (Scheme::Https, rest)
        } else if trimmed.starts_with("unix://") || trimmed.starts_with("unixs://") {
            return Err(format!(
                "endpoint {raw:?}: unix sockets are not supported yet"
            ));
        } else if trimmed.contains("://") {
            return Err(format!(
                "endpoint {raw:?}: unknown scheme (expected host:port, http://host:port or https://host:port)"
            ));
        } else {
            (Scheme::Bare, trimmed)
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (host, port) =
            split_host_port(rest).ok_or_else(|| format!("endpoint {raw:?}: expected host:port"))?;
        if !is_host(host) || (rest.starts_with('[') && host.parse::<std::net::Ipv6Addr>().is_err())
        {
            return Err(format!("endpoint {raw:?}: missing or malformed host"));
        }
        port.parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| {
                format!("endpoint {raw:?}: port must be a number between 1 and 65535")
            })?;
        Ok(Self {
            authority: rest.to_string(),
            scheme,
        })
    }

    /// How the endpoint was written.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }

    /// `host:port`, as dialled and as shown in metrics labels.
    pub fn authority(&self) -> &str {
        &self.authority
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.authority)
    }
}

/// A host name or an IP address as a URI authority may hold it: letters, digits, `-`, `.`, `_` (which DNS names
/// in the wild use), or the inside of `[...]` for IPv6 (checked by the caller). Anything else (`%`, spaces, `@`)
/// would not form a URI to dial.
fn is_host(host: &str) -> bool {
    !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | ':'))
}

/// Splits `host:port` and `[v6]:port`; `None` if there is no port or the host has stray colons.
fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        return Some((host, after.strip_prefix(':')?));
    }
    let (host, port) = s.rsplit_once(':')?;
    (!host.contains(':')).then_some((host, port))
}

/// Parses a listen address the way etcd accepts it: `ip:port`, or `localhost:port`.
pub fn parse_listen_addr(raw: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = raw.parse::<SocketAddr>() {
        return Ok(addr);
    }
    match split_host_port(raw) {
        Some(("localhost", port)) => port
            .parse::<u16>()
            .map(|p| SocketAddr::from(([127, 0, 0, 1], p)))
            .map_err(|_| format!("listen address {raw:?}: bad port")),
        _ => Err(format!(
            "listen address {raw:?}: expected ip:port (for example 127.0.0.1:23790)"
        )),
    }
}

/// `--advertise-client-url`: the address clients are told to reach this proxy at (MemberList answers with it, and
/// `--resolver-prefix` registers it), with the name it goes by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Advertise {
    /// As given: `host:port`, `http://host:port` or `https://host:port`.
    pub url: String,
    /// The host's name (MemberList's member name; clientv3's `Sync` ignores members without one).
    pub name: String,
}

/// `--resolver-prefix` and `--resolver-ttl`: where in etcd the proxy registers itself, and its lease's TTL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolver {
    pub prefix: Vec<u8>,
    /// Seconds; at least 1.
    pub ttl: i64,
}

/// `--metrics-addr`: where `/metrics` and `/health` are also served, and whether over TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricsListen {
    pub addr: SocketAddr,
    pub tls: bool,
}

impl MetricsListen {
    /// Parses `http://ip:port` or `https://ip:port` (`localhost` allowed), as etcd's `--metrics-addr` takes it.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let (tls, rest) = if let Some(rest) = raw.strip_prefix("http://") {
            (false, rest)
        } else if let Some(rest) = raw.strip_prefix("https://") {
            (true, rest)
        } else {
            return Err(format!(
                "--metrics-addr {raw:?}: expected http://host:port or https://host:port"
            ));
        };
        let addr = parse_listen_addr(rest.strip_suffix('/').unwrap_or(rest))
            .map_err(|e| format!("--metrics-addr: {e}"))?;
        Ok(Self { addr, tls })
    }
}

/// Keep-alive settings of HTTP/2 connections (towards clients or towards etcd).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeepAlive {
    /// Ping after this much idle time; `None` disables pings.
    pub interval: Option<Duration>,
    /// Close the connection when a ping is not acknowledged within this time.
    pub timeout: Duration,
    /// Ping even when no call is open (towards etcd only).
    pub while_idle: bool,
}

/// Everything `run` needs to know.
#[derive(Clone, Debug)]
pub struct Config {
    /// etcd client endpoints; one is active at a time.
    pub endpoints: Vec<Endpoint>,
    /// Where gRPC and the HTTP admin routes are served.
    pub listen_addr: SocketAddr,
    /// Largest message the proxy sends to etcd (etcd's `--max-send-bytes`).
    pub max_send_bytes: usize,
    /// Largest message the proxy accepts, from clients and from etcd (etcd's `--max-recv-bytes`).
    pub max_recv_bytes: usize,
    /// How long one connection attempt to an endpoint may take.
    pub dial_timeout: Duration,
    /// HTTP/2 keep-alive towards etcd (`--dial-keepalive-*`, `--permit-without-stream`).
    pub upstream_keepalive: KeepAlive,
    /// HTTP/2 keep-alive towards clients (`--grpc-keepalive-interval`, `--grpc-keepalive-timeout`).
    pub client_keepalive: KeepAlive,
    /// The shortest interval at which a client may ping (`--grpc-keepalive-min-time`); zero means grpc-go's
    /// default (five minutes), as in etcd.
    pub client_ping_min_time: Duration,
    /// Concurrent HTTP/2 streams per client connection.
    pub max_concurrent_streams: u32,
    /// By when a new client connection must have finished its TLS handshake and sent its HTTP/2 preface (or an
    /// HTTP/1.1 request head), else it is closed (`--client-setup-timeout`; grpc-go's 120 s by default).
    pub client_setup_timeout: Duration,
    /// Client connections open at once (both listeners); more are closed as soon as accepted.
    pub max_client_connections: usize,
    /// gRPC calls in progress at once across every client connection; more are refused with `ResourceExhausted`.
    pub max_client_calls: usize,
    /// Responses a client Watch stream may have unread before the proxy ends it (`--watch-buffer-size`).
    pub watch_buffer_size: usize,
    /// How far (in revisions) behind the newest known revision a running upstream watcher may be for a new
    /// watcher without start revision to join it (`--watch-max-join-lag`); 0 means never.
    pub watch_max_join_lag: i64,
    /// The proxy's own etcd identity (`--user`, `--password`), for upstream watch streams.
    pub user: Option<Credentials>,
    /// `--namespace`: the prefix under which clients' keys live in etcd; empty for none.
    pub namespace: Vec<u8>,
    /// `--experimental-serializable-ordering`: a serializable read never returns an older revision than one the
    /// proxy already returned.
    pub serializable_ordering: bool,
    /// `--range-cache-max-bytes`: the bound of the range cache; 0 turns it off.
    pub range_cache_max_bytes: usize,
    /// `--experimental-leasing-prefix`: the prefix of the leasing protocol's ownership keys (inside the
    /// namespace); empty: no leasing.
    pub leasing_prefix: Vec<u8>,
    /// `--experimental-leasing-ttl`: seconds of the leasing session's lease.
    pub leasing_ttl: i64,
    /// TLS towards clients, on the main port (and on `--metrics-addr` when it is `https://`).
    pub server_tls: Option<crate::tls::ServerSettings>,
    /// TLS towards etcd; `None`: plaintext.
    pub upstream_tls: Option<crate::tls::ClientSettings>,
    /// `--endpoints-auto-sync-interval`: how often the endpoints are refreshed from MemberList; `None`: never.
    pub endpoints_auto_sync: Option<Duration>,
    /// `--advertise-client-url`; `None` when given empty: MemberList then passes through to etcd.
    pub advertise: Option<Advertise>,
    /// `--resolver-prefix` and `--resolver-ttl`, when given.
    pub resolver: Option<Resolver>,
    /// `--metrics-addr`: a listener of its own for `/metrics` and `/health`.
    pub metrics_listen: Option<MetricsListen>,
    /// Seed of every random choice the proxy makes, so that a run can be reproduced.
    pub seed: u64,
    /// How long graceful shutdown waits for in-flight calls before closing connections.
    pub shutdown_grace: Duration,
    /// `--enable-pprof`: `/debug/pprof/` on the main port.
    pub enable_pprof: bool,
    /// `--experimental-enable-grpc-logging`: one log line per gRPC call at its end.
    pub grpc_logging: bool,
    /// `--enable-distributed-tracing` and its settings; `None`: off.
    pub distributed_tracing: Option<crate::otel::Settings>,
    /// `--worker-threads`, resolved: how many workers serve client connections ([`crate::workers`]), at least 1.
    /// `Config::new` gives 1; the binary gives as many as the process may use unless the flag says otherwise.
    pub workers: usize,
}

impl Config {
    /// A configuration with etcd's defaults for the given endpoints; tests adjust fields from here.
    pub fn new(endpoints: Vec<Endpoint>, listen_addr: SocketAddr, seed: u64) -> Self {
        Self {
            endpoints,
            listen_addr,
            max_send_bytes: DEFAULT_MAX_SEND_BYTES,
            max_recv_bytes: DEFAULT_MAX_RECV_BYTES,
            dial_timeout: Duration::from_secs(5),
            upstream_keepalive: KeepAlive {
                interval: None,
                timeout: Duration::from_secs(20),
                while_idle: false,
            },
            client_keepalive: KeepAlive {
                interval: Some(Duration::from_secs(2 * 60 * 60)),
                timeout: Duration::from_secs(20),
                while_idle: true,
            },
            client_ping_min_time: Duration::from_secs(5),
            client_setup_timeout: Duration::from_secs(120),
            max_concurrent_streams: u32::MAX,
            max_client_connections: DEFAULT_MAX_CLIENT_CONNECTIONS,
            max_client_calls: DEFAULT_MAX_CLIENT_CALLS,
            watch_buffer_size: DEFAULT_WATCH_BUFFER_SIZE,
            watch_max_join_lag: 0,
            user: None,
            namespace: Vec::new(),
            serializable_ordering: true,
            range_cache_max_bytes: DEFAULT_RANGE_CACHE_MAX_BYTES,
            leasing_prefix: Vec::new(),
            leasing_ttl: DEFAULT_LEASING_TTL,
            server_tls: None,
            upstream_tls: None,
            metrics_listen: None,
            endpoints_auto_sync: None,
            advertise: None,
            resolver: None,
            seed,
            shutdown_grace: Duration::from_secs(10),
            enable_pprof: false,
            grpc_logging: false,
            distributed_tracing: None,
            workers: 1,
        }
    }
}

/// `--max-client-connections` when the open-file limit does not decide it (see `main.rs`).
pub const DEFAULT_MAX_CLIENT_CONNECTIONS: usize = 60_000;
/// Default `--max-client-calls`: an idle Watch stream costs about 21 KiB (README.md), so this bounds what idle
/// streams can hold near 2 GiB.
pub const DEFAULT_MAX_CLIENT_CALLS: usize = 100_000;

/// Default `--watch-buffer-size`: etcd's Go proxy buffers 1024 responses per stream too.
pub const DEFAULT_WATCH_BUFFER_SIZE: usize = 1024;

/// `--range-cache-max-bytes`' default: 256 MiB, a size that suits a large cluster (etcd's own default quota is
/// 2 GiB); `0` turns the cache off.
pub const DEFAULT_RANGE_CACHE_MAX_BYTES: usize = 256 << 20;
/// etcd's default `--max-send-bytes`: 1.5 MiB, etcd's default request size limit.
/// The leasing session's TTL, as etcd's `concurrency.NewSession` (seconds).
pub const DEFAULT_LEASING_TTL: i64 = 60;

pub const DEFAULT_MAX_SEND_BYTES: usize = 1_572_864;
/// etcd's default `--max-recv-bytes`: `math.MaxInt32`.
pub const DEFAULT_MAX_RECV_BYTES: usize = i32::MAX as usize;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_accept_host_port_and_http_urls() {
        for (raw, want) in [
            ("127.0.0.1:2379", "127.0.0.1:2379"),
            ("http://127.0.0.1:2379", "127.0.0.1:2379"),
            ("http://etcd-0.example:2379/", "etcd-0.example:2379"),
            (" localhost:1 ", "localhost:1"),
            ("https://127.0.0.1:2379", "127.0.0.1:2379"),
            ("[::1]:2379", "[::1]:2379"),
        ] {
            assert_eq!(Endpoint::parse(raw).unwrap().authority(), want, "{raw}");
        }
    }

    #[test]
    fn malformed_endpoints_are_rejected_with_a_reason() {
        for (raw, reason) in [
            ("http://", "expected host:port"),
            ("foo:bar:baz", "expected host:port"),
            ("127.0.0.1", "expected host:port"),
            ("127.0.0.1:0", "port must be"),
            ("127.0.0.1:70000", "port must be"),
            (":2379", "missing or malformed host"),
            ("a%b:1", "missing or malformed host"),
            ("[zz]:1", "missing or malformed host"),
            ("a b:1", "missing or malformed host"),
            ("user@host:1", "missing or malformed host"),
            ("unix://sock", "not supported yet"),
            ("ftp://x:1", "unknown scheme"),
        ] {
            let err = Endpoint::parse(raw).unwrap_err();
            assert!(err.contains(reason), "{raw}: {err}");
        }
    }

    #[test]
    fn listen_addresses_take_ips_and_localhost() {
        assert_eq!(
            parse_listen_addr("127.0.0.1:23790").unwrap(),
            "127.0.0.1:23790".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("localhost:7").unwrap(),
            "127.0.0.1:7".parse().unwrap()
        );
        assert!(parse_listen_addr("example.com:1").is_err());
        assert!(parse_listen_addr("127.0.0.1").is_err());
    }
}
