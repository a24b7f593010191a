//! The keep-alive coalescer against a reference model: arbitrary interleavings of client streams (opening,
//! closing, keep-alive requests for a few leases with and without `hasleader`, slow readers whose permits run out)
//! and of the upstream side (the coalescer taking requests and sending renewals, etcd performing them in order on a
//! lease table with a clock the property moves, answers read, the stream ending for a broken connection, a lost
//! leader, an error from etcd or a move to another endpoint, after which renewals left unanswered are settled by
//! etcd's LeaseTimeToLive). The driver plays `run` and `serve_stream` step by step with the coalescer's own state
//! functions, without sockets; every answer a client reads is checked against what etcd did.
//!
//! The property runs `FUZZ_CASES` cases (default 1000) from `FUZZ_SEED` (default 0), as `watch/hub_fuzz.rs` does;
//! a failure prints the seed, and `ci/fuzz.sh` varies it.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use proto::etcdserverpb::{
    LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseTimeToLiveResponse, ResponseHeader,
};
use testkit::fuzz::check;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;
use tonic::Status;

use crate::error;
use crate::lease::confirm::{settle as settle_unanswered, to_confirm};
use crate::lease::renewals::{
    LeaseRenewals, Renew, Waiter, deliver, fail_all, fail_leader_requirers, forget_departed, queue,
    send_queued, unsettle_unanswered,
};
use crate::lease::replies::{Answer, Replies};
use crate::metrics::Metrics;
use crate::upstream::NO_LEADER;

const CLUSTER: u64 = 77;
/// The member ID in the header of etcd's answers to LeaseTimeToLive (renewals' answers carry member 1), so that the
/// checker can tell an answer taken from a lookup.
const LOOKUP_MEMBER: u64 = 2;
/// Client streams open at once.
const SLOTS: usize = 3;
/// Leases 1 to 3 are granted at the start; 4 never is (etcd answers it TTL 0, as any unknown lease).
const LEASES: i64 = 4;
/// Permits (and answer queue) of a client that reads after every step: far more than a case can use.
const FAST_PERMITS: usize = 256;

// ---------------------------------------------------------------------------------------------------------------
// The model etcd: its lease table on a clock the property moves, and the renewals the coalescer sent.

/// The header of etcd's answer to renewal `serial`. etcd writes its store revision there; the model writes the
/// renewal's serial number instead, so that the checker can tell which renewal an answer comes from (the
/// coalescer passes answers on unchanged, header included).
fn header(serial: usize) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        cluster_id: CLUSTER,
        member_id: 1,
        revision: serial as i64,
        raft_term: 2,
    })
}

/// The header of etcd's answer to lookup `serial` (LeaseTimeToLive), told apart by its member.
fn lookup_header(serial: usize) -> Option<ResponseHeader> {
    Some(ResponseHeader {
        member_id: LOOKUP_MEMBER,
        ..header(serial).expect("a header")
    })
}

/// One LeaseTimeToLive etcd answered: what it found of the lease, at which second.
#[derive(Clone, Copy, Debug)]
struct Lookup {
    lease: i64,
    at: u64,
    /// The lease's granted TTL and the first second at which it is expired; `None`: etcd had no such lease.
    found: Option<Granted>,
}

#[derive(Clone, Copy, Debug)]
struct Granted {
    ttl: i64,
    /// The first second at which the lease is expired.
    expires: u64,
}

/// One renewal the coalescer sent upstream.
#[derive(Debug)]
struct Renewal {
    lease: i64,
    /// When the coalescer sent it (on the driver's step clock, which also times requests' arrivals).
    sent_at: u64,
    /// etcd's answer, once etcd performed it.
    answer: Option<LeaseKeepAliveResponse>,
}

#[derive(Debug, Default)]
struct Etcd {
    /// etcd's clock, in seconds.
    now: u64,
    leases: BTreeMap<i64, Granted>,
    /// Every renewal ever sent, by serial number.
    renewals: Vec<Renewal>,
    /// Renewals sent on the current stream that etcd has not performed yet, oldest first.
    inbox: VecDeque<usize>,
    /// etcd's answers on the current stream that the coalescer has not read yet.
    outbox: VecDeque<LeaseKeepAliveResponse>,
    /// Every LeaseTimeToLive answered, by serial number.
    lookups: Vec<Lookup>,
}

impl Etcd {
    /// LeaseGrant with an explicit ID (refused by etcd if the lease exists).
    fn grant(&mut self, lease: i64, ttl: i64) {
        let now = self.now;
        self.leases.entry(lease).or_insert(Granted {
            ttl,
            expires: now + ttl as u64,
        });
    }

    fn sent(&mut self, lease: i64, sent_at: u64) {
        self.inbox.push_back(self.renewals.len());
        self.renewals.push(Renewal {
            lease,
            sent_at,
            answer: None,
        });
    }

