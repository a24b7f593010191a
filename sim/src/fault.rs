//! Fault schedules drawn from the seed, and their application to a running turmoil simulation.
//!
//! A schedule is a time-ordered list of [`Fault`]s. [`FaultProfile`] says which kinds may occur and keeps the
//! "at least one member reachable from the proxy" promise: a member is impaired when it is crashed or hung or its
//! link with the proxy is cut (either direction) or held, and the generator never impairs the last healthy member.
//! Every fault is healed before the quiet period at the end of the run, so that the checkers can demand convergence.
//!
//! Network faults act on turmoil; a member's process faults (crash, hang) also tell the model's [`Cluster`], which
//! moves the leader off a member that can no longer lead and stops a hung member's connections.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::model::Cluster;
use crate::topology::{PROXY_HOST, member_host};

/// One change to the simulated world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Stops a member's software; its connections break.
    Crash(usize),
    /// Starts a crashed member again (same store: the model's state is shared).
    Restart(usize),
    /// Stops a member's process as SIGSTOP does: its listener still accepts and its connections stay open, but it
    /// reads nothing and answers nothing (not even HTTP/2 pings) until resumed.
    Hang(usize),
    /// Resumes a hung member (SIGCONT): it serves what it had read and carries on.
    Resume(usize),
    /// Cuts the proxy↔member link both ways.
    Partition(usize),
    /// Cuts only the proxy→member direction (`to_member`) or the member→proxy direction.
    PartitionOneWay {
        member: usize,
        to_member: bool,
    },
    /// Heals any cut of the proxy↔member link.
    Repair(usize),
    /// Cuts one direction of a client host's link with the proxy (`to_proxy`: the client→proxy direction). turmoil
    /// does not retransmit: the client's connection has a hole for good, which the client's keep-alive finds.
    CutClient {
        client: String,
        to_proxy: bool,
    },
    /// Heals a client host's link with the proxy.
    RepairClient(String),
    /// Cuts a member off from the other members (the proxy still reaches it): it knows no leader, so its raft
    /// requests wait, it applies nothing new and its watchers get nothing; if it led, the others elect another.
    Isolate(usize),
    /// The isolated member hears the others again and catches up.
    Rejoin(usize),
    /// Holds the proxy↔member link's messages; released later, so they arrive after other links' messages.
    Hold(usize),
    Release(usize),
    /// Sets a fixed latency on the proxy↔member link (zero restores the default jitter).
    Latency {
        member: usize,
        latency: Duration,
    },
    /// Sets the largest random latency of every link (jitter).
    Jitter(Duration),
    /// Restarts the proxy process (its clients' connections break).
    RestartProxy,
}

/// A fault and when it happens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    pub at: Duration,
    pub fault: Fault,
}

/// What a scenario allows.
#[derive(Clone, Debug)]
pub struct FaultProfile {
    pub members: usize,
    /// Faults start within `[start, quiet_from)`; everything is healed at `quiet_from`.
    pub start: Duration,
    pub quiet_from: Duration,
    pub crashes: bool,
    /// Members hang (and resume).
    pub hangs: bool,
    pub partitions: bool,
    /// Members cut off from the other members ([`Fault::Isolate`]).
    pub isolations: bool,
    pub holds: bool,
    pub latency: bool,
    pub proxy_restarts: bool,
    /// Mean pause between two faults.
    pub mean_gap: Duration,
    /// Longest time one impairment lasts.
    pub max_outage: Duration,
}

impl FaultProfile {
    /// No faults at all, among `members` members: a quiet world for tests that check one behaviour.
    pub fn quiet(members: usize) -> Self {
        Self {
            members,
            start: Duration::ZERO,
            quiet_from: Duration::ZERO,
            crashes: false,
            hangs: false,
            partitions: false,
            isolations: false,
            holds: false,
            latency: false,
            proxy_restarts: false,
            mean_gap: Duration::from_secs(1),
            max_outage: Duration::from_secs(1),
        }
    }
}

/// The schedule of one run, in time order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FaultPlan {
    pub faults: Vec<Scheduled>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Impairment {
    Crashed,
    Hung,
    Cut,
    Held,
}

