//! `--discovery-srv`, `--discovery-srv-name`, `--insecure-discovery`: etcd's endpoints from DNS SRV records, looked
//! up once at start as etcd's Go proxy looks them up (`srv.GetClient` in `client/pkg/srv/srv.go`, called from
//! `discoverEndpoints` in `server/etcdmain/util.go`):
//!
//! - `_etcd-client-ssl._tcp.<domain>` gives `https://target:port` endpoints and `_etcd-client._tcp.<domain>` gives
//!   `http://target:port` ones (with `--discovery-srv-name=X`: `_etcd-client-ssl-X._tcp` and `_etcd-client-X._tcp`);
//!   when both lookups fail, the proxy stops with `dns lookup errors: <https error> and <http error>`, as etcd's.
//! - Without `--insecure-discovery` only the `https://` endpoints are kept. etcd's proxy also dials each one with
//!   TLS at start (`transport.ValidateSecureEndpoints`, checking the certificate against `--cacert` and the
//!   *domain* as server name) and, when none passes, silently falls back to `--endpoints`. This proxy does not dial
//!   at start: every connection to etcd verifies the certificate against `--cacert` and the target's name anyway,
//!   and a member that fails it is down for the proxy like any other. When no secure endpoint is found it stops
//!   with the reason instead of falling back.
//! - With `--insecure-discovery` and records of both kinds, only the `https://` endpoints are kept: TLS is decided
//!   once for all endpoints (etcd's client takes the first endpoint's scheme for all, and the https records come
//!   first, so it could not reach the http ones either).
//! - `--endpoints` with `--discovery-srv` is refused: the discovered endpoints replace it (etcd's proxy uses it only
//!   as that silent fallback).
//!
//! Differences in the details: records are ordered by priority, then weight (heaviest first), then name, not
//! shuffled by weight; a target of `.` (RFC 2782: no service here) is skipped rather than dialled; the trailing
//! dot of targets is dropped. The DNS servers are resolv.conf's `nameserver`s, or `--discovery-srv-dns` (not an
//! etcd flag); the domain is asked as given (no `search` suffixes).
//!
//! The choice of endpoints lives here; the lookups are hickory-resolver's ([`resolver`]), on the sockets the
//! binary supplies, since this runs before [`crate::run`] and its `Net`.

pub mod resolver;

use std::net::{IpAddr, SocketAddr};

use clap::Args;

use crate::config::{Config, Endpoint, Scheme};
use crate::net::BoxFuture;

/// The DNS port.
pub const DNS_PORT: u16 = 53;
/// Longest name on the wire, length bytes included (RFC 1035 §2.3.4).
const MAX_NAME: usize = 255;
/// Longest label.
const MAX_LABEL: usize = 63;

/// One SRV record's data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Srv {
    pub priority: u16,
    pub weight: u16,
    pub port: u16,
    /// The target host without the trailing dot; empty for `.`, which says the service is not offered there
    /// (RFC 2782).
    pub target: String,
}

/// The SRV lookups [`discover`] makes: [`resolver::HickoryLookup`] in the binary, tables in tests.
pub trait SrvLookup: Send + Sync {
    /// The SRV records of `name` (fully qualified, without the trailing dot), in the order the answer gives them;
    /// none is an error. Errors read as Go's resolver words them (`lookup NAME on SERVER: no such host`).
    fn lookup_srv<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<Srv>, String>>;
}

#[derive(Args, Debug)]
pub struct SrvArgs {
    /// Domain whose DNS SRV records list etcd's client endpoints, looked up at start:
    /// _etcd-client-ssl._tcp.<domain> (https) and _etcd-client._tcp.<domain> (http); replaces --endpoints
    #[arg(long, default_value = "")]
    discovery_srv: String,
    /// Service name in the SRV names: _etcd-client-ssl-<name>._tcp.<domain> and _etcd-client-<name>._tcp.<domain>
    #[arg(long, default_value = "")]
    discovery_srv_name: String,
    /// Also accept plaintext (http) endpoints from SRV records
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    insecure_discovery: bool,
    /// DNS server asked for the SRV records, as IP or IP:PORT (not an etcd flag; default: resolv.conf's)
    #[arg(long)]
    discovery_srv_dns: Option<String>,
}

