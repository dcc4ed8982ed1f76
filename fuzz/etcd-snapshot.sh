#!/usr/bin/env bash
# Writes the snapshot the etcd_snapshot_restore target damages: a real etcd 3.7 member, 300 puts
# over 50 keys and one delete (revision 302, 49 keys), then `etcdctl snapshot save`.
#
# usage: fuzz/etcd-snapshot.sh [OUT]   (default: fuzz/target/etcd-snapshot.db)
# ETCD_DIR names the directory holding etcd and etcdctl (default: target/etcd-3.7, built by
# tests/etcd-3.7/build.sh when missing). Nothing is written when OUT already exists.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
out="${1:-$here/target/etcd-snapshot.db}"
[ -s "$out" ] && exit 0

bin="${ETCD_DIR:-$repo/target/etcd-3.7}"
if [ ! -x "$bin/etcd" ] || [ ! -x "$bin/etcdctl" ]; then
    "$repo/tests/etcd-3.7/build.sh" "$bin"
fi

work="$(mktemp -d)"
pid=""
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

# Two free ports from the kernel, and etcd on them.
read -r client peer < <(python3 -c '
import socket
s = [socket.socket() for _ in range(2)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))')
"$bin/etcd" --name seed --data-dir "$work/data" \
    --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
    --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
    --initial-cluster "seed=http://127.0.0.1:$peer" >"$work/etcd.log" 2>&1 &
pid=$!

ctl() { "$bin/etcdctl" --endpoints "127.0.0.1:$client" "$@"; }
# Health answers once the member has elected itself and serves; give up after a minute.
for _ in $(seq 1 600); do
    if ctl endpoint health >/dev/null 2>&1; then break; fi
    if ! kill -0 "$pid" 2>/dev/null; then cat "$work/etcd.log" >&2; exit 1; fi
    sleep 0.1
done
ctl endpoint health >/dev/null

for i in $(seq 0 299); do
    ctl put "key-$((i % 50))" "value-$i" >/dev/null
done
ctl del key-7 >/dev/null
mkdir -p "$(dirname "$out")"
ctl snapshot save "$work/snapshot.db" >"$work/save.log" 2>&1 || { cat "$work/save.log" >&2; exit 1; }
mv "$work/snapshot.db" "$out"
echo "wrote $out (etcd $("$bin/etcd" --version | sed -n 's/^etcd Version: //p'), revision 302, 49 keys)"
