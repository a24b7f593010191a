//! The load that reached etcd, read from etcd's own Prometheus `/metrics`: gRPC requests and stream messages by
//! method (counters, compared before and after a run) and open watchers and watch streams (gauges, read while the
//! load is running). This is where a proxy's saving shows: the same client load, less work for etcd.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One reading of etcd's `/metrics`, reduced to what the benchmark compares.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EtcdCounters {
    /// `grpc_server_handled_total` summed over codes, by method, for etcd's own services (not grpc.health).
    pub handled: BTreeMap<String, f64>,
    /// `grpc_server_started_total` by method (streams opened, for streaming methods).
    pub started: BTreeMap<String, f64>,
    /// `grpc_server_msg_received_total` by method (messages on streams: keep-alives, watch requests).
    pub msgs_received: BTreeMap<String, f64>,
    /// `etcd_debugging_mvcc_watcher_total`: watchers registered in etcd now.
    pub watchers: f64,
    /// `etcd_debugging_mvcc_watch_stream_total`: watch streams open on etcd now.
    pub watch_streams: f64,
}

/// Parses the Prometheus text format as etcd writes it (one sample per line, no timestamps).
pub fn parse(text: &str) -> EtcdCounters {
    let mut out = EtcdCounters::default();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, labels.trim_end_matches('}')),
            None => (series, ""),
        };
        let label = |key: &str| label_value(labels, key);
        let etcd_service = label("grpc_service").is_some_and(|s| s.starts_with("etcdserverpb."));
        let method = label("grpc_method").unwrap_or_default().to_string();
        match name {
            "grpc_server_handled_total" if etcd_service => {
                *out.handled.entry(method).or_default() += value
            }
            "grpc_server_started_total" if etcd_service => {
                *out.started.entry(method).or_default() += value
            }
            "grpc_server_msg_received_total" if etcd_service => {
                *out.msgs_received.entry(method).or_default() += value
            }
            "etcd_debugging_mvcc_watcher_total" => out.watchers = value,
            "etcd_debugging_mvcc_watch_stream_total" => out.watch_streams = value,
            _ => {}
        }
    }
    out
}

/// The value of `key` in a label set such as `a="x",b="y"` (etcd's label values hold no commas or quotes).
fn label_value<'a>(labels: &'a str, key: &str) -> Option<&'a str> {
    labels.split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"'))
    })
}

/// What one run cost etcd.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UpstreamLoad {
    /// Unary requests completed by etcd during the run, by method (Range, Put, Txn, LeaseGrant, ...).
    pub requests: BTreeMap<String, u64>,
    /// Streams opened on etcd for the run (from before its setup to its end), by method (Watch, LeaseKeepAlive).
    pub streams_started: BTreeMap<String, u64>,
    /// Stream messages etcd received during the run, by method (LeaseKeepAlive: keep-alive requests).
    pub stream_msgs: BTreeMap<String, u64>,
    /// Watchers registered in etcd while the load ran, beyond those registered before the run.
    pub watchers: u64,
    /// Watch streams open on etcd while the load ran, beyond those open before the run.
    pub watch_streams: u64,
    /// Streams open on etcd while the load ran (started less handled), beyond those open before the run, by
    /// streaming method.
    #[serde(default)]
    pub streams_open: BTreeMap<String, u64>,
}

impl UpstreamLoad {
    /// Requests and stream messages: counter deltas over the measured window (`start` to `end`). Streams opened:
    /// from `baseline` (read before the run's setup, which opens them) to `end`. Gauges: `during` (read with the
    /// load in place) less `baseline`.
    pub fn between(
        baseline: &EtcdCounters,
        start: &EtcdCounters,
        during: &EtcdCounters,
        end: &EtcdCounters,
    ) -> Self {
        let delta =
            |b: &BTreeMap<String, f64>, a: &BTreeMap<String, f64>| -> BTreeMap<String, u64> {
                a.iter()
                    .map(|(method, after)| {
                        let before = b.get(method).copied().unwrap_or(0.0);
                        (method.clone(), (after - before).max(0.0).round() as u64)
                    })
                    .filter(|(_, n)| *n > 0)
                    .collect()
            };
        Self {
            requests: delta(&start.handled, &end.handled)
                .into_iter()
                .filter(|(m, _)| !is_streaming(m))
                .collect(),
            streams_started: delta(&baseline.started, &end.started)
                .into_iter()
                .filter(|(m, _)| is_streaming(m))
                .collect(),
            stream_msgs: delta(&start.msgs_received, &end.msgs_received)
                .into_iter()
                .filter(|(m, _)| is_streaming(m))
                .collect(),
            watchers: (during.watchers - baseline.watchers).max(0.0).round() as u64,
            watch_streams: (during.watch_streams - baseline.watch_streams)
                .max(0.0)
                .round() as u64,
            streams_open: delta(&open_streams(baseline), &open_streams(during)),
        }
    }

    /// Unary requests of the KV service (what the KV scenarios ask for).
    pub fn kv_requests(&self) -> u64 {
        ["Range", "Put", "Txn", "DeleteRange"]
            .iter()
            .map(|m| self.requests.get(*m).copied().unwrap_or(0))
            .sum()
    }
}

