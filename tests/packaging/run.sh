#!/usr/bin/env bash
# Packaging, checked on this machine (README.md):
#   1. a static cairn (x86_64-unknown-linux-musl), built here unless $CAIRN_BIN names one;
#   2. the image from contrib/container/Containerfile, built with buildah, its configuration
#      and files checked (user, volume, ports, command, no ETCD_* variable, the etcd symlink);
#   3. the image run with podman: etcdctl put/get through a published port, the process's
#      user, `etcd --version` inside, a clean stop, the data kept in the volume for a second
#      container started with kubeadm's shape of command (`etcd --data-dir=... --listen-...`);
#   4. contrib/systemd: `systemd-analyze verify` on the unit (ExecStart pointed at the binary),
#      `systemd-sysusers --root` on the sysusers file;
#   5. the unit run by a real systemd, PID 1 of a podman container (a Debian 12 image made here
#      with debootstrap, kept in podman's storage as localhost/cairn-test-systemd:bookworm),
#      installed with docs/operations.md's commands: enabled and started, READY=1 awaited,
#      etcdctl put/get, its user, the journal, a SIGKILL restarted by Restart=always with the
#      data kept, a clean stop.
# What this machine cannot do is skipped with the error that stopped it, and listed at the
# end; a real failure exits 1. Installs what it needs from Debian when missing (buildah,
# podman, runc, musl-tools, debootstrap) and the Rust target x86_64-unknown-linux-musl.
# Environment: CAIRN_BIN (a binary to package instead of building one; a dynamically linked
# one needs CAIRN_BASE), CAIRN_BASE (the image's base, default scratch), CAIRN_PROFILE (cargo
# profile of the build, default release; dist is what a release ships).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

