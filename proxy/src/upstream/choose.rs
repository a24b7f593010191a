//! Choosing the endpoint that replaces the active one: every candidate is asked for its Status at once, and the
//! first that answers with a leader wins. A member that answers without a leader (cut off from the majority, or
//! during an election) serves nothing that needs one, and a member that does not answer may be hung: picking at
//! random among members "believed up" lands on such members, and each costs clients another failover. A learner
//! answers Status with its leader but refuses writes and linearizable reads: it is no better than a member without
//! a leader, a last resort.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::join_all;
use futures::stream::FuturesUnordered;
use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::maintenance_client::MaintenanceClient;
use proto::etcdserverpb::{RangeRequest, StatusRequest};
use tokio::time::Instant;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

use super::{HANG_BOUND_MAX, NO_LEADER, Replace, Upstream};
use crate::error;

/// How long the candidates have to answer: the longest a healthy member's Status may take (see
/// [`HANG_BOUND_MAX`]). Calls wait at most this long for the choice.
pub const CHOOSE_WAIT: Duration = HANG_BOUND_MAX;

/// What a member's Status said, best first: a member is as healthy as the worst answer on its connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    /// It answered and has a leader.
    Leader,
    /// It answered, without a leader.
    NoLeader,
    /// It answered, as a learner: it serves no write and no linearizable read (etcd refuses them there), whether or
    /// not it knows a leader.
    Learner,
    /// It did not answer in time, or its connection failed.
    Silent,
}

impl Upstream {
    /// Asks endpoint `index` for its Status on every worker's connection at once, waiting at most `wait` in all.
    /// Each worker calls etcd on a connection of its own ([`crate::workers`]), and the network can break one and
    /// not another (a connection dialled during a partition, say): the member is as healthy as its worst
    /// connection, so that a worker's calls never hang on a connection nobody asks on.
    pub(super) async fn member_status(&self, index: usize, wait: Duration) -> Health {
        let channels = self.members.get(index).channels();
        let answers = join_all(
            channels
                .into_iter()
                .map(|channel| self.status_on(channel, wait)),
        );
        answers.await.into_iter().max().unwrap_or(Health::Silent)
    }

    /// Asks for a member's Status on one of its connections, waiting at most `wait` in all.
    async fn status_on(&self, channel: Channel, wait: Duration) -> Health {
        let deadline = Instant::now() + wait;
        let mut client = MaintenanceClient::new(channel.clone());
        let answer = tokio::time::timeout(wait, client.status(StatusRequest {})).await;
        if let Ok(Ok(status)) = &answer
            && let Some(header) = &status.get_ref().header
        {
            self.versions.record(status.get_ref());
            // A member with a leader reports a revision etcd committed: a serializable answer older than it comes
            // from a member that lags, and must not be passed on (`ordering`). This is how a proxy that just
            // started (which has returned nothing yet) learns where its clients may already be. A member without
            // a leader may itself lag: its revision raises the floor but teaches it nothing committed.
            match status.get_ref().leader {
                0 => self.returned_revision(header.revision),
                _ => self.learnt_revision(header.revision),
            }
        }
        match answer {
            Ok(Ok(status)) if status.get_ref().is_learner => Health::Learner,
            Ok(Ok(status)) if status.get_ref().leader == 0 => Health::NoLeader,
            Ok(Ok(_)) => Health::Leader,
            Ok(Err(refused)) if error::is_auth_refusal(&refused) => {
                self.leader_probe(channel, deadline).await
            }
            Ok(Err(_)) | Err(_) => Health::Silent,
        }
    }

    /// Whether the member behind `channel` has a leader, asked without Status: with auth on, etcd 3.5.30 (and
    /// later) answers Status only to the root role. A linearizable Range that requires a leader (`hasleader`) is
    /// refused at once with "no leader" by a member that knows none; a member with a leader confirms it (a
    /// ReadIndex) and only then checks the caller: the probe carries no token, so it is refused there, having said
    /// what was asked. A learner refuses it as a learner before either. It asks for the count of one key and reads
    /// nothing either way.
    async fn leader_probe(&self, channel: Channel, deadline: Instant) -> Health {
        let probe = RangeRequest {
            key: vec![0],
            count_only: true,
            limit: 1,
            ..Default::default()
        };
        let mut request = tonic::Request::new(probe);
        request
            .metadata_mut()
            .insert("hasleader", MetadataValue::from_static("true"));
        let mut client = KvClient::new(channel);
        match tokio::time::timeout_at(deadline, client.range(request)).await {
            Ok(Err(refused)) if refused.message() == NO_LEADER => Health::NoLeader,
            Ok(Err(refused)) if error::is_learner_refusal(&refused) => Health::Learner,
            Ok(Ok(_)) => Health::Leader,
            Ok(Err(refused)) if error::is_auth_refusal(&refused) => Health::Leader,
            Ok(Err(_)) | Err(_) => Health::Silent,
        }
    }

    /// At start, with several endpoints: the first to answer Status with a leader becomes active in place of the
    /// random `provisional` pick (kept if none does in time), as a failover chooses. A member cut off from the
    /// majority would otherwise serve the first reads from whatever it had applied, behind what clients of the
    /// proxy's previous run already read. Calls wait for the choice as for a failover's (at most [`CHOOSE_WAIT`]).
    pub(super) async fn choose_first(self: Arc<Self>, provisional: usize) {
        let everyone = self.members.live();
        let (with_leader, _) = self.ask(everyone.into_iter()).await;
        let chosen = with_leader.unwrap_or(provisional);
        // /metrics names the chosen endpoint before any call can go to it.
        for (index, active) in [(provisional, 0), (chosen, 1)] {
            let endpoint = self.members.get(index).endpoint.clone();
            self.metrics
                .upstream_active
                .with_label_values(&[endpoint.authority()])
                .set(active);
        }
        tracing::info!(endpoint = %self.members.get(chosen).endpoint, "active etcd endpoint chosen");
        self.active.send_modify(|state| {
            state.choosing = false;
            state.index = chosen;
        });
    }

    /// Chooses the endpoint to serve in place of `from` and makes it active.
    pub(super) async fn choose_replacement(self: Arc<Self>, from: usize, why: Replace) {
        let candidates = self.others(from);
        let (with_leader, answered) = self.ask(candidates).await;
        let next = match why {
            Replace::Failed => with_leader.or(answered).or_else(|| {
                // Nobody answered in time: a member believed up, else the next one, as before asking. The
                // heartbeat asks it again soon.
                Some(self.random_other(from))
            }),
            // During an election every member is without a leader: stay, rather than move every stream.
            Replace::Leaderless => with_leader,
        };
        self.move_to(from, next);
    }

    /// Asks the `candidates` at once. Returns the first voting member to answer with a leader (as soon as it does),
    /// and the best that answered at all: a voting member without a leader (it serves again once an election ends,
    /// with no further move), else a learner (it never will: the heartbeat moves on from it once a voting member
    /// with a leader answers).
    async fn ask(&self, candidates: impl Iterator<Item = usize>) -> (Option<usize>, Option<usize>) {
        let mut asked: FuturesUnordered<_> = candidates
            .map(|index| async move { (index, self.member_status(index, CHOOSE_WAIT).await) })
            .collect();
        let (mut voter, mut learner) = (None, None);
        while let Some((index, health)) = asked.next().await {
            match health {
                Health::Leader => return (Some(index), Some(index)),
                Health::NoLeader => {
                    voter.get_or_insert(index);
                }
                Health::Learner => {
                    learner.get_or_insert(index);
                }
                Health::Silent => {}
            }
        }
        (None, voter.or(learner))
    }
}