impl FaultPlan {
    /// A schedule drawn from `seed` within `profile`.
    pub fn generate(seed: u64, profile: &FaultProfile) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x6661_756c_7473);
        let mut faults = Vec::new();
        // When each member's current impairment ends (None: healthy).
        let mut impaired: Vec<Option<(Duration, Impairment)>> = vec![None; profile.members];
        let mut now = profile.start;
        let mut kinds: Vec<&str> = Vec::new();
        if profile.crashes {
            kinds.push("crash");
        }
        if profile.hangs {
            kinds.push("hang");
        }
        if profile.partitions {
            kinds.extend(["partition", "oneway"]);
        }
        if profile.holds {
            kinds.push("hold");
        }
        if profile.latency {
            kinds.extend(["latency", "jitter"]);
        }
        if profile.proxy_restarts {
            kinds.push("proxy");
        }
        let gap_ms = profile.mean_gap.as_millis().max(2) as u64;
        loop {
            now += Duration::from_millis(rng.random_range(gap_ms / 2..=gap_ms * 3 / 2));
            if now >= profile.quiet_from || kinds.is_empty() {
                break;
            }
            // Heal what ended by now, so the member counts as healthy again.
            for slot in impaired.iter_mut() {
                if slot.is_some_and(|(until, _)| until <= now) {
                    *slot = None;
                }
            }
            let kind = kinds[rng.random_range(0..kinds.len())];
            let outage_ms = rng.random_range(200..=profile.max_outage.as_millis().max(201) as u64);
            let until = (now + Duration::from_millis(outage_ms)).min(profile.quiet_from);
            let healthy: Vec<usize> = (0..profile.members)
                .filter(|&m| impaired[m].is_none())
                .collect();
            let pick_victim = |rng: &mut StdRng| -> Option<usize> {
                // Keep at least one member healthy.
                (healthy.len() >= 2).then(|| healthy[rng.random_range(0..healthy.len())])
            };
            match kind {
                "crash" => {
                    if let Some(m) = pick_victim(&mut rng) {
                        impaired[m] = Some((until, Impairment::Crashed));
                        faults.push(at(now, Fault::Crash(m)));
                        faults.push(at(until, Fault::Restart(m)));
                    }
                }
                "hang" => {
                    if let Some(m) = pick_victim(&mut rng) {
                        impaired[m] = Some((until, Impairment::Hung));
                        faults.push(at(now, Fault::Hang(m)));
                        faults.push(at(until, Fault::Resume(m)));
                    }
                }
                "partition" | "oneway" => {
                    if let Some(m) = pick_victim(&mut rng) {
                        impaired[m] = Some((until, Impairment::Cut));
                        let fault = if kind == "partition" {
                            Fault::Partition(m)
                        } else {
                            Fault::PartitionOneWay {
                                member: m,
                                to_member: rng.random_bool(0.5),
                            }
                        };
                        faults.push(at(now, fault));
                        faults.push(at(until, Fault::Repair(m)));
                    }
                }
                "hold" => {
                    if let Some(m) = pick_victim(&mut rng) {
                        // Holds are short: held messages stall every call on the link until released.
                        let until = (now + Duration::from_millis(outage_ms.min(800)))
                            .min(profile.quiet_from);
                        impaired[m] = Some((until, Impairment::Held));
                        faults.push(at(now, Fault::Hold(m)));
                        faults.push(at(until, Fault::Release(m)));
                    }
                }
                "latency" => {
                    let m = rng.random_range(0..profile.members);
                    let latency = Duration::from_millis(rng.random_range(1..=50));
                    faults.push(at(now, Fault::Latency { member: m, latency }));
                    faults.push(at(
                        until,
                        Fault::Latency {
                            member: m,
                            latency: Duration::ZERO,
                        },
                    ));
                }
                "jitter" => {
                    let jitter = Duration::from_millis(rng.random_range(1..=MAX_JITTER_MS));
                    faults.push(at(now, Fault::Jitter(jitter)));
                    faults.push(at(until, Fault::Jitter(DEFAULT_JITTER)));
                }
                "proxy" => faults.push(at(now, Fault::RestartProxy)),
                _ => unreachable!("unknown fault kind {kind}"),
            }
        }
        // A stable sort keeps an impairment's start before its end when both fall on the same instant.
        faults.sort_by_key(|s| s.at);
        if profile.isolations {
            add_isolations(seed, profile, &mut faults);
            faults.sort_by_key(|s| s.at);
        }
        Self { faults }
    }

    /// Removes and returns the faults due at `now`.
    pub fn take_due(&mut self, now: Duration) -> Vec<Scheduled> {
        let due = self.faults.partition_point(|s| s.at <= now);
        self.faults.drain(..due).collect()
    }
}

/// Isolations are rarer than the other faults: one is drawn about every this many mean gaps.
const ISOLATION_GAPS: u64 = 3;