step() { printf '\n==> %s\n' "$*"; }
ok() { printf 'ok: %s\n' "$*"; }
skipped=()
skip() {
    skipped+=("$1")
    printf 'SKIPPED: %s\n' "$1"
}
fail() {
    printf 'FAILED: %s\n' "$*" >&2
    exit 1
}
# The first line of a command's output, read to the end (no SIGPIPE under pipefail).
first_line() { sed -n 1p; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

sudo_cmd=""
if [ "$(id -u)" != 0 ]; then sudo_cmd="sudo"; fi
debian_packages() {
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing from Debian: ${missing[*]}"
        $sudo_cmd apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

work="$(mktemp -d /tmp/cairn-packaging.XXXXXX)"
tag="localhost/cairn-packaging-test:$$"
names=(); volumes=()
cleanup() {
    for n in "${names[@]}"; do podman rm -f -t 0 "$n" >/dev/null 2>&1 || true; done
    for v in "${volumes[@]}"; do podman volume rm -f "$v" >/dev/null 2>&1 || true; done
    podman rmi -f "$tag" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

if command -v etcdctl >/dev/null 2>&1; then etcdctl=etcdctl
elif [ -x "$root/target/etcd-3.7/etcdctl" ]; then etcdctl="$root/target/etcd-3.7/etcdctl"
else fail "no etcdctl: install Debian's etcd-client, or run tests/etcd-3.7/build.sh"; fi
export ETCDCTL_API=3

step "tools: buildah, podman, runc (Debian)"
debian_packages buildah podman runc
buildah --version
podman --version

step "the binary"
if [ -n "${CAIRN_BIN:-}" ]; then
    bin="$(cd "$(dirname "$CAIRN_BIN")" && pwd)/$(basename "$CAIRN_BIN")"
else
    profile="${CAIRN_PROFILE:-release}"
    debian_packages musl-tools
    if command -v rustup >/dev/null 2>&1 && ! rustup target list --installed | grep -qx x86_64-unknown-linux-musl; then
        rustup target add x86_64-unknown-linux-musl
    fi
    cargo build --locked --profile "$profile" --target x86_64-unknown-linux-musl -p cairn-server --bin cairn
    dir="$profile"
    if [ "$profile" = dev ]; then dir=debug; fi
    bin="${CARGO_TARGET_DIR:-$root/target}/x86_64-unknown-linux-musl/$dir/cairn"
fi
[ -x "$bin" ] || fail "$bin is not an executable file"
file -L "$bin"
echo "size: $(stat -L -c %s "$bin") bytes"
static=false
if file -L "$bin" | grep -Eq 'statically linked|static-pie linked'; then static=true; fi
base="${CAIRN_BASE:-scratch}"
if [ "$static" = false ] && [ "$base" = scratch ]; then
    fail "$bin is dynamically linked: give CAIRN_BASE (docker.io/library/debian:bookworm-slim, say), or a static binary"
fi

step "building the image (contrib/container/Containerfile, BASE=$base)"
ctx="$work/context"
mkdir -p "$ctx"
cp -a contrib/container/Containerfile contrib/container/bin "$ctx/"
rm -f "$ctx/bin/cairn"
install -m 0755 "$bin" "$ctx/bin/cairn"
buildah bud --quiet --format oci --build-arg "BASE=$base" -t "$tag" "$ctx" >/dev/null
echo "image size: $(podman image inspect -f '{{.Size}}' "$tag") bytes"

step "the image's configuration (buildah inspect)"
buildah inspect --type image "$tag" >"$work/inspect.json"
python3 - "$work/inspect.json" <<'EOF' || fail "the image's configuration"
import json, sys
c = json.load(open(sys.argv[1]))["OCIv1"]["config"]
print(json.dumps(c))
problems = []
def expect(what, got, want):
    if got != want:
        problems.append(f"{what}: {got!r}, not {want!r}")
expect("User", c.get("User"), "65532:65532")
expect("Volumes", sorted(c.get("Volumes") or {}), ["/var/lib/cairn"])
expect("ExposedPorts", sorted(c.get("ExposedPorts") or {}), ["2379/tcp", "2380/tcp"])
expect("WorkingDir", c.get("WorkingDir"), "/var/lib/cairn")
expect("Entrypoint", c.get("Entrypoint"), None)
expect("Cmd", c.get("Cmd"), ["cairn", "--data-dir=/var/lib/cairn",
    "--listen-client-urls=http://0.0.0.0:2379", "--listen-peer-urls=http://0.0.0.0:2380"])
etcd_vars = [e for e in c.get("Env", []) if e.startswith("ETCD_")]
expect("ETCD_* variables (each would refuse the same flag on a command line)", etcd_vars, [])
if not any(e.startswith("PATH=") and "/usr/local/bin" in e for e in c.get("Env", [])):
    problems.append("PATH lacks /usr/local/bin")
for p in problems:
    print("wrong:", p)
sys.exit(1 if problems else 0)
EOF
ok "user 65532:65532, volume /var/lib/cairn, ports 2379 and 2380, the default command, no ETCD_* variable"

step "the image's files"
wc="$(buildah from --pull-never "$tag")"
mnt="$(buildah mount "$wc")"
files_ok=true
[ "$(readlink "$mnt/usr/local/bin/etcd")" = cairn ] || { echo "wrong: /usr/local/bin/etcd is not a symlink to cairn"; files_ok=false; }
[ -x "$mnt/usr/local/bin/cairn" ] || { echo "wrong: /usr/local/bin/cairn is not executable"; files_ok=false; }
[ "$(stat -c %u:%g "$mnt/var/lib/cairn")" = 65532:65532 ] || { echo "wrong: /var/lib/cairn is $(stat -c %u:%g "$mnt/var/lib/cairn")'s"; files_ok=false; }
[ -z "$(ls -A "$mnt/var/lib/cairn")" ] || { echo "wrong: /var/lib/cairn is not empty"; files_ok=false; }
[ "$(stat -c %u "$mnt/var/lib")" = 0 ] || { echo "wrong: /var/lib is not root's"; files_ok=false; }
if [ "$static" = true ]; then
    # A static binary runs on the host too: the image's symlink answers as etcd.
    version="$("$mnt/usr/local/bin/etcd" --version | first_line)"
    [ "$version" = "etcd Version: 3.6.0" ] || { echo "wrong: the image's etcd --version says $version"; files_ok=false; }
fi
buildah umount "$wc" >/dev/null
buildah rm "$wc" >/dev/null
$files_ok || fail "the image's files"
ok "/usr/local/bin/etcd -> cairn, /var/lib/cairn the user's and empty"

step "running the image (podman)"
# This machine's limits: podman's default RLIMIT_NOFILE and RLIMIT_NPROC are above what the
# runtime may set without CAP_SYS_RESOURCE, and crun refuses cgroups v1 and v2 mounted
# together; each attempt's error is printed.
hard_nofile="$(ulimit -Hn)"
if [ "$hard_nofile" = unlimited ] || [ "$hard_nofile" -gt 65536 ]; then hard_nofile=65536; fi
limits=(--ulimit "nofile=$hard_nofile:$hard_nofile" --ulimit nproc=4096:4096)
attempts=("podman's defaults" "limits within the host's" "limits within the host's, runc")
run_opts=()
for attempt in "${attempts[@]}"; do
    case "$attempt" in
        "podman's defaults") opts=() ;;
        "limits within the host's") opts=("${limits[@]}") ;;
        *) opts=(--runtime runc "${limits[@]}") ;;
    esac
    if out="$(podman run --rm "${opts[@]}" "$tag" etcd --version 2>&1)"; then
        run_opts=("${opts[@]}")
        runs=true
        echo "runs with $attempt (${opts[*]:-no options})"
        break
    fi
    echo "cannot run with $attempt (${opts[*]:-no options}): $(printf '%s' "$out" | tail -1)"
    runs=false
