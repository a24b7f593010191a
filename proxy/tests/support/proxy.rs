//! The proxy binary cargo built for this package (not the release build `testkit::proxy::binary` makes): started
//! as a `testkit::ProxyProcess`, or run with arguments it must refuse.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use testkit::ProxyProcess;

/// The binary cargo built for this package.
pub const PROXY_BIN: &str = env!("CARGO_BIN_EXE_etcd-grpc-proxy");

/// How long a run that is expected to fail at startup may take to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts `etcd-grpc-proxy start --endpoints=.. --listen-addr=127.0.0.1:PORT FLAGS..` and waits until it is
/// healthy; panics with why not (its log included).
pub async fn start(endpoints: &[String], flags: &[&str]) -> ProxyProcess {
    ProxyProcess::start(Path::new(PROXY_BIN), endpoints, flags)
        .await
        .unwrap_or_else(|e| panic!("start the proxy with {flags:?}: {e}"))
}

/// How a run of the binary that was expected to fail at startup ended.
#[derive(Debug)]
pub struct Exited {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// Runs the proxy binary with exactly `args` and waits (with a deadline) for it to exit.
/// Panics, after killing it, if it is still running at the deadline: a startup error must
/// end the process.
pub async fn try_start(args: &[&str]) -> Exited {
    let child = tokio::process::Command::new(PROXY_BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {PROXY_BIN}: {e}"));
    match tokio::time::timeout(EXIT_TIMEOUT, child.wait_with_output()).await {
        Ok(Ok(out)) => Exited {
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        },
        Ok(Err(e)) => panic!("waiting for {PROXY_BIN} {args:?}: {e}"),
        // The dropped future dropped the child, which kill_on_drop killed.
        Err(_) => panic!(
            "`etcd-grpc-proxy {}` was still running after {EXIT_TIMEOUT:?}; expected it to exit with an error",
            args.join(" ")
        ),
    }
}

/// Waits (up to `deadline`) until `proxy`'s process has exited, as after `terminate`; panics if it has not.
pub async fn wait_exited(proxy: &mut ProxyProcess, deadline: Duration) {
    testkit::wait_for("the proxy to exit", deadline, || {
        let running = proxy.is_running();
        async move {
            if running {
                Err("running".to_string())
            } else {
                Ok(())
            }
        }
    })
    .await;
}
