#!/usr/bin/env bash
# Runs every check of cairn, as CI does (.ci/run calls exactly this):
# formatting, clippy, the whole workspace's tests, and a short run of every fuzz target.
# It installs what it needs (cargo-fuzz) and nothing else; run it from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "toolchain"
cargo --version
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy

step "cargo fmt --check"
cargo fmt --all --check
(cd fuzz && cargo fmt --check)

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo test"
cargo test --workspace --locked

step "fuzz smoke run (${FUZZ_SECONDS:=30}s per target)"
FUZZ_SECONDS="$FUZZ_SECONDS" fuzz/smoke.sh

step "all checks passed"
