//! Go's own etcd clients through the proxy: the test module `goclients/` (its own `go.mod` and `go.sum`:
//! `go.etcd.io/etcd/client/v3` v3.7.3 and `k8s.io/apiserver` v0.37.2) holds Go tests of clientv3 and of
//! Kubernetes' storage layer; this runner builds them once (`go test -c`) and runs each package's test binary
//! against every run: etcd directly and the proxy binary under the profiles, each on a fresh three-member cluster
//! ([`fleet`]). The Go tests read the run from `GOCLIENTS_*` variables and ask for actions (stop a member, start
//! another proxy, ...) at the runner's [`control`] endpoint; the runner owns every process.
//!
//! - [`build`]: `go test -c` of every package with tests, with the module's pinned dependencies only.
//! - [`run_package`]: one package's binary on one run, its `go test -v` output parsed into [`Tally`].

pub mod control;
pub mod fleet;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::process::Command;

use fleet::{Target, View};

/// The module's directory.
pub fn module_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../goclients")
}

/// The Go command: `$GO`, else `go` on the `PATH`, else Go's usual install directory.
pub fn go() -> Option<PathBuf> {
    if let Ok(go) = std::env::var("GO") {
        return Some(go.into());
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join("go"))
        .find(|go| go.is_file());
    on_path.or_else(|| Some(PathBuf::from("/usr/local/go/bin/go")).filter(|go| go.is_file()))
}

/// One package's test binary.
#[derive(Clone, Debug)]
pub struct Package {
    /// Its directory under the module, e.g. `kube`.
    pub name: String,
    pub binary: PathBuf,
}

/// Builds the test binary of every package of the module that has tests into `out`, with the dependencies
/// `go.sum` pins (`-mod=readonly`) and this machine's Go (`GOTOOLCHAIN=local`).
pub async fn build(go: &Path, out: &Path) -> Result<Vec<Package>, String> {
    let output = Command::new(go)
        .current_dir(module_dir())
        .env("GOFLAGS", "-mod=readonly")
        .env("GOTOOLCHAIN", "local")
        .args(["test", "-c", "-o"])
        .arg(out)
        .arg("./...")
        .output()
        .await
        .map_err(|e| format!("run {}: {e}", go.display()))?;
    if !output.status.success() {
        return Err(format!(
            "go test -c failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let mut packages = Vec::new();
    for entry in std::fs::read_dir(out).map_err(|e| format!("{}: {e}", out.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".test"))
        {
            packages.push(Package {
                name: name.to_string(),
                binary: path.clone(),
            });
        }
    }
    packages.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(packages)
}

/// What `go test -v` reported for one package on one run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub passed: usize,
    pub failed: Vec<String>,
    pub skipped: usize,
    /// `measure ...` lines the tests logged, as they logged them.
    pub measures: Vec<String>,
}

impl Tally {
    /// Counts `--- PASS/FAIL/SKIP: Name` lines (subtests included) and keeps `measure` lines.
    pub fn parse(output: &str) -> Tally {
        let mut tally = Tally::default();
        for line in output.lines() {
            let line = line.trim_start();
            if line.starts_with("--- PASS: ") {
                tally.passed += 1;
            } else if let Some(rest) = line.strip_prefix("--- FAIL: ") {
                tally
                    .failed
                    .push(rest.split_whitespace().next().unwrap_or(rest).to_string());
            } else if line.starts_with("--- SKIP: ") {
                tally.skipped += 1;
            } else if let Some(at) = line.find(": measure ") {
                tally.measures.push(line[at + 2..].to_string());
            }
        }
        tally
    }
}

/// How long one package may run on one run before it counts as failed.
const PACKAGE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Runs `package` against the run `fleet` shows (whose control endpoint is `control`): its tally, and its whole output. A
/// binary that exits non-zero with no failed test named (a panic, a timeout) counts as a failure of the package.
pub async fn run_package(
    package: &Package,
    fleet: &View,
    version: testkit::Version,
    control: &str,
    run_filter: Option<&str>,
) -> Result<(Tally, String), String> {
    let namespace = match fleet.target {
        Target::Proxy(p) => p.namespace(),
        Target::Direct => String::new(),
    };
    let mut cmd = Command::new(&package.binary);
    cmd.current_dir(module_dir().join(&package.name))
        .arg("-test.v")
        .arg(format!("-test.timeout={}s", PACKAGE_TIMEOUT.as_secs()))
        .env("GOCLIENTS_CONTROL", control)
        .env("GOCLIENTS_ENDPOINTS", fleet.endpoints.join(","))
        .env("GOCLIENTS_MEMBERS", fleet.members.join(","))
        .env(
            "GOCLIENTS_TARGET",
            if fleet.target == Target::Direct {
                "direct"
            } else {
                "proxy"
            },
        )
        .env("GOCLIENTS_PROFILE", fleet.target.name())
        .env("GOCLIENTS_ETCD_VERSION", version.name())
        .env("GOCLIENTS_NAMESPACE", namespace)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(filter) = run_filter {
        cmd.arg(format!("-test.run={filter}"));
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("run {}: {e}", package.binary.display()))?;
    let (mut stdout, mut stderr) = (child.stdout.take(), child.stderr.take());
    let mut out = String::new();
    let mut err = String::new();
    let finished = tokio::time::timeout(PACKAGE_TIMEOUT + Duration::from_secs(60), async {
        tokio::join!(
            async {
                if let Some(s) = stdout.as_mut() {
                    let _ = s.read_to_string(&mut out).await;
                }
            },
            async {
                if let Some(s) = stderr.as_mut() {
                    let _ = s.read_to_string(&mut err).await;
                }
            }
        );
        child.wait().await
    })
    .await;
    out.push_str(&err);
    let status = match finished {
        Err(_) => return Err(format!("{} did not finish in time\n{out}", package.name)),
        Ok(Err(e)) => return Err(format!("wait for {}: {e}", package.name)),
        Ok(Ok(status)) => status,
    };
    let mut tally = Tally::parse(&out);
    if !status.success() && tally.failed.is_empty() {
        tally.failed.push(format!(
            "{} (exited {status} naming no failed test)",
            package.name
        ));
    }
    Ok((tally, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_test_output_is_tallied_with_subtests_and_measures() {
        let out = "=== RUN   TestA\n--- PASS: TestA (0.01s)\n=== RUN   TestB\n    --- PASS: TestB/one (0.00s)\n    \
                   --- FAIL: TestB/two (1.20s)\n--- FAIL: TestB (1.20s)\n--- SKIP: TestC (0.00s)\n    x_test.go:9: \
                   measure list10000 median=12ms\nFAIL\n";
        let t = Tally::parse(out);
        assert_eq!(t.passed, 2);
        assert_eq!(t.failed, ["TestB/two", "TestB"]);
        assert_eq!(t.skipped, 1);
        assert_eq!(t.measures, ["measure list10000 median=12ms"]);
        assert_eq!(Tally::parse(""), Tally::default());
    }
}
