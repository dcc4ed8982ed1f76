#!/usr/bin/env bash
# A flame graph of a release cairn's CPU under one cairn-bench workload: where a request's
# server CPU goes. The graphs in docs/img/flame-*.svg come from it.
#
#   benches/compare/flame.sh OUT.svg -- <cairn-bench arguments>
#   benches/compare/flame.sh docs/img/flame-put.svg -- --conns 10 --clients 100 put --key-space-size 100000
#
# Needs perf (Debian's linux-perf) and inferno (`cargo install inferno`); builds the release
# binaries if they are missing. The server runs on 127.0.0.1:2379 with its data in a
# temporary directory; the workload runs 10 s and perf samples 5 s of its middle.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$1"
shift
[ "${1:-}" = "--" ] && shift
for tool in perf inferno-collapse-perf inferno-flamegraph; do
    command -v "$tool" >/dev/null || { echo "flame.sh: $tool is missing" >&2; exit 1; }
done
[ -x "$root/target/release/cairn" ] && [ -x "$root/target/release/cairn-bench" ] ||
    cargo build --release --manifest-path "$root/Cargo.toml" -p cairn-server --bin cairn -p cairn-benches --bin cairn-bench
work="$(mktemp -d)"
trap 'kill "$server" 2>/dev/null || true; rm -rf "$work"' EXIT
"$root/target/release/cairn" --data-dir "$work/data" --log-level error >"$work/log" 2>&1 &
server=$!
# Ready once it answers a read.
for _ in $(seq 100); do
    "$root/target/release/cairn-bench" --total 1 range --load 1 >/dev/null 2>&1 && break
    sleep 0.1
done
"$root/target/release/cairn-bench" --seconds 10 "$@" >"$work/bench" 2>&1 &
bench=$!
sleep 3
perf record -F 499 --call-graph dwarf,32768 -p "$server" -o "$work/perf.data" -- sleep 5 >/dev/null 2>&1
wait "$bench"
perf script --no-inline -i "$work/perf.data" 2>/dev/null | inferno-collapse-perf | inferno-flamegraph --minwidth 0.5 \
    --title "cairn: $*" --width 1600 >"$out"
tail -n 4 "$work/bench"
echo "flame.sh: $out"
