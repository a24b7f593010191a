//! Command line: `etcd-grpc-proxy start [flags]`, with the flag names and defaults of `etcd grpc-proxy start`.
//!
//! Flags this proxy implements are parsed into a [`Config`]. Every other flag of etcd's proxy is recognised, and
//! accepted only at its default (where it changes nothing); any other value is rejected with a message naming it
//! as not supported yet, so that a deployment never silently loses a behaviour it asked for.

use std::time::Duration;

use clap::{Args, Command, FromArgMatches};

mod discovery;
mod distributed_tracing;
pub mod srv;
mod tls;

use crate::config::{Config, Endpoint, KeepAlive, parse_listen_addr};

// Flags implemented by this proxy (a plain comment: clap would show a doc comment as the command's help).
#[derive(Args, Debug)]
struct StartArgs {
    /// Address to listen on for gRPC and HTTP (host:port)
    #[arg(long, default_value = "127.0.0.1:23790")]
    listen_addr: String,
    /// Comma-separated etcd endpoints (host:port or http://host:port)
    #[arg(long, default_value = "127.0.0.1:2379")]
    endpoints: String,
    /// Log at debug level (as --log-level=debug)
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    debug: bool,
    /// Log level: debug, info, warn, error, panic, or fatal (etcd's server flag)
    #[arg(long, default_value = "info")]
    log_level: String,
    /// Where logs go: default (stderr), stderr, stdout, or file paths, comma-separated (etcd's server flag)
    #[arg(long, default_value = "default")]
    log_outputs: String,
    /// Largest message sent to etcd, in bytes
    #[arg(long, default_value_t = crate::config::DEFAULT_MAX_SEND_BYTES)]
    max_send_bytes: usize,
    /// Largest message accepted from clients and from etcd, in bytes
    #[arg(long, default_value_t = crate::config::DEFAULT_MAX_RECV_BYTES)]
    max_recv_bytes: usize,
    /// Time limit of one connection attempt to an etcd endpoint (Go duration, e.g. 5s)
    #[arg(long, default_value = "5s", value_parser = parse_go_duration)]
    dial_timeout: Duration,
    /// Keep-alive ping interval towards etcd (0 disables)
    #[arg(long, default_value = "0s", value_parser = parse_go_duration)]
    dial_keepalive_time: Duration,
    /// Keep-alive ping timeout towards etcd
    #[arg(long, default_value = "20s", value_parser = parse_go_duration)]
    dial_keepalive_timeout: Duration,
    /// How often the endpoints are refreshed from etcd's MemberList (learners excluded), so that members can be
    /// replaced under the proxy (0: never)
    #[arg(long, default_value = "0s", value_parser = parse_go_duration)]
    endpoints_auto_sync_interval: Duration,
    /// A serializable read never returns an older revision than one the proxy already returned: a lagging
    /// member's answer is asked again linearizably
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "true")]
    experimental_serializable_ordering: bool,
    /// Bytes the range cache may hold: serializable reads are answered from copies of ranges kept current by a
    /// watch (0: no cache, every read goes to etcd)
    #[arg(long, default_value_t = crate::config::DEFAULT_RANGE_CACHE_MAX_BYTES)]
    range_cache_max_bytes: usize,
    /// Prefix of the leasing protocol's ownership keys (etcd's client/v3/leasing, inside --namespace):
    /// linearizable single-key reads of keys the proxy owns are answered locally (empty: no leasing)
    #[arg(long, default_value = "", value_parser = clap::builder::OsStringValueParser::new())]
    experimental_leasing_prefix: std::ffi::OsString,
    /// Seconds of the leasing session's lease: how long a proxy that stopped renewing it keeps its ownership
    #[arg(long, default_value_t = crate::config::DEFAULT_LEASING_TTL, value_parser = clap::value_parser!(i64).range(1..))]
    experimental_leasing_ttl: i64,
    /// Ping etcd even when no call is open
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    permit_without_stream: bool,
    /// Keep-alive ping interval towards clients
    #[arg(long, default_value = "2h", value_parser = parse_go_duration)]
    grpc_keepalive_interval: Duration,
    /// Keep-alive ping timeout towards clients
    #[arg(long, default_value = "20s", value_parser = parse_go_duration)]
    grpc_keepalive_timeout: Duration,
    /// Shortest interval at which a client may ping; more often ends its connection with GOAWAY "too_many_pings"
    /// (0: grpc-go's default, 5m)
    #[arg(long, default_value = "5s", value_parser = parse_go_duration)]
    grpc_keepalive_min_time: Duration,
    /// A client connection that has not finished its TLS handshake and sent its HTTP/2 preface (or an HTTP/1.1
    /// request head) within this time is closed, freeing its place (grpc-go's connection timeout)
    #[arg(long, default_value = "120s", value_parser = parse_go_duration)]
    client_setup_timeout: Duration,
    /// Concurrent HTTP/2 streams per client connection
    #[arg(long, default_value_t = u32::MAX)]
    max_concurrent_streams: u32,
    /// Client connections open at once; more are closed as soon as accepted (default: the open-file limit, which
    /// the proxy raises to its hard limit at start, minus 256 kept for etcd connections and files)
    #[arg(long)]
    max_client_connections: Option<usize>,
    /// gRPC calls in progress at once over all client connections; more are refused with ResourceExhausted
    #[arg(long, default_value_t = crate::config::DEFAULT_MAX_CLIENT_CALLS)]
    max_client_calls: usize,
    /// Watch responses a client stream may leave unread before the proxy ends that stream
    #[arg(long, default_value_t = crate::config::DEFAULT_WATCH_BUFFER_SIZE)]
    watch_buffer_size: usize,
    /// Revisions a new watcher without start revision may start behind the newest known one to share an upstream
    /// watcher at once (0: never; it gets etcd's exact start and is merged later)
    #[arg(long, default_value_t = 0)]
    watch_max_join_lag: u32,
    /// The proxy's own etcd user for upstream watch streams, as NAME or NAME:PASSWORD (as etcdctl takes it)
    #[arg(long)]
    user: Option<String>,
    /// Password of --user (when not given in --user itself). Anyone on the host can read a command line: prefer
    /// --password-file or the environment variable ETCD_GRPC_PROXY_PASSWORD
    #[arg(long)]
    password: Option<String>,
    /// File holding the password of --user (one trailing newline is not part of it)
    #[arg(long)]
    password_file: Option<std::path::PathBuf>,
    /// Prefix of every key clients read and write: each client sees a whole keyspace that is really the part of
    /// etcd's under this prefix (any bytes; empty: no namespace)
    #[arg(long, default_value = "", value_parser = clap::builder::OsStringValueParser::new())]
    namespace: std::ffi::OsString,
    /// Seed of the proxy's random choices (default: drawn from the OS at start and logged)
    #[arg(long)]
    seed: Option<u64>,
    /// Workers that serve client connections, each a thread of its own: 0 (the default) as many as the process may
    /// use (its cores, or fewer under a CPU quota or affinity mask), N that many (at most 1024)
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=MAX_WORKERS))]
    worker_threads: u16,
    /// Serve CPU profiles and runtime counts under /debug/pprof/ on the client port (not on --metrics-addr)
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    enable_pprof: bool,
    /// Log one line per gRPC call when it ends: service, method, status code, duration, peer (no request or
    /// response contents)
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    experimental_enable_grpc_logging: bool,
    #[command(flatten)]
    tls: tls::TlsArgs,
    #[command(flatten)]
    discovery: discovery::DiscoveryArgs,
    #[command(flatten)]
    tracing: distributed_tracing::TracingArgs,
    #[command(flatten)]
    srv: srv::SrvArgs,
}

