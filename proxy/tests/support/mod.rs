//! Shared harness for the proxy's integration tests: real etcd clusters, the proxy binary,
//! `etcdctl` (foreground and background), an output normaliser, and a step-by-step
//! comparator that runs the same commands against a direct etcd and against the proxy.
//!
//! Every wait in here polls a condition against a deadline; on timeout it fails with what it
//! last saw. Every process is started by the harness and killed by its own handle on drop, and
//! every temporary directory is removed by a drop guard, so a failing test cleans up too.
//!
//! Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

pub mod cluster;
pub mod compare;
pub mod ctl;
pub mod grpc;
pub mod metrics;
pub mod net;
pub mod normalize;
pub mod pair;
pub mod proxy;

use std::future::Future;
use std::path::Path;
use std::time::Duration;

pub use cluster::EtcdCluster;
pub use normalize::Normalizer;
pub use proxy::Proxy;

/// Where the etcd binaries come from: `/usr/bin` (etcd 3.4 from Debian) unless `PROXY_TEST_ETCD_DIR` names
/// another directory (ci/test.sh runs the version-sensitive tests again with etcd 3.5.1 this way).
fn etcd_dir() -> String {
    std::env::var("PROXY_TEST_ETCD_DIR").unwrap_or_else(|_| "/usr/bin".into())
}

/// The etcd server binary every test runs against.
pub fn etcd_bin() -> String {
    format!("{}/etcd", etcd_dir())
}

/// The etcd command-line client.
pub fn etcdctl_bin() -> String {
    format!("{}/etcdctl", etcd_dir())
}

/// Whether the real etcd binaries are installed. Without them a test must not pass silently:
/// under CI (`CI=true`) this panics; elsewhere it prints how to get them and returns `false`,
/// and the caller returns early (a skip):
/// `if !support::etcd_available() { return; }`.
pub fn etcd_available() -> bool {
    let (etcd, etcdctl) = (etcd_bin(), etcdctl_bin());
    if Path::new(&etcd).exists() && Path::new(&etcdctl).exists() {
        return true;
    }
    let msg = format!("{etcd} or {etcdctl} is missing; install etcd 3.4 with ci/install-deps.sh");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg} (CI=true, so this is a failure, not a skip)");
    }
    eprintln!("SKIPPED: {msg}");
    false
}

/// Polls `check` every 25 ms until it returns `Ok`, and returns that value. After `timeout`
/// it panics with `what` and the last error `check` reported.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    match try_wait_for(timeout, &mut check).await {
        Ok(v) => v,
        Err(last) => panic!("timed out after {timeout:?} waiting for {what}; last seen: {last}"),
    }
}

/// Like [`wait_for`], but returns the last error instead of panicking on timeout.
pub async fn try_wait_for<T, F, Fut>(timeout: Duration, mut check: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let last = match check().await {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if tokio::time::Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The last `n` lines of a file, for failure reports (empty if it cannot be read).
pub fn tail_file(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A temporary directory, preferably on tmpfs (`/dev/shm`) so etcd's fsyncs are cheap; it is
/// removed when dropped.
pub fn temp_dir(prefix: &str) -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let builder = {
        let mut b = tempfile::Builder::new();
        b.prefix(prefix);
        b
    };
    if shm.is_dir()
        && let Ok(dir) = builder.tempdir_in(shm)
    {
        return dir;
    }
    builder.tempdir().expect("create a temporary directory")
}
