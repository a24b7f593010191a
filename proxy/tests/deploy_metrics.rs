//! The Grafana dashboard (`deploy/grafana/etcd-grpc-proxy.json`) and the Prometheus alerting rules
//! (`deploy/prometheus/etcd-grpc-proxy-rules.yml`) query only series the proxy exports on `/proxy/metrics`: the
//! real proxy, in front of real etcd, after a unary call, a cache read, a watch and a lease keep-alive, declares
//! every metric family their PromQL names. The dashboard's panels all have a datasource and queries, and every
//! alert has a duration, a severity and the annotations a notification shows.

mod support;

#[path = "deploy_metrics/promql.rs"]
mod promql;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest, PutRequest, RangeRequest};
use serde_json::Value;
use support::watch::{self, WatchStream};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

/// The series Prometheus itself writes for every scrape target: the rules may read them (`up` says whether the
/// proxy answered its scrape at all).
const SCRAPE_SERIES: &[&str] = &["up"];

/// A hang guard for one answer on loopback.
const ANSWER_GUARD: Duration = Duration::from_secs(30);

fn deploy_file(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .join(relative)
}

fn read(relative: &str) -> String {
    let path = deploy_file(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn dashboard() -> Value {
    serde_json::from_str(&read("grafana/etcd-grpc-proxy.json"))
        .unwrap_or_else(|e| panic!("the dashboard is not JSON: {e}"))
}

fn rules() -> serde_yaml_ng::Value {
    serde_yaml_ng::from_str(&read("prometheus/etcd-grpc-proxy-rules.yml"))
        .unwrap_or_else(|e| panic!("the rules are not YAML: {e}"))
}

/// Every panel of the dashboard, those inside collapsed rows included, rows left out.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            out.extend(panel["panels"].as_array().into_iter().flatten());
        } else {
            out.push(panel);
        }
    }
    out
}

/// Each PromQL expression of the dashboard (its panels' and its query variables'), with where it stands.
fn dashboard_expressions(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for panel in panels(dashboard) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            out.push((format!("panel {:?}", panel["title"]), expr.to_string()));
        }
    }
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating");
    for variable in variables.iter().filter(|v| v["type"] == "query") {
        let query = variable["query"]["query"]
            .as_str()
            .or(variable["query"].as_str())
            .unwrap_or_default();
        out.push((
            format!("variable {:?}", variable["name"]),
            query.to_string(),
        ));
    }
    out
}

/// Each rule of the rules file, with its group's name.
fn rule_list(rules: &serde_yaml_ng::Value) -> Vec<&serde_yaml_ng::Value> {
    let groups = rules["groups"].as_sequence().expect("groups");
    groups
        .iter()
        .flat_map(|group| group["rules"].as_sequence().expect("rules of a group"))
        .collect()
}

fn rule_expressions(rules: &serde_yaml_ng::Value) -> Vec<(String, String)> {
    rule_list(rules)
        .into_iter()
        .map(|rule| {
            let name = rule["alert"].as_str().or(rule["record"].as_str());
            let expr = rule["expr"].as_str().unwrap_or_default();
            (format!("rule {name:?}"), expr.to_string())
        })
        .collect()
}

/// The series the rules' unit tests feed them: these too must be series the proxy exports, or the unit tests
/// would pass on data no proxy writes.
fn rule_test_series() -> Vec<(String, String)> {
    let tests: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&read("prometheus/etcd-grpc-proxy-rules.test.yml"))
            .unwrap_or_else(|e| panic!("the rules' tests are not YAML: {e}"));
    let tests = tests["tests"].as_sequence().expect("tests");
    tests
        .iter()
        .flat_map(|test| {
            let name = test["name"].as_str().unwrap_or_default().to_string();
            test["input_series"]
                .as_sequence()
                .expect("input_series")
                .iter()
                .map(move |input| {
                    let series = input["series"].as_str().expect("series");
                    (format!("rule test {name:?}"), series.to_string())
                })
        })
        .collect()
}

/// Every metric name in `expressions`; panics naming an expression that reads none or cannot be read.
fn names_in(expressions: &[(String, String)]) -> BTreeSet<String> {
    let mut all = BTreeSet::new();
    for (place, expr) in expressions {
        let names = promql::metric_names(expr).unwrap_or_else(|e| panic!("{place}: {e}"));
        assert!(!names.is_empty(), "{place} reads no metric: {expr:?}");
        all.extend(names);
    }
    all
}

