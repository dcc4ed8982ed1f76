#!/usr/bin/env bash
# Builds the `cairn` binary of an earlier commit from this repository's own history, for the
# tests that run members of two releases side by side (tests/upgrade/README.md).
#
# usage: tests/upgrade/build.sh COMMIT    (prints the binary's path on its last line)
#
# The commit is checked out in a git worktree under target/upgrade/ and built there into a
# target directory shared by every such build (dependencies compile once). The binary is kept
# as target/upgrade/bin/<commit>/cairn: a second call finds it and builds nothing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
commit="$(git -C "$repo" rev-parse --verify --quiet "${1:?usage: build.sh COMMIT}^{commit}" || true)"
if [ -z "$commit" ]; then
    # A shallow clone: fetch the commit itself from where the clone came from.
    git -C "$repo" fetch --quiet origin "$1" >&2
    commit="$(git -C "$repo" rev-parse --verify "$1^{commit}")"
fi
out="$repo/target/upgrade/bin/$commit"
if [ -x "$out/cairn" ]; then
    echo "$out/cairn"
    exit 0
fi

work="$repo/target/upgrade/src/$commit"
if [ ! -e "$work/Cargo.toml" ]; then
    rm -rf "$work"
    git -C "$repo" worktree prune
    git -C "$repo" worktree add --quiet --detach "$work" "$commit" >&2
fi
echo "building cairn at ${commit:0:10} ($(git -C "$repo" log -1 --format=%cs "$commit"))" >&2
(cd "$work" && CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=0 CARGO_TARGET_DIR="$repo/target/upgrade/target" \
    cargo build --locked -p cairn-server --bin cairn >&2)
mkdir -p "$out"
cp "$repo/target/upgrade/target/debug/cairn" "$out/cairn.tmp"
mv "$out/cairn.tmp" "$out/cairn"
# The sources are not needed once the binary is kept.
git -C "$repo" worktree remove --force "$work" >&2
echo "$out/cairn"
