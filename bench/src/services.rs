//! The processes under test, each on free loopback ports: a one-member etcd ([`testkit::EtcdCluster`]), etcd's
//! Go proxy in front of it (`etcd grpc-proxy start`, from the same etcd binary: [`GoProxy`], on the kit's
//! [`Process`]) and this proxy in front of it with its range cache on ([`CACHE_FLAG`], [`testkit::ProxyProcess`]);
//! when the run visits it, a second process of this proxy with its range cache off ([`NO_CACHE_FLAG`]), and with
//! `--baseline-bin` a process of another build of it ([`Target::BaselineProxy`]).
//!
//! Every process is the test kit's: killed by its own PID when dropped, so a failed or interrupted benchmark
//! leaves nothing running, with its data and log in a temporary directory on tmpfs (`/dev/shm`) when there is one,
//! so etcd's fsyncs do not measure the disk (the same etcd serves every target, so this shifts every target
//! alike). The Go proxy's data and log go in the etcd's directory, which outlives it.
//!
//! A failed start is not retried on new ports: the kit hands out ports outside the kernel's ephemeral range, so
//! no outgoing connection can take one between its probe and the bind, and the benchmark starts one stack at a
//! time. A start that fails anyway is a real failure, reported with the process's log.
//!
//! With `--tls` every link is mutual TLS, with the certificates of [`Pki`]: etcd serves TLS with
//! `--client-cert-auth`, both proxies dial it over TLS and serve TLS requiring client certificates, and every
//! [`Service`] carries the client TLS the benchmark reaches it with.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use testkit::pki::TlsPaths;
use testkit::process::Process;
use testkit::{EtcdCluster, ProxyProcess};

use crate::load::dial::{ClientTls, Dialer};
use crate::plan::{EtcdBinary, Target};
use crate::tls::Pki;

/// How long etcd's Go proxy may take to answer `GET /health` with 200 after it was started.
const GO_PROXY_READY_TIMEOUT: Duration = Duration::from_secs(45);

/// A running target as the runner sees it: where its clients connect, how (in the clear or over TLS), and which
/// process to meter.
#[derive(Clone, Debug)]
pub struct Service {
    addr: String,
    pid: u32,
    tls: Option<ClientTls>,
    /// Where its own Prometheus metrics are served: `/metrics` (this proxy, etcd), `/proxy/metrics` (etcd's Go
    /// proxy, whose `/metrics` relays etcd's).
    metrics_path: &'static str,
}

impl Service {
    /// `127.0.0.1:PORT` its clients (gRPC and HTTP) use.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The HTTP path of its own Prometheus metrics.
    pub fn metrics_path(&self) -> &'static str {
        self.metrics_path
    }

    /// What opens gRPC connections to it.
    pub fn dialer(&self) -> Dialer {
        Dialer::new(&self.addr, self.tls.clone())
    }

    /// The client certificate and CA its HTTP endpoints (`/metrics`, `/health`) take, if it serves TLS.
    pub fn http_tls(&self) -> Option<&TlsPaths> {
        self.tls.as_ref().map(ClientTls::paths)
    }
}

/// etcd's Go gRPC proxy, `etcd grpc-proxy start` of the etcd binary under test.
pub struct GoProxy {
    addr: String,
    process: Process,
}

impl GoProxy {
    /// Starts it in front of `upstream` with its data and log in `dir`, and waits (with a deadline) until
    /// `GET /health` answers 200 (over TLS with `client` when it serves TLS).
    pub async fn start(
        etcd_bin: &Path,
        upstream: &str,
        dir: &Path,
        flags: &[String],
        client: Option<&TlsPaths>,
    ) -> Result<Self, String> {
        let port = testkit::try_free_port().map_err(|e| format!("a free loopback port: {e}"))?;
        let addr = format!("127.0.0.1:{port}");
        let mut cmd = Command::new(etcd_bin);
        // --advertise-client-url is its own address, as a user would set it. Its default, 127.0.0.1:23790, is an
        // address where nothing listens: the proxies of etcd 3.4.23 and 3.5.1 start regardless, but 3.5.30's dials
        // it at startup and exits with "context deadline exceeded" when nothing answers there.
        cmd.args(["grpc-proxy", "start"])
            .arg(format!("--endpoints={upstream}"))
            .arg(format!("--listen-addr={addr}"))
            .arg(format!("--advertise-client-url={addr}"))
            .arg(format!("--data-dir={}", dir.join("go-proxy").display()))
            .args(flags);
        let mut process = Process::spawn("etcd's Go grpc-proxy", cmd, &dir.join("go-proxy.log"))?;
        process
            .wait_http_with(
                &addr,
                "/health",
                client,
                GO_PROXY_READY_TIMEOUT,
                |code, _| code == 200,
            )
            .await?;
        Ok(Self { addr, process })
    }

    /// `127.0.0.1:PORT` it listens on.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}

/// The flag that turns this proxy's range cache on (256 MiB), passed explicitly so the benchmark measures the cache
/// whatever the proxy's default is.
pub const CACHE_FLAG: &str = "--range-cache-max-bytes=268435456";

/// The flag that turns this proxy's range cache off.
pub const NO_CACHE_FLAG: &str = "--range-cache-max-bytes=0";

/// The proxies of a stack besides etcd's Go proxy and this proxy with its range cache, each started only when a
/// case on the stack visits it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Extras<'a> {
    /// This proxy with its range cache off ([`Target::RustProxyNoCache`]).
    pub nocache: bool,
    /// Another build of this proxy ([`Target::BaselineProxy`]).
    pub baseline: Option<&'a Path>,
}

