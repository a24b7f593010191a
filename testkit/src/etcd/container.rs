//! etcd in a container of a locally imported image `local/etcd:<version>` (built by `ci/docker-image.sh start`
//! for 3.5.1, 3.5.30 and the newest version), run through testcontainers.
//!
//! No registry is reachable, so nothing is pulled: the image must exist. testcontainers-rs starts no Ryuk reaper
//! here; every container is removed explicitly by [`EtcdContainer::remove`] (and by testcontainers' drop guard if
//! a run panics). The container uses the host's network namespace and binds 127.0.0.1 only. With TLS, etcd's
//! certificate, key and trusted CA are bind-mounted read-only from this machine's files under [`TLS_DIR`].

use std::time::Duration;

use std::path::Path;

use testcontainers::core::{AccessMode, Mount, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use super::{EtcdTls, Version};
use crate::free_port;

pub const IMAGE: &str = "local/etcd";
/// The socket `ci/docker-image.sh` gives its dockerd.
pub const SCRIPT_SOCKET: &str = "/tmp/etcd-conformance-docker/docker.sock";
const HOW: &str = "run `eval \"$(ci/docker-image.sh start)\"` (it sets DOCKER_HOST)";

/// Where a TLS container finds etcd's certificate (`cert.pem`), key (`key.pem`) and trusted CA (`ca.pem`).
pub const TLS_DIR: &str = "/etc/etcd-tls";

/// The versions `ci/docker-image.sh` imports an image of.
pub const VERSIONS: [Version; 3] = [Version::V3_5_1, Version::V3_5_30, Version::NEWEST];

/// Why a container of `version` cannot run here, or `None` when it can.
pub async fn unavailable(version: Version) -> Option<String> {
    if !VERSIONS.contains(&version) {
        return Some(format!(
            "no image of etcd {version} is built (only {VERSIONS:?})"
        ));
    }
    let host = match std::env::var("DOCKER_HOST") {
        Ok(h) => h,
        Err(_) if std::path::Path::new(SCRIPT_SOCKET).exists() => {
            return Some(format!(
                "DOCKER_HOST is not set (a dockerd of ci/docker-image.sh listens on {SCRIPT_SOCKET}); {HOW}"
            ));
        }
        Err(_) => return Some(format!("DOCKER_HOST is not set and no dockerd runs; {HOW}")),
    };
    let image = format!("{IMAGE}:{version}");
    let out = tokio::process::Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", &image])
        .output()
        .await;
    match out {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "image {image} not found on DOCKER_HOST={host} ({}); {HOW}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("cannot run the docker CLI ({e}); {HOW}")),
    }
}

/// A running etcd container.
pub struct EtcdContainer {
    client_port: u16,
    tls: Option<EtcdTls>,
    container: ContainerAsync<GenericImage>,
}

impl EtcdContainer {
    /// Starts a one-member etcd of `version` with `extra_args`, and waits until it says it is ready to serve.
    pub async fn start(version: Version, extra_args: &[&str]) -> Result<Self, String> {
        Self::start_with(version, extra_args, None).await
    }

    /// Like [`EtcdContainer::start`], with TLS on its client URL as `tls` says (the files mounted into it).
    pub async fn start_with(
        version: Version,
        extra_args: &[&str],
        tls: Option<&EtcdTls>,
    ) -> Result<Self, String> {
        let (client_port, peer_port) = (free_port(), free_port());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let mut cmd = vec![
            "etcd".to_string(),
            "--name=m0".into(),
            "--data-dir=/var/lib/etcd/data".into(),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster=m0={peer}"),
            "--initial-cluster-state=new".into(),
            format!("--initial-cluster-token=testkit-{client_port}"),
            "--logger=zap".into(),
            "--log-outputs=stderr".into(),
        ];
        let dir = Path::new(TLS_DIR);
        let mut mounts = Vec::new();
        if let Some(tls) = tls {
            let (cert, key, ca) = (
                dir.join("cert.pem"),
                dir.join("key.pem"),
                dir.join("ca.pem"),
            );
            cmd.extend(tls.flags(&cert, &key, &ca));
            for (host, inside) in [
                (&tls.server.cert, &cert),
                (&tls.server.key, &key),
                (&tls.server.ca, &ca),
            ] {
                mounts.push(
                    Mount::bind_mount(host.display().to_string(), inside.display().to_string())
                        .with_access_mode(AccessMode::ReadOnly),
                );
            }
        }
        cmd.extend(extra_args.iter().map(|a| a.to_string()));
        let mut image = GenericImage::new(IMAGE, version.name())
            .with_wait_for(WaitFor::message_on_stderr("ready to serve client requests"))
            .with_network("host")
            .with_startup_timeout(Duration::from_secs(60))
            .with_cmd(cmd);
        for mount in mounts {
            image = image.with_mount(mount);
        }
        let container = image
            .start()
            .await
            .map_err(|e| format!("start {IMAGE}:{version} with testcontainers: {e}"))?;
        Ok(Self {
            client_port,
            tls: tls.cloned(),
            container,
        })
    }

    /// Its client endpoint as clients are given it: `127.0.0.1:PORT`, or `https://127.0.0.1:PORT` with TLS.
    pub fn endpoint(&self) -> String {
        match self.tls {
            None => self.addr(),
            Some(_) => format!("https://{}", self.addr()),
        }
    }

    /// `127.0.0.1:PORT`, without a scheme.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The TLS its client URL uses, if any.
    pub fn tls(&self) -> Option<&EtcdTls> {
        self.tls.as_ref()
    }

    pub async fn log_tail(&self, n: usize) -> String {
        let bytes = self.container.stderr_to_vec().await.unwrap_or_default();
        crate::dirs::last_lines(&String::from_utf8_lossy(&bytes), n)
    }

    /// Stops and removes the container, so nothing is left for a reaper.
    pub async fn remove(self) {
        if let Err(e) = self.container.rm().await {
            eprintln!("testkit: removing an etcd container failed: {e}");
        }
    }
}