#[test]
fn every_dashboard_panel_has_the_datasource_variable_and_queries() {
    let dashboard = dashboard();
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating");
    let variable = |name: &str| variables.iter().find(|v| v["name"] == name);
    assert_eq!(
        variable("DS_PROMETHEUS").map(|v| (&v["type"], &v["query"])),
        Some((&Value::from("datasource"), &Value::from("prometheus"))),
        "a Prometheus datasource variable DS_PROMETHEUS"
    );
    for name in ["job", "instance"] {
        assert_eq!(
            variable(name).map(|v| &v["type"]),
            Some(&Value::from("query")),
            "a query variable {name}"
        );
    }
    let panels = panels(&dashboard);
    assert!(panels.len() >= 10, "{} panels", panels.len());
    let datasource = serde_json::json!({"type": "prometheus", "uid": "${DS_PROMETHEUS}"});
    let mut ids = BTreeSet::new();
    for panel in panels {
        let title = &panel["title"];
        assert!(
            ids.insert(panel["id"].to_string()),
            "panel id of {title} repeated"
        );
        assert_eq!(panel["datasource"], datasource, "panel {title}");
        let targets = panel["targets"].as_array();
        assert!(
            targets.is_some_and(|t| !t.is_empty()),
            "panel {title} has no targets"
        );
        for target in targets.into_iter().flatten() {
            assert_eq!(target["datasource"], datasource, "a target of {title}");
            assert!(
                target["expr"]
                    .as_str()
                    .is_some_and(|e| !e.trim().is_empty()),
                "a target of {title} has no expr"
            );
        }
    }
    names_in(&dashboard_expressions(&dashboard));
}

#[test]
fn every_alert_has_a_duration_a_severity_and_a_summary_and_description() {
    let rules = rules();
    let list = rule_list(&rules);
    assert!(list.len() >= 6, "{} rules", list.len());
    for rule in list {
        let name = rule["alert"].as_str().expect("every rule is an alert");
        assert!(
            rule["expr"].as_str().is_some_and(|e| !e.trim().is_empty()),
            "{name}: expr"
        );
        assert!(rule["for"].as_str().is_some(), "{name}: for");
        let severity = rule["labels"]["severity"].as_str();
        assert!(
            matches!(severity, Some("critical" | "warning" | "info")),
            "{name}: severity {severity:?}"
        );
        for annotation in ["summary", "description"] {
            assert!(
                rule["annotations"][annotation]
                    .as_str()
                    .is_some_and(|a| !a.is_empty()),
                "{name}: annotation {annotation}"
            );
        }
    }
    names_in(&rule_expressions(&rules));
}

/// Runs `promtool COMMAND rules FILE` in FILE's directory; `None` when promtool (from Debian's `prometheus`
/// package, as ci/install-deps.sh installs it) is not installed here, which under `CI=true` is a failure instead.
fn promtool_rules(command: &str, path: &Path) -> Option<std::process::Output> {
    match std::process::Command::new("promtool")
        .args([command, "rules"])
        .arg(path)
        .current_dir(path.parent().expect("a file in a directory"))
        .output()
    {
        Ok(output) => Some(output),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "promtool is not installed (ci/install-deps.sh installs it)"
            );
            eprintln!("promtool is not installed: skipped");
            None
        }
        Err(e) => panic!("run promtool: {e}"),
    }
}