/// One etcd and the proxies in front of it. Fields drop in order: the proxies before etcd, whose directory
/// (holding the Go proxy's too) goes before the certificates, last.
pub struct Stack {
    rust_proxy: ProxyProcess,
    rust_proxy_nocache: Option<ProxyProcess>,
    baseline_proxy: Option<ProxyProcess>,
    go_proxy: GoProxy,
    etcd: EtcdCluster,
    etcd_pid: u32,
    client_tls: Option<ClientTls>,
    _pki: Option<Pki>,
}

impl Stack {
    /// Starts a fresh etcd from `etcd`, then both proxies in front of it (and the `extras`: a second process of
    /// this proxy with its range cache off, a process of the baseline build), all with `--namespace` if not empty,
    /// this proxy with `proxy_args` besides (not the baseline build, which may not know them); with `tls`, every
    /// link is mutual TLS.
    pub async fn start(
        etcd: &EtcdBinary,
        proxy_bin: &Path,
        namespace: &str,
        proxy_args: &[String],
        tls: bool,
        extras: Extras<'_>,
    ) -> Result<Self, String> {
        let pki = tls.then(Pki::new).transpose()?;
        let client_tls = pki
            .as_ref()
            .map(|pki| ClientTls::load(pki.client()))
            .transpose()?;
        let client = pki.as_ref().map(Pki::client);
        let mut flags: Vec<String> = (!namespace.is_empty())
            .then(|| format!("--namespace={namespace}"))
            .into_iter()
            .collect();
        flags.extend(pki.iter().flat_map(Pki::proxy_flags));
        let binaries = etcd.binaries()?;
        let cluster = EtcdCluster::start_with(
            &binaries,
            1,
            &["--log-level=warn"],
            pki.as_ref().map(|pki| pki.etcd().clone()),
        )
        .await?;
        // `https://127.0.0.1:PORT` with TLS, which both proxies take as "dial etcd over TLS".
        let upstream = cluster.endpoint(0);
        let etcd_pid = cluster
            .pid(0)
            .ok_or_else(|| format!("etcd {} on {upstream} is not running", etcd.version))?;
        let go_proxy = GoProxy::start(
            &binaries.etcd,
            &upstream,
            &cluster.scratch_dir(),
            &flags,
            client,
        )
        .await?;
        let cached_flags: Vec<String> = flags
            .iter()
            .cloned()
            .chain([CACHE_FLAG.to_string()])
            .chain(proxy_args.iter().cloned())
            .collect();
        let rust_proxy = ProxyProcess::start_with(
            proxy_bin,
            std::slice::from_ref(&upstream),
            &cached_flags,
            &[("RUST_LOG", "warn")],
            client.cloned(),
        )
        .await?;
        let rust_proxy_nocache = if extras.nocache {
            let mut flags = flags.clone();
            flags.push(NO_CACHE_FLAG.to_string());
            flags.extend(proxy_args.iter().cloned());
            Some(
                ProxyProcess::start_with(
                    proxy_bin,
                    std::slice::from_ref(&upstream),
                    &flags,
                    &[("RUST_LOG", "warn")],
                    client.cloned(),
                )
                .await?,
            )
        } else {
            None
        };
        // Without CACHE_FLAG, which an old build may not know: its range cache is its default (today's default is
        // CACHE_FLAG's size), so that the baseline is the build as its users got it.
        let baseline_proxy = match extras.baseline {
            Some(bin) => Some(
                ProxyProcess::start_with(
                    bin,
                    &[upstream],
                    &flags,
                    &[("RUST_LOG", "warn")],
                    client.cloned(),
                )
                .await
                .map_err(|e| format!("the baseline build {}: {e}", bin.display()))?,
            ),
            None => None,
        };
        Ok(Self {
            rust_proxy,
            rust_proxy_nocache,
            baseline_proxy,
            go_proxy,
            etcd: cluster,
            etcd_pid,
            client_tls,
            _pki: pki,
        })
    }

    /// Whether every link of this stack is mutual TLS.
    pub fn tls(&self) -> bool {
        self.client_tls.is_some()
    }

    /// etcd itself.
    pub fn etcd(&self) -> Service {
        Service {
            addr: self.etcd.addr(0),
            pid: self.etcd_pid,
            tls: self.client_tls.clone(),
            metrics_path: "/metrics",
        }
    }

    /// The service a target's clients talk to; an error for this proxy without its cache or the baseline build when
    /// the stack was started without it.
    pub fn entry(&self, target: Target) -> Result<Service, String> {
        match target {
            Target::Direct => Ok(self.etcd()),
            _ => self
                .proxy(target)
                .ok_or_else(|| format!("{} was not started with this stack", target.label())),
        }
    }

    /// The proxy process of a target (none for direct, and none for this proxy without its cache or the baseline
    /// build when the stack was started without it).
    pub fn proxy(&self, target: Target) -> Option<Service> {
        let this = |proxy: &ProxyProcess| Service {
            addr: proxy.addr(),
            pid: proxy.pid(),
            tls: self.client_tls.clone(),
            metrics_path: "/proxy/metrics",
        };
        match target {
            Target::Direct => None,
            Target::GoProxy => Some(Service {
                addr: self.go_proxy.addr.clone(),
                pid: self.go_proxy.process.pid(),
                tls: self.client_tls.clone(),
                metrics_path: "/proxy/metrics",
            }),
            Target::RustProxy => Some(this(&self.rust_proxy)),
            Target::RustProxyNoCache => self.rust_proxy_nocache.as_ref().map(this),
            Target::BaselineProxy => self.baseline_proxy.as_ref().map(this),
        }
    }
}
