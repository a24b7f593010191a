//! Real etcd clusters of one or more members on loopback ports, each member a child process: started, killed,
//! paused (SIGSTOP, a hung member), resumed and restarted on its own data directory; their client URLs in the
//! clear or over TLS ([`EtcdTls`]), their peer URLs in the clear.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{Binaries, EtcdTls};
use crate::process::Process;
use crate::{dirs, free_port};

/// How long a member may take to report healthy after it was (re)started.
const READY_TIMEOUT: Duration = Duration::from_secs(45);

static CLUSTER_SEQ: AtomicUsize = AtomicUsize::new(0);

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    process: Option<Process>,
    /// The `--initial-cluster` of a member that joined a running cluster (`--initial-cluster-state=existing`).
    joined: Option<String>,
    /// The binaries of a member upgraded in place ([`EtcdCluster::upgrade`]); the cluster's otherwise.
    upgraded: Option<Binaries>,
}

/// A running etcd cluster. Dropping it kills every member and removes the data directories; when the drop
/// happens during a panic, the tail of every member's log is printed first.
pub struct EtcdCluster {
    binaries: Binaries,
    members: Vec<Member>,
    token: String,
    initial_cluster: String,
    extra_args: Vec<String>,
    tls: Option<EtcdTls>,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts `n` members of `binaries`' version with `extra_args` for each (e.g. `--auth-token-ttl=2`), and waits
    /// (with a deadline) until every member reports healthy.
    pub async fn start(binaries: &Binaries, n: usize, extra_args: &[&str]) -> Result<Self, String> {
        Self::start_with(binaries, n, extra_args, None).await
    }

    /// Like [`EtcdCluster::start`], with TLS on every member's client URLs as `tls` says; readiness is checked
    /// over TLS with `tls.client`.
    pub async fn start_tls(
        binaries: &Binaries,
        n: usize,
        extra_args: &[&str],
        tls: &EtcdTls,
    ) -> Result<Self, String> {
        Self::start_with(binaries, n, extra_args, Some(tls.clone())).await
    }

    /// [`EtcdCluster::start`] in the clear (`tls` is `None`) or [`EtcdCluster::start_tls`].
    pub async fn start_with(
        binaries: &Binaries,
        n: usize,
        extra_args: &[&str],
        tls: Option<EtcdTls>,
    ) -> Result<Self, String> {
        if n == 0 {
            return Err("a cluster needs at least one member".into());
        }
        let seq = CLUSTER_SEQ.fetch_add(1, Ordering::SeqCst);
        let dir = dirs::temp_dir("etcd-testkit-").map_err(|e| format!("temp dir: {e}"))?;
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                data_dir: dir.path().join(format!("m{i}.etcd")),
                log: dir.path().join(format!("m{i}.log")),
                process: None,
                joined: None,
                upgraded: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        // Unique per cluster, so members of two clusters can never join each other.
        let token = format!(
            "testkit-{}-{seq}-{}",
            std::process::id(),
            members[0].peer_port
        );
        let mut cluster = Self {
            binaries: binaries.clone(),
            members,
            token,
            initial_cluster,
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
            tls,
            dir,
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        for i in 0..n {
            cluster.wait_healthy(i).await?;
        }
        Ok(cluster)
    }

    pub fn version(&self) -> super::Version {
        self.binaries.version
    }

    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Member `i`'s client endpoint as clients are given it: `127.0.0.1:PORT`, or `https://127.0.0.1:PORT` with
    /// TLS.
    pub fn endpoint(&self, i: usize) -> String {
        match self.tls {
            None => self.addr(i),
            Some(_) => format!("https://{}", self.addr(i)),
        }
    }

    /// `127.0.0.1:PORT` of member `i`'s client listener, without a scheme (for sockets).
    pub fn addr(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.members[i].client_port)
    }

    /// The TLS its client URLs use, if any.
    pub fn tls(&self) -> Option<&EtcdTls> {
        self.tls.as_ref()
    }