fn assert_promtool_accepts(command: &str, path: &Path) {
    if let Some(output) = promtool_rules(command, path) {
        assert!(
            output.status.success(),
            "promtool {command} rules {}: {}\n{}",
            path.display(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

#[test]
fn promtool_accepts_the_rules() {
    assert_promtool_accepts(
        "check",
        &deploy_file("prometheus/etcd-grpc-proxy-rules.yml"),
    );
}

/// The rules' unit tests (`etcd-grpc-proxy-rules.test.yml`) pass: each alert fires, with its labels and
/// annotations, on the series of a proxy in that trouble, and not on those of a healthy one.
#[test]
fn each_alert_fires_on_the_series_of_a_proxy_in_trouble() {
    assert_promtool_accepts(
        "test",
        &deploy_file("prometheus/etcd-grpc-proxy-rules.test.yml"),
    );
}

/// Grafana's variables as Prometheus would see them after Grafana replaced them; any other `$` is left for the
/// test to notice.
fn as_grafana_sends(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m")
        .replace("$job", ".+")
        .replace("$instance", ".+")
}

/// Each panel query is PromQL that Prometheus parses: written as recording rules, `promtool check rules` reads
/// them (a bracket or a `by` out of place fails here, not only in Grafana).
#[test]
fn promtool_parses_every_panel_query() {
    let dashboard = dashboard();
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, panel) in panels(&dashboard).into_iter().enumerate() {
        for (m, target) in panel["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let expr = as_grafana_sends(target["expr"].as_str().unwrap_or_default());
            assert!(
                !expr.contains('$'),
                "panel {:?} uses a variable this test does not know: {expr}",
                panel["title"]
            );
            // A JSON string is a YAML double-quoted scalar.
            let quoted = serde_json::to_string(&expr).unwrap();
            rules.push_str(&format!(
                "      - record: dashboard:panel_{n}_{m}\n        expr: {quoted}\n"
            ));
        }
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("dashboard-queries.yml");
    std::fs::write(&path, rules).expect("write the queries");
    assert_promtool_accepts("check", &path);
}

/// Makes the calls after which every family the proxy has is declared: a Vec family with no labelled child yet
/// is not in the exposition at all.
async fn exercise(proxy: &testkit::ProxyProcess) {
    let channel = support::grpc::channel(&proxy.addr()).await;
    let mut kv = KvClient::new(channel.clone());
    kv.put(PutRequest {
        key: b"dashboard".to_vec(),
        value: b"1".to_vec(),
        ..Default::default()
    })
    .await
    .expect("put");
    for _ in 0..2 {
        kv.range(RangeRequest {
            key: b"dashboard".to_vec(),
            serializable: true,
            ..Default::default()
        })
        .await
        .expect("serializable range");
    }

    // The watch's upstream stream makes the proxy authenticate its --user (etcd's auth is off: `auth_disabled`).
    let mut watch = WatchStream::open(channel.clone(), watch::create("dashboard", 0)).await;
    let created = watch.expect("the watch's created response").await;
    assert!(created.created, "{created:?}");

    let mut lease = LeaseClient::new(channel);
    let id = lease
        .lease_grant(LeaseGrantRequest { ttl: 60, id: 0 })
        .await
        .expect("lease grant")
        .into_inner()
        .id;
    let (tx, rx) = mpsc::channel(1);
    tx.send(LeaseKeepAliveRequest { id }).await.unwrap();
    let mut answers = lease
        .lease_keep_alive(ReceiverStream::new(rx))
        .await
        .expect("keep-alive stream")
        .into_inner();
    let answer = tokio::time::timeout(ANSWER_GUARD, answers.next())
        .await
        .expect("a keep-alive answer in time")
        .expect("an answer")
        .expect("no error");
    assert_eq!(answer.id, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_the_dashboard_and_rules_query_is_one_the_proxy_exports() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(
        &etcd.endpoints(),
        &["--range-cache-max-bytes=1048576", "--user=dashboard:secret"],
    )
    .await;
    exercise(&proxy).await;
    let exposition = proxy.metrics().await;
    let exported: BTreeMap<String, String> = promql::exported_families(&exposition);

    let in_dashboard = names_in(&dashboard_expressions(&dashboard()));
    let missing = promql::not_exported(&in_dashboard, &exported);
    assert!(
        missing.is_empty(),
        "the dashboard queries {missing:?}, which /proxy/metrics does not export:\n{exposition}"
    );

    let mut rule_queries = rule_expressions(&rules());
    rule_queries.extend(rule_test_series());
    let in_rules = names_in(&rule_queries);
    let missing: BTreeSet<String> = promql::not_exported(&in_rules, &exported)
        .into_iter()
        .filter(|name| !SCRAPE_SERIES.contains(&name.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "the rules query {missing:?}, which /proxy/metrics does not export:\n{exposition}"
    );

    // The dashboard shows every family the proxy exports, so a new metric gets a panel.
    let not_shown: BTreeSet<String> = exported
        .keys()
        .filter(|family| {
            let queried = |name: &String| {
                name == *family
                    || name
                        .strip_suffix("_bucket")
                        .is_some_and(|base| base == family.as_str())
            };
            !in_dashboard.iter().any(queried)
        })
        .cloned()
        .collect();
    assert!(
        not_shown.is_empty(),
        "/proxy/metrics exports {not_shown:?}, which no dashboard panel shows"
    );
}
