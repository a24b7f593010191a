#!/usr/bin/env bash
# Installs what the tests need, idempotently: etcd 3.4.23 (server and etcdctl, from Debian), protoc and the
# well-known .proto files (the etcd-client crate's build script needs both), curl (with HTTP/2) and openssl (the TLS tests
# read served certificates with `openssl s_client`), systemd-analyze (verifies deploy/systemd's unit) and promtool
# (proxy/tests/deploy_metrics.rs checks deploy/'s alerting rules with it; taken out of Debian's `prometheus` package
# without installing the server and its service). Safe to run again; installs only what is missing.
set -euo pipefail

need=()
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v etcdctl >/dev/null 2>&1 || need+=(etcd-client)
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
[ -f /usr/include/google/protobuf/descriptor.proto ] || need+=(libprotobuf-dev)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)

if [ ${#need[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: ${need[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v promtool >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing: promtool"
  deb_dir=$(mktemp -d)
  $sudo apt-get update -qq
  (cd "$deb_dir" && apt-get download -qq prometheus)
  dpkg-deb -x "$deb_dir"/prometheus_*.deb "$deb_dir/root"
  $sudo install -m 0755 "$deb_dir/root/usr/bin/promtool" /usr/local/bin/promtool
  rm -rf "$deb_dir"
fi

etcd --version | sed -n 1p  # sed reads all input: head would close the pipe early, and pipefail turns the SIGPIPE into a failure
etcdctl version | sed -n 1p
protoc --version
promtool --version 2>&1 | sed -n 1p
