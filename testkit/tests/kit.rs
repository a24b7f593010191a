//! The kit against the real things it drives: every etcd version starts and answers, a member can be killed,
//! paused, resumed and restarted with its data, containers of each imaged version answer, and the proxy's release
//! binary serves in front of etcd. Under `CI=true` a missing version or backend fails; elsewhere it is a skip.

use std::time::Duration;

use testkit::{Backend, Etcd, EtcdCluster, Version};

/// The server version an endpoint reports (`etcdctl endpoint status -w json`).
async fn server_version(ctl: &testkit::Etcdctl) -> String {
    let out = ctl.ok(&["endpoint", "status", "-w", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("endpoint status JSON");
    v[0]["Status"]["version"]
        .as_str()
        .unwrap_or_else(|| panic!("no Status.version in {out}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_version_starts_answers_and_is_the_version_it_says() {
    for version in Version::ALL {
        let Some(binaries) = version.require() else {
            continue;
        };
        let cluster = EtcdCluster::start(&binaries, 1, &[])
            .await
            .unwrap_or_else(|e| panic!("etcd {version}: {e}"));
        let ctl = cluster.etcdctl(0);
        assert_eq!(ctl.ok(&["put", "k", "v"]).await, "OK\n");
        assert_eq!(ctl.ok(&["get", "k", "--print-value-only"]).await, "v\n");
        assert_eq!(server_version(&ctl).await, version.name());
    }
}

/// Puts `k=value` through member 0, retrying while the cluster elects a new leader (the member paused or killed
/// may have been the leader; etcd then answers "request timed out, possibly due to previous leader failure").
async fn put_when_led(cluster: &EtcdCluster, value: &str) {
    let ctl = cluster.etcdctl(0);
    testkit::wait_for("a write through member 0", Duration::from_secs(30), || {
        let ctl = ctl.clone();
        async move {
            let out = ctl
                .run(&["put", "k", value, "--command-timeout=2s"], None)
                .await;
            if out.success() {
                Ok(())
            } else {
                Err(out.to_string())
            }
        }
    })
    .await;
}

/// `etcdctl get k --print-value-only`.
const GET_VALUE: [&str; 3] = ["get", "k", "--print-value-only"];

/// A read that must finish quickly: a paused or dead member makes it fail instead.
async fn quick_get(ctl: &testkit::Etcdctl) -> testkit::Output {
    ctl.run(
        &[
            "get",
            "k",
            "--print-value-only",
            "--command-timeout=1s",
            "--dial-timeout=1s",
        ],
        None,
    )
    .await
}

/// Waits (with a deadline) until the member behind `ctl` answers `k` with `value`: a resumed or restarted member
/// answers once it has caught up with the others.
async fn wait_value(ctl: &testkit::Etcdctl, value: &str) {
    let want = format!("{value}\n");
    testkit::wait_for(
        &format!("{} to answer {value}", ctl.endpoint()),
        Duration::from_secs(30),
        || {
            let (ctl, want) = (ctl.clone(), want.clone());
            async move {
                let out = quick_get(&ctl).await;
                if out.stdout == want {
                    Ok(())
                } else {
                    Err(out.to_string())
                }
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_can_be_paused_resumed_killed_and_restarted_with_its_data() {
    let Some(binaries) = Version::from_env().require() else {
        return;
    };
    let mut cluster = EtcdCluster::start(&binaries, 3, &[])
        .await
        .expect("3-member cluster");
    cluster.etcdctl(0).ok(&["put", "k", "before"]).await;
    let m1 = cluster.etcdctl(1);
    assert_eq!(quick_get(&m1).await.stdout, "before\n");

    cluster.pause(1);
    let paused = quick_get(&m1).await;
    assert!(!paused.success(), "a paused member answered:\n{paused}");
    assert!(cluster.is_running(1), "pausing is not killing");
    // The other two still have quorum.
    put_when_led(&cluster, "during").await;

    cluster.resume(1);
    wait_value(&m1, "during").await;

    cluster.kill(2);
    assert!(!cluster.is_running(2));
    let dead = quick_get(&cluster.etcdctl(2)).await;
    assert!(!dead.success(), "a killed member answered:\n{dead}");
    put_when_led(&cluster, "while-down").await;
    cluster.restart(2).await.expect("restart member 2");
    wait_value(&cluster.etcdctl(2), "while-down").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_of_each_imaged_version_answer() {
    let specs = testkit::etcd::discover().await;
    let containers: Vec<_> = specs
        .iter()
        .filter(|s| s.backend == Backend::Container)
        .collect();
    assert_eq!(containers.len(), testkit::etcd::container::VERSIONS.len());
    for spec in containers {
        if let Some(why) = spec.missing() {
            assert!(
                !testkit::ci(),
                "{} missing under CI=true: {why}",
                spec.label()
            );
            eprintln!("SKIPPED {}: {why}", spec.label());
            continue;
        }
        let etcd = Etcd::start(spec, &[])
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", spec.label()));
        let ctl = spec
            .binaries
            .as_ref()
            .expect("binaries")
            .etcdctl(&etcd.endpoint());
        let version = server_version(&ctl).await;
        ctl.ok(&["put", "k", "v"]).await;
        let value = ctl.ok(&["get", "k", "--print-value-only"]).await;
        etcd.stop().await;
        assert_eq!(version, spec.version.name(), "{}", spec.label());
        assert_eq!(value, "v\n", "{}", spec.label());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_binary_serves_in_front_of_etcd_with_the_flags_given() {
    let Some(binaries) = Version::V3_4_23.require() else {
        return;
    };
    let cluster = EtcdCluster::start(&binaries, 1, &[]).await.expect("etcd");
    let bin = testkit::proxy::binary().expect("the proxy's release binary");
    assert!(
        bin.ends_with("release/etcd-grpc-proxy") || std::env::var("ETCD_GRPC_PROXY_BIN").is_ok()
    );
    // A flag with a visible effect: the proxy refuses requests above --max-send-bytes itself.
    let proxy =
        testkit::ProxyProcess::start(&bin, &cluster.endpoints(), &["--max-send-bytes=1024"])
            .await
            .expect("start the proxy");
    let ctl = binaries.etcdctl(&proxy.addr());
    assert_eq!(ctl.ok(&["put", "k", "small"]).await, "OK\n");
    assert_eq!(
        cluster.etcdctl(0).ok(&GET_VALUE).await,
        "small\n",
        "etcd itself"
    );
    let big = ctl.run(&["put", "k", &"x".repeat(4096)], None).await;
    assert!(
        !big.success(),
        "a 4 KiB put passed a 1 KiB --max-send-bytes:\n{big}"
    );
    assert_eq!(
        cluster.etcdctl(0).ok(&GET_VALUE).await,
        "small\n",
        "etcd itself"
    );
}
