//! Real etcd: which versions exist and where ([`version`]), clusters of member processes ([`cluster`]),
//! containers ([`container`]), and [`Etcd`], one member from either backend, for suites that run on both. Either
//! serves its clients in the clear or over TLS ([`EtcdTls`]).

pub mod cluster;
pub mod container;
pub mod version;

use std::fmt;
use std::path::Path;

pub use cluster::EtcdCluster;
pub use container::EtcdContainer;
pub use version::{Binaries, Version};

use crate::pki::TlsPaths;

/// TLS on etcd's client URLs (its peer URLs stay in the clear): `https://` listeners with etcd's own certificate,
/// and with `client_cert_auth` every client (`/health` included) must present a certificate `server.ca` signed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdTls {
    /// etcd's `--cert-file` and `--key-file`, and as `ca` its `--trusted-ca-file`: what client certificates are
    /// checked against.
    pub server: TlsPaths,
    /// `--client-cert-auth`. etcd then takes a client certificate's Common Name as the user of a request without
    /// a token.
    pub client_cert_auth: bool,
    /// What the kit presents to it (readiness checks, [`EtcdCluster::etcdctl`], [`Etcd::etcdctl`]): the CA that
    /// signed etcd's certificate, and a client certificate.
    pub client: TlsPaths,
}

impl EtcdTls {
    /// The etcd flags that turn it on, naming the files by `cert`, `key` and `ca` (paths as etcd sees them).
    fn flags(&self, cert: &Path, key: &Path, ca: &Path) -> Vec<String> {
        let mut flags = vec![
            format!("--cert-file={}", cert.display()),
            format!("--key-file={}", key.display()),
            format!("--trusted-ca-file={}", ca.display()),
        ];
        if self.client_cert_auth {
            flags.push("--client-cert-auth".into());
        }
        flags
    }

    /// Its flags for an etcd process of this machine.
    pub fn process_flags(&self) -> Vec<String> {
        self.flags(&self.server.cert, &self.server.key, &self.server.ca)
    }
}

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

/// Every backend and version the kit knows (of the versions [`Version::selected`] picks): each version as a process,
/// and as a container where an image is built.
pub async fn discover() -> Vec<Spec> {
    let versions = Version::selected();
    let mut specs = Vec::new();
    for version in versions.iter().copied() {
        specs.push(Spec {
            backend: Backend::Process,
            version,
            binaries: version.binaries(),
        });
    }
    for version in container::VERSIONS
        .into_iter()
        .filter(|v| versions.contains(v))
    {
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
        Etcd::start_with(spec, extra_args, None).await
    }

    /// Like [`Etcd::start`], with TLS on its client URL as `tls` says.
    pub async fn start_tls(
        spec: &Spec,
        extra_args: &[&str],
        tls: &EtcdTls,
    ) -> Result<Etcd, String> {
        Etcd::start_with(spec, extra_args, Some(tls)).await
    }

    /// [`Etcd::start`] in the clear (`tls` is `None`) or [`Etcd::start_tls`].
    pub async fn start_with(
        spec: &Spec,
        extra_args: &[&str],
        tls: Option<&EtcdTls>,
    ) -> Result<Etcd, String> {
        let binaries = spec.binaries.as_ref().map_err(Clone::clone)?;
        let etcd = match spec.backend {
            Backend::Process => Etcd::Process(Box::new(
                EtcdCluster::start_with(binaries, 1, extra_args, tls.cloned()).await?,
            )),
            Backend::Container => Etcd::Container(Box::new(
                EtcdContainer::start_with(spec.version, extra_args, tls).await?,
            )),
        };
        etcd.wait_ready(binaries).await?;
        Ok(etcd)
    }

    /// Its client endpoint as clients are given it: `127.0.0.1:PORT`, or `https://127.0.0.1:PORT` with TLS.
    pub fn endpoint(&self) -> String {
        match self {
            Etcd::Process(c) => c.endpoint(0),
            Etcd::Container(c) => c.endpoint(),
        }
    }

    /// `127.0.0.1:PORT`, without a scheme (for sockets).
    pub fn addr(&self) -> String {
        match self {
            Etcd::Process(c) => c.addr(0),
            Etcd::Container(c) => c.addr(),
        }
    }

    /// The TLS its client URL uses, if any.
    pub fn tls(&self) -> Option<&EtcdTls> {
        match self {
            Etcd::Process(c) => c.tls(),
            Etcd::Container(c) => c.tls(),
        }
    }

    /// `binaries`' etcdctl talking to it (with TLS: presenting the kit's client certificate, [`EtcdTls::client`]).
    pub fn etcdctl(&self, binaries: &Binaries) -> crate::Etcdctl {
        let ctl = binaries.etcdctl(&self.endpoint());
        match self.tls() {
            None => ctl,
            Some(tls) => ctl.with_tls(&tls.client),
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
        let ctl = self.etcdctl(binaries);
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
