//! Renewals whose answer was lost: whether etcd performed them is asked, so that no request renews its lease twice.
//!
//! A renewal sent on an upstream stream that ended before answering may have reached etcd (only its answer was lost)
//! or not. Sending it again on the next stream renews a lease twice for one request when it had, and a client that
//! stopped right after that request then sees its lease outlive its stop by as long as the failover took, which a
//! client talking to etcd directly never sees. So before a lease whose requests are all unsettled is renewed again,
//! etcd's LeaseTimeToLive says how long it still lives:
//! - gone (TTL -1): the request is answered TTL 0, as a renewal of a lease etcd no longer has is;
//! - living at least as long as a renewal at the lost send would have made it: the request is answered with the TTL
//!   etcd reports, left of that renewal; nothing is renewed;
//! - otherwise, or if etcd cannot say: renewed, as any queued request.
//!
//! etcd reports whole seconds, rounded down: a lease whose reported TTL falls short of the lost renewal's by less
//! than a second may have been renewed by it or, in the second before it, by an earlier one. It counts as renewed.
//! Its client is told the TTL that is left, so it knows when to renew next; renewing it again would instead keep a
//! lease alive for a client that may have stopped. A reported TTL under one second is renewed: answering it would
//! tell a client (clientv3 among them) that its lease is gone.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use proto::etcdserverpb::{LeaseKeepAliveResponse, LeaseTimeToLiveResponse};
use tokio::time::Instant;
use tonic::Status;

use super::renewals::LeaseRenewals;

/// Leases looked up at once.
const LOOKUPS_AT_ONCE: usize = 256;

/// The leases whose waiting requests are all unsettled: only etcd can say whether they need a renewal (a lease with
/// a queued request is renewed anyway, and its unsettled requests share that renewal).
pub fn to_confirm(leases: &BTreeMap<i64, LeaseRenewals>) -> Vec<i64> {
    leases
        .iter()
        .filter(|(_, renewals)| renewals.queued.is_empty() && renewals.unsettled.is_some())
        .map(|(&id, _)| id)
        .collect()
}

/// Asks `look_up` (LeaseTimeToLive on the endpoint the next stream goes to) about every lease [`to_confirm`]
/// gives, and settles each with its answer. Leases still unanswered `within` of the start are renewed: a lease
/// may be about to expire, and thousands of them may wait. Returns how many requests were answered without a
/// renewal.
pub async fn confirm_all<F, Fut>(
    leases: &mut BTreeMap<i64, LeaseRenewals>,
    within: Duration,
    look_up: F,
) -> usize
where
    F: Fn(i64) -> Fut,
    Fut: Future<Output = Result<LeaseTimeToLiveResponse, Status>>,
{
    let ids = to_confirm(leases);
    if ids.is_empty() {
        return 0;
    }
    let asked = Instant::now();
    let look_up = &look_up;
    let mut answers: BTreeMap<i64, _> = futures::stream::iter(ids.iter().copied())
        .map(|id| async move { (id, look_up(id).await) })
        .buffer_unordered(LOOKUPS_AT_ONCE)
        .take_until(tokio::time::sleep(within))
        .collect()
        .await;
    // In lease order, whatever order the answers came in: a seeded simulation stays reproducible.
    ids.into_iter()
        .map(|id| {
            let looked_up = answers
                .remove(&id)
                .unwrap_or_else(|| Err(Status::deadline_exceeded("no answer in time")));
            settle(leases, id, looked_up, asked)
        })
        .sum()
}

/// Settles lease `id`'s unsettled requests with what LeaseTimeToLive, asked at `asked`, answered: they get an
/// answer now, or are queued to be renewed. Returns how many were answered.
pub fn settle(
    leases: &mut BTreeMap<i64, LeaseRenewals>,
    id: i64,
    looked_up: Result<LeaseTimeToLiveResponse, Status>,
    asked: Instant,
) -> usize {
    let Some(renewals) = leases.get_mut(&id) else {
        return 0;
    };
    let Some((sent, waiters)) = renewals.unsettled.take() else {
        return 0;
    };
    let since_sent = asked.saturating_duration_since(sent);
    let answered = match looked_up
        .ok()
        .and_then(|looked_up| answer_without_renewing(&looked_up, since_sent))
    {
        Some(answer) => {
            let answered = waiters.len();
            for waiter in waiters {
                waiter.answer(Ok(answer));
            }
            answered
        }
        None => {
            renewals.queued.splice(0..0, waiters);
            0
        }
    };
    if renewals.is_idle() {
        leases.remove(&id);
    }
    answered
}

