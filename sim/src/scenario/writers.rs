//! Writers that go straight to the members (as other etcd clients of the cluster do, bypassing the proxy), and the
//! fence: one txn that puts every key of the keyspace at one revision (and possibly one that deletes them all),
//! after which nothing is written, so every watcher can tell when it has seen everything.

use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::request_op::Request as Op;
use proto::etcdserverpb::{
    CompactionRequest, DeleteRangeRequest, PutRequest, RequestOp, TxnRequest,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;

use super::login::{Login, Session, with_token};
use super::logs::now;
use super::watchers::Fence;
use crate::model::Cluster;
use crate::topology::{Dialer, member_authority};
use crate::trace::Trace;

/// The keys the workloads touch.
pub fn keyspace() -> Vec<Vec<u8>> {
    (0..6).map(|i| format!("k/{i}").into_bytes()).collect()
}

/// Clients of every member, tried in turn until one answers; under auth, as one user ([`MemberClients::as_user`]).
pub struct MemberClients {
    channels: Vec<Channel>,
    next: usize,
    session: Option<Session>,
}

impl MemberClients {
    pub fn new(members: usize, dialer: &Dialer) -> Self {
        Self {
            channels: (0..members)
                .map(|m| dialer.channel(&member_authority(m)))
                .collect(),
            next: 0,
            session: None,
        }
    }

    /// Every call as `login`'s user (auth on).
    pub fn as_user(mut self, login: Login) -> Self {
        self.session = Some(Session::new(login));
        self
    }

    /// The member's client and the token to send to it (`Err`: the member gave no token).
    async fn client(&mut self) -> Result<(KvClient<Channel>, Option<String>), ()> {
        let channel = self.channels[self.next].clone();
        let token = match &mut self.session {
            Some(session) => Some(session.token(&channel).await.ok_or(())?),
            None => None,
        };
        Ok((KvClient::new(channel), token))
    }

    /// Sends `request` to the members in turn until one answers (crashed members refuse at once).
    pub async fn txn(&mut self, request: TxnRequest) -> Option<i64> {
        for _ in 0..self.channels.len() * 3 {
            if let Ok((mut client, token)) = self.client().await {
                let call = client.txn(with_token(request.clone(), token.as_deref()));
                match tokio::time::timeout(Duration::from_millis(500), call).await {
                    Ok(Ok(response)) => {
                        return response.into_inner().header.map(|h| h.revision);
                    }
                    Ok(Err(status)) => self.failed(&status),
                    Err(_) => {}
                }
            }
            self.next = (self.next + 1) % self.channels.len();
        }
        None
    }

    pub async fn compact(&mut self, revision: i64) {
        let Ok((mut client, token)) = self.client().await else {
            return;
        };
        let request = CompactionRequest {
            revision,
            physical: false,
        };
        let call = client.compact(with_token(request, token.as_deref()));
        if let Ok(Err(status)) = tokio::time::timeout(Duration::from_millis(500), call).await {
            self.failed(&status);
        }
    }

    fn failed(&mut self, status: &tonic::Status) {
        if let Some(session) = &mut self.session {
            session.failed(status);
        }
    }
}

fn op(request: Op) -> RequestOp {
    RequestOp {
        request: Some(request),
    }
}

/// Writes random puts, deletes and small txns straight to the members until `until`; compacts now and then if
/// `compactions` is set.
pub async fn direct_writer(
    name: String,
    seed: u64,
    mut members: MemberClients,
    until: Duration,
    compactions: bool,
    cluster: Cluster,
    trace: Trace,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let keys = keyspace();
    let mut counter = 0u64;
    while now() < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(20..150))).await;
        counter += 1;
        let key = keys[rng.random_range(0..keys.len())].clone();
        let choice = rng.random_range(0..100);
        let ops = if choice < 60 {
            vec![op(Op::RequestPut(PutRequest {
                key,
                value: format!("{name}-{counter}").into_bytes(),
                ..Default::default()
            }))]
        } else if choice < 80 {
            vec![op(Op::RequestDeleteRange(DeleteRangeRequest {
                key,
                ..Default::default()
            }))]
        } else if choice < 95 || !compactions {
            let other = keys[rng.random_range(0..keys.len())].clone();
            let mut ops = vec![op(Op::RequestPut(PutRequest {
                key: key.clone(),
                value: format!("{name}-{counter}a").into_bytes(),
                ..Default::default()
            }))];
            if other != key {
                ops.push(op(Op::RequestPut(PutRequest {
                    key: other,
                    value: format!("{name}-{counter}b").into_bytes(),
                    ..Default::default()
                })));
            }
            ops
        } else {
            let revision = cluster.with_store(|store, _| store.revision()) - 8;
            if revision > cluster.with_store(|store, _| store.compacted()) {
                trace.record(format!("{name}: compact {revision}"));
                members.compact(revision).await;
            }
            continue;
        };
        let revision = members
            .txn(TxnRequest {
                success: ops,
                ..Default::default()
            })
            .await;
        trace.record(format!("{name}: write #{counter} -> {revision:?}"));
    }
}

/// Puts every key of the keyspace in one txn, straight to a member; returns its revision.
pub async fn fence(members: usize, dialer: Dialer, trace: Trace) -> i64 {
    fence_by(MemberClients::new(members, &dialer), trace).await
}

/// [`fence`], by `members` (a user's clients, under auth).
pub async fn fence_by(mut members: MemberClients, trace: Trace) -> i64 {
    put_every_key(&mut members, &trace).await
}

/// The fence, then one txn deleting every key of the keyspace (so that watchers filtering puts out see the end
/// too): the revisions of both.
pub async fn fence_with_deletes(members: usize, dialer: Dialer, trace: Trace) -> Fence {
    let mut members = MemberClients::new(members, &dialer);
    let puts = put_every_key(&mut members, &trace).await;
    let delete = vec![op(Op::RequestDeleteRange(DeleteRangeRequest {
        key: b"k/".to_vec(),
        range_end: b"k0".to_vec(),
        ..Default::default()
    }))];
    loop {
        if let Some(last) = members
            .txn(TxnRequest {
                success: delete.clone(),
                ..Default::default()
            })
            .await
        {
            trace.record(format!("fence deletes at revision {last}"));
            return Fence { puts, last };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn put_every_key(members: &mut MemberClients, trace: &Trace) -> i64 {
    let ops: Vec<RequestOp> = keyspace()
        .into_iter()
        .map(|key| {
            op(Op::RequestPut(PutRequest {
                key,
                value: b"fence".to_vec(),
                ..Default::default()
            }))
        })
        .collect();
    loop {
        if let Some(revision) = members
            .txn(TxnRequest {
                success: ops.clone(),
                ..Default::default()
            })
            .await
        {
            trace.record(format!("fence at revision {revision}"));
            return revision;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
