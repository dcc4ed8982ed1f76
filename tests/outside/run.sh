#!/usr/bin/env bash
# Builds and runs tests/outside against the crates `cargo publish --dry-run --workspace`
# packaged into target/package/<crate>-<version>/. The version is the workspace's, read
# here, so the paths follow every bump without an edit (tests/run-all.sh runs this).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n1)"
[ -n "$version" ] || { echo "tests/outside: no version in $root/Cargo.toml" >&2; exit 1; }
wanted="$(sed -n 's/^cairn-engine = "\(.*\)"$/\1/p' "$root/tests/outside/Cargo.toml")"
if [ "$wanted" != "$version" ]; then
    echo "tests/outside/Cargo.toml asks for cairn-engine $wanted; the workspace is $version" >&2
    exit 1
fi
for crate in cairn-wal cairn-engine; do
    [ -f "$root/target/package/$crate-$version/Cargo.toml" ] || {
        echo "tests/outside: $root/target/package/$crate-$version is missing; run cargo publish --dry-run first" >&2
        exit 1
    }
done
CARGO_TARGET_DIR="$root/target" exec cargo run --manifest-path "$root/tests/outside/Cargo.toml" \
    --config "patch.crates-io.cairn-engine.path=\"$root/target/package/cairn-engine-$version\"" \
    --config "patch.crates-io.cairn-wal.path=\"$root/target/package/cairn-wal-$version\""
