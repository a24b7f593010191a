#!/usr/bin/env bash
# Runs the arbitrary-input properties (proxy/tests/arbitrary_input.rs), the watch hub's model property
# (proxy/src/watch/hub_fuzz.rs) and the lease coalescer's (proxy/src/lease/coalescer_fuzz.rs) again and again with
# new seeds for SECONDS (default 60), FUZZ_CASES cases each (default 5000; HUB_CASES, default 2000, for the hub,
# and LEASE_CASES, default 2000, for the coalescer, whose cases are longer). CI runs them once, from seed 0, as
# part of `cargo test`. A failure prints the seed; rerun it with
#   FUZZ_SEED=<seed> FUZZ_CASES=<cases> cargo test -p proxy --test arbitrary_input
#   FUZZ_SEED=<seed> FUZZ_CASES=<cases> cargo test -p proxy --lib watch::hub_fuzz
#   FUZZ_SEED=<seed> FUZZ_CASES=<cases> cargo test -p proxy --lib lease::coalescer::fuzz
set -euo pipefail
cd "$(dirname "$0")/.."
budget=${1:-60}
cases=${FUZZ_CASES:-5000}
hub_cases=${HUB_CASES:-2000}
lease_cases=${LEASE_CASES:-2000}
cargo test --locked -p proxy --test arbitrary_input --no-run
cargo test --locked -p proxy --lib --no-run
deadline=$((SECONDS + budget))
seed=1
while ((SECONDS < deadline)); do
  FUZZ_SEED=$seed FUZZ_CASES=$cases cargo test --locked -q -p proxy --test arbitrary_input >/dev/null 2>&1 || {
    echo "fuzz: a property failed with FUZZ_SEED=$seed FUZZ_CASES=$cases" >&2
    FUZZ_SEED=$seed FUZZ_CASES=$cases cargo test --locked -p proxy --test arbitrary_input
    exit 1
  }
  FUZZ_SEED=$seed FUZZ_CASES=$hub_cases cargo test --locked -q -p proxy --lib watch::hub_fuzz >/dev/null 2>&1 || {
    echo "fuzz: the hub property failed with FUZZ_SEED=$seed FUZZ_CASES=$hub_cases" >&2
    FUZZ_SEED=$seed FUZZ_CASES=$hub_cases cargo test --locked -p proxy --lib watch::hub_fuzz
    exit 1
  }
  FUZZ_SEED=$seed FUZZ_CASES=$lease_cases cargo test --locked -q -p proxy --lib lease::coalescer::fuzz >/dev/null 2>&1 || {
    echo "fuzz: the lease coalescer property failed with FUZZ_SEED=$seed FUZZ_CASES=$lease_cases" >&2
    FUZZ_SEED=$seed FUZZ_CASES=$lease_cases cargo test --locked -p proxy --lib lease::coalescer::fuzz
    exit 1
  }
  seed=$((seed + 1))
done
echo "fuzz: $((seed - 1)) seeds of $cases cases per property ($hub_cases for the hub, $lease_cases for the coalescer), no failure"
