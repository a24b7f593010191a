#!/usr/bin/env bash
# Validates every manifest of deploy/kubernetes/ against the API schemas of Kubernetes 1.37 (the current release),
# strictly: an unknown field, a wrong type, a missing required field or an API version/kind without a schema is an
# error. The validator is kubernetes-validate (PyPI), pinned with its dependencies in
# ci/kubernetes-validate-requirements.txt and installed once into a virtualenv at $KUBERNETES_VALIDATE_DIR (default
# /usr/local/lib/kubernetes-validate); a second run reuses it. Before the real manifests, broken ones must be
# rejected, so that a validator that checks nothing cannot pass. Prints the validator's line for every resource.
set -euo pipefail
cd "$(dirname "$0")/.."

KUBERNETES_VERSION=1.37.0
requirements=ci/kubernetes-validate-requirements.txt
dir=${KUBERNETES_VALIDATE_DIR:-/usr/local/lib/kubernetes-validate}
validator="$dir/bin/kubernetes-validate"

# The copy of the requirements kept in the virtualenv says what it holds: a changed pin reinstalls.
if ! cmp -s "$requirements" "$dir/requirements.txt" 2>/dev/null || [ ! -x "$validator" ]; then
  echo "installing kubernetes-validate (PyPI) into $dir"
  rm -rf "$dir"
  python3 -m venv "$dir"
  "$dir/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$requirements"
  "$dir/bin/pip" check --disable-pip-version-check >/dev/null
  cp "$requirements" "$dir/requirements.txt"
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# validate FILE: the validator's report on each resource of FILE, printed; fails unless every line says "passed"
# (kubernetes-validate exits 0 on a resource it has no schema for, warning only) and at least one resource passed.
validate() {
  local out status=0
  out=$("$validator" --strict --kubernetes-version "$KUBERNETES_VERSION" "$1" 2>&1) || status=$?
  printf '%s\n' "$out"
  [ "$status" -eq 0 ] || return 1
  grep -q ' passed for resource ' <<<"$out" || return 1
  # Some line that is not a pass (grep -v -q: true if one exists).
  if grep -v -q ' passed for resource ' <<<"$out"; then return 1; fi
}

# Each of these is wrong in one way a real manifest could be: each must be rejected.
cat >"$tmp/unknown-field.yaml" <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: broken}
spec:
  selector: {matchLabels: {app: broken}}
  template:
    metadata: {labels: {app: broken}}
    spec:
      containers:
        - name: proxy
          image: etcd-grpc-proxy:0.1.0
          securityContext: {readOnlyRootFileSystem: true}
YAML
cat >"$tmp/wrong-type.yaml" <<'YAML'
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: broken}
spec:
  selector: {matchLabels: {app: broken}}
  template:
    metadata: {labels: {app: broken}}
    spec:
      containers:
        - name: proxy
          image: etcd-grpc-proxy:0.1.0
          livenessProbe: {tcpSocket: {port: 2379}, periodSeconds: "10s"}
YAML
cat >"$tmp/missing-required.yaml" <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: broken}
spec:
  ports:
    - name: client
YAML
# A valid resource beside one without a schema: the file must still fail.
cat >"$tmp/unknown-api-version.yaml" <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: valid}
spec:
  ports: [{name: client, port: 2379}]
---
apiVersion: policy/v2
kind: PodDisruptionBudget
metadata: {name: broken}
spec: {maxUnavailable: 1}
YAML
echo "== broken manifests (each must be rejected)"
for broken in unknown-field wrong-type missing-required unknown-api-version; do
  if validate "$tmp/$broken.yaml"; then
    echo "ci/validate-kubernetes.sh: the validator accepted $broken.yaml, which is invalid" >&2
    exit 1
  fi
done

echo "== deploy/kubernetes (Kubernetes $KUBERNETES_VERSION, strict)"
shopt -s nullglob
manifests=(deploy/kubernetes/*.yaml deploy/kubernetes/*.yml)
[ ${#manifests[@]} -gt 0 ] || { echo "no manifests in deploy/kubernetes" >&2; exit 1; }
failed=0
for manifest in "${manifests[@]}"; do
  validate "$manifest" || failed=1
done
if [ "$failed" -ne 0 ]; then
  echo "ci/validate-kubernetes.sh: invalid manifests (above)" >&2
  exit 1
fi
echo "ci/validate-kubernetes.sh: ${#manifests[@]} manifests valid"
