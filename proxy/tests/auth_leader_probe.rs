//! With auth on, etcd 3.5.30 (and later) answers Status only to the root role, so the proxy asks a member whether
//! it has a leader with a tokenless, linearizable `count_only` Range that requires one (`hasleader`): a member
//! without a leader refuses it at once with "no leader" (the simulation checks that case: `sim/tests/
//! auth_isolation.rs`), and a member with one gets as far as the auth check. This test holds real etcd to that
//! premise, and, where etcd refuses a tokenless Status (3.5.30 on), the proxy to probing and to treating such
//! members as healthy: twelve probes answered, and no failover in front of a healthy cluster.

mod support;

use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::maintenance_client::MaintenanceClient;
use proto::etcdserverpb::{RangeRequest, StatusRequest};
use support::grpc::{channel, with_meta};

/// How many of the proxy's leader probes the test waits for.
const PROBES: f64 = 12.0;

/// Range calls the members refused with InvalidArgument ("user name is empty"), by their own /metrics: the proxy's
/// tokenless leader probes (this test makes one more itself, before the proxy starts).
async fn refused_probes(etcd: &testkit::EtcdCluster) -> f64 {
    let mut refused = 0.0;
    for member in 0..3 {
        let (_, body) = testkit::http::get(&etcd.endpoint(member), "/metrics")
            .await
            .expect("etcd /metrics");
        refused += support::metrics::value(
            &body,
            "grpc_server_handled_total",
            &[
                ("grpc_code", "InvalidArgument"),
                ("grpc_method", "Range"),
                ("grpc_service", "etcdserverpb.KV"),
                ("grpc_type", "unary"),
            ],
        )
        .unwrap_or(0.0);
    }
    refused
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_auth_a_healthy_cluster_is_seen_healthy_without_status() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 3, &[]).await;
    for args in [&["user", "add", "root:rootpw"][..], &["auth", "enable"]] {
        etcd.etcdctl(0).ok(args).await;
    }
    let member = channel(&etcd.endpoint(0)).await;

    // The probe's premise: a member with a leader refuses the tokenless probe for want of a user, not a leader.
    let probe = RangeRequest {
        key: vec![0],
        count_only: true,
        limit: 1,
        ..Default::default()
    };
    let answer = KvClient::new(member.clone())
        .range(with_meta(probe, "hasleader", "true"))
        .await
        .expect_err("auth is on: a tokenless read is refused");
    assert_eq!(
        (answer.code(), answer.message()),
        (
            tonic::Code::InvalidArgument,
            "etcdserver: user name is empty"
        )
    );
    // etcd before 3.5.30 answers a tokenless Status, and the proxy never probes; 3.5.30 refuses it.
    let status = MaintenanceClient::new(member)
        .status(StatusRequest {})
        .await;
    match &status {
        Ok(_) => return,
        Err(refused) => assert_eq!(refused.message(), "etcdserver: user name is empty"),
    }

    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    // Twelve probes answered (a heartbeat every 250 ms; etcd counts each refused probe), then not one failover.
    let before = refused_probes(&etcd).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while refused_probes(&etcd).await < before + PROBES {
        assert!(
            tokio::time::Instant::now() < deadline,
            "etcd saw fewer than {PROBES} leader probes in 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = proxy.metrics().await;
    let failovers =
        support::metrics::value(&metrics, "etcd_grpc_proxy_upstream_failovers_total", &[]);
    assert_eq!(failovers, Some(0.0), "the proxy left a healthy member");
}
