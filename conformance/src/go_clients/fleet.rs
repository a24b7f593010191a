//! The processes of one run of the Go tests: a three-member etcd cluster of one version and, for a proxy target,
//! the profile's row of proxies in front of it; plus the proxies and member restarts the tests ask for through
//! the control endpoint. Dropped at the end of the run: every process goes with it.

use std::collections::BTreeMap;

use testkit::{Binaries, EtcdCluster, ProxyProcess};

use crate::profile::{Profile, Proxies, Setup};

/// Members of every run's cluster: three, so that one can fail (failover) and two can (quorum loss).
pub const MEMBERS: usize = 3;

/// What a run serves its clients from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// etcd's members, given all at once as the client's endpoints.
    Direct,
    /// The proxy binary under a profile, in front of all the members.
    Proxy(Profile),
}

impl Target {
    /// Its name in reports and in `GOCLIENTS_TARGETS`: `direct`, or the profile's name.
    pub fn name(&self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Proxy(p) => p.name,
        }
    }
}

/// What a Go test is told of a run.
#[derive(Clone, Debug)]
pub struct View {
    pub target: Target,
    /// What clients are given: the members, or the front proxy.
    pub endpoints: Vec<String>,
    /// etcd's members' client endpoints.
    pub members: Vec<String>,
}

/// The processes of one run.
pub struct Fleet {
    pub target: Target,
    setup: Setup,
    cluster: EtcdCluster,
    row: Option<Proxies>,
    more: BTreeMap<usize, ProxyProcess>,
    next_id: usize,
}

impl Fleet {
    /// Starts the cluster and, for a proxy target, its proxies (healthy before this returns).
    pub async fn start(binaries: &Binaries, target: Target) -> Result<Fleet, String> {
        let profiles: Vec<Profile> = match target {
            Target::Direct => Vec::new(),
            Target::Proxy(p) => vec![p],
        };
        let setup = Setup::new(&profiles)?;
        let cluster = EtcdCluster::start(binaries, MEMBERS, &[]).await?;
        let row = match target {
            Target::Direct => None,
            Target::Proxy(p) => Some(setup.start_proxy_for(&p, &cluster.endpoints(), &[]).await?),
        };
        Ok(Fleet {
            target,
            setup,
            cluster,
            row,
            more: BTreeMap::new(),
            next_id: 1,
        })
    }

    /// What the Go tests are told of this run.
    pub fn view(&self) -> View {
        View {
            target: self.target,
            endpoints: match &self.row {
                None => self.cluster.endpoints(),
                Some(row) => vec![row.front().endpoint()],
            },
            members: self.cluster.endpoints(),
        }
    }

    /// The profile's proxies (none directly), the front one first.
    pub fn proxies(&self) -> &[ProxyProcess] {
        self.row.as_ref().map_or(&[], |r| r.all())
    }

    pub fn stop_member(&mut self, i: usize) -> Result<(), String> {
        self.check_member(i)?;
        self.cluster.kill(i);
        Ok(())
    }

    pub async fn start_member(&mut self, i: usize) -> Result<(), String> {
        self.check_member(i)?;
        if self.cluster.is_running(i) {
            return Ok(());
        }
        self.cluster.restart(i).await
    }

    fn check_member(&self, i: usize) -> Result<(), String> {
        if i < self.cluster.len() {
            Ok(())
        } else {
            Err(format!(
                "member {i}: the cluster has {}",
                self.cluster.len()
            ))
        }
    }

    /// The member the proxy next to etcd serves from, by its `etcd_grpc_proxy_upstream_active` metric; 0 directly.
    pub async fn active_member(&self) -> Result<usize, String> {
        let Some(row) = &self.row else {
            return Ok(0);
        };
        let metrics = row.back().metrics().await;
        let active: Vec<&str> = metrics
            .lines()
            .filter_map(|l| l.strip_prefix("etcd_grpc_proxy_upstream_active{endpoint=\""))
            .filter_map(|l| l.split_once("\"} "))
            .filter(|(_, value)| value.trim() == "1")
            .map(|(endpoint, _)| endpoint)
            .collect();
        let [endpoint] = active.as_slice() else {
            return Err(format!(
                "not one active endpoint in the proxy's metrics: {active:?}"
            ));
        };
        (0..self.cluster.len())
            .find(|&i| endpoint.ends_with(&self.cluster.addr(i)))
            .ok_or_else(|| format!("the active endpoint {endpoint} is no member"))
    }

    /// Starts another proxy in front of every member, with the profile's flags (a single proxy even for `chain`)
    /// and `flags`; its id and endpoint.
    pub async fn start_proxy(&mut self, flags: &[&str]) -> Result<(usize, String), String> {
        let profile = match self.target {
            Target::Direct => crate::profile::ALL[0],
            Target::Proxy(p) => p,
        };
        let one = Profile {
            proxies: 1,
            ..profile
        };
        let row = self
            .setup
            .start_proxy_for(&one, &self.cluster.endpoints(), flags)
            .await?;
        let proxy = row.into_front();
        let id = self.next_id;
        self.next_id += 1;
        let endpoint = proxy.endpoint();
        self.more.insert(id, proxy);
        Ok((id, endpoint))
    }

    /// Kills a proxy [`Fleet::start_proxy`] started (dropping it kills it); a no-op when it is gone.
    pub fn kill_proxy(&mut self, id: usize) {
        self.more.remove(&id);
    }

    /// Peak resident memory (`VmHWM`, KiB) of each of the profile's proxies, the front one first.
    pub fn proxies_peak_rss_kib(&self) -> Vec<u64> {
        self.proxies()
            .iter()
            .filter_map(|p| peak_rss_kib(p.pid()))
            .collect()
    }

    /// The last lines of every process's log, for a failed run.
    pub fn logs(&self, n: usize) -> String {
        let mut out = self.cluster.logs(n);
        for p in self.proxies() {
            out.push_str(&format!("--- proxy {} ---\n{}\n", p.addr(), p.log_tail(n)));
        }
        out
    }
}

fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}
