//! The renewals the coalescer of one token owes, by lease: requests queued for the next renewal and batches sent
//! upstream but not yet answered, and what happens to them as answers, failures and departures come.

use std::collections::{BTreeMap, VecDeque};

use proto::etcdserverpb::{LeaseKeepAliveRequest, LeaseKeepAliveResponse};
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::time::Instant;
use tonic::Status;

use super::replies::Reply;
use crate::error;
use crate::metrics::Metrics;

/// One client request waiting for its answer.
pub struct Waiter {
    /// Where the answer goes: the client stream, after the answers to its earlier requests.
    pub reply: Reply,
    /// Counts against the client stream's limit of unanswered requests until the client reads the answer.
    pub permit: OwnedSemaphorePermit,
    /// The client stream requires a leader (`hasleader: true`).
    pub requires_leader: bool,
}

impl Waiter {
    pub fn answer(self, answer: Result<LeaseKeepAliveResponse, Status>) {
        self.reply.send((answer, self.permit));
    }

    /// Nobody will read the answer (see [`Reply::is_abandoned`]): renewing for it would keep its lease alive for
    /// nobody.
    pub fn is_abandoned(&self) -> bool {
        self.reply.is_abandoned()
    }
}

/// A keep-alive request from a client stream.
pub struct Renew {
    pub lease_id: i64,
    pub waiter: Waiter,
}

/// Renewals of one lease: requests waiting for the next send, batches sent but not yet answered, and requests whose
/// renewal was sent on a stream that ended before answering.
#[derive(Default)]
pub struct LeaseRenewals {
    pub(super) queued: Vec<Waiter>,
    pub(super) in_flight: VecDeque<(Instant, Vec<Waiter>)>,
    /// Sent on a stream that ended unanswered: etcd may have renewed the lease for them or not
    /// ([`super::confirm`] asks it). The instant is the latest of those sends.
    pub(super) unsettled: Option<(Instant, Vec<Waiter>)>,
}

impl LeaseRenewals {
    pub fn has_in_flight(&self) -> bool {
        !self.in_flight.is_empty()
    }

    /// Every request waiting, sent or not.
    pub fn into_waiters(self) -> impl Iterator<Item = Waiter> {
        self.queued
            .into_iter()
            .chain(self.in_flight.into_iter().flat_map(|(_, batch)| batch))
            .chain(self.unsettled.into_iter().flat_map(|(_, waiters)| waiters))
    }

    pub fn is_idle(&self) -> bool {
        self.queued.is_empty() && self.in_flight.is_empty() && self.unsettled.is_none()
    }
}

/// Renewals sent on a stream that ended unanswered have an unknown outcome: their requests are unsettled until
/// etcd says whether the lease needs renewing for them ([`super::confirm`]), or another request of their lease is
/// sent (they share its renewal).
pub fn unsettle_unanswered(leases: &mut BTreeMap<i64, LeaseRenewals>) {
    for renewals in leases.values_mut() {
        let Some(&(latest, _)) = renewals.in_flight.back() else {
            continue;
        };
        let (since, waiters) = renewals
            .unsettled
            .get_or_insert_with(|| (latest, Vec::new()));
        *since = (*since).max(latest);
        waiters.extend(renewals.in_flight.drain(..).flat_map(|(_, batch)| batch));
    }
}

pub fn queue(leases: &mut BTreeMap<i64, LeaseRenewals>, renew: Renew) {
    leases
        .entry(renew.lease_id)
        .or_default()
        .queued
        .push(renew.waiter);
}

/// Drops the queued requests of client streams that have ended (or end with an earlier request's error), and the
/// leases left with nothing to do.
///
/// Nobody waits for such a request's answer, and renewing for it would keep the lease alive after its client
/// stopped, which a client talking to etcd directly would not see: its request was either renewed before it left
/// or never arrived (etcd reads nothing of a stream after the error that ends it). Such requests are the ones
/// re-queued after a broken upstream stream, or queued while their client left or was failed.
pub fn forget_departed(leases: &mut BTreeMap<i64, LeaseRenewals>) {
    for renewals in leases.values_mut() {
        renewals.queued.retain(|waiter| !waiter.is_abandoned());
        if let Some((_, waiters)) = &mut renewals.unsettled {
            waiters.retain(|waiter| !waiter.is_abandoned());
            if waiters.is_empty() {
                renewals.unsettled = None;
            }
        }
    }
    leases.retain(|_, renewals| !renewals.is_idle());
}

