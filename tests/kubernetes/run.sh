#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager and kube-scheduler for each
# Kubernetes release under test (and kubeadm for the releases in
# KUBEADM_VERSIONS), builds cairn if needed, and runs the
# kube-apiserver-on-cairn scenario (./scenario) once per release: TestScenario
# (plaintext cairn), TestMoveFromEtcd, for the releases in MTLS_VERSIONS
# TestScenarioMTLS (kubeadm's etcd certificates and flags), and for the
# releases in KUBEADM_VERSIONS TestKubeadmManifest (cairn run from kubeadm's
# own etcd static-pod manifest), and for the releases in UPGRADE_VERSIONS
# TestRollingUpgrade (the previous cairn release upgraded to this build under
# kube-apiserver).
#
#   tests/kubernetes/run.sh               # 1.37 and 1.34
#   VERSIONS=1.37 tests/kubernetes/run.sh # one release
#   BUILD_ONLY=1 VERSIONS=1.37 tests/kubernetes/run.sh
#                                         # only the binaries, and the apiserver-level
#                                         # load tool (./apiload) into target/kubernetes/
#
# Environment: VERSIONS (default "1.37 1.34"), MTLS_VERSIONS (releases that also
# run TestScenarioMTLS, default "1.37"; the others pass -skip to go test),
# KUBEADM_VERSIONS (releases whose kubeadm is built and that run
# TestKubeadmManifest, default "1.37"; only 1.37's module has kubeadm),
# UPGRADE_VERSIONS (releases that run TestRollingUpgrade, default "1.37"),
# CAIRN_PREVIOUS_BIN (default: tests/upgrade/build.sh's binary of
# tests/upgrade/PREVIOUS, built if missing), BUILD_ONLY, CAIRN_BIN (default
# <repo>/target/debug/cairn, built with cargo if missing), ETCD_BIN (default
# <repo>/target/etcd-3.7/etcd, the etcd that TestMoveFromEtcd moves
# kube-apiserver from), NICE (default "nice -n 19"; empty: not niced),
# GO_TEST_FLAGS (extra flags for go test, e.g. -run).
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
versions="${VERSIONS:-1.37 1.34}"
mtls_versions="${MTLS_VERSIONS-1.37}"
kubeadm_versions="${KUBEADM_VERSIONS-1.37}"
upgrade_versions="${UPGRADE_VERSIONS-1.37}"
nice_cmd="${NICE-nice -n 19}"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

# Module directory holding the release's k8s.io/kubernetes requirement.
module_dir() {
  case "$1" in
    1.37) echo "$here" ;;
    1.34) echo "$here/k8s-1.34" ;;
    *) echo "unknown Kubernetes version $1 (known: 1.37 1.34)" >&2; return 1 ;;
  esac
}

# in_list WORD LIST: whether WORD is one of LIST's space-separated words.
in_list() {
  local w
  for w in $2; do
    if [ "$w" = "$1" ]; then return 0; fi
  done
  return 1
}

build_kube() {
  local v="$1" mod out
  mod="$(module_dir "$v")" || return 1
  out="$root/target/kubernetes/$v"
  mkdir -p "$out"
  local bins=(kube-apiserver kube-controller-manager kube-scheduler) stale=()
  if in_list "$v" "$kubeadm_versions"; then bins+=(kubeadm); fi
  for b in "${bins[@]}"; do
    if [ ! -x "$out/$b" ] || [ "$mod/go.mod" -nt "$out/$b" ] || [ "$mod/go.sum" -nt "$out/$b" ]; then
      stale+=("k8s.io/kubernetes/cmd/$b")
    fi
  done
  if [ "${#stale[@]}" = 0 ]; then
    echo "== Kubernetes $v binaries (${bins[*]}) in $out are newer than $mod/go.mod: not rebuilding"
    return 0
  fi
  echo "== building ${stale[*]##*/} ($v) into $out (first build ~10 min on 2 cores; kubeadm adds ~1 min)"
  local start=$SECONDS
  (cd "$mod" && GOFLAGS=-mod=readonly $nice_cmd go build -o "$out/" "${stale[@]}") || return 1
  echo "== built Kubernetes $v in $((SECONDS - start))s"
}