    /// The PID of member `i`'s process, while it runs (e.g. to read its CPU and memory from `/proc`).
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].process.as_ref().map(Process::pid)
    }

    /// The client endpoints of all members, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// The client endpoints joined with commas, as `--endpoints=` takes them.
    pub fn endpoints_arg(&self) -> String {
        self.endpoints().join(",")
    }

    /// A directory that lives as long as the cluster, for test files such as snapshots.
    pub fn scratch_dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// `etcdctl` of the cluster's version talking to member `i` (with TLS: presenting the kit's client
    /// certificate, [`EtcdTls::client`]).
    pub fn etcdctl(&self, i: usize) -> crate::Etcdctl {
        let ctl = self.binaries.etcdctl(&self.endpoint(i));
        match &self.tls {
            None => ctl,
            Some(tls) => ctl.with_tls(&tls.client),
        }
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let m = &self.members[i];
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://{}", self.addr(i));
        let peer_url = format!("http://127.0.0.1:{}", m.peer_port);
        let binaries = m.upgraded.as_ref().unwrap_or(&self.binaries);
        let mut cmd = Command::new(&binaries.etcd);
        cmd.arg(format!("--name={}", m.name))
            .arg(format!("--data-dir={}", m.data_dir.display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!(
                "--initial-cluster={}",
                m.joined.as_deref().unwrap_or(&self.initial_cluster)
            ))
            .arg(if m.joined.is_some() {
                "--initial-cluster-state=existing"
            } else {
                "--initial-cluster-state=new"
            })
            .arg(format!("--initial-cluster-token={}", self.token))
            .arg("--logger=zap")
            .arg("--log-outputs=stderr")
            .args(self.tls.iter().flat_map(EtcdTls::process_flags))
            .args(&self.extra_args);
        let name = format!("etcd {} member {i}", binaries.version);
        let process = Process::spawn(&name, cmd, &m.log)?;
        self.members[i].process = Some(process);
        Ok(())
    }

    /// Waits (with a deadline) until member `i` answers `GET /health` with `"health":"true"` (it has a leader);
    /// over TLS with the kit's client certificate when its client URLs use TLS. Fails early, with the member's
    /// log, if the process exits.
    pub async fn wait_healthy(&mut self, i: usize) -> Result<(), String> {
        let addr = self.addr(i);
        let client = self.tls.as_ref().map(|t| &t.client);
        let Some(process) = self.members[i].process.as_mut() else {
            return Err(format!("member {i} is not running"));
        };
        process
            .wait_http_with(&addr, "/health", client, READY_TIMEOUT, |code, body| {
                code == 200 && body.contains("\"health\":\"true\"")
            })
            .await
    }

    /// SIGKILLs member `i` and reaps it.
    pub fn kill(&mut self, i: usize) {
        if let Some(p) = self.members[i].process.take() {
            p.kill();
        }
    }

    /// Pauses member `i` with SIGSTOP: its sockets still accept, nothing answers (a disk stall looks like this).
    pub fn pause(&self, i: usize) {
        if let Some(p) = &self.members[i].process {
            p.pause();
        }
    }

    /// Resumes member `i` after [`EtcdCluster::pause`].
    pub fn resume(&self, i: usize) {
        if let Some(p) = &self.members[i].process {
            p.resume();
        }
    }

    /// Whether member `i`'s process is alive (paused counts as alive).
    pub fn is_running(&mut self, i: usize) -> bool {
        self.members[i]
            .process
            .as_mut()
            .is_some_and(Process::is_running)
    }

    /// Starts member `i` again on the same data directory and ports, and waits until it is healthy.
    pub async fn restart(&mut self, i: usize) -> Result<(), String> {
        if self.members[i].process.is_some() {
            return Err(format!("restart({i}) of a member that is still running"));
        }
        self.spawn(i)?;
        self.wait_healthy(i).await
    }

    /// Upgrades member `i` in place, as one step of a rolling upgrade: stops it, starts `binaries`' etcd on its
    /// data directory and ports, and waits until it is healthy. The other members keep their version.
    pub async fn upgrade(&mut self, i: usize, binaries: &Binaries) -> Result<(), String> {
        self.kill(i);
        self.members[i].upgraded = Some(binaries.clone());
        self.spawn(i)?;
        self.wait_healthy(i).await
    }

    /// Replaces member `i` by a new member, as an operator replaces a machine: removes it from the cluster (asking
    /// member `via`), stops it, adds a new member on new ports with a new name and an empty data directory, starts it
    /// (`--initial-cluster-state=existing`) and waits until it is healthy. Member `i`'s slot then names the new one.
    pub async fn replace(&mut self, i: usize, via: usize) -> Result<(), String> {
        let ctl = self.etcdctl(via);
        let listed = ctl.run(&["member", "list"], None).await;
        let name = self.members[i].name.clone();
        let id = listed
            .stdout
            .lines()
            .find(|line| line.split(", ").nth(2) == Some(name.as_str()))
            .and_then(|line| line.split(", ").next())
            .ok_or_else(|| format!("member {name} is not in the member list:\n{listed}"))?
            .to_owned();
        reconfigure(&ctl, &["member", "remove", &id]).await?;
        self.kill(i);
        // Removing the leader starts an election: add the new member once `via` has a leader again.
        self.wait_healthy(via).await?;
        self.join(Some(i), via, Role::Voter).await?;
        self.wait_healthy(i).await
    }

    /// Adds a learner (a non-voting member: etcd refuses it writes and linearizable reads) through member `via`,
    /// on new ports with an empty data directory, starts it (`--initial-cluster-state=existing`) and waits until
    /// it answers Status as a learner with a leader. Returns its index, after the members so far.
    pub async fn add_learner(&mut self, via: usize) -> Result<usize, String> {
        let i = self.join(None, via, Role::Learner).await?;
        self.wait_learner(i).await?;
        Ok(i)
    }

    /// Adds a member through member `via` and starts it, in slot `slot` (replacing what was there) or in a new
    /// one. Returns its slot. Does not wait for it.
    async fn join(&mut self, slot: Option<usize>, via: usize, role: Role) -> Result<usize, String> {
        let ctl = self.etcdctl(via);
        let i = slot.unwrap_or(self.members.len());
        let generation = CLUSTER_SEQ.fetch_add(1, Ordering::SeqCst);
        let new_name = format!("m{i}-{generation}");
        let peer_port = free_port();
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let peer_urls = format!("--peer-urls={peer_url}");
        let mut add = vec!["member", "add", &new_name, &peer_urls];
        if role == Role::Learner {
            add.push("--learner");
        }
        if let Err(refused) = reconfigure(&ctl, &add).await {
            // "request timed out" leaves the outcome unknown: the member list tells.
            let listed = ctl.run(&["member", "list"], None).await;
            if !listed.stdout.contains(&peer_url) {
                return Err(refused);
            }
        }
        // The joining member's --initial-cluster: every member's name and peer URL (etcd lists the new one, not
        // started yet, without a name).
        let listed = ctl.run(&["member", "list"], None).await;
        let joined = listed
            .stdout
            .lines()
            .filter_map(|line| {
                let fields: Vec<&str> = line.split(", ").collect();
                let (name, peer) = (*fields.get(2)?, *fields.get(3)?);
                Some(format!(
                    "{}={peer}",
                    if name.is_empty() { &new_name } else { name }
                ))
            })
            .collect::<Vec<_>>()
            .join(",");
        let member = Member {
            name: new_name.clone(),
            client_port: free_port(),
            peer_port,
            data_dir: self.dir.path().join(format!("{new_name}.etcd")),
            log: self.dir.path().join(format!("{new_name}.log")),
            process: None,
            joined: Some(joined),
            upgraded: None,
        };
        match slot {
            Some(i) => self.members[i] = member,
            None => self.members.push(member),
        }
        self.spawn(i)?;
        Ok(i)
    }

    /// Waits (with a deadline) until member `i` has a leader (`GET /health`: a learner passes it, seen on 3.5.30
    /// and 3.7.3, though its `/readyz` fails "non_learner") and its Status says it is a learner (`isLearner` in
    /// etcdctl's JSON).
    async fn wait_learner(&mut self, i: usize) -> Result<(), String> {
        self.wait_healthy(i).await?;
        let ctl = &self.etcdctl(i);
        crate::wait::try_wait_for(READY_TIMEOUT, || async move {
            let status = ctl.run(&["endpoint", "status", "-w", "json"], None).await;
            if status.success() && status.stdout.contains("\"isLearner\":true") {
                Ok(())
            } else {
                Err(format!(
                    "member {i} is not a learner with a leader yet: {status}"
                ))
            }
        })
        .await
    }

    /// The last `n` lines of member `i`'s log.
    pub fn log_tail(&self, i: usize, n: usize) -> String {
        dirs::tail(&self.members[i].log, n)
    }

    /// The tails of every member's log, labelled.
    pub fn logs(&self, n: usize) -> String {
        (0..self.members.len())
            .map(|i| {
                format!(
                    "--- etcd member {i} ({}) log ---\n{}",
                    self.endpoint(i),
                    self.log_tail(i, n)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs(40));
        }
        // The data directories and logs go with the TempDir field.
    }
}

/// How a member joins a running cluster.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Voter,
    Learner,
}

/// How long a membership change may be refused for an "unhealthy cluster" before it is given up.
const RECONFIGURE_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs a membership change with `ctl`, again while etcd refuses it as "unhealthy cluster": with
/// `--strict-reconfig-check` (the default) etcd changes membership only once every member has been connected to
/// the others for a while (5 s), which a cluster just started or just changed has not.
async fn reconfigure(ctl: &crate::Etcdctl, args: &[&str]) -> Result<crate::Output, String> {
    let deadline = tokio::time::Instant::now() + RECONFIGURE_TIMEOUT;
    loop {
        let out = ctl.run(args, None).await;
        if out.success() {
            return Ok(out);
        }
        let unhealthy = out.stderr.contains("unhealthy cluster");
        if !unhealthy || tokio::time::Instant::now() >= deadline {
            return Err(format!("etcdctl {}: {out}", args.join(" ")));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
