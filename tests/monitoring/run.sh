#!/usr/bin/env bash
# etcd's monitoring mixin on cairn and on etcd 3.7.3: renders the mixin's alert rules and
# dashboard from etcd's published Go module with Debian's jsonnet, checks them with Debian's
# promtool (and runs etcd's own unit tests of the rules), then runs the driver against a
# three-member cluster of each under Debian's Prometheus. Fails when cairn misses an alert,
# a dashboard query or an etcdctl check that etcd passes, or when etcd itself misses one
# (the harness's own check).
#
# Installs Debian's prometheus and jsonnet if they are missing; builds etcd 3.7 (tests/etcd-3.7)
# if target/etcd-3.7 has none. Needs root to freeze a member's file system (the slow-disk
# alerts); without it those are skipped. Arguments pass through to the driver, e.g.
# `--targets etcd` or `--targets cairn`. CAIRN_BIN picks the cairn binary (default: build
# target/debug/cairn).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"

mixin_version=v3.7.1 # go.etcd.io/etcd/v3, the root module that ships contrib/mixin
work="${MONITORING_WORKDIR:-/tmp/cairn-monitoring}"
export GOTOOLCHAIN=local

if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1 \
    || ! command -v jsonnet >/dev/null 2>&1; then
    sudo_cmd=""
    if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
        prometheus jsonnet >/dev/null
fi
# Debian's package enables a prometheus service on :9090; the driver runs its own.
if command -v systemctl >/dev/null 2>&1; then systemctl stop prometheus >/dev/null 2>&1 || true; fi
prometheus --version 2>&1 | sed -n 1p
jsonnet --version

if [ ! -x target/etcd-3.7/etcd ] || [ ! -x target/etcd-3.7/etcdctl ]; then
    tests/etcd-3.7/build.sh "$root/target/etcd-3.7"
fi
if [ -z "${CAIRN_BIN:-}" ]; then
    cargo build -p cairn-server --bin cairn --locked
    CAIRN_BIN="$root/target/debug/cairn"
fi

# A run that was killed may have left members' file systems mounted (and frozen) under $work:
# thaw them all, then unmount the inner ones first (/proc/mounts lists them after the outer
# ones they live on).
mounts="$(grep -o " $work/[^ ]*" /proc/mounts || true)"
for m in $mounts; do fsfreeze -u "$m" 2>/dev/null || true; done
for m in $(echo "$mounts" | tac); do umount "$m"; done
rm -rf "$work" && mkdir -p "$work/fetch" "$work/mixin/manifests"

# The mixin, from the Go module proxy into the module cache (checked against the Go checksum
# database like any module); a throwaway go.mod only names the module to fetch.
(cd "$work/fetch" && printf 'module fetch\n\ngo 1.26\n' >go.mod &&
    GOFLAGS=-mod=mod go mod download -json "go.etcd.io/etcd/v3@$mixin_version" >download.json)
moddir="$(sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' "$work/fetch/download.json")"
src="$moddir/contrib/mixin"
[ -f "$src/mixin.libsonnet" ] || { echo "no contrib/mixin in $moddir" >&2; exit 1; }
echo "etcd mixin: $src"

# Alerts need no library; the dashboard is the Grafana 7 variant, which needs no grafonnet.
(cd "$src" && jsonnet -e '(import "mixin.libsonnet").prometheusAlerts') >"$work/mixin/rules.json"
(cd "$src" && jsonnet -e '((import "mixin.libsonnet") + {_config+:: {grafana7x: true}}).grafanaDashboards') \
    >"$work/mixin/dashboards.json"
promtool check rules "$work/mixin/rules.json"
# etcd's unit tests of its rules (the mixin's `make test`), on what this jsonnet rendered.
cp "$work/mixin/rules.json" "$work/mixin/manifests/etcd-prometheusRules.yaml"
cp "$src/test.yaml" "$work/mixin/test.yaml"
(cd "$work/mixin" && promtool test rules test.yaml)

mkdir -p target/monitoring
(cd tests/monitoring && GOFLAGS=-mod=readonly go vet . && GOFLAGS=-mod=readonly go build -o "$root/target/monitoring/driver" .)
"$root/target/monitoring/driver" \
    --rules "$work/mixin/rules.json" --dashboard "$work/mixin/dashboards.json" \
    --workdir "$work" --results "$root/target/monitoring/results.md" \
    --etcd "$root/target/etcd-3.7/etcd" --etcdctl "$root/target/etcd-3.7/etcdctl" \
    --cairn "$CAIRN_BIN" "$@"
