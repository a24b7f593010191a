#!/usr/bin/env bash
# The one command that tests everything: installs dependencies, checks formatting and lints, runs all tests
# (unit tests, and integration tests against real etcd processes started on free loopback ports).
set -euo pipefail
cd "$(dirname "$0")/.."

# step runs a command and prints how long it took, so that the run's time stays in view (CI must end well inside
# the hour).
step() {
  local start=$SECONDS
  "$@"
  echo "ci/test.sh: $((SECONDS - start)) s: $*" >&2
}

step ci/install-deps.sh
step ci/install-conformance-deps.sh
step ci/validate-kubernetes.sh # deploy/kubernetes/ against the Kubernetes API's schemas, strictly
step cargo fmt --all --check
step cargo clippy --workspace --all-targets --locked -- -D warnings
# Docker only for the test run (the conformance suite's testcontainers backend): a private dockerd, stopped by its
# pid when this script exits, even on failure. testcontainers-rs starts no Ryuk reaper; the suite removes its
# containers itself.
trap 'ci/docker-image.sh stop' EXIT
eval "$(ci/docker-image.sh start)"
export TESTCONTAINERS_RYUK_DISABLED=true
step cargo test --workspace --locked
step ci/fuzz.sh libfuzzer 15 # every coverage-guided fuzz target of fuzz/ for 15 s, on a copy of its seed corpus
# The proxy's own integration tests run on the newest etcd, 3.7.3 (built from its Go modules by
# ci/install-etcd-go.sh; the default of TESTKIT_ETCD_VERSION), and the conformance suite on all five versions. The
# version-sensitive ones run again on 3.4.23 and 3.5.30: the watch-auth ones depend on how each etcd version
# words its refusals (and on whether it has the open-ended watch hole, fixed in 3.6), TLS on how each checks
# certificates, the hung-member ones on how each elects and answers while a member is stopped, the range cache's on
# whether progress answers can move its copies (from 3.5.8: linearizable reads from the cache), the progress ones on
# when etcd answers progress requests (from 3.5.8: only when every watcher of the stream is synced), the lease-auth,
# leader-probe, discovery and auto-sync ones on whether etcd checks a renewal's token and answers Status and
# MemberList without one (all change in 3.5.30). 3.5.1 answers these as 3.4.23 does, and 3.6.16 as 3.7.3 does (the
# hole fixed, past 3.5.30's changes, built here by the same Go and so the same TLS); the conformance suite covers
# both. RangeStream (served by 3.7, built by the proxy from Range calls before) and deep Txns (refused by 3.7's decoder
# first) run again on 3.5.30, calls cancelled mid-stream included; range_stream.rs runs its every-version test once.
# Distributed tracing runs again on 3.5.30, whose tracing flags are the experimental spellings. The JSON gateway
# runs again on 3.4.23, whose gateway writes errors in the older form (`{"error":..}`), which the proxy must follow.
# Under CI=true a missing version fails the run.
for v in 3.4.23 3.5.30; do
  step env TESTKIT_ETCD_VERSION=$v cargo test -p proxy --locked --test watch_auth --test tls --test hung_member --test range_cache \
    --test watch_progress --test lease_auth --test auth_leader_probe --test discovery --test auto_sync
done
step env TESTKIT_ETCD_VERSION=3.4.23 cargo test -p proxy --locked --test gateway
step env TESTKIT_ETCD_VERSION=3.5.30 cargo test -p proxy --locked --test range_stream --test hostile_clients --test distributed_tracing -- \
  --skip streamed_chunks_are_one_range_at_the_pinned_revision_on_every_version
