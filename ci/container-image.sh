#!/usr/bin/env bash
# ci/container-image.sh [BINARY]: builds the container image etcd-grpc-proxy:<version> (also tagged :latest) from
# deploy/container/Dockerfile with the Docker daemon DOCKER_HOST names (`eval "$(ci/docker-image.sh start)"` gives
# one), and prints its reference on stdout. BINARY is a release build of etcd-grpc-proxy; without it the release
# build is made (or confirmed up to date) first. An image already labelled with this binary's sha256 is kept, so a
# second call costs a docker inspect; the label also tells a test which binary an image holds.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=${1:-}
if [ -z "$bin" ]; then
  cargo build --release --locked --quiet -p proxy --bin etcd-grpc-proxy >&2
  bin="${CARGO_TARGET_DIR:-target}/release/etcd-grpc-proxy"
fi
[ -x "$bin" ] || { echo "ci/container-image.sh: $bin is not an executable" >&2; exit 1; }
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' proxy/Cargo.toml | head -n 1)
image="etcd-grpc-proxy:$version"
sha=$(sha256sum "$bin" | cut -d ' ' -f 1)
held=$(docker image inspect --format '{{index .Config.Labels "io.etcd-grpc-proxy.binary-sha256"}}' "$image" 2>/dev/null || true)
if [ "$held" = "$sha" ]; then
  echo "$image"
  exit 0
fi

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
rootfs="$context/rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc"
# Debug sections are most of a release build's size (its line tables); symbols stay, for --enable-pprof's profiles.
objcopy --strip-debug "$bin" "$rootfs/usr/local/bin/etcd-grpc-proxy"
ci/copy-shared-libs.sh "$bin" "$rootfs"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
cp deploy/container/Dockerfile "$context/Dockerfile"

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
  revision="$revision-modified"
fi
# The legacy builder: Debian's docker.io has no buildx, and FROM scratch needs nothing BuildKit adds.
DOCKER_BUILDKIT=0 docker build --quiet \
  --build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "BINARY_SHA256=$sha" \
  --tag "$image" --tag etcd-grpc-proxy:latest "$context" >/dev/null
echo "$image"
