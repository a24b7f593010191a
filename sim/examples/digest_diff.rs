//! Runs one scenario's seed twice in one process and prints where the traces first differ (a debugging aid).
use sim::scenario::{self, Scenario};

fn main() {
    let name = std::env::args().nth(1).unwrap_or_else(|| "failover".into());
    let seed: u64 = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let scenario = Scenario::ALL
        .into_iter()
        .find(|s| s.name() == name)
        .expect("scenario");
    let a = scenario::run(scenario, seed);
    let b = scenario::run(scenario, seed);
    println!("digests {:016x} {:016x}", a.digest, b.digest);
    for (i, (x, y)) in a.trace_tail.iter().zip(&b.trace_tail).enumerate() {
        if x != y {
            println!("first difference at line {i}:");
            for j in i.saturating_sub(8)..(i + 6).min(a.trace_tail.len()).min(b.trace_tail.len()) {
                println!("A {}\nB {}", a.trace_tail[j], b.trace_tail[j]);
            }
            return;
        }
    }
    println!(
        "traces equal over {} lines",
        a.trace_tail.len().min(b.trace_tail.len())
    );
}
