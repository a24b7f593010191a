//! The proxy binary users run (`etcd-grpc-proxy start ...`) as a child process on a free loopback port.
//!
//! [`binary`] builds the release binary once per test process (cargo confirms it is up to date, so a test never
//! runs a stale proxy) unless `ETCD_GRPC_PROXY_BIN` names one; a test binary of the `proxy` package may pass its
//! own `CARGO_BIN_EXE_etcd-grpc-proxy` to [`ProxyProcess::start`] instead.
//!
//! A proxy started with TLS towards its clients ([`ProxyProcess::start_tls`]) is checked for readiness, and asked
//! for `/health` and `/metrics`, over TLS with the client certificate it was started with.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::pki::TlsPaths;
use crate::process::{Process, Readiness};
use crate::proxy_image::ImageRun;
use crate::{dirs, free_port, http};

/// How long the proxy may take to answer `GET /health` with 200 after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The release build of `etcd-grpc-proxy`, built (or confirmed up to date) by cargo on first use; or the binary
/// `ETCD_GRPC_PROXY_BIN` names.
pub fn binary() -> Result<PathBuf, String> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY.get_or_init(build_release).clone()
}

fn build_release() -> Result<PathBuf, String> {
    if let Ok(bin) = std::env::var("ETCD_GRPC_PROXY_BIN") {
        let bin = PathBuf::from(bin);
        return if bin.is_file() {
            Ok(bin)
        } else {
            Err(format!(
                "ETCD_GRPC_PROXY_BIN={} is not a file",
                bin.display()
            ))
        };
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("the testkit crate has no parent directory")?
        .to_path_buf();
    let target =
        std::env::var("CARGO_TARGET_DIR").map_or_else(|_| root.join("target"), PathBuf::from);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .current_dir(&root)
        .args([
            "build",
            "--release",
            "--locked",
            "--quiet",
            "-p",
            "proxy",
            "--bin",
            "etcd-grpc-proxy",
        ])
        .status()
        .map_err(|e| format!("run {cargo} build for the proxy: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build --release -p proxy failed: {status}"));
    }
    let bin = target.join("release").join("etcd-grpc-proxy");
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("{} was not built", bin.display()))
    }
}

/// A running proxy: a child process of the binary, or a container of the image ([`ProxyProcess::start_image`]).
/// Dropping it kills the process (or removes the container); during a panic the tail of its log is printed first.
pub struct ProxyProcess {
    addr: String,
    tls: Option<TlsPaths>,
    runner: Runner,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// What runs the proxy.
enum Runner {
    Process(Process),
    Container(Box<ImageRun>),
}

impl ProxyProcess {
    /// Starts `BIN start --endpoints=E1,E2.. --listen-addr=127.0.0.1:PORT FLAGS..` and waits (with a deadline)
    /// until `GET /health` answers 200.
    pub async fn start<S: AsRef<std::ffi::OsStr>>(
        bin: &Path,
        endpoints: &[String],
        flags: &[S],
    ) -> Result<Self, String> {
        Self::start_with_env(bin, endpoints, flags, &[]).await
    }

    /// Like [`ProxyProcess::start`], with environment variables set for it (e.g. `RUST_LOG`).
    pub async fn start_with_env<S: AsRef<std::ffi::OsStr>>(
        bin: &Path,
        endpoints: &[String],
        flags: &[S],
        env: &[(&str, &str)],
    ) -> Result<Self, String> {
        Self::start_with(bin, endpoints, flags, env, None).await
    }

    /// Like [`ProxyProcess::start_with_env`] for a proxy that serves TLS (`flags` carry its `--cert-file`,
    /// `--key-file`, `--trusted-ca-file`): readiness is checked over TLS, trusting `client.ca` and presenting
    /// `client.cert`, which [`ProxyProcess::health`] and [`ProxyProcess::metrics`] present too.
    pub async fn start_tls<S: AsRef<std::ffi::OsStr>>(
        bin: &Path,
        endpoints: &[String],
        flags: &[S],
        env: &[(&str, &str)],
        client: &TlsPaths,
    ) -> Result<Self, String> {
        Self::start_with(bin, endpoints, flags, env, Some(client.clone())).await
    }

    /// [`ProxyProcess::start_with_env`] (`tls` is `None`) or [`ProxyProcess::start_tls`].
    pub async fn start_with<S: AsRef<std::ffi::OsStr>>(
        bin: &Path,
        endpoints: &[String],
        flags: &[S],
        env: &[(&str, &str)],
        tls: Option<TlsPaths>,
    ) -> Result<Self, String> {
        let addr = format!("127.0.0.1:{}", free_port());
        let dir = dirs::temp_dir("etcd-grpc-proxy-").map_err(|e| format!("temp dir: {e}"))?;
        let log = dir.path().join("proxy.log");
        let mut cmd = Command::new(bin);
        cmd.arg("start")
            .args(base_flags(endpoints, &addr))
            .args(flags.iter().map(AsRef::as_ref))
            .envs(env.iter().copied());
        let process = Process::spawn("etcd-grpc-proxy", cmd, &log)?;
        Self::ready(addr, tls, Runner::Process(process), log, dir).await
    }

