//! The proxy binary under test, as a child process on a free loopback port.

use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use super::net::{free_port, http_get};
use super::{tail_file, temp_dir};

/// The binary cargo built for this package.
pub const PROXY_BIN: &str = env!("CARGO_BIN_EXE_etcd-grpc-proxy");

/// How long the proxy may take to answer `GET /health` with 200 after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a run that is expected to fail at startup may take to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// A running proxy. Dropping it kills the process (by its own child handle); during a panic
/// the tail of its log is printed first.
pub struct Proxy {
    addr: String,
    child: Option<Child>,
    log_path: PathBuf,
    _dir: tempfile::TempDir,
}

impl Proxy {
    /// Starts `etcd-grpc-proxy start --endpoints=E1,E2.. --listen-addr=127.0.0.1:PORT EXTRA..`
    /// and waits (with a deadline) until `GET /health` answers 200.
    pub async fn start(endpoints: &[String], extra_args: &[&str]) -> Self {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let dir = temp_dir("etcd-proxy-test-proxy-");
        let log_path = dir.path().join("proxy.log");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("open proxy log");
        let child = Command::new(PROXY_BIN)
            .arg("start")
            .arg(format!("--endpoints={}", endpoints.join(",")))
            .arg(format!("--listen-addr={addr}"))
            .args(extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {PROXY_BIN}: {e}"));
        let mut proxy = Self {
            addr,
            child: Some(child),
            log_path,
            _dir: dir,
        };
        proxy.wait_healthy().await;
        proxy
    }

    async fn wait_healthy(&mut self) {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "the proxy exited with {status} while starting; its output:\n{}",
                    self.log_tail(80)
                );
            }
            let last = match http_get(&self.addr, "/health").await {
                Ok((200, _)) => return,
                Ok((code, body)) => format!("HTTP {code}: {body}"),
                Err(e) => e,
            };
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "the proxy at {} did not answer GET /health with 200 within {READY_TIMEOUT:?}; last seen: {last}; its output:\n{}",
                    self.addr,
                    self.log_tail(80)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `127.0.0.1:PORT` it listens on (gRPC and HTTP).
    pub fn addr(&self) -> String {
        self.addr.clone()
    }

    /// `http://127.0.0.1:PORT`, for gRPC clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `GET /metrics`; panics unless it answers 200.
    pub async fn metrics(&self) -> String {
        match http_get(&self.addr, "/metrics").await {
            Ok((200, body)) => body,
            other => panic!("GET /metrics on the proxy: {other:?}"),
        }
    }

    /// `GET /health`: status code and body.
    pub async fn health(&self) -> Result<(u16, String), String> {
        http_get(&self.addr, "/health").await
    }

    /// The last `n` lines the proxy printed.
    pub fn log_tail(&self, n: usize) -> String {
        tail_file(&self.log_path, n)
    }

    /// Whether the proxy process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- proxy ({}) output ---\n{}",
                self.addr,
                self.log_tail(60)
            );
        }
    }
}

/// How a run of the binary that was expected to fail at startup ended.
#[derive(Debug)]
pub struct Exited {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the proxy binary with exactly `args` and waits (with a deadline) for it to exit.
/// Panics, after killing it, if it is still running at the deadline: a startup error must
/// end the process.
pub async fn try_start(args: &[&str]) -> Exited {
    let child = tokio::process::Command::new(PROXY_BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {PROXY_BIN}: {e}"));
    match tokio::time::timeout(EXIT_TIMEOUT, child.wait_with_output()).await {
        Ok(Ok(out)) => Exited {
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Ok(Err(e)) => panic!("waiting for {PROXY_BIN} {args:?}: {e}"),
        // The dropped future dropped the child, which kill_on_drop killed.
        Err(_) => panic!(
            "`etcd-grpc-proxy {}` was still running after {EXIT_TIMEOUT:?}; expected it to exit with an error",
            args.join(" ")
        ),
    }
}
