//! `bench tree`: issue 18's measurement. A tree of proxies (one mid proxy in front of etcd, N leaves in front of
//! the mid proxy) carries W watchers on one key, spread evenly over the leaves, while a writer puts that key
//! straight to etcd at a modest rate. Measured per tree: the fan-out latency (put to last delivery) and every
//! event missing or received twice, the watchers etcd holds, and each tier's CPU and peak memory. This proxy's tree
//! and etcd's Go proxy's tree run in turn in the same run, each on a fresh one-member etcd of the same version, and
//! the report sets them side by side.
//!
//! - [`topology`]: starts a tree of either kind ([`topology::Tree`]), every process the test kit's, killed when
//!   dropped (also on an error or Ctrl-C).
//! - The load is the side-by-side benchmark's watch fan-out ([`crate::load::watch::WatchFanout`]) with a warm-up
//!   event, its Watch streams dealt out over the leaves' connections in turn.
//! - [`probe`]: meters the tree while the puts run: CPU per process ([`usage`]), etcd's gauges ([`etcd_gauges`]).
//! - [`report`]: what was measured (`tree.json`) and the ratios; [`table`]: the markdown (`tree.md`).

pub mod etcd_gauges;
pub mod probe;
pub mod report;
pub mod table;
pub mod topology;
pub mod usage;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use testkit::{Binaries, EtcdCluster};
use tonic::transport::Channel;

use crate::failover::load_average;
use crate::load::dial::Dialer;
use crate::load::watch::WatchFanout;
use crate::plan::EtcdBinary;
use crate::sys::procfs;
use probe::TreeProbe;
use report::{TreeReport, TreeRun};
use topology::{Node, Target, Tree};
use usage::Pids;

/// The kinds of tree.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum TreeTarget {
    /// Every proxy `etcd-grpc-proxy start`.
    This,
    /// Every proxy `etcd grpc-proxy start` of the etcd under test.
    Go,
}

impl TreeTarget {
    pub fn label(self) -> &'static str {
        match self {
            TreeTarget::This => "this proxy",
            TreeTarget::Go => "Go proxy",
        }
    }
}

/// `bench tree`'s flags.
#[derive(Clone, Debug, clap::Args)]
pub struct Options {
    /// The etcd to run, as VERSION=PATH to its `etcd` (its `grpc-proxy start` is the Go proxy). Default: the newest
    /// version the test kit finds installed.
    #[arg(long = "etcd", value_parser = EtcdBinary::parse)]
    pub etcd: Option<EtcdBinary>,
    /// The `etcd-grpc-proxy` binary. Default: the test kit's (`ETCD_GRPC_PROXY_BIN`, else the release build, built
    /// or confirmed up to date by cargo).
    #[arg(long)]
    pub proxy_bin: Option<PathBuf>,
    /// The trees to measure, in this order (repeatable; default: this, then go).
    #[arg(long = "target", value_enum)]
    pub targets: Vec<TreeTarget>,
    /// Leaf proxies behind the mid proxy.
    #[arg(long, default_value_t = 10)]
    pub leaves: usize,
    /// Client watchers on the one key, over all leaves.
    #[arg(long, default_value_t = 10_000)]
    pub watchers: usize,
    /// Watchers created on each Watch stream, as etcd's clients multiplex the watchers of one context.
    #[arg(long, default_value_t = 100)]
    pub watchers_per_stream: usize,
    /// Connections to each leaf; the Watch streams are dealt out over all leaves' connections in turn.
    #[arg(long, default_value_t = 2)]
    pub connections_per_leaf: usize,
    /// Puts per second on the watched key while measuring.
    #[arg(long, default_value_t = 5.0)]
    pub put_rate: f64,
    /// How long the writer puts, in seconds (after the warm-up).
    #[arg(long, default_value_t = 20.0)]
    pub measure_seconds: f64,
    /// Bytes per value put.
    #[arg(long, default_value_t = 256)]
    pub value_size: usize,
    /// Where `tree.md` and `tree.json` go.
    #[arg(long, default_value = "target/bench-tree")]
    pub out_dir: PathBuf,
    /// A line describing the machine, for the report.
    #[arg(long, default_value = "unspecified")]
    pub machine: String,
}

impl Options {
    fn targets(&self) -> Vec<TreeTarget> {
        if self.targets.is_empty() {
            vec![TreeTarget::This, TreeTarget::Go]
        } else {
            self.targets.clone()
        }
    }

