#!/usr/bin/env bash
# ci/copy-shared-libs.sh BINARY ROOTFS: copies every shared library BINARY loads (what ldd names: the C library, the
# loader, libgcc_s, ...) into ROOTFS at the same paths, so that BINARY runs in an image that has nothing else (no
# base image can be pulled here). Libraries are dereferenced (cp -L), since the loader in /lib64 is a symlink. A
# static binary needs none: ldd fails on it, hence `|| true`.
set -euo pipefail
bin=$1 rootfs=$2
{ ldd "$bin" 2>/dev/null || true; } | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' |
  while read -r lib; do
    [ -e "$rootfs$lib" ] || cp -L --parents "$lib" "$rootfs"
  done