/// What the command line asked for.
#[derive(Debug)]
pub struct Cli {
    pub config: Config,
    /// `--log-level`, or debug with `--debug`.
    pub log_level: crate::logging::LogLevel,
    /// `--log-outputs`; the caller opens the files.
    pub log_outputs: Vec<crate::logging::outputs::Target>,
    /// Whether the seed came from `--seed` (otherwise the caller drew it from the OS).
    pub seed_given: bool,
    /// `--worker-threads`: how many workers (one thread each); 0 for as many as the process may use.
    pub worker_threads: usize,
    /// `--max-client-connections` if given; otherwise the caller derives it from the open-file limit.
    pub max_client_connections: Option<usize>,
    /// Deprecated spellings the command line used, for the caller to warn about once logging is set up.
    pub warnings: Vec<String>,
    /// `--discovery-srv`: the caller looks the endpoints up ([`srv::discover`]) and puts them in `config`
    /// ([`srv::use_endpoints`]), which has none until then.
    pub srv: Option<srv::Request>,
}

fn command() -> Command {
    let start = StartArgs::augment_args(Command::new("start")).about("Start the gRPC proxy");
    Command::new("etcd-grpc-proxy")
        .about("A drop-in replacement for `etcd grpc-proxy start`")
        .version(env!("CARGO_PKG_VERSION"))
        .subcommand_required(true)
        .arg_required_else_help(true)
        .subcommand(start)
}

