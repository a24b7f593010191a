//! One client keep-alive stream's answers, in the order of its requests, and the stream's end.
//!
//! etcd serves a keep-alive stream one request at a time (read, renew, answer), so a direct client reads its
//! answers in request order whatever their leases. The coalescer answers lease by lease, as etcd's answers come
//! back on the shared stream, and a request may share a renewal with the stream's earlier requests for its lease:
//! its answer can be ready before the answer to an earlier request for another lease. So each request takes a
//! ticket when the client stream reads it ([`Replies::ticket`]), and an answer waits here until every earlier
//! ticket has gone out.
//!
//! An error ends the client stream, as etcd's error ends a direct one, and etcd reads no request of a stream it has
//! ended. So from the first ticket answered with an error on, nothing of the stream goes out or is renewed: no more
//! tickets are handed out (the client stream stops reading), and the coalescer forgets the stream's later requests
//! it still holds ([`Reply::is_abandoned`]), which would otherwise keep their leases alive for a client that will
//! only ever see the error.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use proto::etcdserverpb::LeaseKeepAliveResponse;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tonic::Status;

/// An answer on its way to a client stream, holding the permit of the request it answers.
pub type Answer = (Result<LeaseKeepAliveResponse, Status>, OwnedSemaphorePermit);

/// The answers of one client stream: its reader takes a ticket for each request it reads.
pub struct Replies(Arc<Mutex<Order>>);

/// Where the answer to one request goes, and when.
pub struct Reply {
    order: Arc<Mutex<Order>>,
    ticket: u64,
    /// Answered: nothing to release when dropped.
    answered: bool,
}

struct Order {
    /// The client stream's response queue. It holds as many answers as the stream may have requests unanswered,
    /// so an answer always fits.
    answers: mpsc::Sender<Answer>,
    /// The ticket of the next request read.
    next_ticket: u64,
    /// The ticket whose answer goes out next.
    next_out: u64,
    /// Answers ready before their turn, by ticket; `None` for a request dropped unanswered (its client left).
    ready: BTreeMap<u64, Option<Answer>>,
    /// The first ticket answered with an error: the stream ends with it.
    end: Option<u64>,
}

fn lock(order: &Mutex<Order>) -> MutexGuard<'_, Order> {
    // Nothing panics while holding it; a poisoned order is still consistent.
    order.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Replies {
    /// The answers of a client stream whose response queue is `answers`. The stream ends cleanly (its queue
    /// closes) once this and every [`Reply`] taken from it are gone.
    pub fn new(answers: mpsc::Sender<Answer>) -> Self {
        Self(Arc::new(Mutex::new(Order {
            answers,
            next_ticket: 0,
            next_out: 0,
            ready: BTreeMap::new(),
            end: None,
        })))
    }

    /// The place of the next request read; none once the stream has ended with an error.
    pub fn ticket(&self) -> Option<Reply> {
        let mut order = lock(&self.0);
        if order.end.is_some() {
            return None;
        }
        let ticket = order.next_ticket;
        order.next_ticket += 1;
        Some(Reply {
            order: self.0.clone(),
            ticket,
            answered: false,
        })
    }
}

impl Reply {
    /// Answers the request: the answer goes out after those of the stream's earlier requests.
    pub fn send(mut self, answer: Answer) {
        self.answered = true;
        lock(&self.order).settle(self.ticket, Some(answer));
    }

    /// Nobody will read this answer: the client stream is gone, or ends with an earlier request's error.
    pub fn is_abandoned(&self) -> bool {
        let order = lock(&self.order);
        order.answers.is_closed() || order.end.is_some_and(|end| end < self.ticket)
    }
}

impl Drop for Reply {
    /// A request dropped unanswered (its client stream left) must not hold back the answers after it.
    fn drop(&mut self) {
        if !self.answered {
            lock(&self.order).settle(self.ticket, None);
        }
    }
}

impl Order {
    /// `ticket` is settled with `answer` (none: dropped); sends every answer whose turn has come.
    fn settle(&mut self, ticket: u64, answer: Option<Answer>) {
        if self.end.is_some_and(|end| end < ticket) {
            return;
        }
        if matches!(answer, Some((Err(_), _))) {
            self.end = Some(ticket);
            // Answers of later requests were for a stream etcd would have ended first: their permits go now.
            self.ready.split_off(&ticket);
        }
        self.ready.insert(ticket, answer);
        while let Some(answer) = self.ready.remove(&self.next_out) {
            self.next_out += 1;
            if let Some(answer) = answer {
                // Never full (see `answers`); closed when the client left, and then nobody reads it.
                let _ = self.answers.try_send(answer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::etcdserverpb::ResponseHeader;
    use tokio::sync::Semaphore;

    fn stream() -> (Replies, mpsc::Receiver<Answer>) {
        let (answers, received) = mpsc::channel(16);
        (Replies::new(answers), received)
    }

    fn ttl(ttl: i64) -> Answer {
        let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        let response = LeaseKeepAliveResponse {
            header: Some(ResponseHeader::default()),
            id: 1,
            ttl,
        };
        (Ok(response), permit)
    }

    fn refused() -> Answer {
        let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        (Err(Status::unavailable("etcdserver: no leader")), permit)
    }

    fn received(answers: &mut mpsc::Receiver<Answer>) -> Vec<Result<i64, tonic::Code>> {
        std::iter::from_fn(|| answers.try_recv().ok())
            .map(|(answer, _)| answer.map(|a| a.ttl).map_err(|s| s.code()))
            .collect()
    }

    #[test]
    fn an_answer_waits_for_the_answers_to_earlier_requests() {
        let (replies, mut answers) = stream();
        let [first, second, third] = [(); 3].map(|_| replies.ticket().unwrap());
        third.send(ttl(3));
        second.send(ttl(2));
        assert_eq!(
            received(&mut answers),
            vec![],
            "the first request is unanswered"
        );
        first.send(ttl(1));
        assert_eq!(received(&mut answers), vec![Ok(1), Ok(2), Ok(3)]);
    }

    #[test]
    fn a_request_dropped_unanswered_holds_nothing_back() {
        let (replies, mut answers) = stream();
        let [first, second] = [(); 2].map(|_| replies.ticket().unwrap());
        second.send(ttl(2));
        drop(first);
        assert_eq!(received(&mut answers), vec![Ok(2)]);
    }

    #[test]
    fn an_error_ends_the_stream_after_the_earlier_answers() {
        let (replies, mut answers) = stream();
        let [first, second, third] = [(); 3].map(|_| replies.ticket().unwrap());
        third.send(ttl(3));
        second.send(refused());
        assert!(
            replies.ticket().is_none(),
            "etcd reads no more of the stream"
        );
        first.send(ttl(1));
        assert_eq!(
            received(&mut answers),
            vec![Ok(1), Err(tonic::Code::Unavailable)],
            "the later request's answer is dropped"
        );
    }

    #[test]
    fn requests_after_the_error_are_abandoned_and_earlier_ones_are_not() {
        let (replies, mut answers) = stream();
        let [first, second, third] = [(); 3].map(|_| replies.ticket().unwrap());
        second.send(refused());
        assert!(!first.is_abandoned(), "etcd answers it before the error");
        assert!(third.is_abandoned(), "etcd never reads it");
        answers.close();
        assert!(first.is_abandoned(), "the client left");
    }
}
