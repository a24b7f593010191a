#!/usr/bin/env bash
# Installs OpenStack's etcd3gw (PyPI: a Python client of etcd's HTTP/JSON gateway), pinned with its dependencies in
# ci/etcd3gw-requirements.txt, into a virtualenv at $ETCD3GW_VENV (default /usr/local/lib/etcd3gw-venv). Idempotent:
# a second run with the same pins does nothing; changed pins reinstall. pip reads the package index from the system's
# configuration. Prints the virtualenv's python on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."

requirements=ci/etcd3gw-requirements.txt
dir=${ETCD3GW_VENV:-/usr/local/lib/etcd3gw-venv}
python="$dir/bin/python"

# The two etcd3gw tests run at once and each runs this script: one installs while the other waits, instead of both
# making the virtualenv (which failed a CI replica with "File exists").
mkdir -p "$(dirname "$dir")"
exec 9>"$dir.lock"
flock 9

# The copy of the requirements kept in the virtualenv says what it holds: a changed pin reinstalls.
if ! cmp -s "$requirements" "$dir/requirements.txt" 2>/dev/null || [ ! -x "$python" ]; then
  echo "installing etcd3gw (PyPI) into $dir" >&2
  rm -rf "$dir"
  python3 -m venv "$dir"
  "$dir/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$requirements"
  "$dir/bin/pip" check --disable-pip-version-check >/dev/null
  "$python" -c 'import etcd3gw' 
  cp "$requirements" "$dir/requirements.txt"
fi
echo "$python"