/// Parses the command line; `os_seed` supplies the seed when `--seed` is absent.
/// Errors are clap errors, so that `main` prints them the way users expect and exits non-zero.
pub fn parse<I, T>(args: I, os_seed: impl FnOnce() -> u64) -> Result<Cli, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let mut cmd = command();
    let matches = cmd.try_get_matches_from_mut(args)?;
    let start = matches
        .subcommand_matches("start")
        .expect("start is the only subcommand and it is required");
    let invalid = |msg: String| cmd.clone().error(clap::error::ErrorKind::InvalidValue, msg);
    let endpoints_on_command_line =
        start.value_source("endpoints") == Some(clap::parser::ValueSource::CommandLine);
    let args = StartArgs::from_arg_matches(start)?;
    into_config(args, endpoints_on_command_line, os_seed).map_err(invalid)
}

fn into_config(
    args: StartArgs,
    endpoints_on_command_line: bool,
    os_seed: impl FnOnce() -> u64,
) -> Result<Cli, String> {
    let endpoints = args
        .endpoints
        .split(',')
        .filter(|e| !e.trim().is_empty())
        .map(Endpoint::parse)
        .collect::<Result<Vec<_>, _>>()?;
    let srv = srv::apply(args.srv, endpoints_on_command_line && !endpoints.is_empty())?;
    // With --discovery-srv the endpoints come from DNS, after parsing.
    let endpoints = if srv.is_some() { Vec::new() } else { endpoints };
    if endpoints.is_empty() && srv.is_none() {
        return Err("--endpoints: at least one endpoint is required".into());
    }
    let listen_addr =
        parse_listen_addr(&args.listen_addr).map_err(|e| format!("--listen-addr: {e}"))?;
    if args.max_send_bytes == 0 || args.max_recv_bytes == 0 {
        return Err("--max-send-bytes and --max-recv-bytes must be greater than 0".into());
    }
    if args.max_send_bytes > args.max_recv_bytes {
        return Err(format!(
            "gRPC message recv limit ({} bytes) must be greater than send limit ({} bytes)",
            args.max_recv_bytes, args.max_send_bytes
        ));
    }
    if args.dial_timeout.is_zero() {
        return Err("--dial-timeout must be greater than 0".into());
    }
    let mut log_level = crate::logging::LogLevel::parse(&args.log_level)?;
    if args.debug {
        log_level = log_level.min(crate::logging::LogLevel::Debug);
    }
    let log_outputs = crate::logging::outputs::parse(&args.log_outputs)?;
    let seed_given = args.seed.is_some();
    let mut config = Config::new(endpoints, listen_addr, args.seed.unwrap_or_else(os_seed));
    config.max_send_bytes = args.max_send_bytes;
    config.max_recv_bytes = args.max_recv_bytes;
    config.dial_timeout = args.dial_timeout;
    config.serializable_ordering = args.experimental_serializable_ordering;
    config.range_cache_max_bytes = args.range_cache_max_bytes;
    config.leasing_prefix =
        std::os::unix::ffi::OsStrExt::as_bytes(args.experimental_leasing_prefix.as_os_str())
            .to_vec();
    config.leasing_ttl = args.experimental_leasing_ttl;
    config.endpoints_auto_sync =
        (!args.endpoints_auto_sync_interval.is_zero()).then_some(args.endpoints_auto_sync_interval);
    config.upstream_keepalive = KeepAlive {
        interval: (!args.dial_keepalive_time.is_zero()).then_some(args.dial_keepalive_time),
        timeout: args.dial_keepalive_timeout,
        while_idle: args.permit_without_stream,
    };
    config.client_keepalive = KeepAlive {
        interval: (!args.grpc_keepalive_interval.is_zero()).then_some(args.grpc_keepalive_interval),
        timeout: args.grpc_keepalive_timeout,
        while_idle: true,
    };
    config.client_ping_min_time = args.grpc_keepalive_min_time;
    config.max_concurrent_streams = args.max_concurrent_streams;
    if args.client_setup_timeout.is_zero() {
        return Err("--client-setup-timeout must be greater than 0".into());
    }
    config.client_setup_timeout = args.client_setup_timeout;
    if args.max_client_connections == Some(0) || args.max_client_calls == 0 {
        return Err(
            "--max-client-connections and --max-client-calls must be greater than 0".into(),
        );
    }
    config.max_client_connections = args
        .max_client_connections
        .unwrap_or(crate::config::DEFAULT_MAX_CLIENT_CONNECTIONS);
    config.max_client_calls = args.max_client_calls;
    if args.watch_buffer_size == 0 {
        return Err("--watch-buffer-size must be greater than 0".into());
    }
    config.watch_buffer_size = args.watch_buffer_size;
    config.watch_max_join_lag = i64::from(args.watch_max_join_lag);
    config.enable_pprof = args.enable_pprof;
    config.grpc_logging = args.experimental_enable_grpc_logging;
    let password = password(
        args.password,
        args.password_file,
        std::env::var(PASSWORD_ENV).ok(),
    )?;
    config.user = credentials(args.user, password)?;
    // Taken as bytes, as etcd takes it: a prefix need not be UTF-8.
    config.namespace = std::os::unix::ffi::OsStrExt::as_bytes(args.namespace.as_os_str()).to_vec();
    tls::apply(args.tls, &mut config)?;
    discovery::apply(args.discovery, &mut config, discovery::host_name())?;
    let warnings = distributed_tracing::apply(args.tracing, &mut config, wall_clock_unix_nanos())?;
    Ok(Cli {
        config,
        log_level,
        log_outputs,
        seed_given,
        worker_threads: args.worker_threads.into(),
        max_client_connections: args.max_client_connections,
        warnings,
        srv,
    })
}

