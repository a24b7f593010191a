//! The SRV lookups of `--discovery-srv`, made by hickory-resolver: over UDP to resolv.conf's `nameserver`s (or the
//! one server of `--discovery-srv-dns`), a truncated answer asked again over TCP, with resolv.conf's `timeout` and
//! `attempts`. Names are asked fully qualified, so `search` domains never apply. The runtime that opens the sockets
//! is the caller's (a hickory `ConnectionProvider`: tokio's in the binary), since this runs before [`crate::run`]
//! and its `Net`.
//!
//! Errors read as Go's resolver words them (`lookup NAME on SERVER: no such host`), since etcd prints those; the
//! servers named are all those asked, not only the last one.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::rr::{Name, RData, RecordType};
use hickory_resolver::{ConnectionProvider, Resolver};

use super::{DNS_PORT, Srv, SrvLookup};
use crate::net::BoxFuture;

/// Where the SRV questions go, and how long each try waits and how often it is made.
#[derive(Clone, Debug)]
pub struct Servers {
    config: ResolverConfig,
    options: ResolverOpts,
}

impl Servers {
    /// Only `server` (`--discovery-srv-dns`), with resolv.conf's defaults (5 s per try, 2 attempts).
    pub fn only(server: SocketAddr) -> Self {
        Self::new(
            ResolverConfig::from_name_servers(vec![name_server(server)]),
            ResolverOpts::default(),
        )
    }

    /// `options.attempts` is resolv.conf's: how many times a question is sent (glibc, Go). hickory counts the tries
    /// after the first, so one less.
    fn new(config: ResolverConfig, mut options: ResolverOpts) -> Self {
        options.attempts = options.attempts.saturating_sub(1);
        Self { config, options }
    }

