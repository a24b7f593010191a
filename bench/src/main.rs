//! `bench`: runs the side-by-side benchmark and writes `<out-dir>/<name>.json`, `.md` and SVG charts; or, without
//! running anything, renders an earlier run again (`--render`) or compares two runs (`--compare`); or, as
//! `bench failover`, measures what a member's crash, hang or partition costs each target's clients; or, as
//! `bench tree`, measures a watch fan-out through a tree of this proxy and through a tree of the Go proxy; or, as
//! `bench list`, times listing 100,000 keys with RangeStream straight from etcd 3.7 and through this proxy; or,
//! as `bench gateway`, measures etcd's JSON gateway through this proxy against gRPC and against etcd's own.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bench::plan::{EtcdBinary, Plan, Scenario, Sizes, Timing, TlsMode};
use bench::results::Report;
use clap::parser::ValueSource;
use clap::{ArgMatches, Args as _, CommandFactory, FromArgMatches, Parser, Subcommand};

/// Direct etcd vs etcd's Go grpc-proxy vs etcd-grpc-proxy, same load, alternating runs.
#[derive(Parser, Debug)]
#[command(
    name = "bench",
    subcommand_negates_reqs = true,
    args_conflicts_with_subcommands = true
)]
struct Args {
    #[command(subcommand)]
    mode: Option<Mode>,
    /// An etcd to test against, as VERSION=PATH to its `etcd` binary (repeatable); its `grpc-proxy start` is the
    /// Go proxy of that version.
    #[arg(long = "etcd", value_parser = EtcdBinary::parse, required_unless_present_any = ["render", "compare"])]
    etcds: Vec<EtcdBinary>,
    /// The `etcd-grpc-proxy` binary (a release build for real numbers).
    #[arg(long, required_unless_present_any = ["render", "compare"])]
    proxy_bin: Option<PathBuf>,
    /// Runs nothing: re-renders the markdown and charts of an earlier run from its JSON into --out-dir (e.g.
    /// after a change to the charts).
    #[arg(long, value_name = "JSON", conflicts_with = "compare")]
    render: Option<PathBuf>,
    /// Runs nothing: compares two earlier runs (e.g. without and with --tls), writing
    /// `<out-dir>/<BASE name>-vs-<OTHER name>.md`: each target's figures in both, and this proxy against Go in each.
    #[arg(long, num_args = 2, value_names = ["BASE_JSON", "OTHER_JSON"], action = clap::ArgAction::Set)]
    compare: Option<Vec<PathBuf>>,
    /// Scenarios to run (all if absent).
    #[arg(long = "scenario", value_enum)]
    scenarios: Vec<Scenario>,
    /// Names the outputs.
    #[arg(long, default_value = "latest")]
    name: String,
    #[arg(long, default_value = "bench/results")]
    out_dir: PathBuf,
    /// Seeds the mixed workload's choices.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// A line describing the machine, for the report.
    #[arg(long, default_value = "unspecified")]
    machine: String,
    /// Quick mode: tiny sizes and one short round (`Sizes::quick`, `Timing::quick`); size and timing flags are
    /// refused with it; checks that everything runs, measures nothing worth reporting.
    #[arg(long, conflicts_with = "scale")]
    quick: bool,
    /// Scale mode: the sizes of issues 5 and 6 (`Sizes::scale`, `Timing::scale`); size and timing flags are
    /// refused with it; runs the watch fan-out (at each put rate) and the lease keep-alive scenarios unless
    /// --scenario says otherwise, each on a fresh stack, and judges them against the issues' targets in the report.
    #[arg(long)]
    scale: bool,
    /// Runs both proxies with this `--namespace` (clients of direct etcd use its keys unprefixed).
    #[arg(long, default_value = "")]
    namespace: String,
    /// A flag for this proxy only (repeatable), in both its processes (cache on and off), e.g.
    /// `--proxy-arg=--worker-threads=2`; none by default. The Go proxy runs as before, so that ratios to it compare
    /// runs with different flags.
    #[arg(long = "proxy-arg", allow_hyphen_values = true)]
    proxy_args: Vec<String>,
    /// Another build of this proxy (e.g. one of an older commit) to measure this one against: every case that
    /// visits `this-proxy-nocache` (range, mixed and write-to-visible) visits it too, as `baseline-proxy`, a
    /// process in front of the same etcd started as `this-proxy` is (with --namespace and the TLS flags) but with
    /// its own default range cache and without the --proxy-arg flags, which an old build may not know. None by
    /// default.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["render", "compare"])]
    baseline_bin: Option<PathBuf>,
    /// Mutual TLS on every link: etcd serves TLS with --client-cert-auth, both proxies dial it over TLS (a client
    /// certificate without a Common Name) and serve TLS requiring a client certificate, and the benchmark's clients
    /// present one; certificates made for the run. `--tls=both`: each case on a plaintext stack and on a TLS
    /// stack in the same rounds, and the report sets them side by side (what TLS costs each proxy).
    #[arg(long, value_enum, num_args = 0..=1, require_equals = true, default_value = "off", default_missing_value = "on")]
    tls: TlsMode,
    /// A fresh etcd and fresh proxies for every scenario case (implied by --scale).
    #[arg(long)]
    fresh_stack: bool,
    #[command(flatten)]
    sizes: Sizes,
    #[command(flatten)]
    timing: Timing,
}

