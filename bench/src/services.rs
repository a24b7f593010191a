//! The processes under test, each on free loopback ports: a one-member etcd, etcd's Go proxy in front of it
//! (`etcd grpc-proxy start`, from the same etcd binary) and this proxy in front of it.
//!
//! Each [`Service`] owns its child process and kills it (by its own handle) when dropped, so a failed or
//! interrupted benchmark leaves nothing running; data directories and logs live in a temporary directory that is
//! removed with the [`Stack`].

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::plan::{EtcdBinary, Target};
use loopback::http;
use loopback::try_free_port as free_port;

/// How long a service may take to answer `GET /health` after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(45);
/// Attempts to start a service: a free port can be taken by another process between probe and bind.
const START_ATTEMPTS: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot prepare {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{what} did not become ready: {detail}\n--- last lines of its log ---\n{log}")]
    NotReady {
        what: String,
        detail: String,
        log: String,
    },
}

/// A running child process that serves HTTP `/health` on `addr`.
pub struct Service {
    name: String,
    addr: String,
    child: Child,
    log_path: PathBuf,
}

impl Service {
    /// Spawns `command` (stdout and stderr to `log_path`) and waits, with a deadline, until `GET /health` on
    /// `addr` answers 200.
    async fn spawn(
        name: &str,
        addr: String,
        mut command: Command,
        log_path: PathBuf,
    ) -> Result<Self, StartError> {
        let io = |what: &str| {
            let what = format!("{name} ({what})");
            move |source| StartError::Io { what, source }
        };
        let log = File::create(&log_path).map_err(io("log file"))?;
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(io("log file"))?)
            .stderr(log);
        let child = command.spawn().map_err(io("spawn"))?;
        let mut service = Self {
            name: name.to_string(),
            addr,
            child,
            log_path,
        };
        service.wait_ready().await?;
        Ok(service)
    }

    async fn wait_ready(&mut self) -> Result<(), StartError> {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(self.not_ready(format!("exited with {status}")));
            }
            let last = match http::get(&self.addr, "/health").await {
                Ok((200, _)) => return Ok(()),
                Ok((code, body)) => format!("HTTP {code}: {body}"),
                Err(e) => e,
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(self.not_ready(format!(
                    "no 200 from /health within {READY_TIMEOUT:?}; last: {last}"
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn not_ready(&self, detail: String) -> StartError {
        StartError::NotReady {
            what: format!("{} on {}", self.name, self.addr),
            detail,
            log: tail(&self.log_path, 30),
        }
    }

    /// `127.0.0.1:PORT` its clients (gRPC and HTTP) use.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// One etcd and the two proxies in front of it. Fields drop in order: the proxies before etcd, the directory last.
pub struct Stack {
    pub rust_proxy: Service,
    pub go_proxy: Service,
    pub etcd: Service,
    _dir: tempfile::TempDir,
}

impl Stack {
    /// Starts a fresh etcd from `etcd`, then both proxies in front of it.
    pub async fn start(etcd: &EtcdBinary, proxy_bin: &Path) -> Result<Self, StartError> {
        let dir = temp_dir().map_err(|source| StartError::Io {
            what: "temporary directory".into(),
            source,
        })?;
        let etcd_service = retry(|| start_etcd(&etcd.path, dir.path())).await?;
        let upstream = etcd_service.addr().to_string();
        let go_proxy = retry(|| start_go_proxy(&etcd.path, &upstream, dir.path())).await?;
        let rust_proxy = retry(|| start_rust_proxy(proxy_bin, &upstream, dir.path())).await?;
        Ok(Self {
            rust_proxy,
            go_proxy,
            etcd: etcd_service,
            _dir: dir,
        })
    }

    /// The service a target's clients talk to.
    pub fn entry(&self, target: Target) -> &Service {
        match target {
            Target::Direct => &self.etcd,
            Target::GoProxy => &self.go_proxy,
            Target::RustProxy => &self.rust_proxy,
        }
    }

    /// The proxy process of a target (none for direct).
    pub fn proxy(&self, target: Target) -> Option<&Service> {
        match target {
            Target::Direct => None,
            Target::GoProxy => Some(&self.go_proxy),
            Target::RustProxy => Some(&self.rust_proxy),
        }
    }
}

async fn retry<F, Fut>(mut start: F) -> Result<Service, StartError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Service, StartError>>,
{
    let mut attempt = 1;
    loop {
        match start().await {
            Ok(service) => return Ok(service),
            Err(e) if attempt >= START_ATTEMPTS => return Err(e),
            Err(e) => {
                eprintln!("bench: start attempt {attempt} failed, retrying on new ports: {e}")
            }
        }
        attempt += 1;
    }
}

fn port() -> Result<u16, StartError> {
    free_port().map_err(|source| StartError::Io {
        what: "a free loopback port".into(),
        source,
    })
}

async fn start_etcd(bin: &Path, dir: &Path) -> Result<Service, StartError> {
    let (client, peer) = (port()?, port()?);
    let client_url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let mut cmd = Command::new(bin);
    cmd.arg("--name=bench")
        .arg(format!(
            "--data-dir={}",
            dir.join(format!("etcd-{client}")).display()
        ))
        .arg(format!("--listen-client-urls={client_url}"))
        .arg(format!("--advertise-client-urls={client_url}"))
        .arg(format!("--listen-peer-urls={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster=bench={peer_url}"))
        .arg("--initial-cluster-state=new")
        .arg(format!("--initial-cluster-token=bench-{client}"))
        .arg("--logger=zap")
        .arg("--log-outputs=stderr")
        .arg("--log-level=warn");
    let addr = format!("127.0.0.1:{client}");
    Service::spawn("etcd", addr, cmd, dir.join(format!("etcd-{client}.log"))).await
}

async fn start_go_proxy(
    etcd_bin: &Path,
    upstream: &str,
    dir: &Path,
) -> Result<Service, StartError> {
    let listen = port()?;
    let addr = format!("127.0.0.1:{listen}");
    let mut cmd = Command::new(etcd_bin);
    // --advertise-client-url defaults to 127.0.0.1:23790 and only shapes MemberList answers, which the load
    // does not use; it is left at its default as a user would.
    cmd.args(["grpc-proxy", "start"])
        .arg(format!("--endpoints={upstream}"))
        .arg(format!("--listen-addr={addr}"))
        .arg(format!(
            "--data-dir={}",
            dir.join(format!("go-proxy-{listen}")).display()
        ));
    Service::spawn(
        "etcd's Go grpc-proxy",
        addr,
        cmd,
        dir.join(format!("go-proxy-{listen}.log")),
    )
    .await
}

async fn start_rust_proxy(bin: &Path, upstream: &str, dir: &Path) -> Result<Service, StartError> {
    let listen = port()?;
    let addr = format!("127.0.0.1:{listen}");
    let mut cmd = Command::new(bin);
    cmd.arg("start")
        .arg(format!("--endpoints={upstream}"))
        .arg(format!("--listen-addr={addr}"))
        .env("RUST_LOG", "warn");
    Service::spawn(
        "etcd-grpc-proxy",
        addr,
        cmd,
        dir.join(format!("rust-proxy-{listen}.log")),
    )
    .await
}

/// A temporary directory on tmpfs (`/dev/shm`) when there is one, so etcd's fsyncs do not measure the disk; the
/// same etcd serves all three targets, so this shifts every target alike.
fn temp_dir() -> std::io::Result<tempfile::TempDir> {
    let mut builder = tempfile::Builder::new();
    builder.prefix("etcd-bench-");
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = builder.tempdir_in(shm)
    {
        return Ok(dir);
    }
    builder.tempdir()
}
