#!/usr/bin/env bash
# Side-by-side benchmark: direct etcd vs etcd's Go grpc-proxy vs this proxy, same load, alternating runs.
#
#   ci/bench.sh           full run (etcd 3.5.1, 3.4.23 and 3.5.30, every scenario, 3 rounds; about 10 minutes on 2
#                         cores for the first two, so an estimated 15 with 3.5.30), writes bench/results/latest.{json,md}
#                         and bench/results/latest-<version>-*.svg
#   ci/bench.sh --quick   tiny sizes, one short round (under 2 minutes after the build), writes target/bench-quick/
#   ci/bench.sh --scale   the sizes of issues 5 and 6 (10,000 watchers on one key, 100 per stream over 100
#                         connections, at 1, 5 and 20 puts/s; 10,000 leases over 1,000 streams), a fresh stack per
#                         scenario case, judged against the issues' targets (about 5 minutes on 2 cores for both
#                         versions), writes bench/results/scale.{json,md} and bench/results/scale-<version>-*.svg
#   ci/bench.sh [--quick|--scale] ARGS...   extra ARGS go to the bench binary (see `target/release/bench --help`),
#                         e.g. --scenario put --rounds 5 --name my-run (size and timing flags such as --rounds are
#                         refused together with --quick or --scale, which set them all)
#
# Installs what it needs with ci/install-conformance-deps.sh (etcd 3.4.23 from Debian; etcd 3.5.1 and 3.5.30 into
# the test kit's directories, $ETCD_351_DIR and $ETCD_3530_DIR), builds the proxy and the load generator in release
# mode, and starts every process itself on free loopback ports.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=full
case "${1:-}" in
  --quick | --scale)
    mode=${1#--}
    shift
    ;;
esac

# Also runs ci/install-deps.sh (etcd 3.4.23).
ci/install-conformance-deps.sh >/dev/null
etcd351_dir=${ETCD_351_DIR:-/usr/local/lib/etcd-3.5.1}
etcd3530_dir=${ETCD_3530_DIR:-/usr/local/lib/etcd-3.5.30}
cargo build --release --locked -p proxy -p bench

machine="$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), \
$(awk '/MemTotal/ {printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo), \
$(. /etc/os-release && echo "$PRETTY_NAME"), Linux $(uname -r); load generator, etcd and proxies share the machine; \
proxy built from $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- proxy proto || echo ' with uncommitted changes')"

args=(
  --etcd "3.5.1=$etcd351_dir/etcd"
  --etcd "3.4.23=$(command -v etcd)"
  --proxy-bin target/release/etcd-grpc-proxy
  --machine "$machine"
)
case $mode in
  quick)
    args+=(--quick --name quick --out-dir target/bench-quick)
    command="ci/bench.sh --quick $*"
    ;;
  scale)
    # Sizes and timing: Sizes::scale and Timing::scale in bench/src/plan.rs.
    args+=(--scale --name scale --out-dir bench/results)
    command="ci/bench.sh --scale $*"
    ;;
  full)
    # Full sizes: the defaults of the bench binary (see Sizes and Timing in bench/src/plan.rs), shorter runs.
    args+=(--etcd "3.5.30=$etcd3530_dir/etcd" --name latest --out-dir bench/results --seconds 2 --warmup-seconds 0.5 --rounds 3)
    command="ci/bench.sh $*"
    ;;
esac

BENCH_COMMAND="${command% }" target/release/bench "${args[@]}" "$@"
