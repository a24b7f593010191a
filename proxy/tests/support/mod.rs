//! What the proxy's integration tests share beyond the workspace's `testkit` (real etcd clusters, `etcdctl`, the
//! normaliser, the proxy as a child process, free ports, waits with deadlines all come from there):
//!
//! - [`etcd`]: the etcd binaries the tests run against, or a skip;
//! - [`cluster`], [`proxy::start`]: a cluster and the proxy cargo built for this package, or a panic with why not;
//! - [`proxy::try_start`]: the proxy binary run with arguments it must refuse;
//! - [`net`]: a port held busy, whether a port accepts connections;
//! - [`compare`], [`pair`]: the same `etcdctl` steps or client calls against a direct etcd and through the proxy;
//! - [`fake_etcd`]: a fake member for what real etcd cannot be made to do on cue;
//! - [`metrics`]: reading the proxy's Prometheus text; [`grpc`]: plain tonic channels and metadata;
//! - [`watch`]: a raw Watch stream driven request by request;
//! - [`collector`]: a loopback OTLP collector that keeps the spans it receives;
//! - [`gateway`]: etcd's JSON gateway by hand (unary calls, streams read line by line).
//!
//! Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

pub mod collector;
pub mod compare;
pub mod fake_etcd;
pub mod gateway;
pub mod grpc;
pub mod metrics;
pub mod net;
pub mod pair;
pub mod proxy;
pub mod watch;

use testkit::{Binaries, EtcdCluster};

/// The etcd binaries of the version these tests run against (`TESTKIT_ETCD_VERSION`, default the newest, 3.7.3), or `None` when
/// they are not installed here (under `CI=true` that panics instead): then the test returns early, a skip.
/// `let Some(etcd) = support::etcd() else { return };`
pub fn etcd() -> Option<Binaries> {
    testkit::Version::from_env().require()
}

/// A cluster of `n` members of `binaries`' version with `extra_args` for each; panics with why it did not start.
pub async fn cluster(binaries: &Binaries, n: usize, extra_args: &[&str]) -> EtcdCluster {
    EtcdCluster::start(binaries, n, extra_args)
        .await
        .unwrap_or_else(|e| panic!("start an etcd {} cluster of {n}: {e}", binaries.version))
}