/// Adds isolations ([`Fault::Isolate`]) to a plan, drawn from a random stream of their own, without changing the
/// plan's other faults: a seed's schedule stays what it was before isolations existed, plus isolations, so seeds
/// kept as regressions keep their schedules. One member is isolated at a time, and only while another member stays
/// unimpaired throughout (the promise the other faults keep).
fn add_isolations(seed: u64, profile: &FaultProfile, faults: &mut Vec<Scheduled>) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6973_6f6c_6174);
    let gap_ms = profile.mean_gap.as_millis().max(2) as u64 * ISOLATION_GAPS;
    let mut now = profile.start;
    let mut added = Vec::new();
    loop {
        now += Duration::from_millis(rng.random_range(gap_ms / 2..=gap_ms * 3 / 2));
        if now >= profile.quiet_from {
            break;
        }
        let outage_ms = rng.random_range(200..=profile.max_outage.as_millis().max(201) as u64);
        let until = (now + Duration::from_millis(outage_ms)).min(profile.quiet_from);
        let member = rng.random_range(0..profile.members);
        if another_stays_unimpaired(faults, profile.members, member, now, until) {
            added.push(at(now, Fault::Isolate(member)));
            added.push(at(until, Fault::Rejoin(member)));
            now = until;
        }
    }
    faults.extend(added);
}

/// Whether, at every instant of `[from, until)`, some member other than `member` is unimpaired by `faults`
/// (sorted by time). Impairments change only when a fault is due, so the instants to look at are `from` and the
/// faults due within.
fn another_stays_unimpaired(
    faults: &[Scheduled],
    members: usize,
    member: usize,
    from: Duration,
    until: Duration,
) -> bool {
    let instants = std::iter::once(from).chain(
        faults
            .iter()
            .map(|s| s.at)
            .filter(|&t| t > from && t < until),
    );
    instants
        .into_iter()
        .all(|t| (0..members).any(|m| m != member && !impaired_at(faults, m, t)))
}

/// Whether member `member` is impaired once the faults due by `t` are applied.
fn impaired_at(faults: &[Scheduled], member: usize, t: Duration) -> bool {
    let mut impaired = false;
    for scheduled in faults.iter().take_while(|s| s.at <= t) {
        match scheduled.fault {
            Fault::Crash(m)
            | Fault::Hang(m)
            | Fault::Partition(m)
            | Fault::Hold(m)
            | Fault::Isolate(m)
                if m == member =>
            {
                impaired = true
            }
            Fault::PartitionOneWay { member: m, .. } if m == member => impaired = true,
            Fault::Restart(m)
            | Fault::Resume(m)
            | Fault::Repair(m)
            | Fault::Release(m)
            | Fault::Rejoin(m)
                if m == member =>
            {
                impaired = false
            }
            _ => {}
        }
    }
    impaired
}

/// The smallest latency of any message.
pub const MIN_LATENCY: Duration = Duration::from_micros(100);

/// The largest jitter a `Fault::Jitter` sets on the links, in milliseconds: two messages sent together arrive at
/// most this far apart.
pub const MAX_JITTER_MS: u64 = 30;
pub const MAX_JITTER: Duration = Duration::from_millis(MAX_JITTER_MS);

/// The largest random latency of a link when no fault changed it.
pub const DEFAULT_JITTER: Duration = Duration::from_millis(5);

fn at(at: Duration, fault: Fault) -> Scheduled {
    Scheduled { at, fault }
}