    /// Refuses sizes that cannot make the tree the run describes.
    fn check(&self) -> Result<(), String> {
        if self.leaves == 0 || self.watchers == 0 || self.connections_per_leaf == 0 {
            return Err(
                "--leaves, --watchers and --connections-per-leaf must be at least 1".into(),
            );
        }
        let streams = self.watchers.div_ceil(self.watchers_per_stream.max(1));
        if streams < self.leaves {
            return Err(format!(
                "{} watchers at {} per Watch stream make {streams} streams, fewer than the {} leaves: lower \
                 --watchers-per-stream so that every leaf carries some",
                self.watchers, self.watchers_per_stream, self.leaves
            ));
        }
        let positive = |v: f64| v > 0.0 && v.is_finite();
        if !positive(self.put_rate) || !positive(self.measure_seconds) {
            return Err("--put-rate and --measure-seconds must be positive".into());
        }
        Ok(())
    }

    /// The etcd binaries: the ones named, or the newest version installed.
    fn binaries(&self) -> Result<Binaries, String> {
        crate::plan::named_or_newest(self.etcd.as_ref())
    }

    fn proxy_bin(&self) -> Result<PathBuf, String> {
        crate::plan::proxy_binary(self.proxy_bin.as_ref())
    }
}

/// Measures every tree in turn. An error is returned only for settings or binaries that cannot run at all; a tree
/// that fails is reported in its [`TreeRun::failure`] and the next one runs.
pub async fn run(options: &Options, command: String) -> Result<TreeReport, String> {
    options.check()?;
    let binaries = options.binaries()?;
    let targets = options.targets();
    let proxy_bin = if targets.contains(&TreeTarget::This) {
        Some(options.proxy_bin()?)
    } else {
        None
    };
    eprintln!(
        "tree: etcd {} ({}){}",
        binaries.version,
        binaries.etcd.display(),
        proxy_bin
            .as_ref()
            .map_or(String::new(), |p| format!(", this proxy {}", p.display()))
    );
    let mut report = TreeReport {
        etcd_version: binaries.version.to_string(),
        command,
        machine: options.machine.clone(),
        leaves: options.leaves,
        watchers: options.watchers,
        watchers_per_stream: options.watchers_per_stream,
        connections_per_leaf: options.connections_per_leaf,
        put_rate: options.put_rate,
        measure_seconds: options.measure_seconds,
        value_size: options.value_size,
        clock_ticks_per_second: procfs::ticks_per_second(),
        load_average: (load_average(), None),
        trees: Vec::new(),
    };
    for kind in targets {
        let target = match kind {
            TreeTarget::This => Target::This {
                proxy_bin: proxy_bin
                    .as_deref()
                    .ok_or("no proxy binary for this proxy's tree")?,
            },
            TreeTarget::Go => Target::Go {
                etcd_bin: &binaries.etcd,
            },
        };
        let started_load = load_average();
        let tree = match measure(options, &binaries, &target).await {
            Ok(tree) => tree,
            Err(failure) => {
                eprintln!("tree: the {} tree failed: {failure}", kind.label());
                TreeRun::failed(kind, failure, (started_load, load_average()))
            }
        };
        for loss in tree.losses(report.planned_puts()) {
            eprintln!("tree: {}: {loss}", kind.label());
        }
        report.trees.push(tree);
    }
    report.load_average.1 = load_average();
    Ok(report)
}

/// Writes `tree.md` and `tree.json` into `dir`; returns their paths.
pub fn write(report: &TreeReport, dir: &Path) -> Result<Vec<PathBuf>, String> {
    crate::report::write_md_json(dir, "tree", table::render(report), report)
}

/// One tree on a fresh etcd: start it, run the fan-out through its leaves, meter it, check it is still healthy.
async fn measure(
    options: &Options,
    binaries: &Binaries,
    target: &Target<'_>,
) -> Result<TreeRun, String> {
    let kind = target.kind();
    let started_load = load_average();
    let etcd = EtcdCluster::start(binaries, 1, &["--log-level=warn"]).await?;
    let etcd_addr = etcd.addr(0);
    let etcd_pid = etcd
        .pid(0)
        .ok_or_else(|| format!("etcd on {etcd_addr} is not running"))?;
    eprintln!(
        "tree: {}: starting a mid proxy and {} leaves in front of etcd {etcd_addr}",
        kind.label(),
        options.leaves
    );
    let tree = Tree::start(target, &etcd.endpoint(0), options.leaves).await?;
    let channels = connect(&tree, options.connections_per_leaf).await?;
    let direct = Dialer::new(&etcd_addr, None).dial().await?;
    let before = etcd_gauges::read(&etcd_addr).await?;
    let probe = TreeProbe::new(
        &etcd_addr,
        Pids {
            etcd: etcd_pid,
            mid: tree.mid().pid(),
            leaves: tree.leaves().iter().map(Node::pid).collect(),
            bench: std::process::id(),
        },
    );
    let fanout = WatchFanout {
        watchers: options.watchers,
        watchers_per_stream: options.watchers_per_stream,
        put_rate: options.put_rate,
        measured: Duration::from_secs_f64(options.measure_seconds),
        value_size: options.value_size,
        etcd_prefix: Vec::new(),
        warmup_event: true,
    };
    eprintln!(
        "tree: {}: {} watchers over {} connections, then {} puts/s for {} s",
        kind.label(),
        options.watchers,
        channels.len(),
        options.put_rate,
        options.measure_seconds
    );
    let (deliveries, watch) = fanout.run(&channels, direct, &probe).await;
    drop(channels);
    let measured = probe.measured();
    let run = TreeRun {
        target: kind,
        failure: None,
        watch: Some(watch),
        deliveries: Some(deliveries),
        etcd_watchers_before: Some(before.watchers),
        etcd_watch_streams_before: Some(before.watch_streams),
        measured,
        unhealthy: tree.unhealthy().await,
        load_average: (started_load, load_average()),
    };
    eprintln!("tree: {}: {}", kind.label(), brief(&run));
    Ok(run)
}

