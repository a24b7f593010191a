//! Real etcd clusters of `n` members on loopback, each member a child process of the test.

use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::net::{free_port, http_get};
use super::{etcd_bin, tail_file, temp_dir};

/// How long a member may take to report healthy after it was (re)started.
const READY_TIMEOUT: Duration = Duration::from_secs(45);

static CLUSTER_SEQ: AtomicUsize = AtomicUsize::new(0);

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
}

/// A running etcd cluster. Dropping it kills every member (by its own child handle) and
/// removes the data directories; when the drop happens during a panic, the tail of every
/// member's log is printed first.
pub struct EtcdCluster {
    members: Vec<Member>,
    token: String,
    initial_cluster: String,
    extra_args: Vec<String>,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `n` members and waits (with a deadline) until every one reports healthy.
    pub async fn start(n: usize) -> Self {
        Self::start_with_args(n, &[]).await
    }

    /// Like [`EtcdCluster::start`], with extra flags for every member (e.g. `--auth-token-ttl=2`).
    pub async fn start_with_args(n: usize, extra_args: &[&str]) -> Self {
        assert!(n >= 1, "a cluster needs at least one member");
        let seq = CLUSTER_SEQ.fetch_add(1, Ordering::SeqCst);
        let dir = temp_dir("etcd-proxy-test-cluster-");
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                data_dir: dir.path().join(format!("m{i}.etcd")),
                log_path: dir.path().join(format!("m{i}.log")),
                child: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!(
            "proxy-test-{}-{seq}-{}",
            std::process::id(),
            members[0].peer_port
        );
        let mut cluster = Self {
            members,
            token,
            initial_cluster,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            dir,
        };
        for i in 0..n {
            cluster.spawn(i);
        }
        for i in 0..n {
            cluster.wait_healthy(i).await;
        }
        cluster
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// `127.0.0.1:PORT` of member `i`'s client listener.
    pub fn endpoint(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.members[i].client_port)
    }

    /// The client endpoints of all members, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// The client endpoints joined with commas, as `--endpoints=` takes them.
    pub fn endpoints_arg(&self) -> String {
        self.endpoints().join(",")
    }

    /// A directory that lives as long as the cluster, for test files such as snapshots.
    pub fn scratch_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    fn spawn(&mut self, i: usize) {
        let m = &self.members[i];
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log_path)
            .expect("open member log");
        let client_url = format!("http://127.0.0.1:{}", m.client_port);
        let peer_url = format!("http://127.0.0.1:{}", m.peer_port);
        let child = Command::new(etcd_bin())
            .arg(format!("--name={}", m.name))
            .arg(format!("--data-dir={}", m.data_dir.display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster={}", self.initial_cluster))
            .arg("--initial-cluster-state=new")
            .arg(format!("--initial-cluster-token={}", self.token))
            .arg("--logger=zap")
            .arg("--log-outputs=stderr")
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", etcd_bin()));
        self.members[i].child = Some(child);
    }

    /// Waits (with a deadline) until member `i` answers `GET /health` with `"health":"true"`.
    /// Fails early, with the member's log, if the process exits.
    pub async fn wait_healthy(&mut self, i: usize) {
        let endpoint = self.endpoint(i);
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(child) = self.members[i].child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "etcd member {i} ({endpoint}) exited with {status} while starting; log:\n{}",
                    self.log_tail(i, 80)
                );
            }
            let last = match http_get(&endpoint, "/health").await {
                Ok((200, body)) if body.contains("\"health\":\"true\"") => return,
                Ok((code, body)) => format!("HTTP {code}: {body}"),
                Err(e) => e,
            };
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "etcd member {i} ({endpoint}) not healthy within {READY_TIMEOUT:?}; last seen: {last}; log:\n{}",
                    self.log_tail(i, 80)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILLs member `i` (by its own child handle) and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on the same data directory and ports, and waits until healthy.
    pub async fn restart(&mut self, i: usize) {
        assert!(
            self.members[i].child.is_none(),
            "restart({i}) of a member that is still running"
        );
        self.spawn(i);
        self.wait_healthy(i).await;
    }

    /// The last `n` lines of member `i`'s log.
    pub fn log_tail(&self, i: usize, n: usize) -> String {
        tail_file(&self.members[i].log_path, n)
    }

    /// The tails of every member's log, labelled.
    pub fn logs(&self, n: usize) -> String {
        (0..self.members.len())
            .map(|i| {
                format!(
                    "--- etcd member {i} ({}) log ---\n{}",
                    self.endpoint(i),
                    self.log_tail(i, n)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs(40));
        }
        // `dir` (the data directories and logs) is removed when the TempDir field drops.
    }
}
