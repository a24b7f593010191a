#!/usr/bin/env bash
# The long simulation sweep: every scenario over N seeds (default 4096) from START (default 0) in release mode, plus
# the regression seeds in testdata/sim/regressions.txt (`ci/sim-sweep.sh [N] [START]`; a sweep proves something only
# on seeds no fix was tuned against, so give each new sweep a START no earlier one used). CI runs 64 seeds per scenario in `cargo test`; this is the sweep to run
# before trusting a change to failover, the watch hub or the lease coalescer. A failure prints its seed; reproduce
# it with the command it prints (`SIM_SEED=<seed> cargo test -p sim --test scenarios <scenario>_scenario`, hyphens as underscores). The `fleet` scenario (ten proxies)
# costs about a second a seed in release mode, the others a tenth of that or less; the scenarios run in parallel.
set -euo pipefail
cd "$(dirname "$0")/.."
SIM_SEEDS=${1:-4096} SIM_SEED_START=${2:-0} cargo test --locked --release -p sim --test scenarios
