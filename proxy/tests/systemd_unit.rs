//! deploy/systemd/etcd-grpc-proxy.service is a unit systemd accepts: `systemd-analyze verify` finds nothing to say
//! about it (with ExecStart pointing at the binary cargo built, which must exist), it is `Type=notify`, and its
//! hardening leaves it an exposure of at most 2.0 of 10 by `systemd-analyze security` (1.4 with systemd 252).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::proxy::PROXY_BIN;

/// Where the unit says the binary is installed.
const INSTALLED_BIN: &str = "/usr/local/bin/etcd-grpc-proxy";

fn unit_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/etcd-grpc-proxy.service")
}

/// `systemd-analyze ARGS`, or `None` (a skip) when it is not installed here; under `CI=true` that panics instead
/// (`ci/install-deps.sh` installs it).
fn systemd_analyze(args: &[&str]) -> Option<Output> {
    match Command::new("systemd-analyze").args(args).output() {
        Ok(output) => Some(output),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "systemd-analyze is missing: run ci/install-deps.sh (Debian package systemd)"
            );
            eprintln!("skipped: systemd-analyze is not installed (Debian package systemd)");
            None
        }
        Err(e) => panic!("run systemd-analyze: {e}"),
    }
}

/// The unit, with ExecStart pointing at the binary cargo built, written to a temp dir under its own name.
fn unit_for_this_build() -> (tempfile::TempDir, PathBuf) {
    let text = std::fs::read_to_string(unit_path()).expect("read the unit");
    assert!(text.contains(INSTALLED_BIN), "{text}");
    let dir = testkit::dirs::temp_dir("systemd-unit-").expect("temp dir");
    let path = dir.path().join("etcd-grpc-proxy.service");
    std::fs::write(&path, text.replace(INSTALLED_BIN, PROXY_BIN)).expect("write the unit");
    (dir, path)
}

#[test]
fn the_unit_is_a_notify_service_systemd_analyze_verify_accepts() {
    let text = std::fs::read_to_string(unit_path()).expect("read the unit");
    assert!(text.lines().any(|l| l == "Type=notify"), "{text}");
    let (_dir, unit) = unit_for_this_build();
    let Some(out) = systemd_analyze(&["verify", "--man=no", unit.to_str().expect("UTF-8")]) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {}\n{stderr}",
        out.status
    );
}

#[test]
fn the_unit_is_hardened_to_an_exposure_of_at_most_2_of_10() {
    let (_dir, unit) = unit_for_this_build();
    let Some(out) = systemd_analyze(&[
        "security",
        "--offline=yes",
        // In tenths: 2.0 of 10.
        "--threshold=20",
        unit.to_str().expect("UTF-8"),
    ]) else {
        return;
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "systemd-analyze security: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}