    /// etcd performs the next renewal of the stream and answers, as its lessor and keep-alive server do: a live
    /// lease is renewed for its granted TTL; an expired one is revoked, and renewing an unknown lease answers TTL 0.
    fn perform(&mut self) {
        let Some(serial) = self.inbox.pop_front() else {
            return;
        };
        let lease = self.renewals[serial].lease;
        let ttl = match self.leases.get_mut(&lease) {
            Some(granted) if self.now < granted.expires => {
                granted.expires = self.now + granted.ttl as u64;
                granted.ttl
            }
            Some(_) => {
                self.leases.remove(&lease);
                0
            }
            None => 0,
        };
        let answer = LeaseKeepAliveResponse {
            header: header(serial),
            id: lease,
            ttl,
        };
        self.renewals[serial].answer = Some(answer);
        self.outbox.push_back(answer);
    }

    /// LeaseTimeToLive, as etcd answers it: seconds left, or -1 for a lease it does not have (an expired one is
    /// revoked first, as etcd's lessor does).
    fn look_up(&mut self, lease: i64) -> LeaseTimeToLiveResponse {
        if self
            .leases
            .get(&lease)
            .is_some_and(|g| self.now >= g.expires)
        {
            self.leases.remove(&lease);
        }
        let found = self.leases.get(&lease).copied();
        let serial = self.lookups.len();
        self.lookups.push(Lookup {
            lease,
            at: self.now,
            found,
        });
        LeaseTimeToLiveResponse {
            header: lookup_header(serial),
            id: lease,
            ttl: found.map_or(-1, |g| (g.expires - self.now) as i64),
            granted_ttl: found.map_or(0, |g| g.ttl),
            keys: Vec::new(),
        }
    }

