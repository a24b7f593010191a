#!/usr/bin/env bash
# Runs the arbitrary-input properties (proxy/tests/arbitrary_input.rs), the watch hub's model property
# (proxy/src/watch/hub_fuzz.rs) and the lease coalescer's (proxy/src/lease/coalescer_fuzz.rs) again and again with
# new seeds for SECONDS (default 60), FUZZ_CASES cases each (default 5000; HUB_CASES, default 2000, for the hub,
# and LEASE_CASES, default 2000, for the coalescer, whose cases are longer). CI runs them once, from seed 0, as
# part of `cargo test`. A failure prints the seed; rerun it with
#   FUZZ_SEED=<seed> FUZZ_CASES=<cases> cargo test -p proxy --test arbitrary_input
#   FUZZ_SEED=<seed> FUZZ_CASES=<cases> cargo test -p proxy --lib watch::hub_fuzz
#   FUZZ_SEED=<seed> FUZZ_CASES=<cases> cargo test -p proxy --lib lease::coalescer::fuzz
#
# `ci/fuzz.sh libfuzzer [SECONDS] [TARGET...]` instead runs the coverage-guided fuzz targets of fuzz/ (cargo fuzz,
# libFuzzer, on the nightly toolchain; cargo-fuzz is installed if missing): builds them once, then runs each (all by
# default) for SECONDS (default 60) on a copy of its committed corpus fuzz/corpus/<target>/ (the copy grows, the
# repository's does not), and prints each target's executions and coverage (libFuzzer's cov: and ft:). A crash,
# a timeout or an out-of-memory prints the target and the input that reproduces it (kept in fuzz/artifacts/<target>/),
# and the script fails once every target has run; rerun it with
#   (cd fuzz && cargo +nightly fuzz run -s none <target> <input>)
# FUZZ_MAX_LEN (default 4096) bounds the input size; CARGO_TARGET_DIR is honoured (default fuzz/target).
set -euo pipefail
cd "$(dirname "$0")/.."

# The pinned cargo-fuzz, and the libFuzzer part.
CARGO_FUZZ_VERSION=0.13.2
libfuzzer() {
  local budget=${1:-60}
  shift || true
  local targets=("$@")
  rustup run nightly rustc --version >/dev/null 2>&1 || rustup toolchain install nightly --profile minimal
  if [[ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz $CARGO_FUZZ_VERSION" ]]; then
    cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
  fi
  if ((${#targets[@]} == 0)); then
    mapfile -t targets < <(cd fuzz && cargo +nightly fuzz list)
  fi
  # No sanitizer: the proxy forbids unsafe code, and without ASan the targets run about twice as fast. Debug
  # assertions and overflow checks stay on.
  (cd fuzz && cargo +nightly fetch --locked -q && cargo +nightly fuzz build -s none)
  local bin_dir=${CARGO_TARGET_DIR:-$PWD/fuzz/target}/x86_64-unknown-linux-gnu/release
  local work failed=0
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  for target in "${targets[@]}"; do
    mkdir -p "$work/$target" "fuzz/artifacts/$target"
    cp -R "fuzz/corpus/$target/." "$work/$target/" 2>/dev/null || true
    local log="$work/$target.log" rc=0
    "$bin_dir/$target" "$work/$target" -max_total_time="$budget" -max_len="${FUZZ_MAX_LEN:-4096}" -timeout=10 \
      -print_final_stats=1 -artifact_prefix="$PWD/fuzz/artifacts/$target/" >"$log" 2>&1 || rc=$?
    local last execs
    last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n 1 || true)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    echo "fuzz: $target: ${execs:-?} executions in ${budget} s, $(grep -oE 'cov: [0-9]+ ft: [0-9]+' <<<"$last" || echo 'no coverage line'), corpus $(find "$work/$target" -type f | wc -l) inputs"
    if ((rc != 0)); then
      failed=1
      local input
      input=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
      echo "fuzz: $target FAILED (exit $rc); reproducing input: ${input:-none written}" >&2
      grep -E 'panicked at|ERROR: libFuzzer|SUMMARY' "$log" | head -n 5 >&2 || true
      echo "fuzz: rerun with (cd fuzz && cargo +nightly fuzz run -s none $target ${input:-<input>})" >&2
    fi
  done
  return "$failed"
}
if [[ ${1:-} == libfuzzer ]]; then
  shift
  libfuzzer "$@"
  exit
fi

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
