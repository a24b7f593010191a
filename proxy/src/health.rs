//! The health checks: `/health`, whether the proxy can serve a linearizable read right now, and `/proxy/health`,
//! whether the proxy serves its clients, checked as a client reaches it.
//!
//! `/health`: a Range of key `a` goes through the same upstream path (and failover) as client reads. Answers that
//! prove etcd reached quorum but refused the proxy's anonymous read (permission denied, or no user under auth)
//! count as healthy, as on etcd's proxy.
//!
//! `/proxy/health` ([`OwnHealth`]), as etcd's Go proxy checks itself: the same read, made as a client through the
//! proxy's own listener (its TLS, its limits, its whole serving path), then a watch of key `a` that must be
//! answered within [`WATCH_TIMEOUT`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::watch_client::WatchClient;
use proto::etcdserverpb::{
    RangeRequest, RangeResponse, WatchCreateRequest, WatchRequest, watch_request,
};
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use crate::metrics::Metrics;
use crate::net::{Connector, Net};
use crate::tls::ServerTls;
use crate::tls::own::OwnListener;
use crate::upstream::{Retry, Upstream};

/// How long a health check may take.
pub const HEALTH_TIMEOUT: Duration = Duration::from_secs(1);

/// The outcome of one health check: the HTTP status and the JSON body etcd uses.
#[derive(Debug, PartialEq, Eq)]
pub struct Health {
    pub healthy: bool,
    pub reason: String,
}

impl Health {
    pub fn http_status(&self) -> u16 {
        if self.healthy { 200 } else { 503 }
    }

    pub fn json(&self) -> String {
        format!(
            r#"{{"health":"{}","reason":{}}}"#,
            self.healthy,
            json_string(&self.reason)
        )
    }
}

/// How long `/proxy/health`'s watch may take to be answered (etcd's Go proxy's bound).
pub const WATCH_TIMEOUT: Duration = Duration::from_secs(3);

/// Runs one `/health` check and counts it.
pub async fn check(upstream: &Arc<Upstream>, metrics: &Metrics) -> Health {
    let read = tokio::time::timeout(HEALTH_TIMEOUT, async {
        upstream
            .call::<_, RangeResponse>(Retry::ReadOnly, crate::upstream::path::RANGE, read_of_a())
            .await
    });
    counted(
        metrics,
        judge_read(read.await.map(|answered| answered.map(drop))),
    )
}

/// `/proxy/health`'s client: a connection to the proxy's own listener, made when first needed and kept.
pub struct OwnHealth {
    channel: Channel,
}

impl OwnHealth {
    /// A client of the listener bound at `addr` (a wildcard address is reached on loopback), with the listener's
    /// `tls` if it has any.
    pub fn new(net: Arc<dyn Net>, addr: SocketAddr, tls: Option<Arc<ServerTls>>) -> Self {
        let mut addr = addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let connector = Connector::with_tls(net, tls.map(|tls| Arc::new(OwnListener(tls))));
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("a socket address forms a URI")
            .connect_timeout(HEALTH_TIMEOUT)
            .connect_with_connector_lazy(connector);
        Self { channel }
    }

    /// Runs one `/proxy/health` check and counts it.
    pub async fn check(&self, metrics: &Metrics) -> Health {
        let read = tokio::time::timeout(HEALTH_TIMEOUT, async {
            KvClient::new(self.channel.clone())
                .range(read_of_a())
                .await
                .map(drop)
        });
        let health = judge_read(read.await);
        if !health.healthy {
            return counted(metrics, health);
        }
        // The send side stays open: a watch whose requests end may end with them.
        let create = WatchRequest {
            request_union: Some(watch_request::RequestUnion::CreateRequest(
                WatchCreateRequest {
                    key: b"a".to_vec(),
                    ..Default::default()
                },
            )),
        };
        let requests =
            futures::StreamExt::chain(futures::stream::iter([create]), futures::stream::pending());
        let watched = tokio::time::timeout(WATCH_TIMEOUT, async {
            let mut answers = WatchClient::new(self.channel.clone())
                .watch(requests)
                .await?
                .into_inner();
            answers.message().await
        });
        // Any answer to the create request (created, or refused: under auth, a watch without a token) shows the
        // watch path serving; the stream is dropped, which cancels the watch.
        let health = match watched.await {
            Ok(Ok(Some(_))) => health,
            _ => Health {
                healthy: false,
                reason: "WATCH TIMEOUT".into(),
            },
        };
        counted(metrics, health)
    }
}

/// The read both checks make: key `a`, linearizable, within [`HEALTH_TIMEOUT`].
fn read_of_a() -> Request<RangeRequest> {
    let mut request = Request::new(RangeRequest {
        key: b"a".to_vec(),
        ..Default::default()
    });
    request.set_timeout(HEALTH_TIMEOUT);
    request
}

/// What the read's outcome says (`Err(_)`: it took longer than [`HEALTH_TIMEOUT`]).
fn judge_read(read: Result<Result<(), Status>, tokio::time::error::Elapsed>) -> Health {
    match read {
        Ok(Ok(())) => Health {
            healthy: true,
            reason: String::new(),
        },
        Ok(Err(status)) if refused_but_answered(status.code(), status.message()) => Health {
            healthy: true,
            reason: String::new(),
        },
        Ok(Err(status)) => Health {
            healthy: false,
            reason: format!("GET ERROR:{}", with_causes(&status)),
        },
        Err(_elapsed) => Health {
            healthy: false,
            reason: "GET ERROR:context deadline exceeded".into(),
        },
    }
}

/// A status's message followed by its causes: "transport error" alone (a connection to the proxy's own listener
/// that failed) would not say why.
fn with_causes(status: &Status) -> String {
    let mut text = status.message().to_string();
    let mut cause = std::error::Error::source(status);
    while let Some(err) = cause {
        text.push_str(": ");
        text.push_str(&err.to_string());
        cause = err.source();
    }
    text
}

fn counted(metrics: &Metrics, health: Health) -> Health {
    if health.healthy {
        metrics.health_success.inc()
    } else {
        metrics.health_failures.inc()
    }
    health
}

fn refused_but_answered(code: Code, message: &str) -> bool {
    code == Code::PermissionDenied || message == "etcdserver: user name is empty"
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_match_etcds_format() {
        let ok = Health {
            healthy: true,
            reason: String::new(),
        };
        assert_eq!(
            (ok.http_status(), ok.json()),
            (200, r#"{"health":"true","reason":""}"#.to_string())
        );
        let bad = Health {
            healthy: false,
            reason: "GET ERROR:say \"no\"\n".into(),
        };
        assert_eq!(bad.http_status(), 503);
        assert_eq!(
            bad.json(),
            r#"{"health":"false","reason":"GET ERROR:say \"no\"\u000a"}"#
        );
    }

    #[test]
    fn auth_refusals_prove_a_working_cluster() {
        assert!(refused_but_answered(
            Code::PermissionDenied,
            "etcdserver: permission denied"
        ));
        assert!(refused_but_answered(
            Code::InvalidArgument,
            "etcdserver: user name is empty"
        ));
        assert!(!refused_but_answered(
            Code::Unavailable,
            "etcdserver: no leader"
        ));
    }
}