/// Streams open now, by streaming method: started and not yet handled (finished).
fn open_streams(counters: &EtcdCounters) -> BTreeMap<String, f64> {
    counters
        .started
        .iter()
        .filter(|(method, _)| is_streaming(method))
        .map(|(method, started)| {
            let handled = counters.handled.get(method).copied().unwrap_or(0.0);
            (method.clone(), (started - handled).max(0.0))
        })
        .collect()
}

/// etcd's streaming methods; everything else is unary.
fn is_streaming(method: &str) -> bool {
    matches!(method, "Watch" | "LeaseKeepAlive" | "Snapshot" | "Observe")
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = r#"# HELP grpc_server_handled_total Total number of RPCs completed on the server.
# TYPE grpc_server_handled_total counter
grpc_server_handled_total{grpc_code="OK",grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"} 10
grpc_server_handled_total{grpc_code="NotFound",grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"} 2
grpc_server_handled_total{grpc_code="OK",grpc_method="Watch",grpc_service="grpc.health.v1.Health",grpc_type="server_stream"} 7
grpc_server_started_total{grpc_method="LeaseKeepAlive",grpc_service="etcdserverpb.Lease",grpc_type="bidi_stream"} 1
grpc_server_msg_received_total{grpc_method="LeaseKeepAlive",grpc_service="etcdserverpb.Lease",grpc_type="bidi_stream"} 5
etcd_debugging_mvcc_watcher_total 0
etcd_debugging_mvcc_watch_stream_total 0
"#;

    const AFTER: &str = r#"grpc_server_handled_total{grpc_code="OK",grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"} 110
grpc_server_handled_total{grpc_code="NotFound",grpc_method="Range",grpc_service="etcdserverpb.KV",grpc_type="unary"} 3
grpc_server_handled_total{grpc_code="OK",grpc_method="Put",grpc_service="etcdserverpb.KV",grpc_type="unary"} 4
grpc_server_handled_total{grpc_code="OK",grpc_method="Watch",grpc_service="grpc.health.v1.Health",grpc_type="server_stream"} 70
grpc_server_started_total{grpc_method="LeaseKeepAlive",grpc_service="etcdserverpb.Lease",grpc_type="bidi_stream"} 3
grpc_server_msg_received_total{grpc_method="LeaseKeepAlive",grpc_service="etcdserverpb.Lease",grpc_type="bidi_stream"} 1e+03
etcd_debugging_mvcc_watcher_total 0
"#;

    #[test]
    fn handled_requests_are_summed_over_codes_and_exclude_grpc_health() {
        let counters = parse(BEFORE);
        assert_eq!(counters.handled.get("Range"), Some(&12.0));
        assert_eq!(counters.handled.get("Watch"), None);
    }

    #[test]
    fn load_is_the_counter_delta_and_the_gauges_read_during_the_run() {
        let baseline = parse(
            "etcd_debugging_mvcc_watcher_total 2\netcd_debugging_mvcc_watch_stream_total 1\n",
        );
        let during = parse(
            "etcd_debugging_mvcc_watcher_total 252\netcd_debugging_mvcc_watch_stream_total 26\n",
        );
        let load = UpstreamLoad::between(&baseline, &parse(BEFORE), &during, &parse(AFTER));
        assert_eq!(load.requests.get("Range"), Some(&101));
        assert_eq!(load.requests.get("Put"), Some(&4));
        assert_eq!(load.kv_requests(), 105);
        // The baseline has no LeaseKeepAlive streams, so all 3 were opened for this run.
        assert_eq!(load.streams_started.get("LeaseKeepAlive"), Some(&3));
        assert_eq!(load.stream_msgs.get("LeaseKeepAlive"), Some(&995));
        assert_eq!((load.watchers, load.watch_streams), (250, 25));
    }

    #[test]
    fn open_streams_are_started_less_handled_beyond_those_open_before() {
        let line = |metric: &str, n: u32, extra: &str| {
            format!(
                "{metric}{{{extra}grpc_method=\"LeaseKeepAlive\",grpc_service=\"etcdserverpb.Lease\",grpc_type=\"bidi_stream\"}} {n}\n"
            )
        };
        // Before: 3 started, 2 finished (1 open). During: 7 started, 3 finished (4 open): 3 more than before.
        let baseline = parse(
            &(line("grpc_server_started_total", 3, "")
                + &line("grpc_server_handled_total", 2, "grpc_code=\"OK\",")),
        );
        let during = parse(
            &(line("grpc_server_started_total", 7, "")
                + &line("grpc_server_handled_total", 2, "grpc_code=\"OK\",")
                + &line("grpc_server_handled_total", 1, "grpc_code=\"Canceled\",")),
        );
        let load = UpstreamLoad::between(&baseline, &baseline, &during, &during);
        assert_eq!(load.streams_open.get("LeaseKeepAlive"), Some(&3));
        assert_eq!(load.streams_started.get("LeaseKeepAlive"), Some(&4));
    }
}
