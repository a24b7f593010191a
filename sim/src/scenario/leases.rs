//! Lease clients: each grants its leases through the proxy, attaches a key to the first, and keeps them all alive
//! over one keep-alive stream through the proxy (a request per lease each interval, as an application holding many
//! leases on one client does), re-opening the stream when it fails or does not answer every request within the
//! interval. A client may stop at a chosen time; the checker then expects its leases gone within TTL plus one
//! interval.

use std::time::Duration;

use futures::StreamExt;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::{LeaseGrantRequest, LeaseKeepAliveRequest, PutRequest};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::logs::{Logs, now};
use crate::check::lease::LeaseClientLog;
use crate::model::Cluster;
use crate::topology::{Dialer, proxy_authority};
use crate::trace::Trace;

/// Which client library keeps the lease alive.
#[derive(Clone, Copy, Debug)]
pub enum Library {
    Tonic,
    /// `etcd-client`'s keeper keeps one lease per stream: a spec with this library holds exactly one lease.
    EtcdClient,
}

#[derive(Clone, Debug)]
pub struct LeaseSpec {
    pub name: String,
    pub library: Library,
    pub ttl: Duration,
    pub interval: Duration,
    /// How many leases the client keeps alive on its stream.
    pub leases: usize,
    /// Stop keeping alive at this time (`None`: until `until`).
    pub stop_at: Option<Duration>,
    pub until: Duration,
}

/// Grants through the proxy, retrying until it works (a grant that failed with an unknown outcome may leave an
/// orphan lease behind; it simply expires).
async fn grant(spec: &LeaseSpec, channel: &Channel, trace: &Trace) -> i64 {
    let mut lease = LeaseClient::new(channel.clone());
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

/// Runs one lease client over `channel` (a connection to the proxy; an `etcd-client` keeper dials its own with
/// `dialer`). With `model`, only the first lease is granted through the proxy and the others straight on the
/// model's store, as another etcd client of the cluster would (a scenario with thousands of leases is about keeping
/// them alive; a grant is a unary call like any other).
pub async fn lease_client(
    spec: LeaseSpec,
    channel: Channel,
    dialer: Dialer,
    model: Option<Cluster>,
    logs: Logs,
    trace: Trace,
) {
    let mut ids = vec![grant(&spec, &channel, &trace).await];
    while ids.len() < spec.leases {
        let id = match &model {
            Some(cluster) => cluster
                .with_store(|store, now| {
                    store.lease_grant(0, spec.ttl.as_secs() as i64, now, || {
                        cluster.fresh_lease_id()
                    })
                })
                .map(|(id, _)| id)
                .expect("a model grant with a valid TTL succeeds"),
            None => grant(&spec, &channel, &trace).await,
        };
        ids.push(id);
    }
    trace.record(format!("{}: granted leases {ids:?}", spec.name));
    let id = ids[0];
    let mut kv = KvClient::new(channel.clone());
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
    let last_request_at = match spec.library {
        Library::Tonic => keep_alive_tonic(&spec, channel, ids.clone(), end, &trace).await,
        Library::EtcdClient => {
            assert_eq!(ids.len(), 1, "etcd-client keeps one lease per stream");
            keep_alive_etcd_client(&spec, &dialer, id, end, &trace).await
        }
    };
    let stopped_at = spec.stop_at.filter(|s| *s < spec.until).map(|_| now());
    trace.record(format!("{}: stopped keeping its leases alive", spec.name));
    for (index, &lease) in ids.iter().enumerate() {
        logs.push_lease(LeaseClientLog {
            client: if ids.len() == 1 {
                spec.name.clone()
            } else {
                format!("{}#{index}", spec.name)
            },
            lease,
            ttl: spec.ttl,
            interval: spec.interval,
            stopped_at,
            last_request_at,
        });
    }
    // Outlive the run's end so that the stopped lease's expiry is observed while the world still runs.
    tokio::time::sleep(spec.until.saturating_sub(now())).await;
}

/// One request per lease each interval on a raw tonic stream; a stream that fails or does not answer every request
/// of a round within the interval is replaced. A lease answered with TTL 0 is gone and no longer renewed. Returns
/// when the last round of requests was sent (`None`: never).
async fn keep_alive_tonic(
    spec: &LeaseSpec,
    channel: Channel,
    mut ids: Vec<i64>,
    end: Duration,
    trace: &Trace,
) -> Option<Duration> {
    let mut client = LeaseClient::new(channel);
    let mut last_sent = None;
    'reopen: while now() < end && !ids.is_empty() {
        // Room for a whole round: the first one is queued before the call is opened.
        let (tx, rx) = mpsc::channel(ids.len() + 1);
        for &id in &ids {
            if tx.send(LeaseKeepAliveRequest { id }).await.is_err() {
                continue 'reopen;
            }
        }
        // Sent as soon as the call opens, which is now.
        last_sent = Some(now());
        let opened = tokio::time::timeout(
            spec.interval,
            client.lease_keep_alive(ReceiverStream::new(rx)),
        );
        let mut responses = match opened.await {
            Ok(Ok(response)) => response.into_inner(),
            _ => {
                trace.record(format!("{}: keep-alive stream failed to open", spec.name));
                continue 'reopen;
            }
        };
        loop {
            let round_ends = tokio::time::Instant::now() + spec.interval;
            let mut unanswered = ids.len();
            while unanswered > 0 {
                match tokio::time::timeout_at(round_ends, responses.next()).await {
                    Ok(Some(Ok(response))) => {
                        unanswered -= 1;
                        if response.ttl <= 0 {
                            trace.record(format!(
                                "{}: lease {} is gone (TTL {})",
                                spec.name, response.id, response.ttl
                            ));
                            ids.retain(|&id| id != response.id);
                        }
                    }
                    _ => {
                        trace.record(format!("{}: keep-alive stream lost", spec.name));
                        continue 'reopen;
                    }
                }
            }
            if ids.is_empty() {
                return last_sent;
            }
            tokio::time::sleep(spec.interval).await;
            if now() >= end {
                return last_sent;
            }
            last_sent = Some(now());
            for &id in &ids {
                if tx.send(LeaseKeepAliveRequest { id }).await.is_err() {
                    continue 'reopen;
                }
            }
        }
    }
    last_sent
}

