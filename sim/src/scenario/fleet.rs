//! `fleet`: ten proxies in a tree. One top-level proxy on [`PROXY_HOST`] stands in front of the members (the fault
//! plan's link faults and proxy restarts act on it), [`MID_LEAVES`] proxies stand in front of it, and
//! [`DEEP_LEAVES`] more in front of those: a proxy of proxies of proxies, each run with the defaults a user gets
//! for `--endpoints=<the proxy below>`. Clients use the leaves only: `watch-scale`'s watchers
//! ([`FLEET_WATCH_CLIENTS`] connections) and `lease-scale`'s keepers ([`FLEET_LEASE_HOSTS`] hosts), spread over
//! every leaf.
//!
//! Coalescing must compose down the tree: at the quiet point the members hold one upstream watcher per distinct
//! range the clients watch, all on one stream (the top-level proxy's), and one keep-alive stream carries every
//! lease; besides, everything `watch-scale` and `lease-scale` check holds for every client.

use rand::rngs::StdRng;

use super::logs::Logs;
use super::scale;
use crate::topology::{PROXY_HOST, PROXY_PORT, listen_addr, proxy_authority};
use crate::world::{self, Settings, World};

/// Leaves in front of the top-level proxy, and leaves in front of those (leaf `i` of them in front of leaf `i`).
pub const MID_LEAVES: usize = 6;
pub const DEEP_LEAVES: usize = 3;
/// Client connections of watchers (two per leaf, about 60 watchers each: over a thousand) and hosts of lease
/// keepers (500 leases each).
pub const FLEET_WATCH_CLIENTS: usize = 2 * (MID_LEAVES + DEEP_LEAVES);
pub const FLEET_LEASE_HOSTS: usize = 2;

fn leaf_host(leaf: usize) -> String {
    format!("leaf{leaf}")
}

fn leaf_authority(leaf: usize) -> String {
    format!("{}:{PROXY_PORT}", leaf_host(leaf))
}

/// Every leaf's address, the ones clients dial.
fn leaves() -> Vec<String> {
    (0..MID_LEAVES + DEEP_LEAVES).map(leaf_authority).collect()
}

/// A proxy in front of `upstream` (another proxy), with the defaults `--endpoints=<upstream>` gets.
fn leaf_config(seed: u64, upstream: &str) -> proxy::Config {
    let endpoint = proxy::Endpoint::parse(upstream).expect("valid endpoint");
    let mut config = proxy::Config::new(vec![endpoint], listen_addr(PROXY_PORT), seed);
    // As for the top-level proxy (`world::proxy_config`): only the end-of-run stop, which no flag sets.
    config.shutdown_grace = world::proxy_config(seed, 1).shutdown_grace;
    config
}

/// The world of the fleet: the members, the top-level proxy and the leaves (plaintext).
pub fn world<'a>(settings: Settings) -> World<'a> {
    let seed = settings.seed;
    let mut proxies = vec![(
        PROXY_HOST.to_string(),
        world::proxy_config(seed, settings.members),
    )];
    for leaf in 0..MID_LEAVES {
        let config = leaf_config(seed ^ (leaf as u64 + 1), &proxy_authority());
        proxies.push((leaf_host(leaf), config));
    }
    for deep in 0..DEEP_LEAVES {
        let leaf = MID_LEAVES + deep;
        let config = leaf_config(seed ^ (leaf as u64 + 1), &leaf_authority(deep));
        proxies.push((leaf_host(leaf), config));
    }
    World::with_proxies(settings, proxies)
}

pub(super) fn build_fleet(world: &mut World<'_>, logs: &Logs, rng: &mut StdRng, members: usize) {
    let targets = leaves();
    scale::build_watchers(world, logs, rng, members, FLEET_WATCH_CLIENTS, &targets);
    scale::build_lease_keepers(world, logs, rng, FLEET_LEASE_HOSTS, &targets);
}