/// The wall clock, read once where the flags are read: span times count on from it with `tokio::time` (a
/// simulation builds its config without this).
fn wall_clock_unix_nanos() -> u64 {
    let since_epoch = time::OffsetDateTime::now_utc() - time::OffsetDateTime::UNIX_EPOCH;
    u64::try_from(since_epoch.whole_nanoseconds()).unwrap_or(0)
}

/// The most workers `--worker-threads` may ask for: far past any host's cores, short of threads that would only
/// cost memory.
pub const MAX_WORKERS: i64 = 1024;

/// Where the password of `--user` may come from besides the command line.
pub const PASSWORD_ENV: &str = "ETCD_GRPC_PROXY_PASSWORD";

/// The password from `--password`, `--password-file` or the environment (used only when neither flag is given).
fn password(
    flag: Option<String>,
    file: Option<std::path::PathBuf>,
    env: Option<String>,
) -> Result<Option<Password>, String> {
    match (flag, file) {
        (Some(_), Some(_)) => Err("--password and --password-file are exclusive".into()),
        (Some(flag), None) => Ok(Some(Password::Given(flag, "--password"))),
        (None, Some(path)) => {
            let read = std::fs::read_to_string(&path)
                .map_err(|e| format!("--password-file {}: {e}", path.display()))?;
            let password = read
                .strip_suffix('\n')
                .map(|p| p.strip_suffix('\r').unwrap_or(p))
                .unwrap_or(&read);
            Ok(Some(Password::Given(
                password.to_owned(),
                "--password-file",
            )))
        }
        (None, None) => Ok(env.map(Password::FromEnvironment)),
    }
}

