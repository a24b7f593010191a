//! The parts of `/etc/resolv.conf` (resolv.conf(5)) an SRV lookup uses: `nameserver` lines, and `options timeout:N`
//! and `attempts:N`, with the defaults Go's resolver takes (5 s, 2 attempts, and 127.0.0.1:53 and [::1]:53 when no
//! nameserver is listed).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

/// The DNS port.
pub const DNS_PORT: u16 = 53;
/// How long one try waits for an answer, unless `options timeout:N` says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// How many times each server is tried, unless `options attempts:N` says otherwise.
pub const DEFAULT_ATTEMPTS: u32 = 2;

/// The servers to ask and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvConf {
    /// In the order listed; asked one after the other until one answers.
    pub servers: Vec<SocketAddr>,
    /// How long one try waits.
    pub timeout: Duration,
    /// Rounds over all servers.
    pub attempts: u32,
}

impl ResolvConf {
    /// Only `server`, with the default timeout and attempts.
    pub fn with_server(server: SocketAddr) -> Self {
        Self {
            servers: vec![server],
            timeout: DEFAULT_TIMEOUT,
            attempts: DEFAULT_ATTEMPTS,
        }
    }

    /// Reads the text of a resolv.conf. Lines it does not know, and malformed values, are ignored, as the C library
    /// ignores them.
    pub fn parse(text: &str) -> Self {
        let mut conf = Self {
            servers: Vec::new(),
            timeout: DEFAULT_TIMEOUT,
            attempts: DEFAULT_ATTEMPTS,
        };
        for line in text.lines() {
            let line = line.split(['#', ';']).next().unwrap_or_default();
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => {
                    if let Some(ip) = words.next().and_then(|w| w.parse::<IpAddr>().ok()) {
                        conf.servers.push(SocketAddr::new(ip, DNS_PORT));
                    }
                }
                Some("options") => {
                    for option in words {
                        let number = |name: &str| {
                            option
                                .strip_prefix(name)
                                .and_then(|n| n.parse::<u32>().ok())
                        };
                        // Bounds as glibc applies them (RES_MAXRETRANS 30 s, RES_MAXRETRY 5).
                        if let Some(seconds) = number("timeout:") {
                            conf.timeout = Duration::from_secs(seconds.clamp(1, 30).into());
                        } else if let Some(attempts) = number("attempts:") {
                            conf.attempts = attempts.clamp(1, 5);
                        }
                    }
                }
                _ => {}
            }
        }
        if conf.servers.is_empty() {
            conf.servers = vec![
                SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), DNS_PORT),
                SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), DNS_PORT),
            ];
        }
        conf
    }
}

/// Parses `--discovery-srv-dns`: `IP`, `IP:PORT` or `[IPv6]:PORT`.
pub fn parse_server(raw: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = raw.parse::<SocketAddr>() {
        return Ok(addr);
    }
    raw.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, DNS_PORT))
        .map_err(|_| format!("{raw:?} is not IP or IP:PORT"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nameservers_and_options_are_read() {
        let conf = ResolvConf::parse(
            "# generated\nsearch example.com\nnameserver 10.0.0.1\nnameserver  fe80::1 # v6\n\
             nameserver bogus\noptions ndots:2 timeout:3 attempts:9\n;nameserver 10.9.9.9\n",
        );
        assert_eq!(
            conf.servers,
            [
                "10.0.0.1:53".parse().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ]
        );
        assert_eq!(conf.timeout, Duration::from_secs(3));
        assert_eq!(conf.attempts, 5);
    }

    #[test]
    fn without_nameservers_the_local_host_is_asked() {
        let conf = ResolvConf::parse("options timeout:0 attempts:x\n");
        assert_eq!(
            conf.servers,
            ["127.0.0.1:53".parse().unwrap(), "[::1]:53".parse().unwrap()]
        );
        assert_eq!(
            (conf.timeout, conf.attempts),
            (Duration::from_secs(1), DEFAULT_ATTEMPTS)
        );
    }

    #[test]
    fn the_server_flag_takes_an_ip_with_or_without_port() {
        assert_eq!(
            parse_server("127.0.0.1:5353").unwrap(),
            "127.0.0.1:5353".parse().unwrap()
        );
        assert_eq!(
            parse_server("10.1.1.1").unwrap(),
            "10.1.1.1:53".parse().unwrap()
        );
        assert_eq!(parse_server("::1").unwrap(), "[::1]:53".parse().unwrap());
        assert_eq!(
            parse_server("[::1]:54").unwrap(),
            "[::1]:54".parse().unwrap()
        );
        assert!(parse_server("dns.example.com:53").is_err());
    }
}
