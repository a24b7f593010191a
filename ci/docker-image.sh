#!/usr/bin/env bash
# Docker for the conformance suite's testcontainers backend, on this machine only (no registry is reachable).
#
#   ci/docker-image.sh start   installs docker.io, busybox-static, etcd 3.5.1, 3.5.30 and the newest (3.7, built
#                              from its Go modules) if missing (ci/install-conformance-deps.sh), starts a dockerd
#                              of our own (own data/exec root, own socket, --iptables=false) unless it already
#                              runs, and imports the images local/etcd:3.5.1, local/etcd:3.5.30 and
#                              local/etcd:<newest> (busybox-static + that version's etcd, etcdctl and etcdutl in
#                              /usr/local/bin) unless present.
#                              Prints `export DOCKER_HOST=...` for the caller to eval.
#   ci/docker-image.sh stop    stops that dockerd by its pid (and only it) and waits for it to exit.
#
# State lives in $CONFORMANCE_DOCKER_DIR (default /tmp/etcd-conformance-docker). The suite finds the socket there
# when DOCKER_HOST is not set. The binaries come from $ETCD_351_DIR (default /usr/local/lib/etcd-3.5.1) and
# $ETCD_3530_DIR (default /usr/local/lib/etcd-3.5.30), the same variables ci/install-conformance-deps.sh installs to.
set -euo pipefail
cd "$(dirname "$0")/.."

D=${CONFORMANCE_DOCKER_DIR:-/tmp/etcd-conformance-docker}
ETCD_351_DIR=${ETCD_351_DIR:-/usr/local/lib/etcd-3.5.1}
ETCD_3530_DIR=${ETCD_3530_DIR:-/usr/local/lib/etcd-3.5.30}
SOCK="$D/docker.sock"
export DOCKER_HOST="unix://$SOCK"

running() {
  [ -f "$D/dockerd.pid" ] && kill -0 "$(cat "$D/dockerd.pid")" 2>/dev/null
}

# import_image VERSION DIR: imports local/etcd:VERSION (busybox-static as /bin/busybox with a few applet links, and
# DIR's etcd, etcdctl and etcdutl in /usr/local/bin) unless the image is already present.
import_image() {
  local version=$1 dir=$2 image rootfs bin
  image="local/etcd:$version"
  docker image inspect "$image" >/dev/null 2>&1 && return 0
  echo "importing $image" >&2
  rootfs=$(mktemp -d)
  # Each call removes its own rootfs when it returns; the handler clears itself, since a RETURN trap set in a function
  # stays set after it.
  trap 'rm -rf "$rootfs"; trap - RETURN' RETURN
  mkdir -p "$rootfs/bin" "$rootfs/usr/local/bin" "$rootfs/tmp" "$rootfs/var/lib/etcd"
  cp /bin/busybox "$rootfs/bin/busybox"
  for applet in sh ls cat mkdir rm ps kill sleep env; do ln -s busybox "$rootfs/bin/$applet"; done
  for bin in etcd etcdctl etcdutl; do
    cp "$dir/$bin" "$rootfs/usr/local/bin/$bin"
    # The image has no libc. etcd 3.5.1 (PyPI) is static, but Debian's 3.5.30 is linked dynamically against glibc.
    ci/copy-shared-libs.sh "$dir/$bin" "$rootfs"
  done
  tar -C "$rootfs" -c . | docker import -c 'ENV PATH=/usr/local/bin:/bin' - "$image" >/dev/null
}

start() {
  ci/install-conformance-deps.sh >&2
  mkdir -p "$D"
  if ! running; then
    echo "starting dockerd (log: $D/dockerd.log)" >&2
    # setsid: dockerd must not get the caller's Ctrl-C or die with its shell; `stop` ends it by pid.
    setsid dockerd --data-root "$D/root" --exec-root "$D/exec" --pidfile "$D/dockerd.pid" \
      -H "unix://$SOCK" --iptables=false --ip6tables=false >"$D/dockerd.log" 2>&1 </dev/null &
    for _ in $(seq 1 300); do
      docker version >/dev/null 2>&1 && break
      sleep 0.1
    done
    docker version >/dev/null 2>&1 || { echo "dockerd did not come up:" >&2; tail -30 "$D/dockerd.log" >&2; exit 1; }
  fi
  import_image 3.5.1 "$ETCD_351_DIR"
  import_image 3.5.30 "$ETCD_3530_DIR"
  # The newest version ci/install-etcd-go.sh builds (its last line: the directories sort by version).
  read -r newest newest_dir < <(ci/install-etcd-go.sh --dirs | tail -n 1)
  import_image "$newest" "$newest_dir"
  echo "export DOCKER_HOST=$DOCKER_HOST"
}

stop() {
  if running; then
    pid=$(cat "$D/dockerd.pid")
    echo "stopping dockerd (pid $pid)" >&2
    kill "$pid"
    for _ in $(seq 1 200); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid"; fi
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
