//! Faults on the clients' side of the proxy: one-way cuts of a client host's link with the proxy, drawn from a
//! random stream of their own and added to a scenario's plan ([`with_client_cuts`]), so its other faults stay as
//! they were.
//!
//! turmoil does not retransmit, so a cut leaves the client's connection with a hole for good, as a long outage
//! leaves a real one: the client finds it by its HTTP/2 keep-alive (clientv3's `DialKeepAliveTime` and
//! `DialKeepAliveTimeout`, [`CLIENT_KEEPALIVE`]) and dials again; its watchers resume from the next revision. The
//! proxy must allow pings that often: the scenario runs it with `--grpc-keepalive-min-time` set to the interval,
//! as a user of such clients would.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::QUIET_FROM;
use crate::fault::{Fault, FaultPlan, Scheduled};
use crate::world::Settings;

/// The clients' HTTP/2 keep-alive: a ping every interval, the connection given up when one is not answered within
/// the timeout.
pub const CLIENT_KEEPALIVE: (Duration, Duration) =
    (Duration::from_millis(500), Duration::from_millis(500));

/// Cuts per run, and how long one lasts.
const CUTS: usize = 2;
const CUT_MS: std::ops::RangeInclusive<u64> = 200..=1000;

/// The cuts of one run among `clients` (host names): each cuts one direction of one client's link, and all heal
/// before the quiet period.
pub fn client_cuts(seed: u64, clients: &[String]) -> Vec<Scheduled> {
    let mut rng = StdRng::seed_from_u64(seed ^ 0x636c_6375_7473);
    let mut cuts = Vec::new();
    for _ in 0..CUTS {
        let client = clients[rng.random_range(0..clients.len())].clone();
        let length = Duration::from_millis(rng.random_range(CUT_MS));
        let latest_start = QUIET_FROM.saturating_sub(length).as_millis() as u64;
        let at = Duration::from_millis(rng.random_range(300..latest_start.max(301)));
        cuts.push(Scheduled {
            at,
            fault: Fault::CutClient {
                client: client.clone(),
                to_proxy: rng.random_bool(0.5),
            },
        });
        cuts.push(Scheduled {
            at: at + length,
            fault: Fault::RepairClient(client),
        });
    }
    cuts
}

/// `settings` with its plan (drawn from the seed if it had none) plus [`client_cuts`] among `clients`.
pub fn with_client_cuts(mut settings: Settings, clients: &[String]) -> Settings {
    let mut plan = settings
        .plan
        .take()
        .unwrap_or_else(|| FaultPlan::generate(settings.seed, &settings.faults));
    plan.faults.extend(client_cuts(settings.seed, clients));
    // Stable: a cut stays before its repair.
    plan.faults.sort_by_key(|scheduled| scheduled.at);
    settings.plan = Some(plan);
    settings
}
