#!/usr/bin/env bash
# The one command that tests everything: installs dependencies, checks formatting and lints, runs all tests
# (unit tests, and integration tests against real etcd processes started on free loopback ports).
set -euo pipefail
cd "$(dirname "$0")/.."

ci/install-deps.sh
ci/install-conformance-deps.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Docker only for the test run (the conformance suite's testcontainers backend): a private dockerd, stopped by its
# pid when this script exits, even on failure. testcontainers-rs starts no Ryuk reaper; the suite removes its
# containers itself.
trap 'ci/docker-image.sh stop' EXIT
eval "$(ci/docker-image.sh start)"
export TESTCONTAINERS_RYUK_DISABLED=true
cargo test --workspace --locked
ci/fuzz.sh libfuzzer 15 # every coverage-guided fuzz target of fuzz/ for 15 s, on a copy of its seed corpus
# The proxy's own integration tests run on etcd 3.4.23 (Debian's, the default of TESTKIT_ETCD_VERSION); the watch-auth ones
# depend on how each etcd version words its refusals, TLS on how each checks certificates, and the hung-member ones on
# how each elects and answers while a member is stopped, and the range cache's on whether progress answers can move
# its copies (from 3.5.8: linearizable reads from the cache), and the progress ones on when etcd answers progress
# requests (from 3.5.8: only when every watcher of the stream is synced), and the lease-auth, leader-probe, discovery and auto-sync ones
# on whether etcd checks a renewal's token and answers Status and MemberList without one (all change in 3.5.30), so they run again on 3.5.1 and 3.5.30 (installed by
# ci/install-conformance-deps.sh; testkit finds them, and under CI=true a missing one fails the run).
for v in 3.5.1 3.5.30; do
  TESTKIT_ETCD_VERSION=$v cargo test -p proxy --locked --test watch_auth --test tls --test hung_member --test range_cache --test watch_progress --test lease_auth --test auth_leader_probe --test discovery --test auto_sync
done
