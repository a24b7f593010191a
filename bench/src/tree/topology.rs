//! A tree of proxies in front of one etcd: one mid proxy whose `--endpoints` is etcd, and leaves whose
//! `--endpoints` is the mid proxy, every process on free loopback ports. "this" tree is all `etcd-grpc-proxy start`
//! (default flags, `RUST_LOG=warn`), "go" tree all `etcd grpc-proxy start` of the etcd binary under test (default
//! flags; its own address as `--advertise-client-url`, see [`GoProxy`]).
//!
//! Every process is the test kit's, killed when dropped; the leaves are dropped first, then the mid proxy, then the
//! directory holding the Go proxies' data and logs.

use std::path::{Path, PathBuf};

use testkit::ProxyProcess;

use super::TreeTarget;
use crate::services::GoProxy;

/// One proxy of a tree.
pub enum Node {
    This(ProxyProcess),
    /// With the path of its log.
    Go(GoProxy, PathBuf),
}

impl Node {
    /// Starts one proxy of `target`'s kind in front of `upstream`; a Go proxy keeps its data and log in `dir`.
    async fn start(target: &Target<'_>, upstream: &str, dir: &Path) -> Result<Self, String> {
        match target {
            Target::This { proxy_bin } => {
                let upstream = [upstream.to_string()];
                let no_flags: [&str; 0] = [];
                // Warnings only, as the side-by-side benchmark runs it.
                ProxyProcess::start_with_env(
                    proxy_bin,
                    &upstream,
                    &no_flags,
                    &[("RUST_LOG", "warn")],
                )
                .await
                .map(Node::This)
            }
            Target::Go { etcd_bin } => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| format!("create {}: {e}", dir.display()))?;
                let proxy = GoProxy::start(etcd_bin, upstream, dir, &[], None).await?;
                Ok(Node::Go(proxy, dir.join("go-proxy.log")))
            }
        }
    }

    /// `127.0.0.1:PORT` its clients use.
    pub fn addr(&self) -> String {
        match self {
            Node::This(proxy) => proxy.addr(),
            Node::Go(proxy, _) => proxy.addr().to_string(),
        }
    }

    pub fn pid(&self) -> u32 {
        match self {
            Node::This(proxy) => proxy.pid(),
            Node::Go(proxy, _) => proxy.pid(),
        }
    }

    /// The last `n` lines it printed.
    pub fn log_tail(&self, n: usize) -> String {
        match self {
            Node::This(proxy) => proxy.log_tail(n),
            Node::Go(_, log) => testkit::dirs::tail(log, n),
        }
    }
}

/// What a tree is made of: this proxy's binary, or the etcd binary whose `grpc-proxy start` is the Go proxy.
pub enum Target<'a> {
    This { proxy_bin: &'a Path },
    Go { etcd_bin: &'a Path },
}

impl Target<'_> {
    pub fn kind(&self) -> TreeTarget {
        match self {
            Target::This { .. } => TreeTarget::This,
            Target::Go { .. } => TreeTarget::Go,
        }
    }
}

/// A running tree. Fields drop in order: leaves, mid proxy, then the directory.
pub struct Tree {
    leaves: Vec<Node>,
    mid: Node,
    _dir: tempfile::TempDir,
}

impl Tree {
    /// Starts the mid proxy in front of `etcd` (an endpoint), waits until it is healthy, then starts `leaves` leaves
    /// in front of it at once and waits until each is healthy (each start has the kit's deadline).
    pub async fn start(target: &Target<'_>, etcd: &str, leaves: usize) -> Result<Self, String> {
        let dir = testkit::dirs::temp_dir("bench-tree-").map_err(|e| format!("temp dir: {e}"))?;
        let mid = Node::start(target, etcd, &dir.path().join("mid"))
            .await
            .map_err(|e| format!("the mid proxy did not start: {e}"))?;
        let upstream = mid.addr();
        let starts = (0..leaves).map(|i| {
            let leaf_dir = dir.path().join(format!("leaf-{i}"));
            let upstream = upstream.clone();
            async move {
                Node::start(target, &upstream, &leaf_dir)
                    .await
                    .map_err(|e| format!("leaf {i} did not start: {e}"))
            }
        });
        let leaves = futures::future::try_join_all(starts).await?;
        Ok(Self {
            leaves,
            mid,
            _dir: dir,
        })
    }

    pub fn mid(&self) -> &Node {
        &self.mid
    }

    pub fn leaves(&self) -> &[Node] {
        &self.leaves
    }

    /// Every proxy that does not answer `GET /health` with 200 now, with the reason and the end of its log.
    pub async fn unhealthy(&self) -> Vec<String> {
        let mut unhealthy = Vec::new();
        let nodes = std::iter::once(("mid proxy".to_string(), &self.mid)).chain(
            self.leaves
                .iter()
                .enumerate()
                .map(|(i, leaf)| (format!("leaf {i}"), leaf)),
        );
        for (name, node) in nodes {
            let answer = match testkit::http::get(&node.addr(), "/health").await {
                Ok((200, _)) => continue,
                Ok((code, body)) => format!("HTTP {code}: {}", body.trim()),
                Err(e) => e,
            };
            unhealthy.push(format!(
                "{name} ({}) is not healthy after the run ({answer}); its log ends:\n{}",
                node.addr(),
                node.log_tail(20)
            ));
        }
        unhealthy
    }
}
