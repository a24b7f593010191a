//! Who can run and who leads: a member's pause state (hung as by SIGSTOP, in the cluster's virtual time) and the
//! leader among the members that run and are not hung. A crashed or hung member cannot lead (its followers elect
//! another, a new term); a member cut off from the proxy still can (partitions only cut proxy↔member links; the
//! members still hear each other). [`super::process`] makes a member's connections and timers obey the pause.

use std::time::Duration;

use tokio::sync::watch;

/// When a member was stopped, in the cluster's virtual time ([`super::cluster::Cluster::now`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pause {
    /// Since when it is hung (`None`: it runs).
    pub since: Option<Duration>,
    /// How long it was hung before, in all.
    pub total: Duration,
    /// The last hang that ended: `(since, resumed)`.
    pub last_hang: Option<(Duration, Duration)>,
}

impl Pause {
    pub fn is_hung(&self) -> bool {
        self.since.is_some()
    }

    /// How long the process has run by virtual time `now`: `now` less the time it spent hung. Its timers measure
    /// this, so a timer does not expire while its process is stopped.
    pub fn running_time(&self, now: Duration) -> Duration {
        let hung_now = self
            .since
            .map_or(Duration::ZERO, |since| now.saturating_sub(since));
        now.saturating_sub(self.total + hung_now)
    }

    pub(super) fn hang(&mut self, now: Duration) {
        self.since.get_or_insert(now);
    }

    pub(super) fn resume(&mut self, now: Duration) {
        if let Some(since) = self.since.take() {
            self.total += now.saturating_sub(since);
            self.last_hang = Some((since, now));
        }
    }

    /// When a message the process reads at `now` may have arrived: a message read at the instant the process
    /// resumed waited in its socket while it was stopped, sent before; it is dated at the hang's start, the
    /// earliest it can have arrived unread (a message that came sooner would have been read before the stop).
    pub fn arrived_by(&self, now: Duration) -> Duration {
        match self.last_hang {
            Some((since, resumed)) if resumed == now && self.since.is_none() => since,
            _ => now,
        }
    }
}

/// Which members can lead and which one does. Elections are instant: the model has no raft, so there is no
/// leaderless interval after a leader is lost (etcd has about an election timeout of one).
#[derive(Clone, Debug)]
pub struct Leadership {
    crashed: Vec<bool>,
    hung: Vec<bool>,
    leader: Option<usize>,
}

impl Leadership {
    /// Every member runs; the first leads.
    pub fn new(members: usize) -> Self {
        Self {
            crashed: vec![false; members],
            hung: vec![false; members],
            leader: Some(0),
        }
    }

    pub fn leader(&self) -> Option<usize> {
        self.leader
    }

    fn can_lead(&self, member: usize) -> bool {
        !self.crashed[member] && !self.hung[member]
    }

    /// Records a change of one member's process and re-elects if the leader can no longer lead (or there was none);
    /// returns whether a new leader was elected (a new term). The next member after the old leader, in order, that
    /// can lead wins: deterministic, and not always the same member.
    pub fn set(&mut self, member: usize, crashed: bool, hung: bool) -> bool {
        self.crashed[member] = crashed;
        self.hung[member] = hung;
        if self.leader.is_some_and(|l| self.can_lead(l)) {
            return false;
        }
        let members = self.crashed.len();
        let after = self.leader.map_or(0, |l| l + 1);
        let next = (0..members)
            .map(|i| (after + i) % members)
            .find(|&m| self.can_lead(m));
        self.leader = next;
        next.is_some()
    }
}

/// The per-member pause signals of a cluster.
pub(super) fn pause_signals(members: usize) -> Vec<watch::Sender<Pause>> {
    (0..members)
        .map(|_| watch::Sender::new(Pause::default()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_time_leaves_out_the_time_hung() {
        let mut pause = Pause::default();
        let s = Duration::from_secs;
        assert_eq!(pause.running_time(s(3)), s(3));
        pause.hang(s(3));
        assert_eq!(pause.running_time(s(5)), s(3));
        pause.resume(s(6));
        assert_eq!(pause.running_time(s(8)), s(5));
        pause.hang(s(9));
        assert_eq!(pause.running_time(s(10)), s(6));
    }

    #[test]
    fn a_message_read_as_the_process_resumes_is_dated_at_the_hangs_start() {
        let mut pause = Pause::default();
        let s = Duration::from_secs;
        assert_eq!(pause.arrived_by(s(1)), s(1));
        pause.hang(s(2));
        pause.resume(s(5));
        assert_eq!(pause.arrived_by(s(5)), s(2));
        assert_eq!(pause.arrived_by(s(6)), s(6));
    }

    #[test]
    fn a_crashed_or_hung_leader_is_replaced_by_the_next_member_that_can_lead() {
        let mut leadership = Leadership::new(3);
        assert_eq!(leadership.leader(), Some(0));
        // A follower that hangs changes nothing.
        assert!(!leadership.set(2, false, true));
        assert_eq!(leadership.leader(), Some(0));
        // The leader crashes: member 1 is next (2 is hung).
        assert!(leadership.set(0, true, false));
        assert_eq!(leadership.leader(), Some(1));
        // Member 0 comes back as a follower.
        assert!(!leadership.set(0, false, false));
        assert_eq!(leadership.leader(), Some(1));
        // Member 1 hangs: 2 is still hung, so 0 leads.
        assert!(leadership.set(1, false, true));
        assert_eq!(leadership.leader(), Some(0));
        // With nobody able to lead there is no leader, until one can again.
        assert!(!leadership.set(0, true, false));
        assert_eq!(leadership.leader(), None);
        assert!(leadership.set(2, false, false));
        assert_eq!(leadership.leader(), Some(2));
    }
}
