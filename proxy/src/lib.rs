//! etcd-grpc-proxy: a drop-in replacement for `etcd grpc-proxy start`.
//!
//! Data flows one way: listener (TLS) → services → upstream → (TLS) etcd, and back.
//!
//! - [`net`]: the `Net` seam, the only code that touches sockets (`TokioNet` in production).
//! - [`workers`]: `--worker-threads`: the workers client connections are spread over (one single-threaded
//!   runtime each in the binary); a call goes to etcd on its worker's own connection.
//! - [`server`]: one listener for gRPC and the HTTP admin routes (and `--metrics-addr`'s, admin routes only), per-RPC
//!   metrics, graceful shutdown.
//! - [`tls`]: TLS towards clients and towards etcd, above the `Net` seam; every file re-read for new connections.
//! - [`gateway`]: etcd's HTTP/JSON gateway (`POST /v3/...`) on the client port: each call served as the gRPC call
//!   it names, its answer written as JSON in the form of the etcd version behind.
//! - [`rpc`]: every gRPC method by path: relayed as bytes (one forwarding path for every unary call and server
//!   stream), RangeStream served from Range for an etcd before 3.7, Watch and LeaseKeepAlive to their coalescers.
//! - [`cache`]: Range calls answered from copies of ranges a watch keeps current: serializable reads once a copy
//!   is at the newest revision returned, linearizable ones once it is at etcd's revision learnt after they arrived;
//!   a copy that keeps failing to answer is retired, and its range rests; a cache whose copies answer next to
//!   nothing sleeps, every read going to etcd as with the cache off.
//! - [`leasing`]: `--experimental-leasing-prefix`: etcd's leasing protocol; reads of owned keys answered locally.
//! - [`watch`]: client watchers coalesced onto shared upstream watchers (one upstream stream per caller token).
//! - [`lease`]: keep-alive streams coalesced: one upstream stream per caller token (one in all without auth).
//! - [`cluster`]: MemberList answered with etcd's members reached at the proxies; registration under
//!   `--resolver-prefix`.
//! - [`namespace`]: `--namespace`: every key clients send gets the prefix, every key they receive loses it.
//! - [`wire`]: reads and edits the protobuf wire format field by field, without decoding whole messages.
//! - [`upstream`]: the etcd endpoints, the active one, failover, probing, and the retry policy of every call.
//! - [`error`]: what status a client sees and what an upstream failure means.
//! - [`health`], [`metrics`]: `/health` and `/proxy/health`, and the Prometheus registry of one running proxy
//!   (`/proxy/metrics`; `/metrics` relays etcd's, see [`server`]).
//! - [`otel`]: `--enable-distributed-tracing`: the proxy's own spans (server and client side of each call), exported
//!   over OTLP/gRPC; clients' trace context travels upstream either way (`upstream::Forwarded`).
//! - [`logging`]: `--log-level`, `--log-outputs`: JSON lines with the field names of etcd's zap logger.
//! - [`profiling`]: `--enable-pprof`'s `/debug/pprof/` (CPU profiles in pprof's format, runtime counts).
//! - `fuzzing` (with the `fuzzing` feature): entry points for the fuzz targets of `fuzz/` (`cargo fuzz`).
//! - [`config`], [`cli`]: etcd's flags → [`Config`] (and `--discovery-srv`'s DNS lookup, `cli::srv`). `main.rs` only
//!   parses, logs, looks up SRV records, serves a [`BoundProxy`] and tells systemd when it serves and stops
//!   (`systemd.rs`, beside `main.rs`).
//!
//! Rules that keep the proxy simulable: sockets only through [`net::Net`], time only through `tokio::time`,
//! randomness only from the seed in [`Config`].

pub mod cache;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod gateway;
pub mod health;
pub mod lease;
pub mod leasing;
pub mod logging;
pub mod metrics;
pub mod namespace;
pub mod net;
pub mod otel;
pub mod profiling;
pub mod rpc;
pub mod server;
pub mod tls;
pub mod upstream;
pub mod watch;
pub mod wire;
pub mod workers;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

pub use config::{Config, Endpoint};

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot register metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    #[error("{0}")]
    Tls(#[from] tls::TlsError),
}

/// A proxy whose listener is bound but which does not serve yet; lets callers learn the port before serving.
pub struct BoundProxy {
    config: Config,
    listener: Box<dyn net::Listener>,
    /// `--metrics-addr`'s listener.
    metrics_listener: Option<Box<dyn net::Listener>>,
    server_tls: Option<Arc<tls::ServerTls>>,
    upstream_tls: Option<Arc<tls::ClientTls>>,
    net: Arc<dyn net::Net>,
    local_addr: SocketAddr,
}

impl BoundProxy {
    /// Loads the TLS files and binds `config.listen_addr` (and `--metrics-addr`) through `net`.
    pub async fn bind(config: Config, net: Arc<dyn net::Net>) -> Result<Self, StartError> {
        let server_tls = match &config.server_tls {
            Some(settings) => Some(Arc::new(tls::ServerTls::new(settings)?)),
            None => None,
        };
        let upstream_tls = match &config.upstream_tls {
            Some(settings) => Some(Arc::new(tls::ClientTls::new(settings)?)),
            None => None,
        };
        let (listener, local_addr) = bind(&*net, config.listen_addr).await?;
        let metrics_listener = match config.metrics_listen {
            Some(metrics) => Some(bind(&*net, metrics.addr).await?.0),
            None => None,
        };
        Ok(Self {
            config,
            listener,
            metrics_listener,
            server_tls,
            upstream_tls,
            net,
            local_addr,
        })
    }

