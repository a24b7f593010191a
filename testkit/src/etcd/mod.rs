//! Real etcd: which versions exist and where ([`version`]), clusters of member processes ([`cluster`]),
//! containers ([`container`]), and [`Etcd`], one member from either backend, for suites that run on both.

pub mod cluster;
pub mod container;
pub mod version;

use std::fmt;

pub use cluster::EtcdCluster;
pub use container::EtcdContainer;
pub use version::{Binaries, Version};

/// Where an etcd runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Backend {
    /// A child process on loopback ports.
    Process,
    /// A container of a locally imported image, through testcontainers.
    Container,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Process => "process",
            Backend::Container => "testcontainers",
        })
    }
}

/// A backend and version, with the binaries (etcdctl comes from the host in both backends) or why it cannot run.
#[derive(Clone, Debug)]
pub struct Spec {
    pub backend: Backend,
    pub version: Version,
    pub binaries: Result<Binaries, String>,
}

impl Spec {
    pub fn label(&self) -> String {
        format!("{} etcd {}", self.backend, self.version)
    }

    /// Why it cannot run here, if it cannot.
    pub fn missing(&self) -> Option<&str> {
        self.binaries.as_ref().err().map(String::as_str)
    }
}

/// Every backend and version the kit knows: each version as a process, and as a container where an image is built.
pub async fn discover() -> Vec<Spec> {
    let mut specs = Vec::new();
    for version in Version::ALL {
        specs.push(Spec {
            backend: Backend::Process,
            version,
            binaries: version.binaries(),
        });
    }
    for version in container::VERSIONS {
        let binaries = match (version.binaries(), container::unavailable(version).await) {
            (Ok(b), None) => Ok(b),
            (Err(e), _) | (Ok(_), Some(e)) => Err(e),
        };
        specs.push(Spec {
            backend: Backend::Container,
            version,
            binaries,
        });
    }
    specs
}

/// A running single-member etcd of either backend, on a loopback client endpoint.
pub enum Etcd {
    Process(Box<EtcdCluster>),
    Container(Box<EtcdContainer>),
}

impl Etcd {
    /// Starts one member as `spec` says, with `extra_args` etcd flags, and waits until it is healthy.
    pub async fn start(spec: &Spec, extra_args: &[&str]) -> Result<Etcd, String> {
        let binaries = spec.binaries.as_ref().map_err(Clone::clone)?;
        let etcd = match spec.backend {
            Backend::Process => {
                Etcd::Process(Box::new(EtcdCluster::start(binaries, 1, extra_args).await?))
            }
            Backend::Container => Etcd::Container(Box::new(
                EtcdContainer::start(spec.version, extra_args).await?,
            )),
        };
        etcd.wait_ready(binaries).await?;
        Ok(etcd)
    }

    /// `127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        match self {
            Etcd::Process(c) => c.endpoint(0),
            Etcd::Container(c) => c.endpoint(),
        }
    }

    /// Stops it and removes its data (containers explicitly, so nothing is left for a reaper).
    pub async fn stop(self) {
        match self {
            Etcd::Process(c) => drop(c),
            Etcd::Container(c) => c.remove().await,
        }
    }

    /// The end of its log, for failure reports.
    pub async fn log_tail(&self) -> String {
        match self {
            Etcd::Process(c) => c.log_tail(0, 30),
            Etcd::Container(c) => c.log_tail(30).await,
        }
    }

    /// Polls `etcdctl endpoint health` (a linearizable read through raft) until it succeeds, within a deadline:
    /// a container's "ready to serve" line comes before its first election settles.
    async fn wait_ready(&self, binaries: &Binaries) -> Result<(), String> {
        let ctl = binaries.etcdctl(&self.endpoint());
        let res = crate::try_wait_for(std::time::Duration::from_secs(60), || {
            let ctl = ctl.clone();
            async move {
                let out = ctl
                    .run(&["endpoint", "health", "--command-timeout=2s"], None)
                    .await;
                if out.success() {
                    Ok(())
                } else {
                    Err(format!("{}{}", out.stdout, out.stderr))
                }
            }
        })
        .await;
        match res {
            Ok(()) => Ok(()),
            Err(last) => Err(format!(
                "etcd at {} not healthy within 60s: {last}\nlog:\n{}",
                self.endpoint(),
                self.log_tail().await
            )),
        }
    }
}
