//! Two fresh single-member etcd clusters with identical histories ahead of them: one used
//! directly, the other only through the proxy. Running the same operations against both
//! gives the same keys, values and revisions, so results can be compared exactly.
//!
//! With `PROXY_TESTS_SELF_CHECK=1` the second cluster is used directly too (no proxy), which
//! checks the harness and the comparisons themselves: every comparison must then pass.

use testkit::{Binaries, EtcdCluster, ProxyProcess};

use testkit::diff::line_diff;

pub struct Pair {
    /// `127.0.0.1:PORT` of the etcd used directly.
    pub direct: String,
    /// `127.0.0.1:PORT` of the proxy (of the second etcd in self-check mode).
    pub other: String,
    /// "proxy", or "direct-2" in self-check mode.
    pub other_name: &'static str,
    binaries: Binaries,
    // Dropped in this order: the proxy before the clusters.
    proxy: Option<ProxyProcess>,
    clusters: Vec<EtcdCluster>,
}

impl Pair {
    /// Starts both clusters of `binaries`' version (concurrently) and the proxy with `extra_proxy_args`.
    pub async fn start(binaries: &Binaries, extra_proxy_args: &[&str]) -> Self {
        let self_check = std::env::var("PROXY_TESTS_SELF_CHECK").is_ok_and(|v| v == "1");
        let (a, b) = tokio::join!(
            super::cluster(binaries, 1, &[]),
            super::cluster(binaries, 1, &[])
        );
        let (proxy, other, other_name) = if self_check {
            (None, b.endpoint(0), "direct-2")
        } else {
            let proxy = super::proxy::start(&b.endpoints(), extra_proxy_args).await;
            let addr = proxy.addr();
            (Some(proxy), addr, "proxy")
        };
        Self {
            direct: a.endpoint(0),
            other,
            other_name,
            binaries: binaries.clone(),
            proxy,
            clusters: vec![a, b],
        }
    }

    /// The etcd binaries both clusters run.
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// The proxy (None in self-check mode).
    pub fn proxy(&self) -> Option<&ProxyProcess> {
        self.proxy.as_ref()
    }

    /// The cluster used directly (0) or behind the proxy (1).
    pub fn cluster(&self, i: usize) -> &EtcdCluster {
        &self.clusters[i]
    }

    /// Asserts that two transcripts of the same scenario are equal, with a line diff.
    pub fn assert_same(&self, scenario: &str, direct: &[String], other: &[String]) {
        if direct != other {
            panic!(
                "{scenario}: results through {} differ from direct etcd (- direct, + {}):\n{}",
                self.other_name,
                self.other_name,
                line_diff(&direct.join("\n"), &other.join("\n"))
            );
        }
    }
}
