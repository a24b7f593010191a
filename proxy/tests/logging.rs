//! The proxy's log is JSON lines with the field names of etcd's zap logger (`level`, `ts`, `caller`, `msg` first,
//! then the fields), to stderr by default as etcd's; `--log-level` and `--debug` choose what is written,
//! `--log-outputs` where. A refused start is still one plain line.

mod support;

use std::time::Duration;

use testkit::wait_for;

const TIMEOUT: Duration = Duration::from_secs(30);

/// Every line of `log`, checked to be one of zap's lines: a JSON object whose keys start with `level`, `ts`,
/// `caller`, `msg` in that order, `ts` in etcd's format; returns them parsed.
fn zap_lines(log: &str) -> Vec<serde_json::Map<String, serde_json::Value>> {
    log.lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}\nlog:\n{log}"));
            let fields = value.as_object().cloned().expect("an object");
            let positions: Vec<usize> = ["\"level\":", "\"ts\":", "\"caller\":", "\"msg\":"]
                .iter()
                .map(|key| {
                    line.find(key)
                        .unwrap_or_else(|| panic!("no {key} in {line}"))
                })
                .collect();
            assert_eq!(positions[0], 1, "level first: {line}");
            assert!(
                positions.is_sorted(),
                "level, ts, caller, msg in order: {line}"
            );
            assert!(
                ["debug", "info", "warn", "error"].contains(&fields["level"].as_str().unwrap()),
                "{line}"
            );
            assert!(is_etcd_timestamp(fields["ts"].as_str().unwrap()), "{line}");
            let caller = fields["caller"].as_str().unwrap();
            let (file, number) = caller.rsplit_once(':').expect("file:line");
            assert!(
                file.ends_with(".rs") && number.parse::<u32>().is_ok(),
                "{line}"
            );
            fields
        })
        .collect()
}

/// `2006-01-02T15:04:05.000000Z`: etcd's `ts`.
fn is_etcd_timestamp(ts: &str) -> bool {
    let shape = "dddd-dd-ddTdd:dd:dd.ddddddZ";
    ts.len() == shape.len()
        && ts.chars().zip(shape.chars()).all(|(c, s)| match s {
            'd' => c.is_ascii_digit(),
            s => c == s,
        })
}

fn messages(lines: &[serde_json::Map<String, serde_json::Value>]) -> Vec<String> {
    lines
        .iter()
        .map(|l| l["msg"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn by_default_every_line_is_zap_json_at_info() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let proxy = support::proxy::start(&etcd.endpoints(), &[]).await;
    let log = wait_for("the started line", TIMEOUT, || async {
        let log = proxy.log_tail(100_000);
        if log.contains("started gRPC proxy") {
            Ok(log)
        } else {
            Err(log)
        }
    })
    .await;
    let lines = zap_lines(&log);
    let started = lines
        .iter()
        .find(|l| l["msg"] == "started gRPC proxy")
        .unwrap();
    assert_eq!(started["level"], "info");
    assert_eq!(started["address"], proxy.addr(), "etcd's field name");
    assert!(
        started["caller"]
            .as_str()
            .unwrap()
            .starts_with("src/lib.rs:")
    );
    let seed = lines.iter().find(|l| l["msg"] == "random seed").unwrap();
    assert!(seed["seed"].is_u64(), "numbers stay numbers: {seed:?}");
    assert_eq!(seed["from_flag"], false);
    assert!(
        lines.iter().all(|l| l["level"] != "debug"),
        "no debug line at the default level:\n{log}"
    );
}

#[tokio::test]
async fn log_level_debug_shows_debug_lines_and_error_hides_info() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let verbose = support::proxy::start(&etcd.endpoints(), &["--log-level=debug"]).await;
    let quiet = support::proxy::start(&etcd.endpoints(), &["--log-level=error"]).await;
    support::grpc::put(&support::grpc::channel(&verbose.addr()).await, "k", "v").await;
    support::grpc::put(&support::grpc::channel(&quiet.addr()).await, "k", "v").await;
    wait_for("a debug line", TIMEOUT, || async {
        let lines = zap_lines(&verbose.log_tail(100_000));
        if lines.iter().any(|l| l["level"] == "debug") {
            Ok(())
        } else {
            Err(format!("{:?}", messages(&lines)))
        }
    })
    .await;
    // The info lines a default start writes are written before the proxy serves, and it has served a call.
    let lines = zap_lines(&quiet.log_tail(100_000));
    assert!(
        lines.iter().all(|l| l["level"] == "error"),
        "{:?}",
        messages(&lines)
    );
}

#[tokio::test]
async fn a_file_in_log_outputs_receives_the_lines() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("proxy.log");
    let flag = format!("--log-outputs={}", file.display());
    let proxy = support::proxy::start(&etcd.endpoints(), &[flag.as_str()]).await;
    let written = wait_for("the started line in the file", TIMEOUT, || async {
        let written = std::fs::read_to_string(&file).unwrap_or_default();
        if written.contains("started gRPC proxy") {
            Ok(written)
        } else {
            Err(written)
        }
    })
    .await;
    let lines = zap_lines(&written);
    assert!(messages(&lines).contains(&"random seed".to_string()));
    // Only the file: nothing on stderr or stdout.
    assert_eq!(proxy.log_tail(100_000), "");
}

#[tokio::test]
async fn bad_log_flags_are_one_line_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let unopenable = dir.path().join("no-such-dir").join("proxy.log");
    let flag = format!("--log-outputs={}", unopenable.display());
    let out = support::proxy::try_start(&["start", flag.as_str()]).await;
    assert!(!out.status.success(), "{out:?}");
    assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
    assert!(
        out.stderr.starts_with(&format!(
            "etcd-grpc-proxy: --log-outputs: cannot open {}: ",
            unopenable.display()
        )),
        "{out:?}"
    );
    for (flag, words) in [
        ("--log-level=verbose", "unrecognized level: \"verbose\""),
        (
            "--log-outputs=default,stdout",
            "multi logoutput for \"default\" is not supported yet",
        ),
    ] {
        let out = support::proxy::try_start(&["start", flag]).await;
        assert!(!out.status.success(), "{out:?}");
        let line = out.stderr.lines().next().unwrap_or("");
        assert!(line.contains(words), "{flag}: {out:?}");
    }
}
