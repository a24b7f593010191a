//! Runs one scenario over a few seeds and prints each report (a tool for exploring; tests use `tests/scenarios.rs`).
//! `cargo run -p sim --example try_seeds -- watch 0 8`. `SIM_TRACE=1` also prints the last trace lines of a passing
//! run; `RUST_LOG=proxy=debug,sim=info` prints the proxy's logs and the faults.

fn main() {
    // The proxy's logs and the faults, stamped with the simulation's virtual time.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_timer(VirtualTime)
            .init();
    }
    let args: Vec<String> = std::env::args().collect();
    let scenario =
        sim::scenario::Scenario::from_name(args.get(1).map_or("watch", |s| s)).expect("scenario");
    let from: u64 = args.get(2).map_or(0, |s| s.parse().unwrap());
    let to: u64 = args.get(3).map_or(from + 1, |s| s.parse().unwrap());
    for seed in from..to {
        // Wall-clock time of a run is printed for tuning, never used by the simulation.
        #[allow(clippy::disallowed_methods)]
        let started = std::time::Instant::now();
        let report = sim::scenario::run(scenario, seed);
        let took = started.elapsed();
        if report.passed() {
            println!(
                "seed {seed}: ok digest {:016x} lag {:?} delivery {:?} watchers {} calls {} revisions {} virtual {:?} wall {took:?}",
                report.digest,
                report.worst_lag,
                report.worst_delivery.map(|d| (d.late_by, d.revision)),
                report.watchers,
                report.calls,
                report.revisions,
                report.virtual_time
            );
            if std::env::var_os("SIM_TRACE").is_some() {
                println!("    {}", report.trace_tail.join("\n    "));
            }
        } else {
            println!("{}\n  wall {took:?}", report.failure_text());
        }
    }
}

/// Stamps log lines with the simulation's virtual time, as the trace does.
struct VirtualTime;

impl tracing_subscriber::fmt::time::FormatTime for VirtualTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match turmoil::sim_elapsed() {
            Some(at) => write!(w, "{:.3}s", at.as_secs_f64()),
            None => write!(w, "-"),
        }
    }
}
