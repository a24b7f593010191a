//! Every etcd RPC a client makes enters here and is served by its route ([`methods`]): one forwarding path for
//! every unary method and every server stream, messages relayed as bytes; RangeStream relayed or
//! served from Range ([`range_stream`]); Watch and LeaseKeepAlive handed to their coalescers.
//!
//! - [`methods`]: etcd 3.7.1's methods by path, and whether a call may be repeated on another endpoint.
//! - [`range_stream`]: RangeStream for an etcd that does not serve it (before 3.7).

pub mod methods;
pub mod range_stream;

use std::sync::Arc;

use bytes::Bytes;
use http::uri::PathAndQuery;
use tonic::body::Body;
use tonic::server::Grpc;
use tonic::{Request, Streaming};
use tonic_prost::ProstCodec;

use crate::cache::Cache;
use crate::cluster::members::Members;
use crate::config::Config;
use crate::lease::LeaseService;
use crate::leasing::{KvCall, Leasing};
use crate::metrics::Metrics;
use crate::namespace::{CallKeys, Namespace};
use crate::upstream::codec::RawCodec;
use crate::upstream::identity::Identity;
use crate::upstream::{Retry, Upstream};
use crate::watch::WatchService;
use methods::Route;
use prost::Message;
use proto::etcdserverpb::{LeaseKeepAliveRequest, MemberListRequest, WatchRequest};

/// What serves the gRPC calls of one running proxy.
pub struct Rpc {
    upstream: Arc<Upstream>,
    watch: Arc<WatchService>,
    lease: Arc<LeaseService>,
    /// MemberList's answer, with `--advertise-client-url`.
    members: Option<Arc<Members>>,
    /// The proxy's own etcd identity (`--user`).
    identity: Option<Arc<Identity>>,
    /// `--namespace`, when given.
    namespace: Option<Arc<Namespace>>,
    /// The range cache, unless `--range-cache-max-bytes` is 0.
    cache: Option<Arc<Cache>>,
    /// The leasing protocol, with `--experimental-leasing-prefix`: KV Range, Put, DeleteRange and Txn go through it.
    leasing: Option<Arc<Leasing>>,
    /// Largest message the proxy accepts from a client: `--max-recv-bytes`, at most `--max-send-bytes`.
    max_recv_bytes: usize,
}

impl Rpc {
    pub fn new(upstream: &Arc<Upstream>, metrics: &Metrics, config: &Config) -> Self {
        let watch_config = crate::watch::hub::HubConfig {
            max_join_lag: config.watch_max_join_lag,
            // etcd fragments at its --max-request-bytes plus its 512 KiB gRPC allowance; --max-send-bytes plays
            // the part of --max-request-bytes here (same default, 1.5 MiB).
            fragment_limit: config.max_send_bytes + 512 * 1024,
            own_identity: config.user.is_some(),
            hidden_prefix: config.namespace.len(),
        };
        let identity = config
            .user
            .clone()
            .map(|credentials| Identity::new(credentials, metrics.clone()));
        let namespace = Namespace::new(&config.namespace).map(Arc::new);
        let members = config.advertise.clone().map(|advertise| {
            // Registrations live inside the namespace, as etcd's Go proxy writes them through its namespaced client.
            let registrations = config
                .resolver
                .as_ref()
                .map(|resolver| [config.namespace.as_slice(), &resolver.prefix].concat());
            Arc::new(Members::new(
                upstream.clone(),
                advertise,
                registrations,
                identity.clone(),
            ))
        });
        let lease = Arc::new(LeaseService::new(upstream.clone(), metrics.clone()));
        let cache = Cache::new(
            upstream,
            metrics,
            config.range_cache_max_bytes,
            watch_config,
            identity.clone(),
        );
        let leasing = Leasing::new(
            upstream,
            metrics,
            config,
            lease.clone(),
            identity.clone(),
            watch_config,
            cache.clone(),
        );
        Self {
            upstream: upstream.clone(),
            watch: Arc::new(WatchService::new(
                upstream.clone(),
                metrics.clone(),
                watch_config,
                config.watch_buffer_size,
                identity.clone(),
                namespace.clone(),
            )),
            lease,
            cache,
            leasing,
            members,
            identity,
            namespace,
            // Whatever a client sends is sent on to etcd, so nothing larger than --max-send-bytes can be served:
            // refusing it by its length prefix, before its bytes are read, keeps such requests from costing memory.
            max_recv_bytes: config.max_recv_bytes.min(config.max_send_bytes),
        }
    }

