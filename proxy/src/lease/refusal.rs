//! Which lease etcd refused. From 3.5.30 a user may renew only a lease whose keys it may write; etcd answers a
//! renewal it refuses by ending the whole keep-alive stream with "permission denied". A direct client stream that
//! sent it ends, and no other client's does. The coalescer's upstream stream carries the renewals of every client
//! stream with one token, so when it ends that way with several leases unanswered, nothing says whose renewal was
//! refused: each of those leases is renewed again on a stream of its own ([`settle`]), and only the leases etcd
//! refuses there fail. Their clients end as they would on etcd; the others get the renewal's answer.

use std::collections::BTreeMap;
use std::future::Future;

use futures::StreamExt;
use proto::etcdserverpb::LeaseKeepAliveResponse;
use tonic::{Code, Status};

use super::renewals::{LeaseRenewals, fail_all};
use crate::error;

/// Leases renewed alone at once while finding the refused ones.
const TRIALS_AT_ONCE: usize = 32;

/// Whether etcd's end of a keep-alive stream may be its refusal of one renewal rather than of the caller.
pub fn refuses_one_renewal(status: &Status) -> bool {
    status.code() == Code::PermissionDenied
}

/// Settles the renewals left unanswered by a stream that etcd ended with `status`, a refusal of one renewal: with
/// none in flight the refusal was not of a renewal (every request gets it); with one, that lease is the one; with
/// several, each is renewed again by `renew_alone` (on a stream of its own), and its waiters get that renewal's
/// answer or refusal. A lease whose renewal fails otherwise (the endpoint broke) stays for the next stream.
pub async fn settle<F, Fut>(
    leases: &mut BTreeMap<i64, LeaseRenewals>,
    status: &Status,
    renew_alone: F,
) where
    F: Fn(i64) -> Fut,
    Fut: Future<Output = Result<LeaseKeepAliveResponse, Status>>,
{
    let suspects: Vec<i64> = leases
        .iter()
        .filter(|(_, renewals)| renewals.has_in_flight())
        .map(|(&id, _)| id)
        .collect();
    match suspects[..] {
        [] => fail_all(leases, status),
        [refused] => fail_lease(leases, refused, status),
        _ => {
            let renew_alone = &renew_alone;
            let trials = futures::stream::iter(suspects)
                .map(|id| async move { (id, renew_alone(id).await) })
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
        waiter.answer(Ok(answer));
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
        waiter.answer(Err(refusal));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::renewals::{Renew, Waiter, queue, send_queued};
    use crate::lease::replies::{Answer, Replies};
    use crate::metrics::Metrics;
    use proto::etcdserverpb::LeaseKeepAliveRequest;
    use std::sync::Arc;
    use tokio::sync::{Semaphore, mpsc};
    use tokio::time::Instant;

    /// A client stream: where its answers arrive.
    struct Client {
        replies: Replies,
        answers: mpsc::Receiver<Answer>,
    }

    impl Client {
        fn new() -> Self {
            let (sender, answers) = mpsc::channel(8);
            Self {
                replies: Replies::new(sender),
                answers,
            }
        }

        fn renew(&self, lease_id: i64) -> Renew {
            let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
            Renew {
                lease_id,
                waiter: Waiter {
                    reply: self.replies.ticket().unwrap(),
                    permit,
                    requires_leader: false,
                },
            }
        }

        /// The answers received so far: TTLs, or the codes of errors.
        fn seen(&mut self) -> Vec<Result<i64, Code>> {
            let mut seen = Vec::new();
            while let Ok((answer, _)) = self.answers.try_recv() {
                seen.push(answer.map(|a| a.ttl).map_err(|s| s.code()));
            }
            seen
        }
    }

    fn denied() -> Status {
        Status::permission_denied("etcdserver: permission denied")
    }

    /// `sent` renewed on an upstream stream (in flight), then `queued` waiting for the next; and what was sent.
    fn in_flight(
        sent: Vec<Renew>,
        queued: Vec<Renew>,
    ) -> (
        BTreeMap<i64, LeaseRenewals>,
        mpsc::UnboundedReceiver<LeaseKeepAliveRequest>,
    ) {
        let metrics = Metrics::new(prometheus::Registry::new()).unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let mut leases = BTreeMap::new();
        for renew in sent {
            queue(&mut leases, renew);
        }
        send_queued(&mut leases, &tx, &metrics, Instant::now());
        for renew in queued {
            queue(&mut leases, renew);
        }
        (leases, rx)
    }

    fn renewed(id: i64) -> Result<LeaseKeepAliveResponse, Status> {
        Ok(LeaseKeepAliveResponse {
            header: None,
            id,
            ttl: 60,
        })
    }

    #[tokio::test]
    async fn with_several_leases_unanswered_only_the_one_etcd_refuses_alone_fails() {
        let (mut a, mut b) = (Client::new(), Client::new());
        let (mut leases, _sent) = in_flight(vec![a.renew(1), b.renew(2)], vec![]);
        settle(&mut leases, &denied(), |id| async move {
            if id == 1 { Err(denied()) } else { renewed(id) }
        })
        .await;
        assert_eq!(a.seen(), vec![Err(Code::PermissionDenied)]);
        assert_eq!(b.seen(), vec![Ok(60)]);
        assert!(leases.is_empty(), "every waiter was settled");
    }

    #[tokio::test]
    async fn with_one_lease_unanswered_it_is_the_refused_one_and_queued_leases_wait() {
        let (mut a, mut b) = (Client::new(), Client::new());
        let (mut leases, _sent) = in_flight(vec![a.renew(1)], vec![b.renew(2)]);
        settle(&mut leases, &denied(), |id| async move {
            panic!("lease {id} renewed alone: only one was in flight")
        })
        .await;
        assert_eq!(a.seen(), vec![Err(Code::PermissionDenied)]);
        assert_eq!(
            b.seen(),
            vec![],
            "lease 2 was never sent: nothing refused it"
        );
        assert_eq!(leases.keys().copied().collect::<Vec<_>>(), vec![2]);
    }

    #[tokio::test]
    async fn a_lease_whose_renewal_alone_breaks_stays_for_the_next_stream() {
        let (mut a, mut b) = (Client::new(), Client::new());
        let (mut leases, _sent) = in_flight(vec![a.renew(1), b.renew(2)], vec![]);
        settle(&mut leases, &denied(), |id| async move {
            if id == 1 {
                Err(denied())
            } else {
                Err(Status::unavailable("connection reset"))
            }
        })
        .await;
        assert_eq!(a.seen(), vec![Err(Code::PermissionDenied)]);
        assert_eq!(b.seen(), vec![]);
        assert!(leases.get(&2).is_some_and(LeaseRenewals::has_in_flight));
    }

    #[tokio::test]
    async fn a_refusal_with_nothing_in_flight_reaches_every_waiting_request() {
        let (mut a, mut b) = (Client::new(), Client::new());
        let (mut leases, _sent) = in_flight(vec![], vec![a.renew(1), b.renew(2)]);
        settle(&mut leases, &denied(), |id| async move {
            panic!("lease {id} renewed alone: none was in flight")
        })
        .await;
        assert_eq!(a.seen(), vec![Err(Code::PermissionDenied)]);
        assert_eq!(b.seen(), vec![Err(Code::PermissionDenied)]);
        assert!(leases.is_empty());
    }
}
