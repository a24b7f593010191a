//! The load that runs through every fault: per route (this proxy, the Go proxy, etcdctl against the members
//! directly) one reader and one writer, each one call at a time, paced, with the client timeout the issue used.
//!
//! Every call is logged with its start time; which fault a call belongs to is decided afterwards ([`super::tally`]),
//! so the load never needs to know what the fault driver is doing.
//!
//! The two proxies are reached by one long-lived gRPC connection each (the reader and writer share it, as one
//! application's etcd client would). etcdctl is a new process per call, given all three members, as the issue's
//! reporter ran it: each call dials afresh, which is part of what is being compared.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use proto::etcdserverpb::kv_client::KvClient;
use proto::etcdserverpb::{PutRequest, RangeRequest};
use serde::{Deserialize, Serialize};
use testkit::Etcdctl;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tonic::transport::Channel;

/// etcdctl's own `--dial-timeout` default: an etcdctl call may take this long to connect before its command
/// timeout starts, so its process is given that much more before it is killed as stuck.
const ETCDCTL_DIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// The longest an error message is kept in the log of calls.
const ERROR_CHARS: usize = 160;

/// How the load reaches etcd.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Via {
    /// etcd-grpc-proxy, this project, default flags, all three members as endpoints.
    ThisProxy,
    /// `etcd grpc-proxy start`, default flags, all three members as endpoints.
    GoProxy,
    /// The real `etcdctl --endpoints=a,b,c`, a new process per call.
    Etcdctl,
}

impl Via {
    pub const ALL: [Via; 3] = [Via::ThisProxy, Via::GoProxy, Via::Etcdctl];

    pub fn label(self) -> &'static str {
        match self {
            Via::ThisProxy => "this proxy",
            Via::GoProxy => "Go proxy",
            Via::Etcdctl => "etcdctl, direct",
        }
    }

    /// The keys this route reads and writes (each route its own, so their writes never meet).
    fn key(self, op: Op) -> String {
        let route = match self {
            Via::ThisProxy => "this-proxy",
            Via::GoProxy => "go-proxy",
            Via::Etcdctl => "etcdctl",
        };
        let op = match op {
            Op::Read => "read",
            Op::Write => "write",
        };
        format!("failover/{route}/{op}")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Op {
    /// A linearizable Range of one key that exists.
    Read,
    /// A Put of one key.
    Write,
}

/// One call as the client saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Call {
    pub via: Via,
    pub op: Op,
    /// Seconds from the phase's start to when the call was made.
    pub start_s: f64,
    /// How long it took to succeed or fail.
    pub seconds: f64,
    /// Why it failed; `None` if it succeeded.
    pub error: Option<String>,
}

/// What makes one call for a route.
#[derive(Clone)]
pub enum Client {
    /// A gRPC connection to a proxy.
    Grpc(Channel),
    /// etcdctl given every member's address.
    Etcdctl(Etcdctl),
}

impl Client {
    /// One call of `op` on `via`'s key, failing if it has not succeeded within `timeout`.
    async fn call(&self, via: Via, op: Op, seq: u64, timeout: Duration) -> Result<(), String> {
        let key = via.key(op);
        match (self, op) {
            (Client::Grpc(channel), Op::Read) => grpc_read(channel.clone(), key, timeout).await,
            (Client::Grpc(channel), Op::Write) => {
                grpc_write(channel.clone(), key, seq, timeout).await
            }
            (Client::Etcdctl(ctl), Op::Read) => {
                let out = etcdctl(ctl, &["get", &key], timeout).await?;
                // etcdctl prints nothing for a key it did not find, and exits 0.
                match out.lines().next() {
                    Some(line) if line == key => Ok(()),
                    _ => Err(format!("key missing; stdout {out:?}")),
                }
            }
            (Client::Etcdctl(ctl), Op::Write) => {
                etcdctl(ctl, &["put", &key, &seq.to_string()], timeout)
                    .await
                    .map(drop)
            }
        }
    }

    /// Writes the key `via` reads, so that every read finds it.
    pub async fn seed(&self, via: Via, timeout: Duration) -> Result<(), String> {
        self.call(via, Op::Write, 0, timeout).await?;
        let read_key = via.key(Op::Read);
        match self {
            Client::Grpc(channel) => {
                grpc_put(channel.clone(), read_key, b"r".to_vec(), timeout).await
            }
            Client::Etcdctl(ctl) => etcdctl(ctl, &["put", &read_key, "r"], timeout)
                .await
                .map(drop),
        }
    }
}

/// The request carries the deadline (as `grpc-timeout`, as etcd's Go clients send theirs), and the client stops
/// waiting at it too.
async fn grpc_read(channel: Channel, key: String, timeout: Duration) -> Result<(), String> {
    let mut request = tonic::Request::new(RangeRequest {
        key: key.into_bytes(),
        ..Default::default()
    });
    request.set_timeout(timeout);
    let response = within(timeout, KvClient::new(channel).range(request)).await?;
    if response.into_inner().kvs.is_empty() {
        return Err("key missing".into());
    }
    Ok(())
}

async fn grpc_write(
    channel: Channel,
    key: String,
    seq: u64,
    timeout: Duration,
) -> Result<(), String> {
    grpc_put(channel, key, seq.to_string().into_bytes(), timeout).await
}

