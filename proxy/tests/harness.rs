//! Checks of the proxy tests' own helpers (no etcd, no proxy):
//! metrics samples are found by name and labels. (The normaliser's rules and the line diff are checked in
//! `testkit`; the whole comparison end to end by running the passthrough suites with
//! `PROXY_TESTS_SELF_CHECK=1`, where both sides are direct etcds.)

mod support;

use support::metrics;

#[test]
fn metrics_samples_are_found_by_name_and_labels() {
    let text = "# HELP x\n# TYPE x counter\n\
        etcd_grpc_proxy_upstream_active{endpoint=\"127.0.0.1:1\"} 0\n\
        etcd_grpc_proxy_upstream_active{endpoint=\"127.0.0.1:2\"} 1\n\
        etcd_grpc_proxy_upstream_up{endpoint=\"127.0.0.1:1\"} 0\n\
        etcd_grpc_proxy_upstream_failovers_total 2\n\
        grpc_server_handled_total{grpc_code=\"OK\",grpc_method=\"Range\",grpc_service=\"etcdserverpb.KV\",grpc_type=\"unary\"} 5\n";
    assert_eq!(
        metrics::active_endpoint(text).as_deref(),
        Some("127.0.0.1:2")
    );
    assert_eq!(metrics::upstream_up(text, "127.0.0.1:1"), Some(false));
    assert_eq!(metrics::upstream_up(text, "127.0.0.1:3"), None);
    assert_eq!(metrics::failovers(text), 2.0);
    let labels = [
        ("grpc_type", "unary"),
        ("grpc_service", "etcdserverpb.KV"),
        ("grpc_method", "Range"),
        ("grpc_code", "OK"),
    ];
    assert_eq!(
        metrics::value(text, "grpc_server_handled_total", &labels),
        Some(5.0)
    );
    assert_eq!(
        metrics::value(text, "grpc_server_handled_total", &labels[..3]),
        None
    );
}
