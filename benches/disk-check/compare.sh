#!/usr/bin/env bash
# `cairn check disk` beside fio running etcd's recommended disk check, on one directory, in one
# run: round after round, fio with etcd's recipe exactly as etcd's documentation gives it and
# `cairn check disk --json` (which goes first alternates every round, so a slow drift of the
# disk hits both alike). It prints each round's fdatasync p50 and p99 from both tools, the
# medians, the ratios cairn / fio, and each tool's spread between rounds (max / min of its own
# figure), which is the disk's run-to-run noise: a median ratio inside that spread is agreement.
#
#   benches/disk-check/compare.sh                       # 3 rounds in a fresh dir under /var/tmp
#   benches/disk-check/compare.sh --dir /var/lib/cairn --rounds 5
#   benches/disk-check/compare.sh --with-overwrite      # adds fio with the file written first
#
# It installs fio from Debian if missing, and builds cairn in release mode unless --cairn names
# a binary. It exits non-zero only when a tool fails to run, never because of a timing: a disk
# either tool finds too slow is a result, not an error.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: benches/disk-check/compare.sh [--dir D] [--rounds N] [--cairn PATH] [--with-overwrite]

  --dir D            directory on the disk to check (default: a fresh directory under /var/tmp,
                     removed at the end; a directory given here is kept, only the tools' files
                     are removed)
  --rounds N         rounds of fio and cairn (default 3)
  --cairn PATH       the cairn binary (default: build it with cargo in release mode, into
                     $CARGO_TARGET_DIR or the workspace's target/)
  --with-overwrite   also run fio with --overwrite=1 each round: the same recipe with its file
                     written out (not just fallocated) before the job, as `cairn check disk`
                     lays out its file; tells the tool apart from the file layout
EOF
}

repo="$(cd "$(dirname "$0")/../.." && pwd)"
dir=""
rounds=3
cairn=""
with_overwrite=0
while [ $# -gt 0 ]; do
    case "$1" in
        --dir) dir="${2:?--dir needs a value}"; shift 2 ;;
        --rounds) rounds="${2:?--rounds needs a value}"; shift 2 ;;
        --cairn) cairn="${2:?--cairn needs a value}"; shift 2 ;;
        --with-overwrite) with_overwrite=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "compare.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done
case "$rounds" in
    ''|*[!0-9]*|0) echo "compare.sh: --rounds must be a positive integer" >&2; exit 2 ;;
esac

if ! command -v fio >/dev/null 2>&1; then
    echo "==> installing fio (Debian's package)"
    sudo_cmd=""
    if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi
    $sudo_cmd apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends fio >/dev/null
fi
command -v python3 >/dev/null 2>&1 || { echo "compare.sh: python3 is needed to read the tools' JSON" >&2; exit 2; }

if [ -z "$cairn" ]; then
    echo "==> building cairn (release)"
    (cd "$repo" && cargo build --release --quiet -p cairn-server --bin cairn)
    cairn="${CARGO_TARGET_DIR:-$repo/target}/release/cairn"
fi
[ -x "$cairn" ] || { echo "compare.sh: no cairn binary at $cairn" >&2; exit 2; }

created_dir=0
if [ -z "$dir" ]; then
    dir="$(mktemp -d /var/tmp/cairn-disk-check.XXXXXX)"
    created_dir=1
else
    mkdir -p "$dir"
fi
dir="$(cd "$dir" && pwd)"
work="$(mktemp -d)" # the tools' JSON, kept off the disk under test
# fio names its file <name>.0.0 in --directory; cairn removes its own scratch directory.
cleanup() {
    rm -f "$dir/etcd-disk-check.0.0" "$dir/etcd-disk-check-overwrite.0.0"
    if [ "$created_dir" = 1 ]; then rm -rf "$dir"; fi
    rm -rf "$work"
}
trap cleanup EXIT

fail() { echo "compare.sh: $*" >&2; exit 1; }
json_has() { # file, python expression on d: whether the file is JSON holding that field
    python3 -c "import json, sys; d = json.load(open(sys.argv[1])); $2" "$1" 2>/dev/null
}

# etcd's recipe, word for word from etcd's "Hardware recommendations" / fio guidance, plus the
# JSON output this script reads.
run_fio() { # round, leg name, extra fio arguments...
    local round="$1" name="$2"; shift 2
    local out="$work/$name-$round.json"
    rm -f "$dir/$name.0.0"
    if ! fio --rw=write --ioengine=sync --fdatasync=1 --directory="$dir" --size=22m --bs=2300 \
        --name="$name" "$@" --output-format=json >"$out" 2>"$work/$name-$round.err"; then
        cat "$work/$name-$round.err" >&2
        fail "fio failed in round $round"
    fi
    json_has "$out" "d['jobs'][0]['sync']['lat_ns']['percentile']['99.000000']" ||
        fail "fio printed no fdatasync percentiles in round $round"
    rm -f "$dir/$name.0.0"
}

run_cairn() { # round
    local round="$1" rc=0
    "$cairn" check disk --dir "$dir" --json >"$work/cairn-$round.json" 2>"$work/cairn-$round.err" || rc=$?
    # 0: the disk is fit; 1: it is not (a result); anything else: the check could not run.
    if [ "$rc" != 0 ] && [ "$rc" != 1 ]; then
        cat "$work/cairn-$round.err" >&2
        fail "cairn check disk failed in round $round (exit $rc)"
    fi
    json_has "$work/cairn-$round.json" "d['fdatasync']['p99_us']" ||
        fail "cairn check disk printed no report in round $round (exit $rc)"
}

