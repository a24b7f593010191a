#!/usr/bin/env bash
# The one command that tests everything: installs dependencies, checks formatting and lints, runs all tests
# (unit tests, and integration tests against real etcd processes started on free loopback ports).
set -euo pipefail
cd "$(dirname "$0")/.."

ci/install-deps.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
cargo test --workspace --locked