/// `per_leaf` connections to every leaf, ordered so that consecutive Watch streams go to consecutive leaves (the
/// fan-out deals its streams out over the connections in turn): leaf 0's first, leaf 1's first, ..., leaf 0's
/// second, ...
async fn connect(tree: &Tree, per_leaf: usize) -> Result<Vec<Channel>, String> {
    let mut by_leaf = Vec::with_capacity(tree.leaves().len());
    for leaf in tree.leaves() {
        by_leaf.push(Dialer::new(&leaf.addr(), None).connect(per_leaf).await?);
    }
    Ok(interleave(by_leaf))
}

/// The first item of every list, then the second of every list, and so on.
fn interleave<T>(lists: Vec<Vec<T>>) -> Vec<T> {
    let mut iters: Vec<_> = lists.into_iter().map(Vec::into_iter).collect();
    let mut out = Vec::new();
    loop {
        let before = out.len();
        out.extend(iters.iter_mut().filter_map(Iterator::next));
        if out.len() == before {
            return out;
        }
    }
}

/// A tree's run in one line, for the progress log.
fn brief(run: &TreeRun) -> String {
    let fanout = run
        .watch
        .as_ref()
        .and_then(|w| w.fanout.as_ref())
        .map_or("-".into(), |l| {
            format!("{:.1}/{:.1}/{:.1} ms", l.p50_ms, l.p99_ms, l.max_ms)
        });
    let etcd_watchers = run
        .measured
        .etcd
        .map_or("?".into(), |g| g.watchers.describe());
    let cpu = run.measured.cpu.map_or("?".into(), |c| {
        format!(
            "etcd {:.3}, mid {:.3}, leaves {:.3} (max {:.3}), bench {:.3}",
            c.etcd, c.mid, c.leaves_sum, c.leaf_max, c.bench
        )
    });
    let (missing, duplicates) = run
        .watch
        .as_ref()
        .map_or((0, 0), |w| (w.missing, w.duplicates));
    format!(
        "fan-out p50/p99/max {fanout}, missing {missing}, duplicates {duplicates}, watchers on etcd {etcd_watchers}, \
         CPU s/s {cpu}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_are_interleaved_so_streams_go_round_the_leaves() {
        let lists = vec![vec!["a0", "a1"], vec!["b0", "b1"], vec!["c0"]];
        assert_eq!(interleave(lists), vec!["a0", "b0", "c0", "a1", "b1"]);
        assert_eq!(interleave::<u8>(Vec::new()), Vec::<u8>::new());
    }

    fn options(flags: &[&str]) -> Options {
        use clap::{Args as _, FromArgMatches};
        let command = Options::augment_args(clap::Command::new("tree"));
        let matches = command
            .try_get_matches_from(std::iter::once("tree").chain(flags.iter().copied()))
            .expect("the flags parse");
        Options::from_arg_matches(&matches).expect("the options convert")
    }

    #[test]
    fn defaults_are_issue_18s_sizes_and_both_trees() {
        let o = options(&[]);
        assert_eq!((o.leaves, o.watchers), (10, 10_000));
        assert_eq!(o.targets(), vec![TreeTarget::This, TreeTarget::Go]);
        assert_eq!(o.check(), Ok(()));
        let go_only = options(&["--target", "go"]);
        assert_eq!(go_only.targets(), vec![TreeTarget::Go]);
    }

    #[test]
    fn sizes_that_leave_a_leaf_without_streams_are_refused() {
        let refused = options(&["--leaves", "3", "--watchers", "200"])
            .check()
            .expect_err("two streams for three leaves");
        assert!(
            refused.contains("make 2 streams, fewer than the 3 leaves"),
            "{refused}"
        );
        assert!(options(&["--put-rate", "0"]).check().is_err());
        assert!(options(&["--leaves", "0"]).check().is_err());
    }
}
