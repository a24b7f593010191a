//! Which lease etcd refused. From 3.5.30 a user may renew only a lease whose keys it may write; etcd answers a
//! renewal it refuses by ending the whole keep-alive stream with "permission denied". A direct client stream that
//! sent it ends, and no other client's does. The coalescer's upstream stream carries the renewals of every client
//! stream with one token, so when it ends that way with several leases unanswered, nothing says whose renewal was
//! refused: each of those leases is renewed again on a stream of its own ([`settle`]), and only the leases etcd
//! refuses there fail. Their clients end as they would on etcd; the others get the renewal's answer.

use std::collections::BTreeMap;

use futures::StreamExt;
use proto::etcdserverpb::lease_client::LeaseClient;
use proto::etcdserverpb::{LeaseKeepAliveRequest, LeaseKeepAliveResponse};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::{Code, Status};

use super::coalescer::{LeaseRenewals, RENEWAL_TIMEOUT, fail_all, keep_alive_request};
use crate::error;
use crate::metrics::Metrics;
use crate::upstream::{Active, Upstream};

/// Streams of one renewal each open at once while finding the refused leases.
const TRIALS_AT_ONCE: usize = 32;

/// Whether etcd's end of a keep-alive stream may be its refusal of one renewal rather than of the caller.
pub fn refuses_one_renewal(status: &Status) -> bool {
    status.code() == Code::PermissionDenied
}

/// Settles the renewals left unanswered by a stream that etcd ended with `status`, a refusal of one renewal: with
/// none in flight the refusal was not of a renewal (every request gets it); with one, that lease is the one; with
/// several, each is renewed again alone, and its waiters get that renewal's answer or refusal. A lease whose
/// renewal fails otherwise (the endpoint broke) stays queued for the next stream.
pub async fn settle(
    upstream: &Upstream,
    pick: &Active,
    token: Option<&MetadataValue<Ascii>>,
    metrics: &Metrics,
    leases: &mut BTreeMap<i64, LeaseRenewals>,
    status: &Status,
) {
    let suspects: Vec<i64> = leases
        .iter()
        .filter(|(_, renewals)| renewals.has_in_flight())
        .map(|(&id, _)| id)
        .collect();
    match suspects[..] {
        [] => fail_all(leases, status),
        [refused] => fail_lease(leases, refused, status),
        _ => {
            let trials = futures::stream::iter(suspects)
                .map(|id| async move {
                    metrics.lease_renewals_forwarded.inc();
                    (id, renew_alone(upstream, pick, token, id).await)
                })
                .buffer_unordered(TRIALS_AT_ONCE)
                .collect::<Vec<_>>()
                .await;
            for (id, outcome) in trials {
                match outcome {
                    Ok(answer) => answer_lease(leases, id, answer),
                    Err(refusal) if refuses_one_renewal(&refusal) => {
                        fail_lease(leases, id, &refusal)
                    }
                    Err(_) => {}
                }
            }
        }
    }
}

/// Renews `id` once on a stream of its own to the `pick` endpoint, as the caller with `token`.
async fn renew_alone(
    upstream: &Upstream,
    pick: &Active,
    token: Option<&MetadataValue<Ascii>>,
    id: i64,
) -> Result<LeaseKeepAliveResponse, Status> {
    // Kept open until the answer is read: a half-close could end the stream before etcd answers.
    let requests =
        futures::stream::iter([LeaseKeepAliveRequest { id }]).chain(futures::stream::pending());
    let renewal = async {
        LeaseClient::new(pick.channel.clone())
            .max_decoding_message_size(upstream.max_recv_bytes)
            .lease_keep_alive(keep_alive_request(requests, token))
            .await?
            .into_inner()
            .message()
            .await?
            .ok_or_else(|| Status::unavailable("upstream keep-alive stream ended"))
    };
    tokio::time::timeout(RENEWAL_TIMEOUT, renewal)
        .await
        .unwrap_or_else(|_| {
            Err(Status::unavailable(
                "etcd did not answer a lease renewal in time",
            ))
        })
}

/// Answers every waiter of lease `id` with `answer`. The coalescer reads no request while it settles, so each of
/// them arrived before the renewal that answers it was sent.
fn answer_lease(
    leases: &mut BTreeMap<i64, LeaseRenewals>,
    id: i64,
    answer: LeaseKeepAliveResponse,
) {
    for waiter in leases
        .remove(&id)
        .into_iter()
        .flat_map(LeaseRenewals::into_waiters)
    {
        let _ = waiter.answers.try_send((Ok(answer), waiter.permit));
    }
}

/// Fails every waiter of lease `id` with etcd's `status`, as etcd ends the stream of a client that sent it.
fn fail_lease(leases: &mut BTreeMap<i64, LeaseRenewals>, id: i64, status: &Status) {
    for waiter in leases
        .remove(&id)
        .into_iter()
        .flat_map(LeaseRenewals::into_waiters)
    {
        let refusal = error::to_client(Status::new(status.code(), status.message()));
        let _ = waiter.answers.try_send((Err(refusal), waiter.permit));
    }
}