    /// Serves one gRPC call: a client's (hyper's `Incoming` body) or one the JSON gateway makes in-process.
    pub async fn serve<B>(&self, request: http::Request<B>) -> http::Response<Body>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    {
        let path = request
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let Some(route) = methods::route(path.path()) else {
            return methods::unknown(path.path()).into_http();
        };
        let upstream = self.upstream.clone();
        let keys = CallKeys::of(self.namespace.as_ref(), path.path());
        if let (Some(leasing), Some(call)) = (&self.leasing, KvCall::of(path.path())) {
            let leasing = leasing.clone();
            let serve = tower::service_fn(move |request: Request<Bytes>| {
                let (leasing, path, keys) = (leasing.clone(), path.clone(), keys.clone());
                async move {
                    let request = keys.request(request)?;
                    // How the call is retried should it go to etcd as it is.
                    let as_is = match route {
                        Route::Unary(repeat) => repeat.retry(request.get_ref())?,
                        _ => Retry::ReadOnly,
                    };
                    keys.answer(leasing.serve(call, path, request, as_is).await?)
                }
            });
            return self.limited(RawCodec).unary(serve, request).await;
        }
        let route = match (route, &self.members, &self.cache) {
            (Route::MemberList, None, _) | (Route::Range, _, None) => {
                Route::Unary(methods::Repeat::Read)
            }
            (route, _, _) => route,
        };
        match route {
            Route::OnLeader => {
                let relay = tower::service_fn(move |request: Request<Bytes>| {
                    let (upstream, path) = (upstream.clone(), path.clone());
                    async move { upstream.unary_on_leader(path, request).await }
                });
                self.limited(RawCodec).unary(relay, request).await
            }
            Route::Unary(repeat) => {
                let relay = tower::service_fn(move |request: Request<Bytes>| {
                    let (upstream, path, keys) = (upstream.clone(), path.clone(), keys.clone());
                    async move {
                        let request = keys.request(request)?;
                        let retry = repeat.retry(request.get_ref())?;
                        keys.answer(upstream.unary(retry, path, request).await?)
                    }
                });
                self.limited(RawCodec).unary(relay, request).await
            }
            Route::Range => {
                let cache = self.cache.clone().expect("routed here only when set");
                let serve = tower::service_fn(move |request: Request<Bytes>| {
                    let (cache, path, keys) = (cache.clone(), path.clone(), keys.clone());
                    async move {
                        let request = keys.request(request)?;
                        keys.answer(cache.range(path, request).await?)
                    }
                });
                self.limited(RawCodec).unary(serve, request).await
            }
            Route::ServerStream => {
                let relay = tower::service_fn(move |request: Request<Bytes>| {
                    let (upstream, path, keys) = (upstream.clone(), path.clone(), keys.clone());
                    async move {
                        let request = keys.request(request)?;
                        let answers = upstream.server_stream(path, request).await?;
                        Ok(keys.answers(answers))
                    }
                });
                self.limited(RawCodec)
                    .server_streaming(relay, request)
                    .await
            }
            Route::RangeStream => {
                let serve = tower::service_fn(move |request: Request<Bytes>| {
                    let (upstream, keys) = (upstream.clone(), keys.clone());
                    async move {
                        let request = keys.request(request)?;
                        let answers = range_stream::serve(&upstream, request).await?;
                        Ok(keys.answers(answers))
                    }
                });
                self.limited(RawCodec)
                    .server_streaming(serve, request)
                    .await
            }
            Route::MemberList => {
                let members = self.members.clone().expect("routed here only when set");
                let answer = tower::service_fn(move |request: Request<Bytes>| {
                    let (members, upstream, path) =
                        (members.clone(), upstream.clone(), path.clone());
                    async move {
                        let token = crate::upstream::Forwarded::capture(&request).token();
                        let Ok(asked) = MemberListRequest::decode(request.get_ref().clone()) else {
                            // Bytes the proxy cannot read go to etcd, which answers them as it does.
                            return upstream.unary(Retry::ReadOnly, path, request).await;
                        };
                        let answer = members.answer(asked, token).await?;
                        Ok(tonic::Response::new(Bytes::from(
                            prost::Message::encode_to_vec(&answer),
                        )))
                    }
                });
                self.limited(RawCodec).unary(answer, request).await
            }
            Route::Watch => {
                let watch = self.watch.clone();
                let serve = tower::service_fn(move |request: Request<Streaming<WatchRequest>>| {
                    let watch = watch.clone();
                    async move { watch.watch(request).await }
                });
                self.limited(ProstCodec::default())
                    .streaming(serve, request)
                    .await
            }
            Route::LeaseKeepAlive => {
                let lease = self.lease.clone();
                let serve =
                    tower::service_fn(move |request: Request<Streaming<LeaseKeepAliveRequest>>| {
                        let lease = lease.clone();
                        async move { lease.lease_keep_alive(request).await }
                    });
                self.limited(ProstCodec::default())
                    .streaming(serve, request)
                    .await
            }
        }
    }

    /// The lease keep-alive coalescer (the proxy's own leases renew through it too).
    pub fn lease(&self) -> &Arc<LeaseService> {
        &self.lease
    }

    /// The proxy's own etcd identity (`--user`), if any.
    pub fn identity(&self) -> Option<&Arc<Identity>> {
        self.identity.as_ref()
    }

    /// The server side of a call with the proxy's receive limit on what the client sends; what it sends back
    /// is limited by etcd (and the upstream receive limit), not again here.
    fn limited<C: tonic::codec::Codec>(&self, codec: C) -> Grpc<C> {
        Grpc::new(codec)
            .max_decoding_message_size(self.max_recv_bytes)
            .max_encoding_message_size(usize::MAX)
    }
}