/// Runs other than the side-by-side benchmark.
#[derive(Subcommand, Debug)]
enum Mode {
    /// Crash, hang and partition each member of a 3-member cluster in turn while reading and writing through this
    /// proxy, etcd's Go proxy and etcdctl at once; prints failed calls per route and this proxy's time to replace
    /// its active member (see `bench::failover`).
    Failover(bench::failover::Options),
    /// One mid proxy in front of etcd and leaf proxies in front of it, 10,000 watchers on one key through the
    /// leaves while the key is put: fan-out latency, lost events, watchers on etcd and each tier's CPU, for a tree
    /// of this proxy and a tree of etcd's Go proxy in turn (see `bench::tree`).
    Tree(bench::tree::Options),
    /// One etcd member loaded with 100,000 keys, the whole keyspace listed with RangeStream (etcd 3.7) straight
    /// from etcd and through this proxy in turn: each one's median time and the proxy's peak memory (see
    /// `bench::list`).
    List(bench::list::Options),
    /// One etcd member and this proxy: 1,000 watchers of one key over the proxy's JSON gateway and then over
    /// gRPC (etcd's watchers, fan-out latency of paced puts), and unary ranges and puts against etcd's own
    /// gateway and the proxy's (calls/s, CPU per call) (see `bench::gateway`).
    Gateway(bench::gateway::Options),
}