/// A lookup the command line asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// `--discovery-srv`, without a trailing dot.
    pub domain: String,
    /// `--discovery-srv-name`.
    pub service_name: String,
    /// `--insecure-discovery`.
    pub insecure: bool,
    /// `--discovery-srv-dns`; `None`: the servers of `/etc/resolv.conf`.
    pub dns: Option<SocketAddr>,
}

impl Request {
    /// The SRV name looked up for `scheme` (`Https` or `Http`), as etcd's `srv.GetSRVService` builds it.
    pub fn name(&self, scheme: Scheme) -> String {
        let ssl = if scheme == Scheme::Https { "-ssl" } else { "" };
        let service = match self.service_name.as_str() {
            "" => String::new(),
            name => format!("-{name}"),
        };
        format!("_etcd-client{ssl}{service}._tcp.{}", self.domain)
    }
}

/// Checks the flags; `endpoints_given` says whether `--endpoints` named an endpoint on the command line.
pub fn apply(args: SrvArgs, endpoints_given: bool) -> Result<Option<Request>, String> {
    if args.discovery_srv.is_empty() {
        for (flag, given) in [
            ("--discovery-srv-name", !args.discovery_srv_name.is_empty()),
            ("--insecure-discovery", args.insecure_discovery),
            ("--discovery-srv-dns", args.discovery_srv_dns.is_some()),
        ] {
            if given {
                return Err(format!(
                    "{flag} applies to --discovery-srv, which is not given"
                ));
            }
        }
        return Ok(None);
    }
    let domain = args.discovery_srv;
    check_name(&domain).map_err(|e| format!("--discovery-srv {domain:?}: {e}"))?;
    let service_name = args.discovery_srv_name;
    if !service_name.is_empty() {
        check_name(&service_name)
            .ok()
            .filter(|()| !service_name.contains('.'))
            .ok_or_else(|| {
                format!("--discovery-srv-name {service_name:?}: one DNS label expected (letters, digits, '-', '_')")
            })?;
    }
    if endpoints_given {
        return Err(
            "--endpoints and --discovery-srv are exclusive: the endpoints come from the SRV records".into(),
        );
    }
    let dns = args
        .discovery_srv_dns
        .map(|raw| parse_server(&raw).map_err(|e| format!("--discovery-srv-dns: {e}")))
        .transpose()?;
    let request = Request {
        domain: domain.strip_suffix('.').unwrap_or(&domain).to_owned(),
        service_name,
        insecure: args.insecure_discovery,
        dns,
    };
    for scheme in [Scheme::Https, Scheme::Http] {
        let name = request.name(scheme);
        check_name(&name).map_err(|e| format!("--discovery-srv: {name}: {e}"))?;
    }
    Ok(Some(request))
}

