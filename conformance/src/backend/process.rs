//! etcd as a child process on free loopback ports, with a data directory on tmpfs when there is one.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::{Child, Command};

use super::Version;
use loopback::free_port;

/// A running etcd process. Dropping it kills the process (by its own handle) and removes its directory.
pub struct EtcdProcess {
    client_port: u16,
    log: PathBuf,
    _child: Child,
    _dir: tempfile::TempDir,
}

/// A temporary directory, on tmpfs when possible so that etcd's fsyncs are cheap.
pub fn temp_dir(prefix: &str) -> Result<tempfile::TempDir, String> {
    let mut builder = tempfile::Builder::new();
    builder.prefix(prefix);
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = builder.tempdir_in(shm)
    {
        return Ok(dir);
    }
    builder.tempdir().map_err(|e| format!("temp dir: {e}"))
}

impl EtcdProcess {
    pub async fn start(version: &Version) -> Result<Self, String> {
        Self::start_with(version, &[]).await
    }

    /// Like [`EtcdProcess::start`], with `extra` flags appended (e.g. `--max-request-bytes=4096`).
    pub async fn start_with(version: &Version, extra: &[String]) -> Result<Self, String> {
        let dir = temp_dir("etcd-conformance-")?;
        let (client_port, peer_port) = (free_port(), free_port());
        let log = dir.path().join("etcd.log");
        let log_file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| format!("etcd log: {e}"))?;
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let child = Command::new(&version.etcd)
            .arg("--name=conformance")
            .arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=conformance={peer}"))
            .arg("--initial-cluster-state=new")
            .arg(format!("--initial-cluster-token=conformance-{client_port}"))
            .arg("--logger=zap")
            .arg("--log-outputs=stderr")
            .args(extra)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().map_err(|e| e.to_string())?)
            .stderr(log_file)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawn {}: {e}", version.etcd.display()))?;
        Ok(Self {
            client_port,
            log,
            _child: child,
            _dir: dir,
        })
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}