/// Sends, at `now`, one renewal per lease with queued requests from client streams still open; the lease's
/// unsettled requests share it (it is performed after they arrived). A lease with only unsettled requests waits
/// for [`super::confirm`].
pub fn send_queued(
    leases: &mut BTreeMap<i64, LeaseRenewals>,
    tx: &mpsc::UnboundedSender<LeaseKeepAliveRequest>,
    metrics: &Metrics,
    now: Instant,
) {
    forget_departed(leases);
    for (&id, renewals) in leases.iter_mut() {
        if renewals.queued.is_empty() {
            continue;
        }
        let mut batch = std::mem::take(&mut renewals.queued);
        batch.extend(
            renewals
                .unsettled
                .take()
                .into_iter()
                .flat_map(|(_, waiters)| waiters),
        );
        metrics.lease_renewals_forwarded.inc();
        metrics.lease_renewals_shared.inc_by(batch.len() as u64 - 1);
        renewals.in_flight.push_back((now, batch));
        // If the stream is gone the batch stays in flight and is re-sent on the next stream.
        let _ = tx.send(LeaseKeepAliveRequest { id });
    }
}

/// Answers the oldest renewal in flight for the answered lease.
pub fn deliver(leases: &mut BTreeMap<i64, LeaseRenewals>, answer: LeaseKeepAliveResponse) {
    let Some(renewals) = leases.get_mut(&answer.id) else {
        return;
    };
    let Some((_, batch)) = renewals.in_flight.pop_front() else {
        return;
    };
    for waiter in batch {
        waiter.answer(Ok(answer));
    }
    if renewals.is_idle() {
        leases.remove(&answer.id);
    }
}

pub fn fail_all(leases: &mut BTreeMap<i64, LeaseRenewals>, status: &Status) {
    for (_, renewals) in std::mem::take(leases) {
        for waiter in renewals.into_waiters() {
            waiter.answer(Err(error::to_client(clone_status(status))));
        }
    }
}

pub fn fail_leader_requirers(leases: &mut BTreeMap<i64, LeaseRenewals>, status: &Status) {
    for renewals in leases.values_mut() {
        let mut failed = take_leader_requirers(&mut renewals.queued);
        for (_, batch) in renewals.in_flight.iter_mut() {
            failed.extend(take_leader_requirers(batch));
        }
        renewals.in_flight.retain(|(_, batch)| !batch.is_empty());
        if let Some((_, waiters)) = &mut renewals.unsettled {
            failed.extend(take_leader_requirers(waiters));
            if waiters.is_empty() {
                renewals.unsettled = None;
            }
        }
        for waiter in failed {
            waiter.answer(Err(Status::unavailable(status.message())));
        }
    }
    leases.retain(|_, renewals| !renewals.is_idle());
}

/// Takes the requests of client streams that require a leader out of `waiters`.
fn take_leader_requirers(waiters: &mut Vec<Waiter>) -> Vec<Waiter> {
    let (failed, kept) = std::mem::take(waiters)
        .into_iter()
        .partition(|waiter| waiter.requires_leader);
    *waiters = kept;
    failed
}

pub fn oldest_in_flight(leases: &BTreeMap<i64, LeaseRenewals>) -> Option<Instant> {
    leases
        .values()
        .filter_map(|renewals| renewals.in_flight.front().map(|(sent, _)| *sent))
        .min()
}

