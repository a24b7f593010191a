//! Choosing the endpoint that replaces the active one: every candidate is asked for its Status at once, and the
//! first that answers with a leader wins. A member that answers without a leader (cut off from the majority, or
//! during an election) serves nothing that needs one, and a member that does not answer may be hung: picking at
//! random among members "believed up" lands on such members, and each costs clients another failover.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use proto::etcdserverpb::StatusRequest;
use proto::etcdserverpb::maintenance_client::MaintenanceClient;

use super::{HANG_BOUND_MAX, Replace, Upstream};
use crate::error;

/// How long the candidates have to answer: the longest a healthy member's Status may take (see
/// [`HANG_BOUND_MAX`]). Calls wait at most this long for the choice.
pub const CHOOSE_WAIT: Duration = HANG_BOUND_MAX;

/// What a member's Status said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// It answered and has a leader (or, with auth on, answered but would not say: etcd 3.5.30 tells only admins).
    Leader,
    /// It answered, without a leader.
    NoLeader,
    /// It did not answer in time, or its connection failed.
    Silent,
}

impl Upstream {
    /// Asks endpoint `index` for its Status, waiting at most `wait`.
    pub(super) async fn member_status(&self, index: usize, wait: Duration) -> Health {
        let mut client = MaintenanceClient::new(self.members.get(index).channel());
        let answer = tokio::time::timeout(wait, client.status(StatusRequest {})).await;
        if let Ok(Ok(status)) = &answer
            && let Some(header) = &status.get_ref().header
        {
            // The member's revision is one etcd committed: a serializable answer older than it comes from a
            // member that lags, and must not be passed on (`ordering`). This is how a proxy that just started
            // (which has returned nothing yet) learns where its clients may already be.
            self.returned_revision(header.revision);
        }
        match answer {
            Ok(Ok(status)) if status.get_ref().leader == 0 => Health::NoLeader,
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

    /// Asks the `candidates` at once. Returns the first to answer with a leader (as soon as it does), and the first
    /// that answered at all.
    async fn ask(&self, candidates: impl Iterator<Item = usize>) -> (Option<usize>, Option<usize>) {
        let mut asked: FuturesUnordered<_> = candidates
            .map(|index| async move { (index, self.member_status(index, CHOOSE_WAIT).await) })
            .collect();
        let mut answered = None;
        while let Some((index, health)) = asked.next().await {
            match health {
                Health::Leader => return (Some(index), Some(index)),
                Health::NoLeader => {
                    answered.get_or_insert(index);
                }
                Health::Silent => {}
            }
        }
        (None, answered)
    }
}