/// The same through `etcd-client`'s keeper and stream.
async fn keep_alive_etcd_client(
    spec: &LeaseSpec,
    dialer: &Dialer,
    id: i64,
    end: Duration,
    trace: &Trace,
) -> Option<Duration> {
    let Ok(mut client) = dialer.etcd_client(&proxy_authority()).await else {
        trace.record(format!("{}: etcd-client could not be built", spec.name));
        return None;
    };
    let mut last_sent = None;
    'reopen: while now() < end {
        last_sent = Some(now());
        let opened = tokio::time::timeout(spec.interval, client.lease_keep_alive(id)).await;
        // Opening sends the first request and reads its answer.
        let (mut keeper, mut stream) = match opened {
            Ok(Ok(pair)) => pair,
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => {
                trace.record(format!("{}: lease {id} is gone", spec.name));
                return last_sent;
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
                return last_sent;
            }
            last_sent = Some(now());
            if keeper.keep_alive().await.is_err() {
                continue 'reopen;
            }
            match tokio::time::timeout(spec.interval, stream.message()).await {
                Ok(Ok(Some(response))) if response.ttl() <= 0 => {
                    trace.record(format!("{}: lease {id} is gone", spec.name));
                    return last_sent;
                }
                Ok(Ok(Some(_))) => {}
                _ => {
                    trace.record(format!("{}: keep-alive stream lost", spec.name));
                    continue 'reopen;
                }
            }
        }
    }
    last_sent
}