/// Applies one fault to the simulation and to the model `cluster` it serves. Returns a line for the trace.
pub fn apply(sim: &mut turmoil::Sim<'_>, cluster: &Cluster, fault: &Fault) -> String {
    // Outside any host the model cannot read the simulation's clock: it is told, so that a hang or crash is dated
    // by simulated time alone.
    cluster.sim_time_is(sim.elapsed());
    match fault {
        Fault::Crash(m) => {
            sim.crash(member_host(*m));
            cluster.crashed(*m);
        }
        Fault::Restart(m) => {
            sim.bounce(member_host(*m));
            cluster.restarted(*m);
        }
        // Not a network fault: the member's serving loop stops its own connections (see `model::process`).
        Fault::Hang(m) => cluster.hang(*m),
        Fault::Resume(m) => cluster.resume(*m),
        Fault::Partition(m) => sim.partition(PROXY_HOST, member_host(*m)),
        Fault::PartitionOneWay { member, to_member } => {
            if *to_member {
                sim.partition_oneway(PROXY_HOST, member_host(*member))
            } else {
                sim.partition_oneway(member_host(*member), PROXY_HOST)
            }
        }
        Fault::Repair(m) => sim.repair(PROXY_HOST, member_host(*m)),
        // Members do not talk to each other over the simulated network (they share the model's store): the model
        // is told instead.
        Fault::CutClient { client, to_proxy } => {
            if *to_proxy {
                sim.partition_oneway(client.as_str(), PROXY_HOST)
            } else {
                sim.partition_oneway(PROXY_HOST, client.as_str())
            }
        }
        Fault::RepairClient(client) => sim.repair(client.as_str(), PROXY_HOST),
        Fault::Isolate(m) => cluster.isolate(*m),
        Fault::Rejoin(m) => cluster.rejoin(*m),
        Fault::Hold(m) => {
            sim.hold(PROXY_HOST, member_host(*m));
            cluster.link_held(*m);
        }
        Fault::Release(m) => {
            sim.release(PROXY_HOST, member_host(*m));
            cluster.link_released(*m);
        }
        Fault::Latency { member, latency } => {
            if latency.is_zero() {
                // Both bounds move back: a maximum below the link's minimum is not a valid range.
                sim.set_link_latency(PROXY_HOST, member_host(*member), MIN_LATENCY);
                sim.set_link_max_message_latency(PROXY_HOST, member_host(*member), DEFAULT_JITTER);
            } else {
                sim.set_link_latency(PROXY_HOST, member_host(*member), *latency)
            }
        }
        Fault::Jitter(jitter) => sim.set_max_message_latency(*jitter),
        Fault::RestartProxy => sim.bounce(PROXY_HOST),
    }
    format!("fault {fault:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile() -> FaultProfile {
        FaultProfile {
            members: 3,
            start: Duration::from_millis(500),
            quiet_from: Duration::from_secs(20),
            crashes: true,
            hangs: true,
            partitions: true,
            isolations: true,
            holds: true,
            latency: true,
            proxy_restarts: false,
            mean_gap: Duration::from_millis(400),
            max_outage: Duration::from_secs(3),
        }
    }

    #[test]
    fn a_seed_always_gives_the_same_schedule() {
        assert_eq!(
            FaultPlan::generate(7, &profile()),
            FaultPlan::generate(7, &profile())
        );
        assert_ne!(
            FaultPlan::generate(7, &profile()),
            FaultPlan::generate(8, &profile())
        );
    }

    #[test]
    fn at_least_one_member_stays_reachable_and_all_heal_before_the_quiet_period() {
        for seed in 0..200 {
            let plan = FaultPlan::generate(seed, &profile());
            let mut impaired = [false; 3];
            for scheduled in &plan.faults {
                assert!(scheduled.at <= profile().quiet_from, "seed {seed}");
                match scheduled.fault {
                    Fault::Crash(m)
                    | Fault::Hang(m)
                    | Fault::Partition(m)
                    | Fault::Hold(m)
                    | Fault::Isolate(m) => impaired[m] = true,
                    Fault::PartitionOneWay { member, .. } => impaired[member] = true,
                    Fault::Restart(m)
                    | Fault::Resume(m)
                    | Fault::Repair(m)
                    | Fault::Release(m)
                    | Fault::Rejoin(m) => impaired[m] = false,
                    _ => {}
                }
                assert!(
                    impaired.iter().any(|i| !i),
                    "seed {seed}: every member impaired at {:?}",
                    scheduled.at
                );
            }
            assert!(impaired.iter().all(|i| !i), "seed {seed}: not healed");
        }
    }

    #[test]
    fn isolations_leave_the_other_faults_of_a_plan_as_they_were() {
        let without = FaultProfile {
            isolations: false,
            ..profile()
        };
        let mut isolated = 0;
        for seed in 0..50 {
            let plan = FaultPlan::generate(seed, &profile());
            let others: Vec<Scheduled> = plan
                .faults
                .iter()
                .filter(|s| !matches!(s.fault, Fault::Isolate(_) | Fault::Rejoin(_)))
                .cloned()
                .collect();
            assert_eq!(
                others,
                FaultPlan::generate(seed, &without).faults,
                "seed {seed}"
            );
            isolated += plan.faults.len() - others.len();
        }
        assert!(isolated > 0, "no isolation in 50 plans");
    }

    #[test]
    fn plans_draw_every_kind_of_fault() {
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..50 {
            for scheduled in FaultPlan::generate(seed, &profile()).faults {
                seen.insert(match scheduled.fault {
                    Fault::Crash(_) => "crash",
                    Fault::Hang(_) => "hang",
                    Fault::Partition(_) => "partition",
                    Fault::PartitionOneWay {
                        to_member: true, ..
                    } => "cut towards the member",
                    Fault::PartitionOneWay {
                        to_member: false, ..
                    } => "cut towards the proxy",
                    Fault::Hold(_) => "hold",
                    Fault::Isolate(_) => "isolation",
                    Fault::Latency { .. } => "latency",
                    Fault::Jitter(_) => "jitter",
                    _ => "an end",
                });
            }
        }
        for kind in [
            "crash",
            "hang",
            "partition",
            "cut towards the member",
            "cut towards the proxy",
            "hold",
            "isolation",
            "latency",
            "jitter",
        ] {
            assert!(seen.contains(kind), "no {kind} in 50 plans: {seen:?}");
        }
    }
}
