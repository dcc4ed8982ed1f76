#!/usr/bin/env bash
# The long run of tests/faults: an hour of random faults (hundreds of them) against release
# builds, three members then five, cairn, etcd 3.5.1 and etcd 3.7.3 side by side (at the same
# time, on the same cores, with the same seed); each report goes to
# target/faults-soak/<label>.txt, for docs/reliability.md.
#
#   tests/faults/soak.sh [seconds per member count, default 1800] [seed, default 1]
#   MEMBERS=3 tests/faults/soak.sh 900     # three members only
#   MIXED=1 tests/faults/soak.sh 1800      # instead: three cairn members alternating between
#                                          # the previous release and this one (an upgrade and
#                                          # a downgrade every 90 s), under the same faults
#
# Clients move to new keys every 10 s (--epoch-seconds), so that each key's history stays short
# enough for the linearizability search: with 30 s it gave up (Unknown) on a key of an
# 1800 s run. Needs root, like run.sh. Takes about twice the given seconds, plus the builds. cairn's
# members get sparse 8 GiB disks: each disk-full fault writes up to 64 MiB of history, which the
# harness's chores (a compaction and a defragmentation every 10 s) reclaim. etcd's run has no
# disk faults, as in run.sh.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
seconds="${1:-1800}"
seed="${2:-1}"
if [ "$(id -u)" != 0 ]; then
    echo "tests/faults needs root (network namespaces and iptables)" >&2
    exit 1
fi
cargo build --release -p cairn-server --bin cairn -p cairn-faults --bin faults --locked
faults="$root/target/release/faults"
out="$root/target/faults-soak"
mkdir -p "$out"
status=0
if [ -n "${MIXED:-}" ]; then
    # The previous release as tests/upgrade/build.sh builds it (unoptimised).
    previous="$(tests/upgrade/build.sh "$(cat tests/upgrade/PREVIOUS)" | tail -n 1)"
    "$faults" --binary "$root/target/release/cairn" --upgrade-from "$previous" --downgrade \
        --cycles $((seconds / 90)) --label "cairn-mixed-3" --members 3 --seconds "$seconds" --seed "$seed" \
        --epoch-seconds 10 --subnet 1 --workdir /tmp/cairn-soak --disk-mb 8192 > "$out/cairn-mixed-3.txt" 2>&1 \
        || status=$?
    tail -n 40 "$out/cairn-mixed-3.txt"
    exit $status
fi
for members in ${MEMBERS:-3 5}; do
    "$faults" --binary "$root/target/release/cairn" --label "cairn-$members" --members "$members" \
        --seconds "$seconds" --seed "$seed" --epoch-seconds 10 --subnet 1 --workdir /tmp/cairn-soak --disk-mb 8192 \
        > "$out/cairn-$members.txt" 2>&1 &
    cairn=$!
    "$faults" --binary "$root/target/etcd-3.5/etcd" --label "etcd-3.5.1-$members" --members "$members" \
        --seconds "$seconds" --seed "$seed" --epoch-seconds 10 --subnet 2 --workdir /tmp/etcd-soak \
        > "$out/etcd-3.5.1-$members.txt" 2>&1 &
    etcd=$!
    "$faults" --binary "$root/target/etcd-3.7/etcd" --label "etcd-3.7.3-$members" --members "$members" \
        --seconds "$seconds" --seed "$seed" --epoch-seconds 10 --subnet 3 --workdir /tmp/etcd37-soak \
        > "$out/etcd-3.7.3-$members.txt" 2>&1 &
    etcd37=$!
    wait "$cairn" || status=1
    wait "$etcd" || status=1
    wait "$etcd37" || status=1
    tail -n 40 "$out/cairn-$members.txt" "$out/etcd-3.5.1-$members.txt" "$out/etcd-3.7.3-$members.txt"
done
exit $status
