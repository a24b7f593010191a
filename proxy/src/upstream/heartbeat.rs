//! The heartbeat: the active member is asked for its Status every [`HEARTBEAT_INTERVAL`], so that a member that
//! hangs (a stopped process, a disk stall, a partition: its socket accepts, nothing answers) is replaced within
//! about a second, whether or not any call or stream is running on it. Calls alone do not tell: a read waiting on a
//! hung member looks like a slow read, and a deadline a client set expires the same way on a healthy member.
//!
//! An answer later than a bound learnt from the members' usual Status times (see [`super::latency`]) marks the
//! member hung. An answer without a leader, or from a learner (the active endpoint when nothing better answered),
//! moves the proxy to a voting member with a leader, if any answers.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::choose::{CHOOSE_WAIT, Health};
use super::{Upstream, sleep_unless_shutdown};

/// How often the active member is asked for its Status.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(250);

/// The least time a member is given to answer Status, however fast it usually answers: a member's Go runtime
/// pauses and a busy machine's scheduling delays are shorter than this, and are not a hung member.
pub const HANG_BOUND_MIN: Duration = Duration::from_millis(200);

/// The most time a member is given to answer Status, however slow it usually answers. etcd answers Status from
/// memory, without the raft log or the disk, so a member slower than this cannot serve anything else either.
pub const HANG_BOUND_MAX: Duration = Duration::from_millis(750);

/// The longest the proxy takes to replace a hung active member: until the next heartbeat, its bound, and the
/// choice of the next member.
pub fn replacement_bound() -> Duration {
    HEARTBEAT_INTERVAL + HANG_BOUND_MAX + CHOOSE_WAIT
}

impl Upstream {
    /// Runs until the proxy shuts down.
    pub(super) async fn heartbeat(self: Arc<Self>) {
        let mut shutdown = self.shutdown.clone();
        while sleep_unless_shutdown(&mut shutdown, HEARTBEAT_INTERVAL).await {
            // With one endpoint there is nothing to move to (auto-sync may add more later).
            if self.active.borrow().choosing || self.len() < 2 {
                continue;
            }
            let pick = self.active();
            let bound = self.status_latency.bound(HANG_BOUND_MIN, HANG_BOUND_MAX);
            let asked = Instant::now();
            match self.member_status(pick.index, bound).await {
                Health::Leader => self.status_latency.observe(asked.elapsed()),
                Health::NoLeader | Health::Learner => {
                    self.status_latency.observe(asked.elapsed());
                    self.seek_leader(&pick);
                }
                Health::Silent => {
                    // A silence counts as an answer at twice the bound (TCP's timer backs off the same way), so
                    // members that are merely slow raise the bound instead of being left one after another.
                    self.status_latency.observe(bound * 2);
                    tracing::warn!(
                        endpoint = %self.members.get(pick.index).endpoint,
                        ?bound,
                        "etcd endpoint did not answer Status in time"
                    );
                    self.report_failure(&pick);
                }
            }
        }
    }
}
