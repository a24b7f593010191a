#!/usr/bin/env bash
# Builds etcd 3.6 and 3.7 (etcd, etcdctl, etcdutl) from their Go modules, pinned by the go.mod and go.sum of each
# directory under ci/etcd-go/, into /usr/local/lib/etcd-<version> (or $ETCD_<digits>_DIR, e.g. ETCD_373_DIR for
# 3.7.3). A version whose etcd already reports itself there is skipped. Static binaries (CGO_ENABLED=0), so the
# same files run in the container images of ci/docker-image.sh.
#
#   ci/install-etcd-go.sh           builds every version that is missing
#   ci/install-etcd-go.sh --dirs    prints "<version> <directory>" for each, building nothing
set -euo pipefail
cd "$(dirname "$0")/.."

command -v go >/dev/null || export PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "Go is needed to build etcd 3.6 and 3.7 (expected in /usr/local/go/bin)" >&2; exit 1; }
# The committed go.sum is the pin: nothing may change it, and no other Go toolchain is fetched.
export GOFLAGS="-mod=readonly -buildvcs=false" GOTOOLCHAIN=local CGO_ENABLED=0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

for module in ci/etcd-go/*/; do
  version=$(cd "$module" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
  version=${version#v}
  var="ETCD_${version//./}_DIR"
  dir=${!var:-/usr/local/lib/etcd-$version}
  if [ "${1:-}" = --dirs ]; then
    echo "$version $dir"
    continue
  fi
  printed=$("$dir/etcd" --version 2>/dev/null || true)
  if [[ "$printed" == *"etcd Version: $version"$'\n'* ]] && [ -x "$dir/etcdctl" ] && [ -x "$dir/etcdutl" ]; then
    continue
  fi
  echo "building etcd $version from its Go modules ($module) into $dir"
  out=$(mktemp -d)
  (cd "$module" && go build -trimpath -ldflags=-s -o "$out/" ./etcd ./etcdctl ./etcdutl)
  $sudo mkdir -p "$dir"
  for bin in etcd etcdctl etcdutl; do
    $sudo install -m 0755 "$out/$bin" "$dir/$bin"
  done
  rm -rf "$out"
  printed=$("$dir/etcd" --version)
  [[ "$printed" == *"etcd Version: $version"$'\n'* ]] || { echo "$dir/etcd reports: $printed" >&2; exit 1; }
done