echo "==> $rounds rounds on $dir ($(df -T "$dir" | awk 'NR==2 {print $2 " on " $1}')), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "    fio: $(fio --version); cairn: $cairn; kernel $(uname -r); $(nproc) cores"
run_leg() { # round, leg
    case "$2" in
        fio) run_fio "$1" etcd-disk-check ;;
        cairn) run_cairn "$1" ;;
        fio-overwrite) run_fio "$1" etcd-disk-check-overwrite --overwrite=1 ;;
    esac
}
legs=(fio cairn)
if [ "$with_overwrite" = 1 ]; then legs+=(fio-overwrite); fi
for round in $(seq 1 "$rounds"); do
    # The order rotates every round (fio first, then cairn first, ...), so a slow drift of the
    # disk does not always favour the same tool.
    order=()
    for i in "${!legs[@]}"; do order+=("${legs[$(( (i + round - 1) % ${#legs[@]} ))]}"); done
    for leg in "${order[@]}"; do run_leg "$round" "$leg"; done
    echo "    round $round done (${order[*]})"
done

python3 - "$work" "$rounds" "$with_overwrite" <<'EOF'
import json, statistics, sys

work, rounds, with_overwrite = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"

def fio(name, r):
    with open(f"{work}/{name}-{r}.json") as f:
        job = json.load(f)["jobs"][0]
    if job.get("error"):
        sys.exit(f"compare.sh: fio reported error {job['error']} in round {r}")
    # fio times each fdatasync alone under "sync" (the write itself is under "write").
    lat = job["sync"]["lat_ns"]
    pct = lat["percentile"]
    return {"n": lat["N"], "p50": pct["50.000000"] / 1e6, "p99": pct["99.000000"] / 1e6}

def cairn(r):
    with open(f"{work}/cairn-{r}.json") as f:
        d = json.load(f)["fdatasync"]
    return {"n": d["count"], "p50": d["p50_us"] / 1e3, "p99": d["p99_us"] / 1e3}

rows = []
for r in range(1, rounds + 1):
    row = {"round": r, "fio": fio("etcd-disk-check", r), "cairn": cairn(r)}
    if with_overwrite:
        row["fio_ow"] = fio("etcd-disk-check-overwrite", r)
    rows.append(row)

legs = [("fio", "fio (etcd's recipe)"), ("cairn", "cairn check disk")]
if with_overwrite:
    legs.insert(1, ("fio_ow", "fio --overwrite=1"))

def verdict(p99):
    return "PASS" if p99 < 10.0 else "FAIL"  # etcd's guidance: fdatasync p99 under 10 ms

head = "round | " + " | ".join(f"{label} p50 / p99 (ms)" for _, label in legs) + \
       " | cairn/fio p50 | cairn/fio p99 | verdicts fio, cairn"
print()
print(head)
for row in rows:
    f, c = row["fio"], row["cairn"]
    cells = [f"{row[k]['p50']:.3f} / {row[k]['p99']:.3f}" for k, _ in legs]
    print(f"{row['round']} | " + " | ".join(cells) +
          f" | {c['p50'] / f['p50']:.2f}x | {c['p99'] / f['p99']:.2f}x"
          f" | {verdict(f['p99'])}, {verdict(c['p99'])}")

med = lambda xs: statistics.median(xs)
cells = [f"{med([r[k]['p50'] for r in rows]):.3f} / {med([r[k]['p99'] for r in rows]):.3f}" for k, _ in legs]
ratio50 = [r["cairn"]["p50"] / r["fio"]["p50"] for r in rows]
ratio99 = [r["cairn"]["p99"] / r["fio"]["p99"] for r in rows]
print(f"median | " + " | ".join(cells) + f" | {med(ratio50):.2f}x | {med(ratio99):.2f}x |")
print()
print("fdatasyncs timed per run: " + ", ".join(f"{label} {rows[0][k]['n']}" for k, label in legs))
for q, ratios in (("p50", ratio50), ("p99", ratio99)):
    spreads = {}
    for k, label in legs:
        xs = [r[k][q] for r in rows]
        spreads[k] = max(xs) / min(xs)
        print(f"{label}: {q} between rounds {min(xs):.3f} to {max(xs):.3f} ms, spread (max/min) {spreads[k]:.2f}x")
    print(f"cairn {q} / fio {q} between rounds: {min(ratios):.2f}x to {max(ratios):.2f}x")
    # The disk's run-to-run noise: how far one tool's own figure moves between rounds.
    noise = max(spreads["fio"], spreads["cairn"])
    m = med(ratios)
    inside = 1 / noise <= m <= noise
    # A difference smaller than that noise can still be systematic: count the rounds it points
    # the same way (in one round both tools saw the same disk, give or take minutes).
    below = sum(x < 1 for x in ratios)
    print(f"reading ({q}): the median ratio {m:.2f}x is {'inside' if inside else 'outside'} the disk's "
          f"run-to-run noise (1/{noise:.2f} to {noise:.2f}x, the larger spread of the two tools); "
          f"cairn read lower than fio in {below} of {len(ratios)} rounds")
    if with_overwrite:
        ow = [r["cairn"][q] / r["fio_ow"][q] for r in rows]
        print(f"           cairn {q} / fio --overwrite=1 {q}: median {med(ow):.2f}x, "
              f"{min(ow):.2f}x to {max(ow):.2f}x between rounds")
EOF
