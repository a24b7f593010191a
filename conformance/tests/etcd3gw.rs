//! OpenStack's etcd3gw (PyPI; what tooz's etcd3gw driver and other OpenStack services use) end to end over etcd's
//! HTTP/JSON gateway: KV, watch, leases and locks (`conformance/etcd3gw/e2e.py`), against direct etcd and through
//! the proxy binary (default profile), on one etcd version (`TESTKIT_ETCD_VERSION`, else the newest). The client is
//! installed by `ci/install-etcd3gw.sh` (idempotent) when the test starts; a failed install fails the test.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use conformance::profile::{self, Endpoint, Setup, Transport};
use testkit::{Backend, Spec, Version};

/// How long the whole script may take (each of its waits has 30 s).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The virtualenv's python, installing etcd3gw first if needed.
async fn python() -> PathBuf {
    let script = root().join("ci/install-etcd3gw.sh");
    let out = tokio::process::Command::new("bash")
        .arg(&script)
        .output()
        .await
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{} failed ({}), so etcd3gw cannot be tested: {}{}",
        script.display(),
        out.status,
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    let python = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(
        python.is_file(),
        "{} printed no python: {stdout}",
        script.display()
    );
    python
}

/// Runs the checks against `at` (`127.0.0.1:PORT`) under `prefix`; returns their output, or panics with it.
async fn run_checks(python: &Path, at: &Endpoint, prefix: &str, target: &str) -> String {
    let (host, port) = at
        .endpoint
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("no port in {}", at.endpoint));
    let child = tokio::process::Command::new(python)
        .arg(root().join("conformance/etcd3gw/e2e.py"))
        .args([host, port, prefix])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("running the etcd3gw checks");
    let out = tokio::time::timeout(SCRIPT_TIMEOUT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("the etcd3gw checks on {target} took over {SCRIPT_TIMEOUT:?}"))
        .expect("waiting for the etcd3gw checks");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.trim_end().ends_with("all checks passed"),
        "etcd3gw on {target}: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn spec() -> Spec {
    let version = Version::from_env();
    Spec {
        backend: Backend::Process,
        version,
        binaries: version.binaries(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn etcd3gw_kv_watch_leases_and_locks_work_on_direct_etcd() {
    let python = python().await;
    let spec = spec();
    let setup = Setup::new(&[]).expect("no certificates needed");
    let etcd = setup
        .start_etcd(&spec, Transport::Plain, &[])
        .await
        .unwrap_or_else(|e| panic!("starting etcd {}: {e}", spec.version));
    let out = run_checks(
        &python,
        &Endpoint::etcd(&etcd),
        "/etcd3gw/direct/",
        "direct etcd",
    )
    .await;
    assert!(
        out.contains("ok a watch sees another client's put"),
        "{out}"
    );
    etcd.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn etcd3gw_kv_watch_leases_and_locks_work_through_the_proxy() {
    let python = python().await;
    let spec = spec();
    let default = *profile::ALL
        .iter()
        .find(|p| p.name == "default")
        .expect("the default profile");
    let setup = Setup::new(&[default]).expect("no certificates needed");
    let etcd = setup
        .start_etcd(&spec, Transport::Plain, &[])
        .await
        .unwrap_or_else(|e| panic!("starting etcd {}: {e}", spec.version));
    let proxies = setup
        .start_proxy(&default, &etcd, &[])
        .await
        .unwrap_or_else(|e| panic!("starting the proxy: {e}"));
    let target = format!(
        "the proxy (default profile) in front of etcd {}",
        spec.version
    );
    let out = run_checks(
        &python,
        &Endpoint::proxy(&proxies),
        "/etcd3gw/proxy/",
        &target,
    )
    .await;
    assert!(
        out.contains("ok a watch sees another client's put"),
        "{out}"
    );
    drop(proxies);
    etcd.stop().await;
}