done

if [ "$runs" = false ]; then
    skip "running the image: no way found to run a container here (errors above)"
else
    [ "$(printf '%s\n' "$out" | first_line)" = "etcd Version: 3.6.0" ] || fail "etcd --version in the image: $out"
    ok "etcd --version in the image: $(printf '%s\n' "$out" | first_line)"

    port="$(free_port)"
    volume="cairn-packaging-$$"
    podman volume create "$volume" >/dev/null
    volumes+=("$volume")
    one="cairn-packaging-$$-1"
    names+=("$one")
    podman run -d --name "$one" "${run_opts[@]}" -p "127.0.0.1:$port:2379" -v "$volume:/var/lib/cairn" \
        -e "ETCD_NAME=packaging" -e "ETCD_ADVERTISE_CLIENT_URLS=http://127.0.0.1:$port" "$tag" >/dev/null
    healthy() {
        for _ in $(seq 1 60); do
            if "$etcdctl" --endpoints="127.0.0.1:$port" --command-timeout=2s endpoint health >/dev/null 2>&1; then return 0; fi
            sleep 0.5
        done
        podman logs "$1" 2>&1 | tail -20
        return 1
    }
    healthy "$one" || fail "the container did not serve on 127.0.0.1:$port within 30 s"
    "$etcdctl" --endpoints="127.0.0.1:$port" put packaged yes >/dev/null
    got="$("$etcdctl" --endpoints="127.0.0.1:$port" get packaged --print-value-only)"
    [ "$got" = yes ] || fail "get after put answered '$got'"
    ok "etcdctl put/get through 127.0.0.1:$port"
    urls="$("$etcdctl" --endpoints="127.0.0.1:$port" member list -w json | python3 -c 'import json,sys; m=json.load(sys.stdin)["members"][0]; print(m["name"], ",".join(m["clientURLs"]))')"
    [ "$urls" = "packaging http://127.0.0.1:$port" ] || fail "member list: $urls"
    ok "name and advertised client URL from ETCD_NAME and ETCD_ADVERTISE_CLIENT_URLS: $urls"
    pid="$(podman inspect -f '{{.State.Pid}}' "$one")"
    uids="$(awk '/^Uid:/ {print $2, $3}' "/proc/$pid/status")"
    [ "$uids" = "65532 65532" ] || fail "the container's process runs as uid $uids"
    ok "the serving process (host pid $pid) runs as uid 65532 (real and effective)"
    inside="$(podman exec "$one" etcd --version | first_line)"
    [ "$inside" = "etcd Version: 3.6.0" ] || fail "podman exec etcd --version: $inside"
    ok "podman exec ... etcd --version: $inside"
    podman stop -t 30 "$one" >/dev/null
    code="$(podman inspect -f '{{.State.ExitCode}}' "$one")"
    [ "$code" = 0 ] || fail "podman stop: exit code $code"
    ok "podman stop (SIGTERM): exit code 0"
    owner="$(stat -c %u:%g "$(podman volume inspect -f '{{.Mountpoint}}' "$volume")/member")"
    [ "$owner" = 65532:65532 ] || fail "the volume's files are $owner's"
    ok "the volume's files are 65532:65532's"

    # kubeadm's static pod runs `etcd` with its settings as flags: none is refused as
    # conflicting with the image's environment, and the data is the first container's.
    two="cairn-packaging-$$-2"
    names+=("$two")
    podman run -d --name "$two" "${run_opts[@]}" -p "127.0.0.1:$port:2379" -v "$volume:/var/lib/cairn" "$tag" \
        etcd --name=packaging --data-dir=/var/lib/cairn \
        --listen-client-urls=http://0.0.0.0:2379 --advertise-client-urls="http://127.0.0.1:$port" \
        --listen-peer-urls=http://0.0.0.0:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 >/dev/null
    healthy "$two" || fail "a container started as etcd with kubeadm's flags did not serve"
    got="$("$etcdctl" --endpoints="127.0.0.1:$port" get packaged --print-value-only)"
    [ "$got" = yes ] || fail "the second container answered '$got'"
    ok "started as etcd with kubeadm's shape of flags, on the same volume: the key is there"
    podman stop -t 30 "$two" >/dev/null