    /// The stream is gone, with what was on it either way.
    fn stream_lost(&mut self) {
        self.inbox.clear();
        self.outbox.clear();
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The checker: what one client stream may read, given what etcd did.

/// A request the proxy read from the client stream.
#[derive(Clone, Copy, Debug)]
struct Asked {
    lease: i64,
    /// When the proxy read it.
    arrived: u64,
    /// etcd's second when the proxy read it.
    arrived_secs: u64,
    /// The coalescer has taken it from its queue.
    taken: bool,
}

#[derive(Debug, Default)]
struct Observer {
    /// Requests whose answers the client has not read, oldest first.
    pending: VecDeque<Asked>,
    /// The error the stream must end with, after how many reads: the upstream stream ended with it while a
    /// request of this stream waited in the coalescer (the answers delivered before still come first).
    owed: Option<(usize, Status)>,
    /// Answers (and errors) read.
    read: usize,
}

impl Observer {
    fn asked(&mut self, lease: i64, arrived: u64, arrived_secs: u64) {
        self.pending.push_back(Asked {
            lease,
            arrived,
            arrived_secs,
            taken: false,
        });
    }

    /// The client reads `answer`. An answer is for the oldest request still waiting, whatever its lease: etcd's
    /// server answers a stream's requests one at a time, in order.
    fn observe(
        &mut self,
        etcd: &Etcd,
        answer: &Result<LeaseKeepAliveResponse, Status>,
    ) -> Result<(), String> {
        let index = self.read;
        self.read += 1;
        let answer = match answer {
            Err(status) => {
                return match &self.owed {
                    Some((at, owed))
                        if *at == index
                            && owed.code() == status.code()
                            && owed.message() == status.message() =>
                    {
                        Ok(())
                    }
                    Some((at, owed)) => Err(format!(
                        "{status:?} as read {index}, where {owed:?} is owed as read {at}"
                    )),
                    None => Err(format!(
                        "an error a direct client would not have seen: {status:?}"
                    )),
                };
            }
            Ok(answer) => answer,
        };
        if self.owed.as_ref().is_some_and(|(at, _)| index >= *at) {
            return Err(format!(
                "an answer where the stream must end with an error: {answer:?}"
            ));
        }
        let position = match self.pending.front() {
            Some(oldest) if oldest.lease == answer.id => Some(0),
            Some(oldest) if self.pending.iter().any(|a| a.lease == answer.id) => {
                return Err(format!(
                    "an answer for lease {} before the answer to the older request for lease {}",
                    answer.id, oldest.lease
                ));
            }
            _ => None,
        };
        let Some(asked) = position.and_then(|p| self.pending.remove(p)) else {
            return Err(format!(
                "an answer for lease {} that no request waits for (a duplicate or made up): {answer:?}",
                answer.id
            ));
        };
        if !asked.taken {
            return Err(format!(
                "an answer for {asked:?}, which the coalescer never took"
            ));
        }
        if answer.header.is_some_and(|h| h.member_id == LOOKUP_MEMBER) {
            return from_lookup(etcd, &asked, answer);
        }
        let serial = answer.header.map_or(-1, |h| h.revision);
        let Some(renewal) = usize::try_from(serial)
            .ok()
            .and_then(|s| etcd.renewals.get(s))
        else {
            return Err(format!("an answer from no renewal sent: {answer:?}"));
        };
        if renewal.answer.as_ref() != Some(answer) {
            return Err(format!(
                "not etcd's answer to renewal {serial} (etcd answered {:?}): {answer:?}",
                renewal.answer
            ));
        }
        if renewal.sent_at <= asked.arrived {
            return Err(format!(
                "a stale answer: renewal {serial} was sent at {}, before the request arrived at {}",
                renewal.sent_at, asked.arrived
            ));
        }
        Ok(())
    }

    /// Everything is delivered and read: every request has its answer, every error owed came.
    fn settled(&self) -> Result<(), String> {
        if let Some((_, owed)) = &self.owed {
            return Err(format!("the error owed never came: {owed:?}"));
        }
        if !self.pending.is_empty() {
            return Err(format!("requests never answered: {:?}", self.pending));
        }
        Ok(())
    }
}

/// An answer taken from etcd's LeaseTimeToLive instead of a renewal (after a stream lost a renewal's answer) is
/// what a renewal would have answered: TTL 0 for a lease etcd did not have, or else the seconds etcd reported
/// left, at least one, of a lease that then lived at least its TTL past the request's arrival (as a renewal when it
/// arrived would have made it).
fn from_lookup(etcd: &Etcd, asked: &Asked, answer: &LeaseKeepAliveResponse) -> Result<(), String> {
    let serial = answer.header.map_or(-1, |h| h.revision);
    let Some(lookup) = usize::try_from(serial)
        .ok()
        .and_then(|s| etcd.lookups.get(s))
    else {
        return Err(format!("an answer from no lookup made: {answer:?}"));
    };
    if lookup.lease != answer.id {
        return Err(format!(
            "lookup {serial} was of lease {}: {answer:?}",
            lookup.lease
        ));
    }
    let Some(granted) = lookup.found else {
        return match answer.ttl {
            0 => Ok(()),
            ttl => Err(format!(
                "TTL {ttl} for a lease etcd no longer had (lookup {serial})"
            )),
        };
    };
    let left = granted.expires - lookup.at;
    if answer.ttl != left as i64 || left < 1 {
        return Err(format!(
            "TTL {} from lookup {serial}, which found {left} s left",
            answer.ttl
        ));
    }
    if granted.expires < asked.arrived_secs + granted.ttl as u64 {
        return Err(format!(
            "lease {} expires at {}, sooner than a renewal at the request's arrival ({}) would make it: {answer:?}",
            answer.id, granted.expires, asked.arrived_secs
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------------------------
// What the property generates.

/// How the upstream stream ends.
#[derive(Clone, Copy, Debug)]
enum End {
    /// The connection broke or etcd stopped answering (an endpoint failure): renewals are retried.
    Broken,
    /// etcd lost its leader (the stream asks for one): streams that require a leader are told, others retried.
    NoLeader,
    /// etcd ended the stream refusing the caller (an invalid token; no endpoint failure): every waiting request
    /// gets it. (A refusal of one renewal is settled by renewing each lease alone: `refusal`, tested on etcd.)
    EtcdError,
    /// Another endpoint became active, or the stream ended cleanly: re-opened at once, renewals retried.
    Moved,
}

impl End {
    fn status(self) -> Option<Status> {
        match self {
            End::Broken => Some(Status::unavailable("upstream keep-alive stream ended")),
            End::NoLeader => Some(Status::unavailable(NO_LEADER)),
            End::EtcdError => Some(Status::unauthenticated("etcdserver: invalid auth token")),
            End::Moved => None,
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// A client stream opens; a slow one reads only when told and has this many permits.
    Open {
        slot: usize,
        requires_leader: bool,
        slow: Option<usize>,
    },
    /// The client stream ends (its answer queue is dropped).
    Close {
        slot: usize,
    },
    /// The client sends a keep-alive request.
    Request {
        slot: usize,
        lease: i64,
    },
    /// A slow client reads its answers.
    Read {
        slot: usize,
    },
    /// The coalescer takes up to `n` requests from its queue and sends what they need.
    Take {
        n: usize,
    },
    /// etcd performs the next `n` renewals of the stream.
    Handle {
        n: usize,
    },
    /// The coalescer reads the next `n` answers of the stream.
    Deliver {
        n: usize,
    },
    /// The upstream stream ends.
    End(End),
    /// The back-off after a failure is over: the coalescer re-opens the stream.
    Reopen,
    Tick {
        secs: u64,
    },
    Revoke {
        lease: i64,
    },
    Grant {
        lease: i64,
        ttl: i64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let slot = 0..SLOTS;
    // Mostly leases that exist at the start.
    let lease = prop_oneof![9 => 1..LEASES, 1 => Just(LEASES)];
    prop_oneof![
        2 => (slot.clone(), client()).prop_map(|(slot, (requires_leader, slow))| Op::Open {
            slot,
            requires_leader,
            slow
        }),
        1 => slot.clone().prop_map(|slot| Op::Close { slot }),
        10 => (slot.clone(), lease.clone()).prop_map(|(slot, lease)| Op::Request { slot, lease }),
        2 => slot.prop_map(|slot| Op::Read { slot }),
        6 => (1usize..5).prop_map(|n| Op::Take { n }),
        5 => (1usize..4).prop_map(|n| Op::Handle { n }),
        5 => (1usize..4).prop_map(|n| Op::Deliver { n }),
        2 => prop_oneof![
            2 => Just(End::Broken),
            2 => Just(End::NoLeader),
            1 => Just(End::EtcdError),
            1 => Just(End::Moved),
        ].prop_map(Op::End),
        2 => Just(Op::Reopen),
        1 => (1u64..4).prop_map(|secs| Op::Tick { secs }),
        1 => lease.clone().prop_map(|lease| Op::Revoke { lease }),
        1 => (lease, 1i64..10).prop_map(|(lease, ttl)| Op::Grant { lease, ttl }),
    ]
}

/// Whether a client stream requires a leader, and whether it is slow (reads only when told), with how many
/// permits.
fn client() -> impl Strategy<Value = (bool, Option<usize>)> {
    (
        any::<bool>(),
        prop_oneof![3 => Just(None), 1 => (1usize..4).prop_map(Some)],
    )
}

/// The TTLs of leases 1 to 3 at the start, and the client streams open at the start.
#[derive(Clone, Debug)]
struct Setup {
    ttls: [i64; 3],
    clients: [Option<(bool, Option<usize>)>; SLOTS],
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        [1i64..12, 1i64..12, 1i64..12],
        [
            prop::option::weighted(0.8, client()),
            prop::option::weighted(0.8, client()),
            prop::option::weighted(0.8, client()),
        ],
    )
        .prop_map(|(ttls, clients)| Setup { ttls, clients })
}

// ---------------------------------------------------------------------------------------------------------------
// The driver: plays the clients, the coalescer's actor (`run`, `serve_stream`) and etcd.

struct Client {
    stream: u64,
    answers: mpsc::Receiver<Answer>,
    /// The client reader's tickets, one for each request's waiter.
    replies: Replies,
    permits: Arc<Semaphore>,
    requires_leader: bool,
    slow: bool,
    /// Requests the client sent that the proxy has not read: its reader waits for a permit.
    blocked: VecDeque<i64>,
    observer: Observer,
}

/// Where the coalescer's actor stands.
enum Actor {
    /// No upstream stream: nothing to renew; the first request opens one.
    Idle,
    /// Serving an upstream stream; what it sends arrives at `upstream`.
    Serving {
        tx: mpsc::UnboundedSender<LeaseKeepAliveRequest>,
        upstream: mpsc::UnboundedReceiver<LeaseKeepAliveRequest>,
    },
    /// The stream failed; the actor waits out its back-off.
    Backoff,
}

struct World {
    leases: BTreeMap<i64, LeaseRenewals>,
    metrics: Metrics,
    etcd: Etcd,
    actor: Actor,
    /// The coalescer's request queue, each request tagged with its client stream.
    requests: VecDeque<(u64, Renew)>,
    clients: [Option<Client>; SLOTS],
    next_stream: u64,
    /// Orders arrivals and sends.
    clock: u64,
    /// The instant of etcd's second 0.
    start: Instant,
}

impl World {
    fn new(setup: &Setup) -> Self {
        let mut etcd = Etcd::default();
        for (lease, ttl) in (1..).zip(setup.ttls) {
            etcd.grant(lease, ttl);
        }
        let mut world = Self {
            leases: BTreeMap::new(),
            metrics: Metrics::new(prometheus::Registry::new()).expect("metrics"),
            etcd,
            actor: Actor::Idle,
            requests: VecDeque::new(),
            clients: [None, None, None],
            next_stream: 1,
            clock: 0,
            start: Instant::now(),
        };
        for (slot, client) in setup.clients.iter().enumerate() {
            if let Some((requires_leader, slow)) = *client {
                world.open(slot, requires_leader, slow);
            }
        }
        world
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn open(&mut self, slot: usize, requires_leader: bool, slow: Option<usize>) {
        if self.clients[slot].is_some() {
            return;
        }
        // As `lease::client_stream`: as many permits as the answer queue holds.
        let permits = slow.unwrap_or(FAST_PERMITS);
        let (sender, answers) = mpsc::channel(permits);
        self.clients[slot] = Some(Client {
            stream: self.next_stream,
            answers,
            replies: Replies::new(sender),
            permits: Arc::new(Semaphore::new(permits)),
            requires_leader,
            slow: slow.is_some(),
            blocked: VecDeque::new(),
            observer: Observer::default(),
        });
        self.next_stream += 1;
    }

    /// The client of `slot` sends a request for `lease`; the proxy reads it if a permit is free.
    fn request(&mut self, slot: usize, lease: i64) {
        let Some(client) = self.clients[slot].as_mut() else {
            return;
        };
        client.blocked.push_back(lease);
        self.unblock(slot);
    }

    /// The client reader hands over the requests it can get permits for, in order.
    fn unblock(&mut self, slot: usize) {
        loop {
            let arrived = self.clock + 1;
            let Some(client) = self.clients[slot].as_mut() else {
                return;
            };
            let Some(&lease) = client.blocked.front() else {
                return;
            };
            let Ok(permit) = client.permits.clone().try_acquire_owned() else {
                return;
            };
            // As `lease::client_stream`: nothing more is read of a stream told its error.
            let Some(reply) = client.replies.ticket() else {
                return;
            };
            client.blocked.pop_front();
            client.observer.asked(lease, arrived, self.etcd.now);
            let renew = Renew {
                lease_id: lease,
                waiter: Waiter {
                    reply,
                    permit,
                    requires_leader: client.requires_leader,
                },
            };
            self.requests.push_back((client.stream, renew));
            self.tick();
        }
    }

    /// The client of `slot` reads what it was sent; an error ends its stream.
    fn read(&mut self, slot: usize) -> Result<(), TestCaseError> {
        let Some(client) = self.clients[slot].as_mut() else {
            return Ok(());
        };
        while let Ok((answer, permit)) = client.answers.try_recv() {
            drop(permit);
            if let Err(why) = client.observer.observe(&self.etcd, &answer) {
                return Err(TestCaseError::fail(format!(
                    "stream {}: {why}",
                    client.stream
                )));
            }
            if answer.is_err() {
                self.clients[slot] = None;
                return Ok(());
            }
        }
        self.unblock(slot);
        Ok(())
    }

    fn read_fast(&mut self) -> Result<(), TestCaseError> {
        for slot in 0..SLOTS {
            if self.clients[slot].as_ref().is_some_and(|c| !c.slow) {
                self.read(slot)?;
            }
        }
        Ok(())
    }

    /// The coalescer takes the next request from its queue.
    fn take_one(&mut self) -> bool {
        let Some((stream, renew)) = self.requests.pop_front() else {
            return false;
        };
        if let Some(client) = self
            .clients
            .iter_mut()
            .flatten()
            .find(|c| c.stream == stream)
            && let Some(asked) = client.observer.pending.iter_mut().find(|a| !a.taken)
        {
            asked.taken = true;
        }
        queue(&mut self.leases, renew);
        true
    }

    /// The top of `run`'s loop: unanswered renewals are unsettled, then a stream opens if there is anything
    /// to renew.
    fn restart(&mut self) -> Result<(), TestCaseError> {
        unsettle_unanswered(&mut self.leases);
        forget_departed(&mut self.leases);
        if self.leases.is_empty() && !self.take_one() {
            self.actor = Actor::Idle;
            return Ok(());
        }
        self.open_stream()
    }

    /// The coalescer's `serve`: unsettled renewals are settled by LeaseTimeToLive, then a stream opens and what is
    /// queued is sent.
    fn open_stream(&mut self) -> Result<(), TestCaseError> {
        let asked = self.instant();
        for lease in to_confirm(&self.leases) {
            let looked_up = self.etcd.look_up(lease);
            settle_unanswered(&mut self.leases, lease, Ok(looked_up), asked);
        }
        let (tx, upstream) = mpsc::unbounded_channel();
        self.actor = Actor::Serving { tx, upstream };
        self.etcd.stream_lost();
        self.send()
    }

    /// etcd's clock as the coalescer's: its sends and lookups are timed on it.
    fn instant(&self) -> Instant {
        self.start + Duration::from_secs(self.etcd.now)
    }

    /// `send_queued`, then etcd receives what was sent: only renewals some client stream still waits for.
    fn send(&mut self) -> Result<(), TestCaseError> {
        let at = self.instant();
        let Actor::Serving { tx, upstream } = &mut self.actor else {
            return Ok(());
        };
        send_queued(&mut self.leases, tx, &self.metrics, at);
        let mut sent = Vec::new();
        while let Ok(request) = upstream.try_recv() {
            sent.push(request.id);
        }
        for lease in sent {
            let wanted = self.clients.iter().flatten().any(|c| {
                // A stream told its error has ended, even before its client reads the error.
                c.observer.owed.is_none()
                    && c.observer
                        .pending
                        .iter()
                        .any(|a| a.taken && a.lease == lease)
            });
            prop_assert!(
                wanted,
                "a renewal of lease {} sent for no client stream still open and waiting",
                lease
            );
            let at = self.tick();
            self.etcd.sent(lease, at);
        }
        Ok(())
    }

    /// The coalescer takes up to `n` requests from its queue.
    fn take(&mut self, n: usize) -> Result<(), TestCaseError> {
        match self.actor {
            Actor::Backoff => Ok(()),
            // `run` waits for the first request, then opens a stream for it.
            Actor::Idle => {
                if self.take_one() {
                    self.open_stream()?;
                }
                Ok(())
            }
            Actor::Serving { .. } => {
                let mut taken = 0;
                while taken < n && self.take_one() {
                    taken += 1;
                }
                if taken > 0 {
                    self.send()?;
                }
                Ok(())
            }
        }
    }

    /// The upstream stream ends `how`; `run` handles the end as here.
    fn end(&mut self, how: End) -> Result<(), TestCaseError> {
        if !matches!(self.actor, Actor::Serving { .. }) {
            return Ok(());
        }
        self.etcd.stream_lost();
        let Some(status) = how.status() else {
            return self.restart();
        };
        self.actor = Actor::Backoff;
        if error::is_endpoint_failure(&status) {
            if status.message() == NO_LEADER {
                self.owe(true, Status::unavailable(NO_LEADER));
                fail_leader_requirers(&mut self.leases, &status);
            }
        } else {
            self.owe(
                false,
                error::to_client(Status::new(status.code(), status.message())),
            );
            fail_all(&mut self.leases, &status);
        }
        Ok(())
    }

    /// Every client stream (that requires a leader, if `leader_only`) with a request waiting in the coalescer
    /// must now end with `status`, as a direct stream would.
    fn owe(&mut self, leader_only: bool, status: Status) {
        for client in self.clients.iter_mut().flatten() {
            if leader_only && !client.requires_leader {
                continue;
            }
            let taken = client.observer.pending.iter().filter(|a| a.taken).count();
            let delivered = client.answers.len();
            if taken > delivered && client.observer.owed.is_none() {
                let at = client.observer.read + delivered;
                client.observer.owed = Some((at, Status::new(status.code(), status.message())));
            }
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Open {
                slot,
                requires_leader,
                slow,
            } => self.open(slot, requires_leader, slow),
            Op::Close { slot } => self.clients[slot] = None,
            Op::Request { slot, lease } => self.request(slot, lease),
            Op::Read { slot } => self.read(slot)?,
            Op::Take { n } => self.take(n)?,
            Op::Handle { n } => {
                for _ in 0..n {
                    self.etcd.perform();
                }
            }
            Op::Deliver { n } => {
                for _ in 0..n {
                    let Some(answer) = self.etcd.outbox.pop_front() else {
                        break;
                    };
                    deliver(&mut self.leases, answer);
                }
            }
            Op::End(how) => self.end(how)?,
            Op::Reopen => {
                if matches!(self.actor, Actor::Backoff) {
                    self.restart()?;
                }
            }
            Op::Tick { secs } => self.etcd.now += secs,
            Op::Revoke { lease } => {
                self.etcd.leases.remove(&lease);
            }
            Op::Grant { lease, ttl } => self.etcd.grant(lease, ttl),
        }
        self.read_fast()
    }

    fn quiet(&self) -> bool {
        self.requests.is_empty()
            && self.etcd.inbox.is_empty()
            && self.etcd.outbox.is_empty()
            && !matches!(self.actor, Actor::Backoff)
            && self.clients.iter().flatten().all(|c| c.blocked.is_empty())
    }

    /// Lets the coalescer and etcd run until nothing moves, every client reading.
    fn settle(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..64 {
            for slot in 0..SLOTS {
                self.read(slot)?;
            }
            self.step(&Op::Reopen)?;
            while !self.requests.is_empty() {
                self.step(&Op::Take { n: usize::MAX })?;
            }
            while !self.etcd.inbox.is_empty() {
                self.step(&Op::Handle { n: 1 })?;
            }
            self.step(&Op::Deliver { n: usize::MAX })?;
            for slot in 0..SLOTS {
                self.read(slot)?;
            }
            if self.quiet() {
                return Ok(());
            }
        }
        Err(TestCaseError::fail("the coalescer and etcd never settled"))
    }

    fn run(&mut self, ops: &[Op]) -> Result<(), TestCaseError> {
        for op in ops {
            self.step(op)?;
        }
        self.settle()?;
        for client in self.clients.iter().flatten() {
            if let Err(why) = client.observer.settled() {
                return Err(TestCaseError::fail(format!(
                    "stream {}: {why}",
                    client.stream
                )));
            }
        }
        // Every client goes: nothing may be renewed or kept for them.
        self.clients = [None, None, None];
        self.settle()?;
        prop_assert!(
            self.leases.is_empty(),
            "renewal state left after every client went: leases {:?}",
            self.leases.keys().collect::<Vec<_>>()
        );
        prop_assert_eq!(
            self.metrics.lease_renewals_forwarded.get(),
            self.etcd.renewals.len() as u64
        );
        Ok(())
    }
}

#[test]
fn every_keep_alive_request_gets_the_answer_etcd_would_give() {
    let cases = (setup(), prop::collection::vec(op(), 1..100));
    check(1000, cases, |(setup, ops)| World::new(&setup).run(&ops));
}

// ---------------------------------------------------------------------------------------------------------------
// The checker rejects broken histories (so that the property can fail).

/// etcd renewed lease 1 (TTL 10) twice, sending renewal 0 at 2 and renewal 1 at 4; the client asked at 1 and 3.
fn asked_twice() -> (Etcd, Observer, [LeaseKeepAliveResponse; 2]) {
    let mut etcd = Etcd::default();
    etcd.grant(1, 10);
    let mut observer = Observer::default();
    observer.asked(1, 1, 0);
    etcd.sent(1, 2);
    observer.asked(1, 3, 0);
    etcd.sent(1, 4);
    etcd.perform();
    etcd.perform();
    for asked in &mut observer.pending {
        asked.taken = true;
    }
    let answers = [etcd.outbox[0], etcd.outbox[1]];
    (etcd, observer, answers)
}

#[test]
fn the_checker_accepts_what_etcd_would_send() {
    let (etcd, mut observer, [first, second]) = asked_twice();
    assert_eq!((first.ttl, second.ttl), (10, 10));
    observer.observe(&etcd, &Ok(first)).unwrap();
    observer.observe(&etcd, &Ok(second)).unwrap();
    observer.settled().unwrap();
    // Both requests may share the later renewal: it was sent after both arrived.
    let (etcd, mut observer, [_, second]) = asked_twice();
    observer.observe(&etcd, &Ok(second)).unwrap();
    observer.observe(&etcd, &Ok(second)).unwrap();
    observer.settled().unwrap();
}

#[test]
fn the_checker_rejects_a_duplicate_answer() {
    let (etcd, mut observer, [first, second]) = asked_twice();
    observer.observe(&etcd, &Ok(first)).unwrap();
    observer.observe(&etcd, &Ok(second)).unwrap();
    let err = observer.observe(&etcd, &Ok(second)).unwrap_err();
    assert!(err.contains("no request waits"), "{err}");
}

#[test]
fn the_checker_rejects_a_stale_answer_from_an_earlier_renewal() {
    let (etcd, mut observer, [first, _]) = asked_twice();
    observer.observe(&etcd, &Ok(first)).unwrap();
    let err = observer.observe(&etcd, &Ok(first)).unwrap_err();
    assert!(err.contains("stale"), "{err}");
}

#[test]
fn the_checker_rejects_answers_in_the_wrong_order() {
    // For one lease: the later renewal's answer first leaves the earlier one for the request sent after it.
    let (etcd, mut observer, [first, second]) = asked_twice();
    observer.observe(&etcd, &Ok(second)).unwrap();
    let err = observer.observe(&etcd, &Ok(first)).unwrap_err();
    assert!(err.contains("stale"), "{err}");
    // Across leases.
    let mut etcd = Etcd::default();
    etcd.grant(1, 10);
    etcd.grant(2, 10);
    let mut observer = Observer::default();
    observer.asked(2, 1, 0);
    observer.asked(1, 2, 0);
    for asked in &mut observer.pending {
        asked.taken = true;
    }
    etcd.sent(1, 3);
    etcd.sent(2, 4);
    etcd.perform();
    etcd.perform();
    let err = observer.observe(&etcd, &Ok(etcd.outbox[0])).unwrap_err();
    assert!(
        err.contains("before the answer to the older request"),
        "{err}"
    );
}

#[test]
fn the_checker_rejects_a_missing_answer() {
    let (etcd, mut observer, [first, _]) = asked_twice();
    observer.observe(&etcd, &Ok(first)).unwrap();
    let err = observer.settled().unwrap_err();
    assert!(err.contains("never answered"), "{err}");
}

#[test]
fn the_checker_rejects_a_ttl_etcd_did_not_give() {
    let (etcd, mut observer, [first, _]) = asked_twice();
    let err = observer
        .observe(&etcd, &Ok(LeaseKeepAliveResponse { ttl: 9, ..first }))
        .unwrap_err();
    assert!(err.contains("not etcd's answer"), "{err}");
    // A revoked lease is answered TTL 0 by etcd, and only that will do.
    let (mut etcd, mut observer, _) = asked_twice();
    etcd.leases.remove(&1);
    etcd.sent(1, 5);
    observer.asked(1, 4, 0);
    observer.pending[2].taken = true;
    etcd.perform();
    let revoked = etcd.outbox[2];
    assert_eq!(revoked.ttl, 0);
    observer.pending.pop_front();
    observer.pending.pop_front();
    let err = observer
        .observe(&etcd, &Ok(LeaseKeepAliveResponse { ttl: 10, ..revoked }))
        .unwrap_err();
    assert!(err.contains("not etcd's answer"), "{err}");
}

/// Lease 1 (TTL 10) renewed at second 0 for a request that arrived at second `arrived_secs`, and looked up at
/// second 2 after the renewal's answer was lost.
fn looked_up_after(arrived_secs: u64) -> (Etcd, Observer, LeaseKeepAliveResponse) {
    let mut etcd = Etcd::default();
    etcd.grant(1, 10);
    let mut observer = Observer::default();
    observer.asked(1, 1, arrived_secs);
    observer.pending[0].taken = true;
    etcd.now = 2;
    let looked_up = etcd.look_up(1);
    let answer = LeaseKeepAliveResponse {
        header: looked_up.header,
        id: 1,
        ttl: looked_up.ttl,
    };
    (etcd, observer, answer)
}

#[test]
fn the_checker_accepts_a_lookup_only_for_a_lease_living_as_a_renewal_at_arrival_would_make_it() {
    let (etcd, mut observer, answer) = looked_up_after(0);
    assert_eq!(answer.ttl, 8);
    observer.observe(&etcd, &Ok(answer)).unwrap();
    observer.settled().unwrap();
    // The request arrived at second 1, after the renewal: it would have lived to 11.
    let (etcd, mut observer, answer) = looked_up_after(1);
    let err = observer.observe(&etcd, &Ok(answer)).unwrap_err();
    assert!(err.contains("sooner than a renewal"), "{err}");
    let (etcd, mut observer, answer) = looked_up_after(0);
    let err = observer
        .observe(&etcd, &Ok(LeaseKeepAliveResponse { ttl: 10, ..answer }))
        .unwrap_err();
    assert!(err.contains("found 8 s left"), "{err}");
    // A lease etcd no longer had: TTL 0, as a renewal answers.
    let (mut etcd, mut observer, answer) = looked_up_after(0);
    etcd.leases.clear();
    let gone = etcd.look_up(1);
    assert_eq!(gone.ttl, -1);
    let gone = LeaseKeepAliveResponse {
        header: gone.header,
        ttl: 1,
        ..answer
    };
    let err = observer.observe(&etcd, &Ok(gone)).unwrap_err();
    assert!(err.contains("no longer had"), "{err}");
}

#[test]
fn the_checker_rejects_errors_a_direct_client_would_not_see_and_wants_those_it_would() {
    let no_leader = || Err(Status::unavailable(NO_LEADER));
    let (etcd, mut observer, [first, _]) = asked_twice();
    let err = observer.observe(&etcd, &no_leader()).unwrap_err();
    assert!(err.contains("would not have seen"), "{err}");
    // Owed after the answer already delivered: that answer, then the error, and nothing else.
    let (etcd, mut observer, [first_again, _]) = asked_twice();
    observer.owed = Some((1, Status::unavailable(NO_LEADER)));
    observer.observe(&etcd, &Ok(first_again)).unwrap();
    observer.observe(&etcd, &no_leader()).unwrap();
    let (etcd, mut observer, _) = asked_twice();
    observer.owed = Some((1, Status::unavailable(NO_LEADER)));
    let err = observer.observe(&etcd, &no_leader()).unwrap_err();
    assert!(err.contains("is owed as read 1"), "{err}");
    let (_, mut observer, _) = asked_twice();
    observer.owed = Some((1, Status::unavailable(NO_LEADER)));
    observer.observe(&etcd, &Ok(first)).unwrap();
    let err = observer.settled().unwrap_err();
    assert!(err.contains("never came"), "{err}");
}

// ---------------------------------------------------------------------------------------------------------------
// Deviations the property found (once it checked them), each as the shortest history that shows it.

/// A world with one client stream in slot 0.
fn one_client(requires_leader: bool, slow: Option<usize>) -> World {
    World::new(&Setup {
        ttls: [10, 10, 10],
        clients: [Some((requires_leader, slow)), None, None],
    })
}

/// etcd's server answers a stream's requests one at a time, so a direct client gets its answers in request order
/// whatever the leases. The coalescer lets a request share the next renewal of its lease with the stream's earlier
/// requests for that lease and sends one renewal per lease, so a stream asking for leases 1, 2, 1 in one go had
/// the answers for 1, 1, 2, until `lease::replies` held each answer back behind those of earlier requests.
#[test]
fn answers_for_different_leases_come_in_request_order() {
    let mut world = one_client(false, None);
    for lease in [1, 2, 1] {
        world.step(&Op::Request { slot: 0, lease }).unwrap();
    }
    world.settle().unwrap();
}

/// When etcd loses its leader, a stream that requires one is told so, and that error ends it. Until the client
/// had read everything before the error (a slow client may take a while), the proxy went on reading its requests
/// and the coalescer renewed their leases, which etcd does not do for a stream it has ended: the lease lived on for
/// a client that will only ever see the error. Now nothing more of a stream is read or renewed once its error is
/// given (`lease::replies`): the coalescer forgets the requests it read before, and the client stream reads no more.
#[test]
fn nothing_is_renewed_for_a_stream_already_told_there_is_no_leader() {
    let mut world = one_client(true, Some(3));
    let ops = [
        Op::Request { slot: 0, lease: 1 },
        Op::Take { n: 1 },
        // Read from the client stream, not yet taken by the coalescer.
        Op::Request { slot: 0, lease: 2 },
        Op::End(End::NoLeader),
        // A permit is free, but etcd would not read it.
        Op::Request { slot: 0, lease: 3 },
        Op::Reopen,
        Op::Take { n: 2 },
    ];
    for op in &ops {
        world.step(op).unwrap();
    }
}

/// A renewal that etcd performed but whose answer the broken stream lost was sent again on the next stream: one
/// request renewed its lease twice, and a client that stopped after it saw its lease outlive the stop by the
/// failover's length (simulation seeds fleet 8538 and 11426). Now etcd's LeaseTimeToLive settles it: the lease
/// lives as long as that renewal made it, so the request is answered from there and nothing is renewed again.
#[test]
fn a_renewal_whose_answer_was_lost_is_not_performed_twice() {
    let mut world = one_client(false, None);
    let ops = [
        Op::Request { slot: 0, lease: 1 },
        Op::Take { n: 1 },
        Op::Handle { n: 1 },
        Op::End(End::Broken),
        Op::Tick { secs: 1 },
        Op::Reopen,
    ];
    for op in &ops {
        world.step(op).unwrap();
    }
    world.settle().unwrap();
    assert_eq!(world.etcd.renewals.len(), 1, "renewed once");
    assert_eq!(world.etcd.lookups.len(), 1, "and looked up once");
    world.clients[0]
        .as_ref()
        .unwrap()
        .observer
        .settled()
        .unwrap();
}

/// The same when etcd never got the renewal: the lookup finds the lease short of it, so it is renewed.
#[test]
fn a_renewal_that_never_reached_etcd_is_sent_again() {
    let mut world = one_client(false, None);
    let ops = [
        Op::Tick { secs: 2 },
        Op::Request { slot: 0, lease: 1 },
        Op::Take { n: 1 },
        Op::End(End::Broken),
        Op::Reopen,
    ];
    for op in &ops {
        world.step(op).unwrap();
    }
    world.settle().unwrap();
    assert_eq!(world.etcd.lookups.len(), 1);
    assert_eq!(world.etcd.renewals.len(), 2, "sent, lost, and sent again");
    assert!(world.etcd.renewals[1].answer.is_some());
    world.clients[0]
        .as_ref()
        .unwrap()
        .observer
        .settled()
        .unwrap();
}