fn main() -> ExitCode {
    let matches = Args::command().get_matches();
    let args = match Args::from_arg_matches(&matches) {
        Ok(args) => args,
        Err(e) => e.exit(),
    };
    match &args.mode {
        Some(Mode::Failover(options)) => return failover(options),
        Some(Mode::Tree(options)) => return tree(options),
        Some(Mode::List(options)) => return list(options),
        Some(Mode::Gateway(options)) => return gateway(options),
        None => {}
    }
    if let Some(message) = overridden_flags(&matches, &args) {
        eprintln!("bench: {message}");
        return ExitCode::from(2);
    }
    if let Some(json) = &args.render {
        return render(json, &args.out_dir);
    }
    if let Some(jsons) = &args.compare {
        return compare(&jsons[0], &jsons[1], &args.out_dir);
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let plan = plan_of(args, std::env::var("BENCH_COMMAND").unwrap_or(command));
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("bench: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = runtime.block_on(bench::runner::run(&plan));
    let written = match bench::report::write(&report, &plan.out_dir) {
        Ok(written) => written,
        Err(e) => {
            eprintln!("bench: cannot write the report: {e}");
            return ExitCode::FAILURE;
        }
    };
    for path in &written {
        println!("{}", path.display());
    }
    if report.versions.iter().any(|v| v.failure.is_some()) {
        for v in &report.versions {
            if let Some(failure) = &v.failure {
                eprintln!("bench: etcd {} was not measured: {failure}", v.version);
            }
        }
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// The side-by-side run the command line asks for, `command` reproducing it in the report.
fn plan_of(args: Args, command: String) -> Plan {
    Plan {
        name: args.name,
        out_dir: args.out_dir,
        etcds: args.etcds,
        proxy_bin: args.proxy_bin.unwrap_or_default(),
        namespace: args.namespace,
        proxy_args: args.proxy_args,
        baseline_bin: args.baseline_bin,
        tls: args.tls,
        scenarios: match (args.scenarios.is_empty(), args.scale) {
            (false, _) => args.scenarios,
            (true, true) => vec![Scenario::WatchFanout, Scenario::LeaseKeepalive],
            (true, false) => Scenario::ALL.to_vec(),
        },
        sizes: match (args.quick, args.scale) {
            (true, _) => Sizes::quick(),
            (_, true) => Sizes::scale(),
            _ => args.sizes,
        },
        timing: match (args.quick, args.scale) {
            (true, _) => Timing::quick(),
            (_, true) => Timing::scale(),
            _ => args.timing,
        },
        fresh_stack: args.fresh_stack || args.scale,
        check_targets: args.scale,
        seed: args.seed,
        machine: args.machine,
        command,
    }
}

/// `bench failover`: runs, prints the markdown, writes it and the JSON. Fails when a phase could not be run.
fn failover(options: &bench::failover::Options) -> ExitCode {
    let written = measure(
        "bench failover",
        |command| bench::failover::run(options, command),
        bench::failover::table::render,
        |report| bench::failover::write(report, &options.out_dir),
    );
    match written {
        Some(report) if report.phases.iter().all(|p| p.failure.is_none()) => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    }
}

/// `bench tree`: runs, prints the markdown, writes it and the JSON. Fails when a tree could not be measured or its
/// clients lost or repeated events.
fn tree(options: &bench::tree::Options) -> ExitCode {
    let Some(report) = measure(
        "bench tree",
        |command| bench::tree::run(options, command),
        bench::tree::table::render,
        |report| bench::tree::write(report, &options.out_dir),
    ) else {
        return ExitCode::FAILURE;
    };
    let planned = report.planned_puts();
    if report.trees.iter().any(|t| !t.losses(planned).is_empty()) {
        eprintln!(
            "bench tree: some tree lost or repeated events, or was not measured: see the report"
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// `bench list`: runs, prints the markdown, writes it and the JSON. Fails when a list failed or came incomplete.
fn list(options: &bench::list::Options) -> ExitCode {
    let written = measure(
        "bench list",
        |command| bench::list::run(options, command),
        bench::list::render,
        |report| bench::list::write(report, &options.out_dir),
    );
    match written {
        Some(_) => ExitCode::SUCCESS,
        None => ExitCode::FAILURE,
    }
}

/// `bench gateway`: runs, prints the markdown, writes it and the JSON. Fails when it could not run, a watcher
/// missed or repeated an event, or a call failed.
fn gateway(options: &bench::gateway::Options) -> ExitCode {
    let Some(report) = measure(
        "bench gateway",
        |command| bench::gateway::run(options, command),
        bench::gateway::render,
        |report| bench::gateway::write(report, &options.out_dir),
    ) else {
        return ExitCode::FAILURE;
    };
    let failures = report.failures();
    if failures.is_empty() {
        return ExitCode::SUCCESS;
    }
    for failure in failures {
        eprintln!("bench gateway: {failure}");
    }
    ExitCode::FAILURE
}

/// Runs a measurement of its own (`bench failover`, `bench tree`, `bench list`, `bench gateway`) on a fresh runtime, given the command line;
/// prints its markdown and writes its files. Ctrl-C ends the run by dropping it, which kills every process it
/// started. `None` (after saying why) when it could not run or its report could not be written.
fn measure<R, F>(
    name: &str,
    run: impl FnOnce(String) -> F,
    render: impl FnOnce(&R) -> String,
    write: impl FnOnce(&R) -> Result<Vec<PathBuf>, String>,
) -> Option<R>
where
    F: std::future::Future<Output = Result<R, String>>,
{
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("bench: cannot start the async runtime: {e}");
            return None;
        }
    };
    let command = std::env::var("BENCH_COMMAND")
        .unwrap_or_else(|_| std::env::args().collect::<Vec<_>>().join(" "));
    let outcome = runtime.block_on(async {
        tokio::select! {
            report = run(command) => report,
            _ = tokio::signal::ctrl_c() => Err("interrupted".to_string()),
        }
    });
    let report = match outcome {
        Ok(report) => report,
        Err(e) => {
            eprintln!("{name}: {e}");
            return None;
        }
    };
    println!("{}", render(&report));
    match write(&report) {
        Ok(paths) => paths.iter().for_each(|p| eprintln!("{}", p.display())),
        Err(e) => {
            eprintln!("{name}: cannot write the report: {e}");
            return None;
        }
    }
    Some(report)
}

/// The size and timing flags given on the command line that `--quick` or `--scale` would silently override, as
/// an error message; `None` when there are none.
fn overridden_flags(matches: &ArgMatches, args: &Args) -> Option<String> {
    let mode = match (args.quick, args.scale) {
        (true, _) => "--quick",
        (_, true) => "--scale",
        _ => return None,
    };
    let given: Vec<String> = Sizes::augment_args(clap::Command::new("sizes"))
        .get_arguments()
        .chain(Timing::augment_args(clap::Command::new("timing")).get_arguments())
        .filter(|arg| matches.value_source(arg.get_id().as_str()) == Some(ValueSource::CommandLine))
        .map(|arg| format!("--{}", arg.get_long().unwrap_or(arg.get_id().as_str())))
        .collect();
    (!given.is_empty()).then(|| {
        format!(
            "{} cannot be combined with {mode}, which sets every size and timing itself; drop {mode} to choose them",
            given.join(", ")
        )
    })
}

/// An earlier run's report, from its JSON.
fn read_report(json: &Path) -> Result<Report, String> {
    std::fs::read_to_string(json)
        .map_err(|e| e.to_string())
        .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()))
        .map_err(|e| format!("cannot read {}: {e}", json.display()))
}

/// Writes the comparison of two earlier runs.
fn compare(base: &Path, other: &Path, out_dir: &Path) -> ExitCode {
    let reports = read_report(base).and_then(|base| Ok((base, read_report(other)?)));
    let written = reports.and_then(|(base, other)| {
        bench::report::write_comparison(&base, &other, out_dir)
            .map_err(|e| format!("cannot write the comparison: {e}"))
    });
    match written {
        Ok(path) => {
            println!("{}", path.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes the markdown and charts of an earlier run again from its JSON.
fn render(json: &Path, out_dir: &Path) -> ExitCode {
    let report = match read_report(json) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    match bench::report::write_rendered(&report, out_dir) {
        Ok(written) => {
            for path in written {
                println!("{}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench: cannot write the report: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bench::plan::Target;

    /// What `overridden_flags` says of a command line (after the binary's name and a target).
    fn refusal(flags: &[&str]) -> Option<String> {
        let line = [
            "bench",
            "--etcd",
            "3.5.1=/usr/bin/etcd",
            "--proxy-bin",
            "proxy",
        ]
        .into_iter()
        .chain(flags.iter().copied());
        let matches = Args::command()
            .try_get_matches_from(line)
            .expect("the command line parses");
        let args = Args::from_arg_matches(&matches).expect("the arguments convert");
        overridden_flags(&matches, &args)
    }

    #[test]
    fn size_and_timing_flags_are_refused_with_a_mode_that_sets_them() {
        assert_eq!(
            refusal(&["--scale", "--rounds", "3", "--watch-put-rate", "1,2"]).as_deref(),
            Some(
                "--watch-put-rate, --rounds cannot be combined with --scale, which sets every size and timing \
                 itself; drop --scale to choose them"
            )
        );
        let quick =
            refusal(&["--quick", "--seconds=2"]).expect("--seconds is refused with --quick");
        assert!(
            quick.starts_with("--seconds cannot be combined with --quick"),
            "{quick}"
        );
    }

    #[test]
    fn compare_takes_two_reports_and_needs_no_targets() {
        let args = Args::try_parse_from(["bench", "--compare", "off.json", "on.json"])
            .expect("--compare stands alone");
        assert_eq!(
            args.compare,
            Some(vec![PathBuf::from("off.json"), PathBuf::from("on.json")])
        );
        assert!(Args::try_parse_from(["bench", "--compare", "off.json"]).is_err());
        assert!(
            Args::try_parse_from(["bench", "--tls"]).is_err(),
            "a run needs targets"
        );
    }

    #[test]
    fn tls_alone_is_on_and_takes_both() {
        let tls = |flags: &[&str]| {
            let line = ["bench", "--etcd", "3.5.1=/usr/bin/etcd", "--proxy-bin", "p"];
            Args::try_parse_from(line.iter().chain(flags)).map(|a| a.tls)
        };
        assert_eq!(tls(&[]).ok(), Some(TlsMode::Off));
        assert_eq!(tls(&["--tls"]).ok(), Some(TlsMode::On));
        assert_eq!(tls(&["--tls=both"]).ok(), Some(TlsMode::Both));
        assert_eq!(
            tls(&["--tls", "--scenario", "put"]).ok(),
            Some(TlsMode::On),
            "a bare --tls takes no value"
        );
    }

    #[test]
    fn failover_is_a_subcommand_that_needs_no_targets() {
        let args = Args::try_parse_from(["bench", "failover", "--rounds", "3", "--fault", "hang"])
            .expect("failover stands alone");
        let Some(Mode::Failover(options)) = args.mode else {
            panic!("not the failover mode: {:?}", args.mode);
        };
        assert_eq!(options.rounds, 3);
        assert_eq!(options.faults, vec![bench::failover::FaultKind::Hang]);
        assert!(
            Args::try_parse_from(["bench", "--quick", "failover"]).is_err(),
            "the side-by-side run's flags do not mix with it"
        );
    }

    #[test]
    fn tree_is_a_subcommand_that_needs_no_targets() {
        let args = Args::try_parse_from(["bench", "tree", "--leaves", "2", "--target", "go"])
            .expect("tree stands alone");
        let Some(Mode::Tree(options)) = args.mode else {
            panic!("not the tree mode: {:?}", args.mode);
        };
        assert_eq!(options.leaves, 2);
        assert_eq!(options.targets, vec![bench::tree::TreeTarget::Go]);
    }

    #[test]
    fn gateway_is_a_subcommand_that_needs_no_targets() {
        let args = Args::try_parse_from(["bench", "gateway", "--watchers", "10", "--seconds", "2"])
            .expect("gateway stands alone");
        let Some(Mode::Gateway(options)) = args.mode else {
            panic!("not the gateway mode: {:?}", args.mode);
        };
        assert_eq!((options.watchers, options.seconds), (10, 2.0));
        assert!(options.etcd.is_none());
    }

    #[test]
    fn the_baseline_build_is_visited_exactly_where_this_proxy_without_its_cache_is_and_only_with_the_flag()
     {
        let plan = |flags: &[&str]| {
            let line = ["bench", "--etcd", "3.5.1=/usr/bin/etcd", "--proxy-bin", "p"];
            let args =
                Args::try_parse_from(line.iter().chain(flags)).expect("the command line parses");
            plan_of(args, "c".into())
        };
        let without = plan(&[]);
        let with = plan(&[
            "--baseline-bin",
            "/tmp/proxy-77cfd39",
            "--proxy-arg=--worker-threads=2",
        ]);
        assert_eq!(without.baseline_bin, None);
        assert_eq!(
            with.baseline_bin.as_deref(),
            Some(Path::new("/tmp/proxy-77cfd39"))
        );
        for scenario in Scenario::ALL {
            let nocache = without
                .targets(scenario)
                .contains(&Target::RustProxyNoCache);
            assert_eq!(
                without.targets(scenario),
                scenario.targets(),
                "{}",
                scenario.label()
            );
            assert!(!without.targets(scenario).contains(&Target::BaselineProxy));
            assert_eq!(
                with.targets(scenario).contains(&Target::BaselineProxy),
                nocache,
                "{}: the baseline where the nocache target is",
                scenario.label()
            );
        }
        for refused in [
            ["bench", "--baseline-bin", "b", "--render", "r.json"].as_slice(),
            &[
                "bench",
                "--baseline-bin",
                "b",
                "--compare",
                "a.json",
                "b.json",
            ],
            &["bench", "--baseline-bin", "b", "tree"],
        ] {
            assert!(
                Args::try_parse_from(refused).is_err(),
                "a flag of the side-by-side run only: {refused:?}"
            );
        }
    }

    #[test]
    fn reports_written_before_the_baseline_build_still_load_and_render_without_it() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
        let mut loaded = 0;
        for entry in std::fs::read_dir(&dir).expect("bench/results") {
            let path = entry.expect("a directory entry").path();
            let text = match path.extension() {
                Some(ext) if ext == "json" => std::fs::read_to_string(&path).expect("readable"),
                _ => continue,
            };
            // The side-by-side runs' reports; the other modes write reports of their own.
            let value: serde_json::Value = serde_json::from_str(&text).expect("JSON");
            if value.get("sizes").is_none() || value.get("versions").is_none() {
                continue;
            }
            let report = read_report(&path).unwrap_or_else(|e| panic!("{e}"));
            if value.get("baseline_bin").is_none() {
                assert_eq!(report.baseline_bin, None);
                let markdown = bench::report::table::markdown(&report);
                assert!(!markdown.contains("baseline"), "{}", path.display());
                loaded += 1;
            }
        }
        assert!(
            loaded > 0,
            "no report older than the flag in {}",
            dir.display()
        );
    }

    #[test]
    fn size_and_timing_flags_stand_alone_and_modes_stand_alone() {
        assert_eq!(refusal(&["--rounds", "3", "--watchers", "10"]), None);
        assert_eq!(refusal(&["--scale", "--scenario", "watch-fanout"]), None);
        assert_eq!(refusal(&["--quick"]), None);
    }
}