    /// The address clients connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serves until `shutdown` completes, then shuts down gracefully.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<(), StartError> {
        self.serve_telling(shutdown, || {}).await
    }

    /// [`BoundProxy::serve`], calling `ready` once the proxy serves: everything it serves with is set up and its
    /// listeners are bound, so a client that connects from then on is answered. Its `config.workers` workers all
    /// run on the caller's runtime.
    pub async fn serve_telling(
        self,
        shutdown: impl Future<Output = ()>,
        ready: impl FnOnce(),
    ) -> Result<(), StartError> {
        let workers = workers::Workers::on_current(self.config.workers);
        self.serve_on(workers, shutdown, ready).await
    }

    /// [`BoundProxy::serve_telling`] with client connections served on `workers` (the binary: one runtime per
    /// thread); the proxy's own tasks run on the caller's runtime.
    pub async fn serve_on(
        self,
        workers: workers::Workers,
        shutdown: impl Future<Output = ()>,
        ready: impl FnOnce(),
    ) -> Result<(), StartError> {
        let metrics = metrics::Metrics::new(prometheus::Registry::new())?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let upstream = upstream::Upstream::new(
            &self.config,
            self.net.clone(),
            self.upstream_tls,
            metrics.clone(),
            stop_rx.clone(),
            &workers,
        );
        let tracer = upstream.tracer().cloned();
        let rpc = rpc::Rpc::new(&upstream, &metrics, &self.config);
        if let Some(every) = self.config.endpoints_auto_sync {
            // As the proxy's user, if it has one: etcd 3.5.30 lists its members only to a caller with a token.
            tokio::spawn(upstream.clone().auto_sync(every, rpc.identity().cloned()));
        }
        let registration = self
            .config
            .advertise
            .as_ref()
            .zip(self.config.resolver.as_ref())
            .map(|(advertise, resolver)| {
                let prefix = [self.config.namespace.as_slice(), &resolver.prefix].concat();
                cluster::registration::Registration::start(cluster::registration::Registrar {
                    upstream: upstream.clone(),
                    lease: rpc.lease().clone(),
                    identity: rpc.identity().cloned(),
                    key: cluster::entry::key(&prefix, &advertise.url),
                    value: cluster::entry::value(&advertise.url, &advertise.name),
                    ttl: resolver.ttl,
                })
            });
        let gateway = gateway::Gateway::new(
            upstream.clone(),
            self.config.max_recv_bytes.min(self.config.max_send_bytes),
        );
        let app = Arc::new(server::App {
            rpc,
            upstream,
            limits: server::Limits::new(&self.config, metrics.clone()),
            metrics,
            own_health: health::OwnHealth::new(
                self.net.clone(),
                self.local_addr,
                self.server_tls.clone(),
            ),
            pprof: self.config.enable_pprof,
            grpc_logging: self.config.grpc_logging,
            gateway,
            workers,
        });
        if let Some(listener) = self.metrics_listener {
            let metrics_port = server::Port {
                listener,
                tls: self
                    .server_tls
                    .clone()
                    .filter(|_| self.config.metrics_listen.is_some_and(|m| m.tls)),
                routes: server::Routes::AdminOnly,
            };
            let (app, config, stop_rx) = (app.clone(), self.config.clone(), stop_rx.clone());
            tokio::spawn(async move { server::serve(metrics_port, app, &config, stop_rx).await });
        }
        tracing::info!(address = %self.local_addr, tls = self.server_tls.is_some(), "started gRPC proxy");
        let main_port = server::Port {
            listener: self.listener,
            tls: self.server_tls,
            routes: server::Routes::All,
        };
        let serving = server::serve(main_port, app, &self.config, stop_rx);
        tokio::pin!(serving);
        ready();
        tokio::select! {
            biased;
            _ = &mut serving => {}
            _ = shutdown => {
                tracing::info!("shutting down");
                // Deregister first, while clients are still served: a client that resolves the fleet now must
                // not find a proxy about to stop.
                if let Some(registration) = registration {
                    registration.stop().await;
                }
                let _ = stop_tx.send(true);
                serving.await;
            }
        }
        if let Some(tracer) = tracer {
            // The last calls' spans, which would otherwise wait for their batch's delay past the proxy's exit.
            tracer.flush().await;
        }
        Ok(())
    }
}

async fn bind(
    net: &dyn net::Net,
    addr: SocketAddr,
) -> Result<(Box<dyn net::Listener>, SocketAddr), StartError> {
    let listener = net
        .bind(addr)
        .await
        .map_err(|source| StartError::Listen { addr, source })?;
    let local_addr = listener
        .local_addr()
        .map_err(|source| StartError::Listen { addr, source })?;
    Ok((listener, local_addr))
}

/// The whole proxy: binds, serves until `shutdown` completes, then shuts down gracefully.
pub async fn run(
    config: Config,
    net: Arc<dyn net::Net>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    BoundProxy::bind(config, net).await?.serve(shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    /// Callers (the binary, tests, the simulation) spawn the proxy on a multi-threaded runtime.
    #[test]
    fn the_whole_proxy_is_a_send_future() {
        let config = Config::new(
            vec![Endpoint::parse("127.0.0.1:2379").unwrap()],
            ([127, 0, 0, 1], 0).into(),
            1,
        );
        let running = run(config, Arc::new(net::TokioNet), std::future::pending());
        assert_send(&running);
    }
}
