#!/usr/bin/env bash
# Build the reference etcd 3.7 binaries (etcd, etcdctl, etcdutl) from the Go
# modules pinned in go.mod/go.sum of this directory.
#
# usage: tests/etcd-3.7/build.sh [OUT_DIR]   (default: <repo>/target/etcd-3.7)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="${1:-$repo/target/etcd-3.7}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"

export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
export CGO_ENABLED="${CGO_ENABLED:-0}"

cd "$here"
go build -mod=readonly -o "$out/etcd" go.etcd.io/etcd/server/v3
go build -mod=readonly -o "$out/etcdctl" go.etcd.io/etcd/etcdctl/v3
go build -mod=readonly -o "$out/etcdutl" go.etcd.io/etcd/etcdutl/v3

"$out/etcd" --version | sed -n 1p
echo "built etcd, etcdctl, etcdutl into $out"
