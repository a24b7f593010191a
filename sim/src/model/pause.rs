//! Who can run and who leads: a member's pause state (hung as by SIGSTOP, in the cluster's virtual time) and the
//! leader a quorum of members elects. A crashed, hung or isolated member (cut off from the other members) cannot
//! lead (the others elect another, a new term) and does not count towards the quorum; a member cut off from the
//! proxy only still can. [`super::process`] makes a member's connections and timers obey the pause.

use std::time::Duration;

use tokio::sync::watch;

/// When a member was stopped, in the cluster's virtual time ([`super::cluster::Cluster::now`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pause {
    /// Since when it is hung (`None`: it runs).
    pub since: Option<Duration>,
    /// How long it was hung before, in all.
    pub total: Duration,
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
        }
    }
}

/// Which members can lead and which one does. A leader needs a quorum: a majority of the members must run, not
/// hang, and hear each other (an isolated member, cut off from the others, can neither lead nor vote). Elections
/// are instant: the model has no raft, so there is no leaderless interval after a leader is lost while a quorum is
/// left (etcd has about an election timeout of one); without a quorum there is no leader until one is back.
#[derive(Clone, Debug)]
pub struct Leadership {
    crashed: Vec<bool>,
    hung: Vec<bool>,
    isolated: Vec<bool>,
    leader: Option<usize>,
}

impl Leadership {
    /// Every member runs; the first leads.
    pub fn new(members: usize) -> Self {
        Self {
            crashed: vec![false; members],
            hung: vec![false; members],
            isolated: vec![false; members],
            leader: Some(0),
        }
    }

    pub fn leader(&self) -> Option<usize> {
        self.leader
    }

    /// Whether `member` knows a leader: there is one, and `member` hears it (it is not isolated). A crashed or hung
    /// member answers nothing, so what it would say does not matter.
    pub fn has_leader(&self, member: usize) -> bool {
        self.leader.is_some() && !self.isolated[member]
    }

    /// Whether `member` is cut off from the other members.
    pub fn is_isolated(&self, member: usize) -> bool {
        self.isolated[member]
    }

    fn can_lead(&self, member: usize) -> bool {
        !self.crashed[member] && !self.hung[member] && !self.isolated[member]
    }

    /// Records a change of one member's process; see [`Leadership::elect`] for what it returns.
    pub fn set(&mut self, member: usize, crashed: bool, hung: bool) -> bool {
        self.crashed[member] = crashed;
        self.hung[member] = hung;
        self.elect()
    }

    /// Records that `member` was cut off from the other members, or joined them again.
    pub fn set_isolated(&mut self, member: usize, isolated: bool) -> bool {
        self.isolated[member] = isolated;
        self.elect()
    }

    /// Re-elects if the leader can no longer lead or lost its quorum (or there was none); returns whether a new
    /// leader was elected (a new term). The next member after the old leader, in order, that can lead wins:
    /// deterministic, and not always the same member.
    fn elect(&mut self) -> bool {
        let members = self.crashed.len();
        let voters = (0..members).filter(|&m| self.can_lead(m)).count();
        if voters <= members / 2 {
            self.leader = None;
            return false;
        }
        if self.leader.is_some_and(|l| self.can_lead(l)) {
            return false;
        }
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
    fn a_crashed_or_hung_leader_is_replaced_by_the_next_member_that_can_lead() {
        let mut leadership = Leadership::new(3);
        assert_eq!(leadership.leader(), Some(0));
        // A follower that hangs changes nothing.
        assert!(!leadership.set(2, false, true));
        assert_eq!(leadership.leader(), Some(0));
        // Member 2 resumes; the leader crashes: member 1 is next.
        assert!(!leadership.set(2, false, false));
        assert!(leadership.set(0, true, false));
        assert_eq!(leadership.leader(), Some(1));
        // Member 0 comes back as a follower.
        assert!(!leadership.set(0, false, false));
        assert_eq!(leadership.leader(), Some(1));
        // Member 1 hangs: 2 is next after it.
        assert!(leadership.set(1, false, true));
        assert_eq!(leadership.leader(), Some(2));
    }

    #[test]
    fn without_a_quorum_there_is_no_leader_until_one_is_back() {
        let mut leadership = Leadership::new(3);
        assert!(!leadership.set(1, true, false));
        assert_eq!(leadership.leader(), Some(0));
        // Two of three down: the one left cannot lead alone, and knows no leader.
        assert!(!leadership.set(2, false, true));
        assert_eq!(leadership.leader(), None);
        assert!(!leadership.has_leader(0));
        // A quorum again: a leader is elected (a new term).
        assert!(leadership.set(2, false, false));
        assert!(leadership.leader().is_some());
        assert!(leadership.has_leader(0) && leadership.has_leader(2));
    }

    #[test]
    fn an_isolated_member_knows_no_leader_and_an_isolated_leader_is_replaced() {
        let mut leadership = Leadership::new(3);
        // A follower cut off from the others: the majority keeps its leader, the follower knows none.
        assert!(!leadership.set_isolated(2, true));
        assert_eq!(leadership.leader(), Some(0));
        assert!(!leadership.has_leader(2) && leadership.has_leader(1));
        assert!(!leadership.set_isolated(2, false));
        assert!(leadership.has_leader(2));
        // The leader cut off: the other two elect one of themselves.
        assert!(leadership.set_isolated(0, true));
        assert_eq!(leadership.leader(), Some(1));
        assert!(!leadership.has_leader(0));
        // And with one of those two crashed, nobody has a quorum.
        assert!(!leadership.set(2, true, false));
        assert_eq!(leadership.leader(), None);
        assert!(!leadership.has_leader(1));
    }
}
