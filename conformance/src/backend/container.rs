//! etcd 3.5.1 in a container of the locally imported image `local/etcd:3.5.1` (built by
//! `ci/docker-image.sh start`), run through testcontainers.
//!
//! No registry is reachable, so nothing is pulled: the image must exist. testcontainers-rs starts no Ryuk
//! reaper; every container is removed explicitly by [`EtcdContainer::remove`] (and by testcontainers' drop
//! guard if a run panics). The container uses the host's network namespace and binds 127.0.0.1 only.

use std::time::Duration;

use testcontainers::core::WaitFor;
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use loopback::free_port;

pub const IMAGE: &str = "local/etcd";
pub const TAG: &str = "3.5.1";
/// The socket `ci/docker-image.sh` gives its dockerd.
pub const SCRIPT_SOCKET: &str = "/tmp/etcd-conformance-docker/docker.sock";
const HOW: &str = "run `eval \"$(ci/docker-image.sh start)\"` (it sets DOCKER_HOST)";

/// Why the testcontainers backend cannot run here, or `None` when it can.
pub async fn unavailable() -> Option<String> {
    let host = match std::env::var("DOCKER_HOST") {
        Ok(h) => h,
        Err(_) if std::path::Path::new(SCRIPT_SOCKET).exists() => {
            return Some(format!(
                "DOCKER_HOST is not set (a dockerd of ci/docker-image.sh listens on {SCRIPT_SOCKET}); {HOW}"
            ));
        }
        Err(_) => return Some(format!("DOCKER_HOST is not set and no dockerd runs; {HOW}")),
    };
    let out = tokio::process::Command::new("docker")
        .args([
            "image",
            "inspect",
            "--format",
            "{{.Id}}",
            &format!("{IMAGE}:{TAG}"),
        ])
        .output()
        .await;
    match out {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "image {IMAGE}:{TAG} not found on DOCKER_HOST={host} ({}); {HOW}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("cannot run the docker CLI ({e}); {HOW}")),
    }
}

/// A running etcd container.
pub struct EtcdContainer {
    client_port: u16,
    container: ContainerAsync<GenericImage>,
}

impl EtcdContainer {
    pub async fn start() -> Result<Self, String> {
        let (client_port, peer_port) = (free_port(), free_port());
        let client = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let container = GenericImage::new(IMAGE, TAG)
            .with_wait_for(WaitFor::message_on_stderr("ready to serve client requests"))
            .with_network("host")
            .with_startup_timeout(Duration::from_secs(60))
            .with_cmd([
                "etcd".to_string(),
                "--name=conformance".into(),
                "--data-dir=/var/lib/etcd/data".into(),
                format!("--listen-client-urls={client}"),
                format!("--advertise-client-urls={client}"),
                format!("--listen-peer-urls={peer}"),
                format!("--initial-advertise-peer-urls={peer}"),
                format!("--initial-cluster=conformance={peer}"),
                "--initial-cluster-state=new".into(),
                format!("--initial-cluster-token=conformance-{client_port}"),
                "--logger=zap".into(),
                "--log-outputs=stderr".into(),
            ])
            .start()
            .await
            .map_err(|e| format!("start {IMAGE}:{TAG} with testcontainers: {e}"))?;
        Ok(Self {
            client_port,
            container,
        })
    }

    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    pub async fn log_tail(&self, n: usize) -> String {
        let bytes = self.container.stderr_to_vec().await.unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    pub async fn remove(self) {
        if let Err(e) = self.container.rm().await {
            eprintln!("conformance: removing an etcd container failed: {e}");
        }
    }
}
