//! `bench`: runs the side-by-side benchmark and writes `<out-dir>/<name>.json`, `.md` and SVG charts.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bench::plan::{EtcdBinary, Plan, Scenario, Sizes, Timing};
use bench::results::Report;
use clap::Parser;

/// Direct etcd vs etcd's Go grpc-proxy vs etcd-grpc-proxy, same load, alternating runs.
#[derive(Parser, Debug)]
#[command(name = "bench")]
struct Args {
    /// An etcd to test against, as VERSION=PATH to its `etcd` binary (repeatable); its `grpc-proxy start` is the
    /// Go proxy of that version.
    #[arg(long = "etcd", value_parser = EtcdBinary::parse, required_unless_present = "render")]
    etcds: Vec<EtcdBinary>,
    /// The `etcd-grpc-proxy` binary (a release build for real numbers).
    #[arg(long, required_unless_present = "render")]
    proxy_bin: Option<PathBuf>,
    /// Runs nothing: re-renders the markdown and charts of an earlier run from its JSON into --out-dir (e.g.
    /// after a change to the charts).
    #[arg(long, value_name = "JSON")]
    render: Option<PathBuf>,
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
    /// Quick mode: tiny sizes and one short round (`Sizes::quick`, `Timing::quick`), overriding size and timing
    /// flags; checks that everything runs, measures nothing worth reporting.
    #[arg(long)]
    quick: bool,
    #[command(flatten)]
    sizes: Sizes,
    #[command(flatten)]
    timing: Timing,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(json) = &args.render {
        return render(json, &args.out_dir);
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let plan = Plan {
        name: args.name,
        out_dir: args.out_dir,
        etcds: args.etcds,
        proxy_bin: args.proxy_bin.unwrap_or_default(),
        scenarios: if args.scenarios.is_empty() {
            Scenario::ALL.to_vec()
        } else {
            args.scenarios
        },
        sizes: if args.quick {
            Sizes::quick()
        } else {
            args.sizes
        },
        timing: if args.quick {
            Timing::quick()
        } else {
            args.timing
        },
        seed: args.seed,
        machine: args.machine,
        command: std::env::var("BENCH_COMMAND").unwrap_or(command),
    };
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

/// Writes the markdown and charts of an earlier run again from its JSON.
fn render(json: &Path, out_dir: &Path) -> ExitCode {
    let report: Report = match std::fs::read_to_string(json)
        .map_err(|e| e.to_string())
        .and_then(|text| serde_json::from_str(&text).map_err(|e| e.to_string()))
    {
        Ok(report) => report,
        Err(e) => {
            eprintln!("bench: cannot read {}: {e}", json.display());
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
