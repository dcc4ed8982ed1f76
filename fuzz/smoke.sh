#!/usr/bin/env bash
# Runs every fuzz target for FUZZ_SECONDS (default 30) on stable Rust, sanitizers off.
# Fails if any target fails (a crash, a timeout, or running out of memory).
set -euo pipefail

cd "$(dirname "$0")"
seconds="${FUZZ_SECONDS:-30}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

# The snapshot etcd_snapshot_restore damages comes from a real etcd 3.7 (built when missing).
./etcd-snapshot.sh

# One build of every target, then the runs, as many at a time as there are cores (each run is
# one process on one core): on two cores the six targets take three slots of FUZZ_SECONDS.
cargo fuzz build -s none
targets=($(cargo fuzz list))
parallel="${FUZZ_JOBS:-$(nproc)}"
mkdir -p target/smoke
failed=()
# run TARGET: fuzzes TARGET for the smoke's seconds, its output in target/smoke/TARGET.log.
run() {
    local target="$1"
    # Every target decodes its input with `arbitrary` or raw bytes, and accepts any: seed an
    # empty corpus with random inputs of up to 4 KiB, so a short run starts from long
    # operation sequences (many segments) instead of growing them from nothing.
    local corpus="corpus/${target}"
    mkdir -p "${corpus}"
    if [ -z "$(ls -A "${corpus}")" ]; then
        for i in $(seq 1 32); do
            head -c $((i * 128)) /dev/urandom >"${corpus}/random-seed-${i}"
        done
    fi
    cargo fuzz run "${target}" -s none -- -max_total_time="${seconds}" -timeout=30 -rss_limit_mb=2048 \
        >"target/smoke/${target}.log" 2>&1
}
for ((i = 0; i < ${#targets[@]}; i += parallel)); do
    batch=("${targets[@]:i:parallel}")
    pids=()
    for target in "${batch[@]}"; do
        echo "== fuzzing ${target} for ${seconds}s (log: fuzz/target/smoke/${target}.log)"
        run "${target}" &
        pids+=($!)
    done
    for j in "${!batch[@]}"; do
        target="${batch[j]}"
        if wait "${pids[j]}"; then
            # libFuzzer's last word: how many runs, how fast, how much memory.
            grep -E "^Done [0-9]+ runs" "target/smoke/${target}.log" | sed "s/^/${target}: /" || true
        else
            tail -n 60 "target/smoke/${target}.log"
            failed+=("${target}")
        fi
    done
done

if ((${#failed[@]})); then
    echo "fuzz targets failed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "all fuzz targets ran ${seconds}s without a failure"