    /// Like [`ProxyProcess::start_with`], the proxy run from its container image ([`crate::proxy_image::image`] of
    /// the release [`binary`]) on the host's network instead of as a child process; the files its flags name are
    /// mounted into it.
    pub async fn start_image(
        endpoints: &[String],
        flags: &[String],
        tls: Option<TlsPaths>,
    ) -> Result<Self, String> {
        let image = crate::proxy_image::image(&binary()?)?;
        let addr = format!("127.0.0.1:{}", free_port());
        let dir = dirs::temp_dir("etcd-grpc-proxy-").map_err(|e| format!("temp dir: {e}"))?;
        let log = dir.path().join("proxy.log");
        let mut args: Vec<String> = base_flags(endpoints, &addr).into();
        args.extend(flags.iter().cloned());
        let run = ImageRun::start(&image, &args, &log).await?;
        Self::ready(addr, tls, Runner::Container(Box::new(run)), log, dir).await
    }

    /// Waits (with a deadline) until the proxy `runner` runs answers `GET /health` with 200.
    async fn ready(
        addr: String,
        tls: Option<TlsPaths>,
        mut runner: Runner,
        log: PathBuf,
        dir: tempfile::TempDir,
    ) -> Result<Self, String> {
        let readiness = Readiness {
            name: "etcd-grpc-proxy",
            addr: &addr,
            path: "/health",
            tls: tls.as_ref(),
            timeout: READY_TIMEOUT,
            log: &log,
        };
        readiness
            .wait(|code, _| code == 200, || runner.exited())
            .await?;
        Ok(Self {
            addr,
            tls,
            runner,
            log,
            _dir: dir,
        })
    }

    /// `127.0.0.1:PORT` it listens on (gRPC and HTTP).
    pub fn addr(&self) -> String {
        self.addr.clone()
    }

    /// Its endpoint as clients are given it: `127.0.0.1:PORT`, or `https://127.0.0.1:PORT` with TLS.
    pub fn endpoint(&self) -> String {
        match self.tls {
            None => self.addr(),
            Some(_) => format!("https://{}", self.addr),
        }
    }

    /// The client certificate (and CA) it was started with ([`ProxyProcess::start_tls`]), if it serves TLS.
    pub fn client_tls(&self) -> Option<&TlsPaths> {
        self.tls.as_ref()
    }

    pub fn pid(&self) -> u32 {
        match &self.runner {
            Runner::Process(p) => p.pid(),
            Runner::Container(c) => c.pid(),
        }
    }

    /// Asks it to shut down gracefully (SIGTERM).
    pub fn terminate(&self) {
        match &self.runner {
            Runner::Process(p) => p.terminate(),
            Runner::Container(c) => c.terminate(),
        }
    }

    /// `GET /proxy/metrics`: the proxy's own metrics in Prometheus text; panics unless it answers 200.
    pub async fn metrics(&self) -> String {
        match http::get_with(&self.addr, "/proxy/metrics", self.tls.as_ref()).await {
            Ok((200, body)) => body,
            other => panic!("GET /proxy/metrics on the proxy: {other:?}"),
        }
    }

    /// `GET /health`: status code and body.
    pub async fn health(&self) -> Result<(u16, String), String> {
        http::get_with(&self.addr, "/health", self.tls.as_ref()).await
    }

    /// The last `n` lines the proxy printed.
    pub fn log_tail(&self, n: usize) -> String {
        dirs::tail(&self.log, n)
    }

    /// Whether the proxy is still running.
    pub fn is_running(&mut self) -> bool {
        self.runner.exited().is_none()
    }
}

impl Runner {
    /// How the proxy ended, if it has.
    fn exited(&mut self) -> Option<String> {
        match self {
            Runner::Process(p) => p.exit_status().map(|s| s.to_string()),
            Runner::Container(c) => c.exited(),
        }
    }
}

/// The flags every proxy of the kit gets first: its upstream and its own address.
fn base_flags(endpoints: &[String], addr: &str) -> [String; 2] {
    [
        format!("--endpoints={}", endpoints.join(",")),
        format!("--listen-addr={addr}"),
    ]
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- proxy ({}) output ---\n{}",
                self.addr,
                self.log_tail(60)
            );
        }
    }
}