async fn grpc_put(
    channel: Channel,
    key: String,
    value: Vec<u8>,
    timeout: Duration,
) -> Result<(), String> {
    let mut request = tonic::Request::new(PutRequest {
        key: key.into_bytes(),
        value,
        ..Default::default()
    });
    request.set_timeout(timeout);
    within(timeout, KvClient::new(channel).put(request))
        .await
        .map(drop)
}

/// A gRPC call's answer, or why there was none within `timeout`.
async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, tonic::Status>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(status)) => Err(shorten(format!(
            "{:?}: {}",
            status.code(),
            status.message()
        ))),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}

/// Runs `etcdctl --command-timeout=T ARGS` (its own way of honouring a client timeout) and returns its stdout,
/// or why it failed. A process that outlives its dial and command timeouts together is killed.
async fn etcdctl(ctl: &Etcdctl, args: &[&str], timeout: Duration) -> Result<String, String> {
    let mut line = vec![format!("--command-timeout={}ms", timeout.as_millis())];
    line.extend(args.iter().map(|a| a.to_string()));
    // Dropping the run on the deadline drops its child, which the kit spawns with kill_on_drop.
    let deadline = timeout + ETCDCTL_DIAL_TIMEOUT + Duration::from_secs(1);
    match tokio::time::timeout(deadline, ctl.run(&line, None)).await {
        Ok(out) if out.success() => Ok(out.stdout),
        Ok(out) => Err(shorten(format!(
            "exit {:?}: {}",
            out.code,
            out.stderr.trim().lines().last().unwrap_or("")
        ))),
        Err(_) => Err(format!("etcdctl still running after {deadline:?}; killed")),
    }
}

fn shorten(mut text: String) -> String {
    if let Some((cut, _)) = text.char_indices().nth(ERROR_CHARS) {
        text.truncate(cut);
        text.push('…');
    }
    text
}

/// The running load: a reader and a writer per route, logging every call.
pub struct Load {
    calls: Arc<Mutex<Vec<Call>>>,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
    grace: Duration,
}

impl Load {
    /// Starts a reader and a writer on each route, each making a call every `pace` (or right after the previous
    /// call, when that took longer), each call failing after `timeout`. Start times count from `epoch`.
    pub fn start(
        routes: &[(Via, Client)],
        epoch: Instant,
        pace: Duration,
        timeout: Duration,
    ) -> Self {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = watch::channel(false);
        let mut tasks = JoinSet::new();
        for (via, client) in routes {
            for op in [Op::Read, Op::Write] {
                let worker = Worker {
                    via: *via,
                    op,
                    client: client.clone(),
                    pace,
                    timeout,
                    epoch,
                    calls: Arc::clone(&calls),
                };
                tasks.spawn(worker.run(stopped.clone()));
            }
        }
        Self {
            calls,
            stop,
            tasks,
            grace: timeout + ETCDCTL_DIAL_TIMEOUT + Duration::from_secs(2),
        }
    }

    /// The calls logged so far.
    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether every route in `routes` has had a read succeed since `since_s`.
    pub fn each_has_read(&self, routes: &[Via], since_s: f64) -> Result<(), String> {
        let calls = self.calls();
        let missing: Vec<&str> = routes
            .iter()
            .filter(|via| {
                !calls.iter().any(|c| {
                    c.via == **via && c.op == Op::Read && c.error.is_none() && c.start_s >= since_s
                })
            })
            .map(|via| via.label())
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "no successful read yet through {}",
                missing.join(", ")
            ))
        }
    }

    /// Lets every call in flight finish (each is bounded by its timeout), then returns the whole log.
    pub async fn stop(mut self) -> Vec<Call> {
        self.stop.send_replace(true);
        let drained = tokio::time::timeout(self.grace, async {
            while self.tasks.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            eprintln!(
                "failover: a client call outlived its deadline at the end of a phase; aborted"
            );
            self.tasks.abort_all();
        }
        self.calls()
    }
}

/// One client: a route and an operation, one call at a time.
struct Worker {
    via: Via,
    op: Op,
    client: Client,
    pace: Duration,
    timeout: Duration,
    epoch: Instant,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Worker {
    async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.pace);
        // A call slower than the pace is followed at once by the next, without a burst to catch up.
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        for seq in 1.. {
            tokio::select! {
                biased;
                _ = stop.wait_for(|stop| *stop) => return,
                _ = tick.tick() => {}
            }
            let started = Instant::now();
            let result = self.client.call(self.via, self.op, seq, self.timeout).await;
            let call = Call {
                via: self.via,
                op: self.op,
                start_s: (started - self.epoch).as_secs_f64(),
                seconds: started.elapsed().as_secs_f64(),
                error: result.err(),
            };
            self.calls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(call);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_errors_are_cut_on_a_character_boundary() {
        let long = "é".repeat(ERROR_CHARS + 10);
        let short = shorten(long);
        assert_eq!(short.chars().count(), ERROR_CHARS + 1);
        assert!(short.ends_with('…'));
        assert_eq!(shorten("brief".into()), "brief");
    }

    #[test]
    fn every_route_has_keys_of_its_own() {
        let keys: std::collections::BTreeSet<String> = Via::ALL
            .iter()
            .flat_map(|via| [via.key(Op::Read), via.key(Op::Write)])
            .collect();
        assert_eq!(keys.len(), 6);
    }
}
