//! The discovery flags: `--advertise-client-url`, `--resolver-prefix`, `--resolver-ttl`, checked as etcd's Go proxy
//! checks them (its words where it has them).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use clap::Args;

use crate::config::{Advertise, Config, Endpoint, Resolver};

#[derive(Args, Debug)]
pub struct DiscoveryArgs {
    /// The address clients reach this proxy at: MemberList answers with it, and --resolver-prefix registers it
    /// (default: --listen-addr's, 127.0.0.1 for an unspecified IP; empty: MemberList passes through to etcd)
    #[arg(long)]
    advertise_client_url: Option<String>,
    /// Key prefix under which the proxy registers itself in etcd (`<prefix>/<advertise-client-url>`), for clients
    /// resolving `etcd:///<prefix>`; MemberList then lists every registered proxy
    #[arg(long, default_value = "", value_parser = clap::builder::OsStringValueParser::new())]
    resolver_prefix: std::ffi::OsString,
    /// TTL in seconds of the registration's lease (required with --resolver-prefix)
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    resolver_ttl: i64,
}

/// Applies the discovery flags; `host_name` names this proxy in MemberList and in its registration.
pub fn apply(args: DiscoveryArgs, config: &mut Config, host_name: String) -> Result<(), String> {
    let url = match args.advertise_client_url {
        Some(url) => url,
        None => default_url(config.listen_addr),
    };
    if !url.is_empty() {
        Endpoint::parse(&url).map_err(|e| format!("--advertise-client-url {url:?}: {e}"))?;
    }
    let prefix = std::os::unix::ffi::OsStrExt::as_bytes(args.resolver_prefix.as_os_str()).to_vec();
    if !prefix.is_empty() && args.resolver_ttl < 1 {
        return Err(format!("invalid resolver-ttl {}", args.resolver_ttl));
    }
    if prefix.is_empty() && args.resolver_ttl > 0 {
        return Err("invalid resolver-prefix \"\" (--resolver-ttl needs it)".into());
    }
    if !prefix.is_empty() && url.is_empty() {
        return Err("invalid advertise-client-url \"\" (--resolver-prefix registers it)".into());
    }
    config.advertise = (!url.is_empty()).then_some(Advertise {
        url,
        name: host_name,
    });
    config.resolver = (!prefix.is_empty()).then_some(Resolver {
        prefix,
        ttl: args.resolver_ttl,
    });
    Ok(())
}

/// The listen address, as clients on this host reach it: an unspecified IP (listening on every address) is not an
/// address to dial, so loopback stands for it. (etcd's Go proxy defaults to `127.0.0.1:23790` whatever
/// `--listen-addr` says, which points clients at the wrong port when it differs.)
fn default_url(listen: SocketAddr) -> String {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port()).to_string()
}

/// This host's name, as Go's `os.Hostname` gives it.
pub fn host_name() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_url_is_the_listen_address_reachable_from_this_host() {
        assert_eq!(
            default_url("127.0.0.1:23790".parse().unwrap()),
            "127.0.0.1:23790"
        );
        assert_eq!(
            default_url("0.0.0.0:2000".parse().unwrap()),
            "127.0.0.1:2000"
        );
        assert_eq!(default_url("[::]:2000".parse().unwrap()), "[::1]:2000");
        assert_eq!(
            default_url("10.1.2.3:2000".parse().unwrap()),
            "10.1.2.3:2000"
        );
    }

    #[test]
    fn the_host_name_is_not_empty() {
        assert!(!host_name().is_empty());
    }
}
