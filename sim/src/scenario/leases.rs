//! Lease clients: each grants a lease through the proxy, attaches a key, and keeps the lease alive over a
//! keep-alive stream through the proxy, re-opening the stream when it fails or stops answering. One client may
//! stop at a chosen time; the checker then expects its lease gone within TTL plus one interval.

use std::time::Duration;

use futures::StreamExt;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest, PutRequest};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::logs::{Logs, now};
use crate::check::lease::LeaseClientLog;
use crate::topology::{channel, etcd_client, proxy_authority};
use crate::trace::Trace;

/// Which client library keeps the lease alive.
#[derive(Clone, Copy, Debug)]
pub enum Library {
    Tonic,
    EtcdClient,
}

#[derive(Clone, Debug)]
pub struct LeaseSpec {
    pub name: String,
    pub library: Library,
    pub ttl: Duration,
    pub interval: Duration,
    /// Stop keeping alive at this time (`None`: until `until`).
    pub stop_at: Option<Duration>,
    pub until: Duration,
}

/// Grants through the proxy, retrying until it works (a grant that failed with an unknown outcome may leave an
/// orphan lease behind; it simply expires).
async fn grant(spec: &LeaseSpec, trace: &Trace) -> i64 {
    let mut lease = LeaseClient::new(channel(&proxy_authority()));
    loop {
        let mut request = tonic::Request::new(LeaseGrantRequest {
            ttl: spec.ttl.as_secs() as i64,
            id: 0,
        });
        request.set_timeout(Duration::from_secs(2));
        match lease.lease_grant(request).await {
            Ok(response) => return response.into_inner().id,
            Err(status) => {
                trace.record(format!("{}: grant failed: {:?}", spec.name, status.code()));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

pub async fn lease_client(spec: LeaseSpec, logs: Logs, trace: Trace) {
    let id = grant(&spec, &trace).await;
    trace.record(format!("{}: granted lease {id}", spec.name));
    let mut kv = KvClient::new(channel(&proxy_authority()));
    let _ = tokio::time::timeout(
        Duration::from_secs(2),
        kv.put(PutRequest {
            key: format!("lease/{}", spec.name).into_bytes(),
            value: b"held".to_vec(),
            lease: id,
            ..Default::default()
        }),
    )
    .await;
    let end = spec.stop_at.unwrap_or(spec.until).min(spec.until);
    match spec.library {
        Library::Tonic => keep_alive_tonic(&spec, id, end, &trace).await,
        Library::EtcdClient => keep_alive_etcd_client(&spec, id, end, &trace).await,
    }
    let stopped_at = spec.stop_at.filter(|s| *s < spec.until).map(|_| now());
    trace.record(format!("{}: stopped keeping lease {id} alive", spec.name));
    logs.push_lease(LeaseClientLog {
        client: spec.name.clone(),
        lease: id,
        ttl: spec.ttl,
        interval: spec.interval,
        stopped_at,
    });
    // Outlive the run's end so that the stopped lease's expiry is observed while the world still runs.
    tokio::time::sleep(spec.until.saturating_sub(now())).await;
}

/// One request per interval on a raw tonic stream; a stream that fails or does not answer within the interval is
/// replaced.
async fn keep_alive_tonic(spec: &LeaseSpec, id: i64, end: Duration, trace: &Trace) {
    let mut client = LeaseClient::new(channel(&proxy_authority()));
    'reopen: while now() < end {
        let (tx, rx) = mpsc::channel(4);
        let opened = tokio::time::timeout(
            spec.interval,
            client.lease_keep_alive(ReceiverStream::new(rx)),
        );
        if tx.send(LeaseKeepAliveRequest { id }).await.is_err() {
            continue;
        }
        let mut responses = match opened.await {
            Ok(Ok(response)) => response.into_inner(),
            _ => {
                trace.record(format!("{}: keep-alive stream failed to open", spec.name));
                continue 'reopen;
            }
        };
        loop {
            match tokio::time::timeout(spec.interval, responses.next()).await {
                Ok(Some(Ok(response))) => {
                    if response.ttl <= 0 {
                        trace.record(format!(
                            "{}: lease {id} is gone (TTL {})",
                            spec.name, response.ttl
                        ));
                        return;
                    }
                }
                _ => {
                    trace.record(format!("{}: keep-alive stream lost", spec.name));
                    continue 'reopen;
                }
            }
            tokio::time::sleep(spec.interval).await;
            if now() >= end {
                return;
            }
            if tx.send(LeaseKeepAliveRequest { id }).await.is_err() {
                continue 'reopen;
            }
        }
    }
}

/// The same through `etcd-client`'s keeper and stream.
async fn keep_alive_etcd_client(spec: &LeaseSpec, id: i64, end: Duration, trace: &Trace) {
    let Ok(mut client) = etcd_client(&proxy_authority()).await else {
        trace.record(format!("{}: etcd-client could not be built", spec.name));
        return;
    };
    'reopen: while now() < end {
        let opened = tokio::time::timeout(spec.interval, client.lease_keep_alive(id)).await;
        // Opening sends the first request and reads its answer.
        let (mut keeper, mut stream) = match opened {
            Ok(Ok(pair)) => pair,
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => {
                trace.record(format!("{}: lease {id} is gone", spec.name));
                return;
            }
            _ => {
                trace.record(format!("{}: keep-alive stream failed to open", spec.name));
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        loop {
            tokio::time::sleep(spec.interval).await;
            if now() >= end {
                return;
            }
            if keeper.keep_alive().await.is_err() {
                continue 'reopen;
            }
            match tokio::time::timeout(spec.interval, stream.message()).await {
                Ok(Ok(Some(response))) if response.ttl() <= 0 => {
                    trace.record(format!("{}: lease {id} is gone", spec.name));
                    return;
                }
                Ok(Ok(Some(_))) => {}
                _ => {
                    trace.record(format!("{}: keep-alive stream lost", spec.name));
                    continue 'reopen;
                }
            }
        }
    }
}