/// The answer to requests whose renewal was sent `since_sent` before etcd reported `looked_up`, if they need no
/// renewal (see the module's rules).
fn answer_without_renewing(
    looked_up: &LeaseTimeToLiveResponse,
    since_sent: Duration,
) -> Option<LeaseKeepAliveResponse> {
    let answer = |ttl| LeaseKeepAliveResponse {
        header: looked_up.header,
        id: looked_up.id,
        ttl,
    };
    if looked_up.ttl < 0 {
        return Some(answer(0));
    }
    let (left, granted) = (
        u64::try_from(looked_up.ttl).ok()?,
        u64::try_from(looked_up.granted_ttl).ok()?,
    );
    // What the lost renewal would have left now is `granted - since_sent`; etcd's `left` is that or more, rounded
    // down to the second, if the lease lives as long.
    let as_renewed = Duration::from_secs(left + 1) + since_sent > Duration::from_secs(granted);
    (left >= 1 && as_renewed).then(|| answer(looked_up.ttl))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::renewals::{Renew, Waiter, queue, send_queued, unsettle_unanswered};
    use crate::lease::replies::{Answer, Replies};
    use crate::metrics::Metrics;
    use proto::etcdserverpb::{LeaseKeepAliveRequest, ResponseHeader};
    use std::sync::Arc;
    use tokio::sync::{Semaphore, mpsc};

    fn looked_up(ttl: i64, granted_ttl: i64) -> LeaseTimeToLiveResponse {
        LeaseTimeToLiveResponse {
            header: Some(ResponseHeader {
                revision: 9,
                ..ResponseHeader::default()
            }),
            id: 7,
            ttl,
            granted_ttl,
            keys: Vec::new(),
        }
    }

    fn ttl_without_renewing(ttl: i64, granted: i64, since_sent_ms: u64) -> Option<i64> {
        answer_without_renewing(
            &looked_up(ttl, granted),
            Duration::from_millis(since_sent_ms),
        )
        .map(|answer| answer.ttl)
    }

    #[test]
    fn a_lease_that_lives_as_long_as_the_lost_renewal_would_make_it_is_not_renewed_again() {
        // Sent 730 ms ago with TTL 3: renewed then, 2.27 s are left, which etcd reports as 2.
        assert_eq!(ttl_without_renewing(2, 3, 730), Some(2));
        // Long ago: any lease still living this long was renewed after the send.
        assert_eq!(ttl_without_renewing(1, 3, 4_000), Some(1));
        // Renewed by someone since, for longer than this renewal would have.
        assert_eq!(ttl_without_renewing(3, 3, 200), Some(3));
    }

    #[test]
    fn a_lease_short_of_the_lost_renewal_by_a_second_or_more_is_renewed() {
        // Sent 730 ms ago with TTL 3, the renewal would leave 2.27 s; etcd reports 1: at most 1.99 s left.
        assert_eq!(ttl_without_renewing(1, 3, 730), None);
        assert_eq!(ttl_without_renewing(5, 10, 0), None);
    }

    #[test]
    fn a_lease_with_less_than_a_second_left_is_renewed_and_a_gone_lease_is_answered_ttl_0() {
        assert_eq!(
            ttl_without_renewing(0, 3, 2_900),
            None,
            "TTL 0 would tell the client its lease is gone"
        );
        assert_eq!(
            ttl_without_renewing(-1, 0, 100),
            Some(0),
            "as etcd answers a renewal of an unknown lease"
        );
    }

    struct Client {
        answers: mpsc::Receiver<Answer>,
        replies: Replies,
        permits: Arc<Semaphore>,
    }

    impl Client {
        fn new() -> Self {
            let (sender, answers) = mpsc::channel(16);
            Self {
                answers,
                replies: Replies::new(sender),
                permits: Arc::new(Semaphore::new(16)),
            }
        }

        fn renew(&self, lease_id: i64) -> Renew {
            Renew {
                lease_id,
                waiter: Waiter {
                    reply: self.replies.ticket().unwrap(),
                    permit: self.permits.clone().try_acquire_owned().unwrap(),
                    requires_leader: false,
                },
            }
        }

        fn answers(&mut self) -> Vec<(i64, i64)> {
            std::iter::from_fn(|| self.answers.try_recv().ok())
                .map(|(answer, _)| answer.map(|a| (a.id, a.ttl)).unwrap())
                .collect()
        }
    }

    fn sent(rx: &mut mpsc::UnboundedReceiver<LeaseKeepAliveRequest>) -> Vec<i64> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|r| r.id)
            .collect()
    }

    /// Lease 7's request sent on a stream that then ended unanswered, 730 ms before `asked`.
    fn unsettled(client: &Client) -> (BTreeMap<i64, LeaseRenewals>, Instant) {
        let metrics = Metrics::new(prometheus::Registry::new()).unwrap();
        let (tx, _upstream) = mpsc::unbounded_channel();
        let mut leases = BTreeMap::new();
        let sent = Instant::now();
        queue(&mut leases, client.renew(7));
        send_queued(&mut leases, &tx, &metrics, sent);
        unsettle_unanswered(&mut leases);
        (leases, sent + Duration::from_millis(730))
    }

    #[tokio::test]
    async fn a_request_whose_renewal_etcd_performed_is_answered_and_not_renewed_twice() {
        let mut client = Client::new();
        let (mut leases, asked) = unsettled(&client);
        assert_eq!(to_confirm(&leases), vec![7]);
        settle(&mut leases, 7, Ok(looked_up(2, 3)), asked);
        assert_eq!(client.answers(), vec![(7, 2)], "answered with the TTL left");
        assert!(leases.is_empty(), "nothing left to renew");
    }

    #[tokio::test]
    async fn a_request_whose_renewal_etcd_may_not_have_performed_is_renewed() {
        let metrics = Metrics::new(prometheus::Registry::new()).unwrap();
        let (tx, mut upstream) = mpsc::unbounded_channel();
        for looked_up in [Ok(looked_up(1, 3)), Err(Status::unavailable("no answer"))] {
            let mut client = Client::new();
            let (mut leases, asked) = unsettled(&client);
            settle(&mut leases, 7, looked_up, asked);
            assert_eq!(client.answers(), vec![]);
            send_queued(&mut leases, &tx, &metrics, asked);
            assert_eq!(sent(&mut upstream), vec![7]);
        }
    }

    #[tokio::test]
    async fn an_unsettled_request_shares_the_renewal_of_a_new_request_for_its_lease_without_asking()
    {
        let metrics = Metrics::new(prometheus::Registry::new()).unwrap();
        let (tx, mut upstream) = mpsc::unbounded_channel();
        let (mut early, mut late) = (Client::new(), Client::new());
        let (mut leases, asked) = unsettled(&early);
        queue(&mut leases, late.renew(7));
        assert_eq!(to_confirm(&leases), Vec::<i64>::new());
        send_queued(&mut leases, &tx, &metrics, asked);
        assert_eq!(sent(&mut upstream), vec![7], "one renewal for both");
        crate::lease::renewals::deliver(
            &mut leases,
            LeaseKeepAliveResponse {
                header: None,
                id: 7,
                ttl: 3,
            },
        );
        assert_eq!(
            (early.answers(), late.answers()),
            (vec![(7, 3)], vec![(7, 3)])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn leases_etcd_does_not_answer_about_in_time_are_renewed() {
        let mut client = Client::new();
        let (mut leases, _) = unsettled(&client);
        let answered = confirm_all(&mut leases, Duration::from_millis(100), |_| {
            std::future::pending::<Result<LeaseTimeToLiveResponse, Status>>()
        })
        .await;
        assert_eq!((answered, client.answers()), (0, vec![]));
        assert_eq!(
            to_confirm(&leases),
            Vec::<i64>::new(),
            "queued, not waiting"
        );
        assert!(
            leases
                .get(&7)
                .is_some_and(|renewals| !renewals.queued.is_empty())
        );
    }

    #[tokio::test]
    async fn confirm_all_asks_about_each_unsettled_lease_once() {
        let mut client = Client::new();
        let (mut leases, _) = unsettled(&client);
        let asked = std::sync::Mutex::new(Vec::new());
        let answered = confirm_all(&mut leases, Duration::from_secs(1), |id| {
            asked.lock().unwrap().push(id);
            async { Ok(looked_up(-1, 0)) }
        })
        .await;
        assert_eq!(*asked.lock().unwrap(), vec![7]);
        assert_eq!(answered, 1);
        assert_eq!(client.answers(), vec![(7, 0)], "a lease etcd no longer has");
        assert!(leases.is_empty());
    }
}
