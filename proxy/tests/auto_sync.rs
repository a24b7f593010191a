//! `--endpoints-auto-sync-interval` against real etcd: every member of a 3-member cluster is replaced in turn (the
//! ones the proxy was started with included) while a client reads through the proxy; no read fails, and the
//! proxy ends up using exactly the new members.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use proto::etcdserverpb::RangeRequest;
use proto::etcdserverpb::kv_client::KvClient;
use support::metrics;
use testkit::wait_for;
use tokio::sync::Mutex;

/// The sync interval the proxy runs with here.
const SYNC_EVERY: &str = "1s";
/// A hang guard for one read: far above what a read takes, even across a failover.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The endpoints the proxy uses now, from `etcd_grpc_proxy_upstream_up`'s labels.
fn endpoints_in_use(text: &str) -> Vec<String> {
    labels(text, "etcd_grpc_proxy_upstream_up")
}

/// The `endpoint` labels of `metric`'s series, sorted.
fn labels(text: &str, metric: &str) -> Vec<String> {
    let prefix = format!("{metric}{{endpoint=\"");
    let mut endpoints: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix(prefix.as_str()))
        .filter_map(|rest| Some(rest.split_once('"')?.0.to_owned()))
        .collect();
    endpoints.sort();
    endpoints
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_is_replaced_under_the_proxy_without_a_failed_read() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let mut cluster = support::cluster(&binaries, 3, &[]).await;
    let proxy = support::proxy::start(
        &cluster.endpoints(),
        &[&format!("--endpoints-auto-sync-interval={SYNC_EVERY}")],
    )
    .await;

    // One linearizable read at a time, for the whole test.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));
    let failures = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut client = KvClient::new(support::grpc::channel(&proxy.addr()).await);
    let reader = {
        let (stop, reads, failures) = (stop.clone(), reads.clone(), failures.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Acquire) {
                let request = RangeRequest {
                    key: b"k".to_vec(),
                    ..Default::default()
                };
                match tokio::time::timeout(READ_TIMEOUT, client.range(request)).await {
                    Ok(Ok(_)) => {
                        reads.fetch_add(1, Ordering::AcqRel);
                    }
                    Ok(Err(status)) => failures.lock().await.push(support::grpc::status(&status)),
                    Err(_) => failures.lock().await.push("no answer within 30 s".into()),
                }
            }
        })
    };

    for i in 0..cluster.len() {
        let via = (i + 1) % cluster.len();
        cluster
            .replace(i, via)
            .await
            .unwrap_or_else(|e| panic!("replace member {i}: {e}\n{}", cluster.logs(30)));
        let new = cluster.addr(i);
        wait_for(
            "the proxy to use the new member",
            Duration::from_secs(30),
            || {
                let (proxy, new) = (&proxy, new.clone());
                async move {
                    let in_use = endpoints_in_use(&proxy.metrics().await);
                    if in_use.contains(&new) {
                        Ok(())
                    } else {
                        Err(format!("in use: {in_use:?}"))
                    }
                }
            },
        )
        .await;
    }
    let mut members: Vec<String> = (0..cluster.len()).map(|i| cluster.addr(i)).collect();
    members.sort();
    wait_for(
        "the proxy to drop the replaced members",
        Duration::from_secs(30),
        || {
            let (proxy, members) = (&proxy, members.clone());
            async move {
                let text = proxy.metrics().await;
                let in_use = endpoints_in_use(&text);
                // No series is left behind for a replaced member.
                let labelled = labels(&text, "etcd_grpc_proxy_upstream_active");
                match metrics::active_endpoint(&text) {
                    Some(active)
                        if in_use == members
                            && labelled == members
                            && members.contains(&active) =>
                    {
                        Ok(())
                    }
                    active => Err(format!(
                        "in use: {in_use:?}, labelled active: {labelled:?}, active {active:?}"
                    )),
                }
            }
        },
    )
    .await;

    let before = reads.load(Ordering::Acquire);
    wait_for("reads on the new members", Duration::from_secs(30), || {
        let reads = reads.clone();
        async move {
            if reads.load(Ordering::Acquire) > before + 10 {
                Ok(())
            } else {
                Err("no new reads".to_string())
            }
        }
    })
    .await;
    stop.store(true, Ordering::Release);
    reader.await.unwrap();
    let failures = failures.lock().await;
    assert!(failures.is_empty(), "failed reads: {failures:?}");
    eprintln!("{} reads, none failed", reads.load(Ordering::Acquire));
}

/// Under etcd auth, auto-sync asks MemberList as the proxy's `--user`: etcd 3.5.30 lists its members only to a
/// caller with a valid token, so a tokenless sync would fail every time and change nothing. Started with a second
/// endpoint that is no member (nothing listens there), the proxy must come to use the one member alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_auth_auto_sync_lists_the_members_as_the_proxys_user() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let cluster = support::cluster(&binaries, 1, &[]).await;
    for args in [
        &["user", "add", "root:rootpw"][..],
        &["user", "add", "plain:plainpw"],
        &["auth", "enable"],
    ] {
        cluster.etcdctl(0).ok(args).await;
    }
    let member = cluster.endpoint(0);
    let stray = format!("127.0.0.1:{}", testkit::ports::free_port());
    let sync = format!("--endpoints-auto-sync-interval={SYNC_EVERY}");
    let proxy = support::proxy::start(
        &[member.clone(), stray],
        &[sync.as_str(), "--user=plain:plainpw"],
    )
    .await;
    wait_for(
        "the stray endpoint retired",
        Duration::from_secs(20),
        || {
            let proxy = &proxy;
            let member = member.clone();
            async move {
                let in_use = endpoints_in_use(&proxy.metrics().await);
                if in_use == [member.clone()] {
                    Ok(())
                } else {
                    Err(format!("endpoints in use: {in_use:?}"))
                }
            }
        },
    )
    .await;
}