fi

step "contrib/systemd/cairn.service: systemd-analyze verify"
sed "s|^ExecStart=/usr/local/bin/cairn\$|ExecStart=$bin|" contrib/systemd/cairn.service >"$work/cairn.service"
grep -q "^ExecStart=$bin\$" "$work/cairn.service" || fail "the unit's ExecStart is not /usr/local/bin/cairn"
# Unknown keys are only warnings to verify: any output at all fails the check.
if ! verify="$(systemd-analyze verify "$work/cairn.service" 2>&1)" || [ -n "$verify" ]; then
    fail "systemd-analyze verify: $verify"
fi
ok "systemd-analyze verify: no error, no warning ($(systemd-analyze --version | first_line))"

step "contrib/systemd/cairn.sysusers.conf: systemd-sysusers --root"
sysroot="$work/sysroot"
mkdir -p "$sysroot/etc"
systemd-sysusers --root="$sysroot" "$root/contrib/systemd/cairn.sysusers.conf"
entry="$(grep '^cairn:' "$sysroot/etc/passwd" || true)"
IFS=: read -r name _ uid gid gecos home shell <<<"$entry"
if ! { [ "$name" = cairn ] && [ "$gecos" = "cairn key-value store" ] && [ "$home" = /var/lib/cairn ] &&
    [ "$shell" = /usr/sbin/nologin ] && [ "$uid" -lt 1000 ]; }; then
    fail "passwd entry: '$entry'"
fi
grep -q "^cairn:x:$gid:" "$sysroot/etc/group" || fail "no group cairn with gid $gid"
ok "$entry (a system user, its own group)"

step "the unit under a real systemd"
if pid1="$(systemd-run --wait --quiet true 2>&1)"; then
    echo "this machine's PID 1 is systemd; the unit is still run in a container, not on the host"
else
    echo "not on the host: $(printf '%s' "$pid1" | paste -sd ' ')"
fi
sd_image=localhost/cairn-test-systemd:bookworm
if [ "$runs" = false ]; then
    skip "the unit under systemd: containers do not run here"
