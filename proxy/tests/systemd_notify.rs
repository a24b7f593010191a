//! Under systemd (`Type=notify`, deploy/systemd/etcd-grpc-proxy.service) the proxy tells systemd over the datagram
//! socket named by `NOTIFY_SOCKET` that it serves (`READY=1`, only once it answers clients) and that it stops
//! (`STOPPING=1`, when SIGTERM begins the graceful shutdown, before the process exits); one that cannot listen says
//! nothing. A socket it cannot reach is logged and does not stop it, as for etcd's Go proxy.

mod support;

use std::process::Command;
use std::time::Duration;

use proto::etcdserverpb::RangeRequest;
use proto::etcdserverpb::kv_client::KvClient;
use support::grpc::channel;
use support::proxy::PROXY_BIN;
use testkit::process::Process;
use testkit::{ProxyProcess, try_wait_for};
use tokio::net::UnixDatagram;

const TIMEOUT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_once_the_proxy_answers_and_stopping_when_sigterm_begins_the_shutdown() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let dir = testkit::dirs::temp_dir("systemd-notify-").expect("temp dir");
    let socket_path = dir.path().join("notify.sock");
    let systemd = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let mut command = Command::new(PROXY_BIN);
    command
        .arg("start")
        .arg(format!("--endpoints={}", etcd.endpoints().join(",")))
        .arg(format!("--listen-addr={addr}"))
        .env("NOTIFY_SOCKET", &socket_path);
    let mut proxy = Process::spawn("etcd-grpc-proxy", command, &dir.path().join("proxy.log"))
        .expect("spawn the proxy");

    assert_eq!(next_notification(&systemd, &mut proxy).await, "READY=1");
    // At once, with no retry: a proxy that said it is ready takes the connection and answers the call.
    let mut kv = KvClient::new(channel(&addr).await);
    kv.range(RangeRequest {
        key: b"k".to_vec(),
        ..Default::default()
    })
    .await
    .unwrap_or_else(|e| panic!("Range right after READY=1: {e}\n{}", proxy.log_tail(40)));

    proxy.terminate();
    assert_eq!(next_notification(&systemd, &mut proxy).await, "STOPPING=1");
    let status = wait_for_exit(&mut proxy).await;
    assert!(
        status.success(),
        "{status}; its log:\n{}",
        proxy.log_tail(40)
    );
    let mut rest = [0u8; 64];
    assert!(
        systemd.try_recv(&mut rest).is_err(),
        "nothing is sent after STOPPING=1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_cannot_listen_exits_without_saying_ready() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let dir = testkit::dirs::temp_dir("systemd-notify-").expect("temp dir");
    let socket_path = dir.path().join("notify.sock");
    let systemd = UnixDatagram::bind(&socket_path).expect("bind the notify socket");
    let busy = support::net::BusyPort::bind();
    let mut command = Command::new(PROXY_BIN);
    command
        .arg("start")
        .arg(format!("--endpoints={}", etcd.endpoints().join(",")))
        .arg(format!("--listen-addr={}", busy.addr()))
        .env("NOTIFY_SOCKET", &socket_path);
    let mut proxy = Process::spawn("etcd-grpc-proxy", command, &dir.path().join("proxy.log"))
        .expect("spawn the proxy");

    let status = wait_for_exit(&mut proxy).await;
    assert!(!status.success(), "{status}");
    let mut buf = [0u8; 64];
    let sent = systemd.try_recv(&mut buf).map(|n| buf[..n].to_vec());
    assert!(
        sent.is_err(),
        "sent {:?} though it never served; its log:\n{}",
        sent.map(|b| String::from_utf8_lossy(&b).into_owned()),
        proxy.log_tail(40)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notify_socket_nobody_listens_on_is_logged_and_the_proxy_serves() {
    let Some(binaries) = support::etcd() else {
        return;
    };
    let etcd = support::cluster(&binaries, 1, &[]).await;
    let dir = testkit::dirs::temp_dir("systemd-notify-").expect("temp dir");
    let missing = dir.path().join("nobody.sock");
    let proxy = ProxyProcess::start_with_env(
        std::path::Path::new(PROXY_BIN),
        &etcd.endpoints(),
        &[] as &[&str],
        &[("NOTIFY_SOCKET", missing.to_str().expect("UTF-8 temp path"))],
    )
    .await
    .unwrap_or_else(|e| panic!("start the proxy: {e}"));
    let log = proxy.log_tail(40);
    assert!(
        log.contains("cannot notify systemd") && log.contains("READY=1"),
        "{log}"
    );
}

/// How `proxy` ended; panics if it still runs after [`TIMEOUT`].
async fn wait_for_exit(proxy: &mut Process) -> std::process::ExitStatus {
    try_wait_for(TIMEOUT, || {
        let status = proxy.exit_status();
        async move { status.ok_or_else(|| "still running".to_string()) }
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "the proxy did not exit: {e}; its log:\n{}",
            proxy.log_tail(40)
        )
    })
}

/// The next datagram the proxy sends to `systemd`, as text; panics, with the proxy's log, if none comes within
/// [`TIMEOUT`] or the proxy exits first.
async fn next_notification(systemd: &UnixDatagram, proxy: &mut Process) -> String {
    let mut buf = [0u8; 256];
    let got = try_wait_for(TIMEOUT, || {
        let received = match systemd.try_recv(&mut buf) {
            Ok(n) => Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
            Err(e) => Err(match proxy.exit_status() {
                Some(status) => format!("the proxy exited with {status}"),
                None => format!("nothing received: {e}"),
            }),
        };
        async move { received }
    })
    .await;
    got.unwrap_or_else(|e| panic!("no notification: {e}; its log:\n{}", proxy.log_tail(40)))
}
