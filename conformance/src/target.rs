//! The things a scenario runs against: `direct` (etcd itself), `proxy` (this project's proxy binary in front of that
//! etcd, once per flag profile; under `chain` a second one in front of the first), `container` (the proxy run from
//! its container image, under the `container` and `container-tls` profiles) and `model` (the
//! simulation's model etcd served over loopback TCP, in this process). etcd and the proxy are started for a profile
//! by [`crate::profile::Setup`].

use std::fmt;
use std::net::SocketAddr;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TargetKind {
    Direct,
    Proxy,
    /// The proxy run from its container image.
    Container,
    Model,
}

impl fmt::Display for TargetKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TargetKind::Direct => "direct",
            TargetKind::Proxy => "proxy",
            TargetKind::Container => "container",
            TargetKind::Model => "model",
        })
    }
}

/// A server task of this process (the model) with a shutdown signal. Dropping it signals
/// shutdown; [`Served::stop`] also waits for the task to end.
pub struct Served {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Served {
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(15), task).await;
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Serves a fresh one-member model etcd of the simulation (`sim::model`) on a free loopback port, through
/// `proxy::net::TokioNet`, on a thread of its own with its own runtime. The seed fixes its IDs; it follows etcd
/// `version`'s rules where versions differ (the version of the etcd it is compared with).
pub async fn start_model(seed: u64, version: testkit::Version) -> Result<Served, String> {
    use proxy::net::Net as _;
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (addr_tx, addr_rx) = oneshot::channel::<Result<SocketAddr, String>>();
    let (done_tx, done_rx) = oneshot::channel::<()>();
    std::thread::Builder::new()
        .name("conformance-model".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = addr_tx.send(Err(format!("model runtime: {e}")));
                    return;
                }
            };
            runtime.block_on(async move {
                let listen: SocketAddr = ([127, 0, 0, 1], 0).into();
                let listener = match proxy::net::TokioNet.bind(listen).await {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = addr_tx.send(Err(format!("bind the model: {e}")));
                        return;
                    }
                };
                let addr = match listener.local_addr() {
                    Ok(a) => a,
                    Err(e) => {
                        let _ = addr_tx.send(Err(format!("model address: {e}")));
                        return;
                    }
                };
                let cluster = sim::model::Cluster::new(1, seed);
                cluster.imitate(version.name());
                cluster.set_client_urls(0, vec![format!("http://{addr}")]);
                let _ = addr_tx.send(Ok(addr));
                let shutdown = async {
                    let _ = stop_rx.await;
                };
                if let Err(e) = sim::model::serve(cluster, 0, listener, shutdown).await {
                    eprintln!("conformance: the model at {addr} stopped with an error: {e}");
                }
            });
            let _ = done_tx.send(());
        })
        .map_err(|e| format!("model thread: {e}"))?;
    let addr = addr_rx
        .await
        .map_err(|_| "the model thread ended early".to_string())??;
    let task = tokio::spawn(async move {
        let _ = done_rx.await;
    });
    Ok(Served {
        addr,
        stop: Some(stop_tx),
        task: Some(task),
    })
}
