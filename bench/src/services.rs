//! The processes under test, each on free loopback ports: a one-member etcd ([`testkit::EtcdCluster`]), etcd's
//! Go proxy in front of it (`etcd grpc-proxy start`, from the same etcd binary: [`GoProxy`], on the kit's
//! [`Process`]) and this proxy in front of it ([`testkit::ProxyProcess`]).
//!
//! Every process is the test kit's: killed by its own PID when dropped, so a failed or interrupted benchmark
//! leaves nothing running, with its data and log in a temporary directory on tmpfs (`/dev/shm`) when there is one,
//! so etcd's fsyncs do not measure the disk (the same etcd serves all three targets, so this shifts every target
//! alike). The Go proxy's data and log go in the etcd's directory, which outlives it.
//!
//! A failed start is not retried on new ports: the kit hands out ports outside the kernel's ephemeral range, so
//! no outgoing connection can take one between its probe and the bind, and the benchmark starts one stack at a
//! time. A start that fails anyway is a real failure, reported with the process's log.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use testkit::process::Process;
use testkit::{EtcdCluster, ProxyProcess};

use crate::plan::{EtcdBinary, Target};

/// How long etcd's Go proxy may take to answer `GET /health` with 200 after it was started.
const GO_PROXY_READY_TIMEOUT: Duration = Duration::from_secs(45);

/// A running target as the runner sees it: where its clients connect and which process to meter.
#[derive(Clone, Debug)]
pub struct Service {
    addr: String,
    pid: u32,
}

impl Service {
    /// `127.0.0.1:PORT` its clients (gRPC and HTTP) use.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }
}

/// etcd's Go gRPC proxy, `etcd grpc-proxy start` of the etcd binary under test.
pub struct GoProxy {
    addr: String,
    process: Process,
}

impl GoProxy {
    /// Starts it in front of `upstream` with its data and log in `dir`, and waits (with a deadline) until
    /// `GET /health` answers 200.
    pub async fn start(
        etcd_bin: &Path,
        upstream: &str,
        dir: &Path,
        flags: &[String],
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
            .wait_http(&addr, "/health", GO_PROXY_READY_TIMEOUT, |code, _| {
                code == 200
            })
            .await?;
        Ok(Self { addr, process })
    }
}

/// One etcd and the two proxies in front of it. Fields drop in order: the proxies before etcd, whose directory
/// (holding the Go proxy's too) goes last.
pub struct Stack {
    rust_proxy: ProxyProcess,
    go_proxy: GoProxy,
    etcd: EtcdCluster,
    etcd_pid: u32,
}

impl Stack {
    /// Starts a fresh etcd from `etcd`, then both proxies in front of it, both with `--namespace` if not empty.
    pub async fn start(
        etcd: &EtcdBinary,
        proxy_bin: &Path,
        namespace: &str,
    ) -> Result<Self, String> {
        let flags: Vec<String> = (!namespace.is_empty())
            .then(|| format!("--namespace={namespace}"))
            .into_iter()
            .collect();
        let binaries = etcd.binaries()?;
        let cluster = EtcdCluster::start(&binaries, 1, &["--log-level=warn"]).await?;
        let upstream = cluster.endpoint(0);
        let etcd_pid = cluster
            .pid(0)
            .ok_or_else(|| format!("etcd {} on {upstream} is not running", etcd.version))?;
        let go_proxy =
            GoProxy::start(&binaries.etcd, &upstream, &cluster.scratch_dir(), &flags).await?;
        let rust_proxy =
            ProxyProcess::start_with_env(proxy_bin, &[upstream], &flags, &[("RUST_LOG", "warn")])
                .await?;
        Ok(Self {
            rust_proxy,
            go_proxy,
            etcd: cluster,
            etcd_pid,
        })
    }

    /// etcd itself.
    pub fn etcd(&self) -> Service {
        Service {
            addr: self.etcd.endpoint(0),
            pid: self.etcd_pid,
        }
    }

    /// The service a target's clients talk to.
    pub fn entry(&self, target: Target) -> Service {
        self.proxy(target).unwrap_or_else(|| self.etcd())
    }

    /// The proxy process of a target (none for direct).
    pub fn proxy(&self, target: Target) -> Option<Service> {
        match target {
            Target::Direct => None,
            Target::GoProxy => Some(Service {
                addr: self.go_proxy.addr.clone(),
                pid: self.go_proxy.process.pid(),
            }),
            Target::RustProxy => Some(Service {
                addr: self.rust_proxy.addr(),
                pid: self.rust_proxy.pid(),
            }),
        }
    }
}