if [ -n "${BUILD_ONLY:-}" ]; then
  for v in $versions; do
    build_kube "$v" || exit 1
  done
  (cd "$here" && GOFLAGS=-mod=readonly $nice_cmd go build -o "$root/target/kubernetes/apiload" ./apiload) || exit 1
  exit 0
fi

cairn_bin="${CAIRN_BIN:-$root/target/debug/cairn}"
if [ ! -x "$cairn_bin" ]; then
  echo "== building cairn"
  (cd "$root" && $nice_cmd cargo build -p cairn-server --bin cairn) || { echo "cairn build failed"; exit 1; }
fi

# etcd for TestMoveFromEtcd (kube-apiserver moved from etcd to cairn); tests/run-all.sh builds it.
etcd_bin="${ETCD_BIN:-$root/target/etcd-3.7/etcd}"

# The previous release, which TestRollingUpgrade upgrades from.
previous_bin="${CAIRN_PREVIOUS_BIN:-}"
if [ -z "$previous_bin" ] && [ -n "$upgrade_versions" ]; then
  previous_bin="$("$root/tests/upgrade/build.sh" "$(cat "$root/tests/upgrade/PREVIOUS")" | tail -n 1)" ||
    { echo "building the previous release failed"; exit 1; }
fi

declare -A result
overall=0
for v in $versions; do
  if ! build_kube "$v"; then
    result[$v]="BUILD FAILED"
    overall=1
    continue
  fi
  log="$root/target/kubernetes/scenario-$v.log"
  skip_flags=()
  skipped_tests=()
  mtls=no kubeadm=no
  if in_list "$v" "$mtls_versions"; then mtls=yes; else skipped_tests+=(TestScenarioMTLS); fi
  if in_list "$v" "$kubeadm_versions"; then kubeadm=yes; else skipped_tests+=(TestKubeadmManifest); fi
  if in_list "$v" "$upgrade_versions"; then upgrade=yes; else upgrade=no; skipped_tests+=(TestRollingUpgrade); fi
  if [ "${#skipped_tests[@]}" != 0 ]; then
    skip_flags=(-skip "^($(IFS='|'; echo "${skipped_tests[*]}"))\$")
  fi
  echo "== running the scenario against Kubernetes $v (mTLS mode: $mtls; kubeadm's manifest: $kubeadm; rolling upgrade: $upgrade; log: $log)"
  start=$SECONDS
  (cd "$here" && CAIRN_BIN="$cairn_bin" CAIRN_PREVIOUS_BIN="$previous_bin" ETCD_BIN="$etcd_bin" KUBE_BIN_DIR="$root/target/kubernetes/$v" KUBE_VERSION="$v" \
    GOFLAGS=-mod=readonly $nice_cmd go test -count=1 -timeout 20m -v ${skip_flags[@]+"${skip_flags[@]}"} ${GO_TEST_FLAGS:-} ./scenario/) 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [ "$rc" = 0 ]; then status=PASS; else status=FAIL; overall=1; fi
  result[$v]="$status in $((SECONDS - start))s"
  for test in TestScenario TestScenarioMTLS TestKubeadmManifest; do
    grep -qE "^=== RUN +$test\$" "$log" || continue
    passed=$(grep -cE "^    --- PASS: $test/" "$log")
    failed=$(grep -E "^    --- FAIL: $test/" "$log" | sed -E "s/^    --- FAIL: $test\/([^ ]+).*/\1/" | tr '\n' ' ')
    skipped=$(grep -E "^    --- SKIP: $test/" "$log" | sed -E "s/^    --- SKIP: $test\/([^ ]+).*/\1/" | tr '\n' ' ')
    result[$v]+="; $test: $passed steps passed, failed: ${failed:-none}, skipped: ${skipped:-none}"
  done
  for test in TestMoveFromEtcd TestRollingUpgrade; do
    outcome=$(grep -oE "^--- (PASS|FAIL|SKIP): $test\b" "$log" | sed -E 's/^--- ([A-Z]+):.*/\1/')
    result[$v]+="; $test: ${outcome:-not run}"
  done
done

echo
echo "== summary"
for v in $versions; do
  echo "Kubernetes $v on cairn: ${result[$v]}"
done
exit $overall