else
    if ! podman image exists "$sd_image"; then
        echo "making $sd_image with debootstrap (Debian 12, minbase, systemd; about two minutes)"
        debian_packages debootstrap
        if debootstrap --variant=minbase --include=systemd,systemd-sysv,dbus bookworm "$work/rootfs" \
            http://deb.debian.org/debian >"$work/debootstrap.log" 2>&1; then
            tar -C "$work/rootfs" -c . | podman import --quiet - "$sd_image" >/dev/null
        else
            tail -5 "$work/debootstrap.log"
        fi
    fi
    if ! podman image exists "$sd_image"; then
        skip "the unit under systemd: no image with systemd (debootstrap failed, above)"
    else
        sd="cairn-packaging-$$-systemd"
        names+=("$sd")
        sport="$(free_port)"
        podman run -d --name "$sd" --systemd=always "${run_opts[@]}" -p "127.0.0.1:$sport:2379" \
            -v "$root/contrib:/src/contrib:ro" -v "$bin:/src/cairn:ro" "$sd_image" /sbin/init >/dev/null
        # Until systemd's bus is up, systemctl cannot ask; then --wait waits for the boot's end.
        for _ in $(seq 1 120); do
            state="$(timeout 60 podman exec "$sd" systemctl is-system-running --wait 2>&1 || true)"
            case "$state" in *"Failed to connect to bus"*) sleep 0.5 ;; *) break ;; esac
        done
        echo "systemd in the container: $state"
        if [ "$state" != running ] && [ "$state" != degraded ]; then
            podman logs "$sd" 2>&1 | tail -20
            skip "the unit under systemd: systemd did not come up in a container ($state)"
        else
            # docs/operations.md's commands, from /src (the repository and the binary, mounted).
            podman exec "$sd" sh -euc "
                cd /src
                install -m 0755 cairn /usr/local/bin/cairn
                install -D -m 0644 contrib/systemd/cairn.sysusers.conf /etc/sysusers.d/cairn.conf
                systemd-sysusers /etc/sysusers.d/cairn.conf
                install -m 0644 contrib/systemd/cairn.service /etc/systemd/system/cairn.service
                install -d -m 0755 /etc/cairn
                printf '%s\n' ETCD_LISTEN_CLIENT_URLS=http://0.0.0.0:2379 \
                    ETCD_ADVERTISE_CLIENT_URLS=http://127.0.0.1:$sport >/etc/cairn/cairn.env
                systemctl daemon-reload
                systemctl enable --now cairn
                systemctl status cairn --no-pager --lines=0
            " || fail "installing and starting the unit (the commands above)"
            # `enable --now` returns once Type=notify's READY=1 came: clients are served.
            [ "$(podman exec "$sd" systemctl is-active cairn)" = active ] || fail "cairn.service is not active"
            "$etcdctl" --endpoints="127.0.0.1:$sport" put unit yes >/dev/null
            got="$("$etcdctl" --endpoints="127.0.0.1:$sport" get unit --print-value-only)"
            [ "$got" = yes ] || fail "get from the unit answered '$got'"
            ok "systemctl enable --now cairn: active, etcdctl put/get through 127.0.0.1:$sport"
            main="$(podman exec "$sd" systemctl show -p MainPID --value cairn)"
            uid="$(podman exec "$sd" id -u cairn)"
            uids="$(podman exec "$sd" awk '/^Uid:/ {print $2, $3}' "/proc/$main/status")"
            [ "$uids" = "$uid $uid" ] || fail "cairn.service runs as uid $uids, not cairn's ($uid)"
            ok "the service runs as cairn (uid $uid)"
            podman exec "$sd" journalctl -u cairn --no-pager -o cat | grep -qx serving ||
                fail "the journal lacks cairn's 'serving' line"
            ok "journalctl -u cairn: cairn's own lines, in the journal's native protocol"
            watchdog="$(podman exec "$sd" systemctl show -p WatchdogUSec --value cairn)"
            ok "watchdog armed: WatchdogUSec=$watchdog"
            podman exec "$sd" systemctl kill --signal=SIGKILL cairn
            echo "SIGKILLed pid $main (systemctl kill); Restart=always, RestartSec=10s"
            restarted=false
            for _ in $(seq 1 60); do
                now="$(podman exec "$sd" systemctl show -p MainPID --value cairn)"
                if [ "$now" != 0 ] && [ "$now" != "$main" ] &&
                    [ "$(podman exec "$sd" systemctl is-active cairn)" = active ]; then
                    restarted=true
                    break
                fi
                sleep 0.5
            done
            $restarted || fail "cairn.service was not restarted within 30 s of a SIGKILL"
            got="$("$etcdctl" --endpoints="127.0.0.1:$sport" get unit --print-value-only)"
            [ "$got" = yes ] || fail "after the restart, get answered '$got'"
            ok "restarted by systemd (pid $now), the key still there"
            podman exec "$sd" systemctl stop cairn
            result="$(podman exec "$sd" systemctl show -p Result -p ExecMainStatus --value cairn | paste -sd ' ')"
            [ "$result" = "success 0" ] || fail "systemctl stop: Result and status '$result'"
            ok "systemctl stop cairn: Result=success, exit status 0"
        fi
    fi
fi

step "done"
if [ ${#skipped[@]} -gt 0 ]; then
    echo "skipped, and why:"
    for s in "${skipped[@]}"; do echo "  - $s"; done
else
    echo "nothing skipped"
fi
