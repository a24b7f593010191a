#!/usr/bin/env bash
# Quick start: installs etcd if missing, starts a one-member etcd on loopback, builds and starts the proxy in front
# of it, and prints etcdctl lines to try. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."

ETCD_PORT=${ETCD_PORT:-12379}
PEER_PORT=${PEER_PORT:-12380}
PROXY_ADDR=${PROXY_ADDR:-127.0.0.1:23790}

ci/install-deps.sh >/dev/null
cargo build --release -p proxy --locked

work=$(mktemp -d)
etcd_pid=""
proxy_pid=""
cleanup() {
  [ -n "$proxy_pid" ] && kill "$proxy_pid" 2>/dev/null && wait "$proxy_pid" 2>/dev/null
  [ -n "$etcd_pid" ] && kill "$etcd_pid" 2>/dev/null && wait "$etcd_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 0' INT TERM

etcd --name quickstart --data-dir "$work/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
  --initial-cluster "quickstart=http://127.0.0.1:$PEER_PORT" --initial-cluster-state new \
  >"$work/etcd.log" 2>&1 &
etcd_pid=$!

for _ in $(seq 1 100); do
  ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$ETCD_PORT" endpoint health >/dev/null 2>&1 && break
  kill -0 "$etcd_pid" 2>/dev/null || { cat "$work/etcd.log"; exit 1; }
  sleep 0.1
done

target/release/etcd-grpc-proxy start --endpoints="127.0.0.1:$ETCD_PORT" --listen-addr="$PROXY_ADDR" &
proxy_pid=$!

for _ in $(seq 1 100); do
  curl -fs "http://$PROXY_ADDR/health" >/dev/null 2>&1 && break
  kill -0 "$proxy_pid" 2>/dev/null || exit 1
  sleep 0.1
done

cat <<TXT

etcd-grpc-proxy listens on $PROXY_ADDR, in front of etcd on 127.0.0.1:$ETCD_PORT. Try:

  export ETCDCTL_API=3
  etcdctl --endpoints=$PROXY_ADDR put greeting hello
  etcdctl --endpoints=$PROXY_ADDR get greeting
  etcdctl --endpoints=$PROXY_ADDR watch greeting      # and put again from another terminal
  curl http://$PROXY_ADDR/health
  curl http://$PROXY_ADDR/metrics          # etcd's metrics; the proxy's own: /proxy/metrics

Ctrl-C stops the proxy and etcd.
TXT
wait "$proxy_pid"
