//! Clients that call the proxy and write down every call for the failover-transparency checker: one speaks
//! through tonic's generated clients, one through the `etcd-client` crate. Each call carries a gRPC deadline (so
//! the proxy knows how long it may retry) and the client itself gives up at the checker's bound.

use std::future::Future;
use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::maintenance_client::MaintenanceClient;
use proto::etcdserverpb::request_op::Request as Op;
use proto::etcdserverpb::{
    LeaseLeasesRequest, PutRequest, RangeRequest, RequestOp, StatusRequest, TxnRequest,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::Code;

use super::logs::{Logs, now};
use super::writers::keyspace;
use crate::check::calls::{CallKind, CallLog, CallOutcome};
use crate::topology::{Dialer, proxy_authority};
use crate::trace::Trace;

/// The deadline each call carries.
pub const CALL_DEADLINE: Duration = Duration::from_secs(3);
/// How long a client waits before it calls a call hung (the checker's bound).
pub const CALL_BOUND: Duration = Duration::from_secs(4);

/// Runs `call` with the client-side bound and records it.
async fn recorded<F>(
    logs: &Logs,
    trace: &Trace,
    client: &str,
    what: String,
    kind: CallKind,
    call: F,
) where
    F: Future<Output = Result<i64, (Code, String)>>,
{
    let started = now();
    let outcome = match tokio::time::timeout(CALL_BOUND, call).await {
        Ok(Ok(revision)) => CallOutcome::Ok { revision },
        Ok(Err((code, message))) => CallOutcome::Failed { code, message },
        Err(_) => CallOutcome::TimedOut,
    };
    trace.record(format!("{client}: {what} -> {outcome:?}"));
    logs.push_call(CallLog {
        client: client.to_string(),
        what,
        kind,
        started,
        finished: now(),
        outcome,
    });
}

fn with_deadline<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(CALL_DEADLINE);
    request
}

fn status(s: tonic::Status) -> (Code, String) {
    (s.code(), s.message().to_string())
}

/// Reads (linearizable and serializable ranges, a read-only txn, Status, LeaseLeases) and writes (puts and txns)
/// through tonic until `until`.
pub async fn tonic_caller(
    name: String,
    seed: u64,
    until: Duration,
    dialer: Dialer,
    logs: Logs,
    trace: Trace,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let channel = dialer.channel(&proxy_authority());
    let mut kv = KvClient::new(channel.clone());
    let mut maintenance = MaintenanceClient::new(channel.clone());
    let mut lease = LeaseClient::new(channel);
    let keys = keyspace();
    let mut counter = 0u64;
    while now() < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(30..200))).await;
        counter += 1;
        let key = keys[rng.random_range(0..keys.len())].clone();
        match rng.random_range(0..10) {
            0..=3 => {
                let serializable = rng.random_bool(0.5);
                let request = RangeRequest {
                    key: b"k/".to_vec(),
                    range_end: b"k0".to_vec(),
                    serializable,
                    ..Default::default()
                };
                let what = format!("range k/ serializable={serializable}");
                recorded(&logs, &trace, &name, what, CallKind::Read, async {
                    kv.range(with_deadline(request))
                        .await
                        .map(|r| r.into_inner().header.map_or(0, |h| h.revision))
                        .map_err(status)
                })
                .await;
            }
            4 => {
                let request = TxnRequest {
                    success: vec![RequestOp {
                        request: Some(Op::RequestRange(RangeRequest {
                            key: key.clone(),
                            ..Default::default()
                        })),
                    }],
                    ..Default::default()
                };
                recorded(
                    &logs,
                    &trace,
                    &name,
                    "read-only txn".into(),
                    CallKind::Read,
                    async {
                        kv.txn(with_deadline(request))
                            .await
                            .map(|r| r.into_inner().header.map_or(0, |h| h.revision))
                            .map_err(status)
                    },
                )
                .await;
            }
            5 => {
                recorded(
                    &logs,
                    &trace,
                    &name,
                    "status".into(),
                    CallKind::Read,
                    async {
                        maintenance
                            .status(with_deadline(StatusRequest {}))
                            .await
                            .map(|r| r.into_inner().header.map_or(0, |h| h.revision))
                            .map_err(status)
                    },
                )
                .await;
                recorded(
                    &logs,
                    &trace,
                    &name,
                    "lease leases".into(),
                    CallKind::Read,
                    async {
                        lease
                            .lease_leases(with_deadline(LeaseLeasesRequest {}))
                            .await
                            .map(|r| r.into_inner().header.map_or(0, |h| h.revision))
                            .map_err(status)
                    },
                )
                .await;
            }
            6..=8 => {
                let value = format!("{name}-{counter}").into_bytes();
                let request = PutRequest {
                    key: key.clone(),
                    value: value.clone(),
                    ..Default::default()
                };
                let what = format!("put {}", String::from_utf8_lossy(&key));
                recorded(
                    &logs,
                    &trace,
                    &name,
                    what,
                    CallKind::Put { key, value },
                    async {
                        kv.put(with_deadline(request))
                            .await
                            .map(|r| r.into_inner().header.map_or(0, |h| h.revision))
                            .map_err(status)
                    },
                )
                .await;
            }
            _ => {
                let request = TxnRequest {
                    success: vec![RequestOp {
                        request: Some(Op::RequestPut(PutRequest {
                            key: key.clone(),
                            value: format!("{name}-{counter}").into_bytes(),
                            ..Default::default()
                        })),
                    }],
                    ..Default::default()
                };
                recorded(
                    &logs,
                    &trace,
                    &name,
                    "write txn".into(),
                    CallKind::OtherWrite,
                    async {
                        kv.txn(with_deadline(request))
                            .await
                            .map(|r| r.into_inner().header.map_or(0, |h| h.revision))
                            .map_err(status)
                    },
                )
                .await;
            }
        }
    }
}

/// Gets and puts through the `etcd-client` crate until `until`.
pub async fn etcd_client_caller(
    name: String,
    seed: u64,
    until: Duration,
    dialer: Dialer,
    logs: Logs,
    trace: Trace,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut client = match dialer.etcd_client(&proxy_authority()).await {
        Ok(client) => client,
        Err(err) => panic!("{name}: etcd-client could not be built: {err}"),
    };
    let keys = keyspace();
    let mut counter = 0u64;
    let code_of = |err: etcd_client::Error| match err {
        etcd_client::Error::GRpcStatus(s) => (s.code(), s.message().to_string()),
        other => (Code::Unknown, other.to_string()),
    };
    while now() < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(30..200))).await;
        counter += 1;
        let key = keys[rng.random_range(0..keys.len())].clone();
        if rng.random_bool(0.6) {
            let serializable = rng.random_bool(0.5);
            let mut options = etcd_client::GetOptions::new().with_prefix();
            if serializable {
                options = options.with_serializable();
            }
            recorded(
                &logs,
                &trace,
                &name,
                format!("get k/ serializable={serializable}"),
                CallKind::Read,
                async {
                    client
                        .get("k/", Some(options))
                        .await
                        .map(|r| r.header().map_or(0, |h| h.revision()))
                        .map_err(code_of)
                },
            )
            .await;
        } else {
            let value = format!("{name}-{counter}").into_bytes();
            let what = format!("put {}", String::from_utf8_lossy(&key));
            recorded(
                &logs,
                &trace,
                &name,
                what,
                CallKind::Put {
                    key: key.clone(),
                    value: value.clone(),
                },
                async {
                    client
                        .put(key, value, None)
                        .await
                        .map(|r| r.header().map_or(0, |h| h.revision()))
                        .map_err(code_of)
                },
            )
            .await;
        }
    }
}