pub fn clone_status(status: &Status) -> Status {
    Status::new(status.code(), status.message())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::replies::{Answer, Replies};
    use crate::upstream::NO_LEADER;
    use proto::etcdserverpb::ResponseHeader;
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    struct Client {
        answers: mpsc::Receiver<Answer>,
        replies: Replies,
        permits: Arc<Semaphore>,
        requires_leader: bool,
    }

    impl Client {
        fn new(requires_leader: bool) -> Self {
            let (sender, answers) = mpsc::channel(16);
            Self {
                answers,
                replies: Replies::new(sender),
                permits: Arc::new(Semaphore::new(16)),
                requires_leader,
            }
        }

        fn renew(&self, lease_id: i64) -> Renew {
            let permit = self.permits.clone().try_acquire_owned().unwrap();
            Renew {
                lease_id,
                waiter: Waiter {
                    reply: self.replies.ticket().unwrap(),
                    permit,
                    requires_leader: self.requires_leader,
                },
            }
        }

        fn ttls(&mut self) -> Vec<Result<i64, tonic::Code>> {
            let mut seen = Vec::new();
            while let Ok((result, _permit)) = self.answers.try_recv() {
                seen.push(result.map(|r| r.ttl).map_err(|s| s.code()));
            }
            seen
        }
    }

    fn metrics() -> Metrics {
        Metrics::new(prometheus::Registry::new()).unwrap()
    }

    fn answer(id: i64, ttl: i64) -> LeaseKeepAliveResponse {
        LeaseKeepAliveResponse {
            header: Some(ResponseHeader::default()),
            id,
            ttl,
        }
    }

    fn sent(rx: &mut mpsc::UnboundedReceiver<LeaseKeepAliveRequest>) -> Vec<i64> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .map(|r| r.id)
            .collect()
    }

    #[tokio::test]
    async fn requests_queued_together_share_one_renewal() {
        let (metrics, (tx, mut upstream)) = (metrics(), mpsc::unbounded_channel());
        let (mut a, mut b) = (Client::new(false), Client::new(false));
        let mut leases = BTreeMap::new();
        queue(&mut leases, a.renew(7));
        queue(&mut leases, b.renew(7));
        send_queued(&mut leases, &tx, &metrics, Instant::now());
        assert_eq!(sent(&mut upstream), vec![7], "one renewal for two requests");
        deliver(&mut leases, answer(7, 30));
        assert_eq!((a.ttls(), b.ttls()), (vec![Ok(30)], vec![Ok(30)]));
        assert_eq!(metrics.lease_renewals_forwarded.get(), 1);
        assert_eq!(metrics.lease_renewals_shared.get(), 1);
        assert!(leases.is_empty(), "nothing is kept for an idle lease");
    }

    #[tokio::test]
    async fn a_request_never_gets_the_answer_of_a_renewal_sent_before_it_arrived() {
        let (metrics, (tx, mut upstream)) = (metrics(), mpsc::unbounded_channel());
        let (mut early, mut late) = (Client::new(false), Client::new(false));
        let mut leases = BTreeMap::new();
        queue(&mut leases, early.renew(7));
        send_queued(&mut leases, &tx, &metrics, Instant::now());
        queue(&mut leases, late.renew(7));
        send_queued(&mut leases, &tx, &metrics, Instant::now());
        assert_eq!(sent(&mut upstream), vec![7, 7]);
        deliver(&mut leases, answer(7, 29));
        assert_eq!(
            (early.ttls(), late.ttls()),
            (vec![Ok(29)], vec![]),
            "the first answer is the early renewal's"
        );
        deliver(&mut leases, answer(7, 30));
        assert_eq!(late.ttls(), vec![Ok(30)]);
    }

    #[tokio::test]
    async fn answers_are_routed_by_lease_id_and_unknown_leases_get_ttl_zero() {
        let (metrics, (tx, mut upstream)) = (metrics(), mpsc::unbounded_channel());
        let (mut a, mut b) = (Client::new(false), Client::new(false));
        let mut leases = BTreeMap::new();
        queue(&mut leases, a.renew(1));
        queue(&mut leases, b.renew(2));
        send_queued(&mut leases, &tx, &metrics, Instant::now());
        assert_eq!(sent(&mut upstream), vec![1, 2]);
        deliver(&mut leases, answer(2, 0));
        deliver(&mut leases, answer(1, 10));
        assert_eq!((a.ttls(), b.ttls()), (vec![Ok(10)], vec![Ok(0)]));
        deliver(&mut leases, answer(3, 10));
        assert!(leases.is_empty(), "an answer nobody waits for is dropped");
    }

    /// etcd could not say whether the unanswered renewals of `lease` were performed: they are to be renewed.
    fn unknown_to_etcd(leases: &mut BTreeMap<i64, LeaseRenewals>, lease: i64) {
        let unknown = Err(Status::unavailable("no answer"));
        crate::lease::confirm::settle(leases, lease, unknown, Instant::now());
    }

    #[tokio::test]
    async fn unanswered_renewals_wait_for_etcd_to_say_whether_they_were_performed_then_share_one_renewal()
     {
        let (metrics, (tx, mut upstream)) = (metrics(), mpsc::unbounded_channel());
        let mut a = Client::new(false);
        let mut leases = BTreeMap::new();
        queue(&mut leases, a.renew(1));
        send_queued(&mut leases, &tx, &metrics, Instant::now());
        queue(&mut leases, a.renew(1));
        send_queued(&mut leases, &tx, &metrics, Instant::now());
        assert_eq!(sent(&mut upstream), vec![1, 1]);
        unsettle_unanswered(&mut leases);
        send_queued(&mut leases, &tx, &metrics, Instant::now());
        assert_eq!(
            sent(&mut upstream),
            Vec::<i64>::new(),
            "not renewed before etcd is asked"
        );
        unknown_to_etcd(&mut leases, 1);
        send_queued(&mut leases, &tx, &metrics, Instant::now());
        assert_eq!(
            sent(&mut upstream),
            vec![1],
            "both unanswered requests share the renewal on the new stream"
        );
        deliver(&mut leases, answer(1, 9));
        assert_eq!(a.ttls(), vec![Ok(9), Ok(9)]);
    }

    #[tokio::test]
    async fn the_renewal_of_a_client_that_left_is_not_sent_again_on_the_next_stream() {
        let (metrics, (tx, mut upstream)) = (metrics(), mpsc::unbounded_channel());
        let (gone, mut staying) = (Client::new(false), Client::new(false));
        let mut leases = BTreeMap::new();
        queue(&mut leases, gone.renew(1));
        queue(&mut leases, staying.renew(2));
        send_queued(&mut leases, &tx, &metrics, Instant::now());
        queue(&mut leases, gone.renew(3));
        assert_eq!(sent(&mut upstream), vec![1, 2]);
        // The client stream ends while its renewal is unanswered (the upstream stream broke) and while another of
        // its requests still waits to be sent.
        drop(gone);
        unsettle_unanswered(&mut leases);
        forget_departed(&mut leases);
        assert_eq!(
            crate::lease::confirm::to_confirm(&leases),
            vec![2],
            "a renewal nobody waits for would keep the lease alive after its client stopped"
        );
        unknown_to_etcd(&mut leases, 2);
        send_queued(&mut leases, &tx, &metrics, Instant::now());
        assert_eq!(sent(&mut upstream), vec![2]);
        deliver(&mut leases, answer(2, 9));
        assert_eq!(staying.ttls(), vec![Ok(9)]);
        assert!(leases.is_empty(), "nothing is kept for the departed client");
    }

    #[tokio::test]
    async fn only_streams_that_require_a_leader_are_told_there_is_none() {
        let (metrics, (tx, _upstream)) = (metrics(), mpsc::unbounded_channel());
        let (mut strict, mut relaxed) = (Client::new(true), Client::new(false));
        let mut leases = BTreeMap::new();
        queue(&mut leases, strict.renew(1));
        queue(&mut leases, relaxed.renew(1));
        send_queued(&mut leases, &tx, &metrics, Instant::now());
        queue(&mut leases, strict.renew(1));
        fail_leader_requirers(&mut leases, &Status::unavailable(NO_LEADER));
        assert_eq!(
            strict.ttls(),
            vec![Err(tonic::Code::Unavailable)],
            "one error, which ends the stream"
        );
        assert_eq!(relaxed.ttls(), vec![]);
        deliver(&mut leases, answer(1, 5));
        assert_eq!(
            relaxed.ttls(),
            vec![Ok(5)],
            "the other stream still gets its answer"
        );
    }

    #[tokio::test]
    async fn an_error_from_etcd_reaches_every_waiting_request() {
        let (metrics, (tx, _upstream)) = (metrics(), mpsc::unbounded_channel());
        let mut a = Client::new(false);
        let mut leases = BTreeMap::new();
        queue(&mut leases, a.renew(1));
        send_queued(&mut leases, &tx, &metrics, Instant::now());
        queue(&mut leases, a.renew(2));
        fail_all(
            &mut leases,
            &Status::invalid_argument("etcdserver: something"),
        );
        assert_eq!(
            a.ttls(),
            vec![Err(tonic::Code::InvalidArgument)],
            "one error, which ends the stream"
        );
        assert!(leases.is_empty());
    }
}
