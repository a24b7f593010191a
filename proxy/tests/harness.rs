//! Checks of the test harness itself (no etcd, no proxy): the output normaliser keeps what
//! must match and redacts only what differs by nature, placeholders resolve back to each
//! target's own IDs, the line diff is readable, and the tiny HTTP client parses responses.
//! (The whole comparison is checked end to end by running the passthrough suites with
//! `PROXY_TESTS_SELF_CHECK=1`, where both sides are direct etcds.)

mod support;

use support::Normalizer;
use support::compare::line_diff;
use support::metrics;

#[test]
fn normaliser_maps_ids_to_stable_placeholders_and_resolves_them_back() {
    let mut a = Normalizer::new();
    let mut b = Normalizer::new();
    let out_a = a.stdout("lease 694d7f3a2b1c0e05 granted with TTL(60s)\n");
    let out_b = b.stdout("lease 32bfa2383e42190c granted with TTL(60s)\n");
    assert_eq!(out_a, "lease <ID1> granted with TTL(60s)\n");
    assert_eq!(out_a, out_b);
    // The same ID in decimal JSON gets the same placeholder; 0 (no lease) stays 0.
    let id = u64::from_str_radix("694d7f3a2b1c0e05", 16).unwrap();
    assert_eq!(
        a.stdout(&format!(
            r#"{{"kvs":[{{"key":"YQ==","lease":{id}}},{{"lease":0}}]}}"#
        )),
        r#"{"kvs":[{"key":"YQ==","lease":<ID1>},{"lease":0}]}"#
    );
    assert_eq!(a.resolve("--lease=<ID1>"), "--lease=694d7f3a2b1c0e05");
    assert_eq!(b.resolve("<ID1>"), "32bfa2383e42190c");
}

#[test]
fn normaliser_keeps_revisions_and_redacts_what_differs_by_nature() {
    let mut n = Normalizer::new();
    let json = r#"{"header":{"cluster_id":10209395086029371855,"member_id":13510015062231200447,"revision":3,"raft_term":2},"kvs":[{"key":"Zm9v","create_revision":2,"mod_revision":2,"version":1,"value":"YmFy"}],"count":1}"#;
    assert_eq!(
        n.stdout(json),
        r#"{"header":{"cluster_id":<ID1>,"member_id":<ID2>,"revision":3,"raft_term":<N>},"kvs":[{"key":"Zm9v","create_revision":2,"mod_revision":2,"version":1,"value":"YmFy"}],"count":1}"#
    );
    // The member ID of the JSON header above, now in hex: the same placeholder.
    assert_eq!(
        n.stdout("127.0.0.1:23791, bb7d371eb677b2bf, 3.4.23, 37 kB, true, false, 2, 9, 9, \n"),
        "127.0.0.1:<PORT>, <ID2>, 3.4.23, <SIZE>, true, false, <TERM>, <INDEX>, <INDEX>, \n"
    );
    assert_eq!(
        n.stdout("127.0.0.1:2379 is healthy: successfully committed proposal: took = 2.58ms\n"),
        "127.0.0.1:<PORT> is healthy: successfully committed proposal: took = <DURATION>\n"
    );
    assert_eq!(
        n.stdout("ea475ec8, 5, 11, 20 kB\n"),
        "<HASH>, 5, 11, <SIZE>\n"
    );
    assert_eq!(
        n.stdout(
            "lease 694d7f3a2b1c0e05 granted with TTL(600s), remaining(598s), attached keys([b a])\n"
        ),
        "lease <ID3> granted with TTL(600s), remaining(<N>s), attached keys([a b])\n"
    );
    assert_eq!(n.stdout("compacted revision 7\n"), "compacted revision 7\n");
}

#[test]
fn normaliser_drops_client_log_lines_but_keeps_errors() {
    let mut n = Normalizer::new();
    let stderr = concat!(
        r#"{"level":"warn","ts":"2026-12-02T19:32:16.140Z","caller":"clientv3/retry_interceptor.go:62","msg":"retrying of unary invoker failed","target":"endpoint://client-b6b4/127.0.0.1:23791","attempt":0,"error":"rpc error: code = OutOfRange desc = etcdserver: mvcc: required revision has been compacted"}"#,
        "\nError: etcdserver: mvcc: required revision has been compacted\n"
    );
    assert_eq!(
        n.stderr(stderr),
        "Error: etcdserver: mvcc: required revision has been compacted\n"
    );
}

#[test]
fn line_diff_marks_removed_and_added_lines() {
    assert_eq!(
        line_diff("a\nb\nc", "a\nx\nc"),
        "    a\n  + x\n  - b\n    c"
    );
    assert_eq!(line_diff("", ""), "    <empty>");
}

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
