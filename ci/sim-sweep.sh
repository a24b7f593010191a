#!/usr/bin/env bash
# The long simulation sweep: every scenario over seeds 0..N (default 4096) in release mode, plus the regression
# seeds in testdata/sim/regressions.txt. CI runs 64 seeds per scenario in `cargo test`; this is the sweep to run
# before trusting a change to failover, the watch hub or the lease coalescer. A failure prints its seed; reproduce
# it with `SIM_SEED=<seed> cargo test -p sim --release --test scenarios <scenario>`. The `fleet` scenario (ten proxies)
# costs about a second a seed in release mode, the others a tenth of that or less; the scenarios run in parallel.
set -euo pipefail
cd "$(dirname "$0")/.."
SIM_SEEDS=${1:-4096} cargo test --locked --release -p sim --test scenarios