    /// The servers and options of resolv.conf's text; `None` (no file) or a file without a usable `nameserver`
    /// means the local host's port 53, as for Go's resolver.
    pub fn from_resolv_conf(text: Option<&[u8]>) -> Self {
        let parsed = text.map(hickory_resolver::system_conf::parse_resolv_conf);
        match parsed {
            Some(Ok((config, options))) => Self::new(config, options),
            other => {
                if let Some(Err(err)) = other {
                    tracing::info!(%err, "resolv.conf: no usable nameserver; asking the local host");
                }
                let local = [
                    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DNS_PORT),
                    SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), DNS_PORT),
                ];
                Self::new(
                    ResolverConfig::from_name_servers(local.map(name_server).into()),
                    ResolverOpts::default(),
                )
            }
        }
    }

    /// The servers as error messages name them: `IP:PORT`, comma-separated.
    pub fn describe(&self) -> String {
        self.config
            .name_servers()
            .iter()
            .map(|server| {
                let port = server.connections.first().map_or(DNS_PORT, |c| c.port);
                SocketAddr::new(server.ip, port).to_string()
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// A server asked over UDP, and over TCP for truncated answers, on `addr`'s port.
fn name_server(addr: SocketAddr) -> NameServerConfig {
    let mut server = NameServerConfig::udp_and_tcp(addr.ip());
    for connection in &mut server.connections {
        connection.port = addr.port();
    }
    server
}

/// [`SrvLookup`] through hickory-resolver, on the runtime of `P`.
pub struct HickoryLookup<P: ConnectionProvider> {
    resolver: Resolver<P>,
    servers: String,
}

impl<P: ConnectionProvider> HickoryLookup<P> {
    pub fn new(servers: Servers, provider: P) -> Result<Self, String> {
        let described = servers.describe();
        let mut builder = Resolver::builder_with_config(servers.config, provider);
        *builder.options_mut() = servers.options;
        let resolver = builder
            .build()
            .map_err(|e| format!("DNS resolver for {described}: {e}"))?;
        Ok(Self {
            resolver,
            servers: described,
        })
    }

    async fn lookup(&self, name: &str) -> Result<Vec<Srv>, String> {
        let error = |reason: String| format!("lookup {name} on {}: {reason}", self.servers);
        let fqdn = Name::from_ascii(format!("{name}.")).map_err(|e| error(e.to_string()))?;
        let lookup = self
            .resolver
            .lookup(fqdn, RecordType::SRV)
            .await
            .map_err(|e| error(reason(&e)))?;
        let records: Vec<Srv> = lookup
            .answers()
            .iter()
            .filter_map(|record| match &record.data {
                RData::SRV(srv) => Some(Srv {
                    priority: srv.priority,
                    weight: srv.weight,
                    port: srv.port,
                    target: target(&srv.target),
                }),
                _ => None,
            })
            .collect();
        if records.is_empty() {
            return Err(error("no such host".into()));
        }
        Ok(records)
    }
}

impl<P: ConnectionProvider> SrvLookup for HickoryLookup<P> {
    fn lookup_srv<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<Srv>, String>> {
        Box::pin(self.lookup(name))
    }
}

/// Why a lookup failed, in Go's resolver's words where it has them.
fn reason(err: &NetError) -> String {
    match err {
        NetError::Dns(DnsError::NoRecordsFound(_)) => "no such host".into(),
        NetError::Dns(DnsError::ResponseCode(code)) => format!("server misbehaving ({code})"),
        NetError::Timeout => "i/o timeout".into(),
        other => other.to_string(),
    }
}

/// A record's target without the trailing dot, empty for the root (`.`: no service there, RFC 2782). Bytes other
/// than letters, digits, `-` and `_` are written `\DDD` (decimal, RFC 1035 §5.1), as Go writes them.
fn target(name: &Name) -> String {
    let label = |bytes: &[u8]| -> String {
        bytes
            .iter()
            .map(|&b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => char::from(b).to_string(),
                _ => format!("\\{b:03}"),
            })
            .collect()
    };
    name.iter().map(label).collect::<Vec<_>>().join(".")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use hickory_resolver::net::runtime::TokioRuntimeProvider;
    use testkit::dns::{Asked, FakeDns};

    use super::*;

    const NAME: &str = "_etcd-client._tcp.example.com";

    async fn lookup(dns: SocketAddr) -> Result<Vec<Srv>, String> {
        HickoryLookup::new(Servers::only(dns), TokioRuntimeProvider::default())?
            .lookup_srv(NAME)
            .await
    }

    fn targets(records: &[Srv]) -> Vec<(u16, u16, u16, &str)> {
        records
            .iter()
            .map(|r| (r.priority, r.weight, r.port, r.target.as_str()))
            .collect()
    }

    #[tokio::test]
    async fn records_come_back_in_the_order_given_without_trailing_dots() {
        let dns = FakeDns::new()
            .srv(
                NAME,
                &[
                    (10, 5, 2379, "m1.example.com."),
                    (0, 0, 2380, "."),
                    (1, 2, 3, "a b"),
                ],
            )
            .start()
            .await
            .unwrap();
        let records = lookup(dns.addr).await.unwrap();
        assert_eq!(
            targets(&records),
            [
                (10, 5, 2379, "m1.example.com"),
                (0, 0, 2380, ""),
                (1, 2, 3, "a\\032b")
            ]
        );
        assert_eq!(
            dns.asked(),
            [Asked {
                name: NAME.into(),
                tcp: false
            }]
        );
    }

    #[tokio::test]
    async fn a_truncated_answer_is_asked_again_over_tcp() {
        let dns = FakeDns::new()
            .srv(NAME, &[(0, 0, 2379, "m1")])
            .truncate_udp()
            .start()
            .await
            .unwrap();
        let records = lookup(dns.addr).await.unwrap();
        assert_eq!(targets(&records), [(0, 0, 2379, "m1")]);
        assert_eq!(
            dns.asked(),
            [
                Asked {
                    name: NAME.into(),
                    tcp: false
                },
                Asked {
                    name: NAME.into(),
                    tcp: true
                }
            ]
        );
    }

    #[tokio::test]
    async fn no_such_name_or_no_records_is_no_such_host() {
        let dns = FakeDns::new()
            .srv("_etcd-client-ssl._tcp.example.com", &[(0, 0, 1, "m1")])
            .srv("_etcd-client._tcp.example.com", &[])
            .start()
            .await
            .unwrap();
        let other =
            HickoryLookup::new(Servers::only(dns.addr), TokioRuntimeProvider::default()).unwrap();
        for name in [NAME, "_etcd-client._tcp.example.org"] {
            assert_eq!(
                other.lookup_srv(name).await.unwrap_err(),
                format!("lookup {name} on {}: no such host", dns.addr)
            );
        }
    }

    #[tokio::test]
    async fn a_server_failure_is_misbehaving() {
        let dns = FakeDns::new().fail(NAME, 2).start().await.unwrap();
        assert_eq!(
            lookup(dns.addr).await.unwrap_err(),
            format!(
                "lookup {NAME} on {}: server misbehaving (Server Failure)",
                dns.addr
            )
        );
    }

    /// A socket that takes the questions and never answers; on a paused clock the tries time out at once, and the
    /// clock tells how long they took.
    #[tokio::test(start_paused = true)]
    async fn a_silent_server_is_an_io_timeout_after_two_tries_of_five_seconds() {
        let silent = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        let started = tokio::time::Instant::now();
        assert_eq!(
            lookup(addr).await.unwrap_err(),
            format!("lookup {NAME} on {addr}: i/o timeout")
        );
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    #[test]
    fn resolv_conf_gives_the_servers_and_options() {
        let conf = Servers::from_resolv_conf(Some(
            b"# generated\nsearch example.com\nnameserver 10.0.0.1\nnameserver fe80::1\n\
              options timeout:3 attempts:4\n",
        ));
        assert_eq!(conf.describe(), "10.0.0.1:53,[fe80::1]:53");
        assert_eq!(conf.options.timeout, Duration::from_secs(3));
        assert_eq!(conf.options.attempts, 3, "retries after the first try");
        for text in [None, Some(&b"options timeout:2\n"[..])] {
            let conf = Servers::from_resolv_conf(text);
            assert_eq!(conf.describe(), "127.0.0.1:53,[::1]:53", "{text:?}");
        }
    }

    #[test]
    fn the_flag_names_one_server_with_its_port() {
        let conf = Servers::only("127.0.0.1:5353".parse().unwrap());
        assert_eq!(conf.describe(), "127.0.0.1:5353");
        assert_eq!(conf.options.timeout, Duration::from_secs(5));
        assert_eq!(
            conf.options.attempts, 1,
            "two tries, as resolv.conf's default"
        );
    }
}