/// A password, and whether a flag gave it (the environment yields to `--user NAME:PASSWORD`).
enum Password {
    Given(String, &'static str),
    FromEnvironment(String),
}

/// `--user NAME:PASSWORD`, or `--user NAME` with the password from [`password`], the way etcdctl takes them.
fn credentials(
    user: Option<String>,
    password: Option<Password>,
) -> Result<Option<crate::config::Credentials>, String> {
    let Some(user) = user else {
        return match password {
            Some(Password::Given(_, flag)) => Err(format!("{flag} needs --user")),
            Some(Password::FromEnvironment(_)) | None => Ok(None),
        };
    };
    let (name, password) = match (user.split_once(':'), password) {
        (Some(_), Some(Password::Given(_, flag))) => {
            return Err(format!("--user NAME:PASSWORD and {flag} are exclusive"));
        }
        (Some((name, inline)), _) => (name.to_owned(), inline.to_owned()),
        (None, Some(Password::Given(password, _) | Password::FromEnvironment(password))) => {
            (user, password)
        }
        (None, None) => {
            return Err(format!(
                "--user {user:?} needs a password: --user NAME:PASSWORD, --password-file, --password or \
                 {PASSWORD_ENV}"
            ));
        }
    };
    if name.is_empty() {
        return Err("--user: the user name is empty".into());
    }
    Ok(Some(crate::config::Credentials {
        user: name,
        password,
    }))
}

/// Parses a Go duration (`300ms`, `1.5h`, `2h45m`, `0`): what etcd's flags accept.
pub fn parse_go_duration(raw: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {raw:?} (expected e.g. 500ms, 5s, 2h45m)");
    if raw == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = raw;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(bad());
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        let number: f64 = rest[..number_len].parse().map_err(|_| bad())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds_per_unit = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += number * seconds_per_unit;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_ok(args: &[&str]) -> Cli {
        parse(
            std::iter::once("etcd-grpc-proxy").chain(args.iter().copied()),
            || 7,
        )
        .unwrap()
    }

    fn parse_err(args: &[&str]) -> String {
        parse(
            std::iter::once("etcd-grpc-proxy").chain(args.iter().copied()),
            || 7,
        )
        .unwrap_err()
        .to_string()
    }

    #[test]
    fn worker_threads_are_bounded() {
        assert_eq!(
            parse_ok(&["start", "--worker-threads=1024"]).worker_threads,
            1024
        );
        let refused = parse_err(&["start", "--worker-threads=1025"]);
        assert!(
            refused.contains("--worker-threads") && refused.contains("0..=1024"),
            "{refused}"
        );
        assert!(parse_err(&["start", "--worker-threads=-1"]).contains("--worker-threads"));
    }

    #[test]
    fn discovery_flags_are_checked_as_etcds_proxy_checks_them() {
        let default = parse_ok(&["start", "--listen-addr=0.0.0.0:4000"]).config;
        assert_eq!(
            default.advertise.map(|a| a.url).as_deref(),
            Some("127.0.0.1:4000")
        );
        assert!(default.resolver.is_none());
        assert!(
            parse_ok(&["start", "--advertise-client-url="])
                .config
                .advertise
                .is_none()
        );
        let fleet = parse_ok(&["start", "--resolver-prefix=fleet", "--resolver-ttl=5"]).config;
        assert_eq!(
            fleet.resolver.map(|r| (r.prefix, r.ttl)),
            Some((b"fleet".to_vec(), 5))
        );
        assert!(
            parse_err(&["start", "--resolver-prefix=fleet"]).contains("invalid resolver-ttl 0")
        );
        assert!(parse_err(&["start", "--resolver-ttl=5"]).contains("invalid resolver-prefix"));
        let unadvertised = [
            "start",
            "--resolver-prefix=p",
            "--resolver-ttl=5",
            "--advertise-client-url=",
        ];
        assert!(parse_err(&unadvertised).contains("invalid advertise-client-url"));
        let bad = parse_err(&["start", "--advertise-client-url=a%b:1"]);
        assert!(bad.contains("--advertise-client-url \"a%b:1\""), "{bad}");
    }

    #[test]
    fn defaults_are_etcds() {
        let cli = parse_ok(&["start"]);
        assert_eq!(cli.config.listen_addr, "127.0.0.1:23790".parse().unwrap());
        assert_eq!(
            cli.config.endpoints,
            vec![Endpoint::parse("127.0.0.1:2379").unwrap()]
        );
        assert_eq!(cli.config.max_send_bytes, 1_572_864);
        assert_eq!(cli.config.max_recv_bytes, i32::MAX as usize);
        assert_eq!(cli.config.dial_timeout, Duration::from_secs(5));
        assert_eq!(cli.config.seed, 7);
        assert!(!cli.seed_given);
        assert_eq!(cli.log_level, crate::logging::LogLevel::Info);
        assert_eq!(cli.log_outputs, [crate::logging::outputs::Target::Stderr]);
        assert_eq!(
            cli.worker_threads, 0,
            "as many workers as the process may use"
        );
    }

    #[test]
    fn log_flags_take_etcds_values() {
        use crate::logging::LogLevel;
        use crate::logging::outputs::Target;
        let cli = parse_ok(&[
            "start",
            "--log-level=error",
            "--log-outputs=stdout,/tmp/p.log",
        ]);
        assert_eq!(cli.log_level, LogLevel::Error);
        assert_eq!(
            cli.log_outputs,
            [Target::File("/tmp/p.log".into()), Target::Stdout]
        );
        // --debug is --log-level=debug whatever the level says.
        let cli = parse_ok(&["start", "--log-level=warn", "--debug"]);
        assert_eq!(cli.log_level, LogLevel::Debug);
        let bad = parse_err(&["start", "--log-level=warning"]);
        assert!(bad.contains("unrecognized level: \"warning\""), "{bad}");
        let bad = parse_err(&["start", "--log-outputs=default,stdout"]);
        assert!(
            bad.contains("multi logoutput for \"default\" is not supported yet"),
            "{bad}"
        );
    }

    #[test]
    fn implemented_flags_reach_the_config() {
        let cli = parse_ok(&[
            "start",
            "--endpoints=http://127.0.0.1:1,127.0.0.1:2",
            "--listen-addr",
            "127.0.0.1:9",
            "--debug",
            "--max-send-bytes=10",
            "--max-recv-bytes=20",
            "--dial-timeout=250ms",
            "--dial-keepalive-time=10s",
            "--permit-without-stream=true",
            "--grpc-keepalive-min-time=1500ms",
            "--client-setup-timeout=3s",
            "--max-client-connections=7",
            "--max-client-calls=8",
            "--seed=42",
            "--data-dir=/tmp/x",
            "--worker-threads=3",
        ]);
        assert_eq!(cli.worker_threads, 3);
        assert_eq!(cli.config.endpoints.len(), 2);
        assert_eq!(cli.config.listen_addr.port(), 9);
        assert!(cli.seed_given);
        assert_eq!(cli.log_level, crate::logging::LogLevel::Debug);
        assert_eq!(
            (cli.config.max_send_bytes, cli.config.max_recv_bytes),
            (10, 20)
        );
        assert_eq!(cli.config.dial_timeout, Duration::from_millis(250));
        assert_eq!(
            cli.config.upstream_keepalive.interval,
            Some(Duration::from_secs(10))
        );
        assert!(cli.config.upstream_keepalive.while_idle);
        assert_eq!(cli.config.client_ping_min_time, Duration::from_millis(1500));
        assert_eq!(cli.config.client_setup_timeout, Duration::from_secs(3));
        assert_eq!(cli.max_client_connections, Some(7));
        assert_eq!(
            (
                cli.config.max_client_connections,
                cli.config.max_client_calls
            ),
            (7, 8)
        );
        assert_eq!(cli.config.seed, 42);
    }

    #[test]
    fn a_namespace_is_any_bytes_the_shell_can_pass() {
        use std::ffi::OsString;
        use std::os::unix::ffi::OsStringExt;
        assert!(parse_ok(&["start"]).config.namespace.is_empty());
        let raw = OsString::from_vec(b"--namespace=a\xff\x00/".to_vec());
        let cli = parse(
            [
                OsString::from("etcd-grpc-proxy"),
                OsString::from("start"),
                raw,
            ],
            || 7,
        )
        .unwrap();
        assert_eq!(cli.config.namespace, b"a\xff\x00/");
    }

    #[test]
    fn the_leasing_prefix_and_its_sessions_ttl_are_taken() {
        let off = parse_ok(&["start"]).config;
        assert!(off.leasing_prefix.is_empty());
        assert_eq!(off.leasing_ttl, 60, "concurrency.NewSession's TTL");
        let on = parse_ok(&[
            "start",
            "--experimental-leasing-prefix=/l/",
            "--experimental-leasing-ttl=5",
        ])
        .config;
        assert_eq!(
            (on.leasing_prefix.as_slice(), on.leasing_ttl),
            (&b"/l/"[..], 5)
        );
        let err = parse_err(&["start", "--experimental-leasing-ttl=0"]);
        assert!(err.contains("experimental-leasing-ttl"), "{err}");
    }

    #[test]
    fn distributed_tracing_takes_etcds_flags_in_both_spellings() {
        let off = parse_ok(&["start", "--distributed-tracing-sampling-rate=-1"]);
        assert_eq!(off.config.distributed_tracing, None, "off, nothing checked");
        let defaults = parse_ok(&["start", "--enable-distributed-tracing"])
            .config
            .distributed_tracing
            .expect("on");
        assert_eq!(
            (
                defaults.address.as_str(),
                defaults.service_name.as_str(),
                defaults.instance_id.as_str(),
                defaults.sampling_per_million
            ),
            ("localhost:4317", "etcd", "", 0)
        );
        let new = parse_ok(&[
            "start",
            "--enable-distributed-tracing=true",
            "--distributed-tracing-address=127.0.0.1:4318",
            "--distributed-tracing-service-name=proxy",
            "--distributed-tracing-instance-id=p1",
            "--distributed-tracing-sampling-rate=1000000",
        ]);
        assert!(new.warnings.is_empty());
        let old = parse_ok(&[
            "start",
            "--experimental-enable-distributed-tracing",
            "--experimental-distributed-tracing-address=127.0.0.1:4318",
            "--experimental-distributed-tracing-service-name=proxy",
            "--experimental-distributed-tracing-instance-id=p1",
            "--experimental-distributed-tracing-sampling-rate=1000000",
            // The deprecated spelling wins, as in etcd 3.6.
            "--distributed-tracing-service-name=other",
        ]);
        assert_eq!(old.warnings.len(), 5, "{:?}", old.warnings);
        assert!(old.warnings[0].contains("use --enable-distributed-tracing"));
        let (new, mut old) = (
            new.config.distributed_tracing.unwrap(),
            old.config.distributed_tracing.unwrap(),
        );
        // Each parse reads the wall clock.
        old.epoch_unix_nanos = new.epoch_unix_nanos;
        assert_eq!(new, old);
        assert_eq!(
            (
                new.address.as_str(),
                new.service_name.as_str(),
                new.instance_id.as_str(),
                new.sampling_per_million
            ),
            ("127.0.0.1:4318", "proxy", "p1", 1_000_000)
        );
        for (rate, why) in [
            ("-1", "tracing sampling rate must be positive"),
            ("1000001", "tracing sampling rate must be less than 1000000"),
        ] {
            let err = parse_err(&[
                "start",
                "--enable-distributed-tracing",
                &format!("--distributed-tracing-sampling-rate={rate}"),
            ]);
            assert!(err.contains(why), "{err}");
        }
        let err = parse_err(&[
            "start",
            "--enable-distributed-tracing",
            "--distributed-tracing-address=nohost",
        ]);
        assert!(err.contains("--distributed-tracing-address"), "{err}");
    }

    #[test]
    fn pprof_and_grpc_logging_are_off_unless_asked_for() {
        let config = parse_ok(&["start"]).config;
        assert!(!config.enable_pprof && !config.grpc_logging);
        for args in [
            &[
                "start",
                "--enable-pprof",
                "--experimental-enable-grpc-logging",
            ][..],
            &[
                "start",
                "--enable-pprof=true",
                "--experimental-enable-grpc-logging=true",
            ],
        ] {
            let config = parse_ok(args).config;
            assert!(config.enable_pprof && config.grpc_logging, "{args:?}");
        }
        let config = parse_ok(&["start", "--enable-pprof=false"]).config;
        assert!(!config.enable_pprof);
        assert!(parse_err(&["start", "--enable-pprof=maybe"]).contains("maybe"));
    }

    #[test]
    fn bad_input_is_rejected_with_a_message() {
        for (args, needle) in [
            (&["start", "--no-such-flag"][..], "--no-such-flag"),
            (&["start", "--endpoints=http://"], "expected host:port"),
            (
                &["start", "--endpoints=unixs://etcd.sock"],
                "not supported yet",
            ),
            (&["start", "--endpoints=,"], "at least one endpoint"),
            (&["start", "--listen-addr=nowhere"], "--listen-addr"),
            (
                &["start", "--max-send-bytes=30", "--max-recv-bytes=20"],
                "must be greater than send limit",
            ),
            (&["start", "--dial-timeout=5 seconds"], "invalid duration"),
            (&["start", "--max-recv-bytes=-1"], "-1"),
            (
                &["start", "--client-setup-timeout=0s"],
                "--client-setup-timeout must be greater than 0",
            ),
        ] {
            let err = parse_err(args);
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn the_proxy_user_is_taken_as_etcdctl_takes_it() {
        use crate::config::Credentials;
        let given = |args: &[&str]| parse_ok(args).config.user;
        let proxy = |password: &str| {
            Some(Credentials {
                user: "proxy".into(),
                password: password.into(),
            })
        };
        assert_eq!(given(&["start"]), None);
        assert_eq!(given(&["start", "--user=proxy:pw"]), proxy("pw"));
        assert_eq!(given(&["start", "--user=proxy:a:b"]), proxy("a:b"));
        assert_eq!(
            given(&["start", "--user", "proxy", "--password", "pw"]),
            proxy("pw")
        );
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, content: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, content).unwrap();
            format!("--password-file={}", path.display())
        };
        for (content, password) in [
            ("pw\n", "pw"),
            ("pw\r\n", "pw"),
            ("pw", "pw"),
            (" p w \n\n", " p w \n"),
        ] {
            let flag = file("password", content);
            assert_eq!(given(&["start", "--user=proxy", &flag]), proxy(password));
        }
        let missing = dir.path().join("missing");
        for (args, needle) in [
            (
                &["start", &file("p", "pw"), "--password=pw"][..],
                "exclusive",
            ),
            (
                &[
                    "start",
                    "--user=proxy",
                    &format!("--password-file={}", missing.display()),
                ],
                "missing",
            ),
            (
                &["start", "--user=proxy:pw", &file("p", "pw")],
                "--password-file are exclusive",
            ),
            (&["start", &file("p", "pw")], "--password-file needs --user"),
            (&["start", "--password=pw"], "--password needs --user"),
            (&["start", "--user=proxy"], "needs a password"),
            (&["start", "--user=proxy:pw", "--password=pw"], "exclusive"),
            (&["start", "--user=:pw"], "user name is empty"),
        ] {
            let err = parse_err(args);
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn go_durations_parse_like_go() {
        for (raw, want) in [
            ("0", 0.0),
            ("5s", 5.0),
            ("300ms", 0.3),
            ("1.5h", 5400.0),
            ("2h45m", 9900.0),
            ("1m30s", 90.0),
            ("10us", 0.00001),
        ] {
            let got = parse_go_duration(raw).unwrap().as_secs_f64();
            assert!((got - want).abs() < 1e-9, "{raw}: {got}");
        }
        for raw in ["", "5", "s", "5x", "-1s", "1..5s"] {
            assert!(parse_go_duration(raw).is_err(), "{raw}");
        }
    }
}