/// Checks a domain name given on the command line: labels of letters, digits, '-' and '_' (as SRV names need),
/// within DNS's length limits; one trailing dot allowed.
pub fn check_name(name: &str) -> Result<(), String> {
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    if trimmed.is_empty() {
        return Err("the domain name is empty".into());
    }
    for label in trimmed.split('.') {
        if label.is_empty() {
            return Err("empty label (two dots in a row, or a leading dot)".into());
        }
        if label.len() > MAX_LABEL {
            return Err(format!("label {label:?} is longer than {MAX_LABEL} bytes"));
        }
        if let Some(c) = label
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_')))
        {
            return Err(format!(
                "{c:?} in label {label:?} (letters, digits, '-' and '_' only)"
            ));
        }
    }
    if trimmed.len() + 2 > MAX_NAME {
        return Err(format!("longer than {MAX_NAME} bytes on the wire"));
    }
    Ok(())
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

/// Looks the endpoints up through `lookup` and keeps the ones etcd's rules keep (module docs). The error names the
/// domain and the SRV names looked up.
pub async fn discover(request: &Request, lookup: &dyn SrvLookup) -> Result<Vec<Endpoint>, String> {
    let https_name = request.name(Scheme::Https);
    let http_name = request.name(Scheme::Http);
    let (https, http) = tokio::join!(
        lookup.lookup_srv(&https_name),
        lookup.lookup_srv(&http_name),
    );
    let https = https.and_then(|records| endpoints(&https_name, "https", records));
    let http = http.and_then(|records| endpoints(&http_name, "http", records));
    let flag = format!("--discovery-srv={}", request.domain);
    let chosen = match (https, http) {
        (Err(https), Err(http)) => {
            return Err(format!("{flag}: dns lookup errors: {https} and {http}"));
        }
        (Ok(https), Ok(http)) => {
            let why = if request.insecure {
                "TLS is decided once for all endpoints, and https records come first"
            } else {
                "plaintext endpoints need --insecure-discovery"
            };
            tracing::warn!(dropped = %list(&http), name = %http_name, "{flag}: {why}");
            https
        }
        (Ok(https), Err(http)) => {
            tracing::info!("{flag}: {http}");
            https
        }
        (Err(https), Ok(http)) if request.insecure => {
            tracing::info!("{flag}: {https}");
            http
        }
        (Err(https), Ok(http)) => {
            return Err(format!(
                "{flag}: no secure endpoint ({https}); the plaintext endpoints of {http_name} ({}) are used only \
                 with --insecure-discovery",
                list(&http)
            ));
        }
    };
    tracing::info!(srv_server = %request.domain, endpoints = %list(&chosen), "discovered cluster from SRV");
    Ok(chosen)
}

/// The endpoints of `records` (looked up as `name`) with `scheme`: ordered by priority, then weight (heaviest
/// first), then target; duplicates and unusable targets (`.`, or not a host name) skipped, the latter logged.
fn endpoints(name: &str, scheme: &str, mut records: Vec<Srv>) -> Result<Vec<Endpoint>, String> {
    records.sort_by(|a, b| {
        let key = |r: &Srv| {
            (
                r.priority,
                std::cmp::Reverse(r.weight),
                r.target.clone(),
                r.port,
            )
        };
        key(a).cmp(&key(b))
    });
    let mut out: Vec<Endpoint> = Vec::new();
    let mut skipped = Vec::new();
    for record in records {
        let target = if record.target.is_empty() {
            "."
        } else {
            &record.target
        };
        let url = format!("{scheme}://{target}:{}", record.port);
        match Endpoint::parse(&url) {
            Ok(endpoint) if !record.target.is_empty() => {
                if !out.contains(&endpoint) {
                    out.push(endpoint);
                }
            }
            _ => skipped.push(url),
        }
    }
    if out.is_empty() {
        return Err(format!(
            "lookup {name}: no usable target in its SRV records ({})",
            skipped.join(",")
        ));
    }
    if !skipped.is_empty() {
        tracing::warn!(name, ?skipped, "SRV records with no usable target skipped");
    }
    Ok(out)
}

fn list(endpoints: &[Endpoint]) -> String {
    endpoints
        .iter()
        .map(|e| match e.scheme() {
            Scheme::Https => format!("https://{e}"),
            Scheme::Http => format!("http://{e}"),
            Scheme::Bare => e.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Puts the discovered `endpoints` (all of one scheme, as [`discover`] returns them) in `config`, with TLS towards
/// etcd on for `https://` ones (with the TLS flags' settings, or the system's CAs), as `--endpoints` would.
pub fn use_endpoints(config: &mut Config, endpoints: Vec<Endpoint>) -> Result<(), String> {
    let Some(first) = endpoints.first() else {
        return Err("--discovery-srv found no endpoint".into());
    };
    match (first.scheme(), &config.upstream_tls) {
        (Scheme::Https, None) => config.upstream_tls = Some(Default::default()),
        (Scheme::Http, Some(_)) => {
            return Err(format!(
                "TLS towards etcd is configured (--cacert, --cert, --key or --insecure-skip-tls-verify), but \
                 --discovery-srv found only plaintext endpoints ({}): drop the TLS flags, or publish \
                 _etcd-client-ssl records",
                list(&endpoints)
            ));
        }
        _ => {}
    }
    config.endpoints = endpoints;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use super::*;

    /// DNS answers from a table: name → records; names not in it are not found, as Go's resolver words it.
    #[derive(Default)]
    struct Table {
        records: BTreeMap<String, Vec<Srv>>,
        asked: Mutex<Vec<String>>,
    }

    impl Table {
        fn with(mut self, name: &str, records: &[(u16, u16, u16, &str)]) -> Self {
            let records = records
                .iter()
                .map(|&(priority, weight, port, target)| Srv {
                    priority,
                    weight,
                    port,
                    target: target.into(),
                })
                .collect();
            self.records.insert(name.into(), records);
            self
        }
    }

    impl SrvLookup for Table {
        fn lookup_srv<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<Vec<Srv>, String>> {
            self.asked.lock().unwrap().push(name.to_owned());
            let found = match self.records.get(name) {
                Some(records) if !records.is_empty() => Ok(records.clone()),
                _ => Err(format!("lookup {name} on 127.0.0.1:53: no such host")),
            };
            Box::pin(std::future::ready(found))
        }
    }

    fn request(args: &[&str]) -> Result<Option<Request>, String> {
        let cli = super::super::parse(
            ["etcd-grpc-proxy", "start"]
                .into_iter()
                .chain(args.iter().copied()),
            || 7,
        )
        .map_err(|e| e.to_string())?;
        Ok(cli.srv)
    }

    async fn found(table: &Table, args: &[&str]) -> Result<String, String> {
        let request = request(args)?.expect("--discovery-srv is given");
        let endpoints = discover(&request, table).await?;
        Ok(list(&endpoints))
    }

    #[test]
    fn srv_names_are_etcds() {
        let plain = request(&["--discovery-srv=example.com."]).unwrap().unwrap();
        assert_eq!(plain.domain, "example.com");
        assert_eq!(
            plain.name(Scheme::Https),
            "_etcd-client-ssl._tcp.example.com"
        );
        assert_eq!(plain.name(Scheme::Http), "_etcd-client._tcp.example.com");
        let named = request(&["--discovery-srv=example.com", "--discovery-srv-name=x"])
            .unwrap()
            .unwrap();
        assert_eq!(
            named.name(Scheme::Https),
            "_etcd-client-ssl-x._tcp.example.com"
        );
        assert_eq!(named.name(Scheme::Http), "_etcd-client-x._tcp.example.com");
        assert_eq!(request(&[]).unwrap(), None);
    }

    #[test]
    fn flags_that_do_not_fit_are_refused() {
        for (args, needle) in [
            (
                &["--discovery-srv-name=x"][..],
                "--discovery-srv-name applies to --discovery-srv",
            ),
            (&["--insecure-discovery"], "--insecure-discovery applies"),
            (
                &["--discovery-srv-dns=127.0.0.1"],
                "--discovery-srv-dns applies",
            ),
            (&["--discovery-srv=a b"], "--discovery-srv \"a b\""),
            (
                &["--discovery-srv=a", "--discovery-srv-name=x.y"],
                "one DNS label",
            ),
            (
                &["--discovery-srv=a", "--discovery-srv-dns=dns:53"],
                "--discovery-srv-dns",
            ),
            (
                &["--discovery-srv=a", "--endpoints=127.0.0.1:2379"],
                "--endpoints and --discovery-srv are exclusive",
            ),
        ] {
            let err = request(args).unwrap_err();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
        // An empty --endpoints names no endpoint; the default is not given either.
        let request = request(&[
            "--discovery-srv=a",
            "--endpoints=",
            "--insecure-discovery=false",
        ]);
        assert!(!request.unwrap().unwrap().insecure);
    }

    #[test]
    fn names_that_cannot_be_asked_are_refused() {
        for bad in [
            "",
            ".",
            "a..b",
            ".a",
            "a b.c",
            "a/b",
            &"x".repeat(64),
            &["abcdefghi"; 26].join("."),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        for good in [
            "example.com",
            "example.com.",
            "_etcd-client-ssl-x._tcp.a-b.c_d",
        ] {
            check_name(good).unwrap();
        }
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

    #[tokio::test]
    async fn secure_records_are_used_and_plaintext_ones_need_insecure_discovery() {
        let both = Table::default()
            .with(
                "_etcd-client-ssl._tcp.example.com",
                &[(0, 0, 2379, "s1.example.com")],
            )
            .with(
                "_etcd-client._tcp.example.com",
                &[(0, 0, 2379, "p1.example.com")],
            );
        let secure = ["--discovery-srv=example.com"];
        assert_eq!(
            found(&both, &secure).await.unwrap(),
            "https://s1.example.com:2379"
        );
        let insecure = ["--discovery-srv=example.com", "--insecure-discovery"];
        assert_eq!(
            found(&both, &insecure).await.unwrap(),
            "https://s1.example.com:2379"
        );
        assert_eq!(
            *both.asked.lock().unwrap(),
            [
                "_etcd-client-ssl._tcp.example.com",
                "_etcd-client._tcp.example.com",
            ]
            .repeat(2)
        );

        let plain = Table::default().with(
            "_etcd-client._tcp.example.com",
            &[(0, 0, 2379, "p1.example.com")],
        );
        assert_eq!(
            found(&plain, &insecure).await.unwrap(),
            "http://p1.example.com:2379"
        );
        let err = found(&plain, &secure).await.unwrap_err();
        assert!(
            err.starts_with("--discovery-srv=example.com: no secure endpoint (lookup _etcd-client-ssl._tcp.example.com on 127.0.0.1:53: no such host)"),
            "{err}"
        );
        assert!(
            err.contains("http://p1.example.com:2379") && err.contains("--insecure-discovery"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn no_records_is_an_error_in_etcds_words() {
        let err = found(
            &Table::default(),
            &["--discovery-srv=example.com", "--discovery-srv-name=x"],
        )
        .await
        .unwrap_err();
        assert_eq!(
            err,
            "--discovery-srv=example.com: dns lookup errors: \
             lookup _etcd-client-ssl-x._tcp.example.com on 127.0.0.1:53: no such host and \
             lookup _etcd-client-x._tcp.example.com on 127.0.0.1:53: no such host"
        );
        let nowhere = Table::default().with(
            "_etcd-client._tcp.example.com",
            &[(0, 0, 0, ""), (0, 0, 1, "a\\032b")],
        );
        let err = found(
            &nowhere,
            &["--discovery-srv=example.com", "--insecure-discovery"],
        )
        .await
        .unwrap_err();
        assert!(err.contains("dns lookup errors"), "{err}");
        assert!(
            err.contains("lookup _etcd-client._tcp.example.com: no usable target in its SRV records (http://.:0,http://a\\032b:1)"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn records_are_ordered_by_priority_then_weight_and_deduplicated() {
        let table = Table::default().with(
            "_etcd-client._tcp.example.com",
            &[
                (20, 0, 1, "d"),
                (10, 1, 1, "c"),
                (10, 5, 1, "b"),
                (10, 5, 1, "b"),
                (10, 5, 1, "a"),
                (0, 0, 0, ""),
            ],
        );
        let got = found(
            &table,
            &["--discovery-srv=example.com", "--insecure-discovery"],
        )
        .await
        .unwrap();
        assert_eq!(got, "http://a:1,http://b:1,http://c:1,http://d:1");
    }

    #[test]
    fn tls_towards_etcd_follows_the_discovered_scheme() {
        let parse = |args: &[&str]| {
            super::super::parse(
                ["etcd-grpc-proxy", "start", "--discovery-srv=example.com"]
                    .into_iter()
                    .chain(args.iter().copied()),
                || 7,
            )
            .unwrap()
            .config
        };
        let https = vec![Endpoint::parse("https://a:1").unwrap()];
        let http = vec![Endpoint::parse("http://a:1").unwrap()];
        let mut config = parse(&[]);
        use_endpoints(&mut config, https.clone()).unwrap();
        assert_eq!(config.endpoints, https);
        assert!(config.upstream_tls.is_some());
        let mut config = parse(&["--insecure-discovery"]);
        use_endpoints(&mut config, http.clone()).unwrap();
        assert!(config.upstream_tls.is_none());
        let mut config = parse(&["--cacert=ca.pem"]);
        use_endpoints(&mut config, https).unwrap();
        assert_eq!(
            config.upstream_tls.unwrap().ca.unwrap(),
            std::path::PathBuf::from("ca.pem")
        );
        let mut config = parse(&["--cacert=ca.pem", "--insecure-discovery"]);
        let err = use_endpoints(&mut config, http).unwrap_err();
        assert!(
            err.contains("found only plaintext endpoints (http://a:1)"),
            "{err}"
        );
    }
}
