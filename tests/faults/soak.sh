#!/usr/bin/env bash
# The long run of tests/faults: an hour of random faults (hundreds of them) against release
# builds, three members then five, cairn and then etcd 3.5.1 beside it; each report goes to
# target/faults-soak/<label>.txt, for docs/reliability.md.
#
#   tests/faults/soak.sh [seconds per run, default 3600] [seed, default 1]
#
# Needs root, like run.sh. Takes about four times the given seconds, plus the builds. cairn's
# members get sparse 8 GiB disks: the history grows by up to 64 MiB per disk-full fault and is
# never compacted (the watchers are checked against all of it).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
seconds="${1:-3600}"
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
for members in 3 5; do
    "$faults" --binary "$root/target/release/cairn" --label "cairn-$members" --members "$members" \
        --seconds "$seconds" --seed "$seed" --subnet 1 --workdir /tmp/cairn-soak --disk-mb 8192 \
        | tee "$out/cairn-$members.txt" || status=1
    "$faults" --binary "$root/target/etcd-3.5/etcd" --label "etcd-3.5.1-$members" --members "$members" \
        --seconds "$seconds" --seed "$seed" --subnet 2 --workdir /tmp/etcd-soak \
        | tee "$out/etcd-3.5.1-$members.txt" || status=1
done
exit $status
