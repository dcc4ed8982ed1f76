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

failed=()
for target in $(cargo fuzz list); do
    # Both targets decode their input with `arbitrary`, which accepts any bytes: seed an empty
    # corpus with random inputs of up to 4 KiB, so a short run starts from long operation
    # sequences (many segments) instead of growing them from nothing.
    corpus="corpus/${target}"
    mkdir -p "${corpus}"
    if [ -z "$(ls -A "${corpus}")" ]; then
        for i in $(seq 1 32); do
            head -c $((i * 128)) /dev/urandom >"${corpus}/random-seed-${i}"
        done
    fi
    echo "== fuzzing ${target} for ${seconds}s"
    if ! cargo fuzz run "${target}" -s none -- -max_total_time="${seconds}" -timeout=30 -rss_limit_mb=2048; then
        failed+=("${target}")
    fi
done

if ((${#failed[@]})); then
    echo "fuzz targets failed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
echo "all fuzz targets ran ${seconds}s without a failure"
